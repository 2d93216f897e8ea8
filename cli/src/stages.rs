//! The sandbox's hidden stages: the command line `ostiary run --sandbox` execs this same
//! binary with (docs/sandbox.md). The library writes those command lines
//! (`ostiary::sandbox::{enter, init, exec}`'s `argv`) and runs the stages from plain
//! structs; this module holds the clap side, parses them back into those structs, and its
//! tests round-trip every command line the library writes, so the two cannot drift.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use ostiary::sandbox::enter::EnterArgs;
use ostiary::sandbox::exec::{CommandLimits, ExecArgs};
use ostiary::sandbox::init::InitArgs;
use ostiary::sandbox::limits::Rlimit;

/// The stages, flattened into the top-level commands (hidden from `--help`).
#[derive(Debug, Subcommand)]
pub enum Stage {
    /// Sandbox stage: join the run's cgroups, set its rlimits, exec the runner.
    #[command(name = EnterArgs::SUBCOMMAND, hide = true)]
    Enter(EnterStage),
    /// Sandbox stage: pid 1 inside (forwarder, working-directory copy, reaping).
    #[command(name = InitArgs::SUBCOMMAND, hide = true)]
    Init(InitStage),
    /// Sandbox stage: drop privileges, install seccomp, exec the command.
    #[command(name = ExecArgs::SUBCOMMAND, hide = true)]
    Exec(ExecStage),
}

/// Run a sandbox stage: synchronously, with no config (inside a sandbox there is none to
/// read) and no multi-threaded runtime (the exec stage's seccomp filter and uid change are
/// per thread until it execs; the init stage makes its own single-threaded one).
pub fn run(stage: Stage) -> ExitCode {
    match stage {
        Stage::Enter(args) => ostiary::sandbox::enter::run(args.into()),
        Stage::Init(args) => ostiary::sandbox::init::run(args.into()),
        Stage::Exec(args) => ostiary::sandbox::exec::run(args.into()),
    }
}

