//! `ostiary audit tail` (docs/design.md §7, docs/cli.md) against a running `ostiary serve`:
//! the real binary following the state directory the proxy writes.
//!
//! What it proves:
//! - started after a request was recorded, tail does not print it; a request made after
//!   tail said it was following is printed, as the same JSON line `audit query` prints;
//! - `--session` keeps to that session's records (another session's request is not shown);
//! - `--since` first prints what matched since then, `--decision` keeps to one decision, and
//!   the follow goes on after the backlog;
//! - Ctrl-C (SIGINT) ends it with exit 0.

use std::process::Stdio;
use std::time::Duration;

use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::support::cli as support;
use support::*;

/// Allows `/status/<code>` on `api.example.test` (the upstream answers with that code), so
/// that every request of the test has a path of its own to find its record by; anything
/// else is denied.
const POLICY: &str = r#"
@id("allow-status")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path like "/status/*" };
"#;

/// How long a record may take to reach a tail (committed, then seen by a poll).
const SEEN_WITHIN: Duration = Duration::from_secs(30);

/// `ostiary audit tail <filters>` on `server`'s state, once it says it is following.
struct Tail {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Tail {
    async fn start(server: &Server, filters: &[&str]) -> Self {
        let config = server.config_arg();
        let mut cmd = Command::new(ostiary_bin());
        cmd.args(["--config", &config, "audit", "tail", "--interval", "50ms"])
            .args(filters)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("OSTIARY_LOG", "warn")
            .kill_on_drop(true);
        for name in ostiary_e2e::clients::SCRUBBED_ENV {
            cmd.env_remove(name);
        }
        let mut child = cmd.spawn().expect("starting ostiary audit tail");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut errors = BufReader::new(stderr).lines();
        // Everything written after this line is printed: the starting point is fixed.
        let said = tokio::time::timeout(CLI_TIMEOUT, async {
            let mut seen = Vec::new();
            while let Ok(Some(line)) = errors.next_line().await {
                if line.contains("following the audit trail") {
                    return Ok(line);
                }
                seen.push(line);
            }
            Err(seen.join("\n"))
        })
        .await
        .expect("tail says it is following in time");
        if let Err(stderr) = said {
            panic!("tail ended before following:\n{stderr}");
        }
        // Drained in the background so that a chatty stderr can never block it.
        tokio::spawn(async move { while let Ok(Some(_)) = errors.next_line().await {} });
        let stdout = child.stdout.take().expect("piped stdout");
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Records printed until one for each path in `wanted` was among them (or the
    /// deadline passed).
    async fn until(&mut self, wanted: &[&str]) -> Vec<(String, Value)> {
        let deadline = tokio::time::Instant::now() + SEEN_WITHIN;
        let mut printed = Vec::new();
        loop {
            let all_seen = wanted.iter().all(|path| {
                printed
                    .iter()
                    .any(|(_, r): &(String, Value)| r["path"] == *path)
            });
            if all_seen {
                return printed;
            }
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!("tail did not print {wanted:?} in {SEEN_WITHIN:?}; printed {printed:#?}")
                })
                .expect("reading tail's stdout")
                .unwrap_or_else(|| panic!("tail ended; printed {printed:#?}"));
            let record: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("tail printed a line that is not JSON ({e}): {line}"));
            printed.push((line, record));
        }
    }

    /// Ctrl-C, as a person stops it: exit 0.
    async fn interrupt(mut self) {
        let pid = self.child.id().expect("tail is running").to_string();
        let sent = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .await
            .expect("running kill");
        assert!(sent.success());
        let status = tokio::time::timeout(CLI_TIMEOUT, self.child.wait())
            .await
            .expect("tail ends on SIGINT")
            .expect("waiting for tail");
        assert!(status.success(), "tail exited with {status} on SIGINT");
    }
}

/// A plain-http upstream for `api.example.test` and an `ostiary serve` under [`POLICY`].
async fn start() -> (Upstream, Server) {
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    (upstream, server)
}

