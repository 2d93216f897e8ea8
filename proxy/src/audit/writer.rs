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
use super::chain::{self, ChainError, Sealer, Tip};
pub use super::chain::{seal, GENESIS};
use super::health::{Health, Limits};
use super::record::AuditRecord;
use super::rows::{record_text, seal_after, seal_rows, texts};
use super::signing::Signing;
use super::sink::{log_unwritten, AuditSink, Command, AUDIT_UNAVAILABLE};
use crate::metrics::Metrics;
use crate::store::audit::{AppendError, AuditRow, AuditStore};
use crate::store::StoreError;

/// How long after the last record the writer keeps gathering asleep, waking every linger
/// to take what came, instead of blocking on the channel. Agents call in bursts with pauses
/// between; a pause shorter than this costs ~50 wakeups a second of an otherwise idle
/// thread, and no request pays for waking it.
const KEEP_GATHERING: Duration = Duration::from_secs(10);

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
        // Records are durable before the checkpoint names them: the store syncs what it
        // committed before each checkpoint (a power cut must not lose commits the head
        // already names, or the next start would see a truncation).
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
            sealer: Sealer::new(&key),
            head_path,
            tip,
            head_dirty: true,
            last_checkpoint: None,
            oldest: None,
            last_record: None,
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
        let woken = thread.thread().clone();
        Ok((
            Self {
                thread: Some(thread),
            },
            AuditSink {
                tx,
                writer: Some(woken),
                health,
                spans: None,
                policies: None,
            },
        ))
    }

    /// Wait for the thread to drain its queue and exit (all sinks must be dropped first).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long one batch keeps catching up, outside the append lock, with more records than
/// [`crate::store::audit::ADOPT_MAX`] that other writers appended before it gives up for
/// this attempt (and retries after the backoff). Fewer are taken on under the lock, where
/// no race can be lost; this bounds only a writer that stalled while the others kept
/// writing faster than it can read.
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

