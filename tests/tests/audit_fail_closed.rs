//! The audit trail fails closed and notices truncation (issue 13, item 8).
//!
//! What it proves, with a real proxy, real upstreams that record what reached them, the
//! real `ostiary` binary for `serve`, `audit verify` and `audit reanchor`:
//! - a state directory on a small tmpfs filled up mid-run: requests are refused `503
//!   audit_unavailable` (plain http, inside a tunnel opened before the outage, a new
//!   CONNECT, a POST, an unauthenticated request) and the upstreams see none of them;
//!   `/readyz` fails naming the audit, the metric says so; once space is freed the proxy
//!   resumes by itself, every request has exactly one record, and the chain verifies;
//! - a database locked by another connection past the bound: the same, then recovery;
//! - the newest rows deleted while the proxy is running: it stops forwarding;
//! - the newest rows deleted between two runs: the next start (in-process and `ostiary
//!   serve`) refuses, naming the last record the checkpoint expects and the last one
//!   found; `audit verify` fails; `audit reanchor` records the loss and the proxy runs again;
//! - a deleted or forged checkpoint, a database replaced by an older copy: refused too; an
//!   older genuine checkpoint (what a crash leaves) is accepted and caught up.
//!
//! Needs root for `mount -t tmpfs` (the state directory on a filesystem of its own).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ostiary_e2e::clients::CmdOutput;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{
    absolute_get, assert_ostiary_error, auth_line, connect, exchange, h1, intercepted, request,
    send_h1, Reply,
};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

#[path = "support/cli.rs"]
mod support;
use support::{ostiary, spawn_serve, SERVER_DEADLINE};

/// How long the proxy may take to notice an outage, or its end (polled, not asserted).
const NOTICE: Duration = Duration::from_secs(30);