/// The paths of the records printed.
fn paths(printed: &[(String, Value)]) -> Vec<&str> {
    printed
        .iter()
        .filter_map(|(_, r)| r["path"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_tail_sees_a_record_written_after_it_started() {
    let (upstream, server) = start().await;
    let (mine, my_token) = session(&server, "demo").await;
    let (_, other_token) = session(&server, "other").await;
    let (before, elsewhere, after, denied) =
        ("/status/201", "/status/202", "/status/203", "/denied/1");

    // Recorded (and committed) before tail starts: not printed.
    let reply = get(&server, &my_token, &upstream.url(before)).await;
    assert_eq!(reply.status, 201, "{reply}");
    let committed = audit_query(&server, &["--session", &mine], |r| {
        r.iter().any(|r| r["path"] == before)
    })
    .await;
    assert!(
        committed.iter().any(|r| r["path"] == before),
        "{committed:#?}"
    );

    let mut tail = Tail::start(&server, &["--session", &mine]).await;
    let reply = get(&server, &other_token, &upstream.url(elsewhere)).await;
    assert_eq!(reply.status, 202, "{reply}");
    let reply = get(&server, &my_token, &upstream.url(after)).await;
    assert_eq!(reply.status, 203, "{reply}");
    let reply = get(&server, &my_token, &upstream.url(denied)).await;
    assert_eq!(reply.status, 403, "{reply}");

    let printed = tail.until(&[after, denied]).await;
    let seen = paths(&printed);
    assert!(!seen.contains(&before), "from before tail: {seen:?}");
    assert!(!seen.contains(&elsewhere), "another session: {seen:?}");
    assert!(
        printed.iter().all(|(_, r)| r["session"] == mine),
        "only --session's records: {printed:#?}"
    );
    let (line, record) = printed.iter().find(|(_, r)| r["path"] == after).unwrap();
    assert_eq!(record["decision"], "allow");
    assert_eq!(record["status"], 203);
    let refused = printed.iter().find(|(_, r)| r["path"] == denied).unwrap();
    assert_eq!(refused.1["decision"], "deny");

    // The same text `audit query` prints for that record.
    let config = server.config_arg();
    let queried = ostiary(&["--config", &config, "audit", "query", "--session", &mine]).await;
    assert!(queried.success(), "{queried}");
    assert!(
        queried.stdout.lines().any(|l| l == line),
        "tail's line is not among query's:\n{line}\n{queried}"
    );
    tail.interrupt().await;

    // --since prints the backlog first (here: the one denial), --decision keeps to
    // denials, and it goes on following after the backlog.
    let mut denials = Tail::start(
        &server,
        &["--session", &mine, "--decision", "deny", "--since", "1h"],
    )
    .await;
    let backlog = denials.until(&[denied]).await;
    let (later_allowed, later_denied) = ("/status/207", "/denied/2");
    let reply = get(&server, &my_token, &upstream.url(later_allowed)).await;
    assert_eq!(reply.status, 207, "{reply}");
    let reply = get(&server, &my_token, &upstream.url(later_denied)).await;
    assert_eq!(reply.status, 403, "{reply}");
    let printed = denials.until(&[later_denied]).await;
    assert!(
        backlog
            .iter()
            .chain(&printed)
            .all(|(_, r)| r["decision"] == "deny"),
        "only denials: {backlog:#?} {printed:#?}"
    );
    let seen: Vec<&str> = paths(&backlog).into_iter().chain(paths(&printed)).collect();
    for allowed in [before, after, later_allowed] {
        assert!(!seen.contains(&allowed), "{seen:?}");
    }
    denials.interrupt().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_query_prints_ocsf_events_a_siem_reads() {
    let (upstream, server) = start().await;
    let (session_id, token) = session(&server, "demo").await;
    let port = upstream.port();
    let allowed = get(
        &server,
        &token,
        &format!("http://api.example.test:{port}/status/204"),
    )
    .await;
    assert_eq!(allowed.status, 204, "{allowed}");
    let denied = get(
        &server,
        &token,
        &format!("http://api.example.test:{port}/denied/1"),
    )
    .await;
    assert_eq!(denied.status, 403, "{denied}");
    // Records are committed a moment after the answer: both are in before they are read.
    audit_query(&server, &["--session", &session_id], |records| {
        records.iter().filter(|r| r["path"].is_string()).count() >= 2
    })
    .await;

    let config = server.config_arg();
    let out = ostiary(&[
        "--config",
        &config,
        "audit",
        "query",
        "--session",
        &session_id,
        "--format",
        "ocsf",
    ])
    .await;
    assert!(out.success(), "{out}");
    let events: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let of = |path: &str| {
        events
            .iter()
            .find(|e| e["http_request"]["url"]["path"] == path)
            .unwrap_or_else(|| panic!("no event for {path}: {events:#?}"))
    };
    let ok = of("/status/204");
    assert_eq!(ok["class_uid"], 4002, "{ok:#}");
    assert_eq!(ok["activity_id"], 3, "GET: {ok:#}");
    assert_eq!(ok["type_uid"], 400203, "{ok:#}");
    assert_eq!(ok["action_id"], 1, "{ok:#}");
    assert_eq!(ok["http_response"]["code"], 204, "{ok:#}");
    assert_eq!(ok["actor"]["user"]["name"], "demo", "{ok:#}");
    assert_eq!(ok["actor"]["session"]["uid"], session_id.as_str(), "{ok:#}");
    assert_eq!(
        ok["unmapped"]["ostiary"]["policies"][0], "allow-status",
        "{ok:#}"
    );
    let no = of("/denied/1");
    assert_eq!(no["action_id"], 2, "{no:#}");
    assert_eq!(no["status_id"], 2, "{no:#}");
    assert_eq!(no["status_code"], "denied", "{no:#}");
    assert_eq!(
        no["metadata"]["uid"],
        denied.header("ostiary-request-id").unwrap_or_default(),
        "{no:#}"
    );
    // Each event carries the schema version and the product, as OCSF asks.
    assert!(events
        .iter()
        .all(|e| e["metadata"]["product"]["name"] == "Ostiary"
            && e["metadata"]["version"] == "1.3.0"));

    // An unknown format is refused, naming the ones there are.
    let bad = ostiary(&["--config", &config, "audit", "query", "--format", "cef"]).await;
    assert!(!bad.success(), "{bad}");
    assert!(bad.stderr.contains("ocsf"), "{bad}");
}
