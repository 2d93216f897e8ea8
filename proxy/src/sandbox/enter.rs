//! `ostiary sandbox-enter` (hidden): the first stage, on the host. It joins the run's
//! cgroups and sets the run's rlimits, then execs the runner (bwrap): everything the
//! sandbox ever runs descends from it, so everything is inside the limits from its first
//! fork. Nothing is written here that the outer process did not compute.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::exit;
use super::limits::Rlimit;

/// The enter stage's arguments. The command line's parser is the binary's (`ostiary-cli`),
/// which parses what [`EnterArgs::argv`] writes back into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnterArgs {
    /// Cgroup directories to join (their `cgroup.procs`).
    pub cgroups: Vec<PathBuf>,
    /// Set on this process, so the runner and everything under it inherit them.
    pub rlimits: Vec<Rlimit>,
    /// The runner's command line.
    pub command: Vec<OsString>,
}

impl EnterArgs {
    /// The subcommand that runs this stage.
    pub const SUBCOMMAND: &'static str = "sandbox-enter";

    /// `binary sandbox-enter [--cgroup DIR].. [--rlimit NAME=SOFT:HARD].. -- COMMAND..`.
    pub fn argv(&self, binary: &Path) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![binary.into(), Self::SUBCOMMAND.into()];
        for dir in &self.cgroups {
            argv.extend(["--cgroup".into(), dir.into()]);
        }
        for limit in &self.rlimits {
            argv.extend(["--rlimit".into(), limit.to_string().into()]);
        }
        argv.push("--".into());
        argv.extend(self.command.iter().cloned());
        argv
    }
}

/// Run the stage; returns only on failure.
pub fn run(args: EnterArgs) -> ExitCode {
    match enter(args) {
        Ok(never) => match never {},
        Err(message) => {
            eprintln!("ostiary: the sandbox could not be set up: {message}");
            ExitCode::from(exit::SETUP)
        }
    }
}

fn enter(args: EnterArgs) -> Result<std::convert::Infallible, String> {
    // The operator's umask (often 077) is not the sandbox's: bwrap makes the view's
    // directories and the command its files under it, and a `/home` made `0700` is one the
    // command's uid cannot enter.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let me = std::process::id().to_string();
    for dir in &args.cgroups {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, &me).map_err(|e| format!("joining {}: {e}", procs.display()))?;
    }
    for limit in &args.rlimits {
        nix::sys::resource::setrlimit(limit.resource.resource(), limit.soft, limit.hard)
            .map_err(|e| format!("setting {limit}: {e}"))?;
    }
    let (program, rest) = args.command.split_first().ok_or("no runner command")?;
    let error = std::process::Command::new(program).args(rest).exec();
    Err(format!("starting {}: {error}", program.to_string_lossy()))
}
