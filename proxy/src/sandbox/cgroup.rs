//! A cgroup per run, v2 or v1: made under the cgroup `ostiary run` is in, limits written,
//! events read, every process killed, removed.
//!
//! v2 is used where the cgroup is delegated: its `cgroup.controllers` offers `memory`,
//! `pids` and `cpu`, and its `cgroup.subtree_control` enables them for children (or can be
//! made to: when `ostiary run` is the only process in it — `systemd-run --user --scope -p
//! Delegate=yes` — it moves itself into a child first, since a v2 cgroup with processes
//! cannot enable controllers for its children). v1 is used where the `memory`, `pids` and
//! `cpuacct` hierarchies are mounted and writable.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The cgroup version of a run's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The limits written into a run's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory: u64,
    /// Tasks (processes and threads) of the whole sandbox, its plumbing included.
    pub pids: u64,
}

/// What the kernel counted in a run's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Events {
    /// Processes the OOM killer killed for the memory limit.
    pub oom_kills: u64,
    /// Forks refused for the pids limit.
    pub pids_max: u64,
    /// CPU time used.
    pub cpu: Duration,
}

/// One run's cgroup (one directory per v1 hierarchy).
#[derive(Debug)]
pub struct RunCgroup {
    pub version: Version,
    /// Every directory made for the run.
    pub dirs: Vec<PathBuf>,
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
}

/// The prefix of the cgroups `ostiary run` makes: `ostiary-run-<pid>-<id>`.
pub const PREFIX: &str = "ostiary-run-";

/// A cgroup mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The path of the hierarchy the mount shows at its mount point.
    pub root: String,
    pub mount_point: PathBuf,
    pub v2: bool,
    /// The super options (for v1, the controllers).
    pub options: Vec<String>,
}

/// The cgroup mounts of `mountinfo` text.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let mut after = after.split(' ');
            let fstype = after.next()?;
            let _source = after.next()?;
            let options = after.next().unwrap_or_default();
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                root: unescape(fields.get(3)?),
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                v2: fstype == "cgroup2",
                options: options.split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `/proc/self/cgroup` lines as (controllers, path); v2's line has no controllers.
pub fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controllers = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((controllers, path.to_owned()))
        })
        .collect()
}

/// The directory of the cgroup this process is in, in `mount`'s hierarchy.
fn own_dir(mount: &CgroupMount, path: &str) -> PathBuf {
    let rel = path
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(path);
    mount.mount_point.join(rel.trim_start_matches('/'))
}