/// `sandbox-enter`'s command line ([`EnterArgs`]).
#[derive(Debug, Args)]
pub struct EnterStage {
    /// A cgroup directory to join (its `cgroup.procs`).
    #[arg(long = "cgroup")]
    cgroups: Vec<PathBuf>,
    /// `NAME=SOFT:HARD` (nofile, cpu, as).
    #[arg(long = "rlimit")]
    rlimits: Vec<Rlimit>,
    /// The runner's command line.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

impl From<EnterStage> for EnterArgs {
    fn from(stage: EnterStage) -> Self {
        EnterArgs {
            cgroups: stage.cgroups,
            rlimits: stage.rlimits,
            command: stage.command,
        }
    }
}

/// `sandbox-init`'s command line ([`InitArgs`]).
#[derive(Debug, Args)]
pub struct InitStage {
    /// A descriptor to write "started" on once everything is ready.
    #[arg(long)]
    started_fd: Option<i32>,
    /// A file to write "started" in instead.
    #[arg(long, conflicts_with = "started_fd")]
    started_file: Option<PathBuf>,
    /// The port the forwarder listens on (127.0.0.1).
    #[arg(long)]
    port: u16,
    /// The proxy's Unix socket.
    #[arg(long)]
    socket: PathBuf,
    /// The private working directory.
    #[arg(long)]
    workdir: PathBuf,
    /// The private HOME.
    #[arg(long)]
    home: PathBuf,
    /// `UID:GID` of the command.
    #[arg(long)]
    owner: String,
    /// Copy this directory into the working directory first.
    #[arg(long, requires = "copy_max")]
    copy_from: Option<PathBuf>,
    /// The most bytes the copy may hold.
    #[arg(long)]
    copy_max: Option<u64>,
    /// The exec stage's command line.
    #[arg(required = true, last = true)]
    exec: Vec<OsString>,
}

impl From<InitStage> for InitArgs {
    fn from(stage: InitStage) -> Self {
        InitArgs {
            started_fd: stage.started_fd,
            started_file: stage.started_file,
            port: stage.port,
            socket: stage.socket,
            workdir: stage.workdir,
            home: stage.home,
            owner: stage.owner,
            copy_from: stage.copy_from,
            copy_max: stage.copy_max,
            exec: stage.exec,
        }
    }
}

/// `sandbox-exec`'s command line ([`ExecArgs`]).
#[derive(Debug, Args)]
pub struct ExecStage {
    #[arg(long)]
    uid: u32,
    #[arg(long)]
    gid: u32,
    /// `RLIMIT_NPROC` for the command's uid.
    #[arg(long)]
    nproc: u64,
    /// `RLIMIT_AS` for the command, where no cgroup limits memory.
    #[arg(long)]
    address_space: Option<u64>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

impl From<ExecStage> for ExecArgs {
    fn from(stage: ExecStage) -> Self {
        ExecArgs {
            uid: stage.uid,
            gid: stage.gid,
            limits: CommandLimits {
                nproc: stage.nproc,
                address_space: stage.address_space,
            },
            command: stage.command,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use clap::Parser;
    use ostiary::config::sandbox::Workdir;
    use ostiary::config::Profile;
    use ostiary::sandbox::gvisor::{started_by_file, STARTED_INSIDE};
    use ostiary::sandbox::limits::{Limits, RlimitName};
    use ostiary::sandbox::uid::Identity;
    use ostiary::sandbox::view::View;
    use ostiary::sandbox::{inside, Env, Plan};

    use super::*;
    use crate::commands::{Cli, Command};

    /// What the exec stage sets on the command, both kinds present.
    const LIMITS: CommandLimits = CommandLimits {
        nproc: 514,
        address_space: Some(64 << 20),
    };

    /// Parse a command line the library wrote, as `main` does.
    fn parse(argv: &[OsString]) -> Stage {
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Stage(stage),
                ..
            }) => stage,
            Ok(other) => panic!("{argv:?} parsed as {other:?}"),
            Err(e) => panic!("{argv:?} does not parse: {e}"),
        }
    }

    fn enter(argv: &[OsString]) -> EnterArgs {
        match parse(argv) {
            Stage::Enter(args) => args.into(),
            other => panic!("{argv:?} parsed as {other:?}"),
        }
    }

    fn init(argv: &[OsString]) -> InitArgs {
        match parse(argv) {
            Stage::Init(args) => args.into(),
            other => panic!("{argv:?} parsed as {other:?}"),
        }
    }

    fn exec(argv: &[OsString]) -> ExecArgs {
        match parse(argv) {
            Stage::Exec(args) => args.into(),
            other => panic!("{argv:?} parsed as {other:?}"),
        }
    }

    /// A plan as `ostiary run --sandbox` makes one; only what the stages' command lines
    /// carry matters here.
    fn plan(workdir: Workdir) -> Plan {
        let profile = Profile {
            workdir,
            ..Profile::default()
        };
        Plan {
            profile_name: "default".into(),
            limits: Limits::of(&profile),
            profile,
            // Flags of the command's own after `--`, which must stay the command's.
            command: vec!["sh".into(), "-c".into(), "exit 7".into(), "--uid".into()],
            env: Env(Vec::new()),
            cwd: "/work/project with space".into(),
            home: inside::HOME.into(),
            identity: Identity {
                uid: 1_500_000_001,
                gid: 1_500_000_002,
                user_ns: false,
            },
            view: View {
                mounts: Vec::new(),
                chdir: "/work/project with space".into(),
            },
            wall_clock: Duration::from_secs(60),
            proxy_port: 8080,
            staging: "/tmp/ostiary-run-1-ab".into(),
            rlimits: Vec::new(),
        }
    }

