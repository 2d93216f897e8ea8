//! Whether the audit trail can take records: the flag the writer sets on its first failed
//! commit and clears once its backlog is written, read by the request path before anything
//! is forwarded (fail closed), by `/readyz` and by `/metrics`.
//!
//! The request path never waits for a disk write: it reads atomics. Three things make the
//! trail unavailable:
//! - the writer's last commit or checkpoint failed (disk full, I/O error, the database
//!   locked for longer than the store's audit busy timeout, the chain changed underneath
//!   it);
//! - a commit has been in progress for longer than [`Limits::stall`] (a disk that hangs
//!   rather than fails), seen by the reader without the writer's help;
//! - [`Limits::queue`] records are waiting (the writer cannot keep up), or half of them
//!   while a write has been in progress for longer than [`Limits::retry_min`] (a write lock
//!   another connection holds: each attempt waits up to the store's busy timeout, and in that
//!   time a fast client could fill the whole queue, leaving no room to record the refusals
//!   that follow one by one). This one alone is waited out for up to [`Limits::full_wait`] by
//!   the request path ([`super::sink::AuditSink::writable`]): a commit slowed by the disk for
//!   a moment is latency, not a burst of 503s, and the bound on records not yet written
//!   still holds.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::Metrics;

/// The writer's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Records waiting to be written past which nothing more is forwarded; past it, the
    /// records of requests refused for that reason are counted, not queued.
    pub queue: usize,
    /// How long a request waits for room in a full queue before its `503`.
    pub full_wait: Duration,
    /// How long a commit may be in progress before the trail counts as unavailable anyway.
    pub stall: Duration,
    /// Largest number of records written in one transaction.
    pub batch: usize,
    /// First and longest wait between retries of a failed write.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How long shutdown keeps retrying before it logs what it could not write.
    pub shutdown_grace: Duration,
    /// Group commit: a batch short of `batch` records waits this long from its first
    /// record for more, unless a flush or shutdown is waiting. Records are queued after
    /// the answer was sent, so this delays when a record is durable, never a response.
    pub linger: Duration,
    /// The head is checkpointed at most this often while records keep coming (a flush or
    /// shutdown checkpoints at once): each checkpoint is a file written, synced and renamed.
    pub checkpoint_every: Duration,
    /// A signed checkpoint ([`super::attest`]) is made at most this long after the previous
    /// one while records come (`[audit] signed_checkpoint_interval`), and at shutdown.
    pub sign_every: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Two batches: never more than that many forwarded requests whose records are
            // not yet committed (plus those in flight when the bound was reached).
            queue: 1_024,
            // Flat out (15,000 records/s) a full queue is ~70 ms of records: one commit
            // whose WAL sync or checkpoint the disk held up. Well short of `stall`.
            full_wait: Duration::from_millis(250),
            // Long enough that a slow fsync on a busy disk is not taken for a hang, nor a
            // burst of the store's other writers for a lost lock (the audit connection's
            // attempts are bounded at 250 ms each; the writer retries them up to this).
            stall: Duration::from_secs(2),
            batch: 512,
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
            // One commit per request cost a synced WAL write each: at one client's
            // 3,000 req/s, a fifth of the proxy's CPU (benches/results/profile-http.svg).
            // Each commit also has a cost of its own (a transaction, its WAL frames, a
            // wake of this thread): 5 ms rather than 2 ms took the writer's CPU per record
            // to 0.70x at one client and 0.86x flat out (docs/benchmarks.md). 20 ms rather
            // than 5 ms took the one-client p99 added by the proxy from +403 to +160 µs
            // (tool calls) and +391 to +126 µs (plain HTTP): 200 short bursts of commit work
            // a second on two shared cores delayed ~1% of requests behind them. A process
            // crash loses what waits here; a power cut already loses up to the 50 ms of
            // records the head does not name yet.
            linger: Duration::from_millis(20),
            checkpoint_every: Duration::from_millis(50),
            sign_every: Duration::from_secs(60),
        }
    }
}

/// What `/readyz` reports about the trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub available: bool,
    /// Why not, when not.
    pub reason: Option<String>,
    /// Records waiting to be written.
    pub queued: usize,
    /// The last committed record.
    pub head_seq: i64,
}

