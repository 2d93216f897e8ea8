//! The limit and teardown checks of `ostiary run --sandbox` (docs/sandbox.md), each taking
//! the profile it runs under, so that `sandbox_limits.rs` runs them under the `namespaces`
//! level and `sandbox_gvisor.rs` under `gvisor`: limits end a run with their exit codes and
//! the session's audit record says which; a profile's limits and env allowlist apply; after
//! every run nothing of it remains and its session is torn down; two runs share nothing; the
//! operator's signals reach the command.
#![allow(dead_code)]

use ostiary_e2e::clients::{curl, CmdOutput};

use crate::support::sandbox::{
    isolation_of, line_value, own_uid, processes_naming, processes_of, said, Rig, LIMITS, PYTHON,
};

/// Profiles with small limits, beside the one under test. Under gvisor the memory limit
/// counts the Sentry's own memory too (some 25 MiB at rest, more with every process inside:
/// a fork bomb would reach 64 MiB before 32 processes), so its tight profile has more.
pub(crate) fn tight(profile: &str) -> String {
    let isolation = isolation_of(profile);
    let memory = if isolation == "gvisor" {
        "256MiB"
    } else {
        "64MiB"
    };
    format!(
        r#"
[sandbox.profiles.{profile}-tight]
isolation = "{isolation}"
memory = "{memory}"
processes = 32
open_files = 100
cpu_time = "2s"

[sandbox.profiles.{profile}-brief]
isolation = "{isolation}"
wall_clock = "2s"
"#
    )
}

