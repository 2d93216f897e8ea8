//! HTTP/1 keep-alive connections at rest give back what hyper holds for them.
//!
//! Between requests an HTTP/1 connection served by hyper keeps two 8 KiB buffers (the read
//! buffer it reserves while it waits for the next head, and the one for response heads it
//! allocates up front) and the last response's header map: ~17 KiB of the ~27 KiB an idle
//! intercepted connection held (docs/benchmarks.md, "Where an idle connection's memory
//! is"), and hyper 1.x has no setting that releases them while the connection waits.
//! Agents keep connections open across seconds of thinking, so most of them wait.
//!
//! [`serve`] therefore runs hyper only while a connection is in use. Every [`REST_AFTER`]
//! it asks the connection to rest. The next time hyper reads while the connection is
//! *at rest* — no request being served or answered, no answer byte unflushed, and the wire
//! guard holding no part of a next request ([`StrictH1::at_rest`]) — the IO takes the stream
//! away and reports end of input. (A pipelined request the guard released is in hyper's
//! buffer, complete: hyper parses it and takes it in flight before it reads again.) hyper,
//! idle, takes that for the agent closing: it ends without writing a byte and frees its
//! state. The stream then waits on its own for the agent's next bytes, which the wire guard
//! keeps, and a new hyper connection is built to read them. An upgrade (a WebSocket) is
//! still hyper's to perform, so the connection keeps `with_upgrades`; after one the guard
//! is in its raw state and never at rest.
//!
//! What rests is the keep-alive connection's waiting, not its bounds: a connection at rest
//! is closed after `proxy.header_read_timeout` (the bound hyper keeps on an idle one), at
//! once when its session ends or the proxy stops, and a slow head never rests (the guard
//! holds part of it), so hyper's header timeout still ends a slowloris.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::body::Holding;
use crate::config::ProxyLimits;
use crate::shards::Open;
use crate::wire_guard::StrictH1;

/// How often a connection in use is asked to rest: it rests at the first moment after that
/// it is at rest. Rebuilding hyper's connection costs a few microseconds, so a busy
/// connection paying it once per period pays nothing measurable, and an agent that pauses
/// for longer (a model's turn takes seconds) holds no buffers while it does.
const REST_AFTER: Duration = Duration::from_millis(250);

/// How long closing a connection at rest may take (TLS `close_notify`, then FIN).
const CLOSE_BOUND: Duration = Duration::from_secs(1);

/// Resolves when a connection must wind down, with how long requests in flight may still
/// take (`None`: as long as they need).
pub type Stop<'a> = Pin<Box<dyn Future<Output = Option<Duration>> + Send + 'a>>;

/// Serve `io` with `service`, resting it whenever it waits (see the module doc), until the
/// agent closes it, it idles at rest for `limits.header_read_timeout`, or `stop` resolves.
/// `resting` counts the connections at rest.
///
/// The stream is boxed, and so is `stop`: a connection's task is as large as the largest
/// state of its future, and a stream held by value in each of this function's states
/// (serving, resting, closing) made an intercepted connection's task 9.6 KiB where hyper's
/// whole connection inline had taken 3.9 (massif, 2026-12-06).
pub async fn serve<IO, S, B>(
    limits: &ProxyLimits,
    mut io: Box<StrictH1<IO>>,
    service: S,
    resting: &Gauge,
    mut stop: Stop<'_>,
) -> hyper::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = builder(limits);
    let keep_idle = limits.header_read_timeout;
    let activity = Arc::new(Activity::default());
    let handoff: Handoff<IO> = Arc::new(Mutex::new(None));
    // Each request counted in flight until hyper drops its answer's body.
    let counted = {
        let activity = activity.clone();
        service_fn(move |req| {
            let in_flight = InFlight::begin(&activity);
            let answer = service.call(req);
            async move {
                let response = answer.await?;
                Ok::<_, S::Error>(response.map(|body| Holding::new(body, in_flight)))
            }
        })
    };
    loop {
        activity.wanted.store(false, Ordering::Relaxed);
        let shell = Shell {
            io: Some(io),
            activity: activity.clone(),
            handoff: handoff.clone(),
        };
        // Boxed: at rest the connection's task keeps no room for hyper's state.
        let mut connection = Box::pin(
            builder
                .serve_connection(TokioIo::new(shell), counted.clone())
                .with_upgrades(),
        );
        let start = tokio::time::Instant::now() + REST_AFTER;
        let mut ask = tokio::time::interval_at(start, REST_AFTER);
        ask.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            tokio::select! {
                result = connection.as_mut() => break result,
                // Taken up by the IO at hyper's next read (the select polls the connection
                // again right away): hyper, idle, reads at every poll.
                _ = ask.tick() => activity.wanted.store(true, Ordering::Relaxed),
                bound = &mut stop => {
                    // An idle connection closes at once; a request in flight finishes first.
                    connection.as_mut().graceful_shutdown();
                    match bound {
                        Some(bound) => {
                            let _ = tokio::time::timeout(bound, connection).await;
                        }
                        None => {
                            let _ = connection.await;
                        }
                    }
                    // The IO may have taken the stream away instead of hyper closing it.
                    if let Some(io) = take(&handoff) {
                        close(io).await;
                    }
                    return Ok(());
                }
            }
        };
        drop(connection);
        result?;
        // Ended without the stream taken away: the agent closed, or hyper upgraded it.
        let Some(at_rest) = take(&handoff) else {
            return Ok(());
        };
        match rest(at_rest, keep_idle, resting, &mut stop).await {
            Some(woken) => io = woken,
            None => return Ok(()),
        }
    }
}