/// Shared between the writer thread and every sink.
#[derive(Debug)]
pub(crate) struct Health {
    pub(crate) limits: Limits,
    failing: AtomicBool,
    reason: Mutex<String>,
    queued: AtomicUsize,
    /// Milliseconds since `base` (plus one) at which the commit in progress began; 0 when
    /// none is.
    busy_since: AtomicU64,
    /// The last write found the store's write lock held by another connection, and none
    /// has succeeded since: between its retries no write is in progress, and the queue
    /// must stay half full all the same.
    contended: AtomicBool,
    base: Instant,
    /// Refusals not queued because the queue was full; summed into one record later.
    folded: AtomicU64,
    head_seq: AtomicI64,
    gauges: Gauges,
    /// Woken whenever records leave the queue, for requests waiting for room.
    pub(crate) room: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Gauges {
    available: Gauge,
    queued: Gauge,
    head_seq: Gauge,
    failures: Counter,
    folded: Counter,
}

impl Health {
    pub(crate) fn new(limits: Limits, head_seq: i64, metrics: &Metrics) -> Self {
        let gauges = Gauges::default();
        gauges.available.set(1);
        gauges.head_seq.set(head_seq);
        metrics.register(
            "audit_available",
            "1 while audit records can be written; 0 while the proxy forwards nothing (503 audit_unavailable)",
            gauges.available.clone(),
        );
        metrics.register(
            "audit_queued_records",
            "Audit records waiting to be written",
            gauges.queued.clone(),
        );
        metrics.register(
            "audit_head_seq",
            "Sequence number of the last committed audit record (an anchor: it never goes down)",
            gauges.head_seq.clone(),
        );
        metrics.register(
            "audit_write_failures",
            "Failed attempts to commit audit records or checkpoint the head (each is retried)",
            gauges.failures.clone(),
        );
        metrics.register(
            "audit_unrecorded_refusals",
            "Requests refused for audit_unavailable while the queue was full, counted instead of recorded one by one",
            gauges.folded.clone(),
        );
        Self {
            limits,
            failing: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            queued: AtomicUsize::new(0),
            busy_since: AtomicU64::new(0),
            contended: AtomicBool::new(false),
            base: Instant::now(),
            folded: AtomicU64::new(0),
            head_seq: AtomicI64::new(head_seq),
            gauges,
            room: tokio::sync::Notify::new(),
        }
    }

    /// Why the trail cannot take records now, if it cannot: the request path's check.
    pub(crate) fn unavailable(&self) -> Option<String> {
        if self.failing.load(Ordering::Acquire) {
            return Some(self.reason());
        }
        let queued = self.queued.load(Ordering::Relaxed);
        if self.full(queued) {
            self.gauges.available.set(0);
            return Some(format!("{queued} records are waiting to be written"));
        }
        let since = self.busy_since.load(Ordering::Acquire);
        if since != 0 {
            let busy = self.elapsed_ms().saturating_sub(since - 1);
            if u128::from(busy) > self.limits.stall.as_millis() {
                self.gauges.available.set(0);
                return Some(format!("a write has not completed for {busy} ms"));
            }
        }
        None
    }

    /// The queue is full and nothing else is wrong: worth waiting for room.
    pub(crate) fn only_full(&self) -> bool {
        !self.failing.load(Ordering::Acquire) && self.full(self.queued.load(Ordering::Relaxed))
    }

    /// Whether `queued` records are as many as may wait: the whole queue, or half of it
    /// while a write has been in progress for longer than a retry's wait or the writer is
    /// retrying a held lock (the rest is kept for the refusals that may follow, each
    /// recorded on its own).
    fn full(&self, queued: usize) -> bool {
        if queued >= self.limits.queue {
            return true;
        }
        if queued < self.limits.queue / 2 {
            return false;
        }
        // Between two attempts on a held lock no write is in progress; without this the
        // queue grew past half in every pause between retries.
        if self.contended.load(Ordering::Acquire) {
            return true;
        }
        let since = self.busy_since.load(Ordering::Acquire);
        since != 0
            && u128::from(self.elapsed_ms().saturating_sub(since - 1))
                > self.limits.retry_min.as_millis()
    }

    pub(crate) fn status(&self) -> Status {
        let reason = self.unavailable();
        Status {
            available: reason.is_none(),
            reason,
            queued: self.queued.load(Ordering::Relaxed),
            head_seq: self.head_seq.load(Ordering::Relaxed),
        }
    }

    fn reason(&self) -> String {
        self.reason
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|_| "the audit writer failed".into())
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A record was queued (`true`), or was not because the queue is full and it is a
    /// refusal that can be counted instead (`false`).
    pub(crate) fn admit(&self, foldable: bool) -> bool {
        if foldable && self.queued.load(Ordering::Relaxed) >= self.limits.queue {
            self.folded.fetch_add(1, Ordering::Relaxed);
            self.gauges.folded.inc();
            return false;
        }
        let queued = self.queued.fetch_add(1, Ordering::Relaxed) + 1;
        self.gauges
            .queued
            .set(i64::try_from(queued).unwrap_or(i64::MAX));
        true
    }

    /// Whether the record just admitted filled a batch: the writer, gathering asleep, is
    /// woken for it rather than waiting out its linger.
    pub(crate) fn fills_a_batch(&self) -> bool {
        let batch = self.limits.batch.max(1);
        self.queued.load(Ordering::Relaxed).is_multiple_of(batch)
    }

    /// A record that was admitted will never reach the writer (it has stopped).
    pub(crate) fn unadmit(&self) {
        self.dequeued(1);
    }

    // --- the writer's side ---

    pub(crate) fn begin_write(&self) {
        self.busy_since
            .store(self.elapsed_ms() + 1, Ordering::Release);
    }

