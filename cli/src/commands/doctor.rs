//! `ostiary doctor`: check a deployment from the operator's shell and say what to fix.
//!
//! Each check prints one line — `ok`, `warn` or `FAIL` (green, yellow, red at a terminal),
//! what was checked, what was found — and, when something is wrong, a `fix:` line saying
//! what to do. With `--json` it prints one document once every check has run: `ok`, the
//! counts, and each check's `name`, `status` (`ok`, `warn`, `fail`), `detail` and `fix`. The exit status is 1 when
//! any check failed (0 with warnings only), so a deploy script can run it; 2 is left for
//! doctor itself failing, as with every command.
//!
//! What is checked, in the order a deployment depends on it: the config loads; the state
//! directory holds a CA whose key matches it and that is still valid, and an admin token
//! only its owner reads; when this shell is a client of the proxy (its `HTTPS_PROXY` names
//! the listener), every CA bundle variable names a file holding that CA (what `session new`
//! and `run` give the clients they configure); the policy set validates
//! (and its tests pass); the store answers; the proxy answers `/healthz` and `/readyz` and
//! takes the admin token; Vault answers unsealed (and takes the login, when this shell holds
//! it); the approvers' channels answer (the SMTP relay greets; the proxy reports no failing
//! notifications). Nothing is changed and nothing is sent to an approver.
//!
//! Doctor runs in the operator's environment, which may not be `serve`'s: a variable that
//! names a secret (`VAULT_TOKEN`, the Slack webhook) being unset here is said, not failed.

use std::fmt::Display;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use ostiary::config::Config;
use ostiary::state::files;
use ostiary_broker::error_chain as chain;
use ostiary_sdk::SdkError;
use serde_json::Value;

use super::CliError;
use crate::output::{paint, print_json, Output, BAD, GOOD, NOTICE};

mod local;
use local::{state_dir, trust};

/// How long one network check may take (Vault, the SMTP relay, the control API).
const NET_TIMEOUT: Duration = Duration::from_secs(5);

/// A CA that expires sooner than this is a warning: every client must be given the new one.
const CA_EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// What was found: printed as each check ends (the network checks can take seconds), or
/// kept for one JSON document at the end.
#[derive(Debug, Default)]
struct Report {
    failures: usize,
    warnings: usize,
    /// Kept only with `--json`.
    checks: Option<Vec<Value>>,
}

impl Report {
    fn new(out: Output) -> Self {
        Report {
            checks: out.json.then(Vec::new),
            ..Default::default()
        }
    }

    fn say(&mut self, verdict: Verdict, what: &str, found: impl Display, fix: Option<String>) {
        let (tag, style) = match verdict {
            Verdict::Ok => ("ok", GOOD),
            Verdict::Warn => {
                self.warnings += 1;
                ("warn", NOTICE)
            }
            Verdict::Fail => {
                self.failures += 1;
                ("FAIL", BAD)
            }
        };
        let found = found.to_string();
        if let Some(checks) = &mut self.checks {
            checks.push(serde_json::json!({
                "name": what,
                "status": tag.to_lowercase(),
                "detail": found.trim_end(),
                "fix": fix,
            }));
            return;
        }
        // A finding of several lines (a TOML or Cedar error with its excerpt) stays indented
        // under its check, so that the first word of every line is a verdict or nothing.
        let found = found.trim_end().replace('\n', &format!("\n{:16}", ""));
        anstream::println!("{} {what:<9} {found}", paint(style, &format!("{tag:<5}")));
        if let Some(fix) = fix {
            println!("{:16}fix: {fix}", "");
        }
    }

    fn ok(&mut self, what: &str, found: impl Display) {
        self.say(Verdict::Ok, what, found, None);
    }

    fn warn(&mut self, what: &str, found: impl Display, fix: impl Into<String>) {
        self.say(Verdict::Warn, what, found, Some(fix.into()));
    }

    fn fail(&mut self, what: &str, found: impl Display, fix: impl Into<String>) {
        self.say(Verdict::Fail, what, found, Some(fix.into()));
    }

