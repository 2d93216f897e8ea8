//! Schedule triggers (`[[trigger]] kind = "schedule"`) against the real `ostiary serve`, on a
//! cron of every second.
//!
//! What it proves:
//! - with `concurrency = "forbid"`, a run that outlasts the interval between ticks is never
//!   overlapped by the next (the runs' start and end times, written by the runs themselves,
//!   do not intersect), and each tick skipped meanwhile is on record (`trigger`, decision
//!   `cancel`, the reason naming `forbid`);
//! - after the proxy was stopped for 5 s, the next start makes ONE run for the ticks missed
//!   (its payload's `missed` above 0), never one per missed tick, and then ticks on.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::support::cli::{spawn_serve, terminate};
use crate::support::runs::*;

fn schedule(name: &str, script: &str, extra: &str) -> String {
    format!(
        r#"
[[trigger]]
name = "{name}"
kind = "schedule"
cron = "* * * * * *"
agent = "cron-bot"
profile = "none"
command = ["sh", "-c", '''{script}''']
{extra}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbid_schedule_never_overlaps_and_audits_the_ticks_it_skips() {
    let marks = Marks::new();
    let m = marks.dir().display();
    let script = format!(
        r#"echo "start $(date +%s%3N) $OSTIARY_RUN_ID" >> "{m}/tick.log"; sleep 2.5; echo "end $(date +%s%3N) $OSTIARY_RUN_ID" >> "{m}/tick.log""#
    );
    let rig = RunsRig::start(&schedule("tick", &script, r#"concurrency = "forbid""#)).await;
    // Three runs ended: about 8 s of ticks every second.
    let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
    while marks
        .lines("tick.log")
        .iter()
        .filter(|l| l.starts_with("end "))
        .count()
        < 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "three runs did not end within {RUN_DEADLINE:?}: {:?}\n{}",
            marks.lines("tick.log"),
            rig.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut intervals: BTreeMap<String, (Option<i64>, Option<i64>)> = BTreeMap::new();
    for line in marks.lines("tick.log") {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (what, at, id) = (parts[0], parts[1].parse::<i64>().unwrap(), parts[2]);
        let entry = intervals.entry(id.to_owned()).or_default();
        match what {
            "start" => entry.0 = Some(at),
            _ => entry.1 = Some(at),
        }
    }
    let mut spans: Vec<(i64, i64, String)> = intervals
        .iter()
        .map(|(id, (start, end))| (start.unwrap(), end.unwrap_or(i64::MAX), id.clone()))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "run {} started at {} while run {} ran until {}: {spans:?}",
            pair[1].2,
            pair[1].0,
            pair[0].2,
            pair[0].1
        );
    }

    // Each run came from its own tick, none missed.
    let runs = rig.runs("trigger=tick").await;
    let mut ticks: Vec<i64> = Vec::new();
    for run in &runs {
        assert_eq!(run["kind"], "schedule", "{run:#}");
        assert_eq!(run["payload"]["missed"], 0, "{run:#}");
        ticks.push(run["payload"]["scheduled_ms"].as_i64().unwrap());
    }
    let before = ticks.len();
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), before, "two runs of one tick: {runs:#?}");

    // The ticks that came while a run went started nothing, on record.
    let skipped = |records: &[Value]| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r["decision"] == "cancel")
            .cloned()
            .collect()
    };
    let records = rig.trigger_records(|r| skipped(r).len() >= 2).await;
    let skipped = skipped(&records);
    assert!(skipped.len() >= 2, "{records:#?}");
    for record in &skipped {
        assert!(
            record["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("forbid"),
            "{record:#}"
        );
        assert_eq!(record["run"]["trigger"], "tick", "{record:#}");
    }
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_a_schedule_starts_one_catch_up_run_not_a_burst() {
    let marks = Marks::new();
    let m = marks.dir().display();
    // A run is quick: a burst of runs for the missed ticks would show.
    let script = format!(r#"echo "$OSTIARY_RUN_ID" >> "{m}/ticks""#);
    let mut rig = RunsRig::start(&schedule("every-second", &script, "")).await;
    marks.wait_lines("ticks", 2, "the schedule ticks").await;

    // Down for 5 s: about five ticks missed.
    terminate(&mut rig.server.child, &rig.server.log).await;
    let stopped_ms = now_ms();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restart_ms = now_ms();
    let (config, log, control) = (
        rig.server.config.clone(),
        rig.server.log.clone(),
        rig.server.control_addr,
    );
    rig.server.child = spawn_serve(Some(&config), None, &log, "info");
    rig.server.wait_healthy(control).await.unwrap();
    let healthy_ms = now_ms();

    // The catch-up run, then at least two ordinary ticks.
    let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
    let after = loop {
        let after: Vec<Value> = rig
            .runs("trigger=every-second&limit=1000")
            .await
            .into_iter()
            .filter(|r| r["created_ms"].as_i64().unwrap() >= restart_ms)
            .collect();
        let done = after.iter().filter(|r| r["status"] == "succeeded").count();
        if done >= 3 {
            break after;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "three runs did not end after the restart: {after:#?}\n{}",
            rig.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let catch_up: Vec<&Value> = after
        .iter()
        .filter(|r| r["payload"]["missed"].as_u64().unwrap_or(0) > 0)
        .collect();
    assert_eq!(catch_up.len(), 1, "not one catch-up run: {after:#?}");
    let missed = catch_up[0]["payload"]["missed"].as_u64().unwrap();
    assert!(
        (3..=10).contains(&missed),
        "{missed} ticks missed: {after:#?}"
    );
    // The catch-up run is for a tick of the downtime, and the first since: no run for any
    // other missed tick, and the ticks after it one each.
    let mut ticks: Vec<(i64, &Value)> = after
        .iter()
        .map(|r| (r["payload"]["scheduled_ms"].as_i64().unwrap(), r))
        .collect();
    ticks.sort_by_key(|(t, _)| *t);
    assert_eq!(ticks[0].1["run_id"], catch_up[0]["run_id"], "{after:#?}");
    let tick = ticks[0].0;
    assert!(
        tick > stopped_ms && tick <= healthy_ms + 1000,
        "the catch-up run's tick {tick} is not one of the downtime ({stopped_ms}..{healthy_ms}): {after:#?}"
    );
    let of_downtime = ticks.iter().filter(|(t, _)| *t < restart_ms).count();
    assert!(
        of_downtime <= 1,
        "runs for {of_downtime} missed ticks: {after:#?}"
    );
    for pair in ticks.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= 1000, "a burst: {after:#?}");
    }
    rig.server.stop().await;
}
