//! Several replicas, as behind a load balancer (the harness: `support/fleet.rs`): real
//! `ostiary serve` processes on one PostgreSQL schema, one Redis prefix and one set of keys.
//! What holds for one process must hold for the fleet:
//!
//! - a session made on one replica works on all; a budget of 30 calls spread over three
//!   replicas stops at exactly 30; a rate of 10/s holds within GCRA tolerance across them;
//!   a fan-out of 3 children holds across them; an `Idempotency-Key` and a child tree too;
//! - a loop spread over the replicas is caught as one, and paused on all of them;
//! - teardown on one replica cuts a tunnel open on another;
//! - `ostiary audit verify` passes over the shared chain after concurrent load on three
//!   replicas, and fails once a row is edited.
//!
//! Failures (a killed executor, Redis or PostgreSQL gone) are `fleet_faults.rs`'s. Timings
//! are printed, not asserted (bounds are generous deadlines): run with `--nocapture`.

use crate::support::cli;
use crate::support::fleet;
use crate::support::postgres;

use std::time::{Duration, Instant};

use fleet::{api_status, get, Fleet};
use ostiary_e2e::raw::{self, auth_line, Wire, IO_DEADLINE};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{ControlClient, NewSession, Session};
use postgres::psql;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_its_budget_and_its_fan_out_hold_across_three_replicas_and_the_chain_verifies() {
    let upstream = Upstream::builder().start().await;
    let mut fleet = Fleet::start(&upstream, 3, "[sessions]\nmax_children = 3\n", None, None).await;

    // Made on replica 0, used on all three.
    let session = fleet
        .session(
            0,
            NewSession {
                agent: "billing".into(),
                max_calls: Some(30),
                ..Default::default()
            },
        )
        .await;
    let agents: Vec<reqwest::Client> = (0..3).map(|i| fleet.agent(i, &session)).collect();
    for (i, agent) in agents.iter().enumerate() {
        let (status, body) = get(agent, &fleet.url("/echo")).await;
        assert_eq!(status, 200, "replica {i}: {body}");
    }
    // The rest of the budget, raced round-robin: exactly 30 in all.
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..42).map(|n| {
        let agent = agents[n % 3].clone();
        let url = fleet.url("/echo");
        async move { get(&agent, &url).await }
    }))
    .await;
    let elapsed = started.elapsed();
    let allowed = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(allowed + 3, 30, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 429, "{body}");
        assert_eq!(body["error"], "limit_exceeded", "{body}");
        assert_eq!(body["limit"], "calls", "{body}");
    }
    assert_eq!(
        upstream.count("/echo"),
        30,
        "nothing past the budget went upstream"
    );
    println!("42 calls over 3 replicas in {elapsed:?}: 27 allowed, 15 refused at the budget");
    // Every replica refuses the spent session alike.
    for agent in &agents {
        assert_eq!(get(agent, &fleet.url("/echo")).await.0, 429);
    }

    // A fan-out of 3, raced through the three replicas by the parent itself.
    let parent = fleet.root(1, "planner").await;
    // An `Idempotency-Key` used through one replica is replayed by another.
    let mut outcomes = Vec::new();
    for i in [0, 2] {
        let response = fleet
            .agent(i, &parent)
            .post(fleet.url("/idem/notes/1"))
            .header("idempotency-key", "note-1")
            .header("content-type", "application/json")
            .body(r#"{"text": "once"}"#)
            .send()
            .await
            .unwrap();
        outcomes.push((
            response.status().as_u16(),
            response.headers().contains_key("idempotency-replayed"),
        ));
    }
    assert_eq!(
        outcomes,
        [(201, false), (201, true)],
        "the second is the first's answer"
    );
    let notes = upstream
        .effects()
        .iter()
        .filter(|e| e.path == "/idem/notes/1")
        .count();
    assert_eq!(notes, 1, "applied once across replicas");
    let spawned = futures_util::future::join_all((0..9).map(|n| {
        let client = ControlClient::new(
            format!("http://{}", fleet.replicas[n % 3].control_addr),
            &parent.token,
        );
        async move {
            client
                .create_session(&NewSession {
                    agent: "planner".into(),
                    ..Default::default()
                })
                .await
        }
    }))
    .await;
    let children: Vec<&Session> = spawned.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(
        children.len(),
        3,
        "{:?}",
        spawned
            .iter()
            .map(|r| r.as_ref().err().map(ToString::to_string))
            .collect::<Vec<_>>()
    );
    for refused in spawned.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(api_status(refused), 429, "{refused}");
        assert!(refused.to_string().contains("children"), "{refused}");
    }
    // A child ends on one replica: another has room for one more child.
    fleet
        .control(2)
        .delete_session(&children[0].session_id)
        .await
        .unwrap();
    let again = ControlClient::new(
        format!("http://{}", fleet.replicas[0].control_addr),
        &parent.token,
    )
    .create_session(&NewSession {
        agent: "planner".into(),
        ..Default::default()
    })
    .await;
    let again = again.unwrap_or_else(|e| panic!("{e}"));
    // The parent ends through replica 0: its children, made through the others, end too.
    assert_eq!(
        get(&fleet.agent(1, &again), &fleet.url("/echo")).await.0,
        200
    );
    fleet
        .control(0)
        .delete_session(&parent.session_id)
        .await
        .unwrap();
    for child in children.iter().skip(1).copied().chain([&again]) {
        for i in 0..3 {
            let (status, _) = get(&fleet.agent(i, child), &fleet.url("/echo")).await;
            assert_eq!(status, 407, "child {} on replica {i}", child.session_id);
        }
    }

    // The chain the three wrote concurrently verifies, from any replica's config.
    for replica in std::mem::take(&mut fleet.replicas) {
        let mut replica = replica;
        cli::terminate(&mut replica.child, &replica.log).await;
    }
    let config = fleet.dir.path().join("r1").join("ostiary.toml");
    let config = config.display().to_string();
    let verified = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(verified.success(), "{verified}");
    let records: usize = psql(&format!("SELECT COUNT(*) FROM {}.audit", fleet._schema.0))
        .parse()
        .unwrap();
    assert!(records >= 45, "{records} records");
    println!(
        "audit verify over {records} records written by 3 replicas: {}",
        verified.stdout.trim()
    );
    psql(&format!(
        "UPDATE {}.audit SET record = replace(record, '\"allow\"', '\"deny\"') WHERE seq = 5",
        fleet._schema.0
    ));
    let tampered = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(!tampered.success(), "{tampered}");
    assert!(tampered.stdout.contains("record 5"), "{tampered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_within_gcra_tolerance_across_three_replicas() {
    let upstream = Upstream::builder().start().await;
    let fleet = Fleet::start(
        &upstream,
        3,
        "[tiers.write]\nrate_agent = \"10/s\"\n",
        None,
        None,
    )
    .await;
    let session = fleet.root(2, "poller").await;
    // Three agents, one per replica, as fast as each can go, for a while.
    let run = Duration::from_secs(3);
    let started = Instant::now();
    let results = futures_util::future::join_all((0..3).map(|i| {
        let agent = fleet.agent(i, &session);
        let url = fleet.url("/status/200");
        async move {
            let (mut admitted, mut refused) = (0usize, 0usize);
            while started.elapsed() < run {
                match get(&agent, &url).await {
                    (200, _) => admitted += 1,
                    (429, body) => {
                        assert_eq!(body["limit"], "rate:agent", "{body}");
                        refused += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            (admitted, refused)
        }
    }))
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let admitted: usize = results.iter().map(|r| r.0).sum();
    let refused: usize = results.iter().map(|r| r.1).sum();
    // GCRA: the burst (10) at once, then one every 100 ms, whichever replica asks.
    let most = 10 + (elapsed * 10.0).ceil() as usize + 1;
    println!(
        "rate 10/s over 3 replicas for {elapsed:.2}s: {admitted} admitted (at most {most}), {refused} refused, per replica {results:?}"
    );
    assert!(admitted <= most, "{admitted} admitted in {elapsed:.2}s");
    assert!(
        refused > admitted,
        "the agents pushed well past the rate: {results:?}"
    );
    assert!(admitted >= 20, "the rate admits what it should: {admitted}");
    assert!(
        results.iter().all(|r| r.0 > 0),
        "each replica admitted some: {results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_on_one_replica_cuts_a_tunnel_open_on_another() {
    let upstream = Upstream::builder().start().await;
    let fleet = Fleet::start(&upstream, 3, "", None, None).await;
    let session = fleet.root(0, "tunneler").await;
    // An intercepted tunnel through replica 0, used once and left open.
    let authority = format!("api.example.test:{}", upstream.port());
    let (wire, reply) = raw::connect(
        fleet.replicas[0].proxy_addr,
        &authority,
        &auth_line(&session.token),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    let ca = std::fs::read_to_string(fleet.keys.join("ca.pem")).unwrap();
    let tls = raw::tls(
        wire.into_inner(),
        raw::client_config(&ca, &[b"http/1.1"]),
        "api.example.test",
    )
    .await
    .unwrap();
    let mut tunnel = Wire::new(tls);
    tunnel
        .send(format!("GET /echo HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(tunnel.response().await.unwrap().status, 200);

    // Ended through replica 2, which never served it.
    let ended = Instant::now();
    fleet
        .control(2)
        .delete_session(&session.session_id)
        .await
        .expect("replica 2 ends a session replica 0 made");
    assert!(
        tunnel.closed_within(IO_DEADLINE).await,
        "the tunnel on replica 0 outlived the teardown on replica 2"
    );
    println!(
        "tunnel on r0 cut {:?} after the teardown on r2",
        ended.elapsed()
    );
    assert_eq!(upstream.count("/echo"), 1);
    // And the token is refused everywhere.
    for i in 0..3 {
        let (status, _) = get(&fleet.agent(i, &session), &fleet.url("/echo")).await;
        assert_eq!(status, 407, "replica {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_spread_over_three_replicas_is_caught_as_one_and_paused_everywhere() {
    let upstream = Upstream::builder().start().await;
    let fleet = Fleet::start(
        &upstream,
        3,
        "[sessions.watchdog]\nenabled = true\n",
        None,
        None,
    )
    .await;
    let session = fleet.root(0, "looper").await;
    let agents: Vec<reqwest::Client> = (0..3).map(|i| fleet.agent(i, &session)).collect();
    // The same tool call 20 times (the read tier's `repeat_max`), round-robin: no replica
    // sees more than 7 of them, the loop is 20 long.
    for n in 0..20 {
        let (status, body) = get(&agents[n % 3], &fleet.url("/echo")).await;
        assert_eq!(status, 200, "call {n}: {body}");
    }
    // Paused by whichever replica saw the 20th, beside its answer (shared counters): the
    // pause is in Redis before its dead letter is written, so once the dead letter is seen
    // every replica's gate refuses the session after one more sync (at most 100 ms).
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters = fleet
            .control(2)
            .dead_letters(Some(&session.session_id))
            .await
            .unwrap();
        let letters = letters["dead_letters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !letters.is_empty() || Instant::now() >= deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letters.len(), 1, "{letters:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, agent) in agents.iter().enumerate() {
        let (status, body) = get(agent, &fleet.url("/echo")).await;
        assert_eq!(status, 423, "replica {i}: {body}");
        assert_eq!(body["error"], "session_paused", "{body}");
    }
    assert_eq!(upstream.count("/echo"), 20);
    // One dead letter, seen from any replica (never more than one, however long the loop
    // ran on three replicas); resumed through another, served everywhere.
    let again = fleet
        .control(2)
        .dead_letters(Some(&session.session_id))
        .await
        .unwrap();
    assert_eq!(
        again["dead_letters"].as_array().map(Vec::len),
        Some(1),
        "{again}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match fleet.control(1).resume_session(&session.session_id).await {
            Ok(()) => break,
            // The dead letter is written a moment after the pause.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("resume: {e}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, agent) in agents.iter().enumerate() {
        let (status, body) = get(agent, &fleet.url("/echo")).await;
        assert_eq!(status, 200, "replica {i} after the resume: {body}");
    }
}
