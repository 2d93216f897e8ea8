//! The runner: queued runs claimed and run, one `ostiary run` process each, until they end.
//!
//! One attempt, in order: a session for the run (its agent, tenant, budgets, profile) →
//! the run's working directory with its payload → `ostiary run [--sandbox=PROFILE] …` with
//! that session (the child ends the session itself, with its sandbox's report) → its exit,
//! or the runner's own stop (a cancellation, the wall-clock limit, the proxy stopping) →
//! the outcome recorded: `succeeded`, a retry queued with its backoff, or a final
//! `failed` / `limit_exceeded` / `killed` / `cancelled` with a dead letter.
//!
//! The child dies with the proxy (`--die-with-parent`), and a sandbox with its `ostiary
//! run`: a run the proxy stops tracking is never left running. At start, runs this process
//! left `running` (a `kill -9`) are ended as `killed` and retried if their trigger allows
//! another attempt — never two attempts of one run at once.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;

use super::attempt::{
    classify, code_of, cost_of, new_session, snapshot_of, tail_of, Ended, RunDir, Stopped,
};
use super::spec::RunSpec;
use crate::audit::{AuditGuard, AuditSink};
use crate::metrics::Metrics;
use crate::session::NewSession;
use crate::store::audit::AuditStore;
use crate::store::runs::{Finished, RunFilter, RunRow, RunStatus, RunStore};
use crate::store::{Call, StoreError};

/// Sessions for runs: the control plane's, without its HTTP.
#[async_trait::async_trait]
pub trait RunSessions: Send + Sync + std::fmt::Debug {
    /// A new session, as `POST /v1/sessions` answers it (what `ostiary run
    /// --session-file` takes), or why there is none.
    async fn open(&self, new: NewSession) -> Result<Value, String>;
    /// End `session` (harmless when the run's `ostiary run` ended it already).
    async fn close(&self, session: &str, why: &str);
}

/// What the runner is told at start.
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    /// The `ostiary` binary (the proxy's own).
    pub binary: PathBuf,
    /// The config file the proxy read, for `ostiary run --config`.
    pub config: Option<PathBuf>,
    /// Where run directories are made.
    pub dir: PathBuf,
    pub concurrency: usize,
    pub stop_grace: Duration,
    /// This process's hold on its running runs past each renewal (`[runs] lease`).
    pub lease: Duration,
    /// Given to `ostiary run` (never to its command) to end the run's session with its report.
    pub admin_token: crate::state::SecretString,
    /// Triggers whose runs go one at a time (schedules with `forbid` or `queue`), across
    /// replicas. (Replaced when the triggers are reloaded.)
    pub serial: Arc<std::sync::RwLock<HashSet<String>>>,
    /// How long the checkpoint of a run that ended is kept (`[runs] checkpoint_retention`).
    pub checkpoint_retention: Duration,
}

/// The audit records a dead letter keeps.
const SNAPSHOT_RECORDS: u32 = 20;
/// How often a running run looks for a cancellation made on another replica.
const CANCEL_POLL: Duration = Duration::from_millis(250);
/// How often expired deduplication keys and old checkpoints are swept: what is swept is
/// already dead weight, so every replica sweeping once a minute is plenty (and harmless when
/// they do it at once).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct Runner {
    runs: Arc<dyn RunStore>,
    sessions: Arc<dyn RunSessions>,
    trail: Arc<dyn AuditStore>,
    audit: AuditSink,
    metrics: Arc<Metrics>,
    settings: RunnerSettings,
    holder: String,
    wake: Arc<Notify>,
    /// Runs going in this process, each with what stops it.
    going: Mutex<HashMap<String, Arc<Notify>>>,
    /// Where a run's session is known as the run's, for its checkpoint.
    checkpoints: Option<Arc<super::checkpoint::Checkpoints>>,
    /// The approvals runs held for a human wait on (`approval = true`).
    approvals: Option<Arc<dyn crate::store::approvals::ApprovalStore>>,
}

