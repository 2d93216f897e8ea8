//! The `namespaces` isolation level: a bubblewrap (`bwrap`, Debian's `bubblewrap`) command
//! built from a [`Plan`].
//!
//! New network, pid, ipc, uts (and, where the kernel has them, cgroup) namespaces; as root no
//! user namespace but every capability dropped except the five the init stage needs
//! (`SETUID`/`SETGID` to drop to the run's uid, `CHOWN` and `DAC_READ_SEARCH` to hand it the
//! working-directory copy, `KILL` to pass the operator's signals to the command's uid),
//! which the exec stage's uid change clears; otherwise a user
//! namespace with further user namespaces disabled. `--as-pid-1`: the init stage is pid 1,
//! and when it exits the kernel kills whatever else runs in the pid namespace.
//! `--die-with-parent`: if `ostiary run` dies, so does the sandbox. `--new-session`: the
//! command cannot push input into the operator's terminal (`TIOCSTI`). The environment
//! is bwrap's own (the stage before it sets exactly the computed one), never `--setenv`:
//! argv is world-readable in `/proc`, and the proxy URL carries the session's token.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::Isolation;

use super::view::Mount;
use super::{Plan, Runner, RunnerStatus, SandboxError};

/// The `namespaces` runner.
#[derive(Debug, Clone)]
pub struct Bubblewrap {
    /// The bwrap binary, resolved.
    pub path: PathBuf,
}

impl Bubblewrap {
    /// The configured bwrap (`[sandbox] bwrap`), looked up on `PATH` when it is a bare name.
    pub fn locate(configured: &Path) -> Result<Self, SandboxError> {
        let path = super::locate_binary(
            configured,
            "bubblewrap",
            "install Debian's `bubblewrap` package (apt-get install bubblewrap) or set [sandbox] bwrap",
        )?;
        Ok(Self { path })
    }
}

/// Capabilities the init stage keeps when the sandbox runs as root (see the module doc).
const INIT_CAPS: &[&str] = &[
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_CHOWN",
    "CAP_DAC_READ_SEARCH",
    "CAP_KILL",
];

impl Runner for Bubblewrap {
    fn isolation(&self) -> Isolation {
        Isolation::Namespaces
    }

    fn command(
        &self,
        plan: &Plan,
        init: &[OsString],
        status_fd: i32,
    ) -> Result<Vec<OsString>, SandboxError> {
        let mut args: Vec<OsString> = vec![self.path.clone().into()];
        let flag = |args: &mut Vec<OsString>, parts: &[&str]| {
            args.extend(parts.iter().map(OsString::from));
        };
        flag(
            &mut args,
            &[
                "--unshare-net",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--hostname",
                "sandbox",
                "--die-with-parent",
                "--new-session",
                "--as-pid-1",
            ],
        );
        if plan.identity.user_ns {
            flag(&mut args, &["--unshare-user", "--disable-userns"]);
            let (uid, gid) = (plan.identity.uid.to_string(), plan.identity.gid.to_string());
            flag(&mut args, &["--uid", &uid, "--gid", &gid]);
        } else {
            flag(&mut args, &["--cap-drop", "ALL"]);
            for cap in INIT_CAPS {
                flag(&mut args, &["--cap-add", cap]);
            }
        }
        flag(&mut args, &["--json-status-fd", &status_fd.to_string()]);
        for mount in &plan.view.mounts {
            mount_args(&mut args, mount);
        }
        args.push("--chdir".into());
        args.push(plan.view.chdir.clone().into());
        args.push("--".into());
        args.extend(init.iter().cloned());
        Ok(args)
    }

    fn status(&self, written: &str) -> RunnerStatus {
        parse_status(written)
    }
}

