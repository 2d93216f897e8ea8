//! The runs aggregate: runs that triggers started (webhooks, schedules, API calls), from
//! their arrival to their end, durable across `kill -9`.
//!
//! A run moves `queued → [awaiting_approval →] running → succeeded | failed |
//! limit_exceeded | killed | cancelled`; a failure the trigger retries goes back to `queued`
//! with a later `not_before_ms`, and a run that ends for good in `failed`,
//! `limit_exceeded` or `killed` carries a dead letter (its diagnostic snapshot). Every move
//! is one compare-and-set on the status (and, for a running run, on who runs it), so two
//! replicas never start, finish or cancel one run twice. Deliveries are deduplicated by a
//! key kept for a window, and counted against their trigger's rate, in the same transaction
//! as the run they start, so that the key and the rate hold across replicas sharing the
//! store. A trigger whose runs go one at a time is claimed only while none of its runs is
//! running, checked in the claim itself. Keys past their window, and the checkpoints of runs
//! that ended long ago, are swept.

use crate::StoreError;

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStatus {
    Queued,
    AwaitingApproval,
    Running,
    Succeeded,
    Failed,
    LimitExceeded,
    Killed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Queued,
        RunStatus::AwaitingApproval,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::LimitExceeded,
        RunStatus::Killed,
        RunStatus::Cancelled,
    ];

    /// Its name in the store, the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::AwaitingApproval => "awaiting_approval",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::LimitExceeded => "limit_exceeded",
            RunStatus::Killed => "killed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// The status named `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Nothing more happens to it (unless an operator retries it).
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            RunStatus::Queued | RunStatus::AwaitingApproval | RunStatus::Running
        )
    }
}

/// One run as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    /// `run_<random>`.
    pub id: String,
    /// The trigger that started it.
    pub trigger: String,
    /// `webhook`, `schedule` or `api`.
    pub kind: String,
    pub status: RunStatus,
    /// What to run, as the trigger said when the run was made (JSON): a trigger changed
    /// later does not change a run already made.
    pub spec: String,
    /// The payload (JSON text; `{}` for a schedule's tick).
    pub payload: String,
    /// Hex SHA-256 of the payload as it arrived.
    pub payload_sha256: String,
    /// Attempts started so far (0 while the first waits).
    pub attempt: i64,
    pub created_ms: i64,
    /// A queued run does not start before then (a retry's backoff).
    pub not_before_ms: i64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    /// The session of the current (or last) attempt.
    pub session: Option<String>,
    /// Who runs it while `running` (a replica's name).
    pub holder: Option<String>,
    /// The command's exit code, or 128 + N for signal N.
    pub exit_code: Option<i64>,
    /// The limit that ended it (`wall_clock`, `memory`, `processes`, `cpu_time`, ...).
    pub limit: Option<String>,
    /// Why it failed, was killed or cancelled, in a sentence.
    pub error: Option<String>,
    /// The end of the command's standard error (bounded).
    pub stderr_tail: Option<String>,
    /// What its session's tool calls cost (micro-units).
    pub cost_micros: Option<i64>,
    /// Set when it ended for good as `failed`, `limit_exceeded` or `killed`: its diagnostic
    /// snapshot (JSON: the last audit records, usage, limits, the stderr tail).
    pub dead_letter: Option<String>,
    /// An operator or the API asked for it to be cancelled while it ran.
    pub cancel_requested: bool,
    /// The run whose agent started this one (parent → child runs).
    pub parent_run: Option<String>,
    /// The approval holding it while `awaiting_approval`.
    pub approval: Option<String>,
}

/// What a run is made as, with every field it gains while it waits and runs unset.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub id: String,
    pub trigger: String,
    pub kind: String,
    pub spec: String,
    pub payload: String,
    pub payload_sha256: String,
}

impl RunRow {
    /// `new` made at `now_ms`, queued: not started, attempted, held or ended.
    pub fn queued(new: NewRun, now_ms: i64) -> Self {
        let NewRun {
            id,
            trigger,
            kind,
            spec,
            payload,
            payload_sha256,
        } = new;
        Self {
            id,
            trigger,
            kind,
            status: RunStatus::Queued,
            spec,
            payload,
            payload_sha256,
            attempt: 0,
            created_ms: now_ms,
            not_before_ms: now_ms,
            started_ms: None,
            ended_ms: None,
            session: None,
            holder: None,
            exit_code: None,
            limit: None,
            error: None,
            stderr_tail: None,
            cost_micros: None,
            dead_letter: None,
            cancel_requested: false,
            parent_run: None,
            approval: None,
        }
    }
}

/// A delivery's deduplication: its key, kept until `expires_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Dedup<'a> {
    pub key: &'a str,
    pub expires_ms: i64,
}

/// A trigger's rate: at most `count` runs in any `per_ms`, a burst of `count` allowed and
/// then one run every `per_ms / count` — a token bucket, kept in the store (as the time its
/// bucket is full again) so that every replica spends the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub count: u32,
    pub per_ms: i64,
}

