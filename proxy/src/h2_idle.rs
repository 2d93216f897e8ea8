//! An intercepted HTTP/2 connection with no request in flight is closed once it has been so
//! for `proxy.header_read_timeout`: the bound an idle HTTP/1 keep-alive has (hyper's header
//! timeout, and [`crate::hibernate`]'s for a connection at rest).
//!
//! Without it an idle HTTP/2 connection lived as long as its session: hyper's HTTP/2 server
//! has no idle timeout (its keep-alive pings only prove the peer is there), and each one
//! holds the codec's buffers, both HPACK tables and the streams' store — about twice what
//! an HTTP/1 connection at rest holds (docs/benchmarks.md, "Idle HTTP/2 connections"). An
//! agent opening connections it never uses again would keep them all.
//!
//! A request counts from the moment hyper hands it to the service until hyper drops its
//! answer's body (the stream's end, or its reset), so a long answer (an event stream) or a
//! slow upload keeps the connection open however long it takes.
//!
//! The close is written here, not left to hyper's graceful shutdown. That one sends GOAWAY
//! naming no stream as unprocessed, then a PING, and waits for its answer. An idle client
//! reads nothing until its next request; then it finds the GOAWAY and the PING together,
//! and Python's `h2` (httpx's) refuses any frame after a GOAWAY: the agent's request failed
//! (`tests/tests/h2_idle.rs` caught it with httpx). So hyper is dropped, and the stream it
//! read from ([`Lent`]) gets one GOAWAY naming the last stream hyper took — a request the
//! client sent after that is known unprocessed, and retried on a new connection — then
//! TLS's `close_notify` and FIN.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::{service_fn, Service};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use crate::body::Holding;

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

/// How long writing the GOAWAY and closing may take (a peer that reads nothing still takes
/// them into its socket's buffer).
const CLOSE_BOUND: Duration = Duration::from_secs(1);

/// The stream hyper serves, lent: it can be taken back once hyper is dropped. It follows the
/// client's frames as hyper reads them, for the last stream a HEADERS frame opened.
pub struct Lent<IO>(Lease<IO>);

/// The lender's side of a [`Lent`] stream.
pub type Lease<IO> = Arc<Mutex<Lending<IO>>>;

/// The stream and what has been read of the client's frames.
pub struct Lending<IO> {
    io: Option<IO>,
    frames: Frames,
}

impl<IO> std::fmt::Debug for Lent<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lent").field(&self.0).finish()
    }
}

impl<IO> std::fmt::Debug for Lending<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lending")
            .field("lent", &self.io.is_some())
            .field("frames", &self.frames)
            .finish()
    }
}

impl<IO> Lent<IO> {
    pub fn new(io: IO) -> (Self, Lease<IO>) {
        let lease = Arc::new(Mutex::new(Lending {
            io: Some(io),
            frames: Frames::default(),
        }));
        (Self(lease.clone()), lease)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut IO, &mut Frames) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let mut lending = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Lending { io, frames } = &mut *lending;
        match io {
            Some(io) => f(io, frames),
            None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Lent<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.with(|io, frames| {
            let before = buf.filled().len();
            let polled = Pin::new(io).poll_read(cx, buf);
            frames.read(&buf.filled()[before..]);
            polled
        })
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Lent<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.with(|io, _| Pin::new(io).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.with(|io, _| Pin::new(io).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        let lending = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lending.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|io, _| Pin::new(io).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|io, _| Pin::new(io).poll_shutdown(cx))
    }
}

/// Take the stream back (hyper dropped) and close it as an idle HTTP/2 connection: GOAWAY
/// (NO_ERROR, the last stream the client opened that hyper read), `close_notify`, FIN.
pub async fn go_away<IO: AsyncWrite + Unpin>(lease: &Lease<IO>) {
    let (io, last) = {
        let mut lending = lease.lock().unwrap_or_else(PoisonError::into_inner);
        (lending.io.take(), lending.frames.last_stream)
    };
    let Some(mut io) = io else { return };
    let close = async {
        io.write_all(&goaway(last)).await?;
        io.shutdown().await
    };
    if let Ok(Err(e)) = tokio::time::timeout(CLOSE_BOUND, close).await {
        tracing::debug!(error = %e, "closing an idle h2 connection failed");
    }
}

/// A GOAWAY frame (RFC 9113 §6.8): NO_ERROR, `last_stream` the last stream processed.
fn goaway(last_stream: u32) -> [u8; 17] {
    let mut frame = [0u8; 17];
    // Length 8, type GOAWAY (0x7), no flags, stream 0.
    frame[..9].copy_from_slice(&[0, 0, 8, 0x7, 0, 0, 0, 0, 0]);
    frame[9..13].copy_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    // Error code NO_ERROR (0): the last four bytes stay zero.
    frame
}

/// The client's side of an HTTP/2 connection, followed frame by frame over the bytes hyper
/// reads: the 24-byte preface, then 9-byte frame heads and payloads skipped by their length.
#[derive(Debug)]
struct Frames {
    preface: usize,
    head: [u8; 9],
    have: usize,
    skip: usize,
    /// The last stream a HEADERS frame opened.
    last_stream: u32,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            preface: 24,
            head: [0; 9],
            have: 0,
            skip: 0,
            last_stream: 0,
        }
    }
}

impl Frames {
    fn read(&mut self, mut bytes: &[u8]) {
        let preface = self.preface.min(bytes.len());
        self.preface -= preface;
        bytes = &bytes[preface..];
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                let [l0, l1, l2, kind, _flags, s0, s1, s2, s3] = self.head;
                self.skip = u32::from_be_bytes([0, l0, l1, l2]) as usize;
                let stream = u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff;
                // HEADERS (0x1) opens a client stream; a trailers block names an open one.
                if kind == 0x1 {
                    self.last_stream = self.last_stream.max(stream);
                }
                self.have = 0;
            }
        }
    }
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
    #[test]
    fn the_last_stream_is_followed_across_any_split_of_the_bytes() {
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS (empty), HEADERS on 1 (3 bytes), DATA on 1 (5), HEADERS on 5 (2),
        // WINDOW_UPDATE on 0 (4), RST_STREAM on 7 (4): the last opened is 5.
        for (kind, stream, len) in [
            (4u8, 0u32, 0usize),
            (1, 1, 3),
            (0, 1, 5),
            (1, 5, 2),
            (8, 0, 4),
            (3, 7, 4),
        ] {
            let l = (len as u32).to_be_bytes();
            wire.extend_from_slice(&[l[1], l[2], l[3], kind, 0]);
            wire.extend_from_slice(&stream.to_be_bytes());
            // Payloads that look like frame heads must be skipped, not read as frames.
            wire.extend(std::iter::repeat_n(0x01, len));
        }
        for split in 1..wire.len() {
            let mut frames = Frames::default();
            for piece in wire.chunks(split) {
                frames.read(piece);
            }
            assert_eq!(frames.last_stream, 5, "read in pieces of {split}");
        }
    }

    #[test]
    fn a_goaway_names_the_last_stream_and_no_error() {
        assert_eq!(
            goaway(5),
            [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0]
        );
        assert_eq!(goaway(u32::MAX)[9], 0x7f, "the reserved bit stays clear");
    }
}
