//! Refused forks, as the Sentry reports them. The command's `RLIMIT_NPROC` is enforced
//! inside the Sentry, where no host counter sees a refusal (the host cgroup's
//! `pids.events` counts host tasks, not the command's), and a count of the command's tasks
//! taken now and then misses a bomb whose processes die the moment a fork fails (seen
//! under load: a shell bomb held at 20 of 32 tasks after its peak had passed between two
//! looks). So runsc traces the fork system calls (`--strace --strace-syscalls=…`) into
//! its debug log, which is a FIFO of the run's staging directory read here: a fork that
//! returned `EAGAIN` is the processes limit, and it is seen however briefly the peak
//! lasted.
//!
//! The log holds what runsc says about the run (its command line, mounts, the traced
//! calls' flags); it is read and dropped, never written anywhere. A FIFO rather than a
//! file: nothing accumulates on disk however many forks a long run makes.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::path::Path;

/// The system calls that make a task, as runsc names them in `--strace-syscalls`.
pub(super) const TRACED: &str = "clone,fork,vfork,clone3";

/// The most of a line kept while its end has not arrived: a longer one is no traced fork's
/// (those are some 250 bytes) and is dropped.
const LINE_MAX: usize = 4096;

/// The pipe capacity asked for: room for some thousands of traced forks between two
/// drains, so that a fork bomb seldom waits on the log (a full pipe holds back the
/// Sentry's logging, not the run's outcome).
const PIPE_SIZE: i32 = 1 << 20;

/// The read end of the debug-log FIFO, non-blocking: opened before runsc starts, so that
/// runsc's opening of its write end never waits.
#[derive(Debug)]
pub(super) struct ForkLog {
    fifo: File,
    /// The start of a line whose end is still to come.
    carry: Vec<u8>,
    /// Whether the line being read has passed [`LINE_MAX`]: the rest of it is dropped.
    skipping: bool,
}

