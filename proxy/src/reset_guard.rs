//! A guard against HTTP/2 *late* resets: a client that opens a stream, waits until the
//! proxy has started on it (decided it, perhaps sent it upstream), then cancels it — again
//! and again. hyper's `max_pending_accept_reset_streams` only counts streams reset before
//! the service saw them, so paced cancellations slip past it and make the proxy do work
//! (policy, checks, upstream requests) that nobody will read.
//!
//! Each intercepted h2 connection gets one [`Cancellations`]. Every request's service
//! future carries a [`Watch`]: dropped before it produced a response, the request counts
//! as cancelled. Once a connection has cancelled at least [`MIN_CANCELLED`] requests and
//! more than it completed, it is told to go away (GOAWAY, in-flight streams finish).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Cancelled requests a connection may have before its ratio is looked at: browsers and
/// agents cancel now and then, floods do it all the time.
pub const MIN_CANCELLED: usize = 128;

/// The cancelled and completed requests of one connection.
#[derive(Debug, Default)]
pub struct Cancellations {
    cancelled: AtomicUsize,
    completed: AtomicUsize,
    tripped: Notify,
}

impl Cancellations {
    /// One request's watch.
    pub fn watch(self: &Arc<Self>) -> Watch {
        Watch {
            owner: self.clone(),
            done: false,
        }
    }

    /// Resolves once the connection cancelled too much.
    pub async fn tripped(&self) {
        self.tripped.notified().await
    }

    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// Held by one request's service future; [`Watch::done`] when it produced a response.
#[derive(Debug)]
pub struct Watch {
    owner: Arc<Cancellations>,
    done: bool,
}

impl Watch {
    pub fn done(mut self) {
        self.done = true;
        self.owner.completed.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let cancelled = self.owner.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
        if cancelled >= MIN_CANCELLED && cancelled > self.owner.completed.load(Ordering::Relaxed) {
            // `notify_one` keeps the permit if nobody waits yet, so a trip is never lost.
            self.owner.tripped.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancellations_outnumbering_completions_trip_it() {
        let c = Arc::new(Cancellations::default());
        // A client that completes most requests may cancel many.
        for _ in 0..1000 {
            c.watch().done();
        }
        for _ in 0..MIN_CANCELLED * 2 {
            drop(c.watch());
        }
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(20), c.tripped());
        assert!(quiet.await.is_err());
        // A client that cancels more than it completes is told to go away.
        let flood = Arc::new(Cancellations::default());
        for _ in 0..MIN_CANCELLED {
            drop(flood.watch());
        }
        tokio::time::timeout(std::time::Duration::from_secs(1), flood.tripped())
            .await
            .expect("tripped");
        assert_eq!(flood.cancelled(), MIN_CANCELLED);
    }
}
