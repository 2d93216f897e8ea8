//! `ostiary run`: a command inside a new session, which ends when the command does.
//!
//! With `--sandbox[=PROFILE]` the command runs where the proxy is the only way out
//! ([`ostiary::sandbox`], docs/sandbox.md). Without it the command is a process of the
//! operator's like any other — not a boundary — and `run` says so: it clears the variables
//! that hold the proxy's or Vault's secrets, and refuses to start a command that could read
//! the state directory or the file backend's secrets unless told `--unsafe-shared-uid`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use ostiary_sdk::{ControlClient, NewSession};

use ostiary::config::{Config, Profile};
use ostiary::sandbox::limits::{Control, Limits};
use ostiary::sandbox::view::{self, Staging, ViewSpec};
use ostiary::sandbox::{
    self, cgroup, env, exit, supervise, teardown, uid, Env, Outcome, Plan, SandboxError,
};
use ostiary::state::{self, files};

use super::CliError;

/// The end of `ostiary run --help`.
pub const AFTER_HELP: &str = "\
Only --sandbox is a boundary. Without it the command runs as your own uid, with your files
and your network: ostiary clears OSTIARY_*, VAULT_*, BAO_* and the variables the config
names as secrets from its environment, and refuses to start it where it could read the
state directory or the file backend's secrets (--unsafe-shared-uid runs it anyway). With
--sandbox the proxy is its only way out (docs/sandbox.md).

Exit codes:
  the command's own     when it ends by itself (128 + N when killed by signal N)
  124                   the wall-clock limit ended the run
  125                   the sandbox could not be set up, or run refused to start; the
                        command did not run
  126                   the command cannot be executed
  127                   the command was not found
  150                   the memory limit ended the run
  151                   the process limit ended the run
  152                   the CPU-time limit ended the run
The open-files limit does not end a run: calls past it fail with EMFILE.";

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The agent's name: the Cedar principal the command's requests are decided as.
    #[arg(long)]
    pub agent: String,
    /// The tenant the agent acts for (default: `default`).
    #[arg(long)]
    pub tenant: Option<String>,
    /// The session's lifetime, e.g. 30m (default: sessions.default_ttl); the session ends
    /// sooner if the command does.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Run the command in a sandbox whose only way out is the proxy, under PROFILE
    /// (default: [sandbox] default_profile).
    #[arg(
        long,
        value_name = "PROFILE",
        num_args = 0..=1,
        require_equals = true,
        conflicts_with = "unsafe_shared_uid"
    )]
    pub sandbox: Option<Option<String>>,
    /// Without --sandbox: run the command even though, sharing your uid, it could read the
    /// state directory (the admin token) or the file backend's secrets.
    #[arg(long)]
    pub unsafe_shared_uid: bool,
    /// Say on stderr how the sandbox is made and what its teardown did.
    #[arg(long, short)]
    pub verbose: bool,
    /// The command and its arguments, after `--` (so that its own flags are never taken
    /// for ostiary's).
    // `last` alone says this; clap refuses it combined with `trailing_var_arg` and panics
    // at parse time.
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
    /// For the proxy's runner (runs started by triggers): use the session in FILE (the
    /// answer of `POST /v1/sessions`; deleted once read) instead of creating one.
    #[arg(long, hide = true, value_name = "FILE")]
    pub session_file: Option<PathBuf>,
    /// For the proxy's runner: the command's working directory (copied into the sandbox).
    #[arg(long, hide = true, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// For the proxy's runner: the run's id, given to the command as `OSTIARY_RUN_ID`, and
    /// its payload's path (`payload.json` in --workdir) as `OSTIARY_TRIGGER_PAYLOAD`.
    #[arg(long, hide = true, requires = "workdir")]
    pub run_id: Option<String>,
    /// For the proxy's runner: end at once if process PID (the proxy) ends, and do not
    /// start if it already has.
    #[arg(long, hide = true, value_name = "PID")]
    pub die_with_parent: Option<u32>,
    /// For the proxy's runner: the wall-clock limit, over the profile's.
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    pub wall_clock: Option<Duration>,
}