impl ForkLog {
    /// Makes the FIFO at `path` (owner-only) and opens its read end.
    pub(super) fn create(path: &Path) -> std::io::Result<Self> {
        use nix::sys::stat::Mode;
        use std::os::unix::fs::OpenOptionsExt;
        nix::unistd::mkfifo(path, Mode::S_IRUSR | Mode::S_IWUSR)?;
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(path)?;
        // Best effort: the default 64 KiB works, with more back-pressure.
        let _ = nix::fcntl::fcntl(fifo.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        Ok(Self {
            fifo,
            carry: Vec::new(),
            skipping: false,
        })
    }

    /// Reads what the log holds now; whether a line of it says a fork was refused.
    pub(super) fn drain(&mut self) -> bool {
        let mut refused = false;
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.fifo.read(&mut buf) {
                // No writer yet, or none any more; or nothing written since the last look.
                Ok(0) => break,
                Ok(n) => refused |= self.lines(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        refused
    }

    /// Takes `bytes` as the next part of the log; whether a line it ends says a fork was
    /// refused.
    fn lines(&mut self, mut bytes: &[u8]) -> bool {
        let mut refused = false;
        while let Some(at) = bytes.iter().position(|&b| b == b'\n') {
            if std::mem::take(&mut self.skipping) {
                // The end of an overlong line.
            } else if self.carry.is_empty() {
                refused |= refused_fork(&bytes[..at]);
            } else {
                self.carry.extend_from_slice(&bytes[..at]);
                refused |= refused_fork(&self.carry);
            }
            self.carry.clear();
            bytes = &bytes[at + 1..];
        }
        if !self.skipping {
            if self.carry.len() + bytes.len() <= LINE_MAX {
                self.carry.extend_from_slice(bytes);
            } else {
                self.carry.clear();
                self.skipping = true;
            }
        }
        refused
    }
}

/// Whether a line of runsc's strace output is the exit of a fork system call that failed
/// with `EAGAIN` — as this version writes it:
/// `I1202 06:31:00.471343 30043 strace.go:611] [   1:   1] sh X clone(…) = 0 (0x0) errno=11 (try again) (529.664µs)`.
/// The task's name (`sh`, at most 15 bytes and the command's to choose) comes before the
/// part matched, which it is too short to spell; a command that named itself to look like
/// one would only end its own run.
pub fn refused_fork(line: &[u8]) -> bool {
    let Ok(line) = std::str::from_utf8(line) else {
        return false;
    };
    let Some((_, call)) = line.split_once("] ") else {
        return false;
    };
    // `[ tid: pid] comm X name(args) = ret (hex) errno=N (what) (took)`.
    let Some(exit) = call.find(" X ") else {
        return false;
    };
    let call = &call[exit + 3..];
    let traced = TRACED
        .split(',')
        .any(|name| call.starts_with(name) && call[name.len()..].starts_with('('));
    traced
        && call
            .rsplit_once(") = ")
            .is_some_and(|(_, result)| result.contains(" errno=11 "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: &str = "I1202 06:31:00.471343   30043 strace.go:611] [   1:   1] sh X clone(CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|0x11, 0x0, 0x0, 0x7f30cea9ca10, 0x0) = 0 (0x0) errno=11 (try again) (529.664µs)";
    const FORKED: &str = "I1202 06:31:00.467016   30043 strace.go:611] [   1:   1] sh X clone(CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|0x11, 0x0, 0x0, 0x7f30cea9ca10, 0x0) = 5 (0x5) (359.511µs)";

    #[test]
    fn only_a_fork_that_failed_with_eagain_is_a_refusal() {
        assert!(refused_fork(REFUSED.as_bytes()));
        assert!(!refused_fork(FORKED.as_bytes()));
        // The entry of the same call, another call's EAGAIN, another errno.
        assert!(!refused_fork(
            REFUSED.replace(" X clone", " E clone").as_bytes()
        ));
        assert!(!refused_fork(
            REFUSED.replace(" X clone(", " X read(").as_bytes()
        ));
        assert!(!refused_fork(
            REFUSED
                .replace("errno=11 (try again)", "errno=12 (cannot allocate memory)")
                .as_bytes()
        ));
        for call in ["fork", "vfork", "clone3"] {
            assert!(refused_fork(
                REFUSED
                    .replace("X clone(", &format!("X {call}("))
                    .as_bytes()
            ));
        }
        // `clone3` is not `clone` followed by something: names match whole.
        assert!(!refused_fork(
            REFUSED.replace("X clone(", "X clonex(").as_bytes()
        ));
        for junk in ["", "errno=11", "] X clone( = errno=11 ", "\u{0}\u{ff}"] {
            assert!(!refused_fork(junk.as_bytes()), "{junk:?}");
        }
        assert!(!refused_fork(&[0xff, 0xfe]));
    }

    #[test]
    fn a_refusal_is_seen_across_reads_and_lines_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = ForkLog::create(&path).unwrap();
        // Nobody writes yet: nothing, and no wait.
        assert!(!log.drain());
        let mut writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        use std::io::Write;
        writeln!(writer, "{FORKED}").unwrap();
        assert!(!log.drain());
        // A refusal split over two writes, read in two drains.
        let (head, tail) = REFUSED.split_at(80);
        write!(writer, "{head}").unwrap();
        assert!(!log.drain());
        writeln!(writer, "{tail}").unwrap();
        assert!(log.drain());
        // A line past the bound is dropped whole, and the next is read as usual.
        write!(writer, "{}", "x".repeat(LINE_MAX + 1)).unwrap();
        assert!(!log.drain());
        writeln!(writer, " {REFUSED}").unwrap();
        assert!(!log.drain(), "the rest of an overlong line is not a line");
        writeln!(writer, "{REFUSED}").unwrap();
        assert!(log.drain());
        drop(writer);
        assert!(!log.drain());
    }
}
