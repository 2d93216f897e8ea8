//! Resource control of a run: which mechanism enforces the profile's limits, how a hit is
//! noticed, and what is killed.
//!
//! `auto` takes cgroup v2 where it is delegated, else cgroup v1 where its `memory`, `pids`
//! and `cpuacct` hierarchies are writable, else rlimits only; `[sandbox] cgroups` may name
//! one, and a named one that is not available is an error, never a fallback.
//!
//! | limit | cgroup (v2 / v1) | rlimits only |
//! |---|---|---|
//! | memory | `memory.max` / `memory.limit_in_bytes` (+ swap): the OOM killer, then exit 150 | `RLIMIT_AS` per process of the command (set by the exec stage): allocations fail, the command's own exit |
//! | processes | `pids.max` (the sandbox's own two tasks added): a refused fork, then 151 | `RLIMIT_NPROC` (per uid, per user namespace) and a count of the sandbox's tasks: 151 |
//! | CPU time | the cgroup's usage: 152 | `RLIMIT_CPU` per process: `SIGXCPU`, the command's own exit (128 + 24 = 152 from a shell) |
//! | open files | `RLIMIT_NOFILE` per process in every mode: calls fail with `EMFILE`, the run goes on |
//!
//! rlimits are set in every mode as a backstop (`RLIMIT_AS` only where no cgroup limits
//! memory: it counts address space, not memory, and runtimes that reserve a lot of it
//! would not start). `RLIMIT_AS` is the exec stage's, set on the command just before it
//! starts, not the enter stage's: the stages before it are this binary, whose allocator
//! reserves address space by the gigabyte, and what it limits is the command's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::sandbox::CgroupMode;
use crate::config::Profile;

use super::cgroup::{self, CgroupLimits, RunCgroup};
use super::exec::CommandLimits;
use super::pin::{signal_if, Pidfd, PinnedNamespace};
use super::Limit;

/// Why the limits of a run could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// `[sandbox] cgroups` names a mechanism this host does not offer.
    #[error("[sandbox] cgroups = \"{mode}\", but {reason}")]
    Forced { mode: &'static str, reason: String },
}

/// The mechanism that enforced a run's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    CgroupV2,
    CgroupV1,
    Rlimits,
}

impl Mechanism {
    /// The name in the run's report (`limits_by`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::CgroupV2 => "cgroup-v2",
            Mechanism::CgroupV1 => "cgroup-v1",
            Mechanism::Rlimits => "rlimits",
        }
    }
}

/// A profile's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory: u64,
    pub processes: u32,
    pub open_files: u32,
    pub cpu_time: Duration,
}

impl Limits {
    pub fn of(profile: &Profile) -> Self {
        Self {
            memory: profile.memory,
            processes: profile.processes,
            open_files: profile.open_files,
            cpu_time: profile.cpu_time,
        }
    }
}

/// Tasks of the sandbox's own in its cgroup: the runner's monitor (bwrap) and the init
/// stage (single-threaded).
pub const SANDBOX_TASKS: u64 = 2;

/// How far the command's `RLIMIT_NPROC` sits above the cgroup's `pids.max` when a cgroup
/// counts: the two count the same tasks but let go of them at different moments of a
/// reap, so at the same number the rlimit could refuse a fork first — a refusal no cgroup
/// counter sees (seen in CI: the classic shell bomb ended with its shell's own exit 2, not
/// 151). Above it, the cgroup is always what refuses.
pub const NPROC_SLACK: u64 = 16;

/// Seconds the per-process `RLIMIT_CPU` lets a process run past the run's CPU limit where a
/// cgroup counts the run's CPU time: the cgroup ends the run first, the rlimit is a backstop.
const CPU_RLIMIT_SLACK: u64 = 5;

/// A resource limit the enter stage sets (soft = hard unless said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub resource: RlimitName,
    pub soft: u64,
    pub hard: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlimitName {
    Nofile,
    Cpu,
}

impl RlimitName {
    fn as_str(self) -> &'static str {
        match self {
            RlimitName::Nofile => "nofile",
            RlimitName::Cpu => "cpu",
        }
    }

    pub fn resource(self) -> nix::sys::resource::Resource {
        use nix::sys::resource::Resource;
        match self {
            RlimitName::Nofile => Resource::RLIMIT_NOFILE,
            RlimitName::Cpu => Resource::RLIMIT_CPU,
        }
    }
}