/// Why `ostiary run` did not run the command.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Cli(#[from] CliError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Sdk(#[from] ostiary_sdk::SdkError),
    #[error("{0}")]
    Refused(String),
}

/// Run `ostiary run`; a failure before the command runs exits with [`exit::SETUP`].
pub async fn run(config: &Config, args: RunArgs) -> ExitCode {
    if let Some(parent) = args.die_with_parent {
        // A sandbox dies with its `ostiary run` (bubblewrap's --die-with-parent): killed at
        // once. An unsandboxed command does not: this process is told instead, and ends
        // the command's process group before it goes ([`stop_group_on_term`]).
        let signal = match args.sandbox {
            Some(_) => nix::sys::signal::Signal::SIGKILL,
            None => nix::sys::signal::Signal::SIGTERM,
        };
        if let Err(e) = die_with(parent, signal) {
            eprintln!("ostiary: {e}");
            return ExitCode::from(exit::SETUP);
        }
    }
    let result = match args.sandbox.clone() {
        Some(profile) => sandboxed(config, &args, profile).await,
        None => unsandboxed(config, &args).await,
    };
    result.unwrap_or_else(|e| {
        eprintln!("ostiary: {e}");
        ExitCode::from(exit::SETUP)
    })
}

/// Be sent `signal` when process `parent` ends (the proxy whose runner started this run), so
/// that no run outlives the proxy tracking it; refuse to start if it already ended.
fn die_with(parent: u32, signal: nix::sys::signal::Signal) -> Result<(), RunError> {
    nix::sys::prctl::set_pdeathsig(signal)
        .map_err(|e| RunError::Refused(format!("--die-with-parent: {e}")))?;
    // Set after the parent may have died already: then this process was reparented.
    if nix::unistd::getppid().as_raw() != i32::try_from(parent).unwrap_or(-1) {
        return Err(RunError::Refused(format!(
            "--die-with-parent {parent}: that process has already ended"
        )));
    }
    Ok(())
}

/// Wait for an unsandboxed command the proxy's runner started, in the process group the
/// runner made for this process; on SIGTERM (the runner stopping the run, or the proxy's
/// death through `--die-with-parent`) the whole group is asked to stop, then killed after
/// `grace` — so that no command of an unsandboxed run outlives it.
async fn stop_group_on_term(
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    use nix::sys::signal::{killpg, Signal};
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        status = child.wait() => return status,
        _ = term.recv() => {}
    }
    let group = nix::unistd::getpgrp();
    // This process is in the group too: it ignores its own SIGTERM from here on (the
    // handler above stays installed), and goes with the SIGKILL.
    let _ = killpg(group, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            child.wait().await
        }
    }
}

/// The run's session: the one the proxy's runner made (`--session-file`, read once and
/// deleted: it holds the session token), or a new one.
async fn session_for(
    client: &ControlClient,
    args: &RunArgs,
    new: &NewSession,
) -> Result<ostiary_sdk::Session, RunError> {
    let Some(path) = &args.session_file else {
        return Ok(client.create_session(new).await?);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| RunError::Refused(format!("--session-file {}: {e}", path.display())))?;
    let _ = std::fs::remove_file(path);
    serde_json::from_str(&text)
        .map_err(|e| RunError::Refused(format!("--session-file {}: {e}", path.display())))
}

/// What a run a trigger started tells its command: its id and its payload's path.
fn run_env(args: &RunArgs, workdir: &Path) -> Vec<(String, String)> {
    match &args.run_id {
        Some(id) => vec![
            ("OSTIARY_RUN_ID".into(), id.clone()),
            (
                "OSTIARY_TRIGGER_PAYLOAD".into(),
                workdir.join("payload.json").display().to_string(),
            ),
        ],
        None => Vec::new(),
    }
}

