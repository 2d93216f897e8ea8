//! Undo for reversible actions (docs/undo.md), against the real `ostiary serve` and a local
//! REST upstream whose records can be created and deleted (`/records`).
//!
//! What it proves:
//! - three records created through a catalog tool that declares `undo` are reversed by
//!   `ostiary sessions undo` newest first, after the session ended, each undo injected with
//!   the tool's credential binding and audited as kind `undo`; a dry run before sends
//!   nothing; a second undo sends nothing again; a call of a tool without an undo is
//!   reported as such;
//! - a policy that forbids `Action::"tool:<name>.undo"` refuses it (nothing is sent, the
//!   record stays), and once the policy no longer does, the same undo runs;
//! - a value the upstream answers can never leave its place in the undo's path (a `../`
//!   id is percent-encoded, never a traversal), an answer that carries a secret is never
//!   kept, and the control route refuses malformed asks;
//! - concurrent undos (two CLI calls, or two replicas on one PostgreSQL store) send each undo
//!   once, and a replica reverses calls made through another, newest first across both;
//! - an approved call records its undo; an undo the catalog no longer declares is refused.

use ostiary_e2e::clients;
use ostiary_e2e::upstream::Upstream;
use serde_json::{json, Value};

use crate::support::cli::{audit_query, ostiary, session, Server};

const SECRET: &str = "rec_live_CANARY_9d1f0e77ab";

const CATALOG: &str = r#"
[[tool]]
name  = "records.create"
tier  = "write"
match = { host = "api.example.test", method = "POST", path = "/records" }
args_schema = { type = "object", properties = { title = { type = "string" } } }
undo  = { method = "DELETE", path = "/records/{response.id}" }

[[tool]]
name  = "notes.post"
tier  = "write"
match = { host = "api.example.test", method = "POST", path = "/messages" }
"#;

const POLICY: &str = r#"
@id("writes") permit (principal, action in Ostiary::Action::"tier:write", resource);
"#;

const HOLD_BIG: &str = r#"
@id("writes") permit (principal, action in Ostiary::Action::"tier:write", resource);
@id("big-needs-human") @escalate("approval")
forbid (principal, action == Ostiary::Action::"tool:records.create", resource)
when { context.args has title && context.args.title like "big*" }
unless { context.approval.granted };
"#;

const KEEP_RECORDS: &str = r#"
@id("writes") permit (principal, action in Ostiary::Action::"tier:write", resource);
@id("keep-records") forbid (principal, action == Ostiary::Action::"tool:records.create.undo", resource)
when { context.args has title && context.args.title like "keep*" };
"#;

struct Rig {
    upstream: Upstream,
    server: Server,
    _secrets: tempfile::TempDir,
}

async fn start(policy: &str) -> Rig {
    let upstream = Upstream::builder()
        .names(&["api.example.test"])
        .start()
        .await;
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("secrets.toml");
    std::fs::write(&file, format!("records = \"{SECRET}\"\n")).unwrap();
    let extra = format!(
        r#"
[sessions.watchdog]
enabled = false

[approvals]
approvers = ["alice@example.com"]

[broker]
backend = "file"
file = "{}"

[[credential]]
name = "records"
source = {{ file = "records" }}
hosts = ["api.example.test"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}
"#,
        file.display()
    );
    let server = Server::start_with_files(
        &upstream,
        &["api.example.test"],
        policy,
        &[("tools.toml", CATALOG)],
        &extra,
        "info",
    )
    .await;
    Rig {
        upstream,
        server,
        _secrets: secrets,
    }
}

/// What an agent's POST got: its status and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: String,
}

/// An HTTPS POST through the proxy by curl, trusting the proxy's CA (a credential is only
/// ever sent over verified TLS).
async fn post(rig: &Rig, token: &str, path_and_query: &str, body: &Value) -> Reply {
    let url = format!(
        "https://api.example.test:{}{path_and_query}",
        rig.upstream.port()
    );
    let proxy = format!("http://agent:{token}@{}", rig.server.proxy_addr);
    let ca = rig.server.state.join("ca.pem").display().to_string();
    let body = body.to_string();
    let out = clients::curl(
        &[
            "-sS",
            "-x",
            &proxy,
            "--cacert",
            &ca,
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
            "-w",
            "\n%{http_code}",
            &url,
        ],
        &[],
    )
    .await;
    assert!(out.success(), "curl {url}: {out}");
    let (body, status) = out.stdout.rsplit_once('\n').unwrap_or_default();
    Reply {
        status: status
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {out}")),
        body: body.to_owned(),
    }
}

