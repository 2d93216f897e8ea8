//! `ostiary approvals list|show|approve|deny|link` (docs/design.md §7, §10) against the real
//! `ostiary serve` binary, the admin token read from the state directory via `--config`.
//!
//! - `list` shows the pending approval with its summary and the queue counts line;
//!   `show ID` shows tool, destination, arguments, policies, deadline and the delivery state
//!   of its notifications (an SMTP relay that is down, then up again); `--json` parses.
//! - `approve ID` with `OSTIARY_APPROVER=alice@example.com` (no `--as`) runs it once, decided
//!   by alice: the agent's retry with `Ostiary-Approval` gets the upstream's answer.
//! - `deny ID --as bob@example.com --reason ...` (with `OSTIARY_APPROVER` naming alice:
//!   `--as` wins): the agent gets 403 `approval_denied` by bob.
//! - approving as someone not listed, or as the agent itself, exits non-zero with a clear
//!   message and decides nothing.
//! - `link ID --as alice@example.com` prints a review-page URL on the control listener whose
//!   GET shows the tool (and decides nothing).

use crate::support::cli;
use cli::*;

use crate::support::approvals as approvals_support;
use approvals_support::{refund_body, APPROVER, POLICIES, TOOLS};

use std::time::Duration;

use ostiary_e2e::clients::CmdOutput;
use ostiary_e2e::smtp::SmtpSink;
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{ControlClient, NewSession};
use serde_json::Value;

const BOB: &str = "bob@example.com";

struct Fixture {
    upstream: Upstream,
    smtp: SmtpSink,
    server: Server,
    agent: reqwest::Client,
    config: String,
}

