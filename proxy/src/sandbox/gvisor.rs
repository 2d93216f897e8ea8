//! The `gvisor` isolation level: the arrangement of the `namespaces` level — the same init
//! and exec stages, view, environment, limits, teardown and exit codes — run under gVisor's
//! `runsc` (Debian's `runsc`), whose user-space kernel (the Sentry) stands between the
//! command and the host: the command's system calls are the Sentry's to answer, and only the
//! Sentry's own, much smaller, set reaches the host kernel (docs/sandbox.md).
//!
//! From a [`Plan`] this writes an OCI bundle into the run's staging directory — an empty
//! read-only root, the view's mounts, exactly the plan's environment (in a `0600` file, never
//! in an argument list) — and returns the `runsc run` command line: `--network=none` (only
//! loopback, in the Sentry's own network stack), `--host-uds=open` (the command may connect
//! to a host Unix socket the view shows: the proxy's; nothing may create one),
//! `--ignore-cgroups` (the run's cgroup, joined by the enter stage, holds every process runsc
//! starts), `--platform=ptrace` (works on every host; this version's KVM platform hangs in
//! nested virtualisation), and `--root` inside the staging directory (runsc's state for the
//! run, removed with it).
//!
//! Where runsc differs from bubblewrap, and what this runner does about it:
//! - a container gets no descriptor but stdio: the init stage says "started" in a file bound
//!   in (root's, `0600`: the command, once it is another uid, cannot write it), not on a
//!   descriptor;
//! - the command's processes are the Sentry's, not the host's: its rlimits are set inside
//!   (OCI `process.rlimits`, enforced by the Sentry), the cgroup's pids limit is a backstop
//!   sized for the Sentry's threads and its ptrace stubs (about eight host tasks for each
//!   process inside), and the command's tasks are counted with `runsc debug --ps`;
//! - the Sentry and its stubs run in the host's pid namespace: the run's host processes are
//!   found by the run's own `--root` in their command line, never by a namespace;
//! - neither `runsc run` nor the Sentry passes on a signal it receives: the operator's go to
//!   the init stage by `runsc kill` (the init holds `CAP_KILL` to pass them to the
//!   command's uid); the host pid of the sandbox (`--pid-file`) is what is killed when the
//!   run is ended;
//! - the Sentry writes to a stdout or stderr that is a regular file at offsets of its own,
//!   from 0 — over what was written before, and stdout over stderr when both are one file
//!   (`> log 2>&1`) — unless the file is open for appending: for the run, such a file is
//!   (the flag is taken back at the end).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::config::Isolation;

use super::limits::{Rlimit, RlimitName};
use super::view::Mount;
use super::{Limit, Plan, Runner, RunnerStatus, SandboxError};

mod forks;
mod watch;

use forks::ForkLog;
use watch::{processes_named, Watch, WatchSpec};

/// Where the init stage says "started", inside.
pub const STARTED_INSIDE: &str = "/run/ostiary/started";

/// Capabilities the init stage holds (see [`super::bwrap`]): to drop to the run's uid, to
/// hand it the working-directory copy, and to pass the operator's signals on to a process
/// of another uid. The exec stage's uid change clears them.
const INIT_CAPS: &[&str] = &[
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_CHOWN",
    "CAP_DAC_READ_SEARCH",
    "CAP_KILL",
];

/// Host tasks of a sandbox before the command runs anything (the Sentry's and the gofer's
/// threads), with room to spare.
const BASE_TASKS: u64 = 256;

/// Host tasks per process inside (a ptrace stub and its threads; measured: about eight).
const TASKS_PER_PROCESS: u64 = 16;

/// The `gvisor` runner.
#[derive(Debug)]
pub struct Gvisor {
    /// The runsc binary, resolved.
    pub path: PathBuf,
    /// The run this runner started (one per runner).
    run: Mutex<Option<Active>>,
}

/// The files of one run, under its staging directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The container's name: the staging directory's (unique per run).
    pub id: String,
    pub bundle: PathBuf,
    /// runsc's state (`--root`).
    pub state: PathBuf,
    pub pid_file: PathBuf,
    pub started: PathBuf,
    /// runsc's debug log, a FIFO: its traced forks ([`forks`]).
    pub debug_log: PathBuf,
}

