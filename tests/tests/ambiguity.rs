//! What the proxy decides is what the upstream executes (THREATS: "Authority and
//! ambiguity"). The upstream here is deliberately lenient (`clients/lenient_upstream.py`):
//! it decodes JSON as Go's `encoding/json` fills a struct (keys folded to lower case, the
//! last of equal keys wins) and routes paths loosely (slashes merged, `;parameters` cut,
//! `%2F` as `/`, a trailing slash dropped), and it logs every request it receives. A policy
//! lets plain `http` through to both hosts, so anything *not* recognised as the tool would
//! reach it: every ambiguous spelling must be refused (400) or decided as the tool, and the
//! log shows that nothing ambiguous arrived.

use ostiary_e2e::lenient::LenientRig;
use ostiary_e2e::raw::{self, Reply};
use serde_json::json;

const API: &str = "api.lenient.test";
const MCP: &str = "mcp.lenient.test";

const POLICIES: &str = r#"
// Plain http to both hosts is allowed: only a request decided as a tool call is bounded.
@id("http-anything")
permit (principal, action == Ostiary::Action::"http", resource);

@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource)
when { ["initialize", "ping"].contains(context.method) };

@id("reads")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("small-refunds")
permit (principal, action in Ostiary::Action::"tier:high_impact", resource)
when { context.impact.records <= 100 };

@id("writes")
permit (principal, action in Ostiary::Action::"tier:write", resource);

@id("no-prod-transfers")
forbid (principal, action == Ostiary::Action::"tool:pay.transfer", resource)
when { context.args has account && context.args.account == "prod" };

@id("no-memo-tag-x")
forbid (principal, action == Ostiary::Action::"tool:pay.transfer", resource)
when { context.args has memo && context.args.memo has tag && context.args.memo.tag == "x" };

@id("no-secret-files")
forbid (principal, action == Ostiary::Action::"tool:files.read", resource)
when { context.args has path && context.args.path like "/secret*" };
"#;

