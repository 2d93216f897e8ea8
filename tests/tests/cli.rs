//! The `ostiary` command line (docs/design.md §7) driven as a user drives it: the real binary,
//! `ostiary serve` as a child process on free ports with a config file, and the other
//! subcommands run against it.
//!
//! What it proves:
//! - `session new` prints `export` lines that, eval'd by a shell, make plain `curl` go
//!   through the proxy with the token and trust its CA; allowed and denied requests both
//!   show up in `audit query` with their decisions; `--json` prints the session itself;
//! - `run` gives the child a working session, passes its exit code through, and revokes
//!   the session afterwards (the child's token then gets 407);
//! - `ca export` prints exactly the CA in the state directory;
//! - `audit verify` accepts an intact chain and rejects an edited record, a deleted middle
//!   record and a deleted newest record;
//! - `serve` with no config at all creates the state directory with private secrets and
//!   listens on the default ports;
//! - `policy validate` accepts the shipped library and names the broken file otherwise.
//! - `policy test` passes the shipped library's cases (exit 0), reports a failing case with
//!   expected vs got (exit 1), and exits 2 when there are no tests to run.
//!
//! The binary (package `ostiary-cli`) is brought up to date once per test process
//! (`support::ostiary_bin`), so the tests always run the current code.
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ostiary_e2e::clients::{self, CmdOutput};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

