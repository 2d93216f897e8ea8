//! `ostiary run --sandbox`: the command runs where the proxy is the only way out
//! (docs/sandbox.md).
//!
//! # Layout
//! The outer process (`ostiary run`, in the `ostiary-cli` crate) makes a [`Plan`] — everything about the
//! run that does not depend on how it is isolated — and hands it to a [`Runner`], which says
//! how to start a sandbox around the init stage. Then [`supervise::run`] starts it, watches
//! it and tears it down.
//! - [`env`] — the environment inside: cleared, then the session's variables and an
//!   allowlist; never the proxy's own, Vault's or a config-named secret.
//! - [`view`] — the filesystem view (read-only host paths, private tmpfs, hidden secrets)
//!   as a list of mounts any runner can translate; [`bwrap`] translates it for bubblewrap,
//!   the `namespaces` runner.
//! - [`limits`] (with [`cgroup`]) — which mechanism enforces memory, processes, CPU time
//!   and open files, and how a hit is noticed.
//! - [`uid`] — the identity the command runs as.
//! - The stages, all the same `ostiary` binary (hidden subcommands): [`enter`] (joins the
//!   cgroups, sets rlimits, execs the runner), [`init`] (pid 1 inside: the forwarder to the
//!   proxy's Unix socket, the working-directory copy, waiting), [`exec`] (drops privileges,
//!   installs [`seccomp`], execs the command).
//! - [`teardown`] — retried clean-up steps and the run's report.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{Config, Isolation, Profile};

pub mod bwrap;
pub mod cgroup;
pub mod enter;
pub mod env;
pub mod exec;
pub mod gvisor;
pub mod init;
pub mod limits;
pub mod pin;
pub mod seccomp;
pub mod spawn;
pub mod supervise;
pub mod teardown;
pub mod uid;
pub mod view;

/// Where things are inside every sandbox, whatever the runner.
pub mod inside {
    /// A private directory of the sandbox's own plumbing.
    pub const DIR: &str = "/run/ostiary";
    /// The `ostiary` binary, for the init and exec stages.
    pub const BINARY: &str = "/run/ostiary/ostiary";
    /// The proxy's Unix socket, the one way out.
    pub const SOCKET: &str = "/run/ostiary/proxy.sock";
    /// The interception CA the session's clients trust.
    pub const CA: &str = "/run/ostiary/ca.pem";
    /// The host working directory, read-only, that the init copies from.
    pub const WORKDIR_SOURCE: &str = "/run/ostiary/workdir";
    /// `HOME` unless the allowlist names `HOME`: an empty private tmpfs.
    pub const HOME: &str = "/home/agent";
    /// The name of the command's user in the sandbox's `/etc/passwd`.
    pub const USER: &str = "agent";
}

/// The exit codes of `ostiary run` that are not the command's own.
pub mod exit {
    /// The wall-clock limit ended the run (as `timeout(1)`).
    pub const WALL_CLOCK: u8 = 124;
    /// The sandbox could not be set up; the command did not run.
    pub const SETUP: u8 = 125;
    /// The command exists but cannot be executed (the shell's convention).
    pub const NOT_EXECUTABLE: u8 = 126;
    /// The command was not found (the shell's convention).
    pub const NOT_FOUND: u8 = 127;
    /// The memory limit ended the run.
    pub const MEMORY: u8 = 150;
    /// The process limit ended the run.
    pub const PROCESSES: u8 = 151;
    /// The CPU-time limit ended the run.
    pub const CPU_TIME: u8 = 152;
}

/// A limit that ends a run when it is hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Memory,
    Processes,
    CpuTime,
    WallClock,
}

impl Limit {
    /// The name in the run's report and audit record.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Processes => "processes",
            Limit::CpuTime => "cpu_time",
            Limit::WallClock => "wall_clock",
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Limit::Memory => exit::MEMORY,
            Limit::Processes => exit::PROCESSES,
            Limit::CpuTime => exit::CPU_TIME,
            Limit::WallClock => exit::WALL_CLOCK,
        }
    }
}