/// Create `n` records through the tool (titles `t0`, `t1`, …); their ids, in order. The
/// agent never sees the credential the proxy injected.
async fn create(rig: &Rig, token: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let reply = post(rig, token, "/records", &json!({ "title": format!("t{i}") })).await;
        assert_eq!(reply.status, 201, "{reply:?}");
        assert!(!reply.body.contains(SECRET));
        ids.push(json_of(&reply)["id"].as_str().unwrap().to_owned());
    }
    ids
}

fn json_of(reply: &Reply) -> Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {reply:?}"))
}

/// `ostiary sessions undo ID <args> --json`: the report and whether it exited 0.
async fn undo(rig: &Rig, id: &str, args: &[&str]) -> (Value, bool) {
    let config = rig.server.config_arg();
    let mut all = vec![
        "--config",
        config.as_str(),
        "--json",
        "sessions",
        "undo",
        id,
    ];
    all.extend_from_slice(args);
    let out = ostiary(&all).await;
    assert!(
        out.status == 0 || out.status == 1,
        "ostiary sessions undo: {out}"
    );
    let report = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    (report, out.success())
}

fn calls(report: &Value, key: &str) -> Vec<String> {
    report[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key}: {report}"))
        .iter()
        .map(|e| e["call"].as_str().unwrap().to_owned())
        .collect()
}

/// The DELETEs the upstream received, in order, with the Authorization each carried.
fn deletes(upstream: &Upstream) -> Vec<(String, Option<String>)> {
    upstream
        .seen()
        .into_iter()
        .filter(|s| s.method == http::Method::DELETE)
        .map(|s| (s.path.clone(), s.header("authorization").map(str::to_owned)))
        .collect()
}

fn admin_token(server: &Server) -> String {
    std::fs::read_to_string(server.state.join("admin.token"))
        .unwrap()
        .trim()
        .to_owned()
}

