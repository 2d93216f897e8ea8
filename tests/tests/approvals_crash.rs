//! The approval queue survives `kill -9` (docs/design.md §10, THREATS "Durability"): the real
//! `ostiary serve` binary, its state directory in a tempdir, killed with SIGKILL and started
//! again on the same config and state.
//!
//! - `approvals_survive_kill_9_and_run_exactly_once`: 200 escalated refunds are held (each
//!   answered 202 with an approval id), 40 are approved — 20 of them routed to an upstream
//!   that applies at once and answers 5 s late, so they are `executing` (applied upstream,
//!   no answer stored) at the kill, and 20 fast ones decided at once right before the kill
//!   (some not even claimed yet). After the restart: no acknowledged approval is lost, the
//!   approved ones all reach `executed` with exactly one upstream effect per
//!   `Idempotency-Key` (re-deliveries are absorbed by the key), nothing unapproved was ever
//!   applied, the rest are still `pending` and, approved now, run exactly once too (200
//!   effects in all). The interrupted executions have `recovered` audit records, every
//!   acknowledged hold and answered decision has its own record, and `ostiary audit verify`
//!   passes on the state directory right after the kill.
//! - `holds_in_flight_at_kill_9_lose_no_acknowledged_request`: 30 holds at once, SIGKILL as
//!   soon as the first is acknowledged: every request that got a 202 has its approval after
//!   the restart and its audit record; the ones that got no answer may or may not (counted
//!   and printed).
//!
//! Figures (state at the kill, deliveries vs effects, wall times) are printed, not asserted:
//! run with `--nocapture` to read them.

use crate::support::cli;
use cli::*;

use crate::support::approvals as approvals_support;
use approvals_support::{refund_body, APPROVER, POLICIES, TOOLS};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{ControlClient, NewSession, Session};
use serde_json::Value;

/// The session holds hundreds of requests at once on purpose: its cap of pending
/// approvals is raised and the watchdog's burst-of-holds rule is off (both are
/// `approvals_bounds.rs`'s to test).
const APPROVALS_TOML: &str = r#"
[approvals]
approvers = ["alice@example.com"]
tick = "200ms"

[sessions]
max_pending_approvals = 1000

[sessions.watchdog]
holds = 0
"#;

/// How late the slow upstream route answers (it applies the effect at once).
const SLOW_MS: u64 = 5000;

/// How long anything may take to settle before a test gives up.
const SETTLE: Duration = Duration::from_secs(40);

/// `ostiary serve` with the approvals catalog and policies.
async fn start(upstream: &Upstream) -> Server {
    Server::start_with_files(
        upstream,
        &["api.example.test"],
        POLICIES,
        &[("tools.toml", TOOLS)],
        APPROVALS_TOML,
        "info",
    )
    .await
}

fn control(server: &Server) -> ControlClient {
    let token = std::fs::read_to_string(server.state.join("admin.token"))
        .expect("the admin token is in the state directory");
    ControlClient::new(format!("http://{}", server.control_addr), token.trim())
}

/// SIGKILL, and wait for the process to be gone.
async fn kill_9(server: &mut Server) {
    server.child.start_kill().expect("SIGKILL ostiary serve");
    let status = server
        .child
        .wait()
        .await
        .expect("waiting for ostiary serve");
    assert!(!status.success(), "killed, not exited: {status}");
}

/// `ostiary serve` again, on the same config and state directory (a new log file).
async fn restart(server: &mut Server, name: &str) {
    let log = server.dir.path().join(name);
    let mut child = spawn_serve(Some(&server.config), None, &log, "info");
    if let Err(text) = wait_healthy(&mut child, server.control_addr, &log).await {
        panic!("ostiary serve did not come back after kill -9:\n{text}");
    }
    server.child = child;
    server.log = log;
}

/// `ostiary audit verify` on the server's state directory.
async fn audit_verify(server: &Server) -> ostiary_e2e::clients::CmdOutput {
    let config = server.config_arg();
    ostiary(&["--config", &config, "audit", "verify"]).await
}

/// The approvals table as the killed process left it, read from a copy of the database
/// (so the restart finds the files exactly as the kill left them): id → status.
fn statuses_on_disk(state: &Path) -> BTreeMap<String, String> {
    let snapshot = tempfile::tempdir().unwrap();
    for suffix in ["", "-wal"] {
        let from = state.join(format!("ostiary.db{suffix}"));
        if from.exists() {
            std::fs::copy(&from, snapshot.path().join(format!("ostiary.db{suffix}"))).unwrap();
        }
    }
    let conn = rusqlite::Connection::open(snapshot.path().join("ostiary.db")).unwrap();
    let mut stmt = conn.prepare("SELECT id, status FROM approvals").unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<BTreeMap<String, String>, _>>()
        .unwrap();
    rows
}

