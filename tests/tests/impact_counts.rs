//! A count that policy bounds is never read as 0 (docs/policies.md, "Tools, tiers and
//! escalation"): `context.impact.records` is what the tool's `impact.records` pointer finds
//! in the call's arguments — an array's length, a whole number however JSON spells it
//! (`1000`, `1000.0`, `1e3`), a string of digits (a query value) — and a value there that is
//! not a count is refused (`400 bad_request`) before policy, never decided as a call of no
//! records. The upstream (`clients/lenient_upstream.py`) logs what reaches it, so each
//! refusal and hold is also shown not to have been forwarded.

use ostiary_e2e::lenient::LenientRig;
use ostiary_e2e::raw;
use serde_json::{json, Value};

const API: &str = "api.counts.test";
const MCP: &str = "mcp.counts.test";

const POLICIES: &str = r#"
@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource)
when { ["initialize", "ping"].contains(context.method) };

@id("high-impact")
permit (principal, action in Ostiary::Action::"tier:high_impact", resource);

@id("many-records-need-a-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:high_impact", resource)
when { context.impact.records > 100 }
unless { context.approval.granted };
"#;

fn tools_toml(port: u16) -> String {
    format!(
        r#"
[[tool]]
name = "pay.export"
tier = "high_impact"
match = {{ host = "{API}", method = "POST", path = "/v1/export" }}
args_schema = {{ type = "object", properties = {{ count = {{ type = "integer" }} }} }}
impact = {{ records = "/count" }}

[[tool]]
name = "pay.list"
tier = "high_impact"
match = {{ host = "{API}", method = "GET", path = "/v1/items" }}
impact = {{ records = "/count" }}

[[tool]]
name = "pay.bulk_refund"
tier = "high_impact"
match = {{ host = "{API}", method = "POST", path = "/v1/refunds/bulk" }}
impact = {{ records = "/ids" }}

[[tool]]
name = "files.purge"
tier = "high_impact"
match = {{ mcp = "https://{MCP}:{port}/mcp", tool = "purge" }}
impact = {{ records = "/ids" }}
"#
    )
}

/// The lenient rig, with this file's checks of what it answers.
struct Rig(LenientRig);

impl std::ops::Deref for Rig {
    type Target = LenientRig;
    fn deref(&self) -> &LenientRig {
        &self.0
    }
}

impl Rig {
    async fn start() -> Self {
        // Holds and refusals in a row are the point here, not a runaway loop.
        let extra = "[sessions]\nmax_pending_approvals = 100\n\n\
                     [sessions.watchdog]\nenabled = false\n";
        Self(LenientRig::start(&[API, MCP], POLICIES, tools_toml, extra).await)
    }

    /// How many requests the upstream received so far.
    fn seen(&self) -> usize {
        self.upstream.seen().len()
    }

    /// Send; expect it held for a human (`202 approval_pending`, audited as escalated) and
    /// not forwarded.
    async fn held(&self, method: &str, path: &str, body: &str, what: &str) {
        let before = self.seen();
        let reply = self.send(API, method, path, body.to_owned()).await;
        assert_eq!(reply.status, 202, "{what}: {reply}");
        assert_eq!(reply.json()["error"], "approval_pending", "{what}: {reply}");
        let record = self.proxy.audit_of(reply.request_id().unwrap()).await;
        assert_eq!(record.decision, "escalate", "{what}: {record:#?}");
        assert_eq!(
            record.policies,
            ["many-records-need-a-human"],
            "{what}: {record:#?}"
        );
        assert_eq!(self.seen(), before, "{what}: reached the upstream");
    }

