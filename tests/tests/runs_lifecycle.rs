//! A run's life after its trigger fired, against the real `ostiary serve`: retries, limits,
//! cancellation, an operator's retry, and a `kill -9` of the proxy.
//!
//! What it proves:
//! - a run that fails (exit 3) with `retry = { attempts = 3, backoff = "200ms" }` runs three
//!   times (attempts 1, 2, 3, the waits between them at least the backoff, doubling) and ends
//!   `failed` with a dead letter that holds its stderr's end and its session's records;
//!   `runs list --dead-letters` lists it;
//! - a run past its `wall_clock` ends `limit_exceeded` (`wall_clock`) with a dead letter, and
//!   its process is gone — unsandboxed and in a sandbox;
//! - a queued run cancelled ends `cancelled` without ever running; a running run cancelled
//!   is stopped (its process gone) and ends `cancelled` — unsandboxed and in a sandbox;
//! - `runs retry` queues a dead-lettered run again, and it runs again;
//! - after `kill -9` of the proxy with one run going and one queued, the next start ends the
//!   one that was going as `killed` (its process died with the proxy), runs the queued one
//!   exactly once, and loses none — unsandboxed and in a sandbox; its session is ended;
//! - a clean stop (SIGTERM) of the proxy with a run going stops the run, records it `killed`
//!   and exits promptly — unsandboxed and in a sandbox.
//!
//! A process is found by a word only this test writes in its command line (`sleep
//! 30.<word>`), which `ostiary run` and the sandbox's processes carry too.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cli::{ostiary, spawn_serve};
use crate::support::runs::*;

/// How long a stopped run's processes may take to be gone: the runner's `stop_grace`
/// (1 s in these rigs) and a margin.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// `[[trigger]]` of kind `api`, agent `demo`, with `profile` and `command` (a shell script),
/// and `extra` lines.
fn api_trigger(name: &str, profile: &str, script: &str, extra: &str) -> String {
    format!(
        r#"
[[trigger]]
name = "{name}"
kind = "api"
agent = "demo"
profile = "{profile}"
command = ["sh", "-c", '''{script}''']
{extra}
"#
    )
}

