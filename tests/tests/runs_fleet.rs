//! Runs on several replicas sharing PostgreSQL and Redis (docs/runs.md): the fleet harness
//! with triggers.
//!
//! What it proves:
//! - one event sent to two replicas at once (the same deduplication key) starts one run (the
//!   key and the run are one transaction of the shared store), which runs once;
//! - a replica killed for good while a run of it was going loses the run to no one: another
//!   replica ends it as `killed` once its lease has run out (its process died with its
//!   replica), ends its session, and runs the next attempt itself.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fleet::Fleet;
use crate::support::runs::{processes_with, unique_token, Marks};
use ostiary_e2e::upstream::Upstream;

/// The triggers, writing to the marks directory.
fn extra(marks: &Marks, token: &str) -> String {
    let dir = marks.dir().display();
    format!(
        r#"
[runs]
dir = "{runs}"
lease = "2s"
stop_grace = "1s"

[[trigger]]
name = "event"
kind = "api"
agent = "ci-bot"
profile = "none"
dedup = {{ pointer = "/id", window = "1h" }}
command = ["sh", "-c", '''echo "$OSTIARY_RUN_ID" >> "{dir}/event.runs"''']

[[trigger]]
name = "slow"
kind = "api"
agent = "ci-bot"
profile = "none"
retry = {{ attempts = 2, backoff = "100ms" }}
command = ["sh", "-c", '''echo "$OSTIARY_RUN_ID $$" >> "{dir}/slow.starts"; exec sleep 60.{token}''']
"#,
        runs = marks.dir().join("runs").display(),
    )
}

async fn fleet(marks: &Marks, token: &str) -> (Upstream, Fleet) {
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let fleet = Fleet::start(&upstream, 2, &extra(marks, token), None, None).await;
    (upstream, fleet)
}

async fn run_of(fleet: &Fleet, i: usize, id: &str) -> Value {
    fleet.control(i).run(id).await.unwrap()
}

/// Run `id` (seen through replica `i`) once `ready` holds for it.
async fn wait_run(
    fleet: &Fleet,
    i: usize,
    id: &str,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let run = run_of(fleet, i, id).await;
        if ready(&run) {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {run:#}\n{}\n{}",
            fleet.log(0),
            fleet.log(1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_sent_to_two_replicas_starts_one_run() {
    let marks = Marks::new();
    let (_upstream, fleet) = fleet(&marks, &unique_token()).await;
    let (c0, c1) = (fleet.control(0), fleet.control(1));
    let event = json!({"id": "event-shared-1"});
    let (a, b) = tokio::join!(
        c0.start_run("event", event.clone()),
        c1.start_run("event", event)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut duplicates = [a["duplicate"] == true, b["duplicate"] == true];
    duplicates.sort();
    assert_eq!(duplicates, [false, true], "{a}\n{b}");
    assert_eq!(a["run_id"], b["run_id"], "{a}\n{b}");
    let id = a["run_id"].as_str().unwrap().to_owned();
    wait_run(&fleet, 1, &id, "the run succeeds", |r| {
        r["status"] == "succeeded"
    })
    .await;
    // Once: whichever replica ran it, nobody else did.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(marks.lines("event.runs"), [id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_replicas_run_is_taken_over_once_its_lease_runs_out() {
    let marks = Marks::new();
    let token = unique_token();
    let (_upstream, mut fleet) = fleet(&marks, &token).await;
    let started = fleet.control(0).start_run("slow", json!({})).await.unwrap();
    let id = started["run_id"].as_str().unwrap().to_owned();
    let running = wait_run(&fleet, 0, &id, "the run starts", |r| {
        r["status"] == "running" && r["session"].is_string()
    })
    .await;
    let holder = running["holder"].as_str().unwrap().to_owned();
    let lost = fleet
        .replicas
        .iter()
        .position(|r| r.name == holder)
        .unwrap_or_else(|| panic!("holder {holder} is no replica"));
    let other = 1 - lost;
    let first_session = running["session"].as_str().unwrap().to_owned();
    marks
        .wait_lines("slow.starts", 1, "the first attempt's start")
        .await;

    // The holder dies for good; its run's process goes with it.
    fleet.replicas[lost].child.kill().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !processes_with(&token).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first attempt outlived its replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The other replica takes over after the lease: killed, then tried again by itself.
    let retried = wait_run(&fleet, other, &id, "the second attempt", |r| {
        r["status"] == "running" && r["attempt"] == 2
    })
    .await;
    assert_eq!(
        retried["holder"],
        fleet.replicas[other].name.as_str(),
        "{retried:#}"
    );
    assert!(
        retried["dead_letter"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("stopped renewing its lease"),
        "{retried:#}"
    );
    // The lost attempt's session was ended by the replica that took over.
    let (status, shown) = crate::support::fleet::control_get(
        fleet.replicas[other].control_addr,
        &format!("/v1/sessions/{first_session}"),
        Some(&fleet.token),
    )
    .await;
    assert_eq!(
        status, 404,
        "the lost attempt's session is still active: {shown}"
    );
    let starts = marks
        .wait_lines("slow.starts", 2, "the second attempt's start")
        .await;
    assert_eq!(starts.len(), 2, "{starts:?}");

    let cancelled = fleet.control(other).cancel_run(&id).await.unwrap();
    assert_eq!(cancelled["run_id"], id.as_str());
    wait_run(&fleet, other, &id, "the cancel", |r| {
        r["status"] == "cancelled"
    })
    .await;
    crate::support::runs::kill_leftovers(&token);
}
