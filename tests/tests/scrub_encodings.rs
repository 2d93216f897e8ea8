//! A secret never reaches the agent in any encoding an upstream commonly produces (issue 13,
//! item 4), and the streaming hold-back is no oracle (item 6), end to end.
//!
//! The proxy injects a canary holding `+ / = < & '`, a space and `>` from the file backend;
//! a Python upstream (`clients/encoding_upstream.py`) echoes it the way real encoders write
//! it — Python's json.dumps, html.escape, urllib.parse.quote/quote_plus, binascii and
//! base64, and hand-written .NET, Go, Gson and PHP escapers, nested encodings and random
//! per-character mixtures — and every path that returns upstream bytes to the agent is
//! tried: live answers (headers, bodies in tiny chunks, SSE, trailers), approved executions
//! and their stored answers (collected with `Ostiary-Approval` and through the status URL),
//! MCP `tools/list` filtering and merged batch answers, and idempotent replays. The oracle
//! (`clients/find_secret.py`) decodes what the agent got with Python's own decoders, up to
//! three deep, and looks for the canary raw, in hex and in base64; it also reads the audit
//! records, the store and the proxy's log. A streaming echo then shows that a chunk which
//! begins the canary is held back exactly as long as one which does not.

use std::convert::Infallible;
use std::io::Write;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use ostiary_e2e::clients::{client_script, python_bin, PyTlsServer};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, Reply, ReqBody};
use ostiary_sdk::Session;
use serde_json::{json, Value};

/// The injected secret: every character an encoder likes to escape.
const CANARY: &str = "sk-Enc+Can/ary=<x&y'z w>-7f3c9a2e";
const HOST: &str = "enc.example.test";
const REDACTED: &str = "[REDACTED by ostiary]";
const APPROVER: &str = "alice@example.com";

/// The encoders of `encoding_upstream.py` that wrap lines (MIME base64, PEM, hex at 64
/// columns, quoted-printable's soft breaks): found by attacking this proxy, a secret cut
/// across a line break was not matched.
const WRAPPING: &[&str] = &[
    "mime_base64",
    "mime_crlf",
    "pem",
    "pem_in_json",
    "quoted_printable",
    "hex_wrapped",
];

/// The other encoders of `encoding_upstream.py`.
const ENCODERS: &[&str] = &[
    "raw",
    "json_ascii",
    "json_utf8",
    "json_dotnet",
    "json_go",
    "json_gson",
    "json_php",
    "json_every",
    "json_in_json",
    "html_escape",
    "html_php",
    "html_decimal",
    "html_hex_upper",
    "html_named",
    "html_twice",
    "url_quote",
    "url_quote_lower",
    "url_quote_plus",
    "url_twice",
    "url_in_json_php",
    "url_in_json_dotnet",
    "html_in_json_go",
    "json_in_html",
    "hex",
    "hex_upper",
    "base64_gson",
    "base64_php",
    "base64_query",
    "mixed_0",
    "mixed_1",
    "mixed_2",
    "mixed_3",
    "mixed_4",
    "mixed_5",
    "mixed_6",
    "mixed_7",
];

fn tools(port: u16) -> String {
    let mcp = format!("https://{HOST}:{port}/mcp");
    format!(
        r#"
[[tool]]
name = "enc.echo"
tier = "irreversible"
match = {{ host = "{HOST}", method = "POST", path = "/echo" }}

[[tool]]
name = "enc.mcp_echo"
tier = "irreversible"
match = {{ mcp = "{mcp}", tool = "echo" }}

[[tool]]
name = "enc.listed"
tier = "read"
match = {{ mcp = "{mcp}", tool = "listed" }}

[[tool]]
name = "enc.forbidden"
tier = "write"
match = {{ mcp = "{mcp}", tool = "forbidden" }}
"#
    )
}

const POLICIES: &str = r#"
@id("http-ok")
permit (principal, action == Ostiary::Action::"http", resource);
@id("mcp-ok")
permit (principal, action == Ostiary::Action::"mcp", resource);
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);
@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);
@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#;

/// Everything the proxy logs in this process (each test is a process of its own).
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || LogWriter(sink.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buffer
    })
    .clone()
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `encoding_upstream.py` on a port of its own, killed on drop.
struct EncUpstream {
    port: u16,
    _server: PyTlsServer,
}