/// The command's working directory: `--workdir`, or this one.
fn workdir(args: &RunArgs) -> std::io::Result<PathBuf> {
    match &args.workdir {
        Some(dir) => dir.canonicalize(),
        None => std::env::current_dir().and_then(|d| d.canonicalize()),
    }
}

async fn unsandboxed(config: &Config, args: &RunArgs) -> Result<ExitCode, RunError> {
    if !args.unsafe_shared_uid {
        let readable = readable_secrets(config);
        if !readable.is_empty() {
            let list: Vec<String> = readable.iter().map(|p| p.display().to_string()).collect();
            return Err(RunError::Refused(format!(
                "not running {:?}: without --sandbox it would run as uid {} with your access, and could read {} (with the admin token it could approve its own held requests, mint sessions and read every secret). Only --sandbox is a boundary: use `ostiary run --sandbox`, or --unsafe-shared-uid to run it anyway",
                args.command.join(" "),
                nix::unistd::geteuid(),
                list.join(", ")
            )));
        }
    }
    let client = super::control_client(config)?;
    let new = NewSession {
        agent: args.agent.clone(),
        tenant: args.tenant.clone(),
        ttl: args.ttl.clone(),
        ..Default::default()
    };
    let session = session_for(&client, args, &new).await?;
    let cwd = workdir(args).map_err(|source| CliError::Io {
        what: "the working directory".into(),
        source,
    })?;
    let ca = super::ca_path(config, &session)?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| CliError::Usage("run needs a command after --".into()))?;
    let mut command = tokio::process::Command::new(program);
    command.args(rest);
    for name in env::unsandboxed_removals(config, std::env::vars_os()) {
        command.env_remove(name);
    }
    command
        .envs(session.env(&ca))
        .envs(run_env(args, &cwd))
        .current_dir(&cwd);
    let status = match command.spawn() {
        Ok(mut child) if args.die_with_parent.is_some() => {
            stop_group_on_term(&mut child, config.runs.stop_grace).await
        }
        Ok(mut child) => child.wait().await,
        Err(e) => Err(e),
    };
    // Teardown whatever happened to the child.
    let teardown = client.delete_session(&session.session_id).await;
    let status = status.map_err(|source| CliError::Io {
        what: format!("starting {program}"),
        source,
    })?;
    teardown?;
    Ok(super::exit_code_of(status))
}

/// The state directory and the secret files a command of the operator's uid could read
/// now (tried, not guessed from modes: root reads whatever the modes say).
fn readable_secrets(config: &Config) -> Vec<PathBuf> {
    let dir = &config.state.dir;
    let mut readable = Vec::new();
    if std::fs::read_dir(dir).is_ok() {
        readable.push(dir.clone());
    }
    for name in [
        files::ADMIN_TOKEN,
        files::CA_KEY,
        files::SIGNING_KEY,
        files::AUDIT_KEY,
        files::APPROVALS_KEY,
        files::DATABASE,
    ] {
        let path = dir.join(name);
        if std::fs::File::open(&path).is_ok() {
            readable.push(path);
        }
    }
    // Shared keys (`state.keys_dir`) are the same secrets, kept apart.
    if let Some(keys) = &config.state.keys_dir {
        for name in [
            files::CA_KEY,
            files::SIGNING_KEY,
            files::AUDIT_KEY,
            files::APPROVALS_KEY,
        ] {
            let path = keys.join(name);
            if std::fs::File::open(&path).is_ok() {
                readable.push(path);
            }
        }
    }
    if std::fs::File::open(&config.broker.file).is_ok() {
        readable.push(config.broker.file.clone());
    }
    readable
}

