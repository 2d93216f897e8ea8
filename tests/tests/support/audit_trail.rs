//! Shared by the audit-trail test crates (`audit_fail_closed.rs`, `audit_tamper.rs`): a
//! proxy on a state directory of its own, the tally of what was sent and refused, the
//! control listener's readiness, and `audit verify` / `reanchor` in-process and as the
//! binary. Each crate uses a subset, so unused items are allowed here.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ostiary_e2e::clients::CmdOutput;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{absolute_get, assert_ostiary_error, auth_line, Reply};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

use crate::support::cli::ostiary;

/// How long the proxy may take to notice an outage, or its end (polled, not asserted).
pub(crate) const NOTICE: Duration = Duration::from_secs(30);

/// A client for the control listener (never through a proxy).
pub(crate) fn control_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `GET /readyz`: status and body.
pub(crate) async fn readyz(proxy: &TestProxy) -> (u16, Value) {
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
pub(crate) async fn metric(proxy: &TestProxy, name: &str) -> f64 {
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
pub(crate) async fn wait_ready(proxy: &TestProxy, want: u16) -> Value {
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
pub(crate) struct Tally {
    /// Requests on the proxy listener or in tunnels that each owe one `http` record.
    pub(crate) http: usize,
    /// Request ids of every `503 audit_unavailable` answer.
    pub(crate) refused: Vec<String>,
}

impl Tally {
    /// Count `reply`; if it is a refusal, check it is `audit_unavailable` and keep its id.
    pub(crate) fn saw(&mut self, reply: &Reply) -> bool {
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
pub(crate) async fn until_refused(
    proxy: &TestProxy,
    url: &str,
    auth: &str,
    tally: &mut Tally,
) -> usize {
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

/// What `ostiary audit verify` checks, run in-process (the binary is driven in
/// [`rows_deleted_between_runs_refuse_the_next_start_until_reanchored`]).
pub(crate) fn verify_in_process(state: &Path) -> ostiary::audit::verify::VerifyReport {
    let key = std::fs::read_to_string(state.join("audit.key")).unwrap();
    let trail = ostiary::store::sqlite::open_audit_reader(&state.join("ostiary.db")).unwrap();
    ostiary::audit::verify::verify(&*trail, key.trim().as_bytes(), &state.join("audit.head"))
        .unwrap()
}

/// The problems `verify` finds, one per line.
pub(crate) fn problems(state: &Path) -> String {
    verify_in_process(state).problems.join("\n")
}

/// `ostiary audit verify` against the state directory `state`.
pub(crate) async fn verify(state: &Path) -> CmdOutput {
    let config = state.with_extension("verify.toml");
    std::fs::write(&config, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    ostiary(&["--config", &config.display().to_string(), "audit", "verify"]).await
}

/// `ostiary audit reanchor` against `state`, with `args` after it.
pub(crate) async fn reanchor(state: &Path, args: &[&str]) -> CmdOutput {
    let config = state.with_extension("verify.toml");
    std::fs::write(&config, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    let config = config.display().to_string();
    let mut all = vec!["--config", &config, "audit", "reanchor"];
    all.extend_from_slice(args);
    ostiary(&all).await
}

/// A proxy on `state` for `upstreams`.
pub(crate) async fn proxy_on(state: Option<PathBuf>, upstreams: &[&Upstream]) -> TestProxy {
    let tls = upstreams.iter().find(|u| u.is_tls());
    TestProxy::start(ProxySpec {
        ports: upstreams.iter().map(|u| u.port()).collect(),
        upstream_ca_pem: tls.map(|u| u.ca_pem()),
        state_dir: state,
        ..Default::default()
    })
    .await
}

/// A proxy on a state directory of its own with one plain upstream, `warm` requests
/// through it already forwarded and committed.
pub(crate) struct Live {
    pub(crate) proxy: TestProxy,
    pub(crate) plain: Upstream,
    pub(crate) state: PathBuf,
    pub(crate) auth: String,
    pub(crate) url: String,
    pub(crate) tally: Tally,
    /// Last: the state directory outlives the proxy.
    pub(crate) _root: tempfile::TempDir,
}

pub(crate) async fn live(agent: &str, warm: usize) -> Live {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let proxy = proxy_on(Some(state.clone()), &[&plain]).await;
    let session = proxy.session(agent).await;
    let (auth, url) = (auth_line(&session.token), plain.url("/echo"));
    let mut tally = Tally::default();
    for _ in 0..warm {
        assert!(!tally.saw(&absolute_get(&proxy, &url, &auth).await));
    }
    assert!(proxy.shared.audit.flush().await);
    Live {
        proxy,
        plain,
        state,
        auth,
        url,
        tally,
        _root: root,
    }
}