/// Waits until a `sleep` carrying `token` runs: the run's command is going.
async fn wait_for_sleep(rig: &RunsRig, token: &str) {
    let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
    loop {
        let found = processes_with(token);
        if found.iter().any(|(_, line)| line.starts_with("sleep ")) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run's command never started: {found:?}\n{}",
            rig.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Run `id` once it has ended, within `within`; else the test fails saying so and naming the
/// run's processes still alive (found by `token`), which are then killed.
async fn ended_within(rig: &RunsRig, id: &str, token: &str, within: Duration, why: &str) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let run = rig.run(id).await;
        if !matches!(run["status"].as_str(), Some("queued" | "running")) {
            return run;
        }
        if tokio::time::Instant::now() >= deadline {
            let alive = processes_with(token);
            kill_leftovers(token);
            panic!(
                "{why}, but the run is still {} {within:?} later; its processes alive: {alive:?}\n{run:#}",
                run["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_run_is_retried_with_backoff_then_dead_lettered() {
    let marks = Marks::new();
    let m = marks.dir().display();
    let script = format!(
        r#"date +%s%3N >> "{m}/attempts"; curl -q -sS -o /dev/null -w '%{{http_code}}\n' "@UPSTREAM@/echo?run=$OSTIARY_RUN_ID" >> "{m}/codes"; echo "flaky-stderr-marker: giving up" >&2; exit 3"#
    );
    let triggers = api_trigger(
        "flaky",
        "none",
        &script,
        r#"retry = { attempts = 3, backoff = "200ms" }"#,
    );
    let rig = RunsRig::start(&triggers).await;
    let id = rig.start_run("flaky", json!({"task": "fail"})).await;
    let run = rig
        .wait_run(&id, "the run ends", |r| {
            r["status"] != "queued" && r["status"] != "running"
        })
        .await;
    assert_eq!(run["status"], "failed", "{run:#}");
    assert_eq!(run["attempt"], 3, "{run:#}");
    assert_eq!(run["exit_code"], 3, "{run:#}");
    assert_eq!(run["error"], "the command exited with 3", "{run:#}");

    // Three attempts, each through the proxy, the waits between them the backoff, doubled.
    let at: Vec<i64> = marks
        .lines("attempts")
        .iter()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(at.len(), 3, "{at:?}");
    assert!(
        at[1] - at[0] >= 200,
        "the first retry came after {} ms",
        at[1] - at[0]
    );
    assert!(
        at[2] - at[1] >= 400,
        "the second retry came after {} ms",
        at[2] - at[1]
    );
    assert_eq!(marks.lines("codes"), ["200", "200", "200"]);
    let records = rig
        .run_records(|r| {
            r.iter()
                .filter(|r| r["run"]["run_id"] == id.as_str() && r["run"]["status"] == "running")
                .count()
                >= 3
        })
        .await;
    let attempts: Vec<&Value> = records
        .iter()
        .filter(|r| r["run"]["run_id"] == id.as_str() && r["run"]["status"] == "running")
        .map(|r| &r["run"]["attempt"])
        .collect();
    assert_eq!(attempts, [&json!(1), &json!(2), &json!(3)], "{records:#?}");

    // The dead letter: the stderr's end and the last session's records, its request included.
    let letter = &run["dead_letter"];
    assert!(letter.is_object(), "no dead letter: {run:#}");
    assert_eq!(letter["run_id"], id.as_str(), "{letter:#}");
    assert_eq!(letter["exit_code"], 3, "{letter:#}");
    assert!(
        letter["stderr_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("flaky-stderr-marker: giving up"),
        "{letter:#}"
    );
    assert!(
        run["stderr_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("flaky-stderr-marker"),
        "{run:#}"
    );
    let session = run["session"].as_str().unwrap();
    let kept = letter["records"].as_array().unwrap();
    assert!(
        kept.iter()
            .any(|r| r["session"] == session && r["path"] == "/echo" && r["decision"] == "allow"),
        "the dead letter lacks the session's request: {letter:#}"
    );

    // Listed among the dead letters (and only it: nothing else ran).
    let listed = rig.cli_json(&["runs", "list", "--dead-letters"]).await;
    let ids: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()], "{listed:#}");
    let config = rig.server.config_arg();
    let table = ostiary(&["--config", &config, "runs", "list", "--dead-letters"]).await;
    assert!(table.success(), "{table}");
    assert!(
        table.stdout.contains(&id) && table.stdout.contains("failed"),
        "{table}"
    );
    rig.server.stop().await;
}

/// A run sleeping 30 s under `wall_clock = "2s"` with `profile`.
async fn the_wall_clock_ends_a_run(profile: &str) {
    let token = unique_token();
    let triggers = api_trigger(
        "sleepy",
        profile,
        &format!("exec sleep 30.{token}"),
        r#"wall_clock = "2s""#,
    );
    let rig = RunsRig::start(&triggers).await;
    let id = rig.start_run("sleepy", json!({})).await;
    wait_for_sleep(&rig, &token).await;
    // The wall clock, the stop grace (1 s) and a margin.
    let run = ended_within(
        &rig,
        &id,
        &token,
        Duration::from_secs(10),
        "the run's wall clock is 2 s",
    )
    .await;
    let left = gone_within(&token, GONE_WITHIN).await;
    kill_leftovers(&token);
    assert_eq!(run["status"], "limit_exceeded", "{run:#}\n{}", rig.log());
    assert_eq!(run["limit"], "wall_clock", "{run:#}");
    let took = run["ended_ms"].as_i64().unwrap() - run["started_ms"].as_i64().unwrap();
    assert!(
        (2000..15_000).contains(&took),
        "the run took {took} ms: {run:#}"
    );
    let letter = &run["dead_letter"];
    assert_eq!(letter["limit"], "wall_clock", "{run:#}");
    assert_eq!(letter["limits"]["wall_clock_secs"], 2, "{run:#}");
    assert!(
        left.is_empty(),
        "the run ended {} but its processes are still running {GONE_WITHIN:?} later: {left:?}",
        run["status"]
    );
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_wall_clock_is_stopped_and_dead_lettered() {
    the_wall_clock_ends_a_run("none").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_run_past_its_wall_clock_is_stopped_and_dead_lettered() {
    crate::support::sandbox::require_sandbox();
    the_wall_clock_ends_a_run("default").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_cancelled_never_runs() {
    let marks = Marks::new();
    let m = marks.dir().display();
    // The slow run holds the runner (concurrency 1) until the test leaves `release`.
    let triggers = format!(
        "{}{}",
        api_trigger(
            "slow",
            "none",
            &format!(
                r#"echo "$OSTIARY_RUN_ID" >> "{m}/slow.started"; while [ ! -e "{m}/release" ]; do sleep 0.05; done"#
            ),
            ""
        ),
        api_trigger(
            "quick",
            "none",
            &format!(r#"echo "$OSTIARY_RUN_ID" >> "{m}/quick.ran""#),
            ""
        ),
    );
    let rig = RunsRig::start_with(
        &triggers,
        Options {
            concurrency: Some(1),
            ..Options::default()
        },
    )
    .await;
    let slow = rig.start_run("slow", json!({})).await;
    marks
        .wait_lines("slow.started", 1, "the slow run starts")
        .await;
    let queued = rig.start_run("quick", json!({})).await;
    assert_eq!(rig.run(&queued).await["status"], "queued");

    let cancelled = rig.cli_json(&["runs", "cancel", &queued]).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    // Cancelling it again: it has ended.
    let config = rig.server.config_arg();
    let again = ostiary(&["--config", &config, "runs", "cancel", &queued]).await;
    assert_eq!(again.status, 1, "{again}");
    assert!(again.stderr.contains("already ended"), "{again}");

    // The runner moves on: the slow run ends, a new quick run runs; had the cancelled one
    // been started, it would have been first (the oldest queued run starts first).
    std::fs::write(marks.path("release"), "").unwrap();
    rig.wait_status(&slow, "succeeded").await;
    let after = rig.start_run("quick", json!({})).await;
    rig.wait_status(&after, "succeeded").await;
    assert_eq!(marks.lines("quick.ran"), [after]);
    let run = rig.run(&queued).await;
    assert_eq!(run["status"], "cancelled", "{run:#}");
    assert_eq!(run["attempt"], 0, "{run:#}");
    assert!(run["started_ms"].is_null(), "{run:#}");
    assert!(run["session"].is_null(), "{run:#}");
    rig.server.stop().await;
}

/// A run of `profile` sleeping 30 s, cancelled while it runs.
async fn cancelling_stops_a_running_run(profile: &str) {
    let token = unique_token();
    let triggers = api_trigger("slow", profile, &format!("exec sleep 30.{token}"), "");
    let rig = RunsRig::start(&triggers).await;
    let id = rig.start_run("slow", json!({})).await;
    rig.wait_status(&id, "running").await;
    wait_for_sleep(&rig, &token).await;

    let asked = rig.cli_json(&["runs", "cancel", &id]).await;
    assert_eq!(asked["cancel_requested"], true, "{asked:#}");
    // The stop grace (1 s) and a margin.
    let run = ended_within(
        &rig,
        &id,
        &token,
        Duration::from_secs(8),
        "the run was cancelled",
    )
    .await;
    let left = gone_within(&token, GONE_WITHIN).await;
    kill_leftovers(&token);
    assert_eq!(run["status"], "cancelled", "{run:#}\n{}", rig.log());
    let took = run["ended_ms"].as_i64().unwrap() - run["started_ms"].as_i64().unwrap();
    assert!(took < 15_000, "the run took {took} ms to stop: {run:#}");
    assert!(
        left.is_empty(),
        "the run ended cancelled but its processes are still running {GONE_WITHIN:?} later: {left:?}"
    );
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_cancelled_is_stopped() {
    cancelling_stops_a_running_run("none").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_running_run_cancelled_is_stopped() {
    crate::support::sandbox::require_sandbox();
    cancelling_stops_a_running_run("default").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_retry_runs_a_dead_lettered_run_again() {
    let marks = Marks::new();
    let m = marks.dir().display();
    // Fails until the test leaves `fixed` in the marks.
    let script = format!(
        r#"echo "$OSTIARY_RUN_ID" >> "{m}/ran"; test -e "{m}/fixed" || {{ echo "not fixed yet" >&2; exit 3; }}"#
    );
    let rig = RunsRig::start(&api_trigger("once", "none", &script, "")).await;
    let id = rig.start_run("once", json!({"n": 1})).await;
    let run = rig.wait_status(&id, "failed").await;
    assert_eq!(run["attempt"], 1, "{run:#}");
    assert!(run["dead_letter"].is_object(), "{run:#}");

    std::fs::write(marks.path("fixed"), "").unwrap();
    let retried = rig.cli_json(&["runs", "retry", &id]).await;
    assert_eq!(retried["run_id"], id.as_str(), "{retried:#}");
    assert_eq!(retried["status"], "queued", "{retried:#}");
    let run = rig.wait_status(&id, "succeeded").await;
    assert_eq!(run["attempt"], 2, "{run:#}");
    assert_eq!(run["payload"], json!({"n": 1}), "{run:#}");
    assert_eq!(marks.lines("ran"), [id.clone(), id.clone()]);

    // Nothing to retry: an unknown run, and (through the API) a run that has not ended.
    let config = rig.server.config_arg();
    let out = ostiary(&[
        "--config",
        &config,
        "runs",
        "retry",
        "run_00000000000000000000",
    ])
    .await;
    assert_eq!(out.status, 1, "{out}");
    assert_eq!(rig.runs("").await.len(), 1);
    rig.server.stop().await;
}

/// `kill -9` of the proxy with a run of `profile` going and one queued behind it.
async fn a_kill_9_loses_no_run(profile: &str) {
    let token = unique_token();
    let triggers = format!(
        "{}{}",
        api_trigger("slow", profile, &format!("exec sleep 30.{token}"), ""),
        api_trigger(
            "after",
            profile,
            r#"curl -q -sS -f -o /dev/null "@UPSTREAM@/echo?run=$OSTIARY_RUN_ID""#,
            ""
        ),
    );
    let mut rig = RunsRig::start_with(
        &triggers,
        Options {
            concurrency: Some(1),
            tls: true,
            ..Options::default()
        },
    )
    .await;
    let slow = rig.start_run("slow", json!({})).await;
    rig.wait_status(&slow, "running").await;
    wait_for_sleep(&rig, &token).await;
    let queued = rig.start_run("after", json!({})).await;
    assert_eq!(rig.run(&queued).await["status"], "queued");

    // kill -9: what the slow run was running dies with the proxy.
    rig.server.child.kill().await.unwrap();
    let survivors = gone_within(&token, GONE_WITHIN).await;
    kill_leftovers(&token);

    let (config, log, control) = (
        rig.server.config.clone(),
        rig.server.log.clone(),
        rig.server.control_addr,
    );
    rig.server.child = spawn_serve(Some(&config), None, &log, "info");
    rig.server.wait_healthy(control).await.unwrap();
    let killed = rig.wait_status(&slow, "killed").await;
    assert_eq!(killed["attempt"], 1, "{killed:#}");
    assert!(killed["dead_letter"].is_object(), "{killed:#}");
    assert!(
        killed["error"]
            .as_str()
            .unwrap_or_default()
            .contains("the proxy stopped"),
        "{killed:#}"
    );
    let ran = rig.wait_status(&queued, "succeeded").await;
    assert_eq!(ran["attempt"], 1, "{ran:#}");
    // Nothing else is left to run, and the queued run ran once.
    let runs = rig.runs("").await;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert!(
        runs.iter()
            .all(|r| r["status"] == "killed" || r["status"] == "succeeded"),
        "{runs:#?}"
    );
    let hits = rig
        .upstream
        .seen_path("/echo")
        .iter()
        .filter(|s| s.path.ends_with(&format!("run={queued}")))
        .count();
    assert_eq!(hits, 1, "the queued run ran {hits} times");

    // What the killed run had is gone: its processes, and its session.
    let mut left = Vec::new();
    if !survivors.is_empty() {
        left.push(format!(
            "its processes are still alive {GONE_WITHIN:?} after the proxy was killed: {survivors:?}"
        ));
    }
    let session = killed["session"].as_str().unwrap();
    let shown = rig
        .call(
            "GET",
            &format!("/v1/sessions/{session}"),
            Some(&rig.admin),
            None,
        )
        .await;
    if shown.status.as_u16() != 404 {
        left.push(format!(
            "its session {session} is still active after the run was recorded killed: {shown}"
        ));
    }
    assert!(
        left.is_empty(),
        "the killed run {slow}: {}",
        left.join("; ")
    );
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_the_running_run_is_killed_and_the_queued_one_runs_once() {
    a_kill_9_loses_no_run("none").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_a_sandboxed_running_run_is_killed_and_the_queued_one_runs_once() {
    crate::support::sandbox::require_sandbox();
    a_kill_9_loses_no_run("default").await;
}

/// SIGTERM to the proxy with a run of `profile` going: the run is stopped and recorded
/// `killed` before the proxy exits, which it does promptly.
async fn a_clean_stop_ends_the_running_run(profile: &str) {
    let token = unique_token();
    let triggers = api_trigger("slow", profile, &format!("exec sleep 30.{token}"), "");
    let mut rig = RunsRig::start(&triggers).await;
    let id = rig.start_run("slow", json!({})).await;
    rig.wait_status(&id, "running").await;
    wait_for_sleep(&rig, &token).await;

    let pid = rig.server.child.id().unwrap().to_string();
    let sent = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(sent.success());
    // The stop grace (1 s), the listeners' drain, and a margin.
    let within = Duration::from_secs(12);
    let exited = tokio::time::timeout(within, rig.server.child.wait()).await;
    let alive = processes_with(&token);
    if exited.is_err() {
        kill_leftovers(&token);
        let _ = tokio::time::timeout(Duration::from_secs(30), rig.server.child.wait()).await;
        panic!(
            "ostiary serve did not exit within {within:?} of SIGTERM with a run going; the run's processes alive: {alive:?}\n{}",
            rig.log()
        );
    }
    assert!(exited.unwrap().unwrap().success(), "{}", rig.log());

    let (config, log, control) = (
        rig.server.config.clone(),
        rig.server.log.clone(),
        rig.server.control_addr,
    );
    rig.server.child = spawn_serve(Some(&config), None, &log, "info");
    rig.server.wait_healthy(control).await.unwrap();
    let run = rig.run(&id).await;
    kill_leftovers(&token);
    assert_eq!(run["status"], "killed", "{run:#}");
    assert!(run["dead_letter"].is_object(), "{run:#}");
    assert!(
        alive.is_empty(),
        "the proxy exited, but the run's processes are still alive: {alive:?}"
    );
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_of_the_proxy_ends_a_running_run_as_killed() {
    a_clean_stop_ends_the_running_run("none").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_of_the_proxy_ends_a_sandboxed_running_run_as_killed() {
    crate::support::sandbox::require_sandbox();
    a_clean_stop_ends_the_running_run("default").await;
}