impl RateLimit {
    /// One more run at `now_ms`, for a bucket that is full again at `full_at_us` (µs since the
    /// epoch; `None`, or a time past, when it is full): `Ok` with when it is full again after
    /// this run, or `Err` with how many milliseconds until it holds a run again.
    ///
    /// Kept as one instant rather than a count of tokens so that the store needs no clock of
    /// its own and a replica's refill never races another's. In microseconds, and the interval
    /// rounded up, so that a rate of thousands a second neither rounds to nothing nor lets
    /// more than `count` through in a period.
    pub fn take(self, full_at_us: Option<i64>, now_ms: i64) -> Result<i64, i64> {
        let count = i64::from(self.count.max(1));
        let now = now_ms.saturating_mul(1000);
        let per = self.per_ms.max(1).saturating_mul(1000);
        let interval = per.saturating_add(count - 1) / count;
        let full_at = full_at_us.map_or(now, |at| at.max(now));
        // How long until it is full, against what a burst may leave: `count - 1` intervals.
        let owed = full_at - now;
        let allowed = interval.saturating_mul(count - 1);
        if owed <= allowed {
            Ok(full_at.saturating_add(interval))
        } else {
            Err((owed - allowed).saturating_add(999) / 1000)
        }
    }
}

/// What [`RunStore::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// The run was stored.
    New,
    /// The key was seen within its window: nothing stored; the first delivery's run.
    Duplicate(String),
    /// The trigger's rate is spent: nothing stored, no key taken; a run fits again in
    /// `retry_after_ms`.
    RateLimited { retry_after_ms: i64 },
}

/// What [`RunStore::sweep`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Deduplication keys past their window.
    pub dedup_keys: u64,
    /// Checkpoints of runs that ended for good before the retention.
    pub checkpoints: u64,
}

/// How a running attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The status it ends in; `Queued` sends it back for another attempt at `retry_at_ms`.
    pub status: RunStatus,
    pub retry_at_ms: Option<i64>,
    pub ended_ms: i64,
    pub exit_code: Option<i64>,
    pub limit: Option<String>,
    pub error: Option<String>,
    pub stderr_tail: Option<String>,
    pub cost_micros: Option<i64>,
    pub dead_letter: Option<String>,
}

/// Which runs [`RunStore::list`] returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub trigger: Option<String>,
    /// Only runs carrying a dead letter.
    pub dead_letters: bool,
    /// At most this many (100 when absent).
    pub limit: Option<u32>,
}

/// What [`RunStore::cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancel {
    /// It had not started: it is `cancelled` now.
    Cancelled(RunRow),
    /// It runs: asked to stop (its runner ends it and records `cancelled`).
    Requested(RunRow),
    /// It had already ended, as it says.
    Over(RunRow),
}

/// The lease of a running run its holder has not renewed yet, from its start.
pub const UNRENEWED_LEASE_MS: i64 = 60_000;

