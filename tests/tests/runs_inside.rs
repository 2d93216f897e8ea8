//! What a run asks of the proxy itself, and the runs a human holds (docs/runs.md), against
//! the real `ostiary serve`: runs whose commands speak to `https://ostiary.internal` through
//! the proxy with curl, as an agent would.
//!
//! What it proves:
//! - a trigger with `approval = true` starts nothing until a human approves, from the CLI;
//!   the approval shows the run's trigger, command and payload; approved, the run runs
//!   once; denied, it ends `cancelled` naming who denied it and never runs;
//! - a run that saved a checkpoint and failed is retried and reads it back (the retry
//!   resumes); a session that is not a run's gets 404 from `ostiary.internal`, and nothing
//!   reaches any upstream;
//! - a run starts a child run at `https://ostiary.internal/v1/runs`: the child runs with its
//!   payload, names its parent run, its session is a child of the parent's, and the parent
//!   sees it at `/v1/runs/{id}`; a child under another agent name without a spawn permit
//!   fails with the policy's refusal; a session that is not a run's cannot start runs.

use serde_json::{json, Value};

use crate::support::cli::{audit_query, get, ostiary, session};
use crate::support::runs::*;

/// `curl` through the run's session (its proxy variables and CA are in its environment).
const CURL: &str = "curl -sS --max-time 10";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_run_starts_only_once_approved_and_a_denied_one_never() {
    let marks = Marks::new();
    let dir = marks.dir().display().to_string();
    let rig = RunsRig::start(&format!(
        r#"
[approvals]
approvers = ["alice@example.com"]

[[trigger]]
name = "deploy"
kind = "api"
agent = "deployer"
profile = "none"
approval = true
command = ["sh", "-c", '''echo "$OSTIARY_RUN_ID" >> "{dir}/deploy.runs"''']
"#
    ))
    .await;
    let yes = rig.start_run("deploy", json!({"release": "v2"})).await;
    let no = rig.start_run("deploy", json!({"release": "v3-rc"})).await;
    for id in [&yes, &no] {
        assert_eq!(rig.run(id).await["status"], "awaiting_approval");
    }

    // What the approvers see: the run, its trigger, its command and its payload.
    let listed = rig.cli_json(&["approvals", "list"]).await;
    let approvals = listed["approvals"].as_array().unwrap().clone();
    assert_eq!(approvals.len(), 2, "{listed:#}");
    let mut ids = Vec::new();
    for run in [&yes, &no] {
        let listed = approvals
            .iter()
            .find(|a| a["session"] == format!("run:{run}"))
            .unwrap_or_else(|| panic!("no approval for {run}: {approvals:#?}"));
        let id = listed["approval_id"].as_str().unwrap().to_owned();
        let shown = rig.cli_json(&["approvals", "show", &id]).await;
        let args = &shown["observed"]["args"];
        assert_eq!(shown["observed"]["tool"], "ostiary.start_run", "{shown:#}");
        assert_eq!(args["run"], run.as_str(), "{shown:#}");
        assert_eq!(args["trigger"], "deploy", "{shown:#}");
        assert!(
            args["command"][2].as_str().unwrap().contains("deploy.runs"),
            "{shown:#}"
        );
        ids.push((id, args["payload"]["release"].clone()));
    }
    assert_eq!(ids[0].1, "v2");
    assert_eq!(ids[1].1, "v3-rc");
    let (approve, deny) = (ids[0].0.clone(), ids[1].0.clone());
    // Held is held: nothing ran while nobody decided.
    assert!(marks.lines("deploy.runs").is_empty());

    let config = rig.server.config_arg();
    for (verb, id) in [("approve", &approve), ("deny", &deny)] {
        let out = ostiary(&[
            "--config",
            &config,
            "approvals",
            verb,
            id,
            "--as",
            "alice@example.com",
        ])
        .await;
        assert!(out.success(), "{verb}: {out}");
    }
    let ran = rig.wait_status(&yes, "succeeded").await;
    assert_eq!(ran["approval"], approve.as_str(), "{ran:#}");
    let denied = rig.wait_status(&no, "cancelled").await;
    assert!(
        denied["error"]
            .as_str()
            .unwrap_or_default()
            .contains("alice@example.com denied"),
        "{denied:#}"
    );
    assert_eq!(
        denied["attempt"], 0,
        "a denied run never started: {denied:#}"
    );
    assert_eq!(marks.lines("deploy.runs"), std::slice::from_ref(&yes));
    // A second decision changes nothing.
    let again = ostiary(&[
        "--config",
        &config,
        "approvals",
        "approve",
        &deny,
        "--as",
        "alice@example.com",
    ])
    .await;
    assert!(!again.success(), "{again}");
    assert_eq!(rig.run(&no).await["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_run_resumes_from_its_checkpoint() {
    let marks = Marks::new();
    let dir = marks.dir().display().to_string();
    let rig = RunsRig::start(&format!(
        r#"
[[trigger]]
name = "long-task"
kind = "api"
agent = "worker"
profile = "none"
retry = {{ attempts = 2, backoff = "200ms" }}
command = ["sh", "-c", '''
if {CURL} -f https://ostiary.internal/v1/checkpoint -o "{dir}/$OSTIARY_RUN_ID.resumed"; then
  exit 0
fi
{CURL} -f -X PUT --data-binary 'step 42 of 100' https://ostiary.internal/v1/checkpoint > "{dir}/$OSTIARY_RUN_ID.saved"
exit 3
''']
"#
    ))
    .await;
    let id = rig.start_run("long-task", json!({})).await;
    let done = rig.wait_status(&id, "succeeded").await;
    assert_eq!(done["attempt"], 2, "{done:#}");
    let saved: Value = serde_json::from_str(&marks.read(&format!("{id}.saved"))).unwrap();
    assert_eq!(saved, json!({"run_id": id, "saved_bytes": 14}));
    assert_eq!(marks.read(&format!("{id}.resumed")), "step 42 of 100");
    // The first attempt's GET found none: 404, not a forwarded request.
    let records = audit_query(&rig.server, &[], |r| {
        r.iter().filter(|r| r["kind"] == "checkpoint").count() >= 3
    })
    .await;
    let checkpoints: Vec<(&Value, &Value)> = records
        .iter()
        .filter(|r| r["kind"] == "checkpoint")
        .map(|r| (&r["method"], &r["status"]))
        .collect();
    assert_eq!(
        checkpoints,
        [
            (&json!("GET"), &json!(404)),
            (&json!("PUT"), &json!(200)),
            (&json!("GET"), &json!(200)),
        ]
    );

    // A session that is not a run's has no checkpoint, and the name goes nowhere.
    let (_, token) = session(&rig.server, "someone").await;
    for path in ["/v1/checkpoint", "/v1/runs", "/anything"] {
        let reply = get(
            &rig.server,
            &token,
            &format!("http://ostiary.internal{path}"),
        )
        .await;
        assert_eq!(reply.status.as_u16(), 404, "{path}: {reply}");
        assert_eq!(reply.json()["error"], "not_found", "{path}: {reply}");
    }
    assert!(rig.upstream.seen().is_empty(), "{:?}", rig.upstream.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_starts_child_runs_in_child_sessions() {
    let marks = Marks::new();
    let dir = marks.dir().display().to_string();
    let rig = RunsRig::start(&format!(
        r#"
[[trigger]]
name = "planner"
kind = "api"
agent = "planner-bot"
profile = "none"
max_calls = 20
command = ["sh", "-c", '''
{CURL} -X POST https://ostiary.internal/v1/runs -d '{{"trigger": "worker", "payload": {{"task": 7}}}}' > "{dir}/planner.child"
{CURL} -X POST https://ostiary.internal/v1/runs -d '{{"trigger": "stranger"}}' > "{dir}/planner.stranger"
echo "$OSTIARY_SESSION_ID" > "{dir}/planner.session"
child=$(sed 's/.*"run_id":"\([^"]*\)".*/\1/' "{dir}/planner.child")
{CURL} "https://ostiary.internal/v1/runs/$child" > "{dir}/planner.seen"
sleep 2
''']

[[trigger]]
name = "worker"
kind = "api"
agent = "planner-bot"
profile = "none"
command = ["sh", "-c", '''cp "$OSTIARY_TRIGGER_PAYLOAD" "{dir}/worker.payload"; echo "$OSTIARY_SESSION_ID" > "{dir}/worker.session"''']

[[trigger]]
name = "stranger"
kind = "api"
agent = "other-bot"
profile = "none"
command = ["true"]
"#
    ))
    .await;
    let parent = rig.start_run("planner", json!({})).await;
    rig.wait_status(&parent, "succeeded").await;
    let started: Value = serde_json::from_str(&marks.read("planner.child")).unwrap();
    assert_eq!(started["trigger"], "worker", "{started:#}");
    let child = started["run_id"].as_str().unwrap().to_owned();
    let seen: Value = serde_json::from_str(&marks.read("planner.seen")).unwrap();
    assert_eq!(seen["run_id"], child.as_str(), "{seen:#}");

    let ran = rig.wait_status(&child, "succeeded").await;
    assert_eq!(ran["parent_run"], parent.as_str(), "{ran:#}");
    assert_eq!(
        serde_json::from_str::<Value>(&marks.read("worker.payload")).unwrap(),
        json!({"task": 7})
    );
    // The child's session is a child of the parent's.
    let parent_session = marks.read("planner.session").trim().to_owned();
    let child_session = marks.read("worker.session").trim().to_owned();
    let records = audit_query(&rig.server, &["--session", &child_session], |r| {
        !r.is_empty()
    })
    .await;
    assert!(
        records
            .iter()
            .any(|r| r["parent"] == parent_session.as_str()),
        "no record of {child_session} names {parent_session} as its parent: {records:#?}"
    );

    // Another agent name needs a spawn permit this policy does not give.
    let other: Value = serde_json::from_str(&marks.read("planner.stranger")).unwrap();
    let stranger = other["run_id"].as_str().unwrap().to_owned();
    let failed = rig.wait_status(&stranger, "failed").await;
    assert!(
        failed["error"]
            .as_str()
            .unwrap_or_default()
            .contains("spawn permit"),
        "{failed:#}"
    );

    // A session that is not a run's starts nothing.
    let (_, token) = session(&rig.server, "planner-bot").await;
    let before = rig.runs("").await.len();
    let request = format!(
        "POST http://ostiary.internal/v1/runs HTTP/1.1\r\nHost: ostiary.internal\r\n{}Content-Type: application/json\r\nContent-Length: 21\r\nConnection: close\r\n\r\n{{\"trigger\":\"worker\"}}",
        ostiary_e2e::raw::auth_line(&token)
    );
    let reply = ostiary_e2e::raw::exchange(rig.server.proxy_addr, request.as_bytes())
        .await
        .unwrap();
    assert_eq!(reply.status.as_u16(), 404, "{reply}");
    assert_eq!(rig.runs("").await.len(), before);
}