    fn finish(self) -> ExitCode {
        let code = if self.failures > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
        if let Some(checks) = self.checks {
            print_json(&serde_json::json!({
                "ok": self.failures == 0,
                "failures": self.failures,
                "warnings": self.warnings,
                "checks": checks,
            }));
        } else if self.failures > 0 {
            println!(
                "{} problem{} found; fix {} and run `ostiary doctor` again",
                self.failures,
                if self.failures == 1 { "" } else { "s" },
                if self.failures == 1 { "it" } else { "them" },
            );
        } else {
            match self.warnings {
                0 => println!("everything checked is ok"),
                n => println!("no problems; {n} warning{}", if n == 1 { "" } else { "s" }),
            }
        }
        code
    }
}

/// Run every check against the config at `path` (or the built-in defaults).
pub async fn run(path: Option<&Path>, out: Output) -> Result<ExitCode, CliError> {
    let mut report = Report::new(out);
    let Some(config) = config(&mut report, path) else {
        return Ok(report.finish());
    };
    let ca = state_dir(&mut report, &config);
    if let Some(ca) = &ca {
        trust(&mut report, &config, ca);
    }
    policies(&mut report, &config);
    store(&mut report, &config).await;
    let listing = proxy(&mut report, &config).await;
    broker(&mut report, &config).await;
    approvals(&mut report, &config, listing.as_ref()).await;
    Ok(report.finish())
}

fn config(report: &mut Report, path: Option<&Path>) -> Option<Config> {
    match path {
        Some(path) => match Config::load(path) {
            Ok(config) => {
                report.ok("config", path.display());
                Some(config)
            }
            Err(e) => {
                report.fail(
                    "config",
                    e,
                    format!(
                        "correct {} (every table refuses unknown fields: docs/configuration.md); \
                         nothing else can be checked until it loads",
                        path.display()
                    ),
                );
                None
            }
        },
        None => match Config::from_toml("", Path::new("(built-in defaults)")) {
            Ok(config) => {
                report.ok(
                    "config",
                    "no file: the built-in defaults (--config or OSTIARY_CONFIG names a deployment's)",
                );
                Some(config)
            }
            Err(e) => {
                report.fail(
                    "config",
                    e,
                    "the environment's overrides (OSTIARY_STATE_STORE, …) do not apply",
                );
                None
            }
        },
    }
}

fn policies(report: &mut Report, config: &Config) {
    let dir = &config.policy.dir;
    let engine = match ostiary::server::load_policies(config) {
        Ok(engine) => engine,
        Err(e) => {
            report.fail(
                "policies",
                e,
                format!(
                    "correct what is named, then `ostiary policy validate`; a running proxy keeps \
                     its last good set until {} validates",
                    dir.display()
                ),
            );
            return;
        }
    };
    // As `serve` loads them: the default directory, when absent, is the copy embedded in
    // the binary.
    let source = if dir.is_dir() {
        dir.display().to_string()
    } else {
        "the library embedded in the binary".to_owned()
    };
    report.ok(
        "policies",
        format!(
            "{} policies in {source} validate against the schema",
            engine.len()
        ),
    );
    let tests = dir.join("tests");
    if !tests.is_dir() {
        return;
    }
    match ostiary_policies::run_dir(&engine, &tests) {
        Ok(run) if run.failed() > 0 => report.warn(
            "policies",
            format!(
                "{} of {} policy tests fail",
                run.failed(),
                run.failed() + run.passed()
            ),
            "`ostiary policy test` shows each difference",
        ),
        Ok(run) => report.ok(
            "policies",
            format!("{} policy tests in {} pass", run.passed(), tests.display()),
        ),
        Err(e) => report.warn(
            "policies",
            format!("the policy tests cannot be run: {e}"),
            "`ostiary policy test` says more",
        ),
    }
}

async fn store(report: &mut Report, config: &Config) {
    let state = config.state.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let backend = ostiary::stores::Backend::of(&state)?;
        let described = backend.describe();
        let last = backend
            .audit_reader()
            .and_then(|trail| trail.last())
            .map_err(|e| format!("{described}: {e}"))?;
        Ok::<_, String>((described, last.map_or(0, |tip| tip.seq)))
    })
    .await
    .unwrap_or_else(|e| Err(format!("the check did not finish: {e}")));
    match answer {
        Ok((store, records)) => report.ok("store", format!("{store}: {records} audit records")),
        Err(why) => report.fail(
            "store",
            why,
            "state.store must name a database `ostiary serve` can open (it makes the SQLite one at its first start)",
        ),
    }
}