    /// Send; expect `400 bad_request` naming the pointer and the kind of value (never the
    /// value: nothing `re_secret` shows in the answer or the record), audited as a refusal,
    /// and nothing forwarded.
    async fn refused(&self, path: &str, body: &str, pointer: &str, kind: &str) {
        let before = self.seen();
        let reply = self.send(API, "POST", path, body.to_owned()).await;
        let (answer, record) = raw::assert_refused(&self.proxy, &reply, 400, "bad_request").await;
        let expected =
            format!("impact.records: the argument at {pointer} is {kind}, not a count of records");
        assert_eq!(answer["reason"], expected, "{body}: {answer}");
        let audited_reason = record.reason.as_deref().unwrap_or_default();
        assert!(audited_reason.contains(&expected), "{body}: {record:#?}");
        assert!(
            record.policies.is_empty(),
            "refused before policy: {record:#?}"
        );
        assert!(!reply.to_string().contains("re_secret"), "{body}: {reply}");
        let audited = serde_json::to_string(&record).unwrap();
        assert!(!audited.contains("re_secret"), "{body}: {audited}");
        assert_eq!(self.seen(), before, "{body}: reached the upstream");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_however_json_spells_it_is_the_count_policy_bounds() {
    let rig = Rig::start().await;

    // The controls: a small count goes through, a large one is held.
    let reply = rig
        .send(API, "POST", "/v1/export", json!({"count": 10}).to_string())
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    rig.held("POST", "/v1/export", r#"{"count":1000}"#, "integer")
        .await;

    // The same count as a float or with an exponent: `args` reads it as the integer 1000
    // (the schema says `integer`), and so does the count.
    for body in [
        r#"{"count":1000.0}"#,
        r#"{"count":1e3}"#,
        r#"{"count":1.0e3}"#,
        r#"{"count":1E3}"#,
    ] {
        rig.held("POST", "/v1/export", body, body).await;
    }

    // Query values are strings: a string of digits is its count.
    let reply = rig.send(API, "GET", "/v1/items?count=5", "").await;
    assert_eq!(reply.status, 200, "{reply}");
    rig.held("GET", "/v1/items?count=5000", "", "query").await;

    // An array counts its items.
    let few = json!({"ids": ["re_1", "re_2"]}).to_string();
    let reply = rig.send(API, "POST", "/v1/refunds/bulk", few).await;
    assert_eq!(reply.status, 200, "{reply}");
    let ids: Vec<String> = (0..101).map(|i| format!("re_{i}")).collect();
    let many = json!({ "ids": ids }).to_string();
    rig.held("POST", "/v1/refunds/bulk", &many, "array").await;
    // Nothing at the pointer is nothing counted.
    let reply = rig.send(API, "POST", "/v1/refunds/bulk", "{}").await;
    assert_eq!(reply.status, 200, "{reply}");

    // What is not a count is refused before policy, whatever policy would have said.
    for (body, kind) in [
        (
            r#"{"ids":{"0":"re_secret0","1":"re_secret1"}}"#,
            "an object",
        ),
        (r#"{"ids":"re_secret0,re_secret1"}"#, "a string"),
        (r#"{"ids":true}"#, "a boolean"),
    ] {
        rig.refused("/v1/refunds/bulk", body, "/ids", kind).await;
    }
    for (body, kind) in [
        (r#"{"count":-1000}"#, "a negative number"),
        (r#"{"count":1000.5}"#, "a fractional number"),
        (r#"{"count":1e19}"#, "a number beyond the 64-bit range"),
    ] {
        rig.refused("/v1/export", body, "/count", kind).await;
    }
    // A query value that is not digits (a GET is refused the same way).
    let before = rig.seen();
    let reply = rig.send(API, "GET", "/v1/items?count=5%2C000", "").await;
    let (answer, _) = raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
    assert_eq!(
        answer["reason"],
        "impact.records: the argument at /count is a string, not a count of records",
        "{answer}"
    );
    assert_eq!(rig.seen(), before, "reached the upstream");
}

fn purge(id: u64, ids: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": "purge", "arguments": {"ids": ids}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_whose_count_cannot_be_read_is_refused_as_its_json_rpc_error() {
    let rig = Rig::start().await;

    // The control: a small purge is forwarded, a large one held.
    let reply = rig
        .send(MCP, "POST", "/mcp", purge(1, json!(["a"])).to_string())
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["result"]["decoded"]["id"], 1, "{reply}");
    let many: Vec<String> = (0..101).map(|i| format!("f_{i}")).collect();
    let before = rig.seen();
    let reply = rig
        .send(MCP, "POST", "/mcp", purge(2, json!(many)).to_string())
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["error"]["code"], -32002, "{reply}");
    assert_eq!(rig.seen(), before, "a held call reached the upstream");

    // An object or a CSV string where the array of ids belongs: the call is refused as
    // MCP clients read refusals (a JSON-RPC error in an HTTP 200), with the body of a 400.
    for (ids, kind) in [
        (json!({"0": "f_secret0", "1": "f_secret1"}), "an object"),
        (json!("f_secret0,f_secret1"), "a string"),
    ] {
        let before = rig.seen();
        let reply = rig
            .send(MCP, "POST", "/mcp", purge(3, ids.clone()).to_string())
            .await;
        assert_eq!(reply.status, 200, "{ids}: {reply}");
        let answer = reply.json();
        assert_eq!(answer["id"], 3, "{reply}");
        assert_eq!(answer["error"]["code"], -32001, "{reply}");
        let data = &answer["error"]["data"];
        assert_eq!(data["error"], "bad_request", "{reply}");
        let expected =
            format!("impact.records: the argument at /ids is {kind}, not a count of records");
        assert_eq!(data["reason"], expected, "{reply}");
        assert!(!reply.to_string().contains("f_secret"), "{reply}");
        assert_eq!(rig.seen(), before, "{ids}: reached the upstream");
        // Audited as the refused call it was (a lone call: on the request's own record),
        // without its arguments.
        let record = rig
            .proxy
            .audit_of(data["request_id"].as_str().unwrap())
            .await;
        assert_refused_call(&record, &expected);
    }

    // In a batch the refusal is that call's own: the ping beside it is forwarded.
    let before = rig.seen();
    let batch = json!([
        {"jsonrpc": "2.0", "id": 10, "method": "ping"},
        purge(11, json!("f_1,f_2")),
    ]);
    let reply = rig.send(MCP, "POST", "/mcp", batch.to_string()).await;
    assert_eq!(reply.status, 200, "{reply}");
    let answers = reply.json();
    let answers = answers.as_array().unwrap_or_else(|| panic!("{reply}"));
    let by_id = |id: u64| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(10)["result"]["decoded"]["method"], "ping", "{reply}");
    assert_eq!(
        by_id(11)["error"]["data"]["error"],
        "bad_request",
        "{reply}"
    );
    assert_eq!(rig.seen(), before + 1, "only the ping reached the upstream");
    // The call of a batch has its own record.
    let request_id = by_id(11)["error"]["data"]["request_id"].as_str().unwrap();
    let call = rig
        .proxy
        .audit()
        .await
        .into_iter()
        .find(|r| r.request_id == request_id && r.kind == "mcp_call")
        .unwrap_or_else(|| panic!("no mcp_call record for {request_id}"));
    assert_refused_call(
        &call,
        "impact.records: the argument at /ids is a string, not a count of records",
    );
}

/// `record` is that of a call of `files.purge` refused, before policy, for `reason`, and
/// keeps none of its arguments.
fn assert_refused_call(record: &ostiary::audit::AuditRecord, reason: &str) {
    assert_eq!(record.decision, "deny", "{record:#?}");
    assert_eq!(record.error.as_deref(), Some("bad_request"), "{record:#?}");
    let audited_reason = record.reason.as_deref().unwrap_or_default();
    assert!(audited_reason.contains(reason), "{record:#?}");
    assert_eq!(record.tool.as_deref(), Some("files.purge"), "{record:#?}");
    assert!(
        record.policies.is_empty(),
        "refused before policy: {record:#?}"
    );
    let audited = serde_json::to_string(record).unwrap();
    assert!(!audited.contains("f_secret"), "{audited}");
}
