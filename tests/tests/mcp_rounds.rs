//! A held MCP call followed up as the 2026-07-28 revision lets a long-running request be:
//! the proxy answers `input_required` with an opaque `requestState`, and the client's retry
//! echoing it collects the call once a human approved it. The MCP Python SDK's `Client`
//! pinned to that revision does the waiting on its own; hand-written JSON-RPC shows each
//! round, and what a forged or mismatched follow-up gets.

use crate::support::mcp as support;

use std::time::Duration;

use ostiary_e2e::clients::{client_script, python};
use ostiary_e2e::raw::Reply;
use serde_json::{json, Value};
use support::Rig;

const POLICIES: &str = concat!(
    crate::mcp_plumbing!(),
    r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#
);

const REVISION: &str = "2026-07-28";

/// The envelope every 2026-07-28 request carries in `params._meta`.
fn envelope() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": REVISION,
           "io.modelcontextprotocol/clientCapabilities": {}})
}

fn delete(id: u64, path: &str, state: Option<&str>) -> Value {
    let mut params =
        json!({"name": "delete_file", "arguments": {"path": path}, "_meta": envelope()});
    if let Some(state) = state {
        params["requestState"] = json!(state);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// POST `message` as a 2026-07-28 client: no session, the revision and the routing
/// headers the revision requires.
async fn post(rig: &Rig, token: &str, message: &Value) -> Value {
    let method = message["method"].as_str().unwrap_or_default();
    let mut headers = vec![("mcp-protocol-version", REVISION), ("mcp-method", method)];
    if let Some(name) = message["params"]["name"].as_str() {
        headers.push(("mcp-name", name));
    }
    let reply: Reply = rig.post_as(token, &headers, message.to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    reply.json()
}

/// Wait until approval `id` has left `pending`/`approved`/`executing`.
async fn settled(rig: &Rig, id: &str) -> Value {
    let control = rig.proxy.control();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = control.approval(id).await.unwrap();
        if !["pending", "approved", "executing"].contains(&a["status"].as_str().unwrap_or("")) {
            return a;
        }
        assert!(tokio::time::Instant::now() < deadline, "{a:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many approvals were ever made (pending or executed: none is denied here).
async fn held(rig: &Rig) -> usize {
    let control = rig.proxy.control();
    let mut n = 0;
    for status in ["pending", "approved", "executing", "executed"] {
        let listed = control.approvals(Some(status)).await.unwrap();
        n += listed["approvals"].as_array().map_or(0, Vec::len);
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_client_of_2026_waits_on_a_human_by_following_its_held_call_up() {
    let rig = Rig::start(&["--json", "--stateless"], POLICIES).await;
    let env: Vec<(&str, &str)> = rig
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let url = rig.server.url();
    // The client retries on its own (every 250 ms at most); a human decides meanwhile.
    let args = [
        "--revision",
        REVISION,
        "--rounds",
        "400",
        &url,
        "delete_file",
        r#"{"path": "/notes.txt"}"#,
    ];
    let client = python(client_script("mcp_client.py"), &args, &env);
    let approver = async {
        let control = rig.proxy.control();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let id = loop {
            let listed = control.approvals(Some("pending")).await.unwrap();
            if let Some(a) = listed["approvals"].as_array().and_then(|a| a.first()) {
                break a["approval_id"].as_str().unwrap().to_owned();
            }
            assert!(tokio::time::Instant::now() < deadline, "nothing held");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Some rounds go by before the human answers: each is a collection, not a hold.
        tokio::time::sleep(Duration::from_millis(600)).await;
        control.decide(&id, true, "alice", None).await.unwrap();
        id
    };
    let (out, id) = tokio::join!(client, approver);
    assert!(out.success(), "{out}");
    let call = &out.json()["calls"][0];
    assert_eq!(call["result"], json!(["deleted"]), "{out}");
    assert_eq!(call["is_error"], false, "{out}");
    assert_eq!(settled(&rig, &id).await["status"], "executed");

    // One approval, executed once, however many rounds the client went through.
    let records = rig.proxy.audit().await;
    let executions = records
        .iter()
        .filter(|r| r.kind == "approval" && r.approval.as_deref() == Some(id.as_str()))
        .filter(|r| r.status == Some(200))
        .count();
    assert_eq!(executions, 1, "{records:#?}");
    assert_eq!(held(&rig).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_round_is_a_collection_and_a_forged_or_changed_one_is_refused() {
    let rig = Rig::start(&["--json", "--stateless"], POLICIES).await;
    // The revision's own methods are decided as `Action::"mcp"` like the others: discovery
    // is plumbing the policies permit (and the server answers it); listening is not.
    let rpc = |id: u64, method: &str| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"_meta": envelope()}});
    let discover = post(&rig, &rig.token, &rpc(20, "server/discover")).await;
    assert!(discover["result"].is_object(), "{discover}");
    let listen = post(&rig, &rig.token, &rpc(21, "subscriptions/listen")).await;
    assert_eq!(listen["error"]["code"], -32001, "{listen}");
    assert_eq!(
        listen["error"]["data"]["action"], "Ostiary::Action::\"mcp\"",
        "{listen}"
    );
    // Tool lists are filtered to what the session may call (a read, and the held delete).
    let listed = post(&rig, &rig.token, &rpc(22, "tools/list")).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"read_file") && !names.contains(&"write_file"),
        "{listed}"
    );

    // Held: a result to follow up, not an error, with the hold in `_meta`.
    let first = post(&rig, &rig.token, &delete(1, "/notes.txt", None)).await;
    let result = &first["result"];
    assert_eq!(result["resultType"], "input_required", "{first}");
    let state = result["requestState"].as_str().unwrap().to_owned();
    let hold = &result["_meta"]["dev.ostiary/approval"];
    assert_eq!(hold["error"], "approval_pending", "{first}");
    let id = hold["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(state, format!("ostiary-approval:{id}"));
    assert_eq!(first["id"], 1);

    // A round before the decision: the same state again, under the round's own id.
    let again = post(&rig, &rig.token, &delete(2, "/notes.txt", Some(&state))).await;
    assert_eq!(again["id"], 2, "{again}");
    assert_eq!(again["result"]["requestState"], state, "{again}");

    // A round asking for another call under this approval: refused, nothing held.
    let changed = post(&rig, &rig.token, &delete(3, "/other.txt", Some(&state))).await;
    assert_eq!(changed["error"]["code"], -32001, "{changed}");
    assert_eq!(
        changed["error"]["data"]["reason"], "approval_mismatch",
        "{changed}"
    );
    // A state naming an approval that is not there, or another session's.
    let forged = post(
        &rig,
        &rig.token,
        &delete(4, "/notes.txt", Some("ostiary-approval:nope")),
    )
    .await;
    assert_eq!(
        forged["error"]["data"]["reason"], "approval_unknown",
        "{forged}"
    );
    let other = rig.proxy.session("agent-2").await;
    let stolen = post(&rig, &other.token, &delete(5, "/notes.txt", Some(&state))).await;
    assert_eq!(
        stolen["error"]["data"]["reason"], "approval_unknown",
        "{stolen}"
    );
    // A 2025 client is answered as before: the -32002 error.
    let older = rig
        .post(delete(6, "/notes.txt", None).to_string())
        .await
        .json();
    assert_eq!(older["error"]["code"], -32002, "{older}");
    assert_eq!(
        older["error"]["data"]["approval_id"],
        id.as_str(),
        "{older}"
    );

    // Approved: the next round gets the server's answer; the file is gone once.
    rig.proxy
        .control()
        .decide(&id, true, "alice", None)
        .await
        .unwrap();
    assert_eq!(settled(&rig, &id).await["status"], "executed");
    let done = post(&rig, &rig.token, &delete(7, "/notes.txt", Some(&state))).await;
    assert_eq!(done["id"], 7, "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "deleted", "{done}");
    // Only one hold was ever made for the call, whatever the rounds.
    assert_eq!(held(&rig).await, 1);

    // A state that is not Ostiary's is the server's: forwarded, and answered by it.
    let theirs = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                        "params": {"name": "read_file", "arguments": {"path": "/notes.txt"},
                                   "requestState": "server-state", "_meta": envelope()}});
    let headers = [
        ("mcp-protocol-version", REVISION),
        ("mcp-method", "tools/call"),
        ("mcp-name", "read_file"),
    ];
    let reply = rig.post_as(&rig.token, &headers, theirs.to_string()).await;
    assert_eq!(
        reply.json()["error"]["data"]["reason"],
        "invalid_request_state",
        "the server's own check: {reply}"
    );
}