/// A tmpfs mounted on a temporary directory for one test, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fill it: a file grown until the filesystem refuses another byte.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let big = vec![0u8; 1 << 20];
        while file.write_all(&big).is_ok() {}
        let small = [0u8; 512];
        while file.write_all(&small).is_ok() {}
        assert!(
            std::fs::write(self.path().join("probe"), b"x").is_err(),
            "the tmpfs is full"
        );
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a connection the proxy's last tasks still hold must not keep it mounted.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A client for the control listener (never through a proxy).
fn control_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `GET /readyz`: status and body.
async fn readyz(proxy: &TestProxy) -> (u16, Value) {
    let response = control_client()
        .get(format!("http://{}/readyz", proxy.control_addr))
        .send()
        .await
        .expect("/readyz answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("/readyz is JSON"))
}

/// The value of the metric line starting with `name ` (with the admin token, which
/// `/metrics` may require).
async fn metric(proxy: &TestProxy, name: &str) -> f64 {
    let text = control_client()
        .get(format!("http://{}/metrics", proxy.control_addr))
        .bearer_auth(&proxy.admin_token)
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// Polls `/readyz` until it answers `want`.
async fn wait_ready(proxy: &TestProxy, want: u16) -> Value {
    let deadline = tokio::time::Instant::now() + NOTICE;
    loop {
        let (status, body) = readyz(proxy).await;
        if status == want {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still {status} after {NOTICE:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Counts what a test sent and what came back.
#[derive(Debug, Default)]
struct Tally {
    /// Requests on the proxy listener or in tunnels that each owe one `http` record.
    http: usize,
    /// Request ids of every `503 audit_unavailable` answer.
    refused: Vec<String>,
}

impl Tally {
    /// Count `reply`; if it is a refusal, check it is `audit_unavailable` and keep its id.
    fn saw(&mut self, reply: &Reply) -> bool {
        self.http += 1;
        if reply.status == 503 {
            let body = assert_ostiary_error(reply, 503, "audit_unavailable");
            assert_eq!(
                body.as_object().map(|o| o.len()),
                Some(3),
                "the agent learns nothing of the proxy's disk: {body}"
            );
            self.refused.push(reply.request_id().unwrap().to_owned());
            return true;
        }
        assert_eq!(reply.status, 200, "{reply}");
        false
    }
}

/// Plain-http GETs until the first refusal: how many were forwarded before it. The records
/// of those are the batch whose failure the proxy noticed.
async fn until_refused(proxy: &TestProxy, url: &str, auth: &str, tally: &mut Tally) -> usize {
    let deadline = tokio::time::Instant::now() + NOTICE;
    let mut forwarded = 0;
    loop {
        if tally.saw(&absolute_get(proxy, url, auth).await) {
            return forwarded;
        }
        forwarded += 1;
        assert!(
            tokio::time::Instant::now() < deadline,
            "{forwarded} requests forwarded and none refused in {NOTICE:?}"
        );
    }
}

/// Every way in is refused while the trail is unavailable, and nothing reaches an upstream.
async fn assert_nothing_forwarded(
    proxy: &TestProxy,
    plain: &Upstream,
    tls: &Upstream,
    token: &str,
    tunnel: &mut hyper::client::conn::http1::SendRequest<ostiary_e2e::raw::ReqBody>,
    tally: &mut Tally,
) {
    let (plain_seen, tls_seen) = (plain.seen().len(), tls.seen().len());
    let auth = auth_line(token);
    for i in 0..10 {
        let reply = absolute_get(proxy, &plain.url(&format!("/echo?after={i}")), &auth).await;
        assert!(tally.saw(&reply), "refused while unavailable:\n{reply}");
    }
    let host = format!("{}:{}", plain.host(), plain.port());
    let post = format!(
        "POST {} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: 5\r\nConnection: close\r\n\r\nhello",
        plain.url("/echo")
    );
    let reply = exchange(proxy.proxy_addr, post.as_bytes()).await.unwrap();
    assert!(tally.saw(&reply), "a POST is refused:\n{reply}");
    // The check comes before authentication: nothing is examined while nothing is recorded.
    let reply = absolute_get(proxy, &plain.url("/echo?anonymous"), "").await;
    assert!(
        tally.saw(&reply),
        "an unauthenticated request too:\n{reply}"
    );
    // A tunnel opened before the outage is no way around it: each request inside is checked.
    let authority = format!("{}:{}", tls.host(), tls.port());
    let reply = send_h1(tunnel, request("GET", "/echo?in-tunnel", Some(&authority)))
        .await
        .expect("the tunnel answers");
    assert!(tally.saw(&reply), "refused inside an open tunnel:\n{reply}");
    // Nor is a new tunnel opened.
    let (_, reply) = connect(proxy.proxy_addr, &authority, &auth).await;
    assert_ostiary_error(&reply, 503, "audit_unavailable");
    assert_eq!(
        plain.seen().len(),
        plain_seen,
        "no request reached the upstream"
    );
    assert_eq!(
        tls.seen().len(),
        tls_seen,
        "no request reached the TLS upstream"
    );
}

/// After the proxy stopped: `audit verify` passes, each request left exactly one `http`
/// record, each refusal is recorded as such, and the outage itself is on record.
async fn assert_all_recorded(state: &Path, tally: &Tally, forwarded: usize, why: &[&str]) {
    let report = verify_in_process(state);
    assert!(
        report.ok(),
        "the chain verifies after the outage: {report:#?}"
    );
    let conn = rusqlite::Connection::open_with_flags(
        state.join("ostiary.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let records: Vec<Value> = conn
        .prepare("SELECT record FROM audit ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| serde_json::from_str(&r.unwrap()).unwrap())
        .collect();
    let http: Vec<&Value> = records.iter().filter(|r| r["kind"] == "http").collect();
    assert_eq!(
        http.len(),
        tally.http,
        "one record per request, none lost: {http:#?}"
    );
    let allowed = http.iter().filter(|r| r["decision"] == "allow").count();
    assert_eq!(
        allowed, forwarded,
        "every forwarded request is recorded as allowed"
    );
    for id in &tally.refused {
        let mine: Vec<_> = records.iter().filter(|r| r["request_id"] == *id).collect();
        assert_eq!(mine.len(), 1, "refusal {id} recorded once: {mine:#?}");
        assert_eq!(mine[0]["error"], "audit_unavailable", "{:#?}", mine[0]);
        assert_eq!(mine[0]["status"], 503, "{:#?}", mine[0]);
    }
    let outage: Vec<_> = records.iter().filter(|r| r["kind"] == "audit").collect();
    assert!(
        outage.iter().any(|r| r["reason"]
            .as_str()
            .is_some_and(|t| why.iter().any(|w| t.contains(w)))),
        "the outage and its cause ({why:?}) are on record: {outage:#?}"
    );
}

/// What `ostiary audit verify` checks, run in-process (the binary is driven in
/// [`rows_deleted_between_runs_refuse_the_next_start_until_reanchored`]).
fn verify_in_process(state: &Path) -> ostiary::audit::verify::VerifyReport {
    let key = std::fs::read_to_string(state.join("audit.key")).unwrap();
    let stores = ostiary::store::sqlite::open_read_only(&state.join("ostiary.db")).unwrap();
    ostiary::audit::verify::verify(
        &*stores.audit,
        key.trim().as_bytes(),
        &state.join("audit.head"),
    )
    .unwrap()
}

/// The problems `verify` finds, one per line.
fn problems(state: &Path) -> String {
    verify_in_process(state).problems.join("\n")
}

/// `ostiary audit verify` against the state directory `state`.
async fn verify(state: &Path) -> CmdOutput {
    let config = state.with_extension("verify.toml");
    std::fs::write(&config, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    ostiary(&["--config", &config.display().to_string(), "audit", "verify"]).await
}

/// `ostiary audit reanchor` against `state`, with `args` after it.
async fn reanchor(state: &Path, args: &[&str]) -> CmdOutput {
    let config = state.with_extension("verify.toml");
    std::fs::write(&config, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    let config = config.display().to_string();
    let mut all = vec!["--config", &config, "audit", "reanchor"];
    all.extend_from_slice(args);
    ostiary(&all).await
}

/// A proxy on `state` for `upstreams`.
async fn proxy_on(state: Option<PathBuf>, upstreams: &[&Upstream]) -> TestProxy {
    let tls = upstreams.iter().find(|u| u.is_tls());
    TestProxy::start(ProxySpec {
        ports: upstreams.iter().map(|u| u.port()).collect(),
        upstream_ca_pem: tls.map(|u| u.ca_pem()),
        state_dir: state,
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_forwarding_until_space_is_freed_and_loses_nothing() {
    let fs = Tmpfs::mount("24m");
    let state = fs.path().join("state");
    let plain = Upstream::builder().tls(false).start().await;
    let tls = Upstream::builder().start().await;
    let proxy = proxy_on(Some(state.clone()), &[&plain, &tls]).await;
    let session = proxy.session("writer").await;
    let auth = auth_line(&session.token);
    let url = plain.url("/echo");
    let mut tally = Tally::default();

    let body = wait_ready(&proxy, 200).await;
    assert_eq!(body["components"]["audit"]["ok"], true, "{body}");
    for _ in 0..5 {
        assert!(!tally.saw(&absolute_get(&proxy, &url, &auth).await));
    }
    let mut tunnel = h1(intercepted(
        &proxy,
        &session.token,
        tls.host(),
        tls.port(),
        &[b"http/1.1"],
    )
    .await)
    .await;
    let authority = format!("{}:{}", tls.host(), tls.port());
    let reply = send_h1(&mut tunnel, request("GET", "/echo", Some(&authority)))
        .await
        .unwrap();
    assert!(!tally.saw(&reply));
    assert!(
        proxy.shared.audit.flush().await,
        "all written before the disk fills"
    );
    assert_eq!(metric(&proxy, "ostiary_audit_available").await, 1.0);

    let filler = fs.fill();
    let window = until_refused(&proxy, &url, &auth, &mut tally).await;
    eprintln!("forwarded between the disk filling up and the first refusal: {window}");
    assert_nothing_forwarded(
        &proxy,
        &plain,
        &tls,
        &session.token,
        &mut tunnel,
        &mut tally,
    )
    .await;
    let body = wait_ready(&proxy, 503).await;
    assert_eq!(body["status"], "unavailable", "{body}");
    assert_eq!(body["components"]["audit"]["ok"], false, "{body}");
    let reason = body["components"]["audit"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("full") || reason.contains("No space"),
        "/readyz names the cause: {body}"
    );
    assert_eq!(metric(&proxy, "ostiary_audit_available").await, 0.0);
    assert!(metric(&proxy, "ostiary_audit_write_failures_total").await >= 1.0);
    assert!(
        !proxy.shared.audit.flush().await,
        "nobody is kept waiting through the outage"
    );

    std::fs::remove_file(filler).unwrap();
    wait_ready(&proxy, 200).await;
    for _ in 0..5 {
        assert!(
            !tally.saw(&absolute_get(&proxy, &url, &auth).await),
            "forwarding resumed"
        );
    }
    let reply = send_h1(&mut tunnel, request("GET", "/echo?again", Some(&authority)))
        .await
        .unwrap();
    assert!(!tally.saw(&reply), "the tunnel works again:\n{reply}");
    assert_eq!(metric(&proxy, "ostiary_audit_available").await, 1.0);
    let forwarded = plain.seen().len() + tls.seen().len();
    assert_eq!(forwarded, 5 + window + 5 + 2, "only those were forwarded");
    drop(tunnel);
    proxy.stop().await;
    assert_all_recorded(&state, &tally, forwarded, &["full", "No space"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_past_the_bound_stops_forwarding_then_recovers() {
    let plain = Upstream::builder().tls(false).start().await;
    let tls = Upstream::builder().start().await;
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    let proxy = proxy_on(Some(state.clone()), &[&plain, &tls]).await;
    let session = proxy.session("writer").await;
    let auth = auth_line(&session.token);
    let url = plain.url("/echo");
    let mut tally = Tally::default();
    let mut tunnel = h1(intercepted(
        &proxy,
        &session.token,
        tls.host(),
        tls.port(),
        &[b"http/1.1"],
    )
    .await)
    .await;
    for _ in 0..3 {
        assert!(!tally.saw(&absolute_get(&proxy, &url, &auth).await));
    }
    assert!(proxy.shared.audit.flush().await);

    // Another process's connection takes the write lock and keeps it.
    let locker = rusqlite::Connection::open(state.join("ostiary.db")).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let window = until_refused(&proxy, &url, &auth, &mut tally).await;
    eprintln!("forwarded between the lock and the first refusal: {window}");
    assert_nothing_forwarded(
        &proxy,
        &plain,
        &tls,
        &session.token,
        &mut tunnel,
        &mut tally,
    )
    .await;
    let body = wait_ready(&proxy, 503).await;
    assert!(
        body["components"]["audit"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("locked")),
        "{body}"
    );

    locker.execute_batch("ROLLBACK").unwrap();
    wait_ready(&proxy, 200).await;
    for _ in 0..3 {
        assert!(
            !tally.saw(&absolute_get(&proxy, &url, &auth).await),
            "forwarding resumed"
        );
    }
    let forwarded = plain.seen().len() + tls.seen().len();
    assert_eq!(forwarded, 3 + window + 3);
    drop(tunnel);
    proxy.stop().await;
    assert_all_recorded(&state, &tally, forwarded, &["locked"]).await;
}

/// A write lock another connection holds for longer than one attempt's bound (250 ms) but
/// shorter than the stall bound (2 s) is waited out, as the store's own writers hold it
/// through a burst (hundreds of approvals held at once, each synced): nothing is refused,
/// every request is recorded, and the trail never counts as failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_briefly_is_waited_out_and_nothing_is_refused() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let proxy = proxy_on(Some(state.clone()), &[&plain]).await;
    let session = proxy.session("writer").await;
    let auth = auth_line(&session.token);
    let url = plain.url("/echo");
    let mut tally = Tally::default();
    assert!(!tally.saw(&absolute_get(&proxy, &url, &auth).await));
    assert!(proxy.shared.audit.flush().await);

    let locker = rusqlite::Connection::open(state.join("ostiary.db")).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let held = std::time::Instant::now();
    while held.elapsed() < Duration::from_millis(900) {
        assert!(
            !tally.saw(&absolute_get(&proxy, &url, &auth).await),
            "refused while the lock was held for {} ms",
            held.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    locker.execute_batch("ROLLBACK").unwrap();
    assert!(proxy.shared.audit.flush().await, "the backlog is written");
    let (status, body) = readyz(&proxy).await;
    assert_eq!(status, 200, "{body}");
    let forwarded = plain.seen().len();
    assert_eq!(forwarded, tally.http);
    proxy.stop().await;

    let report = verify_in_process(&state);
    assert!(report.ok(), "{report:#?}");
    let conn = rusqlite::Connection::open(state.join("ostiary.db")).unwrap();
    let count = |kind: &str| -> usize {
        conn.query_row(
            "SELECT count(*) FROM audit WHERE json_extract(record, '$.kind') = ?1",
            [kind],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as usize
    };
    assert_eq!(count("http"), tally.http, "one record per request");
    assert_eq!(count("audit"), 0, "no outage was recorded");
}

/// Newest rows of the chain, deleted by hand: `DELETE FROM audit WHERE seq > keep`.
fn delete_after(state: &Path, keep: i64) -> usize {
    rusqlite::Connection::open(state.join("ostiary.db"))
        .unwrap()
        .execute("DELETE FROM audit WHERE seq > ?1", [keep])
        .unwrap()
}

/// The last sequence number in the chain.
fn last_seq(state: &Path) -> i64 {
    rusqlite::Connection::open(state.join("ostiary.db"))
        .unwrap()
        .query_row("SELECT coalesce(max(seq), 0) FROM audit", [], |r| r.get(0))
        .unwrap()
}

/// Run a proxy on `state`, send `n` requests through it, stop it.
async fn traffic(state: &Path, plain: &Upstream, n: usize) {
    let proxy = proxy_on(Some(state.to_owned()), &[plain]).await;
    let session = proxy.session("agent").await;
    for i in 0..n {
        let reply = absolute_get(
            &proxy,
            &plain.url(&format!("/echo?{i}")),
            &auth_line(&session.token),
        )
        .await;
        assert_eq!(reply.status, 200, "{reply}");
    }
    proxy.stop().await;
}

/// A config for a proxy on `state` (ports 0, the default policy library), written next to it.
fn config_for(state: &Path) -> PathBuf {
    let path = state.with_extension("serve.toml");
    std::fs::write(
        &path,
        format!(
            "[listen]\nproxy = \"127.0.0.1:0\"\ncontrol = \"127.0.0.1:0\"\n\n[state]\ndir = \"{}\"\n",
            state.display()
        ),
    )
    .unwrap();
    path
}

/// Start a proxy on `state` in-process: the error that refused it, if it was refused.
async fn start_error(state: &Path) -> Option<String> {
    let config = ostiary::Config::load(&config_for(state)).unwrap();
    match ostiary::Ostiary::build(config, ostiary::Options::default()).await {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// `ostiary serve` on `state`: it must exit on its own, non-zero; its log.
async fn serve_refuses(state: &Path) -> String {
    let log = state.with_extension("serve.log");
    let mut child = spawn_serve(Some(&config_for(state)), None, &log, "info");
    let status = tokio::time::timeout(SERVER_DEADLINE, child.wait())
        .await
        .expect("ostiary serve exits by itself")
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "ostiary serve refused to start:\n{text}");
    text
}

/// Copies the (flat) state directory, WAL included, to `to`.
fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_deleted_between_runs_refuse_the_next_start_until_reanchored() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    traffic(&state, &plain, 4).await;
    let expected = last_seq(&state);
    assert!(expected >= 5, "a session and 4 requests: {expected}");
    assert!(verify(&state).await.success());

    let found = expected - 3;
    assert_eq!(delete_after(&state, found), 3);
    let names = |text: &str| {
        text.contains(&format!("ends at record {found}"))
            && text.contains(&format!("names record {expected}"))
            && text.contains("ostiary audit reanchor")
    };
    let error = start_error(&state).await.expect("the start is refused");
    assert!(names(&error), "{error}");
    let log = serve_refuses(&state).await;
    assert!(names(&log), "ostiary serve says why:\n{log}");
    let out = verify(&state).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(
        out.stdout.contains(&format!(
            "the chain ends at record {found} but record {expected} was written (newest records deleted"
        )),
        "{out}"
    );
    assert_eq!(last_seq(&state), found, "a refused start wrote nothing");

    // Acknowledging needs a reason.
    assert!(!reanchor(&state, &[]).await.success());
    assert!(!reanchor(&state, &["--reason", "  "]).await.success());
    let out = reanchor(
        &state,
        &["--reason", "rows cut by the backup job; checked by ops"],
    )
    .await;
    assert!(out.success(), "{out}");
    let anchor = expected + 1;
    assert!(out.stdout.contains(&format!("record {anchor}")), "{out}");
    let out = verify(&state).await;
    assert!(out.success(), "an acknowledged loss verifies:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "records {} to {expected} are missing: acknowledged by the re-anchor at record {anchor}",
            found + 1
        )),
        "the loss stays visible:\n{out}"
    );
    assert!(out.stdout.contains("rows cut by the backup job"), "{out}");

    // The proxy runs again, numbering on after the re-anchor; nothing is left to acknowledge.
    traffic(&state, &plain, 2).await;
    assert!(last_seq(&state) > anchor);
    let out = verify(&state).await;
    assert!(out.success(), "{out}");
    let out = reanchor(&state, &["--reason", "again"]).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stdout.contains("nothing to re-anchor"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_forged_checkpoint_or_an_older_database_refuses_the_start() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("base");
    traffic(&base, &plain, 3).await;
    let older = root.path().join("older");
    copy_state(&base, &older);
    traffic(&base, &plain, 3).await;
    let last = last_seq(&base);
    let head = std::fs::read_to_string(base.join("audit.head")).unwrap();
    assert!(head.starts_with(&format!("{last} ")), "{head}");

    // (a) The checkpoint deleted.
    let s = root.path().join("no-head");
    copy_state(&base, &s);
    std::fs::remove_file(s.join("audit.head")).unwrap();
    let error = start_error(&s).await.expect("refused");
    assert!(
        error.contains("checkpoint") && error.contains("is missing"),
        "{error}"
    );
    assert!(problems(&s).contains("is missing"), "{}", problems(&s));

    // (b) The newest rows deleted and the checkpoint rewritten to name the new last row,
    // in each format an attacker without the audit key could write.
    let cut = last - 2;
    let cut_hash: String = {
        let s = root.path().join("probe");
        copy_state(&base, &s);
        rusqlite::Connection::open(s.join("ostiary.db"))
            .unwrap()
            .query_row("SELECT hash FROM audit WHERE seq = ?1", [cut], |r| r.get(0))
            .unwrap()
    };
    for (name, forged) in [
        ("unsealed", format!("{cut} {cut_hash}\n")),
        ("bad-seal", format!("{cut} {cut_hash} {}\n", "0".repeat(64))),
        (
            "old-seal",
            format!(
                "{cut} {cut_hash} {}\n",
                head.split_whitespace().nth(2).unwrap()
            ),
        ),
        ("garbage", "not a checkpoint\n".to_owned()),
    ] {
        let s = root.path().join(name);
        copy_state(&base, &s);
        delete_after(&s, cut);
        std::fs::write(s.join("audit.head"), forged).unwrap();
        let error = start_error(&s).await.expect("refused");
        assert!(error.contains("cannot be trusted"), "{name}: {error}");
        let found = problems(&s);
        assert!(found.contains("cannot be trusted"), "{name}: {found}");
    }

    // (c) The database replaced by an older copy, the checkpoint left alone.
    let s = root.path().join("old-db");
    copy_state(&base, &s);
    for file in ["ostiary.db", "ostiary.db-wal", "ostiary.db-shm"] {
        let _ = std::fs::remove_file(s.join(file));
        if older.join(file).exists() {
            std::fs::copy(older.join(file), s.join(file)).unwrap();
        }
    }
    let found = last_seq(&s);
    assert!(found < last);
    let error = start_error(&s).await.expect("refused");
    assert!(
        error.contains(&format!("ends at record {found}"))
            && error.contains(&format!("names record {last}")),
        "{error}"
    );
    assert!(
        problems(&s).contains("newest records deleted"),
        "{}",
        problems(&s)
    );

    // (d) An older genuine checkpoint with the chain intact is what a crash between a
    // commit and its checkpoint leaves: accepted, and caught up.
    let s = root.path().join("old-head");
    copy_state(&base, &s);
    std::fs::copy(older.join("audit.head"), s.join("audit.head")).unwrap();
    assert!(
        verify_in_process(&s).ok(),
        "records are all there: {}",
        problems(&s)
    );
    assert_eq!(start_error(&s).await, None, "accepted");
    let caught_up = std::fs::read_to_string(s.join("audit.head")).unwrap();
    assert!(caught_up.starts_with(&format!("{last} ")), "{caught_up}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_deleted_while_running_stop_forwarding_and_the_next_start() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let proxy = proxy_on(Some(state.clone()), &[&plain]).await;
    let session = proxy.session("agent").await;
    let auth = auth_line(&session.token);
    let url = plain.url("/echo");
    let mut tally = Tally::default();
    for _ in 0..3 {
        assert!(!tally.saw(&absolute_get(&proxy, &url, &auth).await));
    }
    assert!(proxy.shared.audit.flush().await);
    let expected = last_seq(&state);
    delete_after(&state, expected - 2);

    let window = until_refused(&proxy, &url, &auth, &mut tally).await;
    eprintln!("forwarded after the deletion: {window}");
    let body = wait_ready(&proxy, 503).await;
    assert!(
        body["components"]["audit"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("changed by another writer")),
        "{body}"
    );
    let seen = plain.seen().len();
    for _ in 0..3 {
        assert!(tally.saw(&absolute_get(&proxy, &url, &auth).await));
    }
    assert_eq!(plain.seen().len(), seen);
    proxy.stop().await;
    let error = start_error(&state)
        .await
        .expect("the next start is refused");
    assert!(
        error.contains(&format!("names record {expected}")),
        "{error}"
    );
}
