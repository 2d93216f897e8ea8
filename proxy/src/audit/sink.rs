//! The request path's handle on the audit writer: queue a record, wait for a flush, and
//! the check before anything is decided or forwarded (`503 audit_unavailable` unless
//! records can be written). It never blocks on a disk write; the writer thread
//! ([`super::writer`]) commits what it queues.

use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::health::{Health, Status};
use super::record::AuditRecord;
use crate::error::ProxyError;
use crate::metrics::Metrics;

pub(super) enum Command {
    Record(Box<AuditRecord>),
    Flush(oneshot::Sender<bool>),
    Close(oneshot::Sender<usize>),
}

/// Cheap handle to send records to the writer; never blocks the request path.
#[derive(Debug, Clone)]
pub struct AuditSink {
    pub(super) tx: mpsc::Sender<Command>,
    /// The writer's thread, woken for a flush or a close; a record never wakes it
    /// ([`super::writer`] gathers them asleep).
    pub(super) writer: Option<std::thread::Thread>,
    pub(super) health: Arc<Health>,
    /// Each record is also a span, when telemetry is on.
    pub(super) spans: Option<Arc<crate::telemetry::Spans>>,
    /// The live policy set, whose version a record no set decided is stamped with.
    pub(super) policies: Option<Arc<crate::policy_store::PolicyStore>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Record(r) => f.debug_tuple("Record").field(&r.request_id).finish(),
            Command::Flush(_) => f.write_str("Flush"),
            Command::Close(_) => f.write_str("Close"),
        }
    }
}

/// The `error` of a request refused because its record could not be written.
pub(super) const AUDIT_UNAVAILABLE: &str = "audit_unavailable";

impl AuditSink {
    /// The span exporter, if telemetry is on.
    pub fn spans(&self) -> Option<Arc<crate::telemetry::Spans>> {
        self.spans.clone()
    }

    /// This sink, making a span of every record it queues.
    pub fn with_spans(mut self, spans: Option<Arc<crate::telemetry::Spans>>) -> Self {
        self.spans = spans;
        self
    }

    /// This sink, stamping every record that names no policy version with the version of
    /// the set `policies` holds when it is queued.
    pub fn with_policies(mut self, policies: Arc<crate::policy_store::PolicyStore>) -> Self {
        self.policies = Some(policies);
        self
    }

    /// Record a session lifecycle event (paused, resumed, ended by a human) in the chain.
    pub fn session_event(
        &self,
        metrics: &Arc<Metrics>,
        session: &str,
        agent: &str,
        tenant: &str,
        what: &str,
    ) {
        let request_id = crate::ids::request_id();
        let mut audit = super::AuditGuard::start(self, metrics, &request_id, "session");
        audit.update(|r| {
            r.session = Some(session.to_owned());
            r.agent = (!agent.is_empty()).then(|| agent.to_owned());
            r.tenant = (!tenant.is_empty()).then(|| tenant.to_owned());
            r.reason = Some(what.to_owned());
        });
        audit.allow(0);
    }

    /// Queue one record. Once the queue is full, the refusal of a request refused for that
    /// very reason is counted rather than queued (memory stays bounded during an outage);
    /// every other record is queued. If the writer has stopped, the record is logged.
    pub fn send(&self, mut record: AuditRecord) {
        // A decision's record names the set that made it (taken with the set, whatever was
        // swapped in since); any other names the one in force now.
        if let (None, Some(policies)) = (&record.policy_version, &self.policies) {
            record.policy_version = Some(policies.current().version().to_string());
        }
        if let Some(spans) = &self.spans {
            spans.record(&record);
        }
        // The shadow set compares the kept decision on its own thread.
        if let Some(shadow) = self.policies.as_ref().and_then(|p| p.shadow()) {
            shadow.observe(&record);
        }
        let foldable = record.error.as_deref() == Some(AUDIT_UNAVAILABLE);
        if !self.health.admit(foldable) {
            return;
        }
        if let Err(e) = self.tx.send(Command::Record(Box::new(record))) {
            self.health.unadmit();
            if let Command::Record(r) = e.0 {
                log_unwritten(&r, "the audit writer has stopped");
            }
        } else if self.health.fills_a_batch() {
            self.wake_writer();
        }
    }

