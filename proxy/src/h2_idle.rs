//! An intercepted HTTP/2 connection with no request in flight is closed once it has been so
//! for `proxy.header_read_timeout`: the bound an idle HTTP/1 keep-alive has (hyper's header
//! timeout, and [`crate::hibernate`]'s for a connection at rest).
//!
//! Without it an idle HTTP/2 connection lived as long as its session: hyper's HTTP/2 server
//! has no idle timeout (its keep-alive pings only prove the peer is there), and each one
//! holds the codec's buffers, both HPACK tables and the streams' store — several times what
//! an HTTP/1 connection at rest holds (docs/benchmarks.md, "Idle HTTP/2 connections"). An
//! agent opening connections it never uses again would keep them all.
//!
//! A request counts from the moment hyper hands it to the service until hyper drops its
//! answer's body (the stream's end, or its reset), so a long answer (an event stream) or a
//! slow upload keeps the connection open however long it takes.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::{service_fn, Service};
use tokio::time::Instant;

use crate::body::Holding;

/// How long a connection told to go away for idling is given to end by itself (the peer's
/// answer to GOAWAY's ping) before it is cut, when no request crossed the GOAWAY.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Requests in flight on one connection, and since when there have been none.
#[derive(Debug)]
pub struct Quiet {
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
}

impl Default for Quiet {
    fn default() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }
    }
}

impl Quiet {
    /// Resolves once no request has been in flight for `bound`.
    pub async fn elapsed(&self, bound: Duration) {
        loop {
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // Busy: look again after a bound; the quiet time counts from the end of the
                // last request, whenever that is.
                tokio::time::sleep(bound).await;
                continue;
            }
            let deadline = *self.since.lock().unwrap_or_else(PoisonError::into_inner) + bound;
            if Instant::now() >= deadline {
                // A request taken since the load above has moved `since` past the deadline.
                if self.in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                continue;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }

    /// Whether a request is in flight.
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight(self.clone())
    }

    fn touch(&self) {
        *self.since.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// One request in flight, until its answer's body is dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Quiet>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // `since` first: a watcher that sees no request in flight must see this end too.
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer counted in flight until hyper drops its body.
pub type Counted<B> = Response<Holding<B, InFlight>>;

/// `service`, with each request counted in `quiet` until hyper drops its answer's body.
pub fn counted<S, B>(
    quiet: Arc<Quiet>,
    service: S,
) -> impl Service<
    Request<Incoming>,
    Response = Counted<B>,
    Error = S::Error,
    Future = impl Future<Output = Result<Counted<B>, S::Error>> + Send + 'static,
> + Clone
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
{
    service_fn(move |req| {
        let request = quiet.begin();
        let answer = service.call(req);
        async move {
            let response = answer.await?;
            Ok(response.map(|body| Holding::new(body, request)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn quiet_counts_from_the_end_of_the_last_request() {
        let quiet = Arc::new(Quiet::default());
        let bound = Duration::from_secs(10);
        let start = Instant::now();
        let request = quiet.begin();
        let watcher = {
            let quiet = quiet.clone();
            tokio::spawn(async move {
                quiet.elapsed(bound).await;
                Instant::now()
            })
        };
        // A request in flight for 25 s keeps the connection, however long it takes.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(!watcher.is_finished(), "closed with a request in flight");
        drop(request);
        let closed = watcher.await.unwrap();
        assert_eq!(closed - start, Duration::from_secs(35));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_carries_a_request_is_closed_after_the_bound() {
        let quiet = Quiet::default();
        let start = Instant::now();
        quiet.elapsed(Duration::from_secs(10)).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
    }
}