fn count(statuses: &BTreeMap<String, String>) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for status in statuses.values() {
        *counts.entry(status.as_str()).or_default() += 1;
    }
    counts
}

/// Every approval through the admin API: id → status.
async fn all_approvals(server: &Server) -> BTreeMap<String, String> {
    let token = std::fs::read_to_string(server.state.join("admin.token")).unwrap();
    let listed: Value = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!(
            "http://{}/v1/approvals?limit=10000",
            server.control_addr
        ))
        .bearer_auth(token.trim())
        .send()
        .await
        .expect("GET /v1/approvals")
        .json()
        .await
        .expect("the list is JSON");
    listed["approvals"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|a| {
            (
                a["approval_id"].as_str().unwrap().to_owned(),
                a["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Polls until every id in `ids` has status `status`; the statuses as they are then.
async fn wait_all(
    server: &Server,
    ids: &BTreeSet<String>,
    status: &str,
) -> BTreeMap<String, String> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let all = all_approvals(server).await;
        let done = ids
            .iter()
            .all(|id| all.get(id).map(String::as_str) == Some(status));
        if done {
            return all;
        }
        if tokio::time::Instant::now() >= deadline {
            let stuck: Vec<_> = ids
                .iter()
                .filter(|id| all.get(*id).map(String::as_str) != Some(status))
                .map(|id| (id, all.get(id)))
                .collect();
            panic!(
                "{} approvals never reached {status}: {stuck:?}\nserver log:\n{}",
                stuck.len(),
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The agent: reqwest through the proxy with its session token, trusting the proxy's CA.
#[derive(Clone)]
struct Agent {
    client: reqwest::Client,
    port: u16,
}

/// What the agent got for one request: the status and JSON body, or why nothing came.
type Answer = Result<(u16, Value), String>;

impl Agent {
    fn new(server: &Server, session: &Session, port: u16) -> Self {
        let ca = std::fs::read(server.state.join("ca.pem")).expect("the proxy CA");
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(&session.proxy_url).unwrap())
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        Self { client, port }
    }

    /// The path of charge `n`'s refund; slow charges answer `SLOW_MS` late.
    fn path(n: u32, slow: bool) -> String {
        if slow {
            format!("/idem/refunds/ch_{n}?delay_ms={SLOW_MS}")
        } else {
            format!("/idem/refunds/ch_{n}")
        }
    }

    async fn refund(&self, n: u32, slow: bool, approval: Option<&str>) -> Answer {
        let url = format!(
            "https://api.example.test:{}{}",
            self.port,
            Self::path(n, slow)
        );
        let mut req = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(refund_body(&[n]));
        if let Some(id) = approval {
            req = req.header("ostiary-approval", id);
        }
        let response = req.send().await.map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(|e| format!("{e:?}"))?;
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    /// Hold charge `n`: the approval id of its 202.
    async fn hold(&self, n: u32, slow: bool) -> String {
        let (status, body) = self
            .refund(n, slow, None)
            .await
            .unwrap_or_else(|e| panic!("holding ch_{n}: {e}"));
        assert_eq!(status, 202, "ch_{n}: {body}");
        assert_eq!(body["error"], "approval_pending", "ch_{n}: {body}");
        body["approval_id"].as_str().unwrap().to_owned()
    }
}

async fn new_session(server: &Server) -> Session {
    control(server)
        .create_session(&NewSession {
            agent: "agent-1".into(),
            ttl: Some("1h".into()),
            ..Default::default()
        })
        .await
        .expect("creating a session")
}

/// Effects per idempotency key.
fn effects_by_key(upstream: &Upstream) -> BTreeMap<String, usize> {
    let mut by_key = BTreeMap::new();
    for effect in upstream.effects() {
        let key = effect
            .key
            .unwrap_or_else(|| panic!("an effect without Idempotency-Key: {}", effect.path));
        *by_key.entry(key).or_default() += 1;
    }
    by_key
}

fn keys_of<'a>(ids: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
    ids.into_iter().map(|id| format!("ostiary-{id}")).collect()
}

/// Requests for refunds that reached the upstream at all (first deliveries and repeats).
fn deliveries(upstream: &Upstream) -> usize {
    upstream
        .seen()
        .iter()
        .filter(|s| s.path_only().starts_with("/idem/refunds/"))
        .count()
}

/// Exactly once per charge, whatever the keys: effects per refund path (a re-send under
/// another key, or none, would apply a charge twice), and every delivery carries the key of
/// the charge's own approval.
fn assert_once_per_charge(upstream: &Upstream, held: &BTreeMap<u32, String>) {
    let mut per_path: BTreeMap<String, usize> = BTreeMap::new();
    for effect in upstream.effects() {
        *per_path.entry(effect.path).or_default() += 1;
    }
    let twice: Vec<_> = per_path.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "charges applied more than once: {twice:?}"
    );
    for seen in upstream.seen() {
        let Some(charge) = seen.path_only().strip_prefix("/idem/refunds/ch_") else {
            continue;
        };
        let id = &held[&charge.parse::<u32>().unwrap()];
        assert_eq!(
            seen.header("idempotency-key"),
            Some(format!("ostiary-{id}").as_str()),
            "a delivery of ch_{charge} without its approval's key"
        );
    }
}

/// Decide `ids` as the approver, 16 at a time.
async fn approve_all(control: &ControlClient, ids: &[String]) {
    let results: Vec<_> = stream::iter(ids.iter().cloned())
        .map(|id| {
            let control = control.clone();
            async move {
                let decided = control.decide(&id, true, APPROVER, None).await;
                (id, decided)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for (id, decided) in results {
        let decided = decided.unwrap_or_else(|e| panic!("approving {id}: {e}"));
        // The answer shows the approval as it is just after the decision: the executor
        // (the decision's own task or the sweep) may have claimed it already.
        assert!(
            ["approved", "executing", "executed"]
                .contains(&decided["status"].as_str().unwrap_or_default()),
            "{id}: {decided}"
        );
        assert_eq!(decided["approver"], APPROVER, "{id}: {decided}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_survive_kill_9_and_run_exactly_once() {
    // Built (or found fresh) before the clock starts: the figures are the test's own.
    ostiary_bin();
    let started = Instant::now();
    let upstream = Upstream::builder().start().await;
    let mut server = start(&upstream).await;
    let session = new_session(&server).await;
    let agent = Agent::new(&server, &session, upstream.port());
    let admin = control(&server);

    // 200 distinct refunds held, 16 at a time; every fifth one routed to the slow upstream.
    let slow = |n: u32| n.is_multiple_of(5);
    let holding = Instant::now();
    let held: BTreeMap<u32, String> = stream::iter(0..200u32)
        .map(|n| {
            let agent = agent.clone();
            async move { (n, agent.hold(n, slow(n)).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let hold_time = holding.elapsed();
    let acknowledged: BTreeSet<String> = held.values().cloned().collect();
    assert_eq!(acknowledged.len(), 200, "200 distinct approval ids");
    assert_eq!(deliveries(&upstream), 0, "nothing runs before a decision");

    // 20 slow ones approved: applied upstream at once, answered 5 s later, so they are
    // `executing` at the kill. Waiting for their effects makes that certain.
    let slow_ids: Vec<String> = held
        .iter()
        .filter(|(n, _)| slow(**n))
        .map(|(_, id)| id.clone())
        .take(20)
        .collect();
    approve_all(&admin, &slow_ids).await;
    let deadline = tokio::time::Instant::now() + SETTLE;
    while upstream.effects().len() < slow_ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slow executions never reached the upstream: {:?}",
            upstream.effects()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 20 fast ones decided all at once, and the process killed as soon as the last
    // decision is acknowledged: some are executed, some executing, some not yet claimed.
    let fast_ids: Vec<String> = held
        .iter()
        .filter(|(n, _)| !slow(**n))
        .map(|(_, id)| id.clone())
        .take(20)
        .collect();
    let decisions = fast_ids.iter().map(|id| {
        let admin = admin.clone();
        async move { admin.decide(id, true, APPROVER, None).await }
    });
    for decided in futures_util::future::join_all(decisions).await {
        assert_eq!(decided.expect("approving")["approver"], APPROVER);
    }
    kill_9(&mut server).await;
    let approved: BTreeSet<String> = slow_ids.iter().chain(&fast_ids).cloned().collect();
    assert_eq!(approved.len(), 40);

    // What the kill left behind.
    let on_disk = statuses_on_disk(&server.state);
    let at_kill = count(&on_disk);
    let executing_at_kill: BTreeSet<String> = on_disk
        .iter()
        .filter(|(_, s)| *s == "executing")
        .map(|(id, _)| id.clone())
        .collect();
    let effects_at_kill = effects_by_key(&upstream);
    let deliveries_at_kill = deliveries(&upstream);
    println!(
        "at the kill: approvals on disk by status {at_kill:?}; upstream deliveries {deliveries_at_kill}, effects {}",
        effects_at_kill.len()
    );
    assert_eq!(on_disk.len(), 200, "every acknowledged hold is on disk");
    assert!(
        acknowledged.iter().all(|id| on_disk.contains_key(id)),
        "an acknowledged approval is missing on disk"
    );
    assert!(
        keys_of(&approved).is_superset(&effects_at_kill.keys().cloned().collect()),
        "an unapproved request was applied: {effects_at_kill:?}"
    );
    for id in &slow_ids {
        assert_eq!(
            on_disk[id], "executing",
            "{id} was applied upstream and not answered before the kill"
        );
    }

    // The audit chain survives the kill.
    let verify = audit_verify(&server).await;
    println!("audit verify after kill -9: {}", verify.stdout.trim());
    assert!(
        verify.success(),
        "audit verify fails on the state left by kill -9:\n{verify}"
    );

    // The same config, the same state directory.
    let restarting = Instant::now();
    restart(&mut server, "serve-after-kill.log").await;
    let after = all_approvals(&server).await;
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|id| !after.contains_key(*id))
        .collect();
    assert!(lost.is_empty(), "approvals lost across kill -9: {lost:?}");
    let done = wait_all(&server, &approved, "executed").await;
    let recovery_time = restarting.elapsed();
    let still_pending: Vec<String> = acknowledged
        .iter()
        .filter(|id| !approved.contains(*id))
        .cloned()
        .collect();
    for id in &still_pending {
        assert_eq!(done[id], "pending", "{id} was never decided");
    }
    let effects = effects_by_key(&upstream);
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(
        effects.keys().cloned().collect::<BTreeSet<_>>(),
        keys_of(&approved),
        "the applied keys are exactly the approved approvals"
    );
    assert_once_per_charge(&upstream, &held);
    let deliveries_after = deliveries(&upstream);
    println!(
        "after the restart: {} approved executed in {recovery_time:?} (restart included); upstream deliveries {deliveries_after} for {} effects ({} re-deliveries absorbed by the key)",
        approved.len(),
        effects.len(),
        deliveries_after - effects.len()
    );

    // The agent collects a recovered execution: the upstream's answer to the key.
    let recovered_slow = slow_ids
        .iter()
        .find(|id| executing_at_kill.contains(*id))
        .expect("a slow execution was interrupted");
    let n = *held.iter().find(|(_, id)| *id == recovered_slow).unwrap().0;
    let (status, body) = agent
        .refund(n, true, Some(recovered_slow))
        .await
        .expect("collecting a recovered execution");
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["key"], format!("ostiary-{recovered_slow}"), "{body}");
    let shown = admin.approval(recovered_slow).await.unwrap();
    assert_eq!(
        shown["attempts"], 2,
        "sent again after the restart: {shown:#}"
    );

    // The interrupted executions are audited as recovered, with the restart as the reason.
    let records = audit_query(&server, &[], |r| {
        recovered_ids(r).len() >= executing_at_kill.len()
    })
    .await;
    let recovered = recovered_ids(&records);
    assert_eq!(
        recovered, executing_at_kill,
        "one `recovered` record per execution the kill interrupted"
    );
    // Every acknowledged hold and every decision that was answered has its record: the
    // proxy answers only once the record is committed.
    let decided_audited: BTreeSet<String> = records
        .iter()
        .filter(|r| {
            r["kind"] == "approval"
                && r["reason"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("approved by"))
        })
        .filter_map(|r| r["approval"].as_str().map(str::to_owned))
        .collect();
    let unaudited: Vec<_> = approved.difference(&decided_audited).collect();
    let held_audited: BTreeSet<String> = records
        .iter()
        .filter(|r| r["kind"] == "http" && r["decision"] == "escalate")
        .filter_map(|r| r["approval"].as_str().map(str::to_owned))
        .collect();
    println!(
        "audit: {} `recovered` records; pre-kill decisions without an `approved` record: {unaudited:?} ({}/40 audited); holds audited {}/200",
        recovered.len(),
        40 - unaudited.len(),
        acknowledged.intersection(&held_audited).count()
    );
    assert!(
        unaudited.is_empty(),
        "decisions lost from the audit: {unaudited:?}"
    );
    assert_eq!(
        acknowledged.intersection(&held_audited).count(),
        acknowledged.len(),
        "every acknowledged hold is audited"
    );

    // The ones still pending, approved now: each runs once; 200 effects in all.
    let finishing = Instant::now();
    approve_all(&admin, &still_pending).await;
    let every: BTreeSet<String> = acknowledged.clone();
    wait_all(&server, &every, "executed").await;
    let effects = effects_by_key(&upstream);
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(upstream.effects().len(), 200);
    assert_eq!(
        effects.keys().cloned().collect::<BTreeSet<_>>(),
        keys_of(&every)
    );
    assert_once_per_charge(&upstream, &held);
    let deliveries_end = deliveries(&upstream);
    let finish_time = finishing.elapsed();

    terminate(&mut server.child, &server.log).await;
    let verify = audit_verify(&server).await;
    assert!(verify.success(), "audit verify at the end:\n{verify}");
    println!(
        "end: 200 effects from {deliveries_end} deliveries; 200 holds took {hold_time:?}, the last 160 approved and executed in {finish_time:?}; whole test {:?}",
        started.elapsed()
    );
}

/// Approvals with a `recovered` audit record (the restart put their execution back).
fn recovered_ids(records: &[Value]) -> BTreeSet<String> {
    records
        .iter()
        .filter(|r| {
            r["kind"] == "approval"
                && r["reason"]
                    .as_str()
                    .is_some_and(|t| t.contains("interrupted by a restart"))
        })
        .filter_map(|r| r["approval"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_in_flight_at_kill_9_lose_no_acknowledged_request() {
    let upstream = Upstream::builder().start().await;
    let mut server = start(&upstream).await;
    let session = new_session(&server).await;
    let agent = Agent::new(&server, &session, upstream.port());

    // 30 holds at once; SIGKILL as soon as the first one is acknowledged.
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let tasks: Vec<_> = (1000..1030u32)
        .map(|n| {
            let agent = agent.clone();
            let first = first_tx.clone();
            tokio::spawn(async move {
                let answer = agent.refund(n, false, None).await;
                if matches!(answer, Ok((202, _))) {
                    let _ = first.send(());
                }
                answer
            })
        })
        .collect();
    drop(first_tx);
    tokio::time::timeout(SETTLE, first_rx.recv())
        .await
        .expect("no hold was acknowledged")
        .expect("no hold was acknowledged");
    kill_9(&mut server).await;
    let mut acknowledged = BTreeSet::new();
    let mut unanswered = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok((202, body)) => {
                assert_eq!(body["error"], "approval_pending", "{body}");
                acknowledged.insert(body["approval_id"].as_str().unwrap().to_owned());
            }
            Ok((status, body)) => panic!("a hold answered {status}: {body}"),
            Err(e) => unanswered.push(e),
        }
    }
    assert!(!acknowledged.is_empty());

    let verify = audit_verify(&server).await;
    assert!(
        verify.success(),
        "audit verify fails on the state left by kill -9:\n{verify}"
    );

    restart(&mut server, "serve-after-kill.log").await;
    let after = all_approvals(&server).await;
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|id| !after.contains_key(*id))
        .collect();
    assert!(lost.is_empty(), "acknowledged holds lost: {lost:?}");
    for id in &acknowledged {
        assert_eq!(after[id], "pending", "{id}");
    }
    let unacknowledged_stored = after.len() - acknowledged.len();
    assert!(
        after.len() <= 30,
        "more approvals than requests: {}",
        after.len()
    );
    assert!(
        upstream.effects().is_empty(),
        "nothing was approved, nothing may run"
    );
    let records = audit_query(&server, &[], |_| true).await;
    let held_audited = records
        .iter()
        .filter(|r| r["kind"] == "http" && r["decision"] == "escalate")
        .filter(|r| {
            r["approval"]
                .as_str()
                .is_some_and(|id| acknowledged.contains(id))
        })
        .count();
    println!(
        "30 holds, kill -9 after the first 202: {} acknowledged (all present after restart, {held_audited} of them with their `escalate` audit record), {} unanswered, of which {unacknowledged_stored} stored anyway",
        acknowledged.len(),
        unanswered.len(),
    );
    assert_eq!(
        held_audited,
        acknowledged.len(),
        "a 202 is sent only after its audit record is committed"
    );
    terminate(&mut server.child, &server.log).await;
}
