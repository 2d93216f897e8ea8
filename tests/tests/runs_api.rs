//! API triggers (`[[trigger]] kind = "api"`) against the real `ostiary serve`: `POST /v1/runs`
//! and `ostiary runs start|list|show`.
//!
//! What it proves:
//! - a run starts with the admin token, or with the trigger's own token (`token = "<a
//!   credential>"`), and with nothing else: a wrong token, no token, and another trigger's
//!   token are 401 and start nothing; the trigger's token opens no other route (401 on `GET
//!   /v1/runs`); a webhook trigger or an unknown name through `/v1/runs` is 404;
//! - each run started gets its payload;
//! - `ostiary runs start NAME --payload '{…}'` queues a run, `runs list` and `runs show` show
//!   it as a person reads them and, with `--json`, as JSON that parses; a refusal (an unknown
//!   trigger, an unknown run) exits 1 with the server's message.

use serde_json::{json, Value};

use crate::support::cli::ostiary;
use crate::support::runs::*;

fn triggers(marks: &Marks) -> String {
    let marks = marks.dir().display();
    format!(
        r#"
[[trigger]]
name = "api-job"
kind = "api"
agent = "job-bot"
profile = "none"
token = "api-token"
command = ["sh", "-c", '''cp "$OSTIARY_TRIGGER_PAYLOAD" "{marks}/$OSTIARY_RUN_ID.json" && echo "$OSTIARY_RUN_ID" >> "{marks}/api-job.runs"''']

[[trigger]]
name = "api-admin-only"
kind = "api"
agent = "job-bot"
profile = "none"
command = ["sh", "-c", '''echo "$OSTIARY_RUN_ID" >> "{marks}/api-admin-only.runs"''']

[[trigger]]
name = "gh-push"
kind = "webhook"
agent = "ci-bot"
profile = "none"
command = ["true"]
signature = {{ scheme = "github", secret = "gh" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_start_with_the_admin_token_or_the_triggers_own_and_nothing_else() {
    let marks = Marks::new();
    let rig = RunsRig::start(&triggers(&marks)).await;
    let start = |trigger: &str, payload: Value| json!({"trigger": trigger, "payload": payload});

    let by_admin = rig
        .call(
            "POST",
            "/v1/runs",
            Some(&rig.admin),
            Some(&start("api-job", json!({"task": "by admin"}))),
        )
        .await;
    assert_eq!(by_admin.status.as_u16(), 202, "{by_admin}");
    let by_admin = by_admin.json()["run_id"].as_str().unwrap().to_owned();
    let by_token = rig
        .call(
            "POST",
            "/v1/runs",
            Some(API_TOKEN),
            Some(&start("api-job", json!({"task": "by token"}))),
        )
        .await;
    assert_eq!(by_token.status.as_u16(), 202, "{by_token}");
    assert_eq!(by_token.json()["trigger"], "api-job");
    let by_token = by_token.json()["run_id"].as_str().unwrap().to_owned();

    // Refused: a wrong token, none, the token of another trigger (this one has none).
    for (token, trigger) in [
        (Some("api-trigger-token-5d0f"), "api-job"),
        (None, "api-job"),
        (Some(API_TOKEN), "api-admin-only"),
    ] {
        let reply = rig
            .call(
                "POST",
                "/v1/runs",
                token,
                Some(&start(trigger, json!({"task": "refused"}))),
            )
            .await;
        assert_eq!(reply.status.as_u16(), 401, "{token:?} {trigger}: {reply}");
        assert_eq!(reply.json()["error"], "unauthenticated", "{reply}");
    }
    // The trigger's token is no admin token.
    for (method, path) in [
        ("GET", "/v1/runs".to_owned()),
        ("GET", format!("/v1/runs/{by_admin}")),
        ("POST", format!("/v1/runs/{by_admin}/cancel")),
    ] {
        let reply = rig.call(method, &path, Some(API_TOKEN), None).await;
        assert_eq!(reply.status.as_u16(), 401, "{method} {path}: {reply}");
    }
    // Not an API trigger, or none at all.
    for trigger in ["gh-push", "no-such-trigger"] {
        let reply = rig
            .call(
                "POST",
                "/v1/runs",
                Some(&rig.admin),
                Some(&start(trigger, json!({}))),
            )
            .await;
        assert_eq!(reply.status.as_u16(), 404, "{trigger}: {reply}");
        assert_eq!(reply.json()["error"], "not_found", "{reply}");
    }

    for (id, task) in [(&by_admin, "by admin"), (&by_token, "by token")] {
        let run = rig.wait_status(id, "succeeded").await;
        assert_eq!(run["kind"], "api", "{run:#}");
        let seen: Value =
            serde_json::from_str(&marks.read(&format!("{id}.json"))).unwrap_or(Value::Null);
        assert_eq!(seen, json!({"task": task}), "run {id}");
    }
    let mut listed: Vec<String> = rig
        .runs("")
        .await
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected = vec![by_admin, by_token];
    expected.sort();
    assert_eq!(listed, expected);
    assert!(marks.lines("api-admin-only.runs").is_empty());
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_starts_lists_and_shows_runs() {
    let marks = Marks::new();
    let rig = RunsRig::start(&triggers(&marks)).await;
    let config = rig.server.config_arg();

    // Started as a person would: the answer names the run.
    let out = ostiary(&[
        "--config",
        &config,
        "runs",
        "start",
        "api-job",
        "--payload",
        r#"{"task":"from the cli","n":1}"#,
    ])
    .await;
    assert!(out.success(), "{out}");
    let first = out
        .stdout
        .trim()
        .strip_prefix("queued: ")
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    assert!(first.starts_with("run_"), "{out}");
    // And with --json.
    let started = rig
        .cli_json(&[
            "runs",
            "start",
            "api-job",
            "--payload",
            r#"{"task":"json"}"#,
        ])
        .await;
    let second = started["run_id"].as_str().unwrap().to_owned();
    assert_eq!(started["trigger"], "api-job", "{started}");
    assert_eq!(started["duplicate"], false, "{started}");

    for id in [&first, &second] {
        rig.wait_status(id, "succeeded").await;
    }
    let seen: Value = serde_json::from_str(&marks.read(&format!("{first}.json"))).unwrap();
    assert_eq!(seen, json!({"task": "from the cli", "n": 1}));

    // Listed, newest first, as a table and as JSON.
    let out = ostiary(&["--config", &config, "runs", "list"]).await;
    assert!(out.success(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("RUN"), "{out}");
    assert!(
        lines[1].starts_with(&second) && lines[1].contains("succeeded"),
        "{out}"
    );
    assert!(
        lines[2].starts_with(&first) && lines[2].contains("api-job"),
        "{out}"
    );
    let listed = rig.cli_json(&["runs", "list"]).await;
    let ids: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second.as_str(), first.as_str()], "{listed:#}");
    let filtered = rig
        .cli_json(&["runs", "list", "--status", "failed", "--trigger", "api-job"])
        .await;
    assert_eq!(filtered["runs"], json!([]), "{filtered:#}");

    // Shown, as text and as JSON.
    let out = ostiary(&["--config", &config, "runs", "show", &first]).await;
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains(&format!("run          {first}")),
        "{out}"
    );
    assert!(out.stdout.contains("trigger      api-job (api)"), "{out}");
    assert!(out.stdout.contains("status       succeeded"), "{out}");
    assert!(out.stdout.contains("exit         0"), "{out}");
    let shown = rig.cli_json(&["runs", "show", &first]).await;
    assert_eq!(shown["run_id"], first.as_str(), "{shown:#}");
    assert_eq!(shown["status"], "succeeded", "{shown:#}");
    assert_eq!(shown["payload"], json!({"task": "from the cli", "n": 1}));

    // Refusals: the server's message, exit 1.
    let out = ostiary(&["--config", &config, "runs", "start", "no-such-trigger"]).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stderr.contains("no-such-trigger"), "{out}");
    let out = ostiary(&[
        "--config",
        &config,
        "runs",
        "show",
        "run_00000000000000000000",
    ])
    .await;
    assert_eq!(out.status, 1, "{out}");
    let out = ostiary(&[
        "--config",
        &config,
        "runs",
        "start",
        "api-job",
        "--payload",
        "{not json",
    ])
    .await;
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("--payload"), "{out}");
    assert_eq!(rig.runs("").await.len(), 2);
    rig.server.stop().await;
}