/// `/healthz`, `/readyz` and the admin token; the pending approvals when all answered.
async fn proxy(report: &mut Report, config: &Config) -> Option<Value> {
    let mut addr = config.listen.control;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let base = format!("http://{addr}");
    // Never through a proxy: this shell may have HTTPS_PROXY pointing at Ostiary itself,
    // which refuses its own control API.
    let http = match reqwest::Client::builder()
        .no_proxy()
        .timeout(NET_TIMEOUT)
        .build()
    {
        Ok(http) => http,
        Err(e) => {
            report.fail(
                "proxy",
                format!("no HTTP client: {e}"),
                "report this as a bug",
            );
            return None;
        }
    };
    if let Err(e) = http.get(format!("{base}/healthz")).send().await {
        report.fail(
            "proxy",
            format!("nothing answers on {base} (listen.control): {}", chain(&e)),
            "start `ostiary serve` with this config, or give doctor the deployment's --config",
        );
        return None;
    }
    match http.get(format!("{base}/readyz")).send().await {
        Ok(answer) if answer.status().is_success() => report.ok(
            "proxy",
            format!(
                "serving: control API on {base}, proxy on {}, ready",
                config.listen.proxy
            ),
        ),
        Ok(answer) => {
            let status = answer.status().as_u16();
            let body = answer.text().await.unwrap_or_default();
            report.fail(
                "proxy",
                format!("{base}/readyz answers {status}: {}", body.trim()),
                "what it names (audit trail, store, redis) cannot be reached or written: see the server's log",
            );
        }
        Err(e) => report.fail(
            "proxy",
            format!("{base}/readyz: {}", chain(&e)),
            "see the server's log",
        ),
    }
    let client = match super::control_client(config) {
        Ok(client) => client,
        Err(e) => {
            report.fail(
                "proxy",
                format!("no admin token to ask with: {e}"),
                "run doctor where the CLI can read the state directory, or set OSTIARY_ADMIN_TOKEN",
            );
            return None;
        }
    };
    match client.approvals(Some("pending")).await {
        Ok(listing) => {
            report.ok("proxy", "the admin token is accepted");
            Some(listing)
        }
        Err(SdkError::Api { status, .. }) if status == 401 || status == 403 => {
            report.fail(
                "proxy",
                format!("the control API refuses this admin token ({status})"),
                format!(
                    "give the CLI the token serve uses: {} or OSTIARY_ADMIN_TOKEN",
                    config.state.dir.join(files::ADMIN_TOKEN).display()
                ),
            );
            None
        }
        Err(e) => {
            report.fail("proxy", e, "see the server's log");
            None
        }
    }
}

async fn broker(report: &mut Report, config: &Config) {
    match config.broker.backend.as_str() {
        "vault" => match &config.broker.vault {
            Some(vault) => vault_check(report, vault).await,
            // Config validation refuses this; said rather than assumed.
            None => report.fail(
                "vault",
                "broker.backend = \"vault\" without [broker.vault]",
                "add [broker.vault] with its addr",
            ),
        },
        _ => {
            let file = &config.broker.file;
            match std::fs::metadata(file) {
                Ok(meta) if meta.permissions().mode() & 0o077 != 0 => report.warn(
                    "secrets",
                    format!(
                        "{} is readable by others (mode {:o})",
                        file.display(),
                        meta.permissions().mode() & 0o777
                    ),
                    format!("chmod 600 {}", file.display()),
                ),
                Ok(_) => report.ok(
                    "secrets",
                    format!(
                        "file backend {} (readable by its owner only)",
                        file.display()
                    ),
                ),
                Err(_) if config.credential.is_empty() => report.ok(
                    "secrets",
                    "file backend, no credentials bound (no [[credential]])",
                ),
                Err(e) => report.warn(
                    "secrets",
                    format!("no secrets file at {}: {e}", file.display()),
                    "file-sourced credentials answer credential_unavailable until it exists (name = \"value\" lines)",
                ),
            }
        }
    }
}

