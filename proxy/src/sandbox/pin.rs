//! The run's processes named so that a number the kernel hands out again never names
//! someone else's.
//!
//! The kernel reuses a pid namespace's inode number as soon as the namespace is freed (the
//! lowest free number: reused within half a second on the project's machines), and a pid as
//! soon as its process is reaped. A teardown that matched `/proc/*/ns/pid` against the
//! number bubblewrap reported, after that namespace was gone, found the namespace of a run
//! started meanwhile and killed its command (seen in CI: a neighbour's `curl` ended by
//! SIGKILL, exit 137, no limit). So:
//!
//! - the sandbox's namespace is held open ([`PinnedNamespace`]) from the first look to the
//!   end of the teardown: while it is held its number names it alone;
//! - its first process is taken as a pidfd ([`Pidfd`]), and only once it is known to descend
//!   from the runner (every descendant of the runner is the run's);
//! - every other process is signalled through [`signal_if`]: a pidfd first, then the check
//!   that it is the run's, then the signal through the pidfd, so that a pid reused between
//!   the check and the signal is never the one signalled.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use nix::sys::signal::Signal;

/// A pid namespace held open (its inode number cannot be reused while it is).
#[derive(Debug)]
pub struct PinnedNamespace {
    _held: File,
    inode: u64,
}

impl PinnedNamespace {
    /// The pid namespace of process `pid`, if it is the one numbered `inode` and `pid` is
    /// still the process `pidfd` names (so the namespace opened was that process's).
    pub fn of(pidfd: &Pidfd, pid: i32, inode: u64) -> Option<Self> {
        let held = File::open(format!("/proc/{pid}/ns/pid")).ok()?;
        let opened = held.metadata().ok()?.ino();
        (opened == inode && pidfd.alive()).then_some(PinnedNamespace { _held: held, inode })
    }

    /// The namespace's inode number (unique while this is held).
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether process `pid` is in this namespace.
    pub fn holds(&self, pid: i32) -> bool {
        namespace_of(pid) == Some(self.inode)
    }
}

/// The inode of process `pid`'s pid namespace.
fn namespace_of(pid: i32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    link.to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// One process, named by a descriptor rather than by its number.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
}

impl Pidfd {
    /// A pidfd of `pid`, if it is alive and descends from `ancestor` (the runner: whatever
    /// descends from it is the run's).
    pub fn of_descendant(pid: i32, ancestor: i32) -> Option<Pidfd> {
        let pidfd = Pidfd::open(pid)?;
        (descends_from(pid, ancestor) && pidfd.alive()).then_some(pidfd)
    }

    fn open(pid: i32) -> Option<Pidfd> {
        let pid = rustix::process::Pid::from_raw(pid)?;
        rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .ok()
            .map(|fd| Pidfd { fd })
    }

    /// Whether the process has not ended (a pidfd polls readable once it has).
    pub fn alive(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&now)), Ok(0))
    }

    /// Send `signal`; whether it was delivered (not if the process has ended).
    pub fn signal(&self, signal: Signal) -> bool {
        rustix::process::Signal::from_named_raw(signal as i32)
            .is_some_and(|signal| rustix::process::pidfd_send_signal(&self.fd, signal).is_ok())
    }
}

/// Send `signal` to process `pid` if, once a pidfd names it, `ours(pid)` says it is the
/// run's; whether it was sent.
pub fn signal_if(pid: i32, signal: Signal, ours: impl Fn(i32) -> bool) -> bool {
    let Some(pidfd) = Pidfd::open(pid) else {
        return false;
    };
    // Alive after the check: what the check read under `/proc/<pid>` was this process's.
    ours(pid) && pidfd.alive() && pidfd.signal(signal)
}

/// Whether `ancestor` is among `pid`'s parents (a bounded walk: a sandbox is a few
/// processes deep below its runner).
fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut at = pid;
    for _ in 0..16 {
        match parent_of(at) {
            Some(parent) if parent == ancestor => return true,
            Some(parent) if parent > 1 => at = parent,
            _ => return false,
        }
    }
    false
}