impl Layout {
    pub fn of(staging: &Path) -> Self {
        let dir = staging.join("gvisor");
        let id = staging
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ostiary-run".into());
        Self {
            id,
            bundle: dir.join("bundle"),
            state: dir.join("state"),
            pid_file: dir.join("sandbox.pid"),
            started: dir.join("started"),
            debug_log: dir.join("runsc.log"),
        }
    }

    /// `--root=<state>`: how runsc and every process it starts for the run are named.
    fn root_flag(&self) -> String {
        format!("--root={}", self.state.display())
    }
}

#[derive(Debug)]
struct Active {
    layout: Layout,
    watch: Watch,
    /// Which of stdout and stderr were made appending for the run.
    appending: Vec<i32>,
    /// Whether runsc runs `--rootless` (every runsc command of the run says so too).
    rootless: bool,
}

impl Gvisor {
    /// The configured runsc (`[sandbox] runsc`), looked up on `PATH` when it is a bare name.
    pub fn locate(configured: &Path) -> Result<Self, SandboxError> {
        let path = super::locate_binary(
            configured,
            "gVisor's runsc",
            "install Debian's `runsc` package (apt-get install runsc) or set [sandbox] runsc",
        )?;
        Ok(Self {
            path,
            run: Mutex::new(None),
        })
    }

    /// `runsc kill` of the run's container: the signal reaches the container's first
    /// process (the init stage). Whether runsc says it was sent.
    fn kill(&self, layout: &Layout, rootless: bool, signal: i32) -> bool {
        let mut kill = std::process::Command::new(&self.path);
        kill.arg(layout.root_flag());
        if rootless {
            kill.arg("--rootless");
        }
        kill.args(["kill", &layout.id, &signal.to_string()])
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The runsc command line of a run laid out as `layout`.
    pub fn argv(&self, layout: &Layout, rootless: bool) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            self.path.clone().into(),
            layout.root_flag().into(),
            "--network=none".into(),
            "--host-uds=open".into(),
            "--ignore-cgroups".into(),
            "--platform=ptrace".into(),
            // The fork system calls traced into the debug log, where a refused one is
            // the processes limit ([`forks`]).
            "--strace".into(),
            format!("--strace-syscalls={}", forks::TRACED).into(),
            format!("--debug-log={}", layout.debug_log.display()).into(),
        ];
        if rootless {
            argv.push("--rootless".into());
        }
        argv.extend([
            "run".into(),
            format!("--bundle={}", layout.bundle.display()).into(),
            format!("--pid-file={}", layout.pid_file.display()).into(),
            layout.id.clone().into(),
        ]);
        argv
    }

    fn active<T>(&self, f: impl FnOnce(&Active) -> T) -> Option<T> {
        let run = self.run.lock().unwrap_or_else(|e| e.into_inner());
        run.as_ref().map(f)
    }
}

impl Runner for Gvisor {
    fn isolation(&self) -> Isolation {
        Isolation::Gvisor
    }

    fn command(
        &self,
        plan: &Plan,
        init: &[OsString],
        _status_fd: i32,
    ) -> Result<Vec<OsString>, SandboxError> {
        let layout = Layout::of(&plan.staging);
        let spec = spec(plan, &started_by_file(init)?)?;
        write_bundle(&layout, &spec)?;
        // Before runsc starts: its opening of the FIFO's write end must find a reader.
        let forks = ForkLog::create(&layout.debug_log).map_err(SandboxError::io(format!(
            "making runsc's debug log {}",
            layout.debug_log.display()
        )))?;
        let watch = Watch::start(WatchSpec {
            runsc: self.path.clone(),
            layout: layout.clone(),
            uid: plan.identity.uid,
            processes: u64::from(plan.limits.processes),
            cpu_time: plan.limits.cpu_time,
            forks,
        });
        let argv = self.argv(&layout, plan.identity.user_ns);
        let appending = [1, 2]
            .into_iter()
            .filter(|&fd| set_append(fd, true))
            .collect();
        *self.run.lock().unwrap_or_else(|e| e.into_inner()) = Some(Active {
            layout,
            watch,
            appending,
            rootless: plan.identity.user_ns,
        });
        Ok(argv)
    }

    /// The sandbox's host pid (the Sentry's), once runsc has written it: killed when the run
    /// is ended. Never a pid namespace: the Sentry runs in the host's.
    fn status(&self, _written: &str) -> RunnerStatus {
        let init_pid = self
            .active(|a| std::fs::read_to_string(&a.layout.pid_file).ok())
            .flatten()
            .and_then(|text| text.trim().parse::<i32>().ok())
            .filter(|&pid| pid > 1);
        RunnerStatus {
            init_pid,
            pid_namespace: None,
            exit: None,
        }
    }

