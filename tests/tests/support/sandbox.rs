//! Shared by the sandbox tests (`sandbox*.rs`, and the checks in `sandbox_checks.rs` and
//! `sandbox_limit_checks.rs`): a real `ostiary serve` with a TLS test upstream, and
//! `ostiary run --sandbox` started as the operator would, from a working directory of the
//! test's, with the environment the test gives it.
//!
//! Every check takes the profile it runs under, so that the same suite runs under each
//! isolation level. The prerequisites (bubblewrap, namespaces, Debian's `python3-requests`;
//! for the `gvisor` level, Debian's `runsc`) are checked first and fail the test with a
//! message saying what is missing: a sandbox test never skips.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use ostiary_e2e::clients::{CmdOutput, SCRUBBED_ENV};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

use crate::support::cli::{audit_query, ostiary_bin, Server, POLICY};

/// How long one `ostiary run` may take in a test before it is killed.
pub(crate) const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The interpreter the sandboxed Python clients use: Debian's, with Debian's
/// `python3-requests` (`scripts/test.sh` installs it), because the sandbox's default view
/// is the system (`/usr`, `/etc`, ...), not the test venv.
pub(crate) const PYTHON: &str = "/usr/bin/python3";

/// The default profile's read-only view (the built-in list), for profiles that add to it.
pub(crate) const SYSTEM: &str =
    r#""/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt""#;

/// Prints the soft rlimits of the command as `NOFILE=`, `NPROC=`, `CPU=` (seconds) and `AS=`
/// (bytes) lines, with [`PYTHON`]: the shell's `ulimit` has no `-u` in dash, and gVisor (as
/// of Debian's runsc) has no `/proc/self/limits`.
pub(crate) const LIMITS: &str = "/usr/bin/python3 -c 'import resource as r
for name, res in ((\"NOFILE\", r.RLIMIT_NOFILE), (\"NPROC\", r.RLIMIT_NPROC), (\"CPU\", r.RLIMIT_CPU), (\"AS\", r.RLIMIT_AS)):
    soft = r.getrlimit(res)[0]
    print(\"%s=%s\" % (name, \"unlimited\" if soft == r.RLIM_INFINITY else soft))'";

/// The isolation level of the test profiles named after `profile` (`gvisor`, `gvisor-tight`:
/// `gvisor`; anything else: `namespaces`).
pub(crate) fn isolation_of(profile: &str) -> &'static str {
    if profile == "gvisor" || profile.starts_with("gvisor-") {
        "gvisor"
    } else {
        "namespaces"
    }
}

/// The uid of this test process (and of `ostiary run`).
pub(crate) fn own_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Fails the test, naming `runsc`, where the `gvisor` level cannot run.
pub(crate) fn require_runsc() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        match std::process::Command::new("runsc").arg("--version").output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "gVisor's `runsc --version` failed ({}): the gvisor sandbox tests need a working runsc (Debian's `runsc` package; scripts/test.sh installs it)",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(format!(
                "gVisor's `runsc` is not installed ({e}): the gvisor sandbox tests need Debian's `runsc` package (scripts/test.sh installs it: apt-get install runsc)"
            )),
        }
    });
    if let Err(message) = checked {
        panic!("{message}");
    }
}

/// Fails the test, with what to do, where this host cannot run sandboxes.
pub(crate) fn require_sandbox() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let bwrap = std::process::Command::new("bwrap").arg("--version").output();
        match bwrap {
            Ok(out) if out.status.success() => {}
            _ => {
                return Err("bubblewrap (`bwrap`) is not installed: the sandbox tests need Debian's `bubblewrap` package (scripts/test.sh installs it: apt-get install bubblewrap)".into())
            }
        }
        let probe = std::process::Command::new("bwrap")
            .args(["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"])
            .args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"])
            .output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "this host refuses the namespaces a sandbox needs (bwrap --unshare-net --unshare-pid ... true failed: {}); run the tests where unprivileged user namespaces are allowed or as root",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
            Err(e) => return Err(format!("running bwrap: {e}")),
        }
        let requests = std::process::Command::new(PYTHON)
            .args(["-c", "import requests"])
            .output();
        if !requests.is_ok_and(|o| o.status.success()) {
            return Err(format!(
                "{PYTHON} cannot import requests: the sandbox tests need Debian's `python3-requests` (scripts/test.sh installs it)"
            ));
        }
        Ok(())
    });
    if let Err(message) = checked {
        panic!("{message}");
    }
}

/// A proxy, its upstream, and a working directory to run sandboxed commands from.
pub(crate) struct Rig {
    pub(crate) upstream: Upstream,
    pub(crate) server: Server,
    /// The working directory of the runs (`data.txt` holds `host data`).
    pub(crate) work: tempfile::TempDir,
}

impl Rig {
    /// A proxy allowing `/echo` on `api.example.test` (or `policy`), with `extra_toml`
    /// in its config.
    pub(crate) async fn start(policy: Option<&str>, extra_toml: &str) -> Self {
        require_sandbox();
        let upstream = Upstream::builder().start().await;
        let server = Server::start_with(
            &upstream,
            &["api.example.test"],
            policy.unwrap_or(POLICY),
            extra_toml,
            "info",
        )
        .await;
        let work = tempfile::tempdir().unwrap();
        std::fs::write(work.path().join("data.txt"), "host data\n").unwrap();
        Rig {
            upstream,
            server,
            work,
        }
    }