/// Why a sandbox could not be set up. Every one ends the run with [`exit::SETUP`] before
/// the command runs: there is never a silent unsandboxed run.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// What the isolation level needs is missing on this host (bwrap, namespaces, a forced
    /// cgroup mechanism).
    #[error("{0}")]
    Unavailable(String),
    /// The profile asks for something this version does not do.
    #[error("{0}")]
    NotBuilt(String),
    /// The profile or the working directory cannot make a sandbox.
    #[error("{0}")]
    Plan(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Limits(#[from] limits::LimitsError),
}

impl SandboxError {
    /// `map_err`'s argument for an I/O failure while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| SandboxError::Io { what, source }
    }
}

/// The environment of the command, whose values (the session's token is in the proxy URL)
/// `Debug` never prints.
#[derive(Clone, Default)]
pub struct Env(pub Vec<(String, String)>);

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Everything about one sandboxed run that does not depend on how it is isolated.
#[derive(Debug, Clone)]
pub struct Plan {
    pub profile_name: String,
    pub profile: Profile,
    /// The command and its arguments.
    pub command: Vec<String>,
    pub env: Env,
    /// The working directory, the same path inside as outside.
    pub cwd: PathBuf,
    /// `HOME` inside: a private tmpfs.
    pub home: PathBuf,
    pub identity: uid::Identity,
    pub view: view::View,
    pub limits: limits::Limits,
    /// When the run is ended (the profile's `wall_clock`, else what is left of the
    /// session's TTL).
    pub wall_clock: Duration,
    /// The port the forwarder listens on inside (`listen.proxy`'s, so the proxy URL reads
    /// the same inside as outside).
    pub proxy_port: u16,
    /// The run's host directory ([`view::Staging`]), where a runner may keep its own files.
    pub staging: PathBuf,
    /// The rlimits of every process of the run (set by the enter stage, or inside by a
    /// runner whose sandbox has a kernel of its own: [`Runner::rlimits_inside`]).
    pub rlimits: Vec<limits::Rlimit>,
}

impl Plan {
    /// The init stage's command line, as seen inside: it prepares the working directory,
    /// starts the forwarder, says "started" on descriptor `started_fd`, and runs the exec
    /// stage, which sets `limits` on the command.
    pub fn init_argv(&self, limits: exec::CommandLimits, started_fd: i32) -> Vec<OsString> {
        let copy = self.profile.workdir == crate::config::sandbox::Workdir::Copy;
        let exec = exec::ExecArgs {
            uid: self.identity.uid,
            gid: self.identity.gid,
            limits,
            command: self.command.iter().map(OsString::from).collect(),
        };
        init::InitArgs {
            started_fd: Some(started_fd),
            started_file: None,
            port: self.proxy_port,
            socket: inside::SOCKET.into(),
            workdir: self.cwd.clone(),
            home: self.home.clone(),
            owner: format!("{}:{}", self.identity.uid, self.identity.gid),
            copy_from: copy.then(|| inside::WORKDIR_SOURCE.into()),
            copy_max: copy.then_some(self.profile.workdir_copy_max),
            exec: exec.argv(Path::new(inside::BINARY)),
        }
        .argv(Path::new(inside::BINARY))
    }
}

/// What a runner reported about the sandbox it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunnerStatus {
    /// The host pid of the sandbox's first process (the init stage), once started.
    pub init_pid: Option<i32>,
    /// The inode of the sandbox's pid namespace (`/proc/<pid>/ns/pid`), when known.
    pub pid_namespace: Option<u64>,
    /// The init stage's exit code, once it ended.
    pub exit: Option<i32>,
}

/// How one isolation level starts a sandbox from a [`Plan`]: the `namespaces` level builds a
/// bubblewrap command ([`bwrap::Bubblewrap`]); another level builds its own command from the
/// same plan, around the same init stage.
pub trait Runner: std::fmt::Debug + Send + Sync {
    fn isolation(&self) -> Isolation;

