//! Every MCP message is decided, not only `tools/call` (docs/design.md §4, `Action::"mcp"`): each
//! JSON-RPC message to a catalogued endpoint is decided on its own, with `context.method`,
//! `context.server` and `context.session`; only the session plumbing passes the library's
//! kind of policy, and the body decides (routing headers that disagree are refused).

use crate::support::mcp as support;

use serde_json::{json, Value};
use support::{Rig, HOST};

/// What the shipped library permits for its MCP server, for this endpoint.
const PLUMBING: &str = concat!(
    crate::mcp_plumbing!(),
    r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

// Would let a POST through if a POST to the endpoint were still decided as http.
@id("http-anything")
permit (principal, action == Ostiary::Action::"http", resource);
"#
);

fn message(id: Option<u64>, method: &str, params: Value) -> Value {
    let mut m = json!({"jsonrpc": "2.0", "method": method, "params": params});
    if let Some(id) = id {
        m["id"] = json!(id);
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_decided_and_only_the_plumbing_passes() {
    // Many refusals in a row: the watchdog would (rightly) pause the session otherwise.
    let rig = Rig::start_with(
        &["--json", "--stateless"],
        PLUMBING,
        "[sessions.watchdog]\ndenials = 100\n",
    )
    .await;

    // The plumbing reaches the server.
    let reply = rig
        .post(message(Some(1), "ping", json!({})).to_string())
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["result"], json!({}), "{reply}");

    // Everything else needs a permit of its own: refused by the proxy as JSON-RPC errors,
    // decided as `Action::"mcp"` on the endpoint's host.
    for (method, params) in [
        ("resources/read", json!({"uri": "file:///notes.txt"})),
        ("resources/list", json!({})),
        ("resources/templates/list", json!({})),
        (
            "prompts/get",
            json!({"name": "summarize", "arguments": {"topic": "x"}}),
        ),
        ("prompts/list", json!({})),
        ("completion/complete", json!({})),
        ("logging/setLevel", json!({"level": "debug"})),
        ("files/reindex", json!({})),
        (
            "Tools/Call",
            json!({"name": "delete_file", "arguments": {}}),
        ),
    ] {
        let reply = rig.post(message(Some(2), method, params).to_string()).await;
        assert_eq!(reply.status, 200, "{method}: {reply}");
        let answer = reply.json();
        assert_eq!(answer["id"], 2, "{method}: {reply}");
        assert_eq!(answer["error"]["code"], -32001, "{method}: {reply}");
        let data = &answer["error"]["data"];
        assert_eq!(data["error"], "denied", "{method}: {reply}");
        assert_eq!(
            data["action"], "Ostiary::Action::\"mcp\"",
            "{method}: {reply}"
        );
        assert_eq!(
            data["resource"],
            format!("Ostiary::Host::{HOST:?}"),
            "{reply}"
        );
        assert_eq!(data["policies"], json!([]), "{method}: {reply}");
        // Audited as what it was.
        let record = rig
            .proxy
            .audit_of(data["request_id"].as_str().unwrap())
            .await;
        assert_eq!(record.decision, "deny", "{record:#?}");
        assert_eq!(record.rpc_method.as_deref(), Some(method), "{record:#?}");
    }

    // A refused notification has no id to answer: the POST itself is refused.
    let reply = rig
        .post(message(None, "vendor/notify", json!({})).to_string())
        .await;
    let (body, _) = ostiary_e2e::raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;
    assert_eq!(body["action"], "Ostiary::Action::\"mcp\"", "{body}");
    // An allowed one is accepted by the server.
    let reply = rig
        .post(message(None, "notifications/initialized", json!({})).to_string())
        .await;
    assert_eq!(reply.status, 202, "{reply}");

    // In a batch each message is decided on its own: the ping is forwarded (alone: the
    // SDK's server takes no batches), the read is answered by the proxy, each has its
    // record.
    let batch = json!([
        message(Some(10), "ping", json!({})),
        message(
            Some(11),
            "resources/read",
            json!({"uri": "file:///notes.txt"})
        ),
    ]);
    let reply = rig.post(batch.to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    let answers = reply.json();
    let answers = answers.as_array().unwrap_or_else(|| panic!("{reply}"));
    let by_id = |id: u64| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(10)["result"], json!({}), "{reply}");
    assert_eq!(by_id(11)["error"]["code"], -32001, "{reply}");
    let request_id = by_id(11)["error"]["data"]["request_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let records: Vec<_> = rig
        .proxy
        .audit()
        .await
        .into_iter()
        .filter(|r| r.request_id == request_id && r.kind == "mcp_message")
        .collect();
    let of = |method: &str| {
        records
            .iter()
            .find(|r| r.rpc_method.as_deref() == Some(method))
            .unwrap_or_else(|| panic!("{method}: {records:#?}"))
    };
    assert_eq!(of("ping").decision, "allow");
    assert_eq!(of("ping").policies, ["mcp-plumbing"]);
    assert_eq!(of("resources/read").decision, "deny");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_opens_one_method_for_one_server_and_sees_the_session() {
    let policies = format!(
        r#"{PLUMBING}
@id("roots-read-notes")
permit (principal, action == Ostiary::Action::"mcp", resource == Ostiary::Host::"mcp.example.test")
when {{
  context.method == "resources/read" &&
  context.server like "https://{HOST}:*/mcp" &&
  context.session.depth == 0
}};
"#
    );
    let rig = Rig::start(&["--json", "--stateless"], &policies).await;
    let read = message(
        Some(3),
        "resources/read",
        json!({"uri": "file:///notes.txt"}),
    );
    let reply = rig.post(read.to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json()["result"]["contents"][0]["text"],
        "hello",
        "the server answered the permitted read: {reply}"
    );
    // A child session (the same agent, depth 1) is refused the same read.
    let created: Value = reqwest::Client::new()
        .post(format!("http://{}/v1/sessions", rig.proxy.control_addr))
        .bearer_auth(&rig.token)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(created["depth"], 1, "{created}");
    let token = created["token"].as_str().unwrap();
    let reply = rig.post_as(token, &[], read.to_string()).await;
    let answer = reply.json();
    assert_eq!(answer["error"]["data"]["error"], "denied", "{reply}");
    // Prompts are still closed.
    let reply = rig
        .post(
            message(
                Some(4),
                "prompts/get",
                json!({"name": "summarize", "arguments": {"topic": "x"}}),
            )
            .to_string(),
        )
        .await;
    assert_eq!(reply.json()["error"]["code"], -32001, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_headers_that_disagree_with_the_body_are_refused() {
    let rig = Rig::start(&["--json", "--stateless"], PLUMBING).await;
    let delete = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                        "params": {"name": "delete_file", "arguments": {"path": "/notes.txt"}}});
    for headers in [
        vec![("Mcp-Method", "ping")],
        vec![("Mcp-Method", "tools/call"), ("Mcp-Name", "read_file")],
        vec![("mcp-name", "read_file")],
        vec![("Mcp-Method", "TOOLS/CALL")],
    ] {
        let reply = rig.post_as(&rig.token, &headers, delete.to_string()).await;
        ostiary_e2e::raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
    }
    // Headers that agree are fine: a read, named as a read.
    let read = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                      "params": {"name": "read_file", "arguments": {"path": "/notes.txt"}}});
    let reply = rig
        .post_as(
            &rig.token,
            &[("Mcp-Method", "tools/call"), ("Mcp-Name", "read_file")],
            read.to_string(),
        )
        .await;
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        "hello",
        "{reply}"
    );
    // The file is still there: the refused delete never reached the server.
    let reply = rig.post(read.to_string()).await;
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        "hello",
        "{reply}"
    );
}