async fn sandboxed(
    config: &Config,
    args: &RunArgs,
    profile: Option<String>,
) -> Result<ExitCode, RunError> {
    let name = profile.unwrap_or_else(|| config.sandbox.default_profile.clone());
    let profile = config.sandbox.profile(&name).ok_or_else(|| {
        SandboxError::Plan(format!(
            "{name:?} is not a sandbox profile (known: {})",
            config.sandbox.profile_names().join(", ")
        ))
    })?;
    // Everything this host may lack is found out before a session exists.
    let runner = sandbox::runner_for(config, profile.isolation)?;
    let cwd = workdir(args).map_err(SandboxError::io("the working directory"))?;
    let socket = std::path::absolute(config.proxy_unix_path())
        .map_err(SandboxError::io("the proxy's Unix socket"))?;
    if !socket.exists() {
        return Err(SandboxError::Unavailable(format!(
            "the proxy's Unix socket {} does not exist: is `ostiary serve` running with this config?",
            socket.display()
        ))
        .into());
    }
    let identity = uid::choose(config.sandbox.uid_range)?;
    let run_id = format!("{}-{}", std::process::id(), state::random_hex(4));
    let control = Control::create(
        config.sandbox.cgroups,
        Limits::of(&profile),
        &format!("{}{run_id}", cgroup::PREFIX),
        runner.cgroup_tasks(profile.processes),
    )
    .map_err(SandboxError::from)?;
    let client = match super::control_client(config) {
        Ok(client) => client,
        Err(e) => {
            let _ = control.remove();
            return Err(e.into());
        }
    };
    let new = NewSession {
        agent: args.agent.clone(),
        tenant: args.tenant.clone(),
        ttl: args.ttl.clone(),
        profile: Some(name.clone()),
        ..Default::default()
    };
    let session = match session_for(&client, args, &new).await {
        Ok(session) => session,
        Err(e) => {
            let _ = control.remove();
            return Err(e);
        }
    };
    let setup = Setup {
        config,
        args,
        name: &name,
        profile: &profile,
        cwd: &cwd,
        socket: &socket,
        identity,
        run_id: &run_id,
    };
    let mut outcome = match setup.run(&session, runner.as_ref(), &control).await {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("ostiary: the sandbox could not be set up: {e}");
            let mut outcome = Outcome {
                exit: exit::SETUP,
                limit: None,
                limits_by: control.mechanism,
                started: false,
                cleaned: Vec::new(),
                failed: Vec::new(),
            };
            match teardown::retry("cgroup", || async { control.remove() }).await {
                Ok(()) if control.has_cgroup() => outcome.cleaned.push("cgroup"),
                Ok(()) => {}
                Err(e) => outcome.failed.push(format!("cgroup: {e}")),
            }
            outcome
        }
    };
    end_session(
        &client,
        &session.session_id,
        &name,
        runner.isolation(),
        &mut outcome,
    )
    .await;
    if args.verbose {
        let report = teardown::report(&outcome, runner.isolation().as_str(), &name);
        eprintln!("ostiary: sandbox report: {report}");
    }
    Ok(ExitCode::from(outcome.exit))
}

/// What a sandboxed run is made from, before its session's values.
struct Setup<'a> {
    config: &'a Config,
    args: &'a RunArgs,
    name: &'a str,
    profile: &'a Profile,
    cwd: &'a Path,
    socket: &'a Path,
    identity: uid::Identity,
    run_id: &'a str,
}

