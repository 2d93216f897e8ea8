//! The audit writer: one thread owns the chain and appends records in batches.
//!
//! Each record is sealed as `hash = HMAC-SHA256(audit key, prev ‖ seq ‖ record)`, where
//! `prev` is the previous record's hash. Editing, inserting or deleting a row breaks the
//! chain; without the key (kept in the state directory, never in the database) the chain
//! cannot be recomputed. The head is checkpointed ([`super::chain`]) so that deleting the
//! newest rows is detected too, at the next start-up and by `verify`: at most every
//! [`Limits::checkpoint_every`] while records keep coming, and at once for a flush (a held
//! approval, a pause, an audit query) or at shutdown. Rows past the head are accepted as
//! a crash between commit and checkpoint would leave them.
//!
//! The request path never waits for a disk write: records go to an in-memory queue, and
//! the writer commits them in groups — whatever is queued (up to [`Limits::batch`]
//! records) once the oldest has waited [`Limits::linger`], or at once when a flush or
//! shutdown waits or the batch is full. It fails closed: the first commit or
//! checkpoint that fails (disk full, I/O error) marks the trail unavailable
//! ([`super::health`]) — for a database whose write lock another connection holds, once
//! every attempt (each bounded by the store's audit busy timeout,
//! `ostiary_store::sqlite::Options`) has found it held for [`Limits::stall`], or half the
//! queue waits — and the
//! request path forwards nothing until the writer has written its whole backlog again.
//! Queued records are kept and retried with backoff, never dropped; since each retry
//! re-seals the same records with the same sequence numbers, the chain has no gap when
//! writing resumes.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::attest::Signer;
use super::chain::{self, ChainError, Tip};
pub use super::chain::{seal, GENESIS};
use super::health::{Health, Limits, Status};
use super::record::AuditRecord;
use super::signing::Signing;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::store::audit::{AppendError, AuditRow, AuditStore};
use crate::store::StoreError;

enum Command {
    Record(Box<AuditRecord>),
    Flush(oneshot::Sender<bool>),
    Close(oneshot::Sender<usize>),
}

/// Cheap handle to send records to the writer; never blocks the request path.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: mpsc::Sender<Command>,
    health: Arc<Health>,
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
const AUDIT_UNAVAILABLE: &str = "audit_unavailable";

impl AuditSink {
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
    pub fn send(&self, record: AuditRecord) {
        let foldable = record.error.as_deref() == Some(AUDIT_UNAVAILABLE);
        if !self.health.admit(foldable) {
            return;
        }
        if let Err(e) = self.tx.send(Command::Record(Box::new(record))) {
            self.health.unadmit();
            if let Command::Record(r) = e.0 {
                log_unwritten(&r, "the audit writer has stopped");
            }
        }
    }

    /// Wait until every record sent before this call is committed and checkpointed: `true`
    /// then, `false` at once if the trail is unavailable (nobody waits out an outage).
    pub async fn flush(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_err() {
            return false;
        }
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
        rx.await.unwrap_or(0)
    }
}

fn log_unwritten(record: &AuditRecord, why: &str) {
    // A record holds no secrets (record.rs), so the log may carry it whole.
    let json = serde_json::to_string(record).unwrap_or_default();
    tracing::error!(record = %json, why, "audit record not written; this log line is its only trace");
}

/// The writer thread's handle; dropping every sink (or [`AuditSink::close`]) and joining
/// drains the queue.
#[derive(Debug)]
pub struct AuditWriter {
    thread: Option<thread::JoinHandle<()>>,
}

impl AuditWriter {
    /// Start the writer on `trail`, sealing with `key`, checkpointing the head to
    /// `head_path`. Refuses a chain that no longer matches its checkpoint ([`ChainError`]).
    pub fn start(
        trail: Arc<dyn AuditStore>,
        key: Vec<u8>,
        head_path: PathBuf,
        metrics: &Metrics,
    ) -> Result<(Self, AuditSink), ChainError> {
        Self::start_with(trail, key, head_path, metrics, Limits::default(), None)
    }