impl Runner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        runs: Arc<dyn RunStore>,
        sessions: Arc<dyn RunSessions>,
        trail: Arc<dyn AuditStore>,
        audit: AuditSink,
        metrics: Arc<Metrics>,
        settings: RunnerSettings,
        holder: String,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            runs,
            sessions,
            trail,
            audit,
            metrics,
            settings,
            holder,
            wake,
            going: Mutex::new(HashMap::new()),
            checkpoints: None,
            approvals: None,
        }
    }

    /// Cancel the held runs whose approval was denied or expired.
    pub fn with_approvals(
        mut self,
        approvals: Arc<dyn crate::store::approvals::ApprovalStore>,
    ) -> Self {
        self.approvals = Some(approvals);
        self
    }

    /// Let each attempt's session reach its run's checkpoint.
    pub fn with_checkpoints(
        mut self,
        checkpoints: Option<Arc<super::checkpoint::Checkpoints>>,
    ) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// Runs left `running` by this holder (a crash): `killed`, and queued again where their
    /// trigger allows another attempt.
    pub async fn recover(&self) -> Result<Vec<RunRow>, StoreError> {
        let holder = self.holder.clone();
        let now = crate::store::now_ms();
        let killed = self
            .runs
            .call(move |s| {
                s.recover(
                    &holder,
                    "the proxy stopped while the run was going: its process ended with it",
                    now,
                    &|row| snapshot_of(row, &[], None).to_string(),
                )
            })
            .await?;
        self.after_killed(&killed, "the proxy stopped while it ran")
            .await;
        Ok(killed)
    }

    /// This replica is alive: its running runs' lease is renewed (six times a lease);
    /// runs whose holder's lease ran out — a replica that died and did not come back — are
    /// ended as `killed` and retried where their trigger allows.
    async fn keep_leases(
        &self,
        last: &mut Option<std::time::Instant>,
        renewed_ok: &mut Option<std::time::Instant>,
    ) -> Result<(), StoreError> {
        if last.is_some_and(|at| at.elapsed() < self.settings.lease / 6) {
            return Ok(());
        }
        *last = Some(std::time::Instant::now());
        let holder = self.holder.clone();
        let now = crate::store::now_ms();
        let until = now + i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX);
        let going: Vec<String> = self
            .going
            .lock()
            .map(|g| g.keys().cloned().collect())
            .unwrap_or_default();
        let kept = self
            .runs
            .call(move |s| {
                s.renew(&holder, until)?;
                let reclaimed = s.reclaim(
                    now,
                    "the replica running it stopped renewing its lease: it is gone",
                    &|row| snapshot_of(row, &[], None).to_string(),
                )?;
                // Runs going here that are no longer this replica's (its lease lapsed
                // while it could not renew, and another replica took them over).
                let mut lost = Vec::new();
                for id in going {
                    let ours = s.get(&id)?.is_some_and(|r| {
                        r.status == RunStatus::Running
                            && r.holder.as_deref() == Some(holder.as_str())
                    });
                    if !ours {
                        lost.push(id);
                    }
                }
                Ok::<_, StoreError>((reclaimed, lost))
            })
            .await;
        let (reclaimed, lost) = match kept {
            Ok(kept) => {
                *renewed_ok = Some(std::time::Instant::now());
                kept
            }
            Err(e) => {
                // Unable to renew for a whole lease: another replica may take these runs
                // over, so they stop here rather than run twice.
                if renewed_ok.is_some_and(|at| at.elapsed() > self.settings.lease) {
                    self.stop_all("the store could not be reached to renew the run's lease");
                }
                return Err(e);
            }
        };
        for id in &lost {
            tracing::warn!(run = %id, "runs: a run going here was taken over by another replica; it is stopped");
            self.stop(id);
        }
        if !reclaimed.is_empty() {
            tracing::warn!(
                runs = reclaimed.len(),
                "runs of a replica that stopped renewing its lease were ended as killed"
            );
        }
        self.after_killed(&reclaimed, "its replica was lost while it ran")
            .await;
        Ok(())
    }

    /// What follows a run ended as `killed` without its runner: its session ended (its
    /// `ostiary run` died before it could), its end on record, another attempt if allowed.
    async fn after_killed(&self, killed: &[RunRow], why: &str) {
        for run in killed {
            if let Some(session) = &run.session {
                self.sessions.close(session, why).await;
            }
            self.record_end(run, RunStatus::Killed, Some(why));
            let spec = serde_json::from_str::<RunSpec>(&run.spec).ok();
            if let Some(spec) = spec.filter(|s| run.attempt < i64::from(s.attempts)) {
                let wait = spec.backoff_before(run.attempt + 1);
                self.requeue_after(&run.id, wait).await;
            }
        }
    }

    /// Start queued runs as they come (woken by the intake, else every second) until
    /// `shutdown`; then stop the ones going and record them.
    pub async fn serve(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tasks = tokio::task::JoinSet::new();
        let (mut renewed, mut renewed_ok) = (None, Some(std::time::Instant::now()));
        let mut swept = None;
        loop {
            if let Err(e) = self.keep_leases(&mut renewed, &mut renewed_ok).await {
                tracing::warn!(error = %e, "runs: the leases of running runs could not be renewed");
            }
            if let Err(e) = self.sweep(&mut swept).await {
                tracing::warn!(error = %e, "runs: expired deduplication keys and old checkpoints could not be swept");
            }
            if let Err(e) = self.settle_gates().await {
                tracing::warn!(error = %e, "runs: held runs could not be checked against their approvals");
            }
            while tasks.len() < self.settings.concurrency {
                match self.claim_next().await {
                    Ok(Some(run)) => {
                        let this = self.clone();
                        tasks.spawn(async move { this.attempt(run).await });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "runs: the store is unavailable; retrying");
                        break;
                    }
                }
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = self.wake.notified() => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let stops: Vec<Arc<Notify>> = self
            .going
            .lock()
            .map(|g| g.values().cloned().collect())
            .unwrap_or_default();
        for stop in stops {
            stop.notify_one();
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Expired deduplication keys, and the checkpoints of runs that ended more than the
    /// retention ago, deleted (once a [`SWEEP_EVERY`]).
    async fn sweep(&self, last: &mut Option<std::time::Instant>) -> Result<(), StoreError> {
        if last.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
            return Ok(());
        }
        *last = Some(std::time::Instant::now());
        let now = crate::store::now_ms();
        let retention =
            i64::try_from(self.settings.checkpoint_retention.as_millis()).unwrap_or(i64::MAX);
        let swept = self
            .runs
            .call(move |s| s.sweep(now, now.saturating_sub(retention)))
            .await?;
        if swept != crate::store::runs::Swept::default() {
            tracing::info!(
                dedup_keys = swept.dedup_keys,
                checkpoints = swept.checkpoints,
                "runs: expired deduplication keys and old checkpoints swept"
            );
        }
        Ok(())
    }

    /// Held runs whose approval ended without a yes (denied, expired) are cancelled; an
    /// approved one was released into the queue by the approval's execution.
    async fn settle_gates(&self) -> Result<(), StoreError> {
        let Some(approvals) = &self.approvals else {
            return Ok(());
        };
        let (runs, approvals) = (self.runs.clone(), approvals.clone());
        let cancelled = tokio::task::spawn_blocking(move || {
            let held = runs.list(&RunFilter {
                status: Some(RunStatus::AwaitingApproval),
                trigger: None,
                dead_letters: false,
                limit: Some(1000),
            })?;
            let mut cancelled = Vec::new();
            for run in held {
                let Some(id) = &run.approval else { continue };
                let Some(approval) = approvals.get(id)? else {
                    continue;
                };
                if let Some(why) = super::gate::refusal(&approval) {
                    if let Some(crate::store::runs::Cancel::Cancelled(row)) =
                        runs.cancel(&run.id, &why, crate::store::now_ms())?
                    {
                        cancelled.push((row, why));
                    }
                }
            }
            Ok::<_, StoreError>(cancelled)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
        for (run, why) in cancelled {
            self.record_end(&run, RunStatus::Cancelled, Some(&why));
        }
        Ok(())
    }

    /// Stop every run going here (`why` is logged; each ends as the proxy stopping it).
    fn stop_all(&self, why: &str) {
        let stops: Vec<(String, Arc<Notify>)> = self
            .going
            .lock()
            .map(|g| g.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        for (id, stop) in stops {
            tracing::warn!(run = %id, why, "runs: stopping a run going here");
            stop.notify_one();
        }
    }

    /// Stop run `id` if it is going here (a cancellation through this replica).
    pub fn stop(&self, id: &str) {
        if let Some(stop) = self.going.lock().ok().and_then(|g| g.get(id).cloned()) {
            stop.notify_one();
        }
    }

    /// The next run to start: the oldest due run of a trigger that may start one now.
    async fn claim_next(&self) -> Result<Option<RunRow>, StoreError> {
        let holder = self.holder.clone();
        let lease_ms = i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX / 2);
        let serial = self
            .settings
            .serial
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        self.runs
            .call(move |s| {
                let now = crate::store::now_ms();
                let queued = s.list(&RunFilter {
                    status: Some(RunStatus::Queued),
                    trigger: None,
                    dead_letters: false,
                    limit: Some(1000),
                })?;
                let mut triggers: Vec<(i64, String)> = Vec::new();
                for run in queued.iter().filter(|r| r.not_before_ms <= now) {
                    match triggers.iter_mut().find(|(_, t)| *t == run.trigger) {
                        Some(entry) => entry.0 = entry.0.min(run.created_ms),
                        None => triggers.push((run.created_ms, run.trigger.clone())),
                    }
                }
                triggers.sort();
                for (_, trigger) in triggers {
                    // One at a time across every replica sharing the store: the store checks
                    // that none of the trigger's runs is running as it claims.
                    let claimed = if serial.contains(&trigger) {
                        s.claim_serial(&holder, &trigger, now)?
                    } else {
                        s.claim(&holder, Some(&trigger), now)?
                    };
                    if let Some(run) = claimed {
                        // Leased from the start: a replica that dies at once loses the run
                        // after its lease, not after the longer unrenewed one.
                        s.renew(&holder, now + lease_ms)?;
                        return Ok(Some(run));
                    }
                }
                Ok(None)
            })
            .await
    }

    /// One attempt of `run`, from its session to its recorded outcome.
    async fn attempt(&self, run: RunRow) {
        let stop = Arc::new(Notify::new());
        if let Ok(mut going) = self.going.lock() {
            going.insert(run.id.clone(), stop.clone());
        }
        let spec = serde_json::from_str::<RunSpec>(&run.spec);
        let (ended, session) = match &spec {
            Ok(spec) => self.go(&run, spec, &stop).await,
            Err(e) => (
                Ended::setup(format!("the run's spec does not parse: {e}")),
                None,
            ),
        };
        if let Ok(mut going) = self.going.lock() {
            going.remove(&run.id);
        }
        if let Some(session) = &session {
            if let Some(checkpoints) = &self.checkpoints {
                checkpoints.detach(session);
            }
            self.sessions.close(session, "the run ended").await;
        }
        self.audit.flush().await;
        let records = match &session {
            Some(session) => self.session_records(session).await,
            None => Vec::new(),
        };
        self.settle(&run, spec.ok().as_ref(), ended, &records).await;
    }

    /// Session, directory, process, and the wait for its end.
    async fn go(&self, run: &RunRow, spec: &RunSpec, stop: &Notify) -> (Ended, Option<String>) {
        let session = match self.sessions.open(new_session(spec)).await {
            Ok(session) => session,
            Err(e) => return (Ended::setup(format!("no session for the run: {e}")), None),
        };
        let Some(session_id) = session["session_id"].as_str().map(str::to_owned) else {
            return (Ended::setup("the session has no id".into()), None);
        };
        let (id, holder, sid) = (run.id.clone(), self.holder.clone(), session_id.clone());
        if let Err(e) = self
            .runs
            .call(move |s| s.set_session(&id, &holder, &sid))
            .await
        {
            tracing::warn!(run = %run.id, error = %e, "runs: the session could not be recorded on the run");
        }
        self.record_start(run, &session_id);
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.attach(&session_id, &run.id);
        }
        let dir = match RunDir::make(&self.settings.dir, run, &session) {
            Ok(dir) => dir,
            Err(e) => {
                return (
                    Ended::setup(format!("the run directory: {e}")),
                    Some(session_id),
                )
            }
        };
        let ended = self.spawn_and_wait(run, spec, &dir, stop).await;
        dir.remove();
        (ended, Some(session_id))
    }

    async fn spawn_and_wait(
        &self,
        run: &RunRow,
        spec: &RunSpec,
        dir: &RunDir,
        stop: &Notify,
    ) -> Ended {
        let mut command = tokio::process::Command::new(&self.settings.binary);
        command.args(self.run_args(run, spec, dir));
        command
            .current_dir(std::env::current_dir().unwrap_or_else(|_| "/".into()))
            .env("OSTIARY_ADMIN_TOKEN", self.settings.admin_token.expose())
            .env("OSTIARY_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // A process group of its own: stopping the run signals `ostiary run` and an
            // unsandboxed command alike.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return Ended::setup(format!("starting ostiary run: {e}")),
        };
        let tail = tokio::spawn(tail_of(child.stderr.take()));
        let wall = spec.wall_clock_secs.map(Duration::from_secs);
        let stopped = self.wait_or_stop(run, &mut child, wall, stop).await;
        let status = child.wait().await.ok();
        let exit_code = status.and_then(|s| code_of(&s));
        // A process that kept the pipe open (what an unsandboxed command left behind in the
        // background) must not hold the record back. No signal goes to the group once its
        // leader is reaped: its id could be another process's by then.
        let stderr_tail = match tokio::time::timeout(Duration::from_secs(1), tail).await {
            Ok(tail) => tail.unwrap_or_default(),
            Err(_) => String::from("(standard error still open when the run ended)"),
        };
        Ended {
            exit_code,
            stopped,
            stderr_tail,
            setup: None,
        }
    }

    /// The child's end, or the runner's reason to end it first (then ended: a SIGTERM,
    /// which `ostiary run` passes to the command, and a SIGKILL after the grace).
    async fn wait_or_stop(
        &self,
        run: &RunRow,
        child: &mut tokio::process::Child,
        wall: Option<Duration>,
        stop: &Notify,
    ) -> Option<Stopped> {
        // The sandbox enforces the wall clock itself; this is the backstop, and the only
        // limit an unsandboxed run has.
        let deadline = async {
            match wall {
                Some(wall) => tokio::time::sleep(wall).await,
                None => std::future::pending().await,
            }
        };
        let cancelled = self.cancelled_elsewhere(&run.id);
        let why = tokio::select! {
            _ = child.wait() => return None,
            () = deadline => Stopped::WallClock,
            () = stop.notified() => {
                if self.cancel_requested(&run.id).await { Stopped::Cancelled } else { Stopped::ProxyStopping }
            }
            () = cancelled => Stopped::Cancelled,
        };
        // The group: `ostiary run`, and an unsandboxed command with it.
        let group = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(nix::unistd::Pid::from_raw);
        if let Some(group) = group {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
        }
        // `ostiary run` gets the grace it passes on, and a little to end its session.
        let grace = self.settings.stop_grace + Duration::from_secs(2);
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            if let Some(group) = group {
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = child.start_kill();
        }
        Some(why)
    }

    /// Resolves once the store says run `id` was asked to stop (through another replica).
    async fn cancelled_elsewhere(&self, id: &str) {
        loop {
            tokio::time::sleep(CANCEL_POLL).await;
            if self.cancel_requested(id).await {
                return;
            }
        }
    }

    async fn cancel_requested(&self, id: &str) -> bool {
        let id = id.to_owned();
        matches!(
            self.runs.call(move |s| s.get(&id)).await,
            Ok(Some(run)) if run.cancel_requested
        )
    }

    /// `ostiary run`'s arguments for `run`.
    fn run_args(&self, run: &RunRow, spec: &RunSpec, dir: &RunDir) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(config) = &self.settings.config {
            args.push("--config".to_owned());
            args.push(config.display().to_string());
        }
        args.extend(["run".into(), "--agent".into(), spec.agent.clone()]);
        if spec.sandboxed() {
            args.push(format!("--sandbox={}", spec.profile));
        } else {
            // The operator's own choice (`profile = "none"`): not a boundary.
            args.push("--unsafe-shared-uid".into());
        }
        args.extend([
            "--session-file".into(),
            dir.session_file.display().to_string(),
            "--workdir".into(),
            dir.workdir.display().to_string(),
            "--run-id".into(),
            run.id.clone(),
            "--die-with-parent".into(),
            std::process::id().to_string(),
        ]);
        if let Some(secs) = spec.wall_clock_secs {
            args.push(format!("--wall-clock={secs}s"));
        }
        args.push("--".into());
        args.extend(spec.argv.iter().cloned());
        args
    }

    /// The session's last records, for the cost and a dead letter.
    async fn session_records(&self, session: &str) -> Vec<Value> {
        let session = session.to_owned();
        let recent = self
            .trail
            .call(move |t| t.recent(&session, SNAPSHOT_RECORDS))
            .await
            .unwrap_or_default();
        recent
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect()
    }

    /// Record how the attempt ended: done, retried, or dead-lettered.
    async fn settle(&self, run: &RunRow, spec: Option<&RunSpec>, ended: Ended, records: &[Value]) {
        let (status, limit, error) = classify(&ended, spec.is_some_and(RunSpec::sandboxed));
        let retry = matches!(status, RunStatus::Failed | RunStatus::Killed)
            && spec.is_some_and(|s| run.attempt < i64::from(s.attempts));
        let now = crate::store::now_ms();
        let cost = cost_of(records);
        let mut finished = Finished {
            status,
            retry_at_ms: None,
            ended_ms: now,
            exit_code: ended.exit_code,
            limit: limit.map(str::to_owned),
            error: error.clone(),
            stderr_tail: (!ended.stderr_tail.is_empty()).then(|| ended.stderr_tail.clone()),
            cost_micros: cost,
            dead_letter: None,
        };
        if retry {
            let wait = spec.map_or(Duration::ZERO, |s| s.backoff_before(run.attempt + 1));
            finished.status = RunStatus::Queued;
            finished.retry_at_ms = Some(now + i64::try_from(wait.as_millis()).unwrap_or(0));
        } else if matches!(
            status,
            RunStatus::Failed | RunStatus::LimitExceeded | RunStatus::Killed
        ) {
            let mut row = run.clone();
            row.exit_code = ended.exit_code;
            row.limit = finished.limit.clone();
            row.error = error.clone();
            finished.dead_letter =
                Some(snapshot_of(&row, records, Some(&ended.stderr_tail)).to_string());
        }
        let (id, holder, done) = (run.id.clone(), self.holder.clone(), finished.clone());
        match self.runs.call(move |s| s.finish(&id, &holder, &done)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(run = %run.id, "runs: the run was no longer this replica's to finish")
            }
            Err(e) => {
                tracing::error!(run = %run.id, error = %e, "runs: the outcome could not be recorded; the run is recovered as killed at the next start")
            }
        }
        self.record_end(run, finished.status, error.as_deref());
        if retry {
            self.wake.notify_one();
        }
    }

    async fn requeue_after(&self, id: &str, wait: Duration) {
        let id = id.to_owned();
        let at = crate::store::now_ms() + i64::try_from(wait.as_millis()).unwrap_or(0);
        let _ = self.runs.call(move |s| s.requeue(&id, at)).await;
    }

    fn record_start(&self, run: &RunRow, session: &str) {
        let mut audit =
            AuditGuard::start(&self.audit, &self.metrics, &crate::ids::request_id(), "run");
        audit.update(|r| {
            r.session = Some(session.to_owned());
            r.reason = Some(format!("run {} of trigger {} started (attempt {})", run.id, run.trigger, run.attempt));
            r.run = Some(json!({"run_id": run.id, "trigger": run.trigger, "attempt": run.attempt, "status": "running"}));
        });
        audit.event("allow", None);
    }

    fn record_end(&self, run: &RunRow, status: RunStatus, why: Option<&str>) {
        let mut audit =
            AuditGuard::start(&self.audit, &self.metrics, &crate::ids::request_id(), "run");
        let decision = match status {
            RunStatus::Succeeded | RunStatus::Queued => "allow",
            RunStatus::Cancelled => "cancel",
            RunStatus::LimitExceeded => "deny",
            _ => "error",
        };
        audit.update(|r| {
            r.session = run.session.clone();
            r.reason = Some(match why {
                Some(why) => format!("run {} ended {}: {why}", run.id, status.as_str()),
                None => format!("run {} ended {}", run.id, status.as_str()),
            });
            r.run = Some(json!({"run_id": run.id, "trigger": run.trigger, "attempt": run.attempt, "status": status.as_str()}));
        });
        audit.event(decision, None);
    }
}