/// Where runs are kept.
pub trait RunStore: Send + Sync + std::fmt::Debug {
    /// Store `run` (status `queued` or `awaiting_approval`), unless `dedup`'s key was stored
    /// for the same trigger and has not expired at `now_ms` (then nothing is stored and the
    /// first delivery's run id is returned), or the trigger's `rate` is spent (then nothing
    /// is stored, no key is taken, and the wait is returned). The key is looked at before the
    /// rate, so a duplicate spends none of it. The checks, the rate spent and the insert are
    /// one transaction, which replicas sharing the store serialise on per trigger.
    fn enqueue(
        &self,
        run: &RunRow,
        dedup: Option<Dedup<'_>>,
        rate: Option<RateLimit>,
        now_ms: i64,
    ) -> Result<Enqueued, StoreError>;
    /// Run `id`, if it exists.
    fn get(&self, id: &str) -> Result<Option<RunRow>, StoreError>;
    /// Runs matching `filter`, newest first.
    fn list(&self, filter: &RunFilter) -> Result<Vec<RunRow>, StoreError>;
    /// The oldest queued run due at `now_ms` (of `trigger`, when given), moved to `running`
    /// for `holder` (attempt + 1, `started_ms`), if there is one.
    fn claim(
        &self,
        holder: &str,
        trigger: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError>;
    /// Like [`RunStore::claim`] of `trigger`, for a trigger whose runs go one at a time: its
    /// oldest due queued run, only while no run of `trigger` is `running` (whoever holds
    /// it). The check and the move are one transaction, which replicas claiming the same
    /// trigger serialise on, so two racing start one. The run is recorded as starting no
    /// earlier than the trigger's last run ended, so that its runs' records never overlap,
    /// even between replicas whose clocks differ by a little.
    fn claim_serial(
        &self,
        holder: &str,
        trigger: &str,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError>;
    /// Run `id`'s `queued` or `awaiting_approval` → `running` for `holder`, if it still is
    /// in `from` (a schedule starting its own tick, an approval granted).
    fn start(
        &self,
        id: &str,
        from: RunStatus,
        holder: &str,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError>;
    /// Run `id`'s `awaiting_approval` → `queued` (a human approved it), due at `now_ms`;
    /// `None` if it is not (or no longer) awaiting approval.
    fn release(&self, id: &str, now_ms: i64) -> Result<Option<RunRow>, StoreError>;
    /// The session of run `id`'s current attempt, if `holder` runs it.
    fn set_session(&self, id: &str, holder: &str, session: &str) -> Result<bool, StoreError>;
    /// End `holder`'s attempt of run `id` as `finished` says; false if it is not (or no
    /// longer) `holder`'s running run.
    fn finish(&self, id: &str, holder: &str, finished: &Finished) -> Result<bool, StoreError>;
    /// Cancel run `id`: at once if it has not started, by request if it runs.
    fn cancel(&self, id: &str, reason: &str, now_ms: i64) -> Result<Option<Cancel>, StoreError>;
    /// Queue run `id` again (an operator's retry of a run that ended): its dead letter is
    /// kept, its attempts go on counting. `None` if it does not exist; the row unchanged
    /// if it has not ended.
    fn requeue(&self, id: &str, now_ms: i64) -> Result<Option<RunRow>, StoreError>;
    /// Runs `holder` left `running` (it crashed): each ended as `killed` with `reason` and
    /// the dead letter `dead_letter` makes of it, and returned.
    fn recover(
        &self,
        holder: &str,
        reason: &str,
        now_ms: i64,
        dead_letter: &dyn Fn(&RunRow) -> String,
    ) -> Result<Vec<RunRow>, StoreError>;
    /// `holder` is alive: its running runs' lease runs until `until_ms`. Returns how many.
    fn renew(&self, holder: &str, until_ms: i64) -> Result<u64, StoreError>;
    /// Runs whose holder's lease ran out before `now_ms` (a replica that died and never came
    /// back; a run never renewed has [`UNRENEWED_LEASE_MS`] from its start): each ended as
    /// `killed` with `reason` and its dead letter, and returned. A holder that renews in
    /// time keeps its runs.
    fn reclaim(
        &self,
        now_ms: i64,
        reason: &str,
        dead_letter: &dyn Fn(&RunRow) -> String,
    ) -> Result<Vec<RunRow>, StoreError>;
    /// How many runs of `trigger` are `running`.
    fn running(&self, trigger: &str) -> Result<i64, StoreError>;
    /// Keep `data` as the checkpoint of the runs rooted at `root` (a run and its retries).
    fn save_checkpoint(&self, root: &str, data: &[u8], now_ms: i64) -> Result<(), StoreError>;
    /// The checkpoint of `root`, if one was saved.
    fn checkpoint(&self, root: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Delete the deduplication keys expired at `now_ms`, and the checkpoints of runs that
    /// ended for good (a final status) before `ended_before_ms`. A run that has not ended —
    /// queued, held, running, or waiting for its retry — keeps its checkpoint, whatever its
    /// age; so does a checkpoint whose run is not in the store (nothing says it ended).
    fn sweep(&self, now_ms: i64, ended_before_ms: i64) -> Result<Swept, StoreError>;
}

/// The final statuses as an SQL list (`'succeeded', …`), for the sweep: named one by one,
/// so that a status this binary does not know is never taken for an end.
pub(crate) fn final_statuses_sql() -> String {
    RunStatus::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::RateLimit;

    const MINUTE: i64 = 60_000;

    #[test]
    fn a_burst_of_the_count_then_one_per_interval() {
        let rate = RateLimit {
            count: 3,
            per_ms: MINUTE,
        };
        let t0 = 1_000_000;
        let mut full_at = None;
        for _ in 0..3 {
            full_at = Some(rate.take(full_at, t0).unwrap());
        }
        assert_eq!(rate.take(full_at, t0), Err(20_000));
        assert_eq!(rate.take(full_at, t0 + 19_999), Err(1));
        let after = rate.take(full_at, t0 + 20_000).unwrap();
        assert!(rate.take(Some(after), t0 + 20_000).is_err());
        // Idle for a whole period: full again, never more than full.
        let later = t0 + 10 * MINUTE;
        let mut full_at = Some(after);
        for _ in 0..3 {
            full_at = Some(rate.take(full_at, later).unwrap());
        }
        assert!(rate.take(full_at, later).is_err());
    }

    #[test]
    fn a_rate_of_thousands_a_second_neither_vanishes_nor_overflows() {
        let rate = RateLimit {
            count: 5_000,
            per_ms: 1_000,
        };
        let mut full_at = None;
        for _ in 0..5_000 {
            full_at = Some(rate.take(full_at, 0).unwrap());
        }
        assert_eq!(rate.take(full_at, 0), Err(1));
        let most = RateLimit {
            count: u32::MAX,
            per_ms: 86_400_000,
        };
        assert!(most.take(Some(i64::MAX - 1), i64::MAX / 1000).is_ok());
    }
}