async fn control_get(server: &Server, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("http://{}{path}", server.control_addr))
        .bearer_auth(admin_token(server))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn control(server: &Server, path: &str, body: Option<&str>, admin: bool) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(format!("http://{}{path}", server.control_addr));
    if admin {
        req = req.bearer_auth(admin_token(server));
    }
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_created_records_are_reversed_newest_first_with_the_tools_credential() {
    let rig = start(POLICY).await;
    let (id, token) = session(&rig.server, "writer").await;
    let created = create(&rig, &token, 3).await;
    let note = post(&rig, &token, "/messages", &json!({"text": "hello"})).await;
    assert_eq!(note.status, 201, "{note:?}");
    assert_eq!(rig.upstream.records().len(), 3);
    let call_records = audit_query(
        &rig.server,
        &["--session", &id, "--decision", "allow"],
        |r| {
            r.iter().filter(|r| r["tool"] == "records.create").count() == 3
                && r.iter().any(|r| r["tool"] == "notes.post")
        },
    )
    .await;
    let mut call_ids: Vec<String> = call_records
        .iter()
        .filter(|r| r["tool"] == "records.create")
        .map(|r| {
            assert_eq!(r["undo"], "recorded", "{r}");
            r["request_id"].as_str().unwrap().to_owned()
        })
        .collect();
    let note_id = call_records
        .iter()
        .find(|r| r["tool"] == "notes.post")
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .expect("the note's record");
    call_ids.reverse();

    // A dry run decides each and sends nothing.
    let (dry, ok) = undo(&rig, &id, &["--dry-run"]).await;
    assert!(ok, "{dry}");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(calls(&dry, "reversed"), call_ids, "newest first: {dry}");
    assert!(deletes(&rig.upstream).is_empty());
    assert_eq!(rig.upstream.records().len(), 3);

    // The session ends; its calls can still be reversed.
    let config = rig.server.config_arg();
    let out = ostiary(&["--config", &config, "sessions", "terminate", &id]).await;
    assert!(out.success(), "{out}");

    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(ok, "{report}");
    assert_eq!(calls(&report, "reversed"), call_ids, "{report}");
    for (entry, record) in report["reversed"]
        .as_array()
        .unwrap()
        .iter()
        .zip(created.iter().rev())
    {
        assert_eq!(entry["method"], "DELETE");
        let url = entry["url"].as_str().unwrap();
        assert!(url.starts_with("https://api.example.test:"), "{entry}");
        assert!(url.ends_with(&format!("/records/{record}")), "{entry}");
        assert_eq!(entry["status"], 204, "{entry}");
        assert_eq!(entry["policies"], json!(["writes"]), "{entry}");
    }
    let no_undo: Vec<&str> = report["no_undo"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call"].as_str().unwrap())
        .collect();
    assert_eq!(no_undo, [note_id.as_str()], "{report}");
    // Newest first, each with the tool's credential; nothing is left.
    let want: Vec<(String, Option<String>)> = created
        .iter()
        .rev()
        .map(|r| (format!("/records/{r}"), Some(format!("Bearer {SECRET}"))))
        .collect();
    assert_eq!(deletes(&rig.upstream), want);
    assert!(rig.upstream.records().is_empty());
    // The report never carries the credential.
    assert!(!report.to_string().contains(SECRET));

    // Each undo is audited as kind `undo`, decided as the tool's undo action.
    let undos = audit_query(&rig.server, &["--session", &id], |r| {
        r.iter().filter(|r| r["kind"] == "undo").count() == 3
    })
    .await;
    let undos: Vec<&Value> = undos.iter().filter(|r| r["kind"] == "undo").collect();
    assert_eq!(undos.len(), 3);
    for (record, call) in undos.iter().zip(&call_ids) {
        assert_eq!(record["decision"], "allow", "{record}");
        assert_eq!(record["tool"], "records.create");
        assert_eq!(record["undo"], format!("of {call}"));
        assert_eq!(record["credentials"], json!(["records"]), "{record}");
        assert_eq!(record["decided"]["action"]["undo"], true, "{record}");
        assert!(record["policy_version"].as_str().is_some());
    }

    // Undone once: a second undo sends nothing.
    let (again, ok) = undo(&rig, &id, &[]).await;
    assert!(ok, "{again}");
    assert_eq!(calls(&again, "already_reversed"), call_ids);
    assert!(calls(&again, "reversed").is_empty());
    assert_eq!(deletes(&rig.upstream).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_forbids_the_undo_refuses_it_until_it_no_longer_does() {
    let rig = start(KEEP_RECORDS).await;
    let (id, token) = session(&rig.server, "writer").await;
    let kept = post(&rig, &token, "/records", &json!({"title": "keep me"})).await;
    assert_eq!(kept.status, 201, "{kept:?}");
    let other = post(&rig, &token, "/records", &json!({"title": "drop me"})).await;
    assert_eq!(other.status, 201, "{other:?}");

    // `policy explain --undo` asks what the undo will be asked.
    let config = rig.server.config_arg();
    let explain = |title: &'static str| {
        let config = config.clone();
        async move {
            let args = format!(r#"{{"title":"{title}"}}"#);
            let out = ostiary(&[
                "--config",
                &config,
                "--json",
                "policy",
                "explain",
                "--agent",
                "writer",
                "--tool",
                "records.create",
                "--undo",
                "--args",
                &args,
            ])
            .await;
            assert!(out.success(), "{out}");
            serde_json::from_str::<Value>(&out.stdout).unwrap()
        }
    };
    let kept_explained = explain("keep me").await;
    assert_eq!(kept_explained["decision"], "deny", "{kept_explained}");
    assert_eq!(
        kept_explained["request"]["action"],
        "tool:records.create.undo"
    );
    assert_eq!(explain("drop me").await["decision"], "allow");
    let out = ostiary(&[
        "--config",
        &config,
        "policy",
        "explain",
        "--agent",
        "writer",
        "--tool",
        "notes.post",
        "--undo",
    ])
    .await;
    assert!(
        !out.success() && out.stderr.contains("declares no undo"),
        "{out}"
    );

    let (dry, ok) = undo(&rig, &id, &["--dry-run"]).await;
    assert!(!ok, "a refused undo fails the command: {dry}");
    assert_eq!(
        dry["refused"][0]["policies"],
        json!(["keep-records"]),
        "{dry}"
    );

    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(!ok, "{report}");
    assert_eq!(report["reversed"].as_array().unwrap().len(), 1, "{report}");
    let refused = &report["refused"][0];
    assert_eq!(refused["policies"], json!(["keep-records"]), "{report}");
    assert!(
        refused["detail"].as_str().unwrap().contains("denied"),
        "{refused}"
    );
    // Only the permitted undo was sent; the forbidden one's record is still there.
    let left = rig.upstream.records();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["title"], "keep me");
    assert_eq!(deletes(&rig.upstream).len(), 1);
    let records = audit_query(&rig.server, &["--session", &id], |r| {
        r.iter().filter(|r| r["kind"] == "undo").count() == 2
    })
    .await;
    let denied: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "undo" && r["decision"] == "deny")
        .collect();
    assert_eq!(denied.len(), 1, "{records:?}");
    assert_eq!(denied[0]["policies"], json!(["keep-records"]));

    // The policy changes; the refused undo is tried again and runs.
    std::fs::write(rig.server.dir.path().join("policies/test.cedar"), POLICY).unwrap();
    let (status, body) = control(&rig.server, "/v1/policy/reload", None, true).await;
    assert_eq!(status, 200, "{body}");
    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(ok, "{report}");
    assert_eq!(report["reversed"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["already_reversed"].as_array().unwrap().len(), 1);
    assert!(rig.upstream.records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_values_stay_in_their_place_and_secrets_are_never_kept() {
    let rig = start(POLICY).await;
    let (id, token) = session(&rig.server, "writer").await;
    // An upstream answering an id that would climb out of the collection.
    let climb = post(
        &rig,
        &token,
        "/records?id=../../admin%3Fall",
        &json!({"title": "x"}),
    )
    .await;
    assert_eq!(climb.status, 201, "{climb:?}");
    // One answering an id that is a credential: never written to the journal.
    let key = "AKIAIOSFODNN7EXAMPLF";
    let leak = post(
        &rig,
        &token,
        &format!("/records?id={key}"),
        &json!({"title": "y"}),
    )
    .await;
    assert_eq!(leak.status, 201, "{leak:?}");

    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(
        !ok,
        "the climbing undo fails upstream (no such record): {report}"
    );
    let unavailable = &report["unavailable"][0];
    assert!(
        unavailable["detail"]
            .as_str()
            .unwrap()
            .contains("looks like a secret"),
        "{report}"
    );
    assert!(!report.to_string().contains(key));
    let failed = &report["failed"][0];
    assert_eq!(failed["status"], 404, "{report}");
    // Encoded whole: the value filled one segment, nothing above `/records` was asked.
    assert_eq!(
        deletes(&rig.upstream),
        [(
            "/records/..%2F..%2Fadmin%253Fall".to_owned(),
            Some(format!("Bearer {SECRET}"))
        )]
    );
    assert_eq!(rig.upstream.records().len(), 2);
    // Nothing of the key in the database.
    for entry in std::fs::read_dir(&rig.server.state).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "db") {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
                "{} holds the key",
                path.display()
            );
        }
    }

    // The route refuses what it cannot read, and asks for the admin token.
    let path = format!("/v1/sessions/{id}/undo");
    for (body, want) in [
        (r#"{"since": "yesterday-ish"}"#, 400),
        (r#"{"dry_run": true, "dry_run": false}"#, 400),
        (r#"{"dry_run": "yes"}"#, 400),
        (r#"{"what": 1}"#, 400),
        (r#"{"since": [1]}"#, 400),
        ("not json", 400),
    ] {
        let (status, answer) = control(&rig.server, &path, Some(body), true).await;
        assert_eq!(status, want, "{body}: {answer}");
        assert_eq!(answer["error"], "bad_request", "{body}: {answer}");
    }
    let (status, _) = control(&rig.server, &path, Some("{}"), false).await;
    assert_eq!(status, 401);
    let (status, answer) =
        control(&rig.server, "/v1/sessions/no-such-session/undo", None, true).await;
    assert_eq!(status, 404, "{answer}");
    // `since` in the future: nothing to undo, nothing sent.
    let (status, answer) = control(
        &rig.server,
        &path,
        Some(r#"{"since": 99999999999999}"#),
        true,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["failed"].as_array().unwrap().is_empty(), "{answer}");
    assert_eq!(deletes(&rig.upstream).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_undos_at_once_send_each_undo_exactly_once() {
    let rig = start(POLICY).await;
    let (id, token) = session(&rig.server, "writer").await;
    create(&rig, &token, 6).await;
    let ((a, _), (b, _)) = tokio::join!(undo(&rig, &id, &[]), undo(&rig, &id, &[]));
    let mut reversed = calls(&a, "reversed");
    reversed.extend(calls(&b, "reversed"));
    reversed.sort();
    let before = reversed.len();
    reversed.dedup();
    assert_eq!(before, reversed.len(), "reversed twice: {a} {b}");
    assert_eq!(reversed.len(), 6, "{a} {b}");
    let mut paths: Vec<String> = deletes(&rig.upstream).into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths.len(), 6, "{paths:?}");
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 6, "each record deleted once: {paths:?}");
    assert!(rig.upstream.records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_records_its_undo_as_a_live_one_does() {
    let rig = start(HOLD_BIG).await;
    let (id, token) = session(&rig.server, "writer").await;
    let held = post(&rig, &token, "/records", &json!({"title": "big batch"})).await;
    assert_eq!(held.status, 202, "{held:?}");
    let approval = json_of(&held)["approval_id"].as_str().unwrap().to_owned();
    assert!(rig.upstream.records().is_empty());
    let (status, body) = control(
        &rig.server,
        &format!("/v1/approvals/{approval}/approve"),
        Some(r#"{"approver": "alice@example.com"}"#),
        true,
    )
    .await;
    assert!(status == 200 || status == 202, "{status}: {body}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let a = control_get(&rig.server, &format!("/v1/approvals/{approval}")).await;
        if a["status"] == "executed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never executed: {a}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(rig.upstream.records().len(), 1);

    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(ok, "{report}");
    assert_eq!(report["reversed"].as_array().unwrap().len(), 1, "{report}");
    assert!(rig.upstream.records().is_empty());
    // The undo itself is decided under the escalating policy: it names the call's tool,
    // not its undo, so the undo is allowed outright.
    assert_eq!(
        report["reversed"][0]["policies"],
        json!(["writes"]),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_no_longer_declares_the_undo_refuses_it() {
    let rig = start(POLICY).await;
    let (id, token) = session(&rig.server, "writer").await;
    let made = post(&rig, &token, "/records", &json!({"title": "t"})).await;
    assert_eq!(made.status, 201, "{made:?}");
    // The tool loses its undo; the entry recorded under the old catalog is not sent.
    let without: String = CATALOG
        .lines()
        .filter(|l| !l.starts_with("undo"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(rig.server.dir.path().join("policies/tools.toml"), without).unwrap();
    let (status, body) = control(&rig.server, "/v1/policy/reload", None, true).await;
    assert_eq!(status, 200, "{body}");
    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(!ok, "{report}");
    let refused = &report["refused"][0];
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("no longer declares an undo"),
        "{report}"
    );
    assert!(deletes(&rig.upstream).is_empty());
    assert_eq!(rig.upstream.records().len(), 1);
    // Put back, the same entry runs: a refusal is tried again.
    std::fs::write(rig.server.dir.path().join("policies/tools.toml"), CATALOG).unwrap();
    let (status, body) = control(&rig.server, "/v1/policy/reload", None, true).await;
    assert_eq!(status, 200, "{body}");
    let (report, ok) = undo(&rig, &id, &[]).await;
    assert!(ok, "{report}");
    assert!(rig.upstream.records().is_empty());
}

/// Two replicas on one PostgreSQL store: calls recorded on either are reversed from the
/// other, newest first across both, and two undos at once on the two replicas send each
/// undo once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_journal_and_send_each_undo_once() {
    use crate::support::fleet::Fleet;

    let upstream = Upstream::builder().start().await;
    let mut fleet = Fleet::start(&upstream, 0, "", None, None).await;
    std::fs::write(fleet.policies.join("tools.toml"), CATALOG).unwrap();
    std::fs::write(fleet.policies.join("test.cedar"), POLICY).unwrap();
    for i in 0..2 {
        let replica = fleet.start_replica(i).await;
        fleet.replicas.push(replica);
    }
    let session = fleet.root(0, "writer").await;
    let on = [fleet.agent(0, &session), fleet.agent(1, &session)];
    let mut created = Vec::new();
    for (n, replica) in [0usize, 1, 0].into_iter().enumerate() {
        let response = on[replica]
            .post(fleet.url("/records"))
            .json(&json!({ "title": format!("t{n}") }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        created.push(body["id"].as_str().unwrap().to_owned());
    }
    let report = fleet
        .control(1)
        .undo_session(&session.session_id, None, false)
        .await
        .unwrap();
    assert_eq!(report["reversed"].as_array().unwrap().len(), 3, "{report}");
    let want: Vec<String> = created
        .iter()
        .rev()
        .map(|r| format!("/records/{r}"))
        .collect();
    let sent: Vec<String> = paths(deletes(&upstream));
    assert_eq!(sent, want);
    assert!(upstream.records().is_empty());

    // More calls, then both replicas undo at once: each undo is sent once.
    for replica in [0usize, 1, 0, 1] {
        let response = on[replica]
            .post(fleet.url("/records"))
            .json(&json!({"title": "again"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
    }
    let (c0, c1) = (fleet.control(0), fleet.control(1));
    let (a, b) = tokio::join!(
        c0.undo_session(&session.session_id, None, false),
        c1.undo_session(&session.session_id, None, false),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let both = calls(&a, "reversed").len() + calls(&b, "reversed").len();
    assert_eq!(both, 4, "{a} {b}");
    assert_eq!(paths(deletes(&upstream)).len(), 7);
    assert!(upstream.records().is_empty());
}

fn paths(deletes: Vec<(String, Option<String>)>) -> Vec<String> {
    deletes.into_iter().map(|(path, _)| path).collect()
}