impl EncUpstream {
    async fn start(ca: &TestCa) -> Self {
        let server = PyTlsServer::start(ca, &[HOST], "encoding_upstream.py", |_| Vec::new()).await;
        Self {
            port: server.port,
            _server: server,
        }
    }
}

struct Rig {
    upstream: EncUpstream,
    proxy: TestProxy,
    session: Session,
    _secrets: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Self {
        let _ = logs();
        let ca = TestCa::new();
        let upstream = EncUpstream::start(&ca).await;
        let secrets = tempfile::tempdir().unwrap();
        let file = secrets.path().join("secrets.toml");
        std::fs::write(&file, format!("enc = \"{CANARY}\"\n")).unwrap();
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(tools(upstream.port)),
            names: vec![HOST.into()],
            ports: vec![upstream.port],
            upstream_ca_pem: Some(ca.ca_pem()),
            watch_interval: Some("100ms".into()),
            extra_toml: format!(
                r#"
[broker]
backend = "file"
file = "{}"

[[credential]]
name = "enc"
source = {{ file = "enc" }}
hosts = ["{HOST}"]
inject = {{ header = "X-Api-Key", value = "{{secret}}" }}

[approvals]
approvers = ["{APPROVER}"]

[sessions.watchdog]
enabled = false
"#,
                file.display()
            ),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        Self {
            upstream,
            proxy,
            session,
            _secrets: secrets,
        }
    }

    fn authority(&self) -> String {
        format!("{HOST}:{}", self.upstream.port)
    }

    async fn h1(&self) -> hyper::client::conn::http1::SendRequest<ReqBody> {
        let tls = raw::intercepted(
            &self.proxy,
            &self.session.token,
            HOST,
            self.upstream.port,
            &[b"http/1.1"],
        )
        .await;
        raw::h1(tls).await
    }

    /// One request through a fresh intercepted tunnel (HTTP/1.1).
    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.authority());
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let req = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        raw::send_h1(&mut self.h1().await, req)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    async fn mcp(&self, headers: &[(&str, &str)], body: Value) -> Reply {
        let mut all = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        all.extend_from_slice(headers);
        self.send("POST", "/mcp", &all, &body.to_string()).await
    }
}

/// Haystacks for the oracle: `what` and the bytes.
type Haystacks = Vec<(String, Vec<u8>)>;

fn reply_haystacks(what: &str, reply: &Reply) -> Haystacks {
    let mut out = vec![(format!("{what} status"), reply.status.as_str().into())];
    for (name, value) in &reply.headers {
        out.push((format!("{what} header name"), name.as_str().into()));
        out.push((format!("{what} header {name}"), value.as_bytes().to_vec()));
    }
    out.push((format!("{what} body"), reply.body.to_vec()));
    out
}

