//! Running a store call from async code: on tokio's blocking pool, since every store
//! trait is synchronous (see the crate's doc), with the task's failure as a
//! [`StoreError::Task`] rather than a panic in the caller.

use std::future::Future;
use std::sync::Arc;

use crate::StoreError;

/// `store.call(|s| s.method(…)).await` for any shared store handle.
pub trait Call<S: ?Sized> {
    /// Run `f` on the store on a blocking thread.
    fn call<T, E>(
        &self,
        f: impl FnOnce(&S) -> Result<T, E> + Send + 'static,
    ) -> impl Future<Output = Result<T, E>> + Send
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static;
}

impl<S: ?Sized + Send + Sync + 'static> Call<S> for Arc<S> {
    fn call<T, E>(
        &self,
        f: impl FnOnce(&S) -> Result<T, E> + Send + 'static,
    ) -> impl Future<Output = Result<T, E>> + Send
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let this = self.clone();
        async move {
            tokio::task::spawn_blocking(move || f(&this))
                .await
                .map_err(|e| E::from(StoreError::Task(e.to_string())))?
        }
    }
}
