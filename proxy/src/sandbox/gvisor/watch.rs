//! The gvisor runner's watch: a thread that counts the command's tasks inside the Sentry
//! and the host CPU time of the run's processes, neither of which the host's mechanisms
//! see (docs/sandbox.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::forks::ForkLog;
use super::Layout;
use crate::sandbox::Limit;

/// How often the command's tasks and the run's host CPU time are looked at.
const POLL: Duration = Duration::from_millis(200);

/// What the watch looks at.
#[derive(Debug)]
pub(super) struct WatchSpec {
    pub(super) runsc: PathBuf,
    pub(super) layout: Layout,
    /// The command's uid inside.
    pub(super) uid: u32,
    /// Tasks the command may have at once.
    pub(super) processes: u64,
    pub(super) cpu_time: Duration,
    /// The forks the Sentry refused: read at every [`STOP_CHECK`], so that a bomb at the
    /// limit is seen however briefly it stays there.
    pub(super) forks: ForkLog,
}

/// A thread that counts the command's tasks inside (`runsc debug --ps`: its processes and
/// their threads, as `RLIMIT_NPROC` counts them) and the host CPU time of the run's
/// processes, and remembers the first limit they reach.
#[derive(Debug)]
pub(super) struct Watch {
    stop: Arc<AtomicBool>,
    hit: Arc<Mutex<Option<Limit>>>,
    /// The thread, joined by [`Watch::stop`]: a `runsc debug` it started must not outlive
    /// the run.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How often the watch thread looks whether it is to stop, between two looks at the run.
const STOP_CHECK: Duration = Duration::from_millis(20);

impl Watch {
    pub(super) fn start(mut spec: WatchSpec) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let hit = Arc::new(Mutex::new(None));
        let (stop2, hit2) = (stop.clone(), hit.clone());
        let thread = std::thread::spawn(move || {
            let mut cpu_seen = Duration::ZERO;
            let found = |limit| {
                hit2.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(limit);
            };
            while !stop2.load(Ordering::Relaxed) {
                if let Some(limit) = observe(&spec, &mut cpu_seen) {
                    found(limit);
                }
                let mut slept = Duration::ZERO;
                while slept < POLL && !stop2.load(Ordering::Relaxed) {
                    if spec.forks.drain() {
                        found(Limit::Processes);
                    }
                    std::thread::sleep(STOP_CHECK);
                    slept += STOP_CHECK;
                }
            }
        });
        Self {
            stop,
            hit,
            thread: Mutex::new(Some(thread)),
        }
    }