fn mount_args(args: &mut Vec<OsString>, mount: &Mount) {
    let mut push = |parts: Vec<OsString>| args.extend(parts);
    match mount {
        Mount::ReadOnly { src, dst } => {
            push(vec!["--ro-bind".into(), src.into(), dst.into()]);
        }
        Mount::Tmpfs { dst, mode } => {
            // bwrap makes the missing parents of a destination no more open than its
            // `--perms` ("least astonishment"): a `0700` HOME at `/home/agent` would come
            // with a `/home` of `0700` that the command's uid cannot enter. A plain `--dir`
            // first makes them `0755` (and leaves an existing directory as it is).
            if mode & 0o005 != 0o005 {
                push(vec!["--dir".into(), dst.into()]);
            }
            push(vec![
                "--perms".into(),
                format!("{mode:04o}").into(),
                "--tmpfs".into(),
                dst.into(),
            ]);
        }
        Mount::Proc { dst } => push(vec!["--proc".into(), dst.into()]),
        Mount::Dev { dst } => push(vec!["--dev".into(), dst.into()]),
        Mount::HideDir { dst } => push(vec![
            "--perms".into(),
            "0000".into(),
            "--tmpfs".into(),
            dst.into(),
            "--remount-ro".into(),
            dst.into(),
        ]),
        Mount::HideFile { src, dst } => push(vec!["--ro-bind".into(), src.into(), dst.into()]),
    }
}

/// bwrap's `--json-status-fd` output: one JSON object per line-ish, `{"child-pid": N,
/// "pid-namespace": N, ...}` once the sandbox's first process exists, `{"exit-code": N}`
/// when it ended.
fn parse_status(written: &str) -> RunnerStatus {
    let mut status = RunnerStatus::default();
    let stream = serde_json::Deserializer::from_str(written).into_iter::<serde_json::Value>();
    for value in stream {
        let Ok(value) = value else { break };
        if let Some(pid) = value.get("child-pid").and_then(|v| v.as_i64()) {
            status.init_pid = i32::try_from(pid).ok();
        }
        if let Some(ns) = value.get("pid-namespace").and_then(|v| v.as_u64()) {
            status.pid_namespace = Some(ns);
        }
        if let Some(code) = value.get("exit-code").and_then(|v| v.as_i64()) {
            status.exit = i32::try_from(code).ok();
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_stream_is_read_as_it_grows() {
        assert_eq!(parse_status(""), RunnerStatus::default());
        let started = "{ \"child-pid\": 25774, \"mnt-namespace\": 4026532178, \"net-namespace\": 4026532180, \"pid-namespace\": 4026532179 }\n";
        assert_eq!(
            parse_status(started),
            RunnerStatus {
                init_pid: Some(25774),
                pid_namespace: Some(4026532179),
                exit: None
            }
        );
        let ended = format!("{started}{{ \"exit-code\": 3 }}\n");
        assert_eq!(parse_status(&ended).exit, Some(3));
        // Half a document (still being written) is not a status yet.
        assert_eq!(parse_status(&started[..20]), RunnerStatus::default());
    }

    #[test]
    fn a_private_tmpfs_comes_with_parents_its_uid_can_enter() {
        let args = |mount: Mount| {
            let mut args = Vec::new();
            mount_args(&mut args, &mount);
            args.into_iter()
                .map(|a| a.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        let home = args(Mount::Tmpfs {
            dst: "/home/agent".into(),
            mode: 0o700,
        });
        assert_eq!(
            home,
            [
                "--dir",
                "/home/agent",
                "--perms",
                "0700",
                "--tmpfs",
                "/home/agent"
            ]
        );
        let tmp = args(Mount::Tmpfs {
            dst: "/tmp".into(),
            mode: 0o1777,
        });
        assert_eq!(tmp, ["--perms", "1777", "--tmpfs", "/tmp"]);
    }

    #[test]
    fn a_missing_bwrap_is_a_clear_error() {
        let e = Bubblewrap::locate(Path::new("/nonexistent/bwrap")).unwrap_err();
        assert!(e.to_string().contains("apt-get install bubblewrap"), "{e}");
        let e = Bubblewrap::locate(Path::new("no-such-bwrap-here")).unwrap_err();
        assert!(e.to_string().contains("bubblewrap"), "{e}");
    }
}
