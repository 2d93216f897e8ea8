//! One attempt of a run, apart from the runner's bookkeeping: how its end is classified
//! (who ended it, which limit), its exit code, its cost and dead letter from its session's
//! records, the session it gets, the end of its standard error, and its directory.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use super::spec::RunSpec;
use crate::sandbox::exit;
use crate::session::NewSession;
use crate::store::runs::{RunRow, RunStatus};

/// The end of standard error kept per run.
pub(super) const STDERR_TAIL: usize = 4096;

/// Why the runner stopped a run itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopped {
    Cancelled,
    WallClock,
    ProxyStopping,
}

/// An attempt's end, before it is classified.
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) exit_code: Option<i64>,
    pub(super) stopped: Option<Stopped>,
    pub(super) stderr_tail: String,
    /// The attempt could not start (no session, no directory, no process).
    pub(super) setup: Option<String>,
}

impl Ended {
    pub(super) fn setup(why: String) -> Self {
        Self {
            exit_code: None,
            stopped: None,
            stderr_tail: String::new(),
            setup: Some(why),
        }
    }
}

/// The status an attempt ends in, the limit that ended it, and why, in words. A sandboxed
/// run's exit codes name its limits ([`exit`]); an unsandboxed command's are its own.
pub(super) fn classify(
    ended: &Ended,
    sandboxed: bool,
) -> (RunStatus, Option<&'static str>, Option<String>) {
    if let Some(why) = &ended.setup {
        return (RunStatus::Failed, None, Some(why.clone()));
    }
    match ended.stopped {
        Some(Stopped::Cancelled) => {
            return (
                RunStatus::Cancelled,
                None,
                Some("cancelled while it ran".into()),
            )
        }
        Some(Stopped::WallClock) => {
            return (
                RunStatus::LimitExceeded,
                Some("wall_clock"),
                Some("the wall-clock limit ended the run".into()),
            )
        }
        Some(Stopped::ProxyStopping) => {
            return (
                RunStatus::Killed,
                None,
                Some("the proxy stopped while the run was going".into()),
            )
        }
        None => {}
    }
    let code = ended.exit_code;
    let limit = match code.and_then(|c| u8::try_from(c).ok()) {
        Some(exit::WALL_CLOCK) if sandboxed => Some("wall_clock"),
        Some(exit::MEMORY) if sandboxed => Some("memory"),
        Some(exit::PROCESSES) if sandboxed => Some("processes"),
        Some(exit::CPU_TIME) if sandboxed => Some("cpu_time"),
        _ => None,
    };
    match (code, limit) {
        (Some(0), _) => (RunStatus::Succeeded, None, None),
        (_, Some(limit)) => (
            RunStatus::LimitExceeded,
            Some(limit),
            Some(format!("the {limit} limit ended the run")),
        ),
        (Some(c), None) if c == i64::from(exit::SETUP) => (
            RunStatus::Failed,
            None,
            Some("the sandbox could not be set up (exit 125)".into()),
        ),
        (Some(c), None) => (
            RunStatus::Failed,
            None,
            Some(format!("the command exited with {c}")),
        ),
        (None, None) => (
            RunStatus::Failed,
            None,
            Some("the run's process ended without an exit code".into()),
        ),
    }
}

/// The exit code, or 128 + the signal.
pub(super) fn code_of(status: &std::process::ExitStatus) -> Option<i64> {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .map(i64::from)
        .or_else(|| status.signal().map(|s| 128 + i64::from(s)))
}

/// The session's totals, from the record of its end.
pub(super) fn cost_of(records: &[Value]) -> Option<i64> {
    records
        .iter()
        .rev()
        .find_map(|r| r["totals"]["cost_micros"].as_i64())
}

/// A dead letter: what an operator needs to see why the run failed.
pub(super) fn snapshot_of(run: &RunRow, records: &[Value], stderr: Option<&str>) -> Value {
    let usage = records.iter().rev().find_map(|r| r.get("totals").cloned());
    json!({
        "run_id": run.id,
        "trigger": run.trigger,
        "attempt": run.attempt,
        "session": run.session,
        "exit_code": run.exit_code,
        "limit": run.limit,
        "error": run.error,
        "limits": serde_json::from_str::<Value>(&run.spec).ok().map(|s| json!({
            "max_calls": s["max_calls"], "max_cost": s["max_cost"], "wall_clock_secs": s["wall_clock_secs"],
        })),
        "usage": usage,
        "records": records,
        "stderr_tail": stderr.or(run.stderr_tail.as_deref()),
    })
}

