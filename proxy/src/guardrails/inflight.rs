//! Requests and byte streams in flight per session, so that teardown can let requests
//! finish — or cancel them once its grace period is over — before it revokes the
//! credentials they may be using, and end every stream the session still has open.
//!
//! Each request holds a [`Ticket`] from the moment its session is known until its answer
//! (body included) has left; dropping it is the only way out, so a panicking or abandoned
//! request cannot leave a session waiting for ever.
//!
//! Long-lived byte streams (WebSocket splices, `egress.tunnel` relays, intercepted TLS
//! connections) hold a [`StreamTicket`] instead: teardown does not wait for them — they
//! would never end by themselves — but ends them ([`InFlight::end_streams`]) as soon as the
//! session is refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::ids::IdMap;

#[derive(Debug, Default)]
struct Entry {
    count: usize,
    cancel: CancellationToken,
    idle: Arc<Notify>,
}

/// The open streams of one session.
#[derive(Debug)]
struct Streams {
    count: usize,
    /// Tells a ticket's drop which entry it counted into: once teardown ended a session's
    /// streams, a stream opened later (it will find the session refused) counts afresh.
    generation: u64,
    end: CancellationToken,
}

/// The in-flight count of every session with requests running, and its open streams.
#[derive(Debug, Default)]
pub struct InFlight {
    sessions: Mutex<IdMap<String, Entry>>,
    streams: Mutex<IdMap<String, Streams>>,
    generations: std::sync::atomic::AtomicU64,
}

/// One long-lived byte stream of a session, open until dropped.
#[derive(Debug)]
pub struct StreamTicket {
    owner: Arc<InFlight>,
    session: String,
    generation: u64,
    /// Cancelled when the session's streams are ended (teardown, expiry).
    pub ended: CancellationToken,
}

impl Drop for StreamTicket {
    fn drop(&mut self) {
        let mut streams = self.owner.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = streams.get_mut(&self.session) {
            if entry.generation == self.generation {
                entry.count -= 1;
                if entry.count == 0 {
                    streams.remove(&self.session);
                }
            }
        }
    }
}

/// One request of a session, in flight until dropped.
#[derive(Debug)]
pub struct Ticket {
    owner: Arc<InFlight>,
    session: String,
    /// Cancelled when teardown's grace period ran out.
    pub cancelled: CancellationToken,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut sessions = self
            .owner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = sessions.get_mut(&self.session) {
            entry.count -= 1;
            if entry.count == 0 {
                entry.idle.notify_waiters();
                sessions.remove(&self.session);
            }
        }
    }
}

/// How a teardown's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Requests that were in flight when teardown started.
    pub waited_for: usize,
    /// Of those, cancelled when the grace period ran out.
    pub cancelled: usize,
}

impl InFlight {
    /// Count one request of `session` in.
    pub fn enter(self: &Arc<Self>, session: &str) -> Ticket {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let count_in = |entry: &mut Entry| {
            entry.count += 1;
            entry.cancel.clone()
        };
        // Only a session's first request in flight allocates its id as a key.
        let cancelled = match sessions.get_mut(session) {
            Some(entry) => count_in(entry),
            None => count_in(sessions.entry(session.to_owned()).or_default()),
        };
        Ticket {
            owner: self.clone(),
            session: session.to_owned(),
            cancelled,
        }
    }

    /// Count one long-lived stream of `session` in. The caller checks that the session is
    /// still live *after* this (teardown refuses the session before it ends its streams, so
    /// one of the two always sees the other).
    pub fn open_stream(self: &Arc<Self>, session: &str) -> StreamTicket {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let entry = streams
            .entry(session.to_owned())
            .or_insert_with(|| Streams {
                count: 0,
                generation: self
                    .generations
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                end: CancellationToken::new(),
            });
        entry.count += 1;
        StreamTicket {
            owner: self.clone(),
            session: session.to_owned(),
            generation: entry.generation,
            ended: entry.end.clone(),
        }
    }

    /// Streams of `session` open now.
    pub fn streams(&self, session: &str) -> usize {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session)
            .map_or(0, |e| e.count)
    }

    /// End every stream `session` has open; returns how many were.
    pub fn end_streams(&self, session: &str) -> usize {
        let ended = self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
        match ended {
            Some(entry) => {
                entry.end.cancel();
                entry.count
            }
            None => 0,
        }
    }

    /// Requests of `session` in flight now.
    pub fn count(&self, session: &str) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session)
            .map_or(0, |e| e.count)
    }

    /// Wait until `session` has no request in flight, at most `grace`; then cancel what is
    /// left and wait (briefly) for it to go.
    pub async fn drain(&self, session: &str, grace: Duration) -> Drained {
        let (waited_for, idle, cancel) = {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            match sessions.get(session) {
                None => {
                    return Drained {
                        waited_for: 0,
                        cancelled: 0,
                    }
                }
                Some(e) => (e.count, e.idle.clone(), e.cancel.clone()),
            }
        };
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let notified = idle.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so a drop in between is not missed.
            notified.as_mut().enable();
            let left = self.count(session);
            if left == 0 {
                return Drained {
                    waited_for,
                    cancelled: 0,
                };
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let cancelled = self.count(session);
                cancel.cancel();
                // Cancelled requests answer and drop their tickets at their next await.
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while self.count(session) > 0 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await;
                return Drained {
                    waited_for,
                    cancelled,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn teardown_waits_for_requests_and_cancels_them_after_the_grace() {
        let inflight = Arc::new(InFlight::default());
        assert_eq!(
            inflight.drain("s", Duration::from_secs(1)).await,
            Drained {
                waited_for: 0,
                cancelled: 0
            }
        );
        // One that finishes within the grace.
        let ticket = inflight.enter("s");
        let done = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(ticket);
        });
        let drained = inflight.drain("s", Duration::from_secs(5)).await;
        assert_eq!(drained.cancelled, 0);
        assert_eq!(drained.waited_for, 1);
        done.await.unwrap();
        // One that would run for ever is cancelled.
        let ticket = inflight.enter("s");
        let stuck = tokio::spawn(async move {
            ticket.cancelled.cancelled().await;
            drop(ticket);
        });
        let drained = inflight.drain("s", Duration::from_millis(50)).await;
        assert_eq!(drained.cancelled, 1);
        stuck.await.unwrap();
        assert_eq!(inflight.count("s"), 0);
        // Another session is never touched.
        let other = inflight.enter("t");
        assert!(!other.cancelled.is_cancelled());
    }

    #[test]
    fn ending_a_session_s_streams_cancels_them_and_only_them() {
        let inflight = Arc::new(InFlight::default());
        let a = inflight.open_stream("s");
        let b = inflight.open_stream("s");
        let other = inflight.open_stream("t");
        assert_eq!(inflight.streams("s"), 2);
        assert_eq!(inflight.end_streams("s"), 2);
        assert!(a.ended.is_cancelled() && b.ended.is_cancelled());
        assert!(!other.ended.is_cancelled());
        assert_eq!(inflight.streams("s"), 0);
        // A stream opened after the end counts afresh; the old tickets' drops leave it be.
        let late = inflight.open_stream("s");
        assert!(!late.ended.is_cancelled());
        drop((a, b));
        assert_eq!(inflight.streams("s"), 1);
        drop(late);
        assert_eq!(inflight.streams("s"), 0);
        assert_eq!(inflight.end_streams("s"), 0);
        drop(other);
        assert_eq!(inflight.streams("t"), 0);
    }
}
