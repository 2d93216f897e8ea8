//! Runs on several replicas sharing PostgreSQL and Redis (docs/runs.md): the fleet harness
//! with triggers.
//!
//! What it proves:
//! - one event sent to two replicas at once (the same deduplication key) starts one run (the
//!   key and the run are one transaction of the shared store), which runs once;
//! - a replica killed for good while a run of it was going loses the run to no one: another
//!   replica ends it as `killed` once its lease has run out (its process died with its
//!   replica), ends its session, and runs the next attempt itself;
//! - a schedule every second whose runs take longer, `forbid` or `queue`, never has two runs
//!   at once on the two replicas, also as one stops and the other takes its schedules and
//!   queue over: not by the runs' records in the store, not by what the runs themselves
//!   wrote as they started and ended;
//! - a trigger's rate is one for the fleet: calls split between two replicas are admitted
//!   up to the rate in all, and a duplicate of an admitted call is still answered as one.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fleet::{api_status, Fleet};
use crate::support::runs::{alive, kill_leftovers, processes_with, unique_token, Marks};
use ostiary_e2e::upstream::Upstream;

/// The triggers, writing to the marks directory.
fn extra(marks: &Marks, token: &str) -> String {
    let dir = marks.dir().display();
    runs_then(
        marks,
        &format!(
            r#"
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
"#
        ),
    )
}

/// `[runs]` as every fleet here has it, then `triggers`.
fn runs_then(marks: &Marks, triggers: &str) -> String {
    format!(
        r#"
[runs]
dir = "{runs}"
lease = "2s"
stop_grace = "1s"
{triggers}"#,
        runs = marks.dir().join("runs").display(),
    )
}

/// Two schedules ticking every second whose runs take a second and a half, writing when
/// they start and end: `tidy` skips a tick while its run goes (`forbid`), `drain` queues it
/// (`queue`).
fn schedules(marks: &Marks, token: &str) -> String {
    let dir = marks.dir().display();
    let schedule = |name: &str, concurrency: &str| {
        format!(
            r#"
[[trigger]]
name = "{name}"
kind = "schedule"
cron = "* * * * * *"
concurrency = "{concurrency}"
agent = "ci-bot"
profile = "none"
command = ["sh", "-c", '''echo "start $OSTIARY_RUN_ID" >> "{dir}/{name}.marks"; sleep 1.5{token}; echo "end $OSTIARY_RUN_ID" >> "{dir}/{name}.marks"''']
"#
        )
    };
    runs_then(
        marks,
        &format!(
            "{}{}",
            schedule("tidy", "forbid"),
            schedule("drain", "queue")
        ),
    )
}

/// An API trigger of three runs an hour (none comes back during the test), deduplicated on
/// the payload's `id`.
fn rated(marks: &Marks) -> String {
    runs_then(
        marks,
        r#"
[[trigger]]
name = "rated"
kind = "api"
agent = "ci-bot"
profile = "none"
rate = "3/h"
dedup = { pointer = "/id", window = "1h" }
command = ["true"]
"#,
    )
}

async fn fleet(marks: &Marks, token: &str) -> (Upstream, Fleet) {
    fleet_of(&extra(marks, token)).await
}

