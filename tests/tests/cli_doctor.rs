//! `ostiary doctor` (docs/cli.md) against a healthy and a broken deployment: the real binary,
//! a running `ostiary serve`, an SMTP relay stand-in, and dead loopback ports.
//!
//! What it proves:
//! - a healthy deployment (serve running, the CA and its key, valid policies, an answering
//!   relay) is all `ok` and exits 0, sending no mail;
//! - in a shell that uses the proxy (`HTTPS_PROXY` names it), a CA bundle variable naming
//!   the proxy's CA is `ok` and one naming another CA fails with a fix, exit 1; in a shell
//!   that does not use it, another CA is not the proxy's business;
//! - a broken deployment — a policy file with a syntax error, Vault and the SMTP relay on
//!   ports nothing answers, no proxy running — fails each of those with what to do, exit 1;
//! - a config that does not load is the first finding, not a crash (exit 1, not 2);
//! - no line carries the admin token.

use ostiary_e2e::clients::{self, CmdOutput};
use ostiary_e2e::raw::refusing_port;
use ostiary_e2e::smtp::SmtpSink;
use ostiary_e2e::upstream::Upstream;

use crate::support::cli as support;
use support::*;

/// `ostiary --config <config> doctor` with `env` added (the CA bundle variables and the
/// admin token are scrubbed first, as for every command the tests run).
async fn doctor(config: &str, env: &[(&str, &str)]) -> CmdOutput {
    let mut all = vec![("OSTIARY_LOG", "warn")];
    all.extend_from_slice(env);
    clients::run(
        ostiary_bin(),
        &["--config", config, "doctor"],
        &all,
        CLI_TIMEOUT,
    )
    .await
}

/// The line of check `what` with verdict `tag` (`ok`, `warn`, `FAIL`).
fn line<'a>(out: &'a CmdOutput, tag: &str, what: &str) -> Option<&'a str> {
    out.stdout.lines().find(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some(tag) && words.next() == Some(what)
    })
}

