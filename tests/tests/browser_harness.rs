//! Self-test of the browser harness ([`ostiary_e2e::browser`]) before the approval tests
//! lean on it: headless Chromium loads the real review page (`page::review` for a made-up
//! approval, with `page::security_headers`) from a tiny server on 127.0.0.1, sees the
//! element ids the end-to-end tests read, renders hostile arguments as text, and clicking
//! Approve or Deny makes the browser POST the form that `page::parse_form` reads, despite
//! the page's strict CSP.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use ostiary::approvals::model::{Approval, HeldRequest, Observed, Status, Verdict};
use ostiary::approvals::page;
use ostiary_e2e::browser::{review_in_browser, review_in_browser_with};
use serde_json::json;
use tokio::net::TcpListener;

const EVIL: &str = "</pre><script>alert(1)</script>";
const PAGE: &str = "/approve/tok123";

/// One request the page server received.
#[derive(Debug, Clone)]
struct Hit {
    method: Method,
    path: String,
    body: Vec<u8>,
}

struct PageServer {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl PageServer {
    /// Serves `approval`'s review page at [`PAGE`] (GET) and takes its form (POST).
    async fn start(approval: Approval) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let approval = Arc::new(approval);
        let seen = hits.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (approval, seen) = (approval.clone(), seen.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        handle(req, approval.clone(), seen.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, hits }
    }