fn read_self(name: &str) -> Result<String, String> {
    std::fs::read_to_string(name).map_err(|e| format!("reading {name}: {e}"))
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    let path = dir.join(file);
    std::fs::write(&path, value)
        .map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

fn mkdir(parent: &Path, name: &str) -> Result<PathBuf, String> {
    remove_stale(parent);
    let dir = parent.join(name);
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Removes the cgroups of runs whose `ostiary run` is gone (killed before its teardown):
/// only empty ones can be removed, and only those of dead processes are tried, so a
/// concurrent run's new cgroup is never touched.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// A v1 cgroup for run `name` in the `memory`, `pids` and `cpuacct` hierarchies.
pub fn create_v1(name: &str, limits: CgroupLimits) -> Result<RunCgroup, String> {
    let mounts = parse_mountinfo(&read_self("/proc/self/mountinfo")?);
    let own = parse_proc_cgroup(&read_self("/proc/self/cgroup")?);
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut dir_of = |controller: &str| -> Result<PathBuf, String> {
        let mount = mounts
            .iter()
            .find(|m| !m.v2 && m.options.iter().any(|o| o == controller))
            .ok_or_else(|| format!("no cgroup v1 {controller} hierarchy is mounted"))?;
        let (_, path) = own
            .iter()
            .find(|(c, _)| c.iter().any(|c| c == controller))
            .ok_or_else(|| format!("this process is in no cgroup v1 {controller} hierarchy"))?;
        let parent = own_dir(mount, path);
        // Co-mounted controllers (`cpu,cpuacct`) share one directory.
        let dir = parent.join(name);
        if !dirs.contains(&dir) {
            mkdir(&parent, name).map_err(|e| {
                format!("the cgroup v1 {controller} hierarchy is not writable: {e}")
            })?;
            dirs.push(dir.clone());
        }
        Ok(dir)
    };
    let made = (|| Ok::<_, String>((dir_of("memory")?, dir_of("pids")?, dir_of("cpuacct")?)))();
    let cgroup = |memory, pids, cpu, dirs| RunCgroup {
        version: Version::V1,
        dirs,
        memory,
        pids,
        cpu,
    };
    let (memory, pids, cpu) = match made {
        Ok(made) => made,
        Err(e) => {
            // Whatever was made before the failure goes again.
            let partial = cgroup(PathBuf::new(), PathBuf::new(), PathBuf::new(), dirs);
            let _ = partial.remove();
            return Err(e);
        }
    };
    let run = cgroup(memory, pids, cpu, dirs);
    let limited = (|| {
        write(
            &run.memory,
            "memory.limit_in_bytes",
            &limits.memory.to_string(),
        )?;
        // With swap accounting, memory + swap too: the limit is not moved to swap.
        if run.memory.join("memory.memsw.limit_in_bytes").exists() {
            write(
                &run.memory,
                "memory.memsw.limit_in_bytes",
                &limits.memory.to_string(),
            )?;
        }
        write(&run.pids, "pids.max", &limits.pids.to_string())
    })();
    if let Err(e) = limited {
        let _ = run.remove();
        return Err(e);
    }
    Ok(run)
}

/// The controllers a v2 run cgroup needs.
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// A v2 cgroup for run `name` under the delegated cgroup this process is in.
pub fn create_v2(name: &str, limits: CgroupLimits) -> Result<RunCgroup, String> {
    let mounts = parse_mountinfo(&read_self("/proc/self/mountinfo")?);
    let mount = mounts
        .iter()
        .find(|m| m.v2)
        .ok_or("no cgroup v2 hierarchy is mounted")?;
    let own = parse_proc_cgroup(&read_self("/proc/self/cgroup")?);
    let (_, path) = own
        .iter()
        .find(|(c, _)| c.is_empty())
        .ok_or("this process is in no cgroup v2 cgroup")?;
    let parent = own_dir(mount, path);
    let offered = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    let missing: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| !offered.split_whitespace().any(|o| o == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the cgroup v2 cgroup {} does not offer the {} controller(s) (cgroup.controllers: {:?})",
            parent.display(),
            missing.join(", "),
            offered.trim()
        ));
    }
    enable_for_children(&parent)?;
    let dir = mkdir(&parent, name)?;
    let run = RunCgroup {
        version: Version::V2,
        dirs: vec![dir.clone()],
        memory: dir.clone(),
        pids: dir.clone(),
        cpu: dir,
    };
    let limited = (|| {
        write(&run.memory, "memory.max", &limits.memory.to_string())?;
        if run.memory.join("memory.swap.max").exists() {
            write(&run.memory, "memory.swap.max", "0")?;
        }
        // An OOM kill takes the whole sandbox, which the run ends anyway.
        if run.memory.join("memory.oom.group").exists() {
            write(&run.memory, "memory.oom.group", "1")?;
        }
        write(&run.pids, "pids.max", &limits.pids.to_string())
    })();
    if let Err(e) = limited {
        let _ = run.remove();
        return Err(e);
    }
    Ok(run)
}