    /// [`AuditWriter::start`] with other bounds, and signing checkpoints with `signer`
    /// ([`super::attest`]) at most every [`Limits::sign_every`] and at shutdown.
    pub fn start_with(
        trail: Arc<dyn AuditStore>,
        key: Vec<u8>,
        head_path: PathBuf,
        metrics: &Metrics,
        limits: Limits,
        signer: Option<Arc<Signer>>,
    ) -> Result<(Self, AuditSink), ChainError> {
        // Records are durable before the checkpoint names them: the store commits with
        // `synchronous = FULL` (a power cut must not lose commits the head already names,
        // or the next start would see a truncation).
        let tip = chain::check_tip(&*trail, &key, &head_path)?;
        // The anchor line: a log kept off this machine can later show a rollback of both
        // the database and its checkpoint, which nothing on this machine can.
        tracing::info!(seq = tip.seq, hash = %tip.hash, "audit chain head");
        let signing = signer
            .map(|signer| Signing::start(signer, limits.sign_every, &*trail))
            .transpose()?;
        let health = Arc::new(Health::new(limits, tip.seq, metrics));
        let mut writer = Writer {
            trail,
            key,
            head_path,
            tip,
            head_dirty: true,
            last_checkpoint: None,
            oldest: None,
            health: health.clone(),
            pending: VecDeque::new(),
            waiters: Vec::new(),
            received: 0,
            written: 0,
            checkpointed: 0,
            retry: Retry::default(),
            outage: None,
            contended: None,
            signing,
        };
        // A checkpoint behind the chain (a crash between commit and checkpoint) is caught
        // up, and a new chain gets its first one; a failure here starts the proxy with the
        // trail unavailable rather than not at all.
        writer.write_once(true);
        let (tx, rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("ostiary-audit".into())
            .spawn(move || writer.run(&rx))
            .map_err(|e| ChainError::Store(StoreError::Task(e.to_string())))?;
        Ok((
            Self {
                thread: Some(thread),
            },
            AuditSink { tx, health },
        ))
    }

    /// Wait for the thread to drain its queue and exit (all sinks must be dropped first).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long one batch keeps taking on records other writers appended before it gives up
/// for this attempt (and retries after the backoff). Each round checks what was appended
/// and tries again; with several busy replicas a batch can lose the race many times in a
/// row (seen: 16 lost rounds in a few milliseconds with three replicas under load), so the
/// bound is time, not a count: what it guards against is a store that never settles.
const ADOPT_FOR: Duration = Duration::from_secs(2);

/// Why a batch or a checkpoint could not be written; the text is what `/readyz`, the
/// log and the outage's record say.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("serialising a record: {0}")]
    Serialise(#[from] serde_json::Error),
    #[error("writing the head checkpoint: {0}")]
    Checkpoint(std::io::Error),
    #[error(
        "the chain was changed by another writer (it should end at record {expected}, it ends \
         at record {found}); restart to have it checked"
    )]
    Changed { expected: i64, found: i64 },
    #[error(
        "records another writer appended do not check: {0}; restart to have the chain checked"
    )]
    Foreign(String),
}

impl WriteError {
    /// The store's write lock was held by another connection past the attempt's bound.
    fn is_busy(&self) -> bool {
        matches!(self, WriteError::Store(StoreError::Busy(_)))
    }
}

/// When the next attempt after a failure is due.
#[derive(Debug, Default)]
struct Retry {
    next: Option<Instant>,
    delay: Duration,
}

impl Retry {
    fn wait(&self) -> Duration {
        self.next.map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        })
    }

    fn back_off(&mut self, limits: &Limits) {
        self.delay = (self.delay * 2).clamp(limits.retry_min, limits.retry_max);
        self.next = Some(Instant::now() + self.delay);
    }

    fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Since when, and why, records cannot be written.
#[derive(Debug)]
struct Outage {
    since: Instant,
    since_ms: i64,
    reason: String,
}

