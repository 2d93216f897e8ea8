//! Starting a stage with exactly the descriptors it is meant to have.
//!
//! A process inherits every descriptor its parent did not mark close-on-exec: the
//! operator's shell (or an agent harness) may have left some open on `ostiary run`, and a
//! sandbox that inherits an open socket or file has a way out. Stages are started with
//! `posix_spawn` (nix's safe wrapper), whose file actions close every descriptor above
//! stdio in the child and then place only the ones named, at fixed numbers.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
use nix::sys::signal::SigSet;
use nix::sys::stat::Mode;
use nix::unistd::Pid;

/// A descriptor the child gets at a fixed number.
#[derive(Debug)]
pub enum Pass<'a> {
    /// The file at this path, opened for writing (created, truncated, `0600`).
    WriteFile(&'a Path),
    /// A descriptor of this process.
    Fd(BorrowedFd<'a>),
}

/// Why a stage could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("an argument or variable holds a NUL byte")]
    Nul,
    #[error("posix_spawn: {0}")]
    Spawn(#[from] nix::Error),
}

/// How the child starts.
#[derive(Debug, Default)]
pub struct Spawn<'a> {
    /// The descriptors the child gets, by number (above stdio).
    pub pass: Vec<(i32, Pass<'a>)>,
    /// Start the child in a process group of its own (the terminal's signals then reach
    /// only this process, which decides what to pass on).
    pub own_group: bool,
}

impl Spawn<'_> {
    /// Start `program` with `argv` (its first element included) and exactly `env`.
    pub fn start(
        &self,
        program: &Path,
        argv: &[OsString],
        env: &[(OsString, OsString)],
    ) -> Result<Pid, SpawnError> {
        let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| SpawnError::Nul);
        let args = argv
            .iter()
            .map(|a| c(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let env = env
            .iter()
            .map(|(k, v)| c(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut actions = PosixSpawnFileActions::init()?;
        // Dups first: a source numbered like an inherited descriptor closed below would be
        // gone by then.
        for (fd, pass) in &self.pass {
            if let Pass::Fd(source) = pass {
                actions.add_dup2(source.as_raw_fd(), *fd)?;
            }
        }
        let passed: Vec<i32> = self.pass.iter().map(|(fd, _)| *fd).collect();
        for fd in open_fds() {
            if !passed.contains(&fd) {
                actions.add_close(fd)?;
            }
        }
        for (fd, pass) in &self.pass {
            if let Pass::WriteFile(path) = pass {
                actions.add_open(
                    *fd,
                    *path,
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
                    Mode::from_bits_truncate(0o600),
                )?;
            }
        }
        let mut attr = PosixSpawnAttr::init()?;
        let mut flags =
            PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK;
        if self.own_group {
            flags |= PosixSpawnFlags::POSIX_SPAWN_SETPGROUP;
            attr.set_pgroup(Pid::from_raw(0))?;
        }
        attr.set_flags(flags)?;
        // Handlers this process installed do not survive exec anyway; ignored signals and
        // a blocked mask would.
        attr.set_sigdefault(&SigSet::all())?;
        attr.set_sigmask(&SigSet::empty())?;
        Ok(nix::spawn::posix_spawn(
            program, &actions, &attr, &args, &env,
        )?)
    }
}

/// This process's environment, for a child that keeps it.
pub fn own_env() -> Vec<(OsString, OsString)> {
    std::env::vars_os().collect()
}

/// `(name, value)` pairs as the `OsString`s [`Spawn::start`] takes.
pub fn env_of(pairs: &[(String, String)]) -> Vec<(OsString, OsString)> {
    pairs
        .iter()
        .map(|(k, v)| (OsStr::new(k).to_owned(), OsStr::new(v).to_owned()))
        .collect()
}

/// Descriptors above stdio open in this process now.
fn open_fds() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&fd| fd > 2)
        .collect()
}