    fn started(&self) -> bool {
        self.active(|a| std::fs::read(&a.layout.started).ok())
            .flatten()
            .is_some_and(|said| said.starts_with(super::init::STARTED))
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> bool {
        self.active(|a| self.kill(&a.layout, a.rootless, signal as i32))
            .unwrap_or(false)
    }

    fn limit(&self) -> Option<Limit> {
        self.active(|a| a.watch.hit()).flatten()
    }

    fn rlimits_inside(&self) -> bool {
        true
    }

    fn cgroup_tasks(&self, processes: u32) -> u64 {
        BASE_TASKS + TASKS_PER_PROCESS * (u64::from(processes) + super::limits::SANDBOX_TASKS)
    }

    fn finish(&self) {
        self.active(|a| a.watch.stop());
    }

    fn remaining(&self) -> Vec<i32> {
        self.active(|a| processes_named(Path::new("/proc"), &a.layout.root_flag()))
            .unwrap_or_default()
    }

    fn holds(&self, pid: i32) -> bool {
        self.active(|a| watch::is_named(Path::new("/proc"), pid, &a.layout.root_flag()))
            .unwrap_or(false)
    }
}

impl Drop for Gvisor {
    fn drop(&mut self) {
        if let Some(active) = self.run.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            active.watch.stop();
            for fd in active.appending {
                set_append(fd, false);
            }
        }
    }
}

/// Sets (or clears) `O_APPEND` on descriptor `fd` (stdout or stderr) when it is a regular
/// file; whether it changed it.
fn set_append(fd: i32, on: bool) -> bool {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use std::os::fd::AsFd;
    let stream = match fd {
        1 => std::io::stdout().as_fd().try_clone_to_owned(),
        2 => std::io::stderr().as_fd().try_clone_to_owned(),
        _ => return false,
    };
    let Ok(stream) = stream else { return false };
    let regular = nix::sys::stat::fstat(&stream)
        .is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG);
    let Ok(bits) = fcntl(&stream, FcntlArg::F_GETFL) else {
        return false;
    };
    let flags = OFlag::from_bits_truncate(bits);
    if !regular || flags.contains(OFlag::O_APPEND) == on {
        return false;
    }
    let flags = if on {
        flags | OFlag::O_APPEND
    } else {
        flags - OFlag::O_APPEND
    };
    fcntl(&stream, FcntlArg::F_SETFL(flags)).is_ok()
}

/// The init stage's command line with its "started" descriptor turned into the file bound
/// at [`STARTED_INSIDE`] (runsc passes a container no descriptor but stdio).
pub fn started_by_file(init: &[OsString]) -> Result<Vec<OsString>, SandboxError> {
    let at = init
        .iter()
        .position(|a| a == "--started-fd")
        .filter(|&i| i + 1 < init.len())
        .ok_or_else(|| {
            SandboxError::Plan("the init stage's command line has no --started-fd".into())
        })?;
    let mut out = init.to_vec();
    out.splice(at..at + 2, ["--started-file".into(), STARTED_INSIDE.into()]);
    Ok(out)
}

fn utf8<'a>(what: &str, s: &'a std::ffi::OsStr) -> Result<&'a str, SandboxError> {
    s.to_str().ok_or_else(|| {
        SandboxError::Plan(format!(
            "{what} {} is not UTF-8, which runsc's OCI spec (JSON) cannot carry",
            s.to_string_lossy()
        ))
    })
}

