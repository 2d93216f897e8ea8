//! The loop watchdog end to end (issue 7): identical calls, cycles, bursts of denials and
//! tier jumps pause a session (`423`) with a dead letter; a human resumes it (approval or
//! API, withdrawing the approvers' question) or terminates it; pauses and spent budgets
//! survive a restart.

use crate::support::guardrails as support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::Rig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_session_is_paused_then_resumed_or_terminated() {
    let rig = Rig::start(
        r#"
[tiers.read]
repeat_max = 5
[approvals]
approvers = ["alice@example.com"]
"#,
    )
    .await;
    let a = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let (s, _, _) = rig.call(&a, "GET", "/idem/read/same", &[], None).await;
        statuses.push(s);
    }
    // The 5th identical call trips the watchdog; from the 6th on the session is paused.
    assert_eq!(statuses[..5], [201; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 423), "{statuses:?}");
    assert_eq!(rig.upstream.count("/idem/read/same"), 5);
    // Every request of the session is refused, not just the repeated one.
    let (s, b, _) = rig.call(&a, "GET", "/echo", &[], None).await;
    assert_eq!(s, 423);
    assert_eq!(b["error"], "session_paused");
    assert!(b["reason"].as_str().unwrap().contains("t.read"), "{b}");
    // Other sessions carry on.
    let other = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    let (s, _, _) = rig.call(&other, "GET", "/idem/read/else", &[], None).await;
    assert_eq!(s, 201);

    // The dead letter holds the snapshot; the approvers got a "resume?" approval.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (letter, approval) = loop {
        let (_, letters) = rig
            .session_call(reqwest::Method::GET, &a, "dead-letters")
            .await;
        let pending = rig
            .proxy
            .control()
            .approvals(Some("pending"))
            .await
            .unwrap();
        let approval = pending["approvals"]
            .as_array()
            .and_then(|l| l.iter().find(|x| x["session"] == a.id.as_str()).cloned());
        if let (Some(letter), Some(approval)) = (letters["dead_letters"].get(0), approval) {
            break (letter.clone(), approval);
        }
        assert!(Instant::now() < deadline, "{letters} / {pending}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letter["kind"], "repeat");
    let recent = letter["snapshot"]["recent_audit"].as_array().unwrap();
    assert!(
        recent.iter().filter(|r| r["tool"] == "t.read").count() >= 5,
        "{letter:#}"
    );
    assert_eq!(letter["snapshot"]["trip"]["kind"], "repeat");
    let (_, shown) = rig.session_call(reqwest::Method::GET, &a, "").await;
    assert_eq!(shown["state"], "paused", "{shown}");

    // A human approves the "resume?" approval: the session works again.
    assert_eq!(approval["tool"], "ostiary.resume_session", "{approval}");
    let id = approval["approval_id"].as_str().unwrap().to_owned();
    rig.proxy
        .control()
        .decide(&id, true, "alice@example.com", None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _, _) = rig.call(&a, "GET", "/idem/read/new", &[], None).await;
        if s == 201 {
            break;
        }
        assert_eq!(s, 423);
        assert!(Instant::now() < deadline, "never resumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Resuming a live session is a conflict.
    let (s, _) = rig.session_call(reqwest::Method::POST, &a, "/resume").await;
    assert_eq!(s, 409);
    // Looping again trips again (the count started over). An operator resumes it from the
    // API this time: the approvers' pending "resume?" question is withdrawn with it.
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(rig.call(&a, "GET", "/idem/read/same", &[], None).await.0);
    }
    assert_eq!(
        statuses,
        [201, 201, 201, 201, 201, 423, 423],
        "{statuses:?}"
    );
    let question = |listed: &Value| {
        listed["approvals"].as_array().and_then(|l| {
            l.iter()
                .find(|x| x["session"] == a.id.as_str() && x["approval_id"] != id.as_str())
                .cloned()
        })
    };
    let pending = rig
        .proxy
        .control()
        .approvals(Some("pending"))
        .await
        .unwrap();
    let second = question(&pending).unwrap_or_else(|| panic!("{pending}"));
    let (s, _) = rig.session_call(reqwest::Method::POST, &a, "/resume").await;
    assert_eq!(s, 200);
    let withdrawn = rig
        .proxy
        .control()
        .approval(second["approval_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(withdrawn["status"], "expired", "{withdrawn:#}");
    // And a third time, terminated.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(rig.call(&a, "GET", "/idem/read/same", &[], None).await.0);
    }
    assert_eq!(statuses, [201, 201, 201, 201, 201, 423], "{statuses:?}");
    let (s, b) = rig
        .session_call(reqwest::Method::POST, &a, "/terminate")
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, _, _) = rig.call(&a, "GET", "/echo", &[], None).await;
    assert_eq!(s, 407);
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &a, "dead-letters")
        .await;
    let resolved: Vec<_> = letters["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resolved"].clone())
        .collect();
    assert_eq!(
        resolved,
        [json!("resumed"), json!("resumed"), json!("terminated")],
        "{letters}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_pauses_survive_a_restart() {
    let mut rig = Rig::start("[tiers.read]\nrepeat_max = 3\n").await;
    let spent = rig
        .agent(json!({"agent": "spent", "max_calls": 2}), None)
        .await
        .unwrap();
    for i in 0..2 {
        assert_eq!(rig.write(&spent, &format!("s{i}")).await.0, 201);
    }
    let looper = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            rig.call(&looper, "GET", "/idem/read/x", &[], None).await.0,
            201
        );
    }
    assert_eq!(rig.call(&looper, "GET", "/echo", &[], None).await.0, 423);

    rig.proxy.restart().await;
    // New listeners: the agents reconnect with the same tokens.
    let spent = rig.reconnect(spent);
    let looper = rig.reconnect(looper);
    let (s, b, _) = rig.write(&spent, "s2").await;
    assert_eq!(s, 429, "a restart is no fresh budget: {b}");
    assert_eq!((b["used"].clone(), b["max"].clone()), (json!(2), json!(2)));
    let (s, b, _) = rig.call(&looper, "GET", "/echo", &[], None).await;
    assert_eq!(s, 423, "still paused after a restart: {b}");
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &looper, "dead-letters")
        .await;
    assert_eq!(letters["dead_letters"][0]["kind"], "repeat", "{letters}");
    let (s, _) = rig
        .session_call(reqwest::Method::POST, &looper, "/resume")
        .await;
    assert_eq!(s, 200);
    assert_eq!(rig.call(&looper, "GET", "/echo", &[], None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_denial_bursts_and_tier_jumps_pause_a_session_too() {
    let rig = Rig::start(
        "[sessions.watchdog]\ncycle_repeats = 3\ndenials = 4\nbaseline_calls = 3\ntier_jumps = 2\n",
    )
    .await;
    // A→B→A→B→A→B: no call repeats often enough for the identical-call rule, but the
    // pattern does; the third period trips it.
    let cycler = rig.agent(json!({"agent": "cycler"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..7 {
        let path = if i % 2 == 0 {
            "/idem/read/a"
        } else {
            "/idem/read/b"
        };
        statuses.push(rig.call(&cycler, "GET", path, &[], None).await.0);
    }
    assert_eq!(
        statuses,
        [201, 201, 201, 201, 201, 201, 423],
        "{statuses:?}"
    );
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &cycler, "dead-letters")
        .await;
    assert_eq!(letters["dead_letters"][0]["kind"], "cycle", "{letters}");

    // Four refusals by policy in a row: the burst rule. (The first two calls are allowed;
    // `guarded-after-two-calls` refuses every one after.)
    let denied = rig.agent(json!({"agent": "denied"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..7 {
        let path = format!("/idem/guarded/g{i}");
        statuses.push(rig.call(&denied, "GET", &path, &[], None).await.0);
    }
    assert_eq!(
        statuses,
        [201, 201, 403, 403, 403, 403, 423],
        "{statuses:?}"
    );
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &denied, "dead-letters")
        .await;
    assert_eq!(
        letters["dead_letters"][0]["kind"], "denial_burst",
        "{letters}"
    );

    // Reads only, then attempts on a tier the session never used: the tier-jump rule.
    let jumper = rig.agent(json!({"agent": "jumper"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..3 {
        let path = format!("/idem/read/j{i}");
        statuses.push(rig.call(&jumper, "GET", &path, &[], None).await.0);
    }
    for i in 0..3 {
        let path = format!("/idem/irrev/x{i}");
        statuses.push(rig.call(&jumper, "DELETE", &path, &[], None).await.0);
    }
    assert_eq!(statuses, [201, 201, 201, 403, 403, 423], "{statuses:?}");
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &jumper, "dead-letters")
        .await;
    assert_eq!(letters["dead_letters"][0]["kind"], "tier_jump", "{letters}");
}
