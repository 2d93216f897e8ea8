//! The proxy listeners' event loops: `listen.proxy_threads` threads, each running a
//! single-threaded tokio runtime of its own over the same listening sockets. A connection
//! stays on the loop that took it for its whole life, and so do the tasks it starts (the
//! intercepted tunnel, the pipeline, the upstream connection it dials).
//!
//! Why not the runtime's work-stealing workers: there, a worker woken by a socket wakes a
//! parked sibling to look for more work, and that one parks again — a futex round trip
//! per request at one client, on every request at a steady rate, ~10% of the proxy's CPU
//! (docs/benchmarks.md). A loop that owns its connections never wakes another thread to
//! serve them. What it gives up is stealing: a connection waits behind the others on its
//! loop even when another loop is idle, so connections are spread by how many each loop
//! has open.
//!
//! Every loop watches the listening socket, so the kernel wakes them all for a new
//! connection and the first to call `accept` takes it; a loop that already has more open
//! than the least busy one hands the connection to that one over a channel. The Unix
//! socket sandboxes reach the proxy through (`listen.proxy_unix`) is watched the same way,
//! by the same loops: a sandboxed agent's connections are spread, counted and drained with
//! the others ([`Conn`]).

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

mod conn;

pub use conn::Conn;
use conn::Handed;