/// The OCI runtime spec of a run whose first process is `init`.
pub fn spec(plan: &Plan, init: &[OsString]) -> Result<Value, SandboxError> {
    let layout = Layout::of(&plan.staging);
    let args = init
        .iter()
        .map(|a| utf8("an argument", a).map(str::to_owned))
        .collect::<Result<Vec<_>, _>>()?;
    let env: Vec<String> = plan.env.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut mounts = plan
        .view
        .mounts
        .iter()
        .map(mount)
        .collect::<Result<Vec<_>, _>>()?;
    // After the `/run/ostiary` tmpfs it lands in.
    mounts.push(json!({
        "destination": STARTED_INSIDE,
        "type": "bind",
        "source": utf8("the started file", layout.started.as_os_str())?,
        "options": ["bind", "rw", "nosuid", "nodev", "noexec"],
    }));
    let caps = json!(INIT_CAPS);
    Ok(json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            // Root of the Sentry's own user namespace: the init stage drops to the run's uid
            // before the command runs.
            "user": { "uid": 0, "gid": 0 },
            "args": args,
            "env": env,
            "cwd": utf8("the working directory", plan.view.chdir.as_os_str())?,
            "capabilities": {
                "bounding": caps,
                "effective": caps,
                "permitted": caps,
                "inheritable": [],
                "ambient": [],
            },
            "rlimits": plan.rlimits.iter().map(rlimit).collect::<Vec<_>>(),
            "noNewPrivileges": true,
        },
        "root": {
            "path": utf8("the bundle", layout.bundle.join("rootfs").as_os_str())?,
            "readonly": true,
        },
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [
                { "type": "pid" },
                { "type": "network" },
                { "type": "ipc" },
                { "type": "uts" },
                { "type": "mount" },
            ],
        },
    }))
}

fn rlimit(limit: &Rlimit) -> Value {
    let name = match limit.resource {
        RlimitName::Nofile => "RLIMIT_NOFILE",
        RlimitName::Cpu => "RLIMIT_CPU",
    };
    json!({ "type": name, "soft": limit.soft, "hard": limit.hard })
}

/// One mount of the view as an OCI mount.
fn mount(m: &Mount) -> Result<Value, SandboxError> {
    let dst = utf8("a mount point", m.dst().as_os_str())?;
    Ok(match m {
        Mount::ReadOnly { src, .. } => {
            let kind = if src.is_dir() { "rbind" } else { "bind" };
            json!({
                "destination": dst,
                "type": "bind",
                "source": utf8("a read-only path", src.as_os_str())?,
                "options": [kind, "ro", "nosuid", "nodev"],
            })
        }
        Mount::Tmpfs { mode, .. } => json!({
            "destination": dst,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", format!("mode={mode:04o}")],
        }),
        Mount::Proc { .. } => json!({
            "destination": dst,
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "nodev", "noexec"],
        }),
        // The Sentry fills it with its own null, zero, full, random, urandom, tty and pts.
        Mount::Dev { .. } => json!({
            "destination": dst,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "mode=0755"],
        }),
        Mount::HideDir { .. } => json!({
            "destination": dst,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["ro", "nosuid", "nodev", "noexec", "mode=0000"],
        }),
        Mount::HideFile { src, .. } => json!({
            "destination": dst,
            "type": "bind",
            "source": utf8("the empty file", src.as_os_str())?,
            "options": ["bind", "ro", "nosuid", "nodev", "noexec"],
        }),
    })
}