fn parent_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    fn own_namespace() -> u64 {
        namespace_of(std::process::id() as i32).unwrap()
    }

    fn sleeper() -> std::process::Child {
        Command::new("sleep").arg("30").spawn().unwrap()
    }

    #[test]
    fn a_namespace_is_pinned_only_under_its_own_number() {
        let me = std::process::id() as i32;
        let pidfd = Pidfd::open(me).unwrap();
        let ns = own_namespace();
        let pinned = PinnedNamespace::of(&pidfd, me, ns).unwrap();
        assert_eq!(pinned.inode(), ns);
        assert!(pinned.holds(me));
        assert!(PinnedNamespace::of(&pidfd, me, ns + 1).is_none());
        assert!(PinnedNamespace::of(&pidfd, i32::MAX, ns).is_none());
    }

    #[test]
    fn only_descendants_of_the_runner_are_taken() {
        let mut child = sleeper();
        let pid = child.id() as i32;
        let me = std::process::id() as i32;
        assert!(Pidfd::of_descendant(pid, me).is_some());
        // Not below the given ancestor: the child's parent is this process, not its child.
        assert!(Pidfd::of_descendant(me, pid).is_none());
        assert!(Pidfd::of_descendant(i32::MAX, me).is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_process_is_signalled_only_when_the_check_says_it_is_ours() {
        let mut child = sleeper();
        let pid = child.id() as i32;
        assert!(!signal_if(pid, Signal::SIGKILL, |_| false));
        assert!(
            child.try_wait().unwrap().is_none(),
            "signalled against the check"
        );
        assert!(signal_if(pid, Signal::SIGKILL, |p| p == pid));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    }

    #[test]
    fn an_ended_process_s_pidfd_is_not_alive_and_takes_no_signal() {
        let mut child = sleeper();
        let pidfd = Pidfd::open(child.id() as i32).unwrap();
        assert!(pidfd.alive());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!pidfd.alive());
        assert!(!pidfd.signal(Signal::SIGKILL));
    }

    /// The pid namespace of a short-lived `unshare` child, as the number it printed.
    fn new_namespace(hold_for: &str) -> (std::process::Child, u64) {
        let mut child = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--kill-child",
                "sh",
                "-c",
            ])
            .arg(format!("readlink /proc/self/ns/pid; exec sleep {hold_for}"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) runs");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let inode = line
            .trim()
            .strip_prefix("pid:[")
            .and_then(|l| l.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unshare printed {line:?}"));
        (child, inode)
    }

    /// The process inside the namespace `unshare --fork` made (its only child).
    fn inside(unshare: &std::process::Child) -> i32 {
        let pid = unshare.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        children.split_whitespace().next().unwrap().parse().unwrap()
    }

    #[test]
    fn a_pinned_namespace_s_number_is_not_handed_out_again() {
        let (mut first, inode) = new_namespace("30");
        let me = std::process::id() as i32;
        let init = inside(&first);
        let pidfd = Pidfd::of_descendant(init, me).expect("the namespace's first process");
        let pinned = PinnedNamespace::of(&pidfd, init, inode).unwrap();
        assert!(pinned.holds(init));
        // The namespace's first process ends and unshare, its parent, reaps it and exits:
        // nothing but what this test holds keeps the namespace.
        assert!(pidfd.signal(Signal::SIGKILL));
        first.wait().unwrap();
        assert!(!pidfd.alive());
        std::thread::sleep(Duration::from_millis(300));
        // Were it not held, its number (the lowest free one) would be handed out again at
        // once (the module's docs): the test fails without the hold.
        for _ in 0..4 {
            let (mut next, number) = new_namespace("30");
            let held_by_pin = pinned.holds(inside(&next));
            next.kill().unwrap();
            next.wait().unwrap();
            assert_ne!(
                number, inode,
                "a held namespace's number was handed out again"
            );
            assert!(!held_by_pin);
        }
    }
}