impl From<AppendError> for WriteError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::Moved { expected, found } | AppendError::Behind { expected, found } => {
                WriteError::Changed { expected, found }
            }
            AppendError::Refused(why) => WriteError::Foreign(why),
            AppendError::Store(e) => WriteError::Store(e),
        }
    }
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
    /// Seals this writer's records and its head checkpoints, and checks other writers'
    /// records ([`Sealer`]): the audit key, held as HMAC's keyed state and nowhere else.
    sealer: Sealer,
    head_path: PathBuf,
    /// The last committed record.
    tip: Tip,
    /// `tip` is committed but not yet checkpointed.
    head_dirty: bool,
    /// When the head was last checkpointed (none yet: due at once).
    last_checkpoint: Option<Instant>,
    /// When the oldest pending record arrived (group commit).
    oldest: Option<Instant>,
    /// When the last record arrived: the writer gathers asleep for a while after it.
    last_record: Option<Instant>,
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

    /// Take what is queued: asleep while records keep coming ([`Writer::nap`]), blocked on
    /// the channel while idle, else waiting at most until the next retry (or the shutdown
    /// deadline). `false` once every sink is gone.
    fn collect(&mut self, rx: &mpsc::Receiver<Command>, closing: &mut Option<Closing>) -> bool {
        if let Some(nap) = self.nap(closing) {
            // Asleep rather than waiting on the channel, so that no record wakes this
            // thread: a waiting receiver costs each request that sends to it a futex call
            // and this thread scheduled beside it, and a request that finds the proxy idle
            // pays most. A flush or a close does wake it (`AuditSink::wake_writer`).
            let napped = Instant::now();
            thread::park_timeout(nap);
            let gathering = self.oldest.is_some();
            let open = self.drain(rx, closing);
            if !gathering && self.oldest.is_some() {
                // What arrived came after the nap began: committed within a linger of that.
                self.oldest = Some(napped);
            }
            return open;
        }
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
                let now = Instant::now();
                self.oldest.get_or_insert(now);
                self.last_record = Some(now);
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

    /// How long to sleep before taking what is queued, if the writer gathers asleep: while
    /// records are pending, until their group is due, and for [`KEEP_GATHERING`] after the
    /// last one came, a linger at a time (so that a record that comes meanwhile is
    /// committed within a linger of coming, as if it had woken the writer). Never when
    /// something waits on the writer or a write is being retried, and never with a linger of
    /// zero (`group_commit = "0s"`: each record is committed as it comes).
    fn nap(&self, closing: &Option<Closing>) -> Option<Duration> {
        let linger = self.health.limits.linger;
        if linger.is_zero()
            || closing.is_some()
            || !self.waiters.is_empty()
            || !self.retry.wait().is_zero()
        {
            return None;
        }
        let recent = self
            .last_record
            .is_some_and(|t| t.elapsed() < KEEP_GATHERING);
        if self.pending.is_empty() && !recent {
            return None;
        }
        let nap = self.next_due().map_or(linger, |at| {
            at.saturating_duration_since(Instant::now()).min(linger)
        });
        (!nap.is_zero()).then_some(nap)
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

    /// When the next group commit or checkpoint is due; none while nothing is.
    fn next_due(&self) -> Option<Instant> {
        [
            self.records_due_at(),
            self.head_due_at(),
            self.sign_due_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// How long until the next group commit or checkpoint is due (zero: now).
    fn until_due(&self) -> Duration {
        self.next_due().map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        })
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
        // Readers keep the queue half full while the writer retries a held lock.
        self.health.set_contended(self.contended.is_some());
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
        written?;
        self.pending.drain(..n);
        // What is left waited as long as the batch just written: due at once.
        self.oldest = (!self.pending.is_empty()).then_some(self.oldest.unwrap_or(started));
        self.written += n as u64;
        self.health.dequeued(n);
        self.head_dirty = true;
        Ok(())
    }

    /// Append `records` after the tip, taking on what other writers appended meanwhile
    /// (read, checked and sealed after under the store's append lock, so that a writer
    /// never loses a race to the others however busy they are); the rows written.
    fn append_adopting(&mut self, records: &[AuditRecord]) -> Result<Vec<AuditRow>, WriteError> {
        // The core offered while serialising, around the append and between the rows it
        // inserts: requests woken onto it wait otherwise ([`crate::store::audit::yielding`]).
        let mut rows = Some(seal_rows(records, texts(records)?));
        thread::yield_now();
        let written = self.append_sealing(&mut |_, _| match rows.take() {
            Some(rows) => Ok(rows),
            // The rows move into the first attempt that builds them rather than each
            // attempt copying every record's text; a store that builds again (a retried
            // transaction) has them serialised anew.
            None => Ok(seal_rows(
                records,
                texts(records).map_err(|e| e.to_string())?,
            )),
        });
        thread::yield_now();
        written
    }

    /// Sign the rows since the last signed checkpoint: a checkpoint record, appended like
    /// any other (the next checkpoint covers it).
    fn sign(&mut self) -> Result<(), WriteError> {
        let Some(signing) = &mut self.signing else {
            return Ok(());
        };
        signing.ready(&*self.trail, &self.tip)?;
        let mut signed = None;
        // Built under the lock, after the rows other writers added: a checkpoint's range
        // always ends at the row right before it, which is what lets a verifier follow the
        // ranges through an export in one pass.
        let rows = self.append_sealing(&mut |signing, tip| {
            let record = signing.ok_or("no signing key")?.checkpoint(tip)?;
            let text = record_text(&record).map_err(|e| e.to_string())?;
            let rows = seal_rows(std::slice::from_ref(&record), vec![text]);
            signed = record.checkpoint;
            Ok(rows)
        })?;
        if let (Some(signing), Some(checkpoint)) = (&mut self.signing, &signed) {
            signing.signed(checkpoint, &rows);
        }
        Ok(())
    }

    /// Append the rows `build` makes (given the signing state, fed first with what other
    /// writers appended, and the tip after their rows), numbered and sealed after the tip,
    /// under the store's append lock; the rows written.
    fn append_sealing(&mut self, build: &mut Build<'_>) -> Result<Vec<AuditRow>, WriteError> {
        let started = Instant::now();
        loop {
            let after = self.tip.clone();
            let (sealer, tip, signing) = (&self.sealer, &mut self.tip, &mut self.signing);
            let written = self.trail.append_after(&after, &mut |foreign| {
                // Committed by the others whatever becomes of this transaction.
                *tip = chain::check_rows(sealer, tip, foreign)?;
                if let Some(signing) = signing.as_mut() {
                    signing.adopted(foreign);
                }
                let rows = build(signing.as_ref(), tip)?;
                Ok(seal_after(sealer, tip, rows))
            });
            match written {
                Ok(rows) => {
                    if let Some(last) = rows.last() {
                        self.tip = Tip {
                            seq: last.seq,
                            hash: last.hash.clone(),
                        };
                    }
                    if let Some(signing) = &mut self.signing {
                        signing.written(&rows);
                    }
                    self.head_dirty = true;
                    return Ok(rows);
                }
                // So far behind that the others' rows are checked outside the lock.
                Err(AppendError::Behind { .. }) if started.elapsed() < ADOPT_FOR => {
                    self.tip = chain::check_tail(&*self.trail, &self.sealer, &self.tip)
                        .map_err(|e| WriteError::Foreign(e.problem()))?;
                    if let Some(signing) = &mut self.signing {
                        signing.skipped();
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn checkpoint(&mut self) -> Result<(), WriteError> {
        // The rows it names must outlive a power cut first: appends are committed without
        // a sync of their own, and a head naming a lost row reads as a truncation.
        self.trail.sync()?;
        chain::write_head(&self.sealer, &self.head_path, &self.tip)
            .map_err(WriteError::Checkpoint)?;
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

/// What [`Writer::append_sealing`] appends: the rows to seal after the tip it is given, with
/// the signing state fed up to it; why not, when they cannot be made.
type Build<'a> = dyn FnMut(Option<&Signing>, &Tip) -> Result<Vec<AuditRow>, String> + 'a;

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