/// The bundle (`config.json`, `0600`: it holds the session's variables; an empty root), an
/// empty "started" file (`0600`) and runsc's state directory (`0700`).
fn write_bundle(layout: &Layout, spec: &Value) -> Result<(), SandboxError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = |path: &Path, mode: u32| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
            .map_err(SandboxError::io(format!("creating {}", path.display())))
    };
    dir(&layout.bundle.join("rootfs"), 0o755)?;
    dir(&layout.state, 0o700)?;
    let file = |path: &Path, bytes: &[u8]| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(SandboxError::io(format!("writing {}", path.display())))
    };
    let text = serde_json::to_vec_pretty(spec).map_err(|e| SandboxError::Plan(e.to_string()))?;
    file(&layout.bundle.join("config.json"), &text)?;
    file(&layout.started, b"")
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use super::*;
    use crate::config::Profile;
    use crate::sandbox::limits::Limits;
    use crate::sandbox::{inside, uid::Identity, view::View, Env};

    fn plan(staging: &Path) -> Plan {
        let profile = Profile::default();
        Plan {
            profile_name: "gvisor".into(),
            profile: profile.clone(),
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: Env(vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                (
                    "HTTPS_PROXY".into(),
                    "http://agent:session-token@127.0.0.1:8080".into(),
                ),
            ]),
            cwd: "/work/project".into(),
            home: inside::HOME.into(),
            identity: Identity {
                uid: 1_500_000_001,
                gid: 1_500_000_001,
                user_ns: false,
            },
            view: View {
                mounts: vec![
                    Mount::ReadOnly {
                        src: "/usr".into(),
                        dst: "/usr".into(),
                    },
                    Mount::ReadOnly {
                        src: "/etc/hostname".into(),
                        dst: "/etc/hostname".into(),
                    },
                    Mount::Proc {
                        dst: "/proc".into(),
                    },
                    Mount::Dev { dst: "/dev".into() },
                    Mount::Tmpfs {
                        dst: "/tmp".into(),
                        mode: 0o1777,
                    },
                    Mount::Tmpfs {
                        dst: inside::DIR.into(),
                        mode: 0o755,
                    },
                    Mount::HideDir {
                        dst: "/work/project/.ostiary".into(),
                    },
                    Mount::HideFile {
                        src: staging.join("empty"),
                        dst: "/etc/secrets.toml".into(),
                    },
                ],
                chdir: "/work/project".into(),
            },
            limits: Limits::of(&profile),
            wall_clock: Duration::from_secs(60),
            proxy_port: 8080,
            staging: staging.to_owned(),
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
        }
    }

    fn options(mount: &Value) -> Vec<&str> {
        mount["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect()
    }

    #[test]
    fn the_init_says_started_in_a_file_not_on_a_descriptor() {
        let staging = Path::new("/tmp/ostiary-run-1-ab");
        let init = plan(staging).init_argv(
            crate::sandbox::exec::CommandLimits {
                nproc: 514,
                address_space: None,
            },
            4,
        );
        let by_file = started_by_file(&init).unwrap();
        assert_eq!(by_file.len(), init.len());
        assert!(!by_file.iter().any(|a| a == "--started-fd"));
        let at = by_file.iter().position(|a| a == "--started-file").unwrap();
        assert_eq!(by_file[at + 1], STARTED_INSIDE);
        // Everything else, the exec stage and the command included, is as the plan says.
        assert_eq!(by_file[at + 2..], init[at + 2..]);
        assert!(started_by_file(&["sandbox-init".into()]).is_err());
    }

    #[test]
    fn the_spec_is_the_plans_view_environment_and_limits() {
        let staging = Path::new("/tmp/ostiary-run-1-ab");
        let plan = plan(staging);
        let init = started_by_file(&plan.init_argv(
            crate::sandbox::exec::CommandLimits {
                nproc: 514,
                address_space: None,
            },
            4,
        ))
        .unwrap();
        let spec = spec(&plan, &init).unwrap();
        let process = &spec["process"];
        assert_eq!(process["args"][0], inside::BINARY);
        assert_eq!(process["args"][1], "sandbox-init");
        assert_eq!(process["user"], json!({"uid": 0, "gid": 0}));
        assert_eq!(process["noNewPrivileges"], true);
        assert_eq!(process["cwd"], "/work/project");
        // Exactly the plan's environment, nothing of this process's.
        assert_eq!(
            process["env"],
            json!([
                "PATH=/usr/bin:/bin",
                "HTTPS_PROXY=http://agent:session-token@127.0.0.1:8080"
            ])
        );
        assert_eq!(process["capabilities"]["bounding"], json!(INIT_CAPS));
        assert_eq!(process["capabilities"]["ambient"], json!([]));
        assert_eq!(
            process["rlimits"],
            json!([
                {"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 1024},
                {"type": "RLIMIT_CPU", "soft": 3605, "hard": 3610},
            ])
        );
        assert_eq!(spec["root"]["readonly"], true);
        assert_eq!(
            spec["root"]["path"],
            "/tmp/ostiary-run-1-ab/gvisor/bundle/rootfs"
        );
        let namespaces: Vec<&str> = spec["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert_eq!(namespaces, ["pid", "network", "ipc", "uts", "mount"]);
        // runsc is told --ignore-cgroups: no resources for it to apply.
        assert!(spec["linux"].get("resources").is_none());

        let mounts = spec["mounts"].as_array().unwrap();
        let at = |dst: &str| mounts.iter().find(|m| m["destination"] == dst).unwrap();
        assert_eq!(at("/usr")["type"], "bind");
        assert_eq!(options(at("/usr")), ["rbind", "ro", "nosuid", "nodev"]);
        assert_eq!(options(at("/etc/hostname"))[..2], ["bind", "ro"]);
        assert_eq!(at("/proc")["type"], "proc");
        assert_eq!(options(at("/tmp")), ["nosuid", "nodev", "mode=1777"]);
        let hidden = at("/work/project/.ostiary");
        assert_eq!(hidden["type"], "tmpfs");
        assert!(options(hidden).contains(&"ro") && options(hidden).contains(&"mode=0000"));
        let file = at("/etc/secrets.toml");
        assert_eq!(
            (file["source"].as_str(), options(file)[1]),
            (Some("/tmp/ostiary-run-1-ab/empty"), "ro")
        );
        // The only writable host file: the started file, root's, after the tmpfs it is in.
        let started = mounts
            .iter()
            .position(|m| m["destination"] == STARTED_INSIDE)
            .unwrap();
        let plumbing = mounts
            .iter()
            .position(|m| m["destination"] == inside::DIR)
            .unwrap();
        assert!(started > plumbing);
        assert_eq!(
            mounts[started]["source"],
            "/tmp/ostiary-run-1-ab/gvisor/started"
        );
        let writable: Vec<&Value> = mounts
            .iter()
            .filter(|m| m["type"] == "bind" && !options(m).contains(&"ro"))
            .collect();
        assert_eq!(writable, [&mounts[started]]);
    }

    #[test]
    fn the_command_line_confines_and_carries_no_secret() {
        let staging = Path::new("/tmp/ostiary-run-7-cd");
        let runner = Gvisor {
            path: "/usr/bin/runsc".into(),
            run: Mutex::new(None),
        };
        let layout = Layout::of(staging);
        let argv: Vec<String> = runner
            .argv(&layout, false)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        for flag in [
            "--network=none",
            "--host-uds=open",
            "--ignore-cgroups",
            "--platform=ptrace",
        ] {
            assert!(argv.iter().any(|a| a == flag), "{flag}: {argv:?}");
        }
        assert!(argv.contains(&"--root=/tmp/ostiary-run-7-cd/gvisor/state".to_owned()));
        assert_eq!(argv.last().unwrap(), "ostiary-run-7-cd");
        assert!(!argv.iter().any(|a| a == "--rootless"));
        // The fork calls traced into the run's own FIFO, and nothing else.
        assert!(argv.contains(&"--strace".to_owned()));
        assert!(argv.contains(&"--strace-syscalls=clone,fork,vfork,clone3".to_owned()));
        assert!(argv.contains(&"--debug-log=/tmp/ostiary-run-7-cd/gvisor/runsc.log".to_owned()));
        assert!(!argv.iter().any(|a| a == "--debug"));
        assert!(runner.argv(&layout, true).iter().any(|a| a == "--rootless"));
        // Flags before the subcommand, the bundle after it.
        let run = argv.iter().position(|a| a == "run").unwrap();
        assert!(argv[run + 1].starts_with("--bundle=/tmp/ostiary-run-7-cd/gvisor/bundle"));
        assert!(!argv.iter().any(|a| a.contains("token")));
    }

    #[test]
    fn the_bundle_is_private_to_root() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("ostiary-run-3-ef");
        std::fs::create_dir(&staging).unwrap();
        let layout = Layout::of(&staging);
        write_bundle(&layout, &json!({"ociVersion": "1.0.2"})).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&layout.bundle.join("config.json")), 0o600);
        assert_eq!(mode(&layout.started), 0o600);
        assert_eq!(mode(&layout.state), 0o700);
        assert_eq!(
            std::fs::read_dir(layout.bundle.join("rootfs"))
                .unwrap()
                .count(),
            0
        );
        assert_eq!(std::fs::read(&layout.started).unwrap(), b"");
        // A second run in the same directory is refused rather than mixed with the first.
        assert!(write_bundle(&layout, &json!({})).is_err());
    }

    #[test]
    fn a_missing_runsc_is_a_clear_error_and_the_cgroup_has_room_for_the_sentry() {
        let e = Gvisor::locate(Path::new("/nonexistent/runsc")).unwrap_err();
        assert!(e.to_string().contains("apt-get install runsc"), "{e}");
        let e = Gvisor::locate(Path::new("no-such-runsc-here")).unwrap_err();
        assert!(e.to_string().contains("runsc"), "{e}");
        let runner = Gvisor {
            path: "/usr/bin/runsc".into(),
            run: Mutex::new(None),
        };
        assert!(runner.cgroup_tasks(1) >= BASE_TASKS + TASKS_PER_PROCESS);
        assert!(runner.cgroup_tasks(512) > 8 * 512);
        assert!(runner.rlimits_inside());
        // Nothing started: nothing to report, nothing remains.
        assert_eq!(runner.status(""), RunnerStatus::default());
        assert!(!runner.started());
        assert!(runner.remaining().is_empty());
    }
}
