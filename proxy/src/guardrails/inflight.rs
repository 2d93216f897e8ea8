//! Requests in flight per session, so that teardown can let them finish — or cancel them
//! once its grace period is over — before it revokes the credentials they may be using.
//!
//! Each request holds a [`Ticket`] from the moment its session is known until its answer
//! (body included) has left; dropping it is the only way out, so a panicking or abandoned
//! request cannot leave a session waiting for ever.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct Entry {
    count: usize,
    cancel: CancellationToken,
    idle: Arc<Notify>,
}

/// The in-flight count of every session with requests running.
#[derive(Debug, Default)]
pub struct InFlight {
    sessions: Mutex<HashMap<String, Entry>>,
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
        let entry = sessions.entry(session.to_owned()).or_default();
        entry.count += 1;
        Ticket {
            owner: self.clone(),
            session: session.to_owned(),
            cancelled: entry.cancel.clone(),
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
}