use crate::support::cli as support;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_new_exports_drive_curl_and_both_outcomes_are_audited() {
    let upstream = Upstream::builder()
        .names(&["api.example.test", "other.example.test"])
        .start()
        .await;
    let server = Server::start(
        &upstream,
        &["api.example.test", "other.example.test"],
        POLICY,
    )
    .await;
    let config = server.config_arg();

    let out = ostiary(&["--config", &config, "session", "new", "--agent", "demo"]).await;
    assert!(out.success(), "{out}");
    let mut lines = out.stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("# Ostiary session ") && header.ends_with(" for agent demo"),
        "{out}"
    );
    for line in lines {
        assert!(
            line.starts_with("export "),
            "only export lines follow: {line:?}\n{out}"
        );
    }
    let exports = server.dir.path().join("exports.sh");
    std::fs::write(&exports, &out.stdout).unwrap();
    let exports_arg = exports.display().to_string();

    // What a shell gets after eval'ing them.
    let env = clients::run(
        "bash",
        &["-c", "source \"$1\" && env", "_", &exports_arg],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(env.success(), "{env}");
    let env = parse_env(&env.stdout);
    let session_id = env.get("OSTIARY_SESSION_ID").cloned().unwrap_or_default();
    assert!(!session_id.is_empty(), "{env:?}");
    assert!(header.contains(&session_id), "{header}");
    let proxy_url = env.get("HTTPS_PROXY").cloned().unwrap_or_default();
    let token = proxy_url
        .strip_prefix("http://agent:")
        .and_then(|rest| rest.strip_suffix(&format!("@{}", server.proxy_addr)))
        .unwrap_or_else(|| {
            panic!(
                "HTTPS_PROXY {proxy_url:?} is not http://agent:<token>@{}",
                server.proxy_addr
            )
        });
    assert!(token.len() > 20, "the token is in the proxy URL");
    for name in ["HTTP_PROXY", "http_proxy", "https_proxy"] {
        assert_eq!(env.get(name), Some(&proxy_url), "{name}");
    }
    let ca_pem = std::fs::read_to_string(server.state.join("ca.pem")).unwrap();
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
    ] {
        let path = env
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not exported"));
        assert!(Path::new(path).is_absolute(), "{name}={path}");
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            ca_pem,
            "{name} names the proxy CA"
        );
    }

    // curl with nothing but the exports: allowed, then a host outside the policy.
    let script = "source \"$1\" && curl -q -sS -w '\\n%{http_code}' \"$2\"";
    let allowed_url = upstream.url("/echo?from=shell");
    let ok = clients::run(
        "bash",
        &["-c", script, "_", &exports_arg, &allowed_url],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(ok.success(), "{ok}");
    let (echo, code) = body_and_code(&ok);
    assert_eq!(code, "200", "{ok}");
    assert_eq!(echo["query"], "from=shell");
    assert_eq!(echo["sni"], "api.example.test");
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{echo}"
    );

    // A host that no permit names is refused at CONNECT (curl shows only "CONNECT tunnel
    // failed, response 403"); absolute-form http:// shows the JSON body of the refusal.
    let refused_connect = clients::run(
        "bash",
        &[
            "-c",
            script,
            "_",
            &exports_arg,
            &format!("https://other.example.test:{}/echo", upstream.port()),
        ],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(
        refused_connect.stderr.contains("response 403"),
        "{refused_connect}"
    );
    let denied_url = format!("http://other.example.test:{}/echo", upstream.port());
    let denied = clients::run(
        "bash",
        &["-c", script, "_", &exports_arg, &denied_url],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(denied.success(), "{denied}");
    let (body, code) = body_and_code(&denied);
    assert_eq!(code, "403", "{denied}");
    assert_eq!(body["error"], "denied", "{denied}");
    assert_eq!(
        body["resource"], "Ostiary::Host::\"other.example.test\"",
        "{denied}"
    );
    assert_eq!(
        body["policies"],
        serde_json::json!([]),
        "a default deny names no policy"
    );
    let denied_id = body["request_id"].as_str().unwrap_or_default().to_owned();
    assert!(!denied_id.is_empty(), "{denied}");
    assert_eq!(
        upstream.count("/echo"),
        1,
        "only the allowed request was forwarded"
    );
    assert!(upstream
        .seen()
        .iter()
        .all(|s| s.sni.as_deref() == Some("api.example.test")));

    // Both decisions, in order, from the audit chain.
    let records = audit_query(&server, &["--session", &session_id], |r| {
        of_kind(r, "http").len() >= 2
    })
    .await;
    let http = of_kind(&records, "http");
    assert_eq!(http.len(), 2, "{records:#?}");
    let connects = of_kind(&records, "connect");
    assert!(
        connects
            .iter()
            .any(|r| r["decision"] == "deny" && r["host"] == "other.example.test"),
        "the refused CONNECT is audited: {records:#?}"
    );
    assert_eq!(http[0]["decision"], "allow");
    assert_eq!(http[0]["host"], "api.example.test");
    assert_eq!(http[0]["path"], "/echo");
    assert_eq!(http[0]["status"], 200);
    assert_eq!(http[0]["agent"], "demo");
    assert_eq!(http[0]["policies"], serde_json::json!(["allow-demo-echo"]));
    assert_eq!(http[1]["decision"], "deny");
    assert_eq!(http[1]["host"], "other.example.test");
    assert_eq!(http[1]["error"], "denied");
    assert_eq!(http[1]["status"], 403);
    assert_eq!(http[1]["request_id"], denied_id.as_str());
    assert!(
        records.iter().all(|r| r["session"] == session_id.as_str()),
        "{records:#?}"
    );

    let denies = audit_query(&server, &["--decision", "deny"], |r| {
        r.iter().any(|r| r["request_id"] == denied_id.as_str())
    })
    .await;
    assert!(
        denies.iter().all(|r| r["decision"] == "deny"),
        "{denies:#?}"
    );
    assert!(
        denies.iter().any(|r| r["request_id"] == denied_id.as_str()),
        "{denies:#?}"
    );

    // --json: the session itself.
    let out = ostiary(&[
        "--config", &config, "session", "new", "--agent", "demo", "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let session: Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(session["agent"], "demo");
    assert_eq!(session["tenant"], "default");
    let token = session["token"].as_str().unwrap_or_default();
    assert!(!token.is_empty());
    assert_ne!(session["session_id"], session_id.as_str(), "a new session");
    assert_eq!(
        session["proxy_url"],
        format!("http://agent:{token}@{}", server.proxy_addr)
    );
    assert_eq!(session["ca_pem"], ca_pem.as_str());
    assert!(session["expires_at"].as_i64().is_some_and(|t| t > 0));

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_passes_exit_code_and_revokes_the_session() {
    let upstream = Upstream::builder().start().await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    let config = server.config_arg();
    let url = upstream.url("/echo?from=run");
    let script = format!(
        "curl -q -sS -w '\\n%{{http_code}}\\n' '{url}'; echo \"PROXY=$HTTPS_PROXY\"; echo \"SID=$OSTIARY_SESSION_ID\"; exit 7"
    );
    let out = ostiary(&[
        "--config",
        &config,
        "run",
        "--unsafe-shared-uid",
        "--agent",
        "demo",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .await;
    assert_eq!(
        out.status, 7,
        "the child's exit code is passed through:\n{out}"
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let echo: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(lines[1], "200", "{out}");
    assert_eq!(echo["query"], "from=run");
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{echo}"
    );
    let proxy_url = lines[2].strip_prefix("PROXY=").unwrap_or_default();
    let session_id = lines[3].strip_prefix("SID=").unwrap_or_default();
    assert!(
        proxy_url.starts_with("http://agent:")
            && proxy_url.ends_with(&format!("@{}", server.proxy_addr)),
        "{out}"
    );
    assert!(!session_id.is_empty(), "{out}");
    assert_eq!(upstream.count("/echo"), 1);

    // The session ended with the child: its token is refused, on CONNECT and on plain http.
    let https = curl_raw(&[
        "-x",
        proxy_url,
        "-w",
        "%{http_connect}",
        &upstream.url("/echo"),
    ])
    .await;
    assert!(!https.success(), "{https}");
    assert_eq!(https.stdout.trim(), "407", "{https}");
    let plain_url = format!("http://api.example.test:{}/echo", upstream.port());
    let plain = curl_raw(&["-i", "-x", proxy_url, &plain_url]).await;
    assert!(plain.success(), "{plain}");
    let (head, body) = plain
        .stdout
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{plain}"));
    assert!(head.starts_with("HTTP/1.1 407"), "{plain}");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}:\n{plain}"));
    assert_eq!(body["error"], "unauthenticated");
    assert!(
        body["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not active"),
        "{body}"
    );
    assert_eq!(upstream.count("/echo"), 1, "nothing more was forwarded");

    let records = audit_query(&server, &["--session", session_id], |r| {
        r.iter().any(|r| r["reason"] == "session revoked")
    })
    .await;
    let lifecycle: Vec<&str> = of_kind(&records, "session")
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert_eq!(
        lifecycle,
        ["session created", "session revoked"],
        "{records:#?}"
    );
    let http = of_kind(&records, "http");
    assert_eq!(http.len(), 1, "{records:#?}");
    assert_eq!(http[0]["decision"], "allow");
    server.stop().await;
}

/// curl with no environment from the test beyond the scrubbed defaults.
async fn curl_raw(args: &[&str]) -> CmdOutput {
    clients::curl(args, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_export_prints_the_state_ca() {
    let upstream = Upstream::builder().start().await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    let out = ostiary(&["--config", &server.config_arg(), "ca", "export"]).await;
    assert!(out.success(), "{out}");
    let on_disk = std::fs::read_to_string(server.state.join("ca.pem")).unwrap();
    assert!(
        on_disk.starts_with("-----BEGIN CERTIFICATE-----"),
        "{on_disk}"
    );
    assert_eq!(out.stdout, on_disk);
    server.stop().await;
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

/// `ostiary audit verify` against the state directory `state`.
async fn verify(state: &Path) -> CmdOutput {
    let config = state.with_extension("toml");
    std::fs::write(&config, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    ostiary(&["--config", &config.display().to_string(), "audit", "verify"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_verify_detects_edits_and_deletions() {
    let upstream = Upstream::builder().start().await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    let config = server.config_arg();
    // Some history: three sessions, and traffic in one of them.
    let mut exports = String::new();
    for _ in 0..3 {
        let out = ostiary(&["--config", &config, "session", "new", "--agent", "demo"]).await;
        assert!(out.success(), "{out}");
        exports = out.stdout;
    }
    let exports_path = server.dir.path().join("exports.sh");
    std::fs::write(&exports_path, exports).unwrap();
    let script =
        "source \"$1\" && curl -q -sS -w '%{http_code} ' -o /dev/null \"$2\" -o /dev/null \"$3\"";
    let out = clients::run(
        "bash",
        &[
            "-c",
            script,
            "_",
            &exports_path.display().to_string(),
            &upstream.url("/echo"),
            &upstream.url("/other"),
        ],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert_eq!(out.stdout.trim(), "200 403", "{out}");
    let dir = server.stop().await;
    let state = dir.path().join("state");

    let rows: i64 = rusqlite::Connection::open(state.join("ostiary.db"))
        .and_then(|conn| conn.query_row("SELECT count(*) FROM audit", [], |r| r.get(0)))
        .unwrap();
    assert!(
        rows >= 6,
        "3 sessions, 1 connect, 2 requests: {rows} records"
    );

    let intact = dir.path().join("intact");
    copy_state(&state, &intact);
    let out = verify(&intact).await;
    assert!(out.success(), "an untouched chain verifies:\n{out}");
    assert_eq!(
        out.stdout.trim(),
        format!("ok: {rows} records, chain intact"),
        "{out}"
    );

    let middle = rows / 2;
    // (a) one record's JSON edited in place.
    let edited = dir.path().join("edited");
    copy_state(&state, &edited);
    {
        let conn = rusqlite::Connection::open(edited.join("ostiary.db")).unwrap();
        let json: String = conn
            .query_row("SELECT record FROM audit WHERE seq = ?1", [middle], |r| {
                r.get(0)
            })
            .unwrap();
        let mut record: Value = serde_json::from_str(&json).unwrap();
        record["request_id"] = Value::String("forged".into());
        let changed = conn
            .execute(
                "UPDATE audit SET record = ?1 WHERE seq = ?2",
                rusqlite::params![record.to_string(), middle],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
    let out = verify(&edited).await;
    assert_eq!(out.status, 1, "an edited record is detected:\n{out}");
    assert!(out.stdout.starts_with("FAILED"), "{out}");
    assert!(
        out.stdout
            .contains(&format!("record {middle}: content does not match its seal")),
        "{out}"
    );

    // (b) a middle record deleted.
    let gap = dir.path().join("gap");
    copy_state(&state, &gap);
    {
        let conn = rusqlite::Connection::open(gap.join("ostiary.db")).unwrap();
        assert_eq!(
            conn.execute("DELETE FROM audit WHERE seq = ?1", [middle])
                .unwrap(),
            1
        );
    }
    let out = verify(&gap).await;
    assert_eq!(out.status, 1, "a deleted middle record is detected:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "record {}: expected sequence {middle}",
            middle + 1
        )),
        "{out}"
    );

    // (c) the newest record deleted: only the head checkpoint can tell.
    let truncated = dir.path().join("truncated");
    copy_state(&state, &truncated);
    {
        let conn = rusqlite::Connection::open(truncated.join("ostiary.db")).unwrap();
        assert_eq!(
            conn.execute("DELETE FROM audit WHERE seq = ?1", [rows])
                .unwrap(),
            1
        );
    }
    let out = verify(&truncated).await;
    assert_eq!(out.status, 1, "a deleted newest record is detected:\n{out}");
    assert!(out.stdout.contains("newest records deleted"), "{out}");

    // The original is still intact: the copies were independent.
    assert!(verify(&state).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_config_creates_state_on_default_ports() {
    let proxy: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let control: SocketAddr = ([127, 0, 0, 1], 8081).into();
    for addr in [proxy, control] {
        if let Err(e) = TcpListener::bind(addr) {
            panic!(
                "this test runs `ostiary serve` with no config, which binds the default \
                 {proxy} and {control}; {addr} is not free ({e}). Stop whatever listens there."
            );
        }
    }
    let cwd = tempfile::tempdir().unwrap();
    let log = cwd.path().join("serve.log");
    let mut child = spawn_serve(None, Some(cwd.path()), &log, "info");
    if let Err(text) = wait_healthy(&mut child, control, &log).await {
        panic!("{text}");
    }
    let state = cwd.path().join(".ostiary");
    for name in [
        "ca.pem",
        "ca.key.pem",
        "admin.token",
        "session-signing.key.pem",
        "ostiary.db",
    ] {
        assert!(
            state.join(name).is_file(),
            "{name} was not created in .ostiary/"
        );
    }
    for secret in ["ca.key.pem", "admin.token", "session-signing.key.pem"] {
        let mode = std::fs::metadata(state.join(secret))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{secret} must be private, is {mode:o}");
    }
    assert!(std::fs::read_to_string(state.join("ca.pem"))
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(!std::fs::read_to_string(state.join("admin.token"))
        .unwrap()
        .trim()
        .is_empty());
    // The proxy listener is up too: a request without credentials is asked for them.
    let out = clients::curl(
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-x",
            "http://127.0.0.1:8080",
            "http://example.invalid/",
        ],
        &[],
    )
    .await;
    assert_eq!(out.stdout, "407", "{out}");
    terminate(&mut child, &log).await;
}
