//! Brokered credentials through the real `ostiary` binary: `ostiary serve` with the file
//! backend and `OSTIARY_LOG=debug`, an agent started by `ostiary run` whose curl calls use
//! the exported placeholder, and a grep of everything the operator's side produced — the
//! server's log, `audit query` — and everything the agent saw, for the canary secrets
//! (the bindings and secrets file are those of `support/credentials.rs`, shared with
//! `credentials_inject.rs` and `credentials_scrub.rs`). The upstream did receive the
//! canary; nothing else may hold it in any form (THREATS "Credentials": a canary grepped
//! across logs, audit, metrics, error bodies → 0 hits).

use ostiary_e2e::proxy::ALLOW_ALL;
use ostiary_e2e::upstream::Upstream;

use crate::support::cli as support;
use support::*;

use crate::support::credentials as credentials_support;
use credentials_support::{
    broker_toml, leaks_in, secrets_toml, seen_at, ALL_SECRETS, BOUND, CANARY, MISSING_HOST, OTHER,
};

/// Where `text` holds any of the secrets (the canary among them) raw, percent-encoded or
/// in base64/base64url at any alignment.
fn hits(what: &str, text: &str) -> Vec<String> {
    leaks_in(what, text.as_bytes(), &ALL_SECRETS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_never_reaches_the_log_audit_or_agent() {
    let names = [BOUND, OTHER, MISSING_HOST];
    let upstream = Upstream::builder().names(&names).start().await;
    let port = upstream.port();
    let secrets_dir = tempfile::tempdir().unwrap();
    let secrets = secrets_dir.path().join("secrets.toml");
    std::fs::write(&secrets, secrets_toml(CANARY)).unwrap();
    // `ostiary serve` at debug level, so the grep below covers the most talkative log.
    let mut server = Server::start_with(
        &upstream,
        &names,
        ALLOW_ALL,
        &broker_toml(&secrets, "5m"),
        "debug",
    )
    .await;

    // The agent: curl calls through the proxy, the placeholder from its environment.
    let script = format!(
        r#"
U=https://api.example.test:{port}
echo "PLACEHOLDER=$GITHUB_TOKEN"
curl -q -sS -i "$U/reflect" -H "Authorization: Bearer $GITHUB_TOKEN"
curl -q -sS -i "$U/reflect?mode=gzip" -H "Authorization: Bearer mine"
curl -q -sS -i "$U/reflect?t=$GITHUB_TOKEN"
curl -q -sS -i "$U/reflect?mode=sse"
curl -q -sS -i "$U/reflect?mode=error"
curl -q -sS -i -L "$U/reflect?mode=redirect"
curl -q -sS -i "$U/reflect?mode=compress"
curl -q -sS -i "https://other.example.test:{port}/reflect?k=$GITHUB_TOKEN"
curl -q -sS -i "https://missing.example.test:{port}/reflect"
curl -q -sS -i "http://api.example.test:{port}/reflect"
exit 0
"#
    );
    let config_arg = server.config_arg();
    let out = ostiary(&[
        "--config",
        &config_arg,
        "run",
        // Not a sandbox: the agent shares the test's uid (and could read the state).
        "--unsafe-shared-uid",
        "--agent",
        "demo",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("PLACEHOLDER=ostiary:github"), "{out}");
    // `session new` exports the same placeholders for a shell to eval.
    let new = ostiary(&["--config", &config_arg, "session", "new", "--agent", "demo"]).await;
    assert!(new.success(), "{new}");
    for line in [
        "export GITHUB_TOKEN='ostiary:github'",
        "export BASIC_TOKEN='ostiary:basic'",
    ] {
        assert!(new.stdout.contains(line), "no `{line}` in:\n{new}");
    }
    // Inner responses are h2 (curl negotiates it with the proxy), the plain one h1.
    for code in [200, 302, 403, 500, 502, 503] {
        assert!(
            out.stdout.contains(&format!("HTTP/2 {code}"))
                || out.stdout.contains(&format!("HTTP/1.1 {code}")),
            "the agent's transcript lacks a {code}:\n{out}"
        );
    }
    for needle in [
        "placeholder_exfiltration",
        "credential_needs_tls",
        "[REDACTED by ostiary]",
    ] {
        assert!(
            out.stdout.contains(needle),
            "the agent's transcript lacks {needle:?}:\n{out}"
        );
    }
    let mut found = hits("agent stdout", &out.stdout);
    found.extend(hits("agent stderr", &out.stderr));

    // The upstream did get the secret (so the grep below means something).
    let at_bound = seen_at(&upstream, BOUND);
    assert!(at_bound.len() >= 6, "{at_bound:#?}");
    assert!(
        at_bound
            .iter()
            .all(|s| s.header("authorization") == Some(&format!("Bearer {CANARY}"))),
        "{at_bound:#?}"
    );
    // The placeholder outside its injection point (`?t=`) was refused, never forwarded.
    assert!(
        at_bound.iter().all(|s| !s.path.contains("ostiary")),
        "{at_bound:#?}"
    );

    // The audit, as the operator reads it.
    let audit = ostiary(&["--config", &config_arg, "audit", "query"]).await;
    assert!(audit.success(), "{audit}");
    assert!(audit.stdout.contains("\"github\""), "{audit}");
    found.extend(hits("audit query", &audit.stdout));

    terminate(&mut server.child, &server.log).await;
    let text = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        text.contains("DEBUG"),
        "the log is at debug level (so the grep covers it):\n{text}"
    );
    assert!(text.contains("credential unavailable"), "{text}");
    found.extend(hits("server log", &text));
    assert!(found.is_empty(), "the canary leaked: {found:#?}");
}
