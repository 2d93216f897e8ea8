//! MCP over Streamable HTTP end to end: the MCP Python SDK's server (behind TLS from the
//! test CA) as the upstream, and either the SDK's own client or hand-written JSON-RPC
//! through an intercepted tunnel as the agent. Each `tools/call` is decided on its own;
//! refused calls come back as JSON-RPC errors (HTTP 200) carrying the docs/design.md §5 body;
//! `tools/list` answers are filtered to what the session may call.

use crate::support::mcp as support;

use std::time::Duration;

use ostiary_e2e::clients::{client_script, python};
use ostiary_e2e::raw::{self, Reply};
use serde_json::{json, Value};
use support::{call, Rig, HOST};

const POLICIES: &str = r#"
// Every message but `tools/call` is decided as `Action::"mcp"`: the session plumbing, as
// the shipped library permits it; the SSE stream and the session's end are plain http.
@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource == Ostiary::Host::"mcp.example.test")
when {
  ["initialize", "ping", "tools/list"].contains(context.method) ||
  context.method like "notifications/*"
};

@id("mcp-stream")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"mcp.example.test")
when { ["GET", "DELETE"].contains(context.method) };

@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("no-writes")
forbid (principal, action in Ostiary::Action::"tier:write", resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_client_sees_decisions_per_call_and_a_filtered_list() {
    let rig = Rig::start(&[], POLICIES).await;
    let env: Vec<(&str, &str)> = rig
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let out = python(
        client_script("mcp_client.py"),
        &[
            &rig.server.url(),
            "read_file",
            r#"{"path": "/notes.txt"}"#,
            "write_file",
            r#"{"path": "/x", "content": "y"}"#,
            "delete_file",
            r#"{"path": "/notes.txt"}"#,
        ],
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    let result = out.json();

    // write_file is forbidden outright; delete_file is escalatable and stays (docs/design.md §4).
    let mut tools: Vec<&str> = result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    tools.sort_unstable();
    assert_eq!(tools, ["delete_file", "read_file"], "{out}");

    let calls = result["calls"].as_array().unwrap();
    assert_eq!(calls[0]["result"], json!(["hello"]), "{out}");
    assert_eq!(calls[0]["is_error"], false, "{out}");

    let denied = &calls[1]["error"];
    assert_eq!(denied["code"], -32001, "{out}");
    assert_eq!(denied["data"]["error"], "denied", "{out}");
    assert_eq!(denied["data"]["policies"], json!(["no-writes"]), "{out}");
    assert_eq!(
        denied["data"]["action"], "Ostiary::Action::\"tool:files.write\"",
        "{out}"
    );
    assert!(denied["message"].as_str().is_some_and(|m| !m.is_empty()));
    let request_id = denied["data"]["request_id"].as_str().unwrap().to_owned();

    let escalated = &calls[2]["error"];
    assert_eq!(escalated["code"], -32002, "{out}");
    assert_eq!(escalated["data"]["error"], "approval_pending", "{out}");
    assert!(
        escalated["data"]["approval_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("apr_")),
        "{out}"
    );
    let held = rig
        .proxy
        .control()
        .approval(escalated["data"]["approval_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(
        held["policies"],
        json!(["irreversible-needs-human"]),
        "{held}"
    );
    assert_eq!(held["observed"]["tool"], "files.delete", "{held}");

    // The refusal is audited as one, under the id the agent saw.
    let record = rig.proxy.audit_of(&request_id).await;
    assert_eq!(record.decision, "deny", "{record:#?}");
    assert_eq!(record.error.as_deref(), Some("denied"), "{record:#?}");
    assert_eq!(record.tool.as_deref(), Some("files.write"), "{record:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_json_rpc_is_decided_per_call_and_bounded() {
    let rig = Rig::start(&["--json", "--stateless"], POLICIES).await;

    // A batch with one allowed and one denied call: the allowed one is executed, the denied
    // one answered by the proxy, both in one array with their own ids.
    let batch = json!([call(1, "read_file"), call(2, "write_file")]);
    let reply = rig.post(batch.to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    let answers = reply.json();
    let answers = answers.as_array().unwrap_or_else(|| panic!("{reply}"));
    assert_eq!(answers.len(), 2, "{reply}");
    let by_id = |id: u64| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(1)["result"]["content"][0]["text"], "hello", "{reply}");
    assert_eq!(by_id(2)["error"]["code"], -32001, "{reply}");
    assert_eq!(by_id(2)["error"]["data"]["error"], "denied", "{reply}");
    assert_eq!(
        by_id(2)["error"]["data"]["policies"],
        json!(["no-writes"]),
        "{reply}"
    );

    // Each call of the batch is audited on its own, under the request's id, next to the
    // request's own record; arguments stay out (but for the decision kept for replay).
    let request_id = by_id(2)["error"]["data"]["request_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_owned();
    let records: Vec<_> = rig
        .proxy
        .audit()
        .await
        .into_iter()
        .filter(|r| r.request_id == request_id)
        .collect();
    let calls: Vec<_> = records.iter().filter(|r| r.kind == "mcp_call").collect();
    assert_eq!(calls.len(), 2, "{records:#?}");
    let of = |id: &str| {
        *calls
            .iter()
            .find(|r| r.rpc_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no record of call {id}: {records:#?}"))
    };
    let (read, write) = (of("1"), of("2"));
    assert_eq!(read.decision, "allow", "{read:#?}");
    assert_eq!(read.error, None, "{read:#?}");
    assert_eq!(read.tool.as_deref(), Some("files.read"), "{read:#?}");
    assert_eq!(read.tier.as_deref(), Some("read"), "{read:#?}");
    assert_eq!(read.policies, ["read-ok"], "{read:#?}");
    assert_eq!(write.decision, "deny", "{write:#?}");
    assert_eq!(write.error.as_deref(), Some("denied"), "{write:#?}");
    assert_eq!(write.tool.as_deref(), Some("files.write"), "{write:#?}");
    assert_eq!(write.tier.as_deref(), Some("write"), "{write:#?}");
    assert_eq!(write.policies, ["no-writes"], "{write:#?}");
    for record in &calls {
        assert_eq!(record.host.as_deref(), Some(HOST), "{record:#?}");
        assert!(record.session.is_some() && record.agent.is_some() && record.tenant.is_some());
        // Arguments only in the decision kept for replay, which reads back as decided.
        let mut record = (*record).clone();
        let kept = record.decided.take().expect("each call keeps its decision");
        let json = serde_json::to_string(&record).unwrap();
        assert!(!json.contains("notes.txt"), "arguments stay out: {json}");
        let kept = ostiary_policies::recorded::from_json(&kept.to_value()).unwrap();
        assert_eq!(kept.outcome, record.decision, "{kept:#?}");
        assert_eq!(kept.policies, record.policies, "{kept:#?}");
    }
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(http.len(), 1, "{records:#?}");
    assert_eq!(http[0].decision, "allow", "{records:#?}");

    // A tool the catalog does not list for this endpoint: denied by default.
    let reply = rig.post(call(3, "format_disk").to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let answer = reply.json();
    assert_eq!(answer["id"], 3, "{reply}");
    assert_eq!(answer["error"]["code"], -32001, "{reply}");
    assert_eq!(answer["error"]["data"]["error"], "denied", "{reply}");
    assert_eq!(answer["error"]["data"]["policies"], json!([]), "{reply}");

    // tools/list as JSON is filtered too.
    let list = json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list"});
    let reply = rig.post(list.to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    let mut names: Vec<String> = reply.json()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["delete_file", "read_file"], "{reply}");

    // Malformed JSON-RPC: 400 bad_request, never forwarded.
    for body in [
        "not json",
        r#"{"id": 1, "method": "ping"}"#,
        r#"{"jsonrpc": "2.0", "id": 1}"#,
        "[]",
    ] {
        let reply = rig.post(body).await;
        raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
    }

    // 10,000 calls in one batch (about 750 KB, under the 1 MiB body limit): a clear 400
    // naming the cap, no panic, and the proxy still answers afterwards.
    let many: Vec<Value> = (0..10_000)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "read_file"}}))
        .collect();
    let reply = rig.post(Value::Array(many).to_string()).await;
    let body = raw::assert_ostiary_error(&reply, 400, "bad_request");
    assert!(body["reason"].as_str().unwrap().contains("1000"), "{reply}");

    // Deeply nested arguments: a parse error, not a stack overflow.
    let nested = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"read_file","arguments":{{"a":{}{}}}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let reply = rig.post(nested).await;
    raw::assert_ostiary_error(&reply, 400, "bad_request");

    let reply = rig.post(call(10, "read_file").to_string()).await;
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        "hello",
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answers_carry_the_refusals_and_filtered_lists() {
    let rig = Rig::start(&["--stateless"], POLICIES).await;
    // The SDK's server takes no batches (MCP 2025-06-18 dropped them): the one allowed call
    // left is forwarded on its own and the answer comes back as a stream.
    let batch = json!([call(1, "read_file"), call(2, "write_file")]);
    let reply = rig.post(batch.to_string()).await;
    let messages = sse_messages(&reply);
    // The refusal goes first, the upstream's answer after.
    assert_eq!(messages[0]["id"], 2, "{reply}");
    assert_eq!(messages[0]["error"]["code"], -32001, "{reply}");
    assert_eq!(
        messages[0]["error"]["data"]["policies"],
        json!(["no-writes"]),
        "{reply}"
    );
    let answer = messages
        .iter()
        .find(|m| m["id"] == 1)
        .unwrap_or_else(|| panic!("{reply}"));
    assert_eq!(answer["result"]["content"][0]["text"], "hello", "{reply}");

    // A `tools/list` answered as a stream is filtered in its event.
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    let reply = rig.post(list.to_string()).await;
    let messages = sse_messages(&reply);
    let answer = messages
        .iter()
        .find(|m| m["id"] == 3)
        .unwrap_or_else(|| panic!("{reply}"));
    let mut names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["delete_file", "read_file"], "{reply}");
}

/// The JSON-RPC messages of an SSE answer, one per `data:` line.
fn sse_messages(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        reply
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("text/event-stream")),
        "{reply}"
    );
    String::from_utf8_lossy(&reply.body)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_json::from_str(d.trim()).unwrap_or_else(|e| panic!("{e}: {reply}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalated_call_is_held_then_collected_by_the_sdk_client_once_approved() {
    // Stateless: the held call is executed later, outside the MCP session that sent it.
    let rig = Rig::start(&["--stateless"], POLICIES).await;
    let env: Vec<(&str, &str)> = rig
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let delete = ["delete_file", r#"{"path": "/notes.txt"}"#];
    let out = python(
        client_script("mcp_client.py"),
        &[&rig.server.url(), delete[0], delete[1]],
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    let held = &out.json()["calls"][0]["error"];
    assert_eq!(held["code"], -32002, "{out}");
    assert_eq!(held["data"]["error"], "approval_pending", "{out}");
    let id = held["data"]["approval_id"].as_str().unwrap().to_owned();

    // Collecting before the decision: still pending, as a JSON-RPC error the SDK raises.
    let header = format!("Ostiary-Approval: {id}");
    let early = python(
        client_script("mcp_client.py"),
        &["--header", &header, &rig.server.url(), delete[0], delete[1]],
        &env,
    )
    .await;
    assert_eq!(early.json()["calls"][0]["error"]["code"], -32002, "{early}");

    let control = rig.proxy.control();
    let shown = control.approval(&id).await.unwrap();
    assert_eq!(shown["observed"]["tool"], "files.delete");
    assert_eq!(shown["observed"]["args"]["path"], "/notes.txt");
    control.decide(&id, true, "alice", None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let executed = loop {
        let a = control.approval(&id).await.unwrap();
        if a["status"] != "pending" && a["status"] != "approved" && a["status"] != "executing" {
            break a;
        }
        assert!(tokio::time::Instant::now() < deadline, "{a:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(executed["status"], "executed", "{executed:#}");

    // The SDK client collects the stored answer under its own request id.
    let collected = python(
        client_script("mcp_client.py"),
        &["--header", &header, &rig.server.url(), delete[0], delete[1]],
        &env,
    )
    .await;
    assert!(collected.success(), "{collected}");
    let call = &collected.json()["calls"][0];
    assert_eq!(call["result"], json!(["deleted"]), "{collected}");
    assert_eq!(call["is_error"], false, "{collected}");

    // Another call under the same approval is refused, not executed.
    let other = python(
        client_script("mcp_client.py"),
        &[
            "--header",
            &header,
            &rig.server.url(),
            "delete_file",
            r#"{"path": "/other"}"#,
        ],
        &env,
    )
    .await;
    let refused = &other.json()["calls"][0]["error"];
    assert_eq!(refused["code"], -32001, "{other}");
    assert_eq!(refused["data"]["reason"], "approval_mismatch", "{other}");
    let records = rig.proxy.audit().await;
    let executions = records
        .iter()
        .filter(|r| {
            r.kind == "approval"
                && r.approval.as_deref() == Some(id.as_str())
                && r.status == Some(200)
        })
        .count();
    assert_eq!(executions, 1, "{records:#?}");
}

/// Writes allowed, so that what the checks keep from the server can be seen there.
const WRITES_ALLOWED: &str = r#"
// Every message but `tools/call` is decided as `Action::"mcp"`: the session plumbing, as
// the shipped library permits it; the SSE stream and the session's end are plain http.
@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource == Ostiary::Host::"mcp.example.test")
when {
  ["initialize", "ping", "tools/list"].contains(context.method) ||
  context.method like "notifications/*"
};

@id("mcp-stream")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"mcp.example.test")
when { ["GET", "DELETE"].contains(context.method) };

@id("files-ok")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);
"#;

/// The answer with JSON-RPC id `id` in a batch's answer (HTTP 200, JSON array).
fn answer_to(reply: &Reply, id: u64) -> Value {
    assert_eq!(reply.status, 200, "{reply}");
    reply
        .json()
        .as_array()
        .and_then(|a| a.iter().find(|m| m["id"] == id))
        .cloned()
        .unwrap_or_else(|| panic!("no answer {id}: {reply}"))
}

fn write(id: u64, path: &str, content: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "write_file", "arguments": {"path": path, "content": content}}})
}

fn read(id: u64, path: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "read_file", "arguments": {"path": path}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_of_a_batch_pays_its_tier_s_checks_and_a_failing_one_never_leaves() {
    let rig = Rig::start_with(&["--json", "--stateless"], WRITES_ALLOWED, "").await;
    let key = "AKIAIOSFODNN7EXAMPLF";
    // Policy allows all three; the write tier's checks (limits, args_schema, dlp) refuse
    // two of them, and only the clean one reaches the server.
    let batch = json!([
        write(1, "/clean.txt", "fine"),
        write(2, "/leak.txt", &format!("aws {key}")),
        write(3, "/UPPER.txt", "x"),
    ]);
    let reply = rig.post(batch.to_string()).await;
    let by_id = |id: u64| answer_to(&reply, id);
    assert_eq!(by_id(1)["result"]["content"][0]["text"], "ok", "{reply}");
    let leak = by_id(2);
    assert_eq!(leak["error"]["code"], -32001, "{reply}");
    assert_eq!(leak["error"]["data"]["error"], "check_failed", "{reply}");
    assert_eq!(leak["error"]["data"]["check"], "dlp", "{reply}");
    let schema = by_id(3);
    assert_eq!(schema["error"]["data"]["check"], "args_schema", "{reply}");
    assert!(!reply.to_string().contains(key), "never echoed: {reply}");

    // The server saw only the clean write (it takes no batches: one read at a time).
    for (id, path, expected) in [
        (4, "/clean.txt", "fine"),
        (5, "/leak.txt", ""),
        (6, "/UPPER.txt", ""),
    ] {
        let reply = rig.post(read(id, path).to_string()).await;
        let answer = reply.json();
        assert_eq!(answer["id"], id, "{reply}");
        // An empty file comes back as no content at all.
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert_eq!(text, expected, "{path}: {reply}");
    }

    // Each call's record lists its own checks; the refused ones name the failing check.
    let records = rig.proxy.audit().await;
    let call = |id: &str| {
        records
            .iter()
            .find(|r| r.kind == "mcp_call" && r.rpc_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no record of call {id}: {records:#?}"))
    };
    let clean = call("1");
    assert_eq!(clean.decision, "allow", "{clean:#?}");
    let ran: Vec<_> = clean.checks.iter().map(|c| c.check.as_str()).collect();
    assert_eq!(ran, ["limits", "args_schema", "dlp"], "{clean:#?}");
    assert_eq!(call("2").error.as_deref(), Some("check_failed"));
    assert_eq!(
        call("2").checks.last().map(|c| c.check.as_str()),
        Some("dlp")
    );
    assert_eq!(call("3").error.as_deref(), Some("check_failed"));
    for r in &records {
        assert!(!serde_json::to_string(r).unwrap().contains(key));
    }
    // Only the executed write was charged, once: on its own `mcp_call` record, not again
    // on the batch's request record (`ostiary audit cost` adds every record up).
    let charged: i64 = records.iter().filter_map(|r| r.cost_micros).sum();
    assert_eq!(charged, 500_000, "{records:#?}");
    assert_eq!(call("1").cost_micros, Some(500_000));

    // A lone call failing its checks is answered by the proxy alone.
    let reply = rig.post(write(7, "/x.txt", key).to_string()).await;
    assert_eq!(reply.json()["error"]["data"]["check"], "dlp", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_cannot_answer_holds_an_mcp_call_for_a_human() {
    // A webhook nobody answers (a port nothing listens on) on reads that escalate when their
    // budget runs out: the read is held, the write next to it goes through.
    let (_closed, closed) = raw::refusing_port();
    let tiers = format!(
        r#"
[tiers.read]
budget = "50ms"
on_budget = "escalate"
checks = ["limits", "args_schema", "webhook"]

[checks.webhook]
url = "http://{closed}/check"
"#
    );
    let rig = Rig::start_with(&["--json", "--stateless"], WRITES_ALLOWED, &tiers).await;
    let batch = json!([read(1, "/notes.txt"), write(2, "/w.txt", "done")]);
    let reply = rig.post(batch.to_string()).await;
    let by_id = |id: u64| answer_to(&reply, id);
    let held = by_id(1);
    assert_eq!(held["error"]["code"], -32002, "{reply}");
    assert_eq!(
        held["error"]["data"]["error"], "approval_pending",
        "{reply}"
    );
    assert_eq!(by_id(2)["result"]["content"][0]["text"], "ok", "{reply}");
    let id = held["error"]["data"]["approval_id"].as_str().unwrap();
    let approval = rig.proxy.control().approval(id).await.unwrap();
    assert_eq!(approval["observed"]["tool"], "files.read", "{approval:#}");
    let policies = approval["policies"].to_string();
    assert!(policies.contains("check:webhook"), "{approval:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_over_an_escalating_limit_waits_for_a_human_who_grants_more() {
    let rig = Rig::start_with(
        &["--json", "--stateless"],
        WRITES_ALLOWED,
        "[sessions]\nmax_calls = 1\nescalate_limits = [\"calls\"]\n[approvals]\napprovers = [\"alice@example.com\"]\n",
    )
    .await;
    let reply = rig.post(write(1, "/a.txt", "one").to_string()).await;
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        "ok",
        "{reply}"
    );
    // The second call is over the budget of one: held, not refused.
    let reply = rig.post(write(2, "/b.txt", "two").to_string()).await;
    let held = reply.json();
    assert_eq!(held["error"]["code"], -32002, "{reply}");
    let id = held["error"]["data"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let control = rig.proxy.control();
    let shown = control.approval(&id).await.unwrap();
    assert!(
        shown["policies"].to_string().contains("limit:calls"),
        "{shown:#}"
    );
    control
        .decide(&id, true, "alice@example.com", None)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = control.approval(&id).await.unwrap();
        if a["status"] == "executed" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{a:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Executed once, and the grant doubled the budget (2 of 2 used): reads are tool calls
    // too, so the next one is held in turn.
    let reply = rig.post(read(3, "/b.txt").to_string()).await;
    assert_eq!(reply.json()["error"]["code"], -32002, "{reply}");
    let records = rig.proxy.audit().await;
    let executed = records
        .iter()
        .filter(|r| {
            r.kind == "approval"
                && r.approval.as_deref() == Some(id.as_str())
                && r.status == Some(200)
        })
        .count();
    assert_eq!(executed, 1, "{records:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_are_rate_limited_by_their_own_tier() {
    let rig = Rig::start_with(
        &["--json", "--stateless"],
        WRITES_ALLOWED,
        "[tiers.read]\nrate_agent = \"2/m\"\nrepeat_max = 0\n",
    )
    .await;
    for id in 1..=2 {
        let reply = rig.post(read(id, "/notes.txt").to_string()).await;
        assert_eq!(
            reply.json()["result"]["content"][0]["text"],
            "hello",
            "{reply}"
        );
    }
    // The third read is over its tier's rate: refused on its own, as a JSON-RPC error.
    let reply = rig.post(read(3, "/notes.txt").to_string()).await;
    let refused = &reply.json()["error"];
    assert_eq!(refused["code"], -32001, "{reply}");
    assert_eq!(refused["data"]["error"], "limit_exceeded", "{reply}");
    assert_eq!(refused["data"]["limit"], "rate:agent", "{reply}");
    assert!(
        refused["data"]["retry_after"].as_u64().unwrap() >= 1,
        "{reply}"
    );
    // Writes are another tier, and the POST itself is not rated as one: it goes through.
    let reply = rig.post(write(4, "/w.txt", "x").to_string()).await;
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        "ok",
        "{reply}"
    );
}
