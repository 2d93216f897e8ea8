//! The runs aggregate: runs that triggers started (webhooks, schedules, API calls), from
//! their arrival to their end, durable across `kill -9`.
//!
//! A run moves `queued → [awaiting_approval →] running → succeeded | failed |
//! limit_exceeded | killed | cancelled`; a failure the trigger retries goes back to `queued`
//! with a later `not_before_ms`, and a run that ends for good in `failed`,
//! `limit_exceeded` or `killed` carries a dead letter (its diagnostic snapshot). Every move
//! is one compare-and-set on the status (and, for a running run, on who runs it), so two
//! replicas never start, finish or cancel one run twice. Deliveries are deduplicated by a
//! key kept for a window, in the same transaction as the run they start.

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

/// A delivery's deduplication: its key, kept until `expires_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Dedup<'a> {
    pub key: &'a str,
    pub expires_ms: i64,
}

/// What [`RunStore::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// The run was stored.
    New,
    /// The key was seen within its window: nothing stored; the first delivery's run.
    Duplicate(String),
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
    /// for the same trigger and has not expired at `now_ms`: then nothing is stored and the
    /// first delivery's run id is returned. The check and the insert are one transaction.
    fn enqueue(
        &self,
        run: &RunRow,
        dedup: Option<Dedup<'_>>,
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
}