impl std::fmt::Display for Rlimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}:{}", self.resource.as_str(), self.soft, self.hard)
    }
}

impl std::str::FromStr for Rlimit {
    type Err = String;

    /// `nofile=1024:1024`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not NAME=SOFT:HARD (nofile, cpu)");
        let (name, values) = text.split_once('=').ok_or_else(bad)?;
        let (soft, hard) = values.split_once(':').ok_or_else(bad)?;
        let resource = match name {
            "nofile" => RlimitName::Nofile,
            "cpu" => RlimitName::Cpu,
            _ => return Err(bad()),
        };
        Ok(Rlimit {
            resource,
            soft: soft.parse().map_err(|_| bad())?,
            hard: hard.parse().map_err(|_| bad())?,
        })
    }
}

/// A run's resource control, from its start to its teardown.
#[derive(Debug)]
pub struct Control {
    pub mechanism: Mechanism,
    pub limits: Limits,
    cgroup: Option<RunCgroup>,
}

/// Where the outer process finds a run's processes, each named so that a reused number
/// never names another's (see [`super::pin`]).
#[derive(Debug, Default)]
pub struct Tracked {
    /// The sandbox's first process, once a status names it and it is known to descend from
    /// the runner.
    pub init: Option<Pidfd>,
    /// The sandbox's pid namespace, held open from the first look to the teardown's end.
    pub namespace: Option<PinnedNamespace>,
    /// The run's own uid, when it has one (a root run).
    pub uid: Option<u32>,
}

impl Tracked {
    /// Take what a runner's status names, the first time it names it: its first process,
    /// when it descends from the runner (`runner`), and that process's namespace, when it
    /// is the one the status numbers. Never again later: by then the numbers may have been
    /// handed out again.
    pub fn follow(&mut self, status: &super::RunnerStatus, runner: i32) {
        let Some(init) = status.init_pid else {
            return;
        };
        if self.init.is_none() {
            self.init = Pidfd::of_descendant(init, runner);
        }
        if let (None, Some(pidfd), Some(inode)) =
            (&self.namespace, &self.init, status.pid_namespace)
        {
            self.namespace = PinnedNamespace::of(pidfd, init, inode);
        }
    }
}

impl Control {
    /// Put the limits in place for run `name` (see the module doc for the choice).
    /// `tasks` is the cgroup's task limit ([`super::Runner::cgroup_tasks`]: the command's
    /// processes and the sandbox's own).
    pub fn create(
        mode: CgroupMode,
        limits: Limits,
        name: &str,
        tasks: u64,
    ) -> Result<Self, LimitsError> {
        let wanted = CgroupLimits {
            memory: limits.memory,
            pids: tasks,
        };
        let with = |mechanism, cgroup| Control {
            mechanism,
            limits,
            cgroup,
        };
        match mode {
            CgroupMode::Rlimits => Ok(with(Mechanism::Rlimits, None)),
            CgroupMode::V2 => cgroup::create_v2(name, wanted)
                .map(|c| with(Mechanism::CgroupV2, Some(c)))
                .map_err(|reason| LimitsError::Forced { mode: "v2", reason }),
            CgroupMode::V1 => cgroup::create_v1(name, wanted)
                .map(|c| with(Mechanism::CgroupV1, Some(c)))
                .map_err(|reason| LimitsError::Forced { mode: "v1", reason }),
            CgroupMode::Auto => match cgroup::create_v2(name, wanted) {
                Ok(c) => Ok(with(Mechanism::CgroupV2, Some(c))),
                Err(v2) => match cgroup::create_v1(name, wanted) {
                    Ok(c) => Ok(with(Mechanism::CgroupV1, Some(c))),
                    Err(v1) => {
                        tracing::debug!(v2, v1, "no writable cgroup: limits by rlimits only");
                        Ok(with(Mechanism::Rlimits, None))
                    }
                },
            },
        }
    }