pub(super) fn new_session(spec: &RunSpec) -> NewSession {
    // The session lives as long as the run may: its wall clock, or the trigger's ttl.
    let ttl = match (spec.ttl_secs, spec.wall_clock_secs) {
        (Some(t), Some(w)) => Some(t.max(w)),
        (t, w) => t.or(w),
    };
    NewSession {
        agent: Some(spec.agent.clone()),
        tenant: spec.tenant.clone(),
        ttl: ttl.map(|s| format!("{s}s")),
        max_calls: spec.max_calls,
        max_cost: spec.max_cost,
        profile: spec.sandboxed().then(|| spec.profile.clone()),
        parent: spec.parent_session.clone(),
        ..Default::default()
    }
}

/// The last [`STDERR_TAIL`] bytes of `stderr`, as text.
pub(super) async fn tail_of(stderr: Option<tokio::process::ChildStderr>) -> String {
    let Some(mut stderr) = stderr else {
        return String::new();
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > STDERR_TAIL {
            kept.drain(..kept.len() - STDERR_TAIL);
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// A run's directory: its working directory (with `payload.json`), copied into its
/// sandbox, and the session file `ostiary run` reads and deletes, beside it (never in the
/// working directory, which the command sees).
#[derive(Debug)]
pub(super) struct RunDir {
    root: PathBuf,
    pub(super) workdir: PathBuf,
    pub(super) session_file: PathBuf,
}

impl RunDir {
    pub(super) fn make(base: &Path, run: &RunRow, session: &Value) -> std::io::Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        // Traversable, not listable: another local user cannot find a run's directory.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(base)?;
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o711))?;
        let root = base.join(format!(
            "{}-{}-{}",
            run.id,
            run.attempt,
            crate::state::random_hex(6)
        ));
        std::fs::DirBuilder::new().mode(0o711).create(&root)?;
        // Readable by the sandbox's own uid, which copies it in.
        let workdir = root.join("work");
        std::fs::DirBuilder::new().mode(0o755).create(&workdir)?;
        let mut payload = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(workdir.join("payload.json"))?;
        payload.write_all(run.payload.as_bytes())?;
        let session_file = root.join("session.json");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&session_file)?;
        file.write_all(session.to_string().as_bytes())?;
        Ok(Self {
            root,
            workdir,
            session_file,
        })
    }

    pub(super) fn remove(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            tracing::warn!(dir = %self.root.display(), error = %e, "runs: a run directory could not be removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(code: Option<i64>, stopped: Option<Stopped>) -> Ended {
        Ended {
            exit_code: code,
            stopped,
            stderr_tail: String::new(),
            setup: None,
        }
    }

    #[test]
    fn outcomes_are_classified_by_who_ended_the_run_and_how() {
        let status = |e: &Ended, sandboxed| classify(e, sandboxed).0;
        assert_eq!(status(&ended(Some(0), None), true), RunStatus::Succeeded);
        assert_eq!(status(&ended(Some(3), None), true), RunStatus::Failed);
        assert_eq!(
            classify(&ended(Some(124), None), true).1,
            Some("wall_clock")
        );
        assert_eq!(classify(&ended(Some(150), None), true).1, Some("memory"));
        // An unsandboxed command's 124 is its own exit code, not a limit.
        assert_eq!(status(&ended(Some(124), None), false), RunStatus::Failed);
        assert_eq!(
            status(&ended(Some(137), Some(Stopped::Cancelled)), true),
            RunStatus::Cancelled
        );
        assert_eq!(
            classify(&ended(Some(143), Some(Stopped::WallClock)), false).1,
            Some("wall_clock")
        );
        assert_eq!(
            status(&ended(None, Some(Stopped::ProxyStopping)), true),
            RunStatus::Killed
        );
        assert_eq!(status(&Ended::setup("x".into()), true), RunStatus::Failed);
    }

    #[test]
    fn the_session_lives_as_long_as_the_run_may() {
        let mut spec = RunSpec {
            argv: vec!["true".into()],
            agent: "bot".into(),
            tenant: Some("acme".into()),
            profile: "default".into(),
            max_calls: Some(5),
            max_cost: None,
            ttl_secs: None,
            wall_clock_secs: Some(30),
            attempts: 1,
            backoff_ms: 0,
            parent_session: None,
            parent_agent: None,
            depth: 0,
        };
        let new = new_session(&spec);
        assert_eq!(new.ttl.as_deref(), Some("30s"));
        assert_eq!(new.profile.as_deref(), Some("default"));
        assert_eq!(new.max_calls, Some(5));
        spec.ttl_secs = Some(600);
        spec.profile = "none".into();
        let new = new_session(&spec);
        assert_eq!(new.ttl.as_deref(), Some("600s"));
        assert_eq!(new.profile, None);
    }

    #[test]
    fn the_cost_is_the_session_totals() {
        let records = vec![
            json!({"kind": "http"}),
            json!({"kind": "session", "totals": {"cost_micros": 2500}}),
        ];
        assert_eq!(cost_of(&records), Some(2500));
        assert_eq!(cost_of(&[]), None);
    }
}