async fn vault_check(report: &mut Report, vault: &ostiary_broker::vault::VaultConfig) {
    use ostiary_broker::vault::{health, VaultClient, VaultError};
    let addr = &vault.addr;
    match health::health(addr, NET_TIMEOUT).await {
        Ok(h) if !h.initialized => {
            report.fail(
                "vault",
                format!("{addr} is not initialized"),
                "initialize it (`bao operator init`), then unseal it",
            );
            return;
        }
        Ok(h) if h.sealed => {
            report.fail(
                "vault",
                format!("{addr} is sealed"),
                "unseal it (`bao operator unseal`); meanwhile Vault credentials answer credential_unavailable",
            );
            return;
        }
        Ok(_) => {}
        Err(e) => {
            report.fail(
                "vault",
                format!("{addr}: {e}"),
                "start Vault/OpenBao, or correct [broker.vault] addr; serve keeps retrying, and Vault credentials answer credential_unavailable meanwhile",
            );
            return;
        }
    }
    // Log in only with what this shell holds: serve may hold a token that doctor does not.
    let login_var = match (&vault.auth.token_env, &vault.auth.approle) {
        (Some(var), None) => var.clone(),
        (None, Some(role)) => role.secret_id_env.clone(),
        _ => String::new(),
    };
    if login_var.is_empty() || std::env::var_os(&login_var).is_none_or(|v| v.is_empty()) {
        report.ok(
            "vault",
            format!(
                "{addr} answers, unsealed; login not tried: ${login_var} is not set in this shell (serve reads its own)"
            ),
        );
        return;
    }
    match VaultClient::connect_with_timeout(vault, NET_TIMEOUT).await {
        Ok(_) => report.ok(
            "vault",
            format!("{addr} answers, unsealed, and takes the login in ${login_var}"),
        ),
        Err(e @ (VaultError::Auth(_) | VaultError::Denied { .. })) => report.fail(
            "vault",
            format!("{addr} refuses the login: {e}"),
            format!("${login_var} must hold a valid token (or AppRole secret id) for serve"),
        ),
        Err(e) => report.fail("vault", format!("{addr}: {e}"), "see Vault's log"),
    }
}

async fn approvals(report: &mut Report, config: &Config, listing: Option<&Value>) {
    let approvals = &config.approvals;
    if approvals.approvers.is_empty() {
        report.ok(
            "approvers",
            "none listed: holders of the admin token decide (CLI, control API)",
        );
    }
    let mut channels = 0;
    if let Some(smtp) = &approvals.smtp {
        channels += 1;
        match ostiary::approvals::notify::email::Mailer::new(smtp) {
            Err(e) => report.fail(
                "smtp",
                e,
                "correct approvals.smtp (the login comes from the variables it names)",
            ),
            Ok(mailer) => match mailer.check().await {
                Ok(()) => report.ok("smtp", format!("the relay at {} answers", mailer.relay())),
                Err(e) => report.fail(
                    "smtp",
                    format!("the relay at {}: {e}", mailer.relay()),
                    "start the relay or correct approvals.smtp.url; notices are retried meanwhile",
                ),
            },
        }
    }
    let slack_var = &approvals.slack_webhook_env;
    if !slack_var.is_empty() && std::env::var_os(slack_var).is_some_and(|v| !v.is_empty()) {
        channels += 1;
        // A webhook cannot be asked anything without posting to the channel.
        report.ok(
            "slack",
            format!("a webhook is set in ${slack_var} (not posted to)"),
        );
    }
    if channels == 0 && !approvals.approvers.is_empty() {
        report.warn(
            "approvers",
            format!(
                "{} listed, notified by no channel (no approvals.smtp; ${slack_var} unset here)",
                approvals.approvers.len()
            ),
            "set approvals.smtp or the Slack webhook variable for serve; until then approvers watch `ostiary approvals list`",
        );
    }
    if let Some(listing) = listing {
        match listing["counts"]["failing_notifications"].as_u64() {
            Some(0) | None => report.ok("approvers", "the proxy reports no failing notification"),
            Some(n) => report.fail(
                "approvers",
                format!("the proxy reports {n} failing notification(s), being retried"),
                "`ostiary approvals list`, then `ostiary approvals show ID` names each error",
            ),
        }
    }
}