struct Writer {
    trail: Arc<dyn AuditStore>,
    key: Vec<u8>,
    head_path: PathBuf,
    /// The last committed record.
    tip: Tip,
    /// `tip` is committed but not yet checkpointed.
    head_dirty: bool,
    /// When the head was last checkpointed (none yet: due at once).
    last_checkpoint: Option<Instant>,
    /// When the oldest pending record arrived (group commit).
    oldest: Option<Instant>,
    health: Arc<Health>,
    pending: VecDeque<AuditRecord>,
    /// Flushes and the count of records received before each.
    waiters: Vec<(u64, oneshot::Sender<bool>)>,
    received: u64,
    written: u64,
    /// `written` as of the last checkpoint: what a flush may be answered for.
    checkpointed: u64,
    retry: Retry,
    outage: Option<Outage>,
    /// Since when every write has found the store's write lock held by another connection
    /// (and failed on nothing else).
    contended: Option<Instant>,
    /// Signed checkpoints, when a signing key is configured.
    signing: Option<Signing>,
}

/// A shutdown in progress: its deadline and who waits for it.
struct Closing {
    deadline: Instant,
    waiters: Vec<oneshot::Sender<usize>>,
}

impl Writer {
    fn busy(&self) -> bool {
        !self.pending.is_empty() || self.head_dirty
    }

    /// Rows wait for a signed checkpoint (due at its interval, or at shutdown).
    fn unsigned(&self) -> bool {
        self.signing.as_ref().is_some_and(|s| s.unsigned(&self.tip))
    }

    fn sign_due_at(&self) -> Option<Instant> {
        self.signing.as_ref().and_then(|s| s.due_at(&self.tip))
    }

    fn run(mut self, rx: &mpsc::Receiver<Command>) {
        let mut closing: Option<Closing> = None;
        loop {
            let open = self.collect(rx, &mut closing);
            // Before writing: a flush whose records are already written is answered even if
            // the next write fails.
            self.answer_flushes();
            if !open && closing.is_none() {
                closing = Some(Closing {
                    deadline: Instant::now() + self.health.limits.shutdown_grace,
                    waiters: Vec::new(),
                });
            }
            let sign_due = self.sign_due_at().is_some_and(|t| t <= Instant::now());
            if (self.busy() || sign_due || (closing.is_some() && self.unsigned()))
                && self.retry.wait().is_zero()
            {
                self.write_once(closing.is_some());
            }
            self.answer_flushes();
            let Some(c) = &closing else { continue };
            if !(self.busy() || self.unsigned()) || Instant::now() >= c.deadline {
                break;
            }
        }
        let unwritten = self.abandon();
        for (_, w) in self.waiters.drain(..) {
            let _ = w.send(false);
        }
        for w in closing.map(|c| c.waiters).unwrap_or_default() {
            let _ = w.send(unwritten);
        }
    }