/// Hold a connection at rest until the agent's next bytes arrive (the stream back, for a
/// new hyper connection to read them), or close it: idle for `keep_idle`, `stop`, or the
/// agent gone (`None`).
async fn rest<IO: AsyncRead + AsyncWrite + Unpin>(
    mut io: Box<StrictH1<IO>>,
    keep_idle: Duration,
    resting: &Gauge,
    stop: &mut Stop<'_>,
) -> Option<Box<StrictH1<IO>>> {
    // Counted by a guard: a task cut while it rests (after the drain) is counted out too.
    let counted_at_rest = Open::new(resting);
    let woke = tokio::select! {
        woke = std::future::poll_fn(|cx| io.poll_arrival(cx)) => woke,
        () = tokio::time::sleep(keep_idle) => Ok(0),
        _ = stop => Ok(0),
    };
    drop(counted_at_rest);
    match woke {
        Ok(n) if n > 0 => Some(io),
        Ok(_) => {
            close(io).await;
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "a connection at rest failed");
            None
        }
    }
}

/// hyper's HTTP/1 server for an agent's connection, the same for every round of it.
fn builder(limits: &ProxyLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Vectored writes (hyper's default once the IO says it takes them, as the wire guard
        // does): the head and the body's pieces go to the stream in one call, with no copy
        // into hyper's own buffer first.
        .max_buf_size(crate::body::paced::h1_buffer(limits.max_header_bytes));
    builder
}

type Handoff<IO> = Arc<Mutex<Option<Box<StrictH1<IO>>>>>;

fn take<IO>(handoff: &Handoff<IO>) -> Option<Box<StrictH1<IO>>> {
    handoff
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
}

/// What hyper closing an idle connection would do: `close_notify`, then FIN, bounded.
async fn close<IO: AsyncRead + AsyncWrite + Unpin>(mut io: Box<StrictH1<IO>>) {
    let _ = tokio::time::timeout(CLOSE_BOUND, io.shutdown()).await;
}

/// What the connection is doing, as far as resting is concerned; shared by the IO, the
/// service and the answers' bodies, all polled on the connection's task.
#[derive(Debug, Default)]
struct Activity {
    /// Requests taken by the service whose answer's body hyper has not yet dropped.
    in_flight: AtomicUsize,
    /// Bytes were written (or an answer ended) since the last completed flush.
    unflushed: AtomicBool,
    /// Rest at the next moment the connection is at rest.
    wanted: AtomicBool,
}

impl Activity {
    fn quiet(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0 && !self.unflushed.load(Ordering::Relaxed)
    }
}

/// One request in flight, until its answer's body is dropped (hyper drops it once it has
/// taken the last frame, before it flushes them).
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The answer's last bytes are hyper's to flush yet: not quiet until they are.
        self.0.unflushed.store(true, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The IO hyper serves: the guarded stream, until hyper reads while the connection is
/// wanted at rest and is; then the stream goes to `handoff` and hyper reads end of input.
struct Shell<IO> {
    io: Option<Box<StrictH1<IO>>>,
    activity: Arc<Activity>,
    handoff: Handoff<IO>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Shell<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(io) = this.io.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let activity = &this.activity;
        if activity.wanted.load(Ordering::Relaxed) && activity.quiet() && io.at_rest() {
            *this.handoff.lock().unwrap_or_else(PoisonError::into_inner) = this.io.take();
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut **io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Shell<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write(|io| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write(|io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(io) = this.io.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let flushed = Pin::new(&mut **io).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            this.activity.unflushed.store(false, Ordering::Relaxed);
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().io.as_mut() {
            Some(io) => Pin::new(&mut **io).poll_shutdown(cx),
            // Taken away to rest: hyper's close is not the connection's.
            None => Poll::Ready(Ok(())),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Shell<IO> {
    fn write(
        &mut self,
        write: impl FnOnce(Pin<&mut StrictH1<IO>>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let Some(io) = self.io.as_mut() else {
            // hyper was idle when the stream was taken, with nothing left to write.
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        let written = write(Pin::new(&mut **io));
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.unflushed.store(true, Ordering::Relaxed);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::Empty;
    use tokio::io::DuplexStream;

    use super::*;

    /// A stream as large as a TLS session: what a connection's task must not hold by value.
    struct Bulky {
        inner: DuplexStream,
        _session: [u8; 4096],
    }

    impl AsyncRead for Bulky {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Bulky {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }

    /// What an idle connection's task keeps is the serving future's largest state: neither
    /// the stream nor hyper's connection may sit in it by value.
    #[test]
    fn the_serving_future_holds_no_stream_by_value() {
        let (_client, server) = tokio::io::duplex(64);
        let io = Box::new(StrictH1::new(
            Bulky {
                inner: server,
                _session: [0; 4096],
            },
            1024,
        ));
        let service = service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let limits = ProxyLimits::default();
        let gauge = Gauge::default();
        let serving = serve(
            &limits,
            io,
            service,
            &gauge,
            Box::pin(std::future::pending()),
        );
        let size = std::mem::size_of_val(&serving);
        assert!(size < 1024, "the serving future takes {size} bytes");
    }
}