/// Makes `parent`'s children get the memory, pids and cpu controllers.
fn enable_for_children(parent: &Path) -> Result<(), String> {
    let enabled =
        std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    if V2_CONTROLLERS
        .iter()
        .all(|c| enabled.split_whitespace().any(|e| e == *c))
    {
        return Ok(());
    }
    // Only a cgroup without processes may enable controllers for its children: when this
    // process is the only one in it, it moves into a child of its own first.
    let procs = read_pids(&parent.join("cgroup.procs"));
    let me = std::process::id() as i32;
    if procs != [me] {
        return Err(format!(
            "the cgroup v2 cgroup {} does not enable memory, pids and cpu for its children (cgroup.subtree_control: {:?}) and holds other processes; run ostiary in a delegated cgroup of its own (e.g. systemd-run --user --scope -p Delegate=yes ostiary run ...)",
            parent.display(),
            enabled.trim()
        ));
    }
    let supervisor = parent.join(format!("ostiary-supervisor-{me}"));
    if !supervisor.exists() {
        std::fs::create_dir(&supervisor)
            .map_err(|e| format!("creating {}: {e}", supervisor.display()))?;
    }
    write(&supervisor, "cgroup.procs", &me.to_string())?;
    write(parent, "cgroup.subtree_control", "+memory +pids +cpu")
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The number after `key` in a `key value` per line file.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl RunCgroup {
    /// What the kernel counted so far (a file that cannot be read counts nothing).
    pub fn events(&self) -> Events {
        let read =
            |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        match self.version {
            Version::V1 => Events {
                oom_kills: field(&read(&self.memory, "memory.oom_control"), "oom_kill")
                    .unwrap_or(0),
                pids_max: field(&read(&self.pids, "pids.events"), "max").unwrap_or(0),
                cpu: Duration::from_nanos(
                    read(&self.cpu, "cpuacct.usage").trim().parse().unwrap_or(0),
                ),
            },
            Version::V2 => Events {
                oom_kills: field(&read(&self.memory, "memory.events"), "oom_kill").unwrap_or(0),
                pids_max: field(&read(&self.pids, "pids.events"), "max").unwrap_or(0),
                cpu: Duration::from_micros(
                    field(&read(&self.cpu, "cpu.stat"), "usage_usec").unwrap_or(0),
                ),
            },
        }
    }

    /// The processes still in the cgroup (in any of its directories).
    pub fn procs(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs
            .iter()
            .flat_map(|d| read_pids(&d.join("cgroup.procs")))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// SIGKILL to every process in the cgroup (v2's `cgroup.kill` where the kernel has it,
    /// which also catches processes forking meanwhile), each checked again once a pidfd
    /// names it (a pid read from `cgroup.procs` may be reused before the signal).
    pub fn kill_all(&self) {
        if self.version == Version::V2 && self.pids.join("cgroup.kill").exists() {
            let _ = write(&self.pids, "cgroup.kill", "1");
        }
        for pid in self.procs() {
            super::pin::signal_if(pid, nix::sys::signal::Signal::SIGKILL, |pid| {
                self.holds(pid)
            });
        }
    }

    /// Whether process `pid` is in this cgroup: a line of `/proc/<pid>/cgroup` whose path
    /// ends in one of the run's directories (its name is the run's own, in every hierarchy).
    fn holds(&self, pid: i32) -> bool {
        let Ok(listed) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        let names: Vec<&std::ffi::OsStr> = self.dirs.iter().filter_map(|d| d.file_name()).collect();
        listed.lines().any(|line| {
            line.splitn(3, ':')
                .nth(2)
                .and_then(|path| Path::new(path).file_name())
                .is_some_and(|name| names.contains(&name))
        })
    }

    /// A cgroup that is no directory, for the tests of what depends on having one.
    #[cfg(test)]
    pub(super) fn for_tests() -> Self {
        RunCgroup {
            version: Version::V1,
            dirs: Vec::new(),
            memory: PathBuf::new(),
            pids: PathBuf::new(),
            cpu: PathBuf::new(),
        }
    }

    /// Remove every directory of the cgroup (they must be empty of processes).
    pub fn remove(&self) -> Result<(), String> {
        let mut failed = Vec::new();
        for dir in &self.dirs {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => failed.push(format!("removing {}: {e}", dir.display())),
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/x /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/my\\040pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn mountinfo_and_proc_cgroup_are_read() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 4);
        assert_eq!(
            mounts[0].mount_point,
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert!(mounts[0].options.contains(&"cpuacct".to_owned()));
        assert_eq!(mounts[1].root, "/docker/x");
        assert_eq!(mounts[2].mount_point, Path::new("/sys/fs/cgroup/my pids"));
        assert!(mounts[3].v2);
        let own = parse_proc_cgroup("4:memory:/docker/x/y\n2:cpu,cpuacct:/\n0::/user.slice\n");
        assert_eq!(
            own[0],
            (vec!["memory".to_owned()], "/docker/x/y".to_owned())
        );
        assert_eq!(own[1].0, ["cpu", "cpuacct"]);
        assert_eq!(own[2], (vec![], "/user.slice".to_owned()));
        // A mount showing /docker/x: the process's /docker/x/y is y under it.
        assert_eq!(
            own_dir(&mounts[1], "/docker/x/y"),
            Path::new("/sys/fs/cgroup/memory/y")
        );
        assert_eq!(
            own_dir(&mounts[3], "/"),
            Path::new("/sys/fs/cgroup/unified")
        );
    }

    #[test]
    fn event_fields() {
        assert_eq!(
            field("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(field("max 12\n", "max"), Some(12));
        assert_eq!(field("usage_usec 5\nuser_usec 4\n", "usage_usec"), Some(5));
        assert_eq!(field("", "max"), None);
    }
}