thread_local! {
    /// The event loop this thread runs, if it runs one.
    static LOOP: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The event loop the calling thread runs (from 0), or `None` off the loops: for state kept
/// per loop, such as the upstream pools, so that what a loop's tasks share stays on it.
pub fn current() -> Option<usize> {
    LOOP.with(Cell::get)
}

/// The running loops; dropping them stops them too (without waiting for the drain).
#[derive(Debug)]
pub struct Loops {
    stop: CancellationToken,
    drained: Vec<oneshot::Receiver<()>>,
}

/// How many connections each loop has open (the `ostiary_proxy_connections` gauges), and
/// where to hand a connection to another loop.
struct Shared {
    open: Box<[Gauge]>,
    handoff: Box<[mpsc::UnboundedSender<Handed>]>,
}

impl Shared {
    /// Where a connection that loop `me` accepted is served: on `me` while no loop has
    /// fewer open, else on the loop with the fewest.
    fn place(&self, me: usize) -> usize {
        let mine = self.open[me].get();
        let least = self
            .open
            .iter()
            .enumerate()
            .min_by_key(|(_, open)| open.get())
            .map_or(me, |(i, _)| i);
        if mine <= self.open[least].get() {
            me
        } else {
            least
        }
    }
}

/// What keeps a connection counted and the drain waiting for it. The task serving the
/// connection holds it, and so does each task that takes over part of the connection and
/// outlives that one (a CONNECT's tunnel, a spliced WebSocket): they find it in their
/// request's extensions.
#[derive(Clone, Debug)]
pub struct Alive(Arc<Life>);

#[derive(Debug)]
struct Life {
    _open: Open,
    _tracked: TaskTrackerToken,
    stopping: CancellationToken,
}

impl Alive {
    /// A connection counted in `gauge`, waited for by `tracker`, told to stop by `stopping`.
    pub fn new(gauge: &Gauge, tracker: &TaskTracker, stopping: &CancellationToken) -> Self {
        Self(Arc::new(Life {
            _open: Open::new(gauge),
            _tracked: tracker.token(),
            stopping: stopping.clone(),
        }))
    }

    /// Resolves once the listener stops: an idle connection then closes at once and one
    /// with a request in flight after its answer (the drain bounds how long that may take).
    pub async fn stopping(&self) {
        self.0.stopping.cancelled().await;
    }
}

/// One count in a gauge, held while something lasts (a connection open, one at rest).
#[derive(Debug)]
pub(crate) struct Open(Gauge);

impl Open {
    pub(crate) fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Loops {
    /// Start `threads` loops (at least one) over `listener` and `unix` (when given), each
    /// serving the connections it keeps with `serve`. On stop, each loop stops accepting,
    /// tells its connections ([`Alive::stopping`]) and gives them `drain` to finish.
    pub fn start<S, F>(
        listener: TcpListener,
        unix: Option<UnixListener>,
        threads: usize,
        metrics: &Metrics,
        drain: Duration,
        serve: S,
    ) -> io::Result<Self>
    where
        S: Fn(Conn, Alive) -> F + Clone + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let threads = threads.max(1);
        // Built here, so that a runtime that cannot start is an error of `serve`, not a
        // listener that silently accepts nothing.
        let runtimes = (0..threads)
            .map(|i| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .thread_name(format!("ostiary-proxy-{i}-blocking"))
                    .build()
            })
            .collect::<io::Result<Vec<_>>>()?;
        let listener = listener.into_std()?;
        let unix = unix.map(UnixListener::into_std).transpose()?;
        let listeners = (0..threads)
            .map(|_| {
                let unix = unix.as_ref().map(|u| u.try_clone()).transpose()?;
                Ok(Listening {
                    tcp: listener.try_clone()?,
                    unix,
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        drop((listener, unix));
        let (handoff, handed): (Vec<_>, Vec<_>) =
            (0..threads).map(|_| mpsc::unbounded_channel()).unzip();
        let shared = Arc::new(Shared {
            open: (0..threads)
                .map(|i| metrics.proxy_connections(&i.to_string()))
                .collect(),
            handoff: handoff.into_boxed_slice(),
        });
        let stop = CancellationToken::new();
        let mut drained = Vec::with_capacity(threads);
        for (me, ((runtime, listener), handed)) in
            runtimes.into_iter().zip(listeners).zip(handed).enumerate()
        {
            let (done, waited) = oneshot::channel();
            let event_loop = Loop {
                me,
                shared: shared.clone(),
                stop: stop.clone(),
                drain,
                serve: serve.clone(),
            };
            std::thread::Builder::new()
                .name(format!("ostiary-proxy-{me}"))
                .spawn(move || event_loop.run(runtime, listener, handed, done))?;
            drained.push(waited);
        }
        Ok(Self { stop, drained })
    }

    /// Stop accepting on every loop and wait until each has drained.
    pub async fn stop(mut self) {
        self.stop.cancel();
        for waited in self.drained.drain(..) {
            // An error is a loop whose thread ended without saying so: nothing to wait for.
            let _ = waited.await;
        }
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What one loop watches: its copies of the listening sockets.
struct Listening {
    tcp: std::net::TcpListener,
    unix: Option<std::os::unix::net::UnixListener>,
}

/// The next connection on the Unix socket; never, when the loop watches none.
async fn accept_unix(unix: Option<&UnixListener>) -> io::Result<UnixStream> {
    match unix {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// One loop, before its thread starts.
struct Loop<S> {
    me: usize,
    shared: Arc<Shared>,
    stop: CancellationToken,
    drain: Duration,
    serve: S,
}

impl<S, F> Loop<S>
where
    S: Fn(Conn, Alive) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    /// The loop's thread: accept and serve until stopped, drain, then say so on `done`.
    fn run(
        self,
        runtime: Runtime,
        listener: Listening,
        handed: mpsc::UnboundedReceiver<Handed>,
        done: oneshot::Sender<()>,
    ) {
        LOOP.with(|at| at.set(Some(self.me)));
        runtime.block_on(self.accept(listener, handed));
        // Whatever outlived the drain is cut here; a blocking store call it started is
        // left to finish on its own rather than hold the shutdown.
        runtime.shutdown_background();
        let _ = done.send(());
    }

    async fn accept(self, listener: Listening, mut handed: mpsc::UnboundedReceiver<Handed>) {
        let tracker = TaskTracker::new();
        let keep = |conn: Conn| {
            let alive = Alive::new(&self.shared.open[self.me], &tracker, &self.stop);
            tracker.spawn((self.serve)(conn, alive));
        };
        let adopt = |handed: Handed| match conn::from_std(handed) {
            Ok(conn) => keep(conn),
            Err(e) => tracing::warn!(error = %e, "taking over a proxy connection failed"),
        };
        // A loop that cannot watch the Unix socket still serves TCP; the other loops take
        // the socket's connections.
        let unix = listener.unix.and_then(|u| {
            UnixListener::from_std(u)
                .inspect_err(|e| {
                    tracing::error!(error = %e, loop = self.me, "proxy event loop cannot watch the Unix socket")
                })
                .ok()
        });
        match TcpListener::from_std(listener.tcp) {
            Ok(listener) => loop {
                tokio::select! {
                    () = self.stop.cancelled() => break,
                    Some(handed) = handed.recv() => adopt(handed),
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _peer)) => {
                            let _ = stream.set_nodelay(true);
                            self.place(Either::Left(stream), &keep);
                        }
                        Err(e) => crate::accept::backoff(e).await,
                    },
                    accepted = accept_unix(unix.as_ref()) => match accepted {
                        Ok(stream) => self.place(Either::Right(stream), &keep),
                        Err(e) => crate::accept::backoff(e).await,
                    },
                }
            },
            Err(e) => {
                tracing::error!(error = %e, loop = self.me, "proxy event loop cannot watch the listener")
            }
        }
        // Closed before the drain, like the TCP listener above: a sandbox that connects now
        // is refused at once rather than left waiting in the backlog.
        drop(unix);
        // Connections another loop handed over before the stop are served, not dropped.
        handed.close();
        while let Ok(stream) = handed.try_recv() {
            adopt(stream);
        }
        tracker.close();
        if tokio::time::timeout(self.drain, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(loop = self.me, "proxy connections still open after the drain period");
        }
    }

    /// Serve `conn` here, or hand it to the loop with the fewest open connections.
    fn place(&self, conn: Conn, keep: &impl Fn(Conn)) {
        let to = self.shared.place(self.me);
        if to == self.me {
            return keep(conn);
        }
        match conn::into_std(conn) {
            // A loop that has stopped no longer takes connections: this one closes.
            Ok(handed) => {
                let _ = self.shared.handoff[to].send(handed);
            }
            Err(e) => tracing::warn!(error = %e, "handing over a proxy connection failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(open: &[i64]) -> Shared {
        Shared {
            open: open
                .iter()
                .map(|&n| {
                    let g = Gauge::default();
                    g.set(n);
                    g
                })
                .collect(),
            handoff: open.iter().map(|_| mpsc::unbounded_channel().0).collect(),
        }
    }

    #[test]
    fn a_loop_keeps_a_connection_while_no_other_has_fewer() {
        assert_eq!(shared(&[0, 0]).place(0), 0);
        assert_eq!(shared(&[0, 0]).place(1), 1);
        assert_eq!(shared(&[2, 3, 2]).place(2), 2);
    }

    #[test]
    fn a_busier_loop_hands_a_connection_to_the_least_busy() {
        assert_eq!(shared(&[1, 0]).place(0), 1);
        assert_eq!(shared(&[5, 3, 1, 4]).place(0), 2);
        assert_eq!(shared(&[5, 3, 1, 4]).place(3), 2);
    }

    #[test]
    fn an_open_connection_is_counted_until_it_closes() {
        let gauge = Gauge::default();
        let open = Open::new(&gauge);
        assert_eq!(gauge.get(), 1);
        drop(open);
        assert_eq!(gauge.get(), 0);
    }
}