    /// The cgroup directories the enter stage joins.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        self.cgroup
            .as_ref()
            .map(|c| c.dirs.clone())
            .unwrap_or_default()
    }

    /// The rlimits the enter stage sets for the whole sandbox (`RLIMIT_AS` is the command's
    /// alone: [`Control::address_space`]).
    pub fn rlimits(&self) -> Vec<Rlimit> {
        let cpu = self.limits.cpu_time.as_secs().max(1);
        let cpu = match self.cgroup {
            Some(_) => cpu + CPU_RLIMIT_SLACK,
            None => cpu,
        };
        vec![
            Rlimit {
                resource: RlimitName::Nofile,
                soft: u64::from(self.limits.open_files),
                hard: u64::from(self.limits.open_files),
            },
            // SIGXCPU at the soft limit; SIGKILL at the hard one for a process that
            // catches it.
            Rlimit {
                resource: RlimitName::Cpu,
                soft: cpu,
                hard: cpu + CPU_RLIMIT_SLACK,
            },
        ]
    }

    /// `RLIMIT_AS` for the command, where no cgroup limits memory.
    pub fn address_space(&self) -> Option<u64> {
        self.cgroup.is_none().then_some(self.limits.memory)
    }

    /// What the exec stage sets on the command itself (see [`Control::nproc`]).
    pub fn command_limits(&self, user_ns: bool, own_kernel: bool) -> CommandLimits {
        CommandLimits {
            nproc: self.nproc(user_ns, own_kernel),
            address_space: self.address_space(),
        }
    }

    /// `RLIMIT_NPROC` for the command. It counts the tasks of the command's uid in its user
    /// namespace: with a cgroup it is a backstop above `pids.max`, so that the cgroup (whose
    /// refusals are counted) is what stops a fork bomb; without one it is the limit, and
    /// the init stage counts too when it shares the uid (a user-namespace run). A sandbox
    /// with a kernel of its own (`own_kernel`, see [`super::Runner::rlimits_inside`]) counts
    /// the command's tasks alone under that uid (the init stage is root there) and sees
    /// its refusals: the limit exactly, so that a fork it refuses is the processes limit.
    pub fn nproc(&self, user_ns: bool, own_kernel: bool) -> u64 {
        let processes = u64::from(self.limits.processes);
        if own_kernel {
            return processes;
        }
        match (&self.cgroup, user_ns) {
            (Some(_), _) => processes + SANDBOX_TASKS + NPROC_SLACK,
            (None, true) => processes + 1,
            (None, false) => processes,
        }
    }

    /// The limit the run has hit, if any.
    pub fn hit(&self, tracked: &Tracked) -> Option<Limit> {
        match &self.cgroup {
            Some(cgroup) => {
                let events = cgroup.events();
                if events.oom_kills > 0 {
                    Some(Limit::Memory)
                } else if events.pids_max > 0 {
                    Some(Limit::Processes)
                } else if events.cpu >= self.limits.cpu_time {
                    Some(Limit::CpuTime)
                } else {
                    None
                }
            }
            None => {
                let ns = tracked.namespace.as_ref()?.inode();
                // The init stage is one task of the namespace and not the command's.
                let tasks = tasks_in_namespace(Path::new("/proc"), ns).saturating_sub(1);
                (tasks >= u64::from(self.limits.processes)).then_some(Limit::Processes)
            }
        }
    }

    /// SIGKILL to every process of the run that the cgroup holds or the kernel says is in
    /// its pid namespace or has its uid, each checked again once a pidfd names it.
    pub fn kill_all(&self, tracked: &Tracked) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
        for pid in remaining(tracked) {
            signal_if(pid, nix::sys::signal::Signal::SIGKILL, |pid| {
                is_the_runs(tracked, pid)
            });
        }
    }

    /// The run's processes still alive.
    pub fn remaining(&self, tracked: &Tracked) -> Vec<i32> {
        let mut pids = remaining(tracked);
        if let Some(cgroup) = &self.cgroup {
            pids.extend(cgroup.procs());
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Whether the run has a cgroup (to remove at teardown).
    pub fn has_cgroup(&self) -> bool {
        self.cgroup.is_some()
    }

    /// Remove the run's cgroup.
    pub fn remove(&self) -> Result<(), String> {
        match &self.cgroup {
            Some(cgroup) => cgroup.remove(),
            None => Ok(()),
        }
    }
}

/// Processes in the run's pid namespace or with its uid (zombies are dead: what is left
/// of them is a pid for their parent to reap).
fn remaining(tracked: &Tracked) -> Vec<i32> {
    let mut pids = Vec::new();
    if let Some(ns) = &tracked.namespace {
        pids.extend(pids_in_namespace(Path::new("/proc"), ns.inode()));
    }
    if let Some(uid) = tracked.uid {
        pids.extend(super::uid::processes_of(uid));
    }
    pids.retain(|pid| !is_zombie(*pid));
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Whether process `pid` is in the run's (held) namespace or has its uid.
fn is_the_runs(tracked: &Tracked, pid: i32) -> bool {
    tracked.namespace.as_ref().is_some_and(|ns| ns.holds(pid))
        || tracked
            .uid
            .is_some_and(|uid| super::uid::is_process_of(pid, uid))
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) S ...`: the state follows the last `)` (comm may hold any byte).
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// The processes whose pid namespace is the one with inode `ns`.
fn pids_in_namespace(proc: &Path, ns: u64) -> Vec<i32> {
    let want = format!("pid:[{ns}]");
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_link(proc.join(pid.to_string()).join("ns/pid"))
                .is_ok_and(|link| link.as_os_str() == want.as_str())
        })
        .collect()
}

/// The tasks (threads included) of the processes in pid namespace `ns`.
fn tasks_in_namespace(proc: &Path, ns: u64) -> u64 {
    pids_in_namespace(proc, ns)
        .into_iter()
        .map(|pid| {
            std::fs::read_dir(proc.join(pid.to_string()).join("task"))
                .map(|t| t.count() as u64)
                .unwrap_or(0)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(cgroup: bool) -> Control {
        Control {
            mechanism: Mechanism::Rlimits,
            limits: Limits::of(&Profile::default()),
            cgroup: cgroup.then(RunCgroup::for_tests),
        }
    }

    #[test]
    fn rlimits_round_trip_and_bad_ones_are_refused() {
        for r in control(false).rlimits() {
            assert_eq!(r.to_string().parse::<Rlimit>().unwrap(), r);
        }
        for bad in ["nofile", "nofile=1", "stack=1:1", "cpu=a:1"] {
            assert!(bad.parse::<Rlimit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn address_space_is_limited_only_without_a_memory_cgroup_and_only_on_the_command() {
        let memory = Limits::of(&Profile::default()).memory;
        assert_eq!(control(false).address_space(), Some(memory));
        assert_eq!(control(true).address_space(), None);
        let limits = control(false).command_limits(true, false);
        assert_eq!((limits.nproc, limits.address_space), (513, Some(memory)));
        // Never on the stages before the exec: they are this binary.
        for c in [control(false), control(true)] {
            assert!(
                c.rlimits()
                    .iter()
                    .all(|r| r.to_string().starts_with("nofile=")
                        || r.to_string().starts_with("cpu="))
            );
        }
        assert!("as=1:1".parse::<Rlimit>().is_err());
        // The cgroup counts CPU time first; the per-process rlimit is a backstop past it.
        let cpu = |c: &Control| {
            c.rlimits()
                .into_iter()
                .find(|r| r.resource == RlimitName::Cpu)
                .unwrap()
                .soft
        };
        assert_eq!(cpu(&control(false)), 3600);
        assert!(cpu(&control(true)) > 3600);
        assert_eq!(control(false).nproc(false, false), 512);
        assert_eq!(control(false).nproc(true, false), 513);
        assert_eq!(
            control(true).nproc(false, false),
            512 + SANDBOX_TASKS + NPROC_SLACK
        );
        assert_eq!(control(true).nproc(true, true), 512);
    }

    #[test]
    fn this_process_is_found_in_its_pid_namespace() {
        let link = std::fs::read_link("/proc/self/ns/pid").unwrap();
        let ns: u64 = link
            .to_str()
            .unwrap()
            .trim_start_matches("pid:[")
            .trim_end_matches(']')
            .parse()
            .unwrap();
        assert!(pids_in_namespace(Path::new("/proc"), ns).contains(&(std::process::id() as i32)));
        assert!(tasks_in_namespace(Path::new("/proc"), ns) >= 1);
        assert!(pids_in_namespace(Path::new("/proc"), 1).is_empty());
    }
}