    /// The program and arguments that start a sandbox showing `plan.view`, whose first
    /// process is `init` (a command line as seen inside). `status_fd` is a descriptor open
    /// for writing that the runner may write its status to (read back with
    /// [`Runner::status`]).
    fn command(
        &self,
        plan: &Plan,
        init: &[OsString],
        status_fd: i32,
    ) -> Result<Vec<OsString>, SandboxError>;

    /// What the status written so far says.
    fn status(&self, written: &str) -> RunnerStatus;

    /// Whether the init stage said "started" some other way than on its descriptor (a
    /// runner that passes a sandbox no descriptor but stdio: gvisor).
    fn started(&self) -> bool {
        false
    }

    /// Pass one of the operator's signals to the sandbox's first process (the init stage,
    /// which passes it to the command) some way of the runner's own; `false`: the caller
    /// sends it to [`RunnerStatus::init_pid`] itself. gvisor: `runsc kill`, since neither
    /// `runsc run` nor the Sentry passes on what it receives.
    fn signal(&self, _signal: nix::sys::signal::Signal) -> bool {
        false
    }

    /// A limit the runner saw the run reach that the host's mechanism cannot see (gvisor:
    /// the command's processes are the Sentry's, not the host's).
    fn limit(&self) -> Option<Limit> {
        None
    }

    /// Whether the run's rlimits are set inside the sandbox by the runner (from
    /// [`Plan::rlimits`]) rather than on the runner's process by the enter stage: a sandbox
    /// with a kernel of its own does not inherit the host's.
    fn rlimits_inside(&self) -> bool {
        false
    }

    /// The cgroup's task limit for a run of `processes` processes: the command's and the
    /// sandbox's own.
    fn cgroup_tasks(&self, processes: u32) -> u64 {
        u64::from(processes) + limits::SANDBOX_TASKS
    }

    /// Stop what the runner runs beside the sandbox (gvisor's watch, which starts `runsc`
    /// processes of its own), before the teardown looks for what remains of the run.
    fn finish(&self) {}

    /// Host processes of the sandbox that neither the cgroup nor the pid namespace show,
    /// still alive (killed and checked for at teardown).
    fn remaining(&self) -> Vec<i32> {
        Vec::new()
    }

    /// Whether process `pid` is one of those [`Runner::remaining`] finds (checked again
    /// once a pidfd names it, before it is killed).
    fn holds(&self, _pid: i32) -> bool {
        false
    }
}

/// The runner of an isolation level, or why this host (or this version) has none.
pub fn runner_for(config: &Config, isolation: Isolation) -> Result<Box<dyn Runner>, SandboxError> {
    match isolation {
        Isolation::Namespaces => Ok(Box::new(bwrap::Bubblewrap::locate(&config.sandbox.bwrap)?)),
        Isolation::Gvisor => Ok(Box::new(gvisor::Gvisor::locate(&config.sandbox.runsc)?)),
    }
}

/// The way a run ended, and what its teardown did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `ostiary run`'s exit code.
    pub exit: u8,
    /// The limit that ended the run, if one did.
    pub limit: Option<Limit>,
    pub limits_by: limits::Mechanism,
    /// Whether the command was started at all.
    pub started: bool,
    /// Teardown steps done (`processes`, `cgroup`, `staging`; the proxy adds `session`).
    pub cleaned: Vec<&'static str>,
    /// Teardown steps that failed after their retries, with why.
    pub failed: Vec<String>,
}
/// A runner's binary as configured (`[sandbox] bwrap`, `runsc`), looked up on `PATH` when it
/// is a bare name, made absolute; `what` is not installed otherwise, and `how` says what to
/// do about it.
fn locate_binary(configured: &Path, what: &str, how: &str) -> Result<PathBuf, SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let is_executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let missing = || {
        SandboxError::Unavailable(format!(
            "{what} ({}) is not installed or not executable: {how}",
            configured.display()
        ))
    };
    let path = if configured.components().count() > 1 {
        configured.to_owned()
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .map(|dir| dir.join(configured))
            .find(|p| is_executable(p))
            .ok_or_else(missing)?
    };
    if !is_executable(&path) {
        return Err(missing());
    }
    std::path::absolute(&path).map_err(SandboxError::io("resolving a runner's binary"))
}