impl Setup<'_> {
    /// Stage, plan and run; the host-side teardown is done when this returns `Ok`.
    async fn run(
        &self,
        session: &ostiary_sdk::Session,
        runner: &dyn sandbox::Runner,
        control: &Control,
    ) -> Result<Outcome, SandboxError> {
        let (config, profile) = (self.config, self.profile);
        let home = env::sandbox_home(config, profile, std::env::var_os("HOME").as_deref());
        let binary = std::env::current_exe().map_err(SandboxError::io("the ostiary binary"))?;
        let staging = Staging::create(self.run_id, &self.identity, &home, &session.ca_pem)?;
        let planned = self.plan(session, &home, &binary, &staging, control);
        let plan = match planned {
            Ok(plan) => plan,
            Err(e) => {
                let _ = staging.remove();
                return Err(e);
            }
        };
        if self.args.verbose {
            eprintln!(
                "ostiary: sandbox: session {}, profile {} ({}), uid {}{}, limits by {} {:?}, staging {}, wall clock {}",
                session.session_id,
                self.name,
                runner.isolation().as_str(),
                self.identity.uid,
                if self.identity.user_ns { " (user namespace)" } else { "" },
                control.mechanism.as_str(),
                control.cgroup_dirs(),
                staging.dir.display(),
                humantime::format_duration(plan.wall_clock),
            );
        }
        Ok(supervise::run(&plan, runner, control, &staging, &binary).await)
    }

    fn plan(
        &self,
        session: &ostiary_sdk::Session,
        home: &Path,
        binary: &Path,
        staging: &Staging,
        control: &Control,
    ) -> Result<Plan, SandboxError> {
        let (config, profile) = (self.config, self.profile);
        let view = view::build(&ViewSpec {
            profile,
            cwd: self.cwd,
            home,
            staging,
            binary,
            socket: self.socket,
            hidden: view::secret_paths(config, profile, self.cwd),
        })?;
        let port = config.listen.proxy.port();
        let operator: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        let mut env = env::sandbox_env(config, profile, session, port, home, operator);
        env.extend(run_env(self.args, self.cwd));
        Ok(Plan {
            profile_name: self.name.to_owned(),
            profile: profile.clone(),
            command: self.args.command.clone(),
            env: Env(env),
            cwd: self.cwd.to_owned(),
            home: home.to_owned(),
            identity: self.identity,
            view,
            limits: control.limits,
            // The trigger's wall clock never loosens the profile's.
            wall_clock: match (self.args.wall_clock, profile.wall_clock) {
                (Some(run), Some(profile)) => run.min(profile),
                (run, profile) => run.or(profile).unwrap_or_else(|| until(session.expires_at)),
            },
            proxy_port: port,
            staging: staging.dir.clone(),
            rlimits: control.rlimits(),
        })
    }
}

/// What is left of a session that expires at `expires_at` (seconds since the epoch), at
/// least a second.
fn until(expires_at: i64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Duration::from_secs(expires_at.saturating_sub(now).max(1) as u64)
}

/// Tear the session down with the run's report for its audit record, retried; a failure is
/// said and kept in the outcome.
async fn end_session(
    client: &ControlClient,
    session_id: &str,
    profile: &str,
    isolation: ostiary::config::Isolation,
    outcome: &mut Outcome,
) {
    let reason = match outcome.limit {
        Some(limit) => format!(
            "the sandboxed run was ended by its {} limit",
            limit.as_str()
        ),
        None => format!("the sandboxed run ended (exit {})", outcome.exit),
    };
    let report = teardown::report(outcome, isolation.as_str(), profile);
    let ended = teardown::retry("session", || async {
        client
            .end_run(session_id, &reason, Some(&report))
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    match ended {
        Ok(()) => outcome.cleaned.push("session"),
        Err(e) => outcome.failed.push(format!("session: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readable_state_directory_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join(files::ADMIN_TOKEN), "t").unwrap();
        let mut config = Config::default();
        config.state.dir = state.clone();
        config.broker.file = dir.path().join("absent.toml");
        let found = readable_secrets(&config);
        assert!(found.contains(&state), "{found:?}");
        assert!(found.contains(&state.join(files::ADMIN_TOKEN)), "{found:?}");
        config.state.dir = dir.path().join("nope");
        assert!(readable_secrets(&config).is_empty());
    }

    #[test]
    fn the_wall_clock_defaults_to_what_is_left_of_the_session() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let left = until(now + 600);
        assert!(left <= Duration::from_secs(600) && left >= Duration::from_secs(598));
        assert_eq!(until(now - 5), Duration::from_secs(1));
    }
}