/// The run ended by `limit` with `code`, said on stderr and in the session's audit record.
pub(crate) async fn ended_by(rig: &Rig, out: &CmdOutput, limit: &str, code: i32) {
    assert_eq!(out.status, code, "{out}");
    let words = limit.replace('_', "-");
    assert!(
        out.stderr.contains(&format!("ended by its {words} limit")),
        "{out}"
    );
    let said = said(out);
    assert_eq!(said.report["limit"], limit, "{out}");
    let record = rig.run_record(&said.session).await;
    assert_eq!(record["run"]["limit"], limit, "{record}");
    assert_eq!(record["run"]["exit"], code, "{record}");
    assert_eq!(record["decision"], "deny", "{record}");
    assert_eq!(record["error"], "limit_exceeded", "{record}");
    assert!(
        record["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(limit),
        "{record}"
    );
}

/// Fork bombs (of a shell, of processes, of threads) end the run with 151, memory hogs (the
/// heap, a private tmpfs) with 150.
pub(crate) async fn memory_and_processes(profile: &str) {
    let rig = Rig::start(None, &tight(profile)).await;
    let p = format!("{profile}-tight");
    for bomb in [
        // The bomb's own shell waits: a run ends when its command does (and the rest of it
        // with it), so a shell that returned at once could end the run before the bomb
        // reached the limit. The classic bomb's shells die the moment a fork is refused:
        // under gvisor, whose count of the tasks inside is sampled, such a peak is seen
        // only as the refused fork itself (docs/sandbox.md); the second bomb's shells
        // stay.
        "f() { f | f & }; f; sleep 60".to_owned(),
        "f() { f | f & sleep 60; }; f; sleep 60".to_owned(),
        format!("{PYTHON} -c 'import os, time\nwhile True:\n  try:\n    os.fork() or time.sleep(60)\n  except OSError: pass'"),
        format!("{PYTHON} -c 'import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(60,)).start()'"),
    ] {
        let out = rig.sandboxed(&p, &bomb).await;
        ended_by(&rig, &out, "processes", 151).await;
    }
    for hog in [
        format!("{PYTHON} -c 'x = bytearray(1 << 30)'"),
        // Pages of a private tmpfs count against the sandbox's memory too.
        "dd if=/dev/zero of=/tmp/fill bs=1M count=512".to_owned(),
    ] {
        let out = rig.sandboxed(&p, &hog).await;
        if said(&out).limits_by == "rlimits" {
            // Without a memory cgroup the address space is limited per process: the
            // allocation fails, the command ends by itself.
            assert_ne!(out.status, 0, "{out}");
        } else {
            ended_by(&rig, &out, "memory", 150).await;
        }
    }
}

/// The CPU-time limit ends a run with 152 (one busy process, or several sharing it), the
/// wall clock with 124 (even a command that ignores the signals).
pub(crate) async fn cpu_and_wall_clock(profile: &str) {
    let rig = Rig::start(None, &tight(profile)).await;
    let tight = format!("{profile}-tight");
    // One busy process, and four that share the run's CPU time between them.
    for burn in [
        "while :; do :; done",
        "for i in 1 2 3 4; do (while :; do :; done) & done; wait",
    ] {
        let out = rig.sandboxed(&tight, burn).await;
        ended_by(&rig, &out, "cpu_time", 152).await;
    }
    let out = rig
        .sandboxed(&format!("{profile}-brief"), "sleep 600")
        .await;
    ended_by(&rig, &out, "wall_clock", 124).await;
    // A command that ignores SIGTERM ends the same way.
    let out = rig
        .sandboxed(
            &format!("{profile}-brief"),
            "trap '' TERM INT HUP; sleep 600",
        )
        .await;
    ended_by(&rig, &out, "wall_clock", 124).await;
}

/// After a run that left processes behind every way a shell can, none remains; the cgroup,
/// the staging directory and the session are gone, and the run's record says so.
pub(crate) async fn nothing_remains(profile: &str) {
    let rig = Rig::start(None, "").await;
    // Processes left behind every way a shell can: in the background, in a new session,
    // ignoring hangups, and a daemon's double fork.
    let script =
        "sleep 300 & setsid sleep 301 & nohup sleep 302 >/dev/null 2>&1 & (sleep 303 &) ; \
                  echo \"UID=$(id -u)\"; echo \"PROXY=$HTTPS_PROXY\"; exit 0";
    let out = rig.sandboxed(profile, script).await;
    assert!(out.success(), "{out}");
    let said = said(&out);
    let uid: u32 = line_value(&out, "UID").parse().unwrap();
    assert_eq!(uid, said.uid);
    // A run of its own uid (`ostiary run` as root): no process has it any more.
    if uid != own_uid() {
        assert!(processes_of(uid).is_empty(), "{:?}", processes_of(uid));
    }
    for dir in &said.cgroups {
        assert!(!dir.exists(), "{} is left", dir.display());
    }
    assert!(!said.staging.exists(), "{} is left", said.staging.display());
    let staging = said.staging.display().to_string();
    assert_eq!(
        processes_naming(&staging),
        Vec::<String>::new(),
        "processes of the run are left"
    );
    let mut cleaned = vec!["processes", "cgroup", "staging", "session"];
    if said.cgroups.is_empty() {
        cleaned.retain(|s| *s != "cgroup");
    }
    assert_eq!(said.report["cleaned"], serde_json::json!(cleaned), "{out}");
    // The session is over: its token is refused by the proxy (through its TCP listener,
    // from the host).
    let inside = line_value(&out, "PROXY");
    let outside = inside.replace(
        &format!("127.0.0.1:{}", rig.server.proxy_addr.port()),
        &rig.server.proxy_addr.to_string(),
    );
    let refused = curl(
        &[
            "-x",
            &outside,
            "-w",
            "%{http_connect}",
            &rig.upstream.url("/echo"),
        ],
        &[],
    )
    .await;
    assert_eq!(refused.stdout.trim(), "407", "{refused}");
    let record = rig.run_record(&said.session).await;
    assert_eq!(record["run"]["exit"], 0, "{record}");
    assert_eq!(record["run"]["limit"], serde_json::Value::Null, "{record}");
    assert_eq!(record["run"]["profile"], profile, "{record}");
    assert!(
        record["run"]["cleaned"]
            .as_array()
            .is_some_and(|c| c.iter().any(|s| s == "session") && c.iter().any(|s| s == "processes")),
        "{record}"
    );
}

/// A file, a variable, a process or a token of a first run is not seen by a second.
pub(crate) async fn clean_slate(profile: &str) {
    let rig = Rig::start(None, "").await;
    let first = rig
        .sandboxed(
            profile,
            "echo left > /tmp/left-by-first; echo left > \"$HOME/left-by-first\"; echo left > left-by-first; \
             sleep 300 & setsid sleep 301 & export LEFT_BY_FIRST=1; \
             echo \"UID=$(id -u)\"; echo \"TOKEN=$HTTPS_PROXY\"",
        )
        .await;
    assert!(first.success(), "{first}");
    let second = rig
        .sandboxed(
            profile,
            "find /tmp \"$HOME\" . -maxdepth 1; ps -e -o pid=,args=; env; echo \"UID=$(id -u)\"; echo \"TOKEN=$HTTPS_PROXY\"",
        )
        .await;
    assert!(second.success(), "{second}");
    // What is there is listed (and `ps` sees the second run's own processes).
    assert!(second.stdout.lines().any(|l| l == "./data.txt"), "{second}");
    assert!(second.stdout.contains("ps -e"), "{second}");
    assert!(!second.stdout.contains("left-by-first"), "{second}");
    assert!(!second.stdout.contains("LEFT_BY_FIRST"), "{second}");
    assert!(!second.stdout.contains("sleep 30"), "{second}");
    let token = line_value(&first, "TOKEN");
    assert!(!second.stdout.contains(token), "{second}");
    assert_ne!(token, line_value(&second, "TOKEN"));
    if said(&first).uid != own_uid() {
        assert_ne!(
            said(&first).uid,
            said(&second).uid,
            "each run gets a uid of its own"
        );
    }
    assert!(!rig.work.path().join("left-by-first").exists());
}

/// A profile's limits and its env allowlist apply; `builtin` (`default` or `gvisor`) is the
/// built-in profile whose own limits are checked too: 1,024 open files, 512 processes, 1 h
/// of CPU time.
pub(crate) async fn limits_and_allowlist(builtin: &str) {
    let extra = format!(
        r#"
[sandbox]
env = ["PATH", "SHARED_VAR"]

[sandbox.profiles.{builtin}-tight]
isolation = "{isolation}"
processes = 32
open_files = 100
cpu_time = "2s"
env = ["PROFILE_VAR"]
"#,
        isolation = isolation_of(builtin)
    );
    let rig = Rig::start(None, &extra).await;
    let env = [
        ("SHARED_VAR", "shared"),
        ("PROFILE_VAR", "profiled"),
        ("UNLISTED_VAR", "unlisted"),
    ];
    let tight = format!("{builtin}-tight");
    let script = format!("{LIMITS}; env");
    let out = rig.sandboxed_with(&tight, &script, &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line_value(&out, "NOFILE"), "100", "{out}");
    // With a cgroup counting the run's CPU time, the per-process rlimit is a backstop 5 s
    // past it.
    let cpu = if said(&out).limits_by == "rlimits" {
        "2"
    } else {
        "7"
    };
    assert_eq!(line_value(&out, "CPU"), cpu, "{out}");
    assert!(out.stdout.contains("SHARED_VAR=shared"), "{out}");
    assert!(out.stdout.contains("PROFILE_VAR=profiled"), "{out}");
    assert!(!out.stdout.contains("UNLISTED_VAR"), "{out}");
    // The built-in profile passes [sandbox] env only.
    let out = rig.sandboxed_with(builtin, "env", &env).await;
    assert!(out.stdout.contains("SHARED_VAR=shared"), "{out}");
    assert!(!out.stdout.contains("PROFILE_VAR"), "{out}");
    let out = rig.sandboxed(builtin, LIMITS).await;
    assert!(out.success(), "{out}");
    assert_eq!(line_value(&out, "NOFILE"), "1024", "{out}");
    // RLIMIT_NPROC: the 512 processes, and the sandbox's own tasks where they share its
    // count; with a cgroup, a backstop clearly above `pids.max` (limits::NPROC_SLACK).
    let nproc: u64 = line_value(&out, "NPROC").parse().unwrap();
    assert!((512..=512 + 2 + 16).contains(&nproc), "{out}");
    let cpu: u64 = line_value(&out, "CPU").parse().unwrap();
    assert!((3600..=3605).contains(&cpu), "{out}");
    // Past the open-files limit calls fail, and the run goes on.
    let out = rig
        .sandboxed(builtin, &format!("{PYTHON} -c 'fs = []\ntry:\n  while True: fs.append(open(\"/dev/null\"))\nexcept OSError as e: print(\"EMFILE=%d\" % e.errno)'; echo after"))
        .await;
    assert!(out.success(), "{out}");
    assert_eq!(line_value(&out, "EMFILE"), "24", "{out}");
    assert!(out.stdout.contains("after"), "{out}");
}

/// SIGTERM to `ostiary run` reaches the command, which ends with its own exit code; the
/// teardown still runs.
pub(crate) async fn signals_reach_the_command(profile: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let rig = Rig::start(None, "").await;
    let mut cmd = tokio::process::Command::new(crate::support::cli::ostiary_bin());
    cmd.arg("--config")
        .arg(&rig.server.config)
        .args([
            "run",
            "-v",
            &format!("--sandbox={profile}"),
            "--agent",
            "demo",
            "--",
            "sh",
            "-c",
        ])
        .arg("trap 'echo got-term; exit 3' TERM; echo ready; sleep 600 & wait")
        .current_dir(rig.work.path())
        .env("OSTIARY_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(
        crate::support::sandbox::RUN_TIMEOUT,
        stdout.read_line(&mut line),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = tokio::time::timeout(
        crate::support::sandbox::RUN_TIMEOUT,
        child.wait_with_output(),
    )
    .await
    .unwrap()
    .unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await.unwrap();
    let out = CmdOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: format!("{line}{rest}"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(out.status, 3, "the command's own exit:\n{out}");
    assert!(out.stdout.contains("got-term"), "{out}");
    let said = said(&out);
    assert!(
        said.report["cleaned"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "session"),
        "{out}"
    );
    assert!(!said.staging.exists());
}