    pub(super) fn hit(&self) -> Option<Limit> {
        *self.hit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stop the thread and wait for it (and the `runsc debug` it may be running) to end.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// One look: the limit the run is at, if any. `cpu_seen` keeps the most CPU time seen (the
/// processes that used it may be gone at the next look).
fn observe(spec: &WatchSpec, cpu_seen: &mut Duration) -> Option<Limit> {
    let ps = std::process::Command::new(&spec.runsc)
        .arg(spec.layout.root_flag())
        .args(["debug", "--ps", &spec.layout.id])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    if let Ok(out) = ps {
        if out.status.success()
            && tasks_of_uid(&String::from_utf8_lossy(&out.stdout), spec.uid) >= spec.processes
        {
            return Some(Limit::Processes);
        }
    }
    let pids = processes_named(Path::new("/proc"), &spec.layout.root_flag());
    *cpu_seen = (*cpu_seen).max(cpu_of(Path::new("/proc"), &pids));
    (*cpu_seen >= spec.cpu_time).then_some(Limit::CpuTime)
}

/// The tasks (threads of its processes) of `uid` in what `runsc debug --ps` printed: a JSON
/// list of `{"uid", "pid", "threads": [...], ...}`, after lines of chatter (and, in this
/// version, wrapped in a stray `[...]`): the JSON is the first `[` from which the rest
/// parses.
pub fn tasks_of_uid(printed: &str, uid: u32) -> u64 {
    let Some(list) = printed
        .match_indices('[')
        .find_map(|(at, _)| serde_json::from_str::<Value>(&printed[at..]).ok())
    else {
        return 0;
    };
    fn count(value: &Value, uid: u64) -> u64 {
        match value {
            Value::Array(items) => items.iter().map(|v| count(v, uid)).sum(),
            Value::Object(process) if process.get("uid").and_then(Value::as_u64) == Some(uid) => {
                process
                    .get("threads")
                    .and_then(Value::as_array)
                    .map_or(1, |threads| threads.len().max(1) as u64)
            }
            _ => 0,
        }
    }
    count(&list, u64::from(uid))
}

/// The host processes one of whose arguments is `arg` (runsc, its gofer, its Sentry and the
/// Sentry's stubs, forked from it, all carry the run's `--root=`).
pub fn processes_named(proc: &Path, arg: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&pid| is_named(proc, pid, arg))
        .collect()
}

/// Whether process `pid` has `arg` among its arguments.
pub fn is_named(proc: &Path, pid: i32, arg: &str) -> bool {
    std::fs::read(proc.join(pid.to_string()).join("cmdline"))
        .is_ok_and(|cmdline| cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
}

/// The CPU time (user and system, their reaped children's included) of `pids`.
fn cpu_of(proc: &Path, pids: &[i32]) -> Duration {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&t| t > 0)
        .unwrap_or(100) as u64;
    let total: u64 = pids
        .iter()
        .filter_map(|pid| std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok())
        .map(|stat| stat_ticks(&stat))
        .sum();
    Duration::from_millis(total.saturating_mul(1000) / ticks)
}

/// utime + stime + cutime + cstime of a `/proc/<pid>/stat` line (fields 14 to 17, counted
/// after the command name, which may hold spaces and parentheses).
fn stat_ticks(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<i64>().ok())
        .map(|t| t.max(0) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_counted_from_runsc_debug_ps() {
        // As this version prints it: chatter, then the list in a stray pair of brackets.
        let printed = "Found sandbox [\"x\" '\u{4200}'], PID: %!d(MISSING)\nRetrieving process list\n%!(EXTRA []interface {}=[])[[\n  {\"uid\": 0, \"pid\": 1, \"ppid\": 0, \"threads\": [1], \"cmd\": \"ostiary\"},\n  {\"uid\": 1500000001, \"pid\": 5, \"ppid\": 1, \"threads\": [5, 6, 7], \"cmd\": \"python3\"},\n  {\"uid\": 1500000001, \"pid\": 8, \"ppid\": 5, \"threads\": [8], \"cmd\": \"{[\\\"x\"}\n]]\n";
        assert_eq!(tasks_of_uid(printed, 1_500_000_001), 4);
        assert_eq!(tasks_of_uid(printed, 0), 1);
        assert_eq!(tasks_of_uid(printed, 42), 0);
        // Plain JSON (a later version) reads the same.
        let plain = "[{\"uid\": 7, \"pid\": 1, \"threads\": [1, 2]}]";
        assert_eq!(tasks_of_uid(plain, 7), 2);
        assert_eq!(tasks_of_uid("loading container: file does not exist", 7), 0);
    }

    #[test]
    fn the_runs_host_processes_are_found_by_their_root_and_their_cpu_time_read() {
        let proc = tempfile::tempdir().unwrap();
        let add = |pid: &str, cmdline: &[&str], stat: &str| {
            let dir = proc.path().join(pid);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("cmdline"), cmdline.join("\0")).unwrap();
            std::fs::write(dir.join("stat"), stat).unwrap();
        };
        let ours = "--root=/tmp/ostiary-run-1-ab/gvisor/state";
        add(
            "10",
            &["runsc-sandbox", ours, "boot"],
            "10 (exe) S 9 10 10 0 -1 0 0 0 0 0 150 50 10 5 20 0",
        );
        add(
            "11",
            &["runsc-gofer", ours, "gofer"],
            "11 (a) b) S 9 10 10 0 -1 0 0 0 0 0 100 0 0 0 20 0",
        );
        add(
            "12",
            &[
                "runsc-sandbox",
                "--root=/tmp/ostiary-run-1-ab/gvisor/state2",
            ],
            "12 (exe) S",
        );
        add("13", &["sh", "-c", ours], "13 (sh) S");
        add("self", &["x"], "");
        let mut found = processes_named(proc.path(), ours);
        found.sort_unstable();
        assert_eq!(found, [10, 11, 13], "an exact argument, never a prefix");
        let ticks = stat_ticks("10 (exe) S 9 10 10 0 -1 0 0 0 0 0 150 50 10 5 20 0");
        assert_eq!(ticks, 215);
        assert_eq!(
            stat_ticks("11 (a) b) S 9 10 10 0 -1 0 0 0 0 0 100 0 0 0 20 0"),
            100
        );
        assert_eq!(stat_ticks("garbage"), 0);
        assert!(cpu_of(proc.path(), &[10, 11]) > Duration::ZERO);
    }
}