    pub(crate) fn end_write(&self) {
        self.busy_since.store(0, Ordering::Release);
    }

    /// Whether the writer is retrying a write lock another connection holds (set after a
    /// busy attempt, cleared by the next success or failure).
    pub(crate) fn set_contended(&self, contended: bool) {
        self.contended.store(contended, Ordering::Release);
    }

    /// `n` records left the queue (written, or logged at shutdown).
    pub(crate) fn dequeued(&self, n: usize) {
        let left = self
            .queued
            .fetch_sub(n, Ordering::Relaxed)
            .saturating_sub(n);
        self.gauges
            .queued
            .set(i64::try_from(left).unwrap_or(i64::MAX));
        self.room.notify_waiters();
    }

    /// A batch was committed and checkpointed: `head_seq` is the chain's new tip.
    pub(crate) fn committed(&self, head_seq: i64) {
        self.head_seq.store(head_seq, Ordering::Relaxed);
        self.gauges.head_seq.set(head_seq);
        // Readers only ever lower the gauge (a full queue, a stall they saw); every refusal
        // they answer is a record, whose commit brings the writer back here to raise it.
        if self.unavailable().is_none() {
            self.gauges.available.set(1);
        }
    }

    /// A write failed; returns whether the trail was available until now.
    pub(crate) fn failed(&self, reason: String) -> bool {
        self.gauges.failures.inc();
        if let Ok(mut r) = self.reason.lock() {
            *r = reason;
        }
        let was_available = !self.failing.swap(true, Ordering::AcqRel);
        self.gauges.available.set(0);
        was_available
    }

    /// Everything queued is written; returns whether the trail was unavailable until now.
    pub(crate) fn recovered(&self) -> bool {
        let was = self.failing.swap(false, Ordering::AcqRel);
        if self.unavailable().is_none() {
            self.gauges.available.set(1);
        }
        was
    }

    pub(crate) fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// Refusals counted instead of queued since the last call.
    pub(crate) fn take_folded(&self) -> u64 {
        self.folded.swap(0, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(queue: usize) -> Health {
        let limits = Limits {
            queue,
            ..Limits::default()
        };
        Health::new(limits, 0, &Metrics::default())
    }

    #[test]
    fn a_full_queue_refuses_and_folds_only_refusals() {
        let h = health(2);
        assert!(h.admit(false) && h.admit(true));
        assert!(h.unavailable().unwrap().contains("2 records are waiting"));
        assert!(
            !h.admit(true),
            "a refusal past the bound is counted, not queued"
        );
        assert!(
            h.admit(false),
            "any other record is queued whatever the bound"
        );
        assert_eq!(h.take_folded(), 1);
        h.dequeued(3);
        assert_eq!(h.unavailable(), None);
    }

    #[test]
    fn a_failure_holds_until_recovery() {
        let h = health(10);
        assert!(h.failed("database or disk is full".into()));
        assert!(
            !h.failed("still full".into()),
            "only the first failure is a transition"
        );
        assert_eq!(h.unavailable().as_deref(), Some("still full"));
        assert!(!h.status().available);
        assert!(h.recovered());
        assert!(h.status().available);
    }

    #[test]
    fn a_commit_that_hangs_is_seen_by_readers() {
        let h = Health::new(
            Limits {
                stall: Duration::ZERO,
                ..Limits::default()
            },
            0,
            &Metrics::default(),
        );
        h.begin_write();
        std::thread::sleep(Duration::from_millis(5));
        assert!(h.unavailable().unwrap().contains("has not completed"));
        h.end_write();
        assert_eq!(h.unavailable(), None);
    }

    #[test]
    fn half_the_queue_is_full_while_a_write_is_held_up() {
        let h = Health::new(
            Limits {
                queue: 4,
                retry_min: Duration::from_millis(1),
                ..Limits::default()
            },
            0,
            &Metrics::default(),
        );
        assert!(h.admit(false) && h.admit(false));
        assert_eq!(
            h.unavailable(),
            None,
            "no write in progress: half is not full"
        );
        h.begin_write();
        assert_eq!(h.unavailable(), None, "a write just begun is not held up");
        std::thread::sleep(Duration::from_millis(5));
        assert!(h.only_full(), "half the queue behind a held-up write");
        assert!(h.unavailable().unwrap().contains("2 records are waiting"));
        // The refusals that follow are still recorded one by one: room is left for them.
        assert!(h.admit(true) && h.admit(true));
        assert!(!h.admit(true), "past the whole queue they are counted");
        h.end_write();
        h.dequeued(4);
        assert_eq!(h.unavailable(), None);
    }

    #[test]
    fn half_the_queue_is_full_between_retries_of_a_held_lock() {
        let h = health(4);
        assert!(h.admit(false) && h.admit(false));
        h.set_contended(true);
        assert!(
            h.unavailable().unwrap().contains("2 records are waiting"),
            "no write in progress, but the last one found the lock held"
        );
        h.set_contended(false);
        assert_eq!(
            h.unavailable(),
            None,
            "a write got through: half is not full"
        );
    }
}
