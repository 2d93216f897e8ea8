//! Runs decided by Cedar before they start (docs/runs.md, docs/design.md §4): every trigger's
//! run is `Action::"trigger"` — the trigger's agent, `Trigger::"<name>"` with its `kind`,
//! the validated payload in `context.payload` — against the real `ostiary serve`.
//!
//! What it proves:
//! - a run the policy permits starts; one a `forbid` matches is refused `403 denied` with
//!   the policy's id, audited, and no run exists; with no permit at all nothing starts;
//! - an `@escalate("approval")` forbid holds the run for a human (the approval names the
//!   policy); approved, it runs; held, then forbidden outright by a reloaded policy,
//!   approving it cancels it instead — it is decided again, approved, under the policies in
//!   force then — and it never runs;
//! - the payload is typed from the triggers' schemas: a policy reading an attribute no
//!   trigger declares does not load (`ostiary policy test --dir`), nor one reading a
//!   declared one without testing for it first (every payload attribute is optional); one
//!   that tests and reads a declared one does, and decides the trigger's cases.

use serde_json::{json, Value};

use crate::support::cli::ostiary;
use crate::support::runs::*;

const POLICY: &str = r#"
@id("deploys")
permit (principal == Ostiary::Agent::"deployer", action == Ostiary::Action::"trigger", resource == Ostiary::Trigger::"deploy")
when { resource.kind == "api" && context.payload has env };

@id("prod-needs-human")
@escalate("approval")
forbid (principal, action == Ostiary::Action::"trigger", resource)
when { context.payload has env && context.payload.env == "prod" }
unless { context.approval.granted };

@id("freeze")
forbid (principal, action == Ostiary::Action::"trigger", resource)
when { context.payload has env && context.payload.env == "frozen" };
"#;

fn triggers(dir: &str) -> String {
    format!(
        r#"
[approvals]
approvers = ["alice@example.com"]

[[trigger]]
name = "deploy"
kind = "api"
agent = "deployer"
profile = "none"
schema = {{ type = "object", required = ["env"], properties = {{ env = {{ type = "string" }} }} }}
command = ["sh", "-c", '''echo "$OSTIARY_RUN_ID" >> "{dir}/deploy.runs"''']
"#
    )
}

async fn rig(marks: &Marks, policy: &str) -> RunsRig {
    RunsRig::start_with(
        &triggers(&marks.dir().display().to_string()),
        Options {
            policy: Some(policy.to_owned()),
            ..Options::default()
        },
    )
    .await
}

/// `POST /v1/runs` with the admin token, answered however it is.
async fn start(rig: &RunsRig, payload: Value) -> ostiary_e2e::raw::Reply {
    let body = json!({"trigger": "deploy", "payload": payload});
    rig.call("POST", "/v1/runs", Some(&rig.admin), Some(&body))
        .await
}