fn tools_toml(port: u16) -> String {
    format!(
        r#"
[[tool]]
name = "pay.bulk_refund"
tier = "high_impact"
match = {{ host = "{API}", method = "POST", path = "/v1/refunds/bulk" }}
impact = {{ records = "/ids" }}

[[tool]]
name = "pay.transfer"
tier = "write"
match = {{ host = "{API}", method = "POST", path = "/v1/transfer" }}
args_schema = {{ type = "object", properties = {{ account = {{ type = "string" }}, memo = {{ type = "object", properties = {{ tag = {{ type = "string" }} }} }}, lines = {{ type = "array", items = {{ type = "object", properties = {{ account = {{ type = "string" }} }} }} }} }} }}

[[tool]]
name = "files.read"
tier = "read"
match = {{ mcp = "https://{MCP}:{port}/mcp", tool = "read_file" }}
args_schema = {{ type = "object", properties = {{ path = {{ type = "string" }} }} }}

[[tool]]
name = "files.delete"
tier = "irreversible"
match = {{ mcp = "https://{MCP}:{port}/mcp", tool = "delete_file" }}
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
        Self(LenientRig::start(&[API, MCP], POLICIES, tools_toml, "").await)
    }

    /// A POST of `body` to `path` on the API host with `content_type` (`""`: none).
    async fn post_typed(&self, path: &str, content_type: &str, body: &str) -> Reply {
        let headers = [("content-type", content_type)];
        self.send_with(API, "POST", path, &headers, body.to_owned())
            .await
    }

    /// Send, expect `400 bad_request` naming an ambiguity, and check nothing reached the
    /// upstream.
    async fn refused(&self, host: &str, method: &str, path: &str, body: &str, what: &str) {
        let before = self.upstream.seen().len();
        let reply = self.send(host, method, path, body.to_owned()).await;
        let (answer, record) = raw::assert_refused(&self.proxy, &reply, 400, "bad_request").await;
        let reason = answer["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("ambiguous"), "{what}: {reason}");
        assert_eq!(record.decision, "deny", "{what}: {record:#?}");
        assert_eq!(
            self.upstream.seen().len(),
            before,
            "{what}: reached the upstream"
        );
    }
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("re_{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_json_never_reaches_a_case_insensitive_upstream() {
    let rig = Rig::start().await;
    let many = json!(ids(5000));

    // The control: a small batch is decided as the tool, allowed, and the upstream reads
    // exactly what was decided.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/refunds/bulk",
            json!({"ids": ["re_1"]}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["decoded"]["ids"], json!(["re_1"]), "{reply}");
    let records = rig.proxy.audit().await;
    let record = records.iter().rev().find(|r| r.kind == "http").unwrap();
    assert_eq!(
        record.tool.as_deref(),
        Some("pay.bulk_refund"),
        "{record:#?}"
    );
    assert_eq!(record.decision, "allow", "{record:#?}");
    // A large one is denied by the tool's policy.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/refunds/bulk",
            json!({"ids": many}).to_string(),
        )
        .await;
    raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;

    // The attack: one record for the proxy, 5,000 for a decoder that folds case or keeps
    // the last duplicate. Every spelling is refused before policy, and never forwarded.
    let many_text = many.to_string();
    for (body, what) in [
        (
            format!(r#"{{"ids":["re_1"],"IDS":{many_text}}}"#),
            "case-folded",
        ),
        (
            format!(r#"{{"ids":["re_1"],"Ids":{many_text}}}"#),
            "mixed case",
        ),
        (
            format!(r#"{{"ids":["re_1"],"ids":{many_text}}}"#),
            "duplicate",
        ),
        (
            format!(r#"{{"ids":["re_1"],"\u0049DS":{many_text}}}"#),
            "escaped",
        ),
        (
            format!(r#"{{"ids":["re_1"],"\u0069ds":{many_text}}}"#),
            "escaped duplicate",
        ),
        (
            r#"{"meta":{"k":1,"K":2},"ids":["re_1"]}"#.to_owned(),
            "nested",
        ),
        (
            format!(r#"{{"ids":["re_1"],"ids\u0000":{many_text}}}"#),
            "NUL",
        ),
    ] {
        rig.refused(API, "POST", "/v1/refunds/bulk", &body, what)
            .await;
    }
    // The query is arguments too: a key twice, or in the query and the body.
    rig.refused(
        API,
        "POST",
        "/v1/refunds/bulk?note=a&NOTE=b",
        "{}",
        "query twice",
    )
    .await;
    rig.refused(
        API,
        "POST",
        "/v1/refunds/bulk?ids=x",
        r#"{"ids":["re_1"]}"#,
        "query and body",
    )
    .await;

    // A second Content-Type: JSON for the proxy, a form for an upstream that takes the last.
    let before = rig.upstream.seen().len();
    let reply = rig
        .send_with(
            API,
            "POST",
            "/v1/refunds/bulk",
            &[
                ("content-type", "application/json"),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            r#"{"note":"&ids=1&ids=2&ids=3"}"#,
        )
        .await;
    raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
    assert_eq!(
        rig.upstream.seen().len(),
        before,
        "two content types reached the upstream"
    );

    // JSON-RPC: `ping` for the proxy, `tools/call delete_file` for the server.
    let url_path = "/mcp";
    for (body, what) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"delete_file","arguments":{}}}"#,
            "method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"delete_file"}}"#,
            "duplicate method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","NAME":"delete_file"}}"#,
            "tool name",
        ),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","METHOD":"tools/call","params":{"name":"delete_file"}}]"#,
            "in a batch",
        ),
    ] {
        rig.refused(MCP, "POST", url_path, body, what).await;
    }
    // The control: a plain ping is forwarded and read as a ping.
    let reply = rig
        .send(
            MCP,
            "POST",
            url_path,
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json()["result"]["decoded"]["method"],
        "ping",
        "{reply}"
    );

    // Everything the upstream received was unambiguous: re-read strictly, it is what the
    // lenient decoder read.
    for seen in rig.upstream.seen() {
        let body = seen["body"].as_str().unwrap();
        if body.is_empty() {
            continue;
        }
        assert!(
            ostiary::strict_json::parse(body.as_bytes()).is_ok(),
            "an ambiguous body reached the upstream: {seen}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_an_upstream_routes_to_a_tool_are_decided_as_the_tool_or_refused() {
    let rig = Rig::start().await;
    let many = json!({"ids": ids(500)}).to_string();
    // Decided as the tool (and denied by its policy: 500 records), never as plain http,
    // which would be allowed: a trailing slash, the method in another case, an encoded
    // unreserved character.
    for (method, path) in [
        ("POST", "/v1/refunds/bulk/"),
        ("post", "/v1/refunds/bulk"),
        ("Post", "/v1/refunds/bulk/"),
        ("POST", "/v1/%72efunds/bulk"),
        ("POST", "/v1/refunds/%62%75%6C%6B"),
        ("POST", "/v1/refunds/bulk?x=1"),
    ] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(API, method, path, many.clone()).await;
        let (_, record) = raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;
        assert_eq!(
            record.tool.as_deref(),
            Some("pay.bulk_refund"),
            "{method} {path}"
        );
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{method} {path} reached the upstream"
        );
    }
    // Refused: only a lenient upstream routes them to the tool.
    for path in [
        "//v1/refunds/bulk",
        "/v1//refunds/bulk",
        "/v1/refunds//bulk",
        "/v1/refunds/bulk;jsessionid=1",
        "/v1;x/refunds/bulk",
        "/v1/refunds%2Fbulk",
        "/v1/refunds%2fbulk",
        "/v1/refunds%5Cbulk",
        "/v1/refunds%252Fbulk",
        "/v1/refunds/bulk//",
    ] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(API, "POST", path, many.clone()).await;
        let (answer, _) = raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert!(
            answer["reason"]
                .as_str()
                .unwrap()
                .contains("pay.bulk_refund"),
            "{path}: {answer}"
        );
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{path} reached the upstream"
        );
    }
    // The normalised path is what is forwarded: an allowed call sent with an encoded
    // unreserved character arrives decoded.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/%72efunds/bulk",
            json!({"ids": ["re_1"]}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    let last = rig.upstream.seen().pop().unwrap();
    assert_eq!(last["path"], "/v1/refunds/bulk", "{last}");

    // The MCP endpoint: a trailing slash or `post` is the endpoint (its JSON-RPC decided:
    // delete_file has no permit), the lenient spellings are refused.
    let delete = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_file","arguments":{}}}"#;
    for (method, path) in [("POST", "/mcp/"), ("post", "/mcp"), ("POST", "/%6Dcp")] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(MCP, method, path, delete).await;
        assert_eq!(reply.status, 200, "{method} {path}: {reply}");
        let answer = reply.json();
        assert_eq!(answer["error"]["code"], -32001, "{method} {path}: {reply}");
        assert_eq!(answer["error"]["data"]["error"], "denied", "{reply}");
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{method} {path} reached the upstream"
        );
    }
    for path in ["//mcp", "/mcp;x", "/mcp//", "/%2Fmcp"] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(MCP, "POST", path, delete).await;
        raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{path} reached the upstream"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_or_path_in_another_case_is_refused_where_policy_reads_it() {
    let rig = Rig::start().await;
    // The controls: spelled as declared, each is decided on what it says.
    let reply = rig
        .send(API, "POST", "/v1/transfer", r#"{"account":"dev"}"#)
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    let reply = rig
        .send(API, "POST", "/v1/transfer", r#"{"account":"prod"}"#)
        .await;
    raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;
    let read = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"/secret/key"}}}"#;
    let reply = rig.send(MCP, "POST", "/mcp", read).await;
    assert_eq!(reply.json()["error"]["data"]["error"], "denied", "{reply}");

    // One key, no twin: policy reads `account`, a case-insensitive decoder runs `Account`
    // as it. Anywhere the schema declares a property: the body, the query, nested objects,
    // the items of arrays; Unicode folds too (LONG S, `ſ`, is `s`).
    for (path, body, what) in [
        ("/v1/transfer", r#"{"Account":"prod"}"#, "body"),
        ("/v1/transfer", r#"{"ACCOUNT":"prod"}"#, "upper case"),
        ("/v1/transfer?ACCOUNT=prod", "{}", "query"),
        ("/v1/transfer", r#"{"memo":{"TAG":"x"}}"#, "nested"),
        (
            "/v1/transfer",
            r#"{"lines":[{"account":"dev"},{"Account":"prod"}]}"#,
            "array items",
        ),
        (
            "/v1/transfer",
            r#"{"memo":{"\u0074\u0041g":"x"}}"#,
            "escaped",
        ),
        (
            "/v1/transfer",
            r#"{"line\u017f":[{"account":"prod"}]}"#,
            "LONG S",
        ),
    ] {
        rig.refused(API, "POST", path, body, what).await;
    }
    // An undeclared key that folds to nothing declared is not ambiguous.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/transfer",
            r#"{"acc\u00f6unt":"prod","\u212aey":1}"#,
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    for (args, what) in [
        (r#"{"Path":"/secret/key"}"#, "MCP arguments"),
        (r#"{"PAT\u0048":"/secret/key"}"#, "MCP arguments, escaped"),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"read_file","arguments":{args}}}}}"#
        );
        // A refused call is answered as MCP clients expect: a JSON-RPC error.
        let before = rig.upstream.seen().len();
        let reply = rig.send(MCP, "POST", "/mcp", body).await;
        assert_eq!(reply.status, 200, "{what}: {reply}");
        let data = &reply.json()["error"]["data"];
        assert_eq!(data["error"], "bad_request", "{what}: {reply}");
        assert!(
            data["reason"].as_str().unwrap().contains("ambiguous"),
            "{what}: {reply}"
        );
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{what}: reached the upstream"
        );
        let records = rig.proxy.audit().await;
        let record = records.iter().rev().find(|r| r.kind == "http").unwrap();
        assert_eq!(record.decision, "deny", "{what}: {record:#?}");
    }
    // The JSON-RPC envelope: `Arguments`, `Params`, `Method` read by the server, not here.
    for (body, what) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","Arguments":{"path":"/secret/key"}}}"#,
            "Arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"read_file","arguments":{"path":"/secret/key"}}}"#,
            "Params",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"delete_file"}}"#,
            "Method alone",
        ),
        (
            r#"{"JSONRPC":"2.0","jsonrpc":"2.0","id":1,"method":"ping"}"#,
            "jsonrpc twice",
        ),
    ] {
        rig.refused(MCP, "POST", "/mcp", body, what).await;
    }

    // Paths: Express and ASP.NET Core route `/V1/TRANSFER` to the tool's handler.
    let prod = r#"{"account":"prod"}"#;
    for path in [
        "/V1/transfer",
        "/v1/Transfer",
        "/V1/TRANSFER/",
        "//v1/TRANSFER",
    ] {
        rig.refused(API, "POST", path, prod, path).await;
    }
    let delete = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_file","arguments":{}}}"#;
    for path in ["/MCP", "/Mcp/", "//MCP"] {
        rig.refused(MCP, "POST", path, delete, path).await;
    }
    // A path no route takes in any case stays plain http.
    let reply = rig.send(API, "POST", "/v1/other", prod).await;
    assert_eq!(reply.status, 200, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_overrides_and_query_structure_are_refused() {
    let rig = Rig::start().await;
    // `_method` runs a POST as a DELETE in Rails, Laravel, Symfony and Express's
    // method-override: in the query (any escape of it) on any request, plain http or a tool;
    // in a tool call's JSON body.
    for (host, path, body) in [
        (API, "/v1/items/1?_method=DELETE", "{}"),
        (API, "/v1/items/1?x=1&%5Fmethod=DELETE", "{}"),
        (API, "/v1/items/1?_METHOD=delete", "{}"),
        // PHP turns a leading `.` or an unclosed `[` into `_`, ends a name at NUL, and
        // reads `_method[]` as `_method`.
        (API, "/v1/items/1?.method=DELETE", "{}"),
        (API, "/v1/items/1?[method=DELETE", "{}"),
        (API, "/v1/items/1?_method%00x=DELETE", "{}"),
        (API, "/v1/items/1?_method[]=DELETE", "{}"),
        (
            API,
            "/v1/transfer",
            r#"{"account":"dev",".method":"DELETE"}"#,
        ),
        (API, "/v1/transfer?_method=PUT", r#"{"account":"dev"}"#),
        (
            API,
            "/v1/transfer",
            r#"{"account":"dev","_method":"DELETE"}"#,
        ),
        (
            MCP,
            "/mcp?_method=DELETE",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ),
    ] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(host, "POST", path, body.to_owned()).await;
        let (answer, record) = raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert!(
            answer["reason"].as_str().unwrap().contains("_method"),
            "{path}: {answer}"
        );
        assert_eq!(record.decision, "deny", "{path}: {record:#?}");
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{path} reached the upstream"
        );
    }
    // In the form or JSON body of a POST decided as plain http, to a host that serves
    // tools: Rails reads form bodies, Laravel and Symfony JSON too.
    for (content_type, body) in [
        ("application/x-www-form-urlencoded", "a=1&_method=DELETE"),
        ("application/x-www-form-urlencoded", "%5Fmethod=DELETE"),
        (
            "application/x-www-form-urlencoded; charset=utf-8",
            "_METHOD=put",
        ),
        ("application/json", r#"{"_method":"DELETE"}"#),
        ("application/vnd.api+json", r#"{"x":1,"_Method":"DELETE"}"#),
        ("application/x-www-form-urlencoded", ".method=DELETE"),
        ("application/x-www-form-urlencoded", "a=1;[method=DELETE"),
        // The media type as PHP cuts it (at `,` or a blank), and Laravel's JSON test
        // (the type contains `/json`).
        (
            "application/x-www-form-urlencoded, text/plain",
            "_method=DELETE",
        ),
        ("application/x-www-form-urlencoded x", "_method=DELETE"),
        ("text/plain; x=/json", r#"{"_method":"DELETE"}"#),
    ] {
        let before = rig.upstream.seen().len();
        let reply = rig.post_typed("/v1/items/1", content_type, body).await;
        let (answer, _) = raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert!(
            answer["reason"].as_str().unwrap().contains("_method"),
            "{content_type} {body}: {answer}"
        );
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{content_type} {body} reached the upstream"
        );
    }
    // Bodies that stream: untyped (Rack reads a POST without a media type as a form) and
    // multipart (every parser's reading of a part's name). The upstream may have the
    // head and some of the body, never the whole body.
    let part = |head: &str| format!("--XyZ\r\n{head}\r\n\r\nDELETE\r\n--XyZ--\r\n");
    for (content_type, body) in [
        ("", "a=1&_method=DELETE".to_owned()),
        ("", "%5Fmethod=DELETE".to_owned()),
        (" ; charset=utf-8", ".method=DELETE".to_owned()),
        (
            "multipart/form-data; boundary=XyZ",
            part(r#"Content-Disposition: form-data; name="_method""#),
        ),
        (
            "multipart/form-data; boundary=XyZ",
            part("content-disposition: form-data; name*=utf-8''%5Fmethod"),
        ),
        (
            "multipart/form-data; boundary=XyZ",
            part("Content-Disposition: form-data;\r\n name=\"_method[]\""),
        ),
        (
            "multipart/form-data; boundary=\"other\"; boundary=XyZ",
            part(r#"Content-Disposition: form-data; name="%5Fmethod""#),
        ),
        ("multipart/mixed; boundary=XyZ", part("Content-ID: _method")),
    ] {
        let reply = rig.post_typed("/v1/items/1", content_type, &body).await;
        let (answer, record) = raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert!(
            answer["reason"].as_str().unwrap().contains("_method"),
            "{content_type} {body}: {answer}"
        );
        assert_eq!(
            record.decision, "deny",
            "{content_type} {body}: {record:#?}"
        );
        let arrived = rig.upstream.seen();
        assert!(
            !arrived.iter().any(|seen| seen["body"] == body.as_str()),
            "{content_type} {body:?} reached the upstream whole"
        );
    }
    // A real client's multipart form: curl's `-F`.
    let session = rig.proxy.session("curl").await;
    let env = rig.proxy.client_env(&session);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let url = format!("https://{API}:{}/v1/items/1", rig.upstream.port);
    let before = rig.upstream.seen().len();
    let out = ostiary_e2e::clients::curl(
        &[
            "-F",
            "note=hello",
            "-F",
            "_method=DELETE",
            "-w",
            "\n%{http_code}",
            &url,
        ],
        &env,
    )
    .await;
    assert!(out.stdout.ends_with("\n400"), "{out}");
    assert!(out.stdout.contains("_method"), "{out}");
    assert_eq!(
        rig.upstream.seen().len(),
        before,
        "curl's form reached the upstream"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "a file that says _method=DELETE\n").unwrap();
    let upload = format!("upload=@{};filename=notes.txt", file.path().display());
    let out = ostiary_e2e::clients::curl(
        &[
            "-F",
            "note=_method=DELETE",
            "-F",
            &upload,
            "-w",
            "\n%{http_code}",
            &url,
        ],
        &env,
    )
    .await;
    assert!(out.stdout.ends_with("\n200"), "{out}");
    assert_eq!(rig.upstream.seen().len(), before + 1, "{out}");

    // A parameter merely containing the word is not an override, and a body the host's
    // frameworks take no override from streams on.
    let reply = rig
        .send(API, "POST", "/v1/items/1?payment_method=card", "{}")
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    for (content_type, body) in [
        (
            "application/json",
            r#"{"payment_method":"card","note":"_method"}"#,
        ),
        ("application/x-www-form-urlencoded", "payment_method=card"),
        ("text/plain", "_method=DELETE"),
        ("application/x-ndjson", r#"{"_method":"DELETE"}"#),
        ("", "payment_method=card"),
        ("", "note=_method"),
        (
            "multipart/form-data; boundary=XyZ",
            "--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\n\
             _method=DELETE\r\n--XyZ--\r\n",
        ),
        (
            "multipart/form-data; boundary=XyZ",
            "--XyZ\r\nContent-Disposition: form-data; name=\"payment_method\"\r\n\r\n\
             card\r\n--XyZ--\r\n",
        ),
    ] {
        let reply = rig.post_typed("/v1/items/1", content_type, body).await;
        assert_eq!(reply.status, 200, "{content_type} {body}: {reply}");
        let arrived = rig.upstream.seen();
        assert_eq!(
            arrived.last().map(|seen| seen["body"].clone()),
            Some(json!(body)),
            "{content_type} {body:?} arrived whole"
        );
    }

    // Query keys PHP, Rails and Express's qs read as arrays or objects, and `;` that Rack
    // splits on: a tool's arguments must be read one way only.
    for path in [
        "/v1/transfer?account[]=prod",
        "/v1/transfer?account%5B%5D=prod",
        "/v1/transfer?account[0]=prod",
        "/v1/transfer?memo[tag]=x",
        "/v1/transfer?account=dev;account=prod",
    ] {
        rig.refused(API, "POST", path, "{}", path).await;
    }
    // Encoded, `;` is data.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/transfer?note=a%3Bb",
            r#"{"account":"dev"}"#,
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");

    // `Mcp_Method` is `Mcp-Method` to CGI-style servers: it must agree with the body too.
    let before = rig.upstream.seen().len();
    let reply = rig
        .send_with(
            MCP,
            "POST",
            "/mcp",
            &[("mcp_method", "tools/call")],
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        )
        .await;
    raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
    assert_eq!(
        rig.upstream.seen().len(),
        before,
        "Mcp_Method reached the upstream"
    );
}
