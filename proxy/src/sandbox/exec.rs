//! `ostiary sandbox-exec` (hidden): the last stage, inside the sandbox. It sets
//! `RLIMIT_NPROC` and, where no cgroup limits memory, `RLIMIT_AS`, drops to the run's uid and gid with no supplementary groups (which
//! clears every capability the init stage held), sets `no_new_privs`, installs the seccomp
//! filter, and execs the command: 127 if it is not found, 126 if it cannot be executed.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::ExitCode;

use nix::unistd::{Gid, Uid};

use super::{exit, seccomp};

/// The rlimits set on the command alone, by the last stage before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandLimits {
    /// `RLIMIT_NPROC` for the command's uid.
    pub nproc: u64,
    /// `RLIMIT_AS`, where no cgroup limits memory. Set here rather than on the stages before
    /// (which inherit the enter stage's other rlimits): they are this binary, whose
    /// allocator reserves more address space than a command's memory limit, and it is the
    /// command's memory that is limited.
    pub address_space: Option<u64>,
}

/// The exec stage's arguments. The command line's parser is the binary's (`ostiary-cli`),
/// which parses what [`ExecArgs::argv`] writes back into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecArgs {
    pub uid: u32,
    pub gid: u32,
    pub limits: CommandLimits,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

impl ExecArgs {
    /// The subcommand that runs this stage.
    pub const SUBCOMMAND: &'static str = "sandbox-exec";

    /// `binary sandbox-exec --uid UID --gid GID --nproc N [--address-space BYTES] -- COMMAND..`.
    pub fn argv(&self, binary: &Path) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            binary.into(),
            Self::SUBCOMMAND.into(),
            "--uid".into(),
            self.uid.to_string().into(),
            "--gid".into(),
            self.gid.to_string().into(),
            "--nproc".into(),
            self.limits.nproc.to_string().into(),
        ];
        if let Some(bytes) = self.limits.address_space {
            argv.extend(["--address-space".into(), bytes.to_string().into()]);
        }
        argv.push("--".into());
        argv.extend(self.command.iter().cloned());
        argv
    }
}

/// Run the stage; returns only on failure.
pub fn run(args: ExecArgs) -> ExitCode {
    if let Err(message) = confine(&args) {
        eprintln!("ostiary: the sandbox could not be set up: {message}");
        return ExitCode::from(exit::SETUP);
    }
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return ExitCode::from(exit::SETUP),
    };
    let error = std::process::Command::new(program).args(rest).exec();
    let code = match error.kind() {
        std::io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::NOT_EXECUTABLE,
    };
    eprintln!("ostiary: {}: {error}", program.to_string_lossy());
    ExitCode::from(code)
}

/// Everything but the exec, in the order that keeps each step possible: the rlimits and the
/// uid change need the privileges the uid change then drops; the filter comes last, as it
/// refuses calls the steps before it make. What this stage allocates after `RLIMIT_AS` comes
/// from address space its allocator reserved before it.
fn confine(args: &ExecArgs) -> Result<(), String> {
    use nix::sys::resource::{setrlimit, Resource};
    let limits = args.limits;
    setrlimit(Resource::RLIMIT_NPROC, limits.nproc, limits.nproc)
        .map_err(|e| format!("setting RLIMIT_NPROC: {e}"))?;
    if let Some(bytes) = limits.address_space {
        setrlimit(Resource::RLIMIT_AS, bytes, bytes)
            .map_err(|e| format!("setting RLIMIT_AS: {e}"))?;
    }
    let (uid, gid) = (Uid::from_raw(args.uid), Gid::from_raw(args.gid));
    if nix::unistd::getuid() != uid {
        nix::unistd::setgroups(&[]).map_err(|e| format!("clearing groups: {e}"))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setting gid {gid}: {e}"))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setting uid {uid}: {e}"))?;
        // The drop must be for good: a process that can take root back is not confined.
        if nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).is_ok() {
            return Err("the uid change can be undone".into());
        }
    }
    if nix::unistd::getuid() != uid || nix::unistd::getgid() != gid {
        return Err(format!(
            "running as {}:{}, not {uid}:{gid}",
            nix::unistd::getuid(),
            nix::unistd::getgid()
        ));
    }
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("setting no_new_privs: {e}"))?;
    seccomp::install().map_err(|e| e.to_string())
}