    /// Take what is queued: block while idle, else wait at most until the next retry (or
    /// the shutdown deadline). `false` once every sink is gone.
    fn collect(&mut self, rx: &mpsc::Receiver<Command>, closing: &mut Option<Closing>) -> bool {
        let first = if !self.busy() && closing.is_none() {
            // Idle: until a command comes, or the next signed checkpoint is due (not before
            // the retry of a failed one).
            let next = match self.sign_due_at() {
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(at) => {
                    let at = at.saturating_duration_since(Instant::now());
                    rx.recv_timeout(at.max(self.retry.wait()))
                }
            };
            match next {
                Ok(cmd) => cmd,
                Err(RecvTimeoutError::Timeout) => return true,
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        } else {
            let mut wait = self.retry.wait();
            if wait.is_zero() && closing.is_none() && self.waiters.is_empty() {
                wait = self.until_due();
                // Gathering a group: asleep rather than waiting on the channel, so that the
                // records arriving meanwhile do not each wake this thread (a futex call and
                // a context switch per request). A flush or shutdown sent meanwhile waits
                // out the linger at most; a dirty head alone waits on the channel.
                if !self.pending.is_empty() && !wait.is_zero() {
                    thread::sleep(wait.min(self.health.limits.linger));
                    return self.drain(rx, closing);
                }
            }
            if let Some(c) = closing {
                wait = wait.min(c.deadline.saturating_duration_since(Instant::now()));
            }
            match rx.recv_timeout(wait) {
                Ok(cmd) => cmd,
                Err(RecvTimeoutError::Timeout) => return true,
                Err(RecvTimeoutError::Disconnected) => {
                    // Nothing more can arrive: wait out the backoff here rather than spin.
                    thread::sleep(wait);
                    return false;
                }
            }
        };
        self.take(first, closing);
        self.drain(rx, closing)
    }

    /// Take everything queued without waiting; `false` once every sink is gone.
    fn drain(&mut self, rx: &mpsc::Receiver<Command>, closing: &mut Option<Closing>) -> bool {
        loop {
            match rx.try_recv() {
                Ok(cmd) => self.take(cmd, closing),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn take(&mut self, cmd: Command, closing: &mut Option<Closing>) {
        match cmd {
            Command::Record(r) => {
                self.oldest.get_or_insert_with(Instant::now);
                self.pending.push_back(*r);
                self.received += 1;
            }
            Command::Flush(w) if self.health.is_failing() => {
                let _ = w.send(false);
            }
            Command::Flush(w) => self.waiters.push((self.received, w)),
            Command::Close(w) => closing
                .get_or_insert_with(|| Closing {
                    deadline: Instant::now() + self.health.limits.shutdown_grace,
                    waiters: Vec::new(),
                })
                .waiters
                .push(w),
        }
    }

    /// Flushes whose records are all written (a failure answers the rest, in `fail`).
    fn answer_flushes(&mut self) {
        let written = self.checkpointed;
        let (done, waiting) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition::<Vec<_>, _>(|(target, _)| *target <= written);
        self.waiters = waiting;
        for (_, w) in done {
            let _ = w.send(true);
        }
    }

    /// When the pending records are due to be committed: once the oldest has waited the
    /// linger, at once when a batch is full; never when nothing is pending.
    fn records_due_at(&self) -> Option<Instant> {
        let limits = &self.health.limits;
        self.oldest.map(|t| {
            if self.pending.len() >= limits.batch {
                t
            } else {
                t + limits.linger
            }
        })
    }

    /// When the head is due to be checkpointed: `checkpoint_every` after the last one (at
    /// once when there was none); never while it is clean.
    fn head_due_at(&self) -> Option<Instant> {
        let every = self.health.limits.checkpoint_every;
        self.head_dirty.then(|| {
            self.last_checkpoint
                .map_or_else(Instant::now, |t| t + every)
        })
    }

    /// How long until the next group commit or checkpoint is due (zero: now).
    fn until_due(&self) -> Duration {
        let Some(next) = [
            self.records_due_at(),
            self.head_due_at(),
            self.sign_due_at(),
        ]
        .into_iter()
        .flatten()
        .min() else {
            return Duration::ZERO;
        };
        next.saturating_duration_since(Instant::now())
    }

    /// What is due — a group commit, a signed checkpoint, a head checkpoint — or everything
    /// at once when `closing` (shutdown) or a flush waits; one retry of a failed write.
    fn write_once(&mut self, closing: bool) {
        let urgent = closing || !self.waiters.is_empty() || self.retry.next.is_some();
        self.health.begin_write();
        let result = self.write_due(urgent, closing);
        self.health.end_write();
        match result {
            Ok(()) => {
                self.contended = None;
                self.retry.reset();
                self.after_success();
            }
            Err(e) if e.is_busy() && self.still_contended() => {
                // Another connection holds the write lock — on SQLite, the approvals' and
                // sessions' own, through a burst of holds — so the lock bound of one
                // attempt ran out. Waited out, like a slow disk, up to `stall` before the
                // trail counts as failing; flushes keep waiting.
                self.retry.next = Some(Instant::now() + self.health.limits.retry_min);
            }
            Err(e) => {
                self.contended = None;
                self.fail(e);
            }
        }
    }

    /// Whether lock contention is still worth waiting out: begun at the first busy write
    /// less than [`Limits::stall`] ago, and with fewer than half [`Limits::queue`] records
    /// waiting — so that when it is not, the refusals that follow still find room to be
    /// recorded one by one.
    fn still_contended(&mut self) -> bool {
        let since = *self.contended.get_or_insert_with(Instant::now);
        since.elapsed() < self.health.limits.stall
            && self.pending.len() < self.health.limits.queue / 2
    }

    fn write_due(&mut self, urgent: bool, closing: bool) -> Result<(), WriteError> {
        let due = |at: Option<Instant>| at.is_some_and(|t| urgent || Instant::now() >= t);
        if due(self.records_due_at()) {
            self.write_batch()?;
        }
        // After the batch, so that it covers the batch; at shutdown only once every record
        // is written (the last checkpoint covers them all). Not for a flush: a held
        // approval would cost a checkpoint record each.
        let sign_at = self.sign_due_at();
        if sign_at.is_some_and(|t| Instant::now() >= t)
            || (closing && sign_at.is_some() && self.pending.is_empty())
        {
            self.sign()?;
        }
        // After the batch and the signed checkpoint: they are what makes the head dirty.
        if due(self.head_due_at()) {
            self.checkpoint()?;
        }
        Ok(())
    }

    fn write_batch(&mut self) -> Result<(), WriteError> {
        if self.pending.is_empty() {
            self.oldest = None;
            return Ok(());
        }
        let n = self.pending.len().min(self.health.limits.batch);
        let started = Instant::now();
        // Out of `self` while it is written (nothing else touches the queue meanwhile), so
        // the batch is lent, not copied.
        let mut pending = std::mem::take(&mut self.pending);
        let written = self.append_adopting(&pending.make_contiguous()[..n]);
        self.pending = pending;
        let rows = written?;
        if let Some(signing) = &mut self.signing {
            signing.written(&rows);
        }
        self.pending.drain(..n);
        // What is left waited as long as the batch just written: due at once.
        self.oldest = (!self.pending.is_empty()).then_some(self.oldest.unwrap_or(started));
        self.written += n as u64;
        self.health.dequeued(n);
        self.head_dirty = true;
        Ok(())
    }

    /// Append `records` after the tip, taking on what other writers appended meanwhile;
    /// the rows written.
    fn append_adopting(&mut self, records: &[AuditRecord]) -> Result<Vec<AuditRow>, WriteError> {
        let adopting = Instant::now();
        loop {
            match append(&*self.trail, &self.key, &self.tip, records) {
                // Another writer sharing the store (a replica, on PostgreSQL) extended the
                // chain: its records are checked — numbered on, linked, sealed with the key
                // only Ostiary holds — and ours are sealed after them. A chain that ends
                // *before* our tip lost rows, and stays refused.
                Err(WriteError::Changed { expected, found })
                    if found > expected && adopting.elapsed() < ADOPT_FOR =>
                {
                    self.tip = chain::check_tail(&*self.trail, &self.key, &self.tip)
                        .map_err(|e| WriteError::Foreign(e.problem()))?;
                    if let Some(signing) = &mut self.signing {
                        signing.adopted();
                    }
                }
                other => {
                    let (tip, rows) = other?;
                    self.tip = tip;
                    return Ok(rows);
                }
            }
        }
    }

    /// Sign the rows since the last signed checkpoint: a checkpoint record, appended like
    /// any other (the next checkpoint covers it).
    fn sign(&mut self) -> Result<(), WriteError> {
        let Some(signing) = &mut self.signing else {
            return Ok(());
        };
        let adopting = Instant::now();
        loop {
            let record = signing.checkpoint(&*self.trail, &self.tip)?;
            match append(
                &*self.trail,
                &self.key,
                &self.tip,
                std::slice::from_ref(&record),
            ) {
                // Signed again over the rows another writer added: a checkpoint's range
                // always ends at the row right before it, which is what lets a verifier
                // follow the ranges through an export in one pass.
                Err(WriteError::Changed { expected, found })
                    if found > expected && adopting.elapsed() < ADOPT_FOR =>
                {
                    self.tip = chain::check_tail(&*self.trail, &self.key, &self.tip)
                        .map_err(|e| WriteError::Foreign(e.problem()))?;
                    signing.adopted();
                }
                other => {
                    let (tip, rows) = other?;
                    self.tip = tip;
                    if let Some(checkpoint) = &record.checkpoint {
                        signing.signed(checkpoint, &rows);
                    }
                    self.head_dirty = true;
                    return Ok(());
                }
            }
        }
    }

    fn checkpoint(&mut self) -> Result<(), WriteError> {
        chain::write_head(&self.key, &self.head_path, &self.tip).map_err(WriteError::Checkpoint)?;
        self.head_dirty = false;
        self.last_checkpoint = Some(Instant::now());
        self.checkpointed = self.written;
        self.health.committed(self.tip.seq);
        Ok(())
    }

    fn fail(&mut self, e: WriteError) {
        let reason = e.to_string();
        if self.health.failed(reason.clone()) {
            tracing::error!(
                error = %reason,
                queued = self.pending.len(),
                "audit records cannot be written: nothing is forwarded (503 audit_unavailable) \
                 until they can; queued records are kept and retried"
            );
            self.outage = Some(Outage {
                since: Instant::now(),
                since_ms: crate::store::now_ms(),
                reason,
            });
        } else {
            tracing::debug!(error = %reason, "audit write retry failed");
        }
        self.retry.back_off(&self.health.limits);
        // Nobody waits out an outage: flushes are answered `false` now.
        for (_, w) in self.waiters.drain(..) {
            let _ = w.send(false);
        }
    }

    /// After a successful write: the end of an outage once the backlog is written, and a
    /// record of what could not be recorded one by one meanwhile.
    fn after_success(&mut self) {
        if self.busy() {
            return;
        }
        if self.health.is_failing() && self.health.recovered() {
            if let Some(outage) = self.outage.take() {
                let lasted = outage.since.elapsed().as_millis();
                tracing::warn!(
                    after_ms = lasted as u64,
                    "audit records can be written again; forwarding resumes"
                );
                self.push_own(format!(
                    "audit records could not be written for {lasted} ms from {} ({}); nothing \
                     was forwarded meanwhile",
                    outage.since_ms, outage.reason
                ));
            }
        }
        if self.health.unavailable().is_none() {
            let folded = self.health.take_folded();
            if folded > 0 {
                self.push_own(format!(
                    "{folded} requests were refused (audit_unavailable) while the audit queue \
                     was full; they are counted here rather than recorded one by one"
                ));
            }
        }
    }

    /// A record of the trail's own (kind `audit`), queued like any other.
    fn push_own(&mut self, reason: String) {
        self.health.admit(false);
        self.received += 1;
        self.oldest.get_or_insert_with(Instant::now);
        self.pending.push_back(AuditRecord {
            ts_ms: crate::store::now_ms(),
            request_id: crate::ids::request_id(),
            kind: "audit".into(),
            decision: "error".into(),
            error: Some(AUDIT_UNAVAILABLE.into()),
            reason: Some(reason),
            ..Default::default()
        });
    }

    /// At shutdown, what could not be written is logged, the only trace left of it.
    fn abandon(&mut self) -> usize {
        let n = self.pending.len();
        if n > 0 {
            tracing::error!(
                unwritten = n,
                "audit records could not be written before shutdown; each is logged below"
            );
        }
        for record in self.pending.drain(..) {
            log_unwritten(&record, "the audit trail was unavailable at shutdown");
        }
        self.oldest = None;
        self.health.dequeued(n);
        n
    }
}

/// Append `records` after `tip` in one transaction; the new tip and the rows written.
fn append(
    trail: &dyn AuditStore,
    key: &[u8],
    tip: &Tip,
    records: &[AuditRecord],
) -> Result<(Tip, Vec<AuditRow>), WriteError> {
    let (mut seq, mut prev) = (tip.seq, tip.hash.clone());
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        seq += 1;
        let json = serde_json::to_string(record)?;
        let hash = seal(key, &prev, seq, &json);
        rows.push(AuditRow {
            seq,
            ts_ms: record.ts_ms,
            session: record.session.clone(),
            decision: record.decision.clone(),
            record: json,
            prev: std::mem::replace(&mut prev, hash.clone()),
            hash,
        });
    }
    // The chain must still end where this writer left it: a second writer on the same
    // database, or rows deleted while running, would otherwise fork or gap the chain.
    trail.append(tip, &rows).map_err(|e| match e {
        AppendError::Moved { expected, found } => WriteError::Changed { expected, found },
        AppendError::Store(e) => WriteError::Store(e),
    })?;
    Ok((Tip { seq, hash: prev }, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(queue: usize, full_wait: Duration) -> (AuditSink, mpsc::Receiver<Command>) {
        let limits = Limits {
            queue,
            full_wait,
            ..Limits::default()
        };
        let (tx, rx) = mpsc::channel();
        let health = Arc::new(Health::new(limits, 0, &Metrics::default()));
        (AuditSink { tx, health }, rx)
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