/// Where the canary hides in `haystacks`, found by Python's own decoders.
fn oracle(haystacks: &Haystacks) -> Vec<String> {
    let job = json!({
        "secrets": [CANARY],
        "haystacks": haystacks.iter().map(|(what, bytes)| json!({
            "what": what,
            "b64": base64::engine::general_purpose::STANDARD.encode(bytes),
        })).collect::<Vec<_>>(),
    });
    let mut child = std::process::Command::new(python_bin())
        .arg(client_script("find_secret.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting find_secret.py");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(job.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "find_secret.py failed");
    serde_json::from_slice(&out.stdout).expect("find_secret.py prints a JSON list")
}

fn assert_clean(haystacks: &Haystacks) {
    let found = oracle(haystacks);
    assert!(found.is_empty(), "the canary reached the agent: {found:#?}");
}

/// The audit records (API and every cell of the store) and the log hold no form of the
/// canary either.
async fn assert_no_trace(rig: &Rig) {
    let records = rig.proxy.audit().await;
    assert!(!records.is_empty());
    let mut haystacks: Haystacks = vec![(
        "audit records".into(),
        serde_json::to_vec(&records).unwrap(),
    )];
    let conn = rusqlite::Connection::open_with_flags(
        &rig.proxy.shared.db_path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for table in tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let columns = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..columns {
                if let rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) =
                    row.get_ref(i).unwrap()
                {
                    haystacks.push((format!("store {table}.{i}"), t.to_vec()));
                }
            }
        }
    }
    let log = logs().lock().unwrap().clone();
    assert!(!log.is_empty(), "the proxy logged nothing to look at");
    haystacks.push(("log".into(), log));
    assert_clean(&haystacks);
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_encoder_s_echo_is_scrubbed_from_live_answers() {
    let rig = Rig::start().await;
    let mut haystacks = Haystacks::new();
    for enc in ENCODERS.iter().chain(WRAPPING) {
        for extra in ["", "&chunk=3", "&sse=1"] {
            // One SSE event per line: a wrapped value is cut into events, and no reader
            // joins events into one line.
            if extra == "&sse=1" && WRAPPING.contains(enc) {
                continue;
            }
            let path = format!("/echo?enc={enc}{extra}");
            let reply = rig.send("GET", &path, &[], "").await;
            assert_eq!(reply.status, StatusCode::OK, "{path}: {reply}");
            assert!(
                contains(&reply.body, REDACTED),
                "{path}: no redaction: {reply}"
            );
            haystacks.extend(reply_haystacks(&path, &reply));
        }
    }
    assert_clean(&haystacks);
    assert_no_trace(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_in_a_header_name_or_under_a_transfer_coding_never_reaches_the_agent() {
    let rig = Rig::start().await;
    let mut haystacks = Haystacks::new();
    // Reflected into a header's name, which arrives lowercased: the header goes.
    let reply = rig.send("GET", "/echo?name=1", &[], "").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert!(
        reply
            .headers
            .keys()
            .all(|n| !n.as_str().starts_with("x-n-")),
        "{reply}"
    );
    haystacks.extend(reply_haystacks("name", &reply));
    // Under `Transfer-Encoding: gzip, chunked`, which hyper does not take off: nothing the
    // scrubber cannot read passes, so the answer is a 502.
    for enc in ["raw", "json_dotnet", "html_escape"] {
        let path = format!("/echo?enc={enc}&te=gzip");
        let reply = rig.send("GET", &path, &[], "").await;
        raw::assert_ostiary_error(&reply, 502, "upstream_error");
        haystacks.extend(reply_haystacks(&path, &reply));
    }
    assert_clean(&haystacks);
    assert_no_trace(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_echoing_the_canary_are_scrubbed() {
    let rig = Rig::start().await;
    let mut haystacks = Haystacks::new();
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        HOST,
        rig.upstream.port,
        &[b"h2"],
    )
    .await;
    let mut sender = raw::h2(tls).await;
    for enc in ["raw", "json_dotnet", "html_escape", "url_quote", "mixed_2"] {
        let uri = format!("https://{}/echo?enc={enc}&trailers=1", rig.authority());
        let req = Request::get(&uri)
            .header("te", "trailers")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = tokio::time::timeout(raw::IO_DEADLINE, sender.send_request(req))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected
            .trailers()
            .cloned()
            .unwrap_or_else(|| panic!("{enc}: the upstream's trailers reach an h2 client"));
        let echoed = trailers.get("x-echo-trailer").expect("the echo trailer");
        assert!(contains(echoed.as_bytes(), REDACTED), "{enc}: {echoed:?}");
        for (name, value) in &trailers {
            haystacks.push((format!("{enc} trailer {name}"), value.as_bytes().to_vec()));
        }
        haystacks.push((format!("{enc} body"), collected.to_bytes().to_vec()));
    }
    assert_clean(&haystacks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_replays_are_scrubbed() {
    let rig = Rig::start().await;
    let mut haystacks = Haystacks::new();
    for (i, enc) in [
        "json_dotnet",
        "json_gson",
        "html_php",
        "url_twice",
        "mixed_5",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("key-{i}");
        let path = format!("/idem?enc={enc}");
        let first = rig
            .send("POST", &path, &[("idempotency-key", &key)], "{}")
            .await;
        let again = rig
            .send("POST", &path, &[("idempotency-key", &key)], "{}")
            .await;
        assert_eq!(first.status, StatusCode::CREATED, "{first}");
        assert_eq!(again.status, StatusCode::CREATED, "{again}");
        assert!(again.header("idempotency-replayed").is_some(), "{again}");
        assert_eq!(again.body, first.body, "the replay is what the agent got");
        assert!(contains(&again.body, REDACTED), "{again}");
        haystacks.extend(reply_haystacks(&format!("{enc} first"), &first));
        haystacks.extend(reply_haystacks(&format!("{enc} replay"), &again));
    }
    assert_clean(&haystacks);
    assert_no_trace(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_list_filtering_and_merged_batches_are_scrubbed() {
    let rig = Rig::start().await;
    let mut haystacks = Haystacks::new();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let batch = json!([
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "forbidden", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "listed", "arguments": {}}},
    ]);
    for enc in ["raw", "dotnet", "go", "gson", "php"] {
        for as_ in ["json", "sse"] {
            let headers = [("x-enc", enc), ("x-as", as_)];
            let reply = rig.mcp(&headers, list.clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{enc} {as_}: {reply}");
            let text = String::from_utf8_lossy(&reply.body).into_owned();
            // Filtered: the uncatalogued tool is gone, so the answer was re-serialised.
            assert!(text.contains("listed"), "{enc} {as_}: {text}");
            assert!(!text.contains("uncatalogued"), "{enc} {as_}: {text}");
            assert!(text.contains(REDACTED), "{enc} {as_}: {text}");
            haystacks.extend(reply_haystacks(&format!("list {enc} {as_}"), &reply));
            let reply = rig.mcp(&headers, batch.clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{enc} {as_}: {reply}");
            let text = String::from_utf8_lossy(&reply.body).into_owned();
            // Merged: the refused call's error is there with the upstream's answers.
            assert!(text.contains("\"id\":3"), "{enc} {as_}: {text}");
            assert!(text.contains("saw "), "{enc} {as_}: {text}");
            haystacks.extend(reply_haystacks(&format!("batch {enc} {as_}"), &reply));
        }
    }
    assert_clean(&haystacks);
    assert_no_trace(&rig).await;
}

/// Hold a request, approve it, and collect its outcome both ways.
async fn hold_approve_collect(
    rig: &Rig,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Haystacks {
    let held = rig.send("POST", path, headers, body).await;
    let pending: Value = serde_json::from_slice(&held.body).unwrap();
    // A REST call is answered 202; an MCP call with a JSON-RPC error carrying the same.
    let pending = match pending.get("error") {
        Some(error) if error.is_object() => error["data"].clone(),
        _ => {
            assert_eq!(held.status.as_u16(), 202, "{path}: {held}");
            pending
        }
    };
    assert_eq!(pending["error"], "approval_pending", "{path}: {held}");
    let id = pending["approval_id"].as_str().unwrap().to_owned();
    let status_url = pending["status_url"].as_str().unwrap().to_owned();
    let control = rig.proxy.control();
    control.decide(&id, true, APPROVER, None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let admin = loop {
        let a = control.approval(&id).await.unwrap();
        if a["status"] == "executed" {
            break a;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id}: {a:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut retry_headers = headers.to_vec();
    retry_headers.push(("ostiary-approval", &id));
    let collected = rig.send("POST", path, &retry_headers, body).await;
    assert_eq!(collected.status, StatusCode::OK, "{path}: {collected}");
    assert!(contains(&collected.body, REDACTED), "{path}: {collected}");
    // The status URL, called directly with the session token.
    let status = reqwest::Client::new()
        .get(&status_url)
        .bearer_auth(&rig.session.token)
        .send()
        .await
        .unwrap();
    assert!(status.status().is_success(), "{status_url}");
    let status = status.bytes().await.unwrap().to_vec();
    assert!(
        contains(&status, "executed"),
        "{}",
        String::from_utf8_lossy(&status)
    );
    let mut out = reply_haystacks(&format!("{path} collected"), &collected);
    out.push((format!("{path} status url"), status));
    out.push((format!("{path} admin view"), admin.to_string().into_bytes()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_calls_and_their_stored_answers_are_scrubbed() {
    let rig = Rig::start().await;
    let mut haystacks = Haystacks::new();
    for enc in [
        "json_dotnet",
        "json_in_json",
        "html_escape",
        "url_quote_plus",
        "mixed_3",
    ] {
        let path = format!("/echo?enc={enc}");
        let json = [("content-type", "application/json")];
        haystacks.extend(hold_approve_collect(&rig, &path, &json, "{}").await);
    }
    // An MCP call answered over SSE: stored as the one JSON-RPC message it carries,
    // decoded and written again, and collected under the retry's own id.
    for (i, enc) in ["dotnet", "gson", "php"].iter().enumerate() {
        let call = json!({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"n": i}}});
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("x-enc", *enc),
            ("x-as", if i % 2 == 0 { "sse" } else { "json" }),
        ];
        haystacks.extend(hold_approve_collect(&rig, "/mcp", &headers, &call.to_string()).await);
    }
    assert_clean(&haystacks);
    assert_no_trace(&rig).await;
}

/// A streamed request whose chunks the test sends one by one, to an upstream that echoes
/// every chunk as it arrives; after each chunk, what the agent has received.
async fn released_after_each(rig: &Rig, chunks: &[Vec<u8>], expected: &[usize]) -> Vec<usize> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let req = Request::post("/stream-echo")
        .header("host", rig.authority())
        .body(StreamBody::new(frames))
        .unwrap();
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        HOST,
        rig.upstream.port,
        &[b"http/1.1"],
    )
    .await;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let response = tokio::spawn(sender.send_request(req));
    // The proxy decides (and sends the head on) once the body has begun.
    tx.send(Bytes::from(chunks[0].clone())).unwrap();
    let response = tokio::time::timeout(raw::IO_DEADLINE, response)
        .await
        .expect("the answer's head")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0usize;
    let mut seen = Vec::new();
    for (i, (chunk, want)) in chunks.iter().zip(expected).enumerate() {
        if i > 0 {
            tx.send(Bytes::from(chunk.clone())).unwrap();
        }
        // Wait for what must have arrived; whatever came in the same read counts too, so
        // a proxy releasing more than the fixed window shows.
        while received < *want {
            let frame = tokio::time::timeout(raw::IO_DEADLINE, body.frame())
                .await
                .unwrap_or_else(|_| panic!("only {received} of {want} bytes arrived"))
                .expect("the body goes on")
                .unwrap();
            received += frame.data_ref().map_or(0, Bytes::len);
        }
        seen.push(received);
    }
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    seen.push(received + rest.len());
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_back_is_the_same_for_a_probe_that_begins_the_canary_and_one_that_does_not() {
    let rig = Rig::start().await;
    // The session holds the canary (a first request mints it): requests are scanned for it
    // (dlp of the write tier) and answers scrubbed of it.
    let first = rig.send("GET", "/echo?enc=raw", &[], "").await;
    assert!(contains(&first.body, REDACTED), "{first}");
    let scrub_hold = ostiary::scrub::Scrubber::new([CANARY]).hold_back();
    let dlp_hold = ostiary::check::dlp::Detectors::with_literals(
        &ostiary::check::dlp::Detectors::default_set(),
        vec![("enc".into(), CANARY.as_bytes().to_vec())],
    )
    .hold_back();
    let filler = |n: usize| vec![b'x'; n];
    let head = filler(scrub_hold + dlp_hold + 2000);
    // Long enough that a rescan of the held window is never skipped.
    let pad = filler(scrub_hold);
    let mut observed = Vec::new();
    for k in [1, 4, 9, CANARY.len() - 1] {
        let mut matching = pad.clone();
        matching.extend_from_slice(&CANARY.as_bytes()[..k]);
        let mut other = pad.clone();
        other.extend(std::iter::repeat_n(b'q', k));
        let tail = filler(3000);
        // After each chunk: all sent so far but the request's held window, and of that
        // echo all but the answer's held window.
        let mut sent = 0;
        let expected: Vec<usize> = [head.len(), matching.len(), tail.len()]
            .iter()
            .map(|n| {
                sent += n;
                sent.saturating_sub(dlp_hold).saturating_sub(scrub_hold)
            })
            .collect();
        let chunks_a = [head.clone(), matching.clone(), tail.clone()];
        let chunks_b = [head.clone(), other.clone(), tail.clone()];
        let a = released_after_each(&rig, &chunks_a, &expected).await;
        let b = released_after_each(&rig, &chunks_b, &expected).await;
        assert_eq!(a, b, "probe of {k} bytes");
        let mut want = expected.clone();
        want.push(sent);
        assert_eq!(a, want, "probe of {k} bytes: the fixed windows and no more");
        observed.push(a);
    }
    assert_eq!(observed.len(), 4);
}