    #[test]
    fn the_enter_stage_parses_back_to_what_the_library_wrote() {
        let binary = Path::new("/usr/local/bin/ostiary");
        let args = EnterArgs {
            cgroups: vec![
                "/sys/fs/cgroup/ostiary-run-1".into(),
                "/sys/fs/cgroup/pids/ostiary-run-1".into(),
            ],
            rlimits: vec![
                Rlimit {
                    resource: RlimitName::Nofile,
                    soft: 1024,
                    hard: 1024,
                },
                Rlimit {
                    resource: RlimitName::Cpu,
                    soft: 3605,
                    hard: 3610,
                },
            ],
            command: vec!["bwrap".into(), "--unshare-all".into(), "--".into()],
        };
        assert_eq!(enter(&args.argv(binary)), args);
        let bare = EnterArgs {
            cgroups: Vec::new(),
            rlimits: Vec::new(),
            ..args
        };
        assert_eq!(enter(&bare.argv(binary)), bare);
    }

    #[test]
    fn the_init_and_exec_stages_parse_back_to_what_the_plan_says() {
        for workdir in [Workdir::Copy, Workdir::Empty] {
            let plan = plan(workdir);
            let argv = plan.init_argv(LIMITS, 4);
            let parsed = init(&argv);
            assert_eq!(parsed.argv(Path::new(inside::BINARY)), argv);
            assert_eq!(parsed.started_fd, Some(4));
            assert_eq!(parsed.started_file, None);
            assert_eq!(parsed.port, plan.proxy_port);
            assert_eq!(parsed.socket, Path::new(inside::SOCKET));
            assert_eq!(parsed.workdir, plan.cwd);
            assert_eq!(parsed.home, plan.home);
            assert_eq!(parsed.owner, "1500000001:1500000002");
            let copy = workdir == Workdir::Copy;
            assert_eq!(
                parsed.copy_from.as_deref(),
                copy.then_some(Path::new(inside::WORKDIR_SOURCE))
            );
            assert_eq!(
                parsed.copy_max,
                copy.then_some(plan.profile.workdir_copy_max)
            );

            // The init stage runs its `exec` as given: the exec stage's own command line.
            assert_eq!(parsed.exec[0], inside::BINARY);
            let inner = exec(&parsed.exec);
            assert_eq!(
                inner,
                ExecArgs {
                    uid: plan.identity.uid,
                    gid: plan.identity.gid,
                    limits: LIMITS,
                    command: plan.command.iter().map(OsString::from).collect(),
                }
            );
            assert_eq!(inner.argv(Path::new(inside::BINARY)), parsed.exec);

            // gvisor's variant says "started" in a file; the rest is the same.
            let by_file = init(&started_by_file(&argv).expect("has --started-fd"));
            assert_eq!(by_file.started_fd, None);
            assert_eq!(
                by_file.started_file.as_deref(),
                Some(Path::new(STARTED_INSIDE))
            );
            assert_eq!(
                InitArgs {
                    started_fd: Some(4),
                    started_file: None,
                    ..by_file
                },
                parsed
            );
        }
    }

    #[test]
    fn the_stages_are_refused_when_malformed() {
        let binary = Path::new("/usr/local/bin/ostiary");
        let mut args = plan(Workdir::Copy).init_argv(LIMITS, 4);
        // Both ways of saying "started".
        args.splice(2..2, ["--started-file".into(), "/run/x".into()]);
        assert!(Cli::try_parse_from(&args).is_err());
        let no_command = ExecArgs {
            uid: 1,
            gid: 1,
            limits: CommandLimits {
                nproc: 1,
                address_space: None,
            },
            command: Vec::new(),
        };
        assert!(Cli::try_parse_from(no_command.argv(binary)).is_err());
        let bad_rlimit = [binary.as_os_str(), "sandbox-enter".as_ref()]
            .into_iter()
            .chain(["--rlimit", "stack=1:1", "--", "bwrap"].map(AsRef::as_ref));
        assert!(Cli::try_parse_from(bad_rlimit).is_err());
    }

    #[test]
    fn the_stages_are_hidden_from_help() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("serve"), "{help}");
        assert!(!help.contains("sandbox-"), "{help}");
    }
}