async fn fleet_of(extra: &str) -> (Upstream, Fleet) {
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let fleet = Fleet::start(&upstream, 2, extra, None, None).await;
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

    // The holder dies for good; its run's processes go with it. Those of the first attempt,
    // by pid: the second may start on the other replica (same command, same token) before a
    // loaded machine has reaped them all.
    let first_attempt = processes_with(&token);
    assert!(!first_attempt.is_empty(), "the first attempt runs nothing");
    fleet.replicas[lost].child.kill().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while first_attempt.iter().any(|(pid, _)| alive(*pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first attempt outlived its replica: {first_attempt:?}"
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

/// A trigger that starts nothing by itself: the runs' parts are made at start only when the
/// config has triggers.
const IDLE: &str = r#"
[[trigger]]
name = "idle"
kind = "api"
agent = "ci-bot"
profile = "none"
command = ["true"]
"#;

/// Replica `i` reads its config again, written from the fleet's `extra` as it is now
/// (`POST /v1/policy/reload`, as `SIGHUP` does).
async fn reload(fleet: &Fleet, i: usize) {
    let replica = &fleet.replicas[i];
    let home = fleet.dir.path().join(&replica.name);
    let config = fleet.config_text(&home, replica.proxy_addr, replica.control_addr);
    std::fs::write(home.join("ostiary.toml"), config).unwrap();
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/policy/reload", replica.control_addr))
        .bearer_auth(&fleet.token)
        .header("content-type", "application/json")
        .body("{}")
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("the control listener answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{}: {text}", replica.name);
}

/// The runs of `trigger` seen through replica `i` that have started, in the order they did.
async fn started_runs(fleet: &Fleet, i: usize, trigger: &str) -> Vec<Value> {
    let runs = fleet
        .control(i)
        .runs(None, Some(trigger), false, Some(1000))
        .await
        .unwrap();
    let mut started: Vec<Value> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["started_ms"].is_i64())
        .cloned()
        .collect();
    started.sort_by_key(|r| r["started_ms"].as_i64());
    started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_at_a_time_schedule_never_runs_twice_at_once_across_replicas() {
    let marks = Marks::new();
    let token = unique_token();
    // Both replicas up before anything is audited (a replica joining a chain that already
    // has records, without its checkpoint, refuses to start): the schedules come by a reload.
    let idle = runs_then(&marks, IDLE);
    let (_upstream, mut fleet) = fleet_of(&idle).await;
    fleet.extra = fleet.extra.replace(&idle, &schedules(&marks, &token));
    for i in 0..2 {
        reload(&fleet, i).await;
    }
    let names = ["tidy", "drain"];
    // Two runs of each, on whichever replica ticks the schedules (it is woken first).
    for name in names {
        marks
            .wait_lines(&format!("{name}.marks"), 4, &format!("two runs of {name}"))
            .await;
    }
    // That replica stops (its run going ends as killed, its schedules are released): the
    // other takes the queue, then the schedules, over.
    let ticker = started_runs(&fleet, 0, "tidy").await[0]["holder"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = fleet
        .replicas
        .iter()
        .position(|r| r.name == ticker)
        .unwrap();
    let other = 1 - first;
    let replica = &mut fleet.replicas[first];
    crate::support::cli::terminate(&mut replica.child, &replica.log).await;
    // A run of the other replica started after the stop: the two before it may already have
    // been one on each replica, when the other took a queued run first.
    let stopped_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    for name in names {
        loop {
            let runs = started_runs(&fleet, other, name).await;
            let theirs = |r: &&Value| r["holder"] == fleet.replicas[other].name.as_str();
            if runs
                .iter()
                .filter(theirs)
                .any(|r| r["status"] == "succeeded" && r["started_ms"].as_i64() > Some(stopped_ms))
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: no run of the other replica: {runs:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for name in names {
        let started = started_runs(&fleet, other, name).await;
        let shown: Vec<String> = started
            .iter()
            .map(|r| {
                format!(
                    "{} {} on {}: {}..{}",
                    r["run_id"], r["status"], r["holder"], r["started_ms"], r["ended_ms"]
                )
            })
            .collect();
        for replica in &fleet.replicas {
            assert!(
                started.iter().any(|r| r["holder"] == replica.name.as_str()),
                "{name}: no run on {}: {shown:#?}",
                replica.name
            );
        }
        // As recorded: each run ended before the next started, whichever replica ran it.
        for pair in started.windows(2) {
            let ended = pair[0]["ended_ms"].as_i64();
            let next = pair[1]["started_ms"].as_i64().unwrap();
            assert!(
                ended.is_some_and(|ended| ended <= next),
                "{name}: two runs overlapped: {shown:#?}"
            );
        }
        // As the runs themselves wrote it: each end right after its own start, nothing
        // started between (a run stopped with its replica wrote no end).
        let lines = marks.lines(&format!("{name}.marks"));
        for (i, line) in lines.iter().enumerate() {
            if let Some(run) = line.strip_prefix("end ") {
                assert_eq!(
                    lines[i - 1],
                    format!("start {run}"),
                    "{name}: {lines:#?}\n{shown:#?}"
                );
            }
        }
        let ends = lines.iter().filter(|l| l.starts_with("end ")).count();
        assert!(ends >= 3, "{name}: {lines:#?}\n{shown:#?}");
    }
    drop(fleet);
    kill_leftovers(&token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_triggers_rate_is_one_for_the_whole_fleet() {
    let marks = Marks::new();
    let (_upstream, fleet) = fleet_of(&rated(&marks)).await;
    // Eight distinct events at once, four through each replica: three runs an hour in all.
    let calls = (0..8).map(|i| {
        let control = fleet.control(i % 2);
        async move {
            let outcome = control
                .start_run("rated", json!({"id": format!("event-{i}")}))
                .await;
            (i, outcome)
        }
    });
    let mut admitted = Vec::new();
    let mut limited = 0;
    for (i, outcome) in futures_util::future::join_all(calls).await {
        match outcome {
            Ok(body) => {
                assert_eq!(body["duplicate"], false, "{body}");
                admitted.push((i, body["run_id"].as_str().unwrap().to_owned()));
            }
            Err(e) => {
                assert_eq!(api_status(&e), 429, "{e}");
                limited += 1;
            }
        }
    }
    assert_eq!((admitted.len(), limited), (3, 5), "{admitted:?}");
    // Spent for both replicas.
    for i in 0..2 {
        let refused = fleet
            .control(i)
            .start_run("rated", json!({"id": format!("late-{i}")}))
            .await
            .unwrap_err();
        assert_eq!(api_status(&refused), 429, "{refused}");
    }
    // A duplicate of an admitted event is answered as one by either replica, rate or not.
    let (first, first_run) = &admitted[0];
    for i in 0..2 {
        let again = fleet
            .control(i)
            .start_run("rated", json!({"id": format!("event-{first}")}))
            .await
            .unwrap();
        assert_eq!(again["duplicate"], true, "{again}");
        assert_eq!(again["run_id"], first_run.as_str(), "{again}");
    }
    let stored = fleet
        .control(1)
        .runs(None, Some("rated"), false, None)
        .await
        .unwrap();
    let mut stored: Vec<&str> = stored["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    stored.sort_unstable();
    let mut expected: Vec<&str> = admitted.iter().map(|(_, id)| id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(stored, expected);
}
