//! Evidence an auditor checks without our keys: a real proxy signs its chain's checkpoints,
//! the real binary exports a slice (`audit export`) and prints the public key (`audit
//! pubkey`), and `audit verify --offline` checks the file with nothing else — in a
//! directory with no state, no config and no database. An export edited afterwards, and
//! one taken from a database edited by someone who has the database but not the signing
//! key, both fail; so do the command's bad inputs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ostiary_e2e::clients::CmdOutput;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{absolute_get, auth_line};
use ostiary_e2e::upstream::Upstream;

use crate::support::cli as support;
use support::ostiary;

/// A proxy on `state` signing at least every `interval`.
async fn proxy(state: &Path, plain: &Upstream, interval: &str) -> TestProxy {
    TestProxy::start(ProxySpec {
        ports: vec![plain.port()],
        state_dir: Some(state.to_owned()),
        extra_toml: format!("[audit]\nsigned_checkpoint_interval = \"{interval}\"\n"),
        ..Default::default()
    })
    .await
}

async fn traffic(proxy: &TestProxy, plain: &Upstream, n: usize) {
    let session = proxy.session("auditor-test").await;
    for i in 0..n {
        let reply = absolute_get(
            proxy,
            &plain.url(&format!("/echo?{i}")),
            &auth_line(&session.token),
        )
        .await;
        assert_eq!(reply.status, 200, "{reply}");
    }
}

/// A config naming only the state directory, for the commands that read it.
fn config(state: &Path) -> String {
    let path = state.with_extension("cli.toml");
    std::fs::write(&path, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    path.display().to_string()
}

/// `audit export` into `file`; its output.
async fn export(state: &Path, file: &Path, extra: &[&str]) -> CmdOutput {
    let config = config(state);
    let mut args = vec!["--config", &config, "audit", "export"];
    args.extend_from_slice(extra);
    let out = ostiary(&args).await;
    std::fs::write(file, &out.stdout).unwrap();
    out
}

/// `audit verify --offline`, run where nothing of the proxy is: no config, no state.
async fn verify_offline(file: &Path, key: &Path) -> CmdOutput {
    ostiary(&[
        "audit",
        "verify",
        "--offline",
        &file.display().to_string(),
        "--pubkey",
        &key.display().to_string(),
    ])
    .await
}

fn rows(state: &Path) -> i64 {
    rusqlite::Connection::open(state.join("ostiary.db"))
        .unwrap()
        .query_row(
            "SELECT count(*) FROM audit WHERE decision = 'checkpoint'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_checks_out_with_the_public_key_alone_and_tampering_does_not() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    // A running proxy signs within its interval, while records come.
    let running = proxy(&state, &plain, "300ms").await;
    traffic(&running, &plain, 3).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while rows(&state) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no signed checkpoint while running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    traffic(&running, &plain, 3).await;
    // And at shutdown, over the rest.
    running.stop().await;
    assert!(rows(&state) >= 2, "one while running, one at shutdown");

    // The auditor's side: a directory holding nothing but what they were given.
    let auditor = tempfile::tempdir().unwrap();
    let key = auditor.path().join("ostiary-audit.pub.pem");
    let printed = ostiary(&["--config", &config(&state), "audit", "pubkey"]).await;
    assert!(printed.success(), "{printed}");
    assert!(
        printed.stdout.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{printed}"
    );
    std::fs::write(&key, &printed.stdout).unwrap();
    let file = auditor.path().join("audit.jsonl");
    let out = export(&state, &file, &[]).await;
    assert!(out.success(), "{out}");
    assert!(out.stderr.contains("exported records 1–"), "{out}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.lines().count() > 8,
        "a session, six requests and checkpoints:\n{text}"
    );
    assert!(!text.contains(&std::fs::read_to_string(state.join("audit.key")).unwrap()));

    let ok = verify_offline(&file, &key).await;
    assert!(ok.success(), "{ok}");
    assert!(ok.stdout.starts_with("ok: records 1–"), "{ok}");
    assert!(ok.stdout.contains("signed checkpoints verified"), "{ok}");

    // The file edited: one request's path.
    let edited = auditor.path().join("edited.jsonl");
    let changed = text.replacen("/echo", "/other", 1);
    assert_ne!(changed, text);
    std::fs::write(&edited, changed).unwrap();
    let out = verify_offline(&edited, &key).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(
        out.stdout.contains("are not the ones the checkpoint"),
        "{out}"
    );

    // The database edited by someone without the signing key: the export taken from it
    // fails, though the rows still link (the edit is of a record's text only).
    let edited_rows = rusqlite::Connection::open(state.join("ostiary.db"))
        .unwrap()
        .execute(
            "UPDATE audit SET record = replace(record, '\"decision\":\"allow\"', \
             '\"decision\":\"deny\"') WHERE seq = (SELECT min(seq) FROM audit \
             WHERE record LIKE '%\"kind\":\"http\"%')",
            [],
        )
        .unwrap();
    assert_eq!(edited_rows, 1);
    let from_db = auditor.path().join("from-db.jsonl");
    assert!(export(&state, &from_db, &[]).await.success());
    let out = verify_offline(&from_db, &key).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stdout.contains("records 1–"), "names the range: {out}");

    // Another proxy's key.
    let other = tempfile::tempdir().unwrap();
    let other_state = other.path().join("state");
    proxy(&other_state, &plain, "60s").await.stop().await;
    let other_key = other.path().join("other.pub.pem");
    std::fs::copy(other_state.join("audit-signing.pub.pem"), &other_key).unwrap();
    let out = verify_offline(&file, &other_key).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stdout.contains("not the key given"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_refused_with_a_reason() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    proxy(&state, &plain, "60s").await.stop().await;
    let file: PathBuf = root.path().join("export.jsonl");

    // Nothing signed yet: a chain with no records has no checkpoint.
    let out = export(&state, &file, &[]).await;
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("no signed checkpoint yet"), "{out}");
    let out = export(&state, &file, &["--since", "yesterday-ish"]).await;
    assert!(
        !out.success() && out.stderr.contains("not a time or duration"),
        "{out}"
    );

    // --offline and --pubkey go together.
    let out = ostiary(&["audit", "verify", "--offline", "x.jsonl"]).await;
    assert_eq!(out.status, 2, "{out}");
    assert!(out.stderr.contains("--pubkey"), "{out}");
    // A key that is not one, a file that is not an export, a file that is not there.
    let pem = root.path().join("not-a-key.pem");
    std::fs::write(
        &pem,
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    std::fs::write(&file, "{\"format\":\"something else\"}\n").unwrap();
    let out = verify_offline(&file, &pem).await;
    assert!(
        !out.success() && out.stderr.contains("not an Ed25519 public key"),
        "{out}"
    );
    let key = state.join("audit-signing.pub.pem");
    let out = verify_offline(&file, &key).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stdout.contains("line 1"), "{out}");
    let out = verify_offline(&root.path().join("missing.jsonl"), &key).await;
    assert!(
        !out.success() && out.stderr.contains("missing.jsonl"),
        "{out}"
    );
}