async fn approve(rig: &RunsRig, run: &str) -> String {
    let listed = rig.cli_json(&["approvals", "list"]).await;
    let approval = listed["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["session"] == format!("run:{run}"))
        .unwrap_or_else(|| panic!("no approval for {run}: {listed:#}"))
        .clone();
    let id = approval["approval_id"].as_str().unwrap().to_owned();
    let shown = rig.cli_json(&["approvals", "show", &id]).await;
    assert_eq!(
        shown["policies"],
        json!(["prod-needs-human"]),
        "the approval names the policy that asked for it: {shown:#}"
    );
    let config = rig.server.config_arg();
    let out = ostiary(&[
        "--config",
        &config,
        "approvals",
        "approve",
        &id,
        "--as",
        "alice@example.com",
    ])
    .await;
    assert!(out.success(), "approve: {out}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_permits_refuses_and_holds_runs_and_decides_again_on_approval() {
    let marks = Marks::new();
    let rig = rig(&marks, POLICY).await;

    // Permitted: it runs.
    let staging = rig.start_run("deploy", json!({"env": "staging"})).await;
    rig.wait_status(&staging, "succeeded").await;

    // Forbidden: 403 with the policy, and no run was made.
    let frozen = start(&rig, json!({"env": "frozen"})).await;
    assert_eq!(frozen.status.as_u16(), 403, "{frozen}");
    let body = frozen.json();
    assert_eq!(body["error"], "denied", "{body:#}");
    assert_eq!(body["policies"], json!(["freeze"]), "{body:#}");
    assert_eq!(body["resource"], "Ostiary::Trigger::\"deploy\"", "{body:#}");
    assert!(body.get("run_id").is_none(), "{body:#}");
    let records = rig
        .trigger_records(|r| r.iter().any(|r| r["decision"] == "deny"))
        .await;
    let denied = records.iter().find(|r| r["decision"] == "deny").unwrap();
    assert_eq!(denied["error"], "denied", "{denied:#}");
    assert_eq!(denied["policies"], json!(["freeze"]), "{denied:#}");
    // Kept so that it can be decided again (replay, a shadow set).
    let kept = ostiary_policies::recorded::from_json(&denied["decided"]).unwrap();
    assert_eq!(kept.outcome, "deny", "{denied:#}");
    assert_eq!(kept.policies, ["freeze"], "{denied:#}");
    assert_eq!(kept.request.action.id(), "trigger", "{denied:#}");

    // Escalated: held for a human, naming the policy; approved, it runs.
    let prod = start(&rig, json!({"env": "prod"})).await;
    assert_eq!(prod.status.as_u16(), 202, "{prod}");
    let prod = prod.json()["run_id"].as_str().unwrap().to_owned();
    assert_eq!(rig.run(&prod).await["status"], "awaiting_approval");
    approve(&rig, &prod).await;
    rig.wait_status(&prod, "succeeded").await;

    // Held under one set, forbidden outright by the next: approving it cancels it.
    let held = start(&rig, json!({"env": "prod"})).await;
    let held = held.json()["run_id"].as_str().unwrap().to_owned();
    assert_eq!(rig.run(&held).await["status"], "awaiting_approval");
    let stricter = format!(
        "{POLICY}\n@id(\"no-prod\")\nforbid (principal, action == Ostiary::Action::\"trigger\", resource)\n\
         when {{ context.payload has env && context.payload.env == \"prod\" }};\n"
    );
    std::fs::write(rig.server.dir.path().join("policies/test.cedar"), stricter).unwrap();
    let reload = rig
        .call("POST", "/v1/policy/reload", Some(&rig.admin), None)
        .await;
    assert_eq!(reload.status.as_u16(), 200, "{reload}");
    approve(&rig, &held).await;
    let cancelled = rig.wait_status(&held, "cancelled").await;
    let why = cancelled["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("policy denies") && why.contains("no-prod"),
        "{cancelled:#}"
    );
    assert_eq!(cancelled["attempt"], 0, "it never started: {cancelled:#}");

    // Exactly the two permitted runs ran, once each.
    let ran = marks.lines("deploy.runs");
    assert_eq!(ran, [staging, prod], "{}", rig.log());
    let runs = rig.runs("trigger=deploy").await;
    assert_eq!(runs.len(), 3, "no run for the forbidden call: {runs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_permit_for_triggers_nothing_starts() {
    let marks = Marks::new();
    let rig = rig(
        &marks,
        r#"@id("echo") permit (principal, action == Ostiary::Action::"http", resource);"#,
    )
    .await;
    let reply = start(&rig, json!({"env": "staging"})).await;
    assert_eq!(reply.status.as_u16(), 403, "{reply}");
    let body = reply.json();
    assert_eq!(body["error"], "denied", "{body:#}");
    assert_eq!(body["policies"], json!([]), "a default deny: {body:#}");
    assert!(rig.runs("trigger=deploy").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payload_is_typed_from_the_triggers_schemas() {
    let marks = Marks::new();
    let rig = rig(&marks, POLICY).await;
    let config = rig.server.config_arg();
    let dir = tempfile::tempdir().unwrap();
    // A case of the trigger's, decided on its typed payload.
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    std::fs::write(
        dir.path().join("tests/deploy.toml"),
        r#"[[case]]
name = "qa deploys"
agent = "deployer"
action = "trigger"
trigger = "deploy"
kind = "api"
payload = { env = "qa" }
expect = "allow"

[[case]]
name = "staging does not"
agent = "deployer"
action = "trigger"
trigger = "deploy"
kind = "api"
payload = { env = "staging" }
expect = "deny"
"#,
    )
    .unwrap();
    let test = |text: &str| {
        std::fs::write(dir.path().join("p.cedar"), text).unwrap();
        let dir = dir.path().display().to_string();
        let config = config.clone();
        async move { ostiary(&["--config", &config, "policy", "test", "--dir", &dir]).await }
    };
    let declared = test(
        r#"permit (principal, action == Ostiary::Action::"trigger", resource)
           when { context.payload has env && context.payload.env == "qa" };"#,
    )
    .await;
    assert!(
        declared.success(),
        "{declared}\n{}",
        std::fs::read_to_string(&config).unwrap_or_default()
    );
    assert!(declared.stdout.contains("2 passed, 0 failed"), "{declared}");
    // An attribute no trigger declares cannot be read; tested for, it is never there (Cedar
    // types the test false, so the policy loads but never matches).
    let undeclared = test(
        r#"permit (principal, action == Ostiary::Action::"trigger", resource)
           when { context.payload.region == "eu" };"#,
    )
    .await;
    assert!(!undeclared.success(), "{undeclared}");
    assert!(
        undeclared.stderr.contains("p.cedar") && undeclared.stderr.contains("region"),
        "{undeclared}"
    );
    let tested = test(
        r#"permit (principal, action == Ostiary::Action::"trigger", resource)
           when { context.payload has region || context.payload has env && context.payload.env == "qa" };"#,
    )
    .await;
    assert!(tested.success(), "{tested}");
    // `policy explain` decides a trigger as the proxy does (the config's policies).
    let explain = |payload: &'static str| {
        let config = config.clone();
        async move {
            ostiary(&[
                "--config",
                &config,
                "--json",
                "policy",
                "explain",
                "--agent",
                "deployer",
                "--trigger",
                "deploy",
                "--payload",
                payload,
            ])
            .await
        }
    };
    let frozen = explain(r#"{"env":"frozen"}"#).await;
    assert!(frozen.success(), "{frozen}");
    let frozen: Value = serde_json::from_str(&frozen.stdout).unwrap();
    assert_eq!(frozen["decision"], "deny", "{frozen:#}");
    assert!(frozen.to_string().contains("freeze"), "{frozen:#}");
    let staging = explain(r#"{"env":"staging"}"#).await;
    let staging: Value = serde_json::from_str(&staging.stdout).unwrap();
    assert_eq!(staging["decision"], "allow", "{staging:#}");
    let unknown = ostiary(&[
        "--config",
        &config,
        "policy",
        "explain",
        "--agent",
        "deployer",
        "--trigger",
        "nope",
    ])
    .await;
    assert!(
        !unknown.success() && unknown.stderr.contains("no such trigger"),
        "{unknown}"
    );

    // Unguarded, even a declared attribute is refused: every payload attribute is optional.
    let unguarded = test(
        r#"permit (principal, action == Ostiary::Action::"trigger", resource)
           when { context.payload.env == "qa" };"#,
    )
    .await;
    assert!(!unguarded.success(), "{unguarded}");
}
