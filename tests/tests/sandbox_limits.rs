//! `ostiary run --sandbox` under the `namespaces` level against a real `ostiary serve`:
//! limits end a run with their exit codes and the session's audit record says which; after
//! every run nothing of it remains and its session is torn down; two runs share nothing;
//! the operator's signals reach the command; and whatever keeps a sandbox from being made
//! stops the run before the command runs, never falling back to an unsandboxed one
//! (docs/sandbox.md). The checks that take a profile are in
//! `support/sandbox_limit_checks.rs` (`sandbox_gvisor.rs` runs them under `gvisor`).

use crate::support::sandbox as rig;
use crate::support::sandbox_limit_checks as limit_checks;

use limit_checks::{ended_by, tight};
use rig::{line_value, said, Rig, LIMITS, PYTHON};

const PROFILE: &str = "default";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bombs_and_memory_hogs_are_stopped_with_their_exit_codes() {
    limit_checks::memory_and_processes(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_and_wall_clock_limits_end_the_run() {
    limit_checks::cpu_and_wall_clock(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_limits_and_env_allowlist_apply() {
    limit_checks::limits_and_allowlist(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_run_nothing_of_it_remains_and_its_session_is_torn_down() {
    limit_checks::nothing_remains(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_share_nothing() {
    limit_checks::clean_slate(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_signals_reach_the_command_and_the_teardown_still_runs() {
    limit_checks::signals_reach_the_command(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_rlimits_only_a_fork_bomb_is_still_stopped() {
    let rig = Rig::start(
        None,
        &format!("[sandbox]\ncgroups = \"rlimits\"\n{}", tight("default")),
    )
    .await;
    let bomb = format!("{PYTHON} -c 'import os, time\nwhile True:\n  try:\n    os.fork() or time.sleep(60)\n  except OSError: pass'");
    let out = rig.sandboxed("default-tight", &bomb).await;
    assert_eq!(said(&out).limits_by, "rlimits", "{out}");
    ended_by(&rig, &out, "processes", 151).await;
    // Only rlimits: the address space is limited (64 MiB) where no cgroup limits memory.
    let out = rig.sandboxed("default-tight", LIMITS).await;
    assert!(out.success(), "{out}");
    assert_eq!(line_value(&out, "NOFILE"), "100", "{out}");
    assert_eq!(line_value(&out, "CPU"), "2", "{out}");
    assert_eq!(line_value(&out, "AS"), (64u64 << 20).to_string(), "{out}");
    // RLIMIT_NPROC is the limit: the 32 processes, and the init stage where it shares the
    // command's uid (a user-namespace run).
    let nproc: u64 = line_value(&out, "NPROC").parse().unwrap();
    assert!((32..=33).contains(&nproc), "{out}");
}

/// Whether the sandboxed `sh -c` whose script holds `marker` runs (not `ostiary run` or
/// the runner, whose command lines hold it too: their first argument is not `sh`).
fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| {
            let text = String::from_utf8_lossy(&cmdline);
            text.starts_with("sh\0-c\0") && text.contains(marker)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teardown_that_fails_is_retried_and_reported() {
    let rig = Rig::start(None, "").await;
    let go = tempfile::tempdir().unwrap();
    rig.append_config(&format!(
        "[sandbox.profiles.default]\nread_only = [{}, \"{}\"]",
        rig::SYSTEM,
        go.path().display()
    ));
    // The command waits for the test's word, by then the proxy is gone: the session
    // cannot be torn down.
    let marker = format!("teardown-marker-{}", std::process::id());
    let script = format!(
        "echo {marker} >/dev/null; until [ -e '{}/go' ]; do sleep 0.05; done; echo ran",
        go.path().display()
    );
    let run = rig.sandboxed(PROFILE, &script);
    let stop = async {
        tokio::time::timeout(rig::RUN_TIMEOUT, async {
            while !running(&marker) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the sandboxed command never started");
        let pid = rig.server.child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success());
        std::fs::write(go.path().join("go"), "").unwrap();
    };
    let (out, ()) = tokio::join!(run, stop);
    assert!(out.success(), "the command's own exit:\n{out}");
    assert!(out.stdout.contains("ran"), "{out}");
    assert!(
        out.stderr
            .contains("teardown: session failed (attempt 1 of 5)"),
        "{out}"
    );
    assert!(
        out.stderr
            .contains("teardown: session failed after 5 attempts"),
        "{out}"
    );
    let said = said(&out);
    let failed = said.report["failed"].as_array().unwrap();
    assert!(
        failed.len() == 1 && failed[0].as_str().unwrap().starts_with("session: "),
        "{out}"
    );
    // What could be cleaned still was.
    let mut cleaned = vec!["processes", "cgroup", "staging"];
    if said.cgroups.is_empty() {
        cleaned.retain(|s| *s != "cgroup");
    }
    assert_eq!(said.report["cleaned"], serde_json::json!(cleaned), "{out}");
}

/// An executable shell script `name` in `dir` that says `message` on stderr and fails, as
/// a tool does where the host refuses what it needs.
fn refusing(dir: &std::path::Path, name: &str, message: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho '{message}' >&2\nexit 1\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_keeps_a_sandbox_from_being_made_stops_the_run_before_the_command() {
    let tools = tempfile::tempdir().unwrap();
    let bwrap = refusing(
        tools.path(),
        "bwrap",
        "bwrap: No permissions to create new namespace",
    );
    let runsc = refusing(
        tools.path(),
        "runsc",
        "creating container: cannot set up the sandbox",
    );
    let extra = "[sandbox.profiles.small-copy]\nworkdir_copy_max = \"1KiB\"\n[sandbox.profiles.vm]\nisolation = \"gvisor\"\n";
    let rig = Rig::start(None, extra).await;
    let config = std::fs::read_to_string(&rig.server.config).unwrap();
    // `ostiary run` alone reads these; the running proxy keeps its own config.
    let with_sandbox = |toml: &str| {
        std::fs::write(&rig.server.config, format!("{config}\n[sandbox]\n{toml}\n")).unwrap();
    };
    std::fs::write(rig.work.path().join("big.bin"), vec![0u8; 4096]).unwrap();
    // Had the command run, the upstream would have seen it.
    let script = format!("curl -q -sS '{}'", rig.upstream.url("/echo?ran"));
    let refused = |profile: &'static str, needle: String| {
        let script = script.clone();
        let rig = &rig;
        async move {
            let flag = format!("--sandbox={profile}");
            let out = rig
                .run(
                    &["-v", &flag, "--agent", "demo", "--", "sh", "-c", &script],
                    &[],
                )
                .await;
            assert_eq!(out.status, 125, "{profile}:\n{out}");
            assert!(
                out.stderr.contains(&needle),
                "{profile} should say {needle:?}:\n{out}"
            );
            out
        }
    };
    refused("nope", "not a sandbox profile".into()).await;
    refused("small-copy", "workdir_copy_max".into()).await;
    // Each level's tool missing: said by name, with the package that has it.
    with_sandbox("bwrap = \"/nonexistent/bwrap\"\nrunsc = \"/nonexistent/runsc\"");
    refused("default", "apt-get install bubblewrap".into()).await;
    for profile in ["gvisor", "vm"] {
        refused(profile, "apt-get install runsc".into()).await;
    }
    // Each level's tool refused by the host: the run stops before the command, with what
    // the tool said, and the session is torn down all the same.
    with_sandbox(&format!(
        "bwrap = \"{}\"\nrunsc = \"{}\"",
        bwrap.display(),
        runsc.display()
    ));
    for (profile, said_by_tool) in [
        ("default", "No permissions to create new namespace"),
        ("gvisor", "cannot set up the sandbox"),
    ] {
        let out = refused(profile, "the command did not run".into()).await;
        assert!(out.stderr.contains(said_by_tool), "{out}");
        let report = &said(&out).report;
        assert_eq!(report["started"], false, "{out}");
        assert!(
            report["cleaned"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "session"),
            "{out}"
        );
    }
    // A forced cgroup mechanism this host does not offer.
    with_sandbox("cgroups = \"v2\"");
    let out = rig
        .run(
            &[
                "-v",
                "--sandbox",
                "--agent",
                "demo",
                "--",
                "sh",
                "-c",
                &script,
            ],
            &[],
        )
        .await;
    if out.status == 125 {
        assert!(out.stderr.contains("cgroups = \"v2\""), "{out}");
    } else {
        // A host that delegates cgroup v2 runs it under v2, as asked.
        assert_eq!(said(&out).limits_by, "cgroup-v2", "{out}");
    }
    let ran = if out.status == 125 { 0 } else { 1 };
    assert_eq!(
        rig.upstream.count("/echo"),
        ran,
        "a refused run never ran its command"
    );
}