    /// Adds TOML to the config file the CLI reads (the running proxy does not reread it:
    /// only for what `ostiary run` alone decides, like a `default` profile's view).
    pub(crate) fn append_config(&self, toml: &str) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.server.config)
            .unwrap();
        writeln!(file, "\n{toml}").unwrap();
    }

    pub(crate) fn admin_token(&self) -> String {
        std::fs::read_to_string(self.server.state.join("admin.token"))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// `ostiary --config <config> run <args>` from the working directory.
    pub(crate) async fn run(&self, args: &[&str], env: &[(&str, &str)]) -> CmdOutput {
        self.run_from(self.work.path(), args, env).await
    }

    /// `ostiary --config <config> run <args>` from `cwd`.
    pub(crate) async fn run_from(
        &self,
        cwd: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> CmdOutput {
        let mut cmd = tokio::process::Command::new(ostiary_bin());
        cmd.arg("--config").arg(&self.server.config).arg("run");
        self.finish(&mut cmd, cwd, args, env);
        output(cmd).await
    }

    /// `sh -c 'exec 7<FILE; exec ostiary ... run <args>'`: `ostiary run` with a descriptor
    /// left open on it, as a careless parent would.
    pub(crate) async fn run_with_fd7(&self, file: &Path, args: &[&str]) -> CmdOutput {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg("exec 7<\"$1\"; shift; exec \"$@\"")
            .arg("sh")
            .arg(file)
            .arg(ostiary_bin())
            .arg("--config")
            .arg(&self.server.config)
            .arg("run");
        self.finish(&mut cmd, self.work.path(), args, &[]);
        output(cmd).await
    }

    fn finish(
        &self,
        cmd: &mut tokio::process::Command,
        cwd: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) {
        cmd.args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("OSTIARY_LOG", "warn")
            .env_remove("OSTIARY_CONFIG")
            .env_remove("OSTIARY_ADMIN_TOKEN");
        for name in SCRUBBED_ENV {
            cmd.env_remove(name);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
    }

    /// `ostiary run -v --sandbox=<profile> --agent demo -- sh -c <script>`.
    pub(crate) async fn sandboxed(&self, profile: &str, script: &str) -> CmdOutput {
        self.sandboxed_with(profile, script, &[]).await
    }

    pub(crate) async fn sandboxed_with(
        &self,
        profile: &str,
        script: &str,
        env: &[(&str, &str)],
    ) -> CmdOutput {
        let flag = format!("--sandbox={profile}");
        self.run(
            &["-v", &flag, "--agent", "demo", "--", "sh", "-c", script],
            env,
        )
        .await
    }

    /// The audit records of a session once its `run` record is there.
    pub(crate) async fn run_record(&self, session: &str) -> Value {
        let records = audit_query(&self.server, &["--session", session], |r| {
            r.iter().any(|r| r["kind"] == "run")
        })
        .await;
        records
            .into_iter()
            .find(|r| r["kind"] == "run")
            .unwrap_or_else(|| panic!("no run record for session {session}"))
    }
}

async fn output(mut cmd: tokio::process::Command) -> CmdOutput {
    let child = cmd.spawn().expect("starting ostiary run");
    match tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => CmdOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("waiting for ostiary run: {e}"),
        Err(_) => panic!("ostiary run did not end within {RUN_TIMEOUT:?}"),
    }
}

/// What `ostiary run -v` said about the sandbox it made.
#[derive(Debug, Clone)]
pub(crate) struct Said {
    pub(crate) session: String,
    pub(crate) uid: u32,
    pub(crate) cgroups: Vec<PathBuf>,
    pub(crate) staging: PathBuf,
    pub(crate) limits_by: String,
    /// The report printed at the end.
    pub(crate) report: Value,
}

/// Reads `ostiary run -v`'s two lines on stderr.
pub(crate) fn said(out: &CmdOutput) -> Said {
    let line = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("ostiary: sandbox: session "))
        .unwrap_or_else(|| panic!("no sandbox line:\n{out}"));
    let after = |marker: &str| -> &str {
        let at = line
            .find(marker)
            .unwrap_or_else(|| panic!("no {marker:?} in {line}"));
        &line[at + marker.len()..]
    };
    let session = line.split(',').next().unwrap_or_default().to_owned();
    let digits: String = after(", uid ")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let uid: u32 = digits
        .parse()
        .unwrap_or_else(|e| panic!("uid in {line}: {e}"));
    let rest = after("limits by ");
    let (limits_by, rest) = rest.split_once(' ').unwrap_or_default();
    let dirs = rest.split(']').next().unwrap_or_default();
    let cgroups = dirs
        .trim_start_matches('[')
        .split(", ")
        .map(|d| d.trim_matches('"'))
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    let staging = PathBuf::from(after(", staging ").split(',').next().unwrap_or_default());
    let limits_by = limits_by.to_owned();
    let report = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("ostiary: sandbox report: "))
        .map(|r| serde_json::from_str(r).unwrap_or_else(|e| panic!("{e}: {r}")))
        .unwrap_or_else(|| panic!("no sandbox report:\n{out}"));
    Said {
        session,
        uid,
        cgroups,
        staging,
        limits_by,
        report,
    }
}

/// The value after `NAME=` on a line of the command's output.
pub(crate) fn line_value<'a>(out: &'a CmdOutput, name: &str) -> &'a str {
    let prefix = format!("{name}=");
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {name}= line:\n{out}"))
}

/// Host processes whose command line holds `text` (the run's staging directory: bwrap,
/// runsc, its gofer and Sentry, and every `runsc` started for the run name it).
pub(crate) fn processes_naming(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(text) {
            found.push(cmdline);
        }
    }
    found
}

/// Host processes any of whose uids is `uid`.
pub(crate) fn processes_of(uid: u32) -> Vec<String> {
    let id = uid.to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let uids = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .unwrap_or_default();
        let zombie = status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if !zombie && uids.split_whitespace().any(|u| u == id) {
            found.push(status.lines().next().unwrap_or_default().to_owned());
        }
    }
    found
}