/// The `fix:` line of check `what`'s first FAIL line that contains `containing` (a finding
/// may run over several indented lines before it).
fn fix_after<'a>(out: &'a CmdOutput, what: &str, containing: &str) -> Option<&'a str> {
    let mut lines = out.stdout.lines();
    lines.find(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some("FAIL") && words.next() == Some(what) && l.contains(containing)
    })?;
    lines
        .take_while(|l| l.starts_with(' '))
        .map(str::trim)
        .find(|l| l.starts_with("fix: "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_deployment_is_all_ok() {
    let upstream = Upstream::builder()
        .names(&["api.example.test"])
        .start()
        .await;
    let smtp = SmtpSink::start().await;
    let approvals = format!(
        "[approvals]\napprovers = [\"alice@example.com\"]\nsmtp = {{ url = \"{}\", from = \"ostiary@example.com\" }}\n",
        smtp.url()
    );
    let server =
        Server::start_with(&upstream, &["api.example.test"], POLICY, &approvals, "info").await;
    let config = server.config_arg();

    let out = doctor(&config, &[]).await;
    assert!(out.success(), "{out}");
    for what in [
        "config", "token", "CA", "trust", "policies", "store", "proxy", "smtp",
    ] {
        assert!(line(&out, "ok", what).is_some(), "no `ok {what}`:\n{out}");
    }
    assert!(!out.stdout.contains("FAIL"), "{out}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("the admin token is accepted")),
        "{out}"
    );
    assert!(
        out.stdout.trim_end().ends_with("everything checked is ok")
            || out.stdout.contains("no problems;"),
        "{out}"
    );
    assert!(
        smtp.messages_to("alice@example.com").is_empty(),
        "doctor sends no mail"
    );
    let token = std::fs::read_to_string(server.state.join("admin.token")).unwrap();
    assert!(
        !out.stdout.contains(token.trim()) && !out.stderr.contains(token.trim()),
        "the admin token is never printed"
    );

    // A shell that is a client of the proxy (HTTPS_PROXY names it, with a token that is
    // never printed): its CA bundle variable names the proxy's CA, or another CA.
    let via = format!("http://agent:not-a-real-token@{}", server.proxy_addr);
    let ca = server.state.join("ca.pem").display().to_string();
    let out = doctor(&config, &[("HTTPS_PROXY", &via), ("SSL_CERT_FILE", &ca)]).await;
    assert!(out.success(), "{out}");
    let trust = line(&out, "ok", "trust").unwrap_or_else(|| panic!("{out}"));
    assert!(
        trust.contains("SSL_CERT_FILE") && trust.contains("holds this proxy's CA"),
        "{out}"
    );
    assert!(!out.stdout.contains("not-a-real-token"), "{out}");
    let other = upstream.write_ca(server.dir.path()).display().to_string();
    // Not a client of the proxy: its bundle is its own business.
    let out = doctor(&config, &[("NODE_EXTRA_CA_CERTS", &other)]).await;
    assert!(out.success(), "{out}");
    assert!(
        line(&out, "ok", "trust").is_some_and(|l| l.contains("does not use the proxy")),
        "{out}"
    );
    let out = doctor(
        &config,
        &[("HTTPS_PROXY", &via), ("NODE_EXTRA_CA_CERTS", &other)],
    )
    .await;
    assert_eq!(out.status, 1, "{out}");
    assert!(!out.stdout.contains("not-a-real-token"), "{out}");
    assert!(
        line(&out, "FAIL", "trust").is_some_and(|l| l.contains("NODE_EXTRA_CA_CERTS")),
        "{out}"
    );
    let fix = fix_after(&out, "trust", "NODE_EXTRA_CA_CERTS").unwrap_or_else(|| panic!("{out}"));
    assert!(fix.contains(&ca), "the fix names the CA to use: {fix}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_deployment_fails_each_problem_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("good.cedar"), POLICY).unwrap();
    std::fs::write(
        policies.join("broken.cedar"),
        "permit (principal, action, resource) when { context.path == ",
    )
    .unwrap();
    // Bound, never listened on: nothing answers, and no other test can take them.
    let (_vault_socket, vault) = refusing_port();
    let (_smtp_socket, relay) = refusing_port();
    let (_control_socket, control) = refusing_port();
    let (_proxy_socket, proxy) = refusing_port();
    let config = dir.path().join("ostiary.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[listen]
proxy = "{proxy}"
control = "{control}"

[state]
dir = "{state}"

[policy]
dir = "{policies}"

[broker]
backend = "vault"
[broker.vault]
addr = "http://{vault}"

[approvals]
approvers = ["alice@example.com"]
smtp = {{ url = "smtp://{relay}", from = "ostiary@example.com" }}
"#,
            state = dir.path().join("state").display(),
            policies = policies.display(),
        ),
    )
    .unwrap();
    let config = config.display().to_string();

    let out = doctor(&config, &[]).await;
    assert_eq!(out.status, 1, "problems exit 1:\n{out}");
    assert!(line(&out, "ok", "config").is_some(), "{out}");
    let policy = line(&out, "FAIL", "policies").unwrap_or_else(|| panic!("{out}"));
    assert!(policy.contains("broken.cedar"), "names the file: {policy}");
    assert!(
        fix_after(&out, "policies", "broken.cedar").is_some_and(|f| f.contains("policy validate")),
        "{out}"
    );
    let vault_line = line(&out, "FAIL", "vault").unwrap_or_else(|| panic!("{out}"));
    assert!(vault_line.contains(&vault.to_string()), "{vault_line}");
    assert!(
        fix_after(&out, "vault", "").is_some_and(|f| f.contains("[broker.vault] addr")),
        "{out}"
    );
    let smtp_line = line(&out, "FAIL", "smtp").unwrap_or_else(|| panic!("{out}"));
    assert!(smtp_line.contains(&relay.port().to_string()), "{smtp_line}");
    assert!(
        fix_after(&out, "smtp", "").is_some_and(|f| f.contains("approvals.smtp.url")),
        "{out}"
    );
    let proxy_line = line(&out, "FAIL", "proxy").unwrap_or_else(|| panic!("{out}"));
    assert!(proxy_line.contains(&control.to_string()), "{proxy_line}");
    assert!(
        fix_after(&out, "proxy", "").is_some_and(|f| f.contains("ostiary serve")),
        "{out}"
    );
    assert!(
        line(&out, "FAIL", "state").is_some(),
        "no state directory:\n{out}"
    );
    assert!(
        out.stdout
            .lines()
            .last()
            .is_some_and(|l| l.contains("problems found")),
        "{out}"
    );

    // A config that does not load: said, with the file, and nothing else checked.
    std::fs::write(dir.path().join("bad.toml"), "[listen]\nproxxy = 1\n").unwrap();
    let out = doctor(&dir.path().join("bad.toml").display().to_string(), &[]).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(line(&out, "FAIL", "config").is_some(), "{out}");
    assert!(
        fix_after(&out, "config", "").is_some_and(|f| f.contains("bad.toml")),
        "{out}"
    );
    assert!(
        line(&out, "ok", "policies").is_none() && line(&out, "FAIL", "policies").is_none(),
        "{out}"
    );
}