    fn url(&self) -> String {
        format!("http://{}{PAGE}", self.addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

async fn handle(
    req: Request<Incoming>,
    approval: Arc<Approval>,
    seen: Arc<Mutex<Vec<Hit>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec());
    let body = body.unwrap_or_default();
    seen.lock().unwrap().push(Hit {
        method: method.clone(),
        path: path.clone(),
        body: body.clone(),
    });
    let (status, html) = match (method, path.as_str()) {
        (Method::GET, PAGE) => (StatusCode::OK, page::review(&approval, "alice", PAGE)),
        (Method::POST, PAGE) => match page::parse_form(&body) {
            Ok((verdict, reason)) => (
                StatusCode::OK,
                page::outcome(
                    &format!("Decision recorded: {}", verdict.as_str()),
                    &format!("reason: {}", reason.as_deref().unwrap_or("(none)")),
                ),
            ),
            Err(e) => (StatusCode::BAD_REQUEST, page::outcome("Bad form", &e)),
        },
        _ => (StatusCode::NOT_FOUND, page::outcome("Not found", "")),
    };
    let mut resp = Response::new(Full::new(Bytes::from(html)));
    *resp.status_mut() = status;
    for (name, value) in page::security_headers() {
        resp.headers_mut().insert(name, value);
    }
    Ok(resp)
}

fn approval(status: Status) -> Approval {
    let args = json!({"amount": 1000, "currency": "EUR", "note": EVIL});
    Approval {
        id: "apr_browser".into(),
        status,
        created_ms: 1_800_000_000_000,
        deadline_ms: 1_800_000_900_000,
        renotify_ms: 1_800_000_300_000,
        rounds: 1,
        session: "ses_1".into(),
        agent: "billing-bot".into(),
        tenant: "acme".into(),
        request_id: "req_1".into(),
        policies: vec!["irreversible-needs-approval".into()],
        policy_generation: 1,
        request: HeldRequest {
            method: "POST".into(),
            url: "https://pay.example.test:8443/mcp".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: args.to_string().into_bytes(),
            body_digest: String::new(),
        },
        observed: Observed {
            host: "pay.example.test".into(),
            port: 8443,
            scheme: "https".into(),
            action: "Ostiary::Action::\"tool:payments.refund\"".into(),
            resource: "Ostiary::Host::\"pay.example.test\"".into(),
            tool: Some("payments.refund".into()),
            tier: Some("irreversible".into()),
            args: Some(args),
            args_hash: None,
            records: Some(1),
            cost: None,
            rpc_id: None,
        },
        approver: None,
        channel: None,
        decided_ms: None,
        reason: None,
        attempts: 0,
        result: None,
        held_policy_version: None,
        executed_policy_version: None,
    }
}

#[tokio::test]
async fn browser_sees_the_review_page_and_a_get_changes_nothing() {
    let server = PageServer::start(approval(Status::Pending)).await;
    let started = Instant::now();
    let visit = review_in_browser(&server.url(), None).await.unwrap();
    eprintln!("one browser visit: {:?}", started.elapsed());

    assert_eq!(visit.http_status, Some(200));
    assert_eq!(visit.tool.as_deref(), Some("payments.refund"));
    assert_eq!(
        visit.destination.as_deref(),
        Some("https://pay.example.test:8443")
    );
    assert_eq!(visit.agent.as_deref(), Some("billing-bot"));
    assert_eq!(visit.status.as_deref(), Some("pending"));
    // The hostile argument is on screen as text, so the markup was escaped, not parsed.
    let args = visit.args.unwrap();
    assert!(args.contains("\"amount\": 1000"), "{args}");
    assert!(args.contains(EVIL), "{args}");
    assert!(visit.text.contains("Approve") && visit.text.contains("Deny"));
    assert!(visit
        .text
        .contains("POST https://pay.example.test:8443/mcp"));
    assert_eq!(visit.after_click, None);

    let hits = server.hits();
    assert!(hits.iter().all(|h| h.method == Method::GET), "{hits:?}");
    // The page declares its own (empty) icon: no stray request for /favicon.ico.
    assert!(hits.iter().all(|h| h.path == PAGE), "{hits:?}");
}

#[tokio::test]
async fn clicking_approve_posts_the_form() {
    let server = PageServer::start(approval(Status::Pending)).await;
    let started = Instant::now();
    let visit = review_in_browser_with(&server.url(), Some("approve"), Some("refund ok <b>"))
        .await
        .unwrap();
    eprintln!("browser visit with a click: {:?}", started.elapsed());

    assert_eq!(visit.after_click_status, Some(200));
    let after = visit.after_click.unwrap();
    assert!(after.contains("Decision recorded: approve"), "{after}");
    assert!(after.contains("reason: refund ok <b>"), "{after}");

    let posts: Vec<Hit> = server
        .hits()
        .into_iter()
        .filter(|h| h.method == Method::POST)
        .collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0].path, PAGE);
    assert_eq!(
        page::parse_form(&posts[0].body),
        Ok((Verdict::Approve, Some("refund ok <b>".to_owned())))
    );
}

#[tokio::test]
async fn clicking_deny_posts_the_form() {
    let server = PageServer::start(approval(Status::Pending)).await;
    let visit = review_in_browser(&server.url(), Some("deny"))
        .await
        .unwrap();
    assert!(visit
        .after_click
        .unwrap()
        .contains("Decision recorded: deny"));
    let posts: Vec<Hit> = server
        .hits()
        .into_iter()
        .filter(|h| h.method == Method::POST)
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(page::parse_form(&posts[0].body), Ok((Verdict::Deny, None)));
}

#[tokio::test]
async fn a_decided_approval_has_no_buttons() {
    let mut decided = approval(Status::Denied);
    decided.approver = Some("carol".into());
    decided.decided_ms = Some(1_800_000_060_000);
    let server = PageServer::start(decided).await;

    let visit = review_in_browser(&server.url(), None).await.unwrap();
    assert_eq!(visit.status.as_deref(), Some("denied"));
    assert!(visit.text.contains("carol"), "{}", visit.text);
    assert!(!visit.text.contains("Approve"), "{}", visit.text);

    // Asking the harness to click a button that is not there is an error, not a pass.
    let err = review_in_browser(&server.url(), Some("approve"))
        .await
        .unwrap_err();
    assert!(err.contains("review_page.py"), "{err}");
    assert!(server.hits().iter().all(|h| h.method == Method::GET));
}
