//! The identity a sandboxed command runs as.
//!
//! When `ostiary run` runs as root, each run takes a host uid (and the same-numbered gid)
//! of its own from `[sandbox] uid_range`, that no process uses: nothing the host's users own
//! is the agent's, per-uid limits (`RLIMIT_NPROC`) count only the run's processes, and
//! after the run "no process of that uid remains" is something to check. Otherwise the
//! command keeps the operator's uid, mapped inside a user namespace of its own (bubblewrap's
//! `--unshare-user`): it cannot reach what the operator's uid can outside the view, but the
//! kernel sees the operator's uid for whatever the view does let through.

use std::path::Path;

use rand::Rng;

use super::SandboxError;

/// Who the command runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// The sandbox needs a user namespace (the outer process is not root): the command
    /// keeps the outer uid, mapped.
    pub user_ns: bool,
}

/// How many uids are tried before giving up on finding an unused one.
const ATTEMPTS: usize = 64;

/// The identity of a new run (see the module doc).
pub fn choose(range: [u32; 2]) -> Result<Identity, SandboxError> {
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 {
        return Ok(Identity {
            uid: euid,
            gid: nix::unistd::getegid().as_raw(),
            user_ns: true,
        });
    }
    let [low, high] = range;
    let mut rng = rand::rng();
    for _ in 0..ATTEMPTS {
        let id = rng.random_range(low..=high);
        if processes_of(id).is_empty() {
            return Ok(Identity {
                uid: id,
                gid: id,
                user_ns: false,
            });
        }
    }
    Err(SandboxError::Unavailable(format!(
        "no unused uid found in sandbox.uid_range [{low}, {high}] after {ATTEMPTS} tries"
    )))
}

/// The pids of processes any of whose uids or gids is `id` (real, effective, saved,
/// filesystem).
pub fn processes_of(id: u32) -> Vec<i32> {
    processes_matching(Path::new("/proc"), |status| has_id(status, id))
}

/// Whether process `pid` has `id` among its uids or gids (as [`processes_of`] finds them).
pub fn is_process_of(pid: i32, id: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| has_id(&status, id))
}

fn has_id(status: &str, id: u32) -> bool {
    let id = id.to_string();
    ["Uid:", "Gid:"].iter().any(|field| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .is_some_and(|ids| ids.split_whitespace().any(|n| n == id))
    })
}

/// The pids whose `/proc/<pid>/status` satisfies `test` (processes that end meanwhile are
/// skipped).
pub(super) fn processes_matching(proc: &Path, test: impl Fn(&str) -> bool) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(proc.join(pid.to_string()).join("status"))
                .is_ok_and(|status| test(&status))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_run_gets_an_unused_uid_of_the_range() {
        let id = choose([1_500_000_000, 1_500_000_100]).unwrap();
        if nix::unistd::geteuid().is_root() {
            assert!((1_500_000_000..=1_500_000_100).contains(&id.uid));
            assert_eq!(id.uid, id.gid);
            assert!(!id.user_ns);
        } else {
            assert!(id.user_ns);
        }
    }

    #[test]
    fn processes_of_a_uid_are_found() {
        let me = nix::unistd::getuid().as_raw();
        assert!(processes_of(me).contains(&(std::process::id() as i32)));
        assert!(processes_of(1_999_999_998).is_empty());
    }
}
