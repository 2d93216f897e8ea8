//! One Ostiary on PostgreSQL (`state.store = "postgres://…"`), end to end: requests decided
//! and audited with the state in the database (no SQLite file in the state directory), a
//! session that survives a restart because it was read back from PostgreSQL, and
//! `ostiary audit verify` (the real binary, reading the same database through the config)
//! accepting the chain and refusing it once a row is edited.
//!
//! Each test runs in a schema of its own in the machine's PostgreSQL
//! (`OSTIARY_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/test`), dropped
//! afterwards; a server that cannot be reached fails the test.

use ostiary_e2e::clients::curl;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;

use crate::support::cli;

use crate::support::postgres;
use postgres::{psql, Schema};

const POLICY: &str = r#"
@id("allow-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_on_postgres_decides_audits_restarts_and_verifies() {
    let schema = Schema::create();
    let upstream = Upstream::builder().start().await;
    let keep = tempfile::tempdir().unwrap();
    let state = keep.path().join("state");
    let mut proxy = TestProxy::start(ProxySpec {
        policies: POLICY.into(),
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        state_dir: Some(state.clone()),
        store: Some(schema.url()),
        ..Default::default()
    })
    .await;
    let session = proxy.session("demo").await;
    let env = proxy.client_env(&session);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let allowed = curl(
        &["-sS", "-w", "\n%{http_code}", &upstream.url("/echo")],
        &env,
    )
    .await;
    assert!(allowed.stdout.ends_with("\n200"), "{allowed}");
    let denied = curl(
        &["-sS", "-w", "\n%{http_code}", &upstream.url("/status/200")],
        &env,
    )
    .await;
    assert!(denied.stdout.ends_with("\n403"), "{denied}");

    // The records are in PostgreSQL, and nothing went to a SQLite file.
    let records = proxy.audit().await;
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(http.len(), 2, "{records:#?}");
    assert_eq!(
        (http[0].decision.as_str(), http[1].decision.as_str()),
        ("allow", "deny")
    );
    let rows: usize = psql(&format!("SELECT COUNT(*) FROM {}.audit", schema.0))
        .parse()
        .unwrap();
    assert_eq!(rows, records.len());
    assert!(!state.join("ostiary.db").exists());

    // The session was read back from PostgreSQL by the new process: its token still works.
    proxy.restart().await;
    // The same token, to the new process's port (and its CA, which is the state dir's).
    let mut session = session;
    session.proxy_url = proxy.proxy_url(&session);
    let env = proxy.client_env(&session);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let again = curl(
        &["-sS", "-w", "\n%{http_code}", &upstream.url("/echo")],
        &env,
    )
    .await;
    assert!(again.stdout.ends_with("\n200"), "{again}");
    proxy.audit().await;

    // `audit verify` through the same config: intact, then an edited row refused.
    let config = proxy.config_path.display().to_string();
    let verified = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(verified.success(), "{verified}");
    assert!(verified.stdout.starts_with("ok: "), "{verified}");
    psql(&format!(
        "UPDATE {}.audit SET record = replace(record, '\"allow\"', '\"deny\"') WHERE seq = 2",
        schema.0
    ));
    let tampered = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(!tampered.success(), "{tampered}");
    assert!(tampered.stdout.contains("FAILED"), "{tampered}");
    assert!(tampered.stdout.contains("record 2"), "{tampered}");
}

/// A database that cannot be reached stops the start, naming it without its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_refused_at_start_without_its_password() {
    let (_closed, closed) = ostiary_e2e::raw::refusing_port();
    let port = closed.port();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("ostiary.toml");
    std::fs::write(
        &config_path,
        format!(
            "[state]\ndir = \"{}\"\nstore = \"postgres://ostiary:hunter2@127.0.0.1:{port}/test\"\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let config = ostiary::config::Config::load(&config_path).unwrap();
    assert!(!format!("{config:?}").contains("hunter2"));
    let message = match ostiary::server::Ostiary::build(config, Default::default()).await {
        Ok(_) => panic!("started without its database"),
        Err(e) => e.to_string(),
    };
    assert!(message.contains("unavailable"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

/// Two proxies on one PostgreSQL schema and one state directory (the keys are the state
/// directory's, shared), each serving its own sessions at once: one chain, extended by both
/// writers in turn — every record written, none refused for want of an audit record — that
/// `ostiary audit verify` accepts whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_extend_one_chain_that_verifies() {
    let schema = Schema::create();
    let upstream = Upstream::builder().start().await;
    let keep = tempfile::tempdir().unwrap();
    let state = keep.path().join("state");
    let replica = |n: u32| ProxySpec {
        policies: POLICY.into(),
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        state_dir: Some(state.clone()),
        store: Some(schema.url()),
        proxy_unix: Some(keep.path().join(format!("proxy-{n}.sock"))),
        ..Default::default()
    };
    let one = TestProxy::start(replica(1)).await;
    let two = TestProxy::start(replica(2)).await;
    let url = upstream.url("/echo");
    let mut clients = Vec::new();
    for proxy in [&one, &two] {
        let session = proxy.session("demo").await;
        let env = proxy.client_env(&session);
        clients.push(env);
    }
    const EACH: usize = 15;
    let runs = clients.iter().map(|env| {
        let url = url.clone();
        async move {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut codes = Vec::new();
            for _ in 0..EACH {
                let out = curl(
                    &["-sS", "-o", "/dev/null", "-w", "%{http_code}", &url],
                    &env,
                )
                .await;
                codes.push(out.stdout.trim().to_owned());
            }
            codes
        }
    });
    let codes: Vec<Vec<String>> = futures_util::future::join_all(runs).await;
    for c in &codes {
        let outages: Vec<_> = one
            .audit()
            .await
            .into_iter()
            .filter(|r| r.kind == "audit")
            .map(|r| r.reason)
            .collect();
        assert!(c.iter().all(|code| code == "200"), "{codes:?} {outages:?}");
    }
    assert_eq!(upstream.count("/echo"), 2 * EACH);

    // Both writers' records, in one chain.
    let records = one.audit().await;
    two.audit().await;
    let all = two.audit().await;
    let http = all.iter().filter(|r| r.kind == "http").count();
    assert_eq!(http, 2 * EACH, "{} records", records.len());
    let config = one.config_path.display().to_string();
    let verified = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(verified.success(), "{verified}");
}