impl Fixture {
    /// `ostiary serve` with the approvals catalog, two approvers mailed through an SMTP
    /// relay that starts out down, and an agent session.
    async fn start() -> Self {
        let upstream = Upstream::builder().start().await;
        let smtp = SmtpSink::start().await;
        smtp.set_down(true);
        let approvals = format!(
            r#"
[approvals]
approvers = ["{APPROVER}", "{BOB}"]
tick = "100ms"
retry_initial = "200ms"
retry_max = "400ms"
smtp = {{ url = "{}", from = "ostiary@example.com" }}
"#,
            smtp.url()
        );
        let server = Server::start_with_files(
            &upstream,
            &["api.example.test"],
            POLICIES,
            &[("tools.toml", TOOLS)],
            &approvals,
            "info",
        )
        .await;
        let token = std::fs::read_to_string(server.state.join("admin.token")).unwrap();
        let session = ControlClient::new(format!("http://{}", server.control_addr), token.trim())
            .create_session(&NewSession {
                agent: "agent-1".into(),
                ..Default::default()
            })
            .await
            .expect("creating a session");
        let ca = std::fs::read(server.state.join("ca.pem")).unwrap();
        let agent = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(&session.proxy_url).unwrap())
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let config = server.config_arg();
        Self {
            upstream,
            smtp,
            server,
            agent,
            config,
        }
    }

    /// `ostiary --config <config> approvals <args>`.
    async fn approvals(&self, args: &[&str]) -> CmdOutput {
        let mut all = vec!["--config", self.config.as_str(), "approvals"];
        all.extend_from_slice(args);
        ostiary(&all).await
    }

    /// `ostiary --config <config> approvals <args>` with `OSTIARY_APPROVER=<who>`.
    async fn approvals_as(&self, who: &str, args: &[&str]) -> CmdOutput {
        let mut all = vec!["--config", self.config.as_str(), "approvals"];
        all.extend_from_slice(args);
        ostiary_e2e::clients::run(
            ostiary_bin(),
            &all,
            &[("OSTIARY_LOG", "warn"), ("OSTIARY_APPROVER", who)],
            CLI_TIMEOUT,
        )
        .await
    }

    /// `approvals <args> --json`, which must succeed and print JSON.
    async fn approvals_json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.approvals(&all).await;
        assert!(out.success(), "{out}");
        serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("--json output does not parse ({e}):\n{out}"))
    }

    /// The agent's refund of `charge`, optionally the retry carrying `Ostiary-Approval`.
    async fn refund(&self, charge: &str, approval: Option<&str>) -> (u16, Value) {
        let mut req = self
            .agent
            .post(self.upstream.url(&format!("/idem/refunds/{charge}")))
            .header("content-type", "application/json")
            .body(refund_body(&[7, 8]));
        if let Some(id) = approval {
            req = req.header("ostiary-approval", id);
        }
        let response = req.send().await.expect("request through the proxy");
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// Hold `charge`'s refund: the 202's approval id.
    async fn hold(&self, charge: &str) -> String {
        let (status, body) = self.refund(charge, None).await;
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["error"], "approval_pending", "{body}");
        body["approval_id"].as_str().unwrap().to_owned()
    }

    /// Polls `show --json` until `ready` holds for it.
    async fn show_until(&self, id: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let shown = self.approvals_json(&["show", id]).await;
            if ready(&shown) {
                return shown;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never got {what}: {shown:#}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn applied(&self, charge: &str) -> usize {
        let path = format!("/idem/refunds/{charge}");
        self.upstream
            .effects()
            .iter()
            .filter(|e| e.path == path)
            .count()
    }
}

fn failed_attempts(shown: &Value) -> bool {
    let notes = shown["notifications"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    notes.len() == 2
        && notes
            .iter()
            .all(|n| n["sent_ms"].is_null() && n["attempts"].as_u64() >= Some(1))
}

fn all_delivered(shown: &Value) -> bool {
    let notes = shown["notifications"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    notes.len() == 2 && notes.iter().all(|n| !n["sent_ms"].is_null())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_approve_from_the_command_line() {
    let mut fx = Fixture::start().await;
    let id = fx.hold("ch_cli_1").await;

    // Notifications are owed; the relay is down, so both fail and are retried.
    fx.show_until(&id, "a failed delivery to each approver", failed_attempts)
        .await;

    let list = fx.approvals(&["list"]).await;
    assert!(list.success(), "{list}");
    let row = list
        .stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} is not listed:\n{list}"));
    assert!(row.contains("pending"), "{row}");
    assert!(
        row.contains("pay.refund on api.example.test for agent-1"),
        "the summary: {row}"
    );
    assert!(row.contains("(deadline "), "{row}");
    assert!(
        list.stdout.contains(
            "queue: 1 pending, 0 approved, 0 executing; 2 notifications failing (retrying)"
        ),
        "the counts line:\n{list}"
    );
    let listed = fx.approvals_json(&["list"]).await;
    assert_eq!(
        listed["approvals"][0]["approval_id"],
        id.as_str(),
        "{listed}"
    );
    assert_eq!(listed["approvals"][0]["tool"], "pay.refund");
    assert_eq!(listed["counts"]["pending"], 1);
    assert_eq!(listed["counts"]["failing_notifications"], 2);

    let show = fx.approvals(&["show", &id]).await;
    assert!(show.success(), "{show}");
    let port = fx.upstream.port();
    for needle in [
        format!("approval     {id}"),
        "status       pending".to_owned(),
        "tool         pay.refund (tier irreversible)".to_owned(),
        format!("destination  https://api.example.test:{port}"),
        format!("request      POST https://api.example.test:{port}/idem/refunds/ch_cli_1"),
        "agent        agent-1".to_owned(),
        "impact       2 records, cost 0.25".to_owned(),
        "policies     [\"irreversible-needs-human\"]".to_owned(),
        "deadline     ".to_owned(),
        format!("idempotency  ostiary-{id}"),
        "\"charge\": \"ch_cli_1\"".to_owned(),
        format!("notified     email {APPROVER} round 1: NOT DELIVERED after"),
        format!("notified     email {BOB} round 1: NOT DELIVERED after"),
    ] {
        assert!(show.stdout.contains(&needle), "no {needle:?} in:\n{show}");
    }
    let arguments = show
        .stdout
        .lines()
        .find(|l| l.starts_with("arguments"))
        .unwrap_or_else(|| panic!("no arguments:\n{show}"));
    assert!(arguments.contains('{'), "{arguments}");

    // The relay comes back: the retries deliver, and `show` says so.
    fx.smtp.set_down(false);
    fx.show_until(&id, "delivered notifications", all_delivered)
        .await;
    let show = fx.approvals(&["show", &id]).await;
    for who in [APPROVER, BOB] {
        assert!(
            show.stdout
                .contains(&format!("notified     email {who} round 1: delivered at ")),
            "{show}"
        );
    }
    assert_eq!(fx.smtp.messages_to(APPROVER).len(), 1);

    // Approved from the command line, the approver taken from OSTIARY_APPROVER: it runs
    // once and the agent collects the answer.
    assert_eq!(fx.applied("ch_cli_1"), 0, "nothing ran before the decision");
    let approve = fx
        .approvals_as(APPROVER, &["approve", &id, "--reason", "checked"])
        .await;
    assert!(approve.success(), "{approve}");
    assert!(
        approve
            .stdout
            .contains(&format!("{id} approved: pay.refund on api.example.test")),
        "{approve}"
    );
    let executed = fx
        .show_until(&id, "executed", |a| a["status"] == "executed")
        .await;
    assert_eq!(executed["approver"], APPROVER);
    assert_eq!(executed["channel"], "api");
    let (status, body) = fx.refund("ch_cli_1", Some(&id)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["key"], format!("ostiary-{id}"), "{body}");
    assert_eq!(body["applied"], 1, "{body}");
    assert_eq!(fx.applied("ch_cli_1"), 1);

    let show = fx.approvals(&["show", &id]).await;
    assert!(show.stdout.contains("status       executed"), "{show}");
    assert!(
        show.stdout
            .contains(&format!("decided      by {APPROVER} via api")),
        "{show}"
    );
    assert!(
        show.stdout.contains("response     HTTP 201 (1 attempts)"),
        "{show}"
    );
    let list = fx.approvals(&["list"]).await;
    assert!(
        list.stdout.contains("no approvals"),
        "nothing pending:\n{list}"
    );
    let all = fx.approvals(&["list", "--status", "all"]).await;
    assert!(
        all.stdout.contains(&id) && all.stdout.contains("executed"),
        "{all}"
    );

    // A decided approval cannot be decided again.
    let again = fx.approvals(&["deny", &id, "--as", BOB]).await;
    assert!(!again.success(), "{again}");
    assert!(again.stderr.contains("already executed"), "{again}");
    terminate(&mut fx.server.child, &fx.server.log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_refusals_and_review_links_from_the_command_line() {
    let mut fx = Fixture::start().await;

    // Denied: the agent's retry is refused, nothing runs.
    let denied = fx.hold("ch_cli_2").await;
    // `--as` wins over OSTIARY_APPROVER.
    let deny = fx
        .approvals_as(
            APPROVER,
            &["deny", &denied, "--as", BOB, "--reason", "not a duplicate"],
        )
        .await;
    assert!(deny.success(), "{deny}");
    assert!(deny.stdout.contains(&format!("{denied} denied")), "{deny}");
    let (status, body) = fx.refund("ch_cli_2", Some(&denied)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "approval_denied", "{body}");
    assert_eq!(body["approver"], BOB, "{body}");
    let shown = fx.approvals_json(&["show", &denied]).await;
    assert_eq!(shown["status"], "denied");
    assert_eq!(shown["reason"], "not a duplicate");

    // Someone not listed, and the agent itself: refused with a reason, nothing decided.
    let held = fx.hold("ch_cli_3").await;
    let stranger = fx
        .approvals(&["approve", &held, "--as", "mallory@example.com"])
        .await;
    assert!(!stranger.success(), "{stranger}");
    assert!(
        stranger
            .stderr
            .contains("\"mallory@example.com\" is not one of the configured approvers"),
        "{stranger}"
    );
    let own = fx.approvals(&["approve", &held, "--as", "agent-1"]).await;
    assert!(!own.success(), "{own}");
    assert!(
        own.stderr
            .contains("the agent that made a request cannot approve it"),
        "{own}"
    );
    let own_link = fx.approvals(&["link", &held, "--as", "agent-1"]).await;
    assert!(
        !own_link.success(),
        "no link for the agent either: {own_link}"
    );
    let unknown = fx
        .approvals(&["approve", "apr_000000000000000000000000", "--as", APPROVER])
        .await;
    assert!(!unknown.success(), "{unknown}");
    assert!(unknown.stderr.contains("no approval"), "{unknown}");
    assert_eq!(
        fx.approvals_json(&["show", &held]).await["status"],
        "pending"
    );

    // A review link for alice: a page on the control listener showing the tool.
    let link = fx.approvals(&["link", &held, "--as", APPROVER]).await;
    assert!(link.success(), "{link}");
    let url = link.stdout.trim();
    let prefix = format!("http://{}/approve/", fx.server.control_addr);
    assert!(url.starts_with(&prefix), "{url} is not under {prefix}");
    assert!(url.len() > prefix.len() + 16, "a token follows: {url}");
    let page = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html")));
    let html = page.text().await.unwrap();
    assert!(html.contains("pay.refund"), "{html}");
    assert!(html.contains("ch_cli_3"), "the arguments are shown: {html}");
    // Looking decides nothing.
    assert_eq!(
        fx.approvals_json(&["show", &held]).await["status"],
        "pending"
    );
    assert_eq!(fx.applied("ch_cli_2") + fx.applied("ch_cli_3"), 0);
    assert_eq!(
        fx.upstream.count("/idem/refunds/ch_cli_2") + fx.upstream.count("/idem/refunds/ch_cli_3"),
        0,
        "neither reached the upstream"
    );
    terminate(&mut fx.server.child, &fx.server.log).await;
}