    /// Wait until every record sent before this call is committed and checkpointed: `true`
    /// then, `false` at once if the trail is unavailable (nobody waits out an outage).
    pub async fn flush(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_err() {
            return false;
        }
        self.wake_writer();
        rx.await.unwrap_or(false)
    }

    /// The request path's check before it decides or forwards anything: `503
    /// audit_unavailable` unless records can be written. A full queue, and nothing else
    /// wrong, is waited out for up to [`Limits::full_wait`] (`health.rs`).
    pub async fn writable(&self) -> Result<(), ProxyError> {
        if self.health.unavailable().is_none() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.health.limits.full_wait;
        while self.health.only_full() {
            // Registered before the check below, so that room made in between still wakes.
            let room = self.health.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if !self.health.only_full() {
                break;
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                break;
            }
        }
        self.ensure_writable()
    }

    /// [`Self::writable`] without waiting: `503 audit_unavailable` at once.
    fn ensure_writable(&self) -> Result<(), ProxyError> {
        match self.health.unavailable() {
            None => Ok(()),
            Some(reason) => Err(ProxyError::AuditUnavailable { reason }),
        }
    }

    /// The trail's state, for `/readyz`.
    pub fn status(&self) -> Status {
        self.health.status()
    }

    /// Write everything queued (retrying for [`Limits::shutdown_grace`] if writes fail),
    /// then stop the writer. Returns how many records could not be written; each of those
    /// was logged, as the only trace left of it.
    pub async fn close(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Close(tx)).is_err() {
            return 0;
        }
        self.wake_writer();
        rx.await.unwrap_or(0)
    }

    /// Someone waits on the writer, or a batch is full: cut its nap short. (A writer blocked
    /// on the channel was woken by the send itself; an unpark then only makes its next nap
    /// end at once.)
    fn wake_writer(&self) {
        if let Some(writer) = &self.writer {
            writer.unpark();
        }
    }
}

pub(super) fn log_unwritten(record: &AuditRecord, why: &str) {
    // A record holds no secrets (record.rs), so the log may carry it whole.
    let json = serde_json::to_string(record).unwrap_or_default();
    tracing::error!(record = %json, why, "audit record not written; this log line is its only trace");
}

#[cfg(test)]
mod tests {
    use super::super::health::Limits;
    use super::*;
    use std::time::Duration;

    fn sink(queue: usize, full_wait: Duration) -> (AuditSink, mpsc::Receiver<Command>) {
        let limits = Limits {
            queue,
            full_wait,
            ..Limits::default()
        };
        let (tx, rx) = mpsc::channel();
        let health = Arc::new(Health::new(limits, 0, &Metrics::default()));
        (
            AuditSink {
                tx,
                writer: None,
                health,
                spans: None,
                policies: None,
            },
            rx,
        )
    }

    fn refused(result: Result<(), ProxyError>) -> String {
        match result {
            Err(ProxyError::AuditUnavailable { reason }) => reason,
            other => panic!("expected audit_unavailable, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_full_queue_is_waited_out_while_records_leave_it() {
        let (sink, _rx) = sink(2, Duration::from_secs(30));
        sink.writable().await.unwrap();
        assert!(sink.health.admit(false) && sink.health.admit(false));
        assert!(sink.ensure_writable().is_err(), "full: refused at once");
        let health = sink.health.clone();
        let drain = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            health.dequeued(1);
        });
        sink.writable().await.unwrap();
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn a_queue_that_stays_full_is_refused_after_the_wait() {
        let (sink, _rx) = sink(1, Duration::from_millis(20));
        assert!(sink.health.admit(false));
        let reason = refused(sink.writable().await);
        assert!(reason.contains("1 records are waiting"), "{reason}");
    }

    #[tokio::test]
    async fn a_failing_trail_is_refused_at_once_however_long_the_wait() {
        let (sink, _rx) = sink(1, Duration::from_secs(3600));
        assert!(sink.health.admit(false));
        sink.health.failed("database or disk is full".into());
        let answer = tokio::time::timeout(Duration::from_secs(10), sink.writable())
            .await
            .expect("a failing trail is not waited out");
        assert_eq!(refused(answer), "database or disk is full");
    }
}
