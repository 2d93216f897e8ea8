//! A run's checkpoint, through the proxy at a reserved name: `PUT` and `GET
//! https://ostiary.internal/v1/checkpoint` (or `http://`), answered by the proxy itself — the
//! name is never resolved and nothing is forwarded — so that a retried run resumes where
//! the failed attempt left off instead of starting over.
//!
//! The checkpoint belongs to the run whose session makes the request (its retries keep the
//! run's id, so they read it); any other session gets `404`. A `PUT` is bounded
//! (`[runs] checkpoint_max_bytes`) and answered once the store has it. The session → run
//! index is this replica's runs first, then the store's running runs, so a run whose
//! traffic reaches another replica finds its checkpoint too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::json;

use crate::audit::AuditGuard;
use crate::body::{full, ProxyBody};
use crate::classify::Target;
use crate::egress::address::Host;
use crate::error::ProxyError;
use crate::respond::json_response;
use crate::session::Principal;
use crate::store::runs::{RunFilter, RunStatus, RunStore};
use crate::store::Call;

/// The proxy's own name: requests to it are answered here.
pub const RESERVED_HOST: &str = "ostiary.internal";
/// The one path served at it.
pub const PATH: &str = "/v1/checkpoint";

/// Whether `host` is the reserved name (so it is intercepted, and never resolved).
pub fn is_reserved(host: &Host) -> bool {
    matches!(host, Host::Name(name) if name == RESERVED_HOST)
}

/// Checkpoints of the runs of this process, and where they are kept.
#[derive(Debug)]
pub struct Checkpoints {
    runs: Arc<dyn RunStore>,
    /// Session → run, for the runs this replica started.
    index: Mutex<HashMap<String, String>>,
    max_bytes: usize,
}

impl Checkpoints {
    pub fn new(runs: Arc<dyn RunStore>, max_bytes: usize) -> Self {
        Self {
            runs,
            index: Mutex::new(HashMap::new()),
            max_bytes,
        }
    }

    /// `session` is run `run`'s (the runner, when it opens the attempt's session).
    pub fn attach(&self, session: &str, run: &str) {
        if let Ok(mut index) = self.index.lock() {
            index.insert(session.to_owned(), run.to_owned());
        }
    }

    /// The attempt is over.
    pub fn detach(&self, session: &str) {
        if let Ok(mut index) = self.index.lock() {
            index.remove(session);
        }
    }

    /// The run `session` belongs to, while it runs.
    pub async fn run_of(&self, session: &str) -> Result<Option<String>, ProxyError> {
        if let Some(run) = self.index.lock().ok().and_then(|i| i.get(session).cloned()) {
            return Ok(Some(run));
        }
        let session = session.to_owned();
        self.runs
            .call(move |s| {
                let running = s.list(&RunFilter {
                    status: Some(RunStatus::Running),
                    trigger: None,
                    dead_letters: false,
                    limit: Some(10_000),
                })?;
                Ok(running
                    .into_iter()
                    .find(|r| r.session.as_deref() == Some(session.as_str()))
                    .map(|r| r.id))
            })
            .await
            .map_err(state_unavailable)
    }
}

/// Answer a request to the reserved name for `principal`'s session.
pub async fn answer(
    checkpoints: Option<&Checkpoints>,
    principal: &Principal,
    target: &Target,
    req: Request<hyper::body::Incoming>,
    audit: &mut AuditGuard,
    request_id: &str,
) -> Result<Response<ProxyBody>, ProxyError> {
    audit.update(|r| r.kind = "checkpoint".into());
    if target.path != PATH {
        return Err(not_served(
            404,
            format!("{RESERVED_HOST} answers {PATH} only"),
        ));
    }
    let run = match checkpoints {
        Some(c) => c.run_of(&principal.session_id).await?,
        None => None,
    };
    let (Some(checkpoints), Some(run)) = (checkpoints, run) else {
        return Err(not_served(
            404,
            "this session is not a run's: only a run started by a trigger has a checkpoint".into(),
        ));
    };
    audit.update(|r| r.run = Some(json!({"run_id": run})));
    match *req.method() {
        Method::GET => {
            let root = run.clone();
            let saved = checkpoints
                .runs
                .call(move |s| s.checkpoint(&root))
                .await
                .map_err(state_unavailable)?;
            match saved {
                Some(data) => {
                    let mut response = Response::new(full(data));
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/octet-stream"),
                    );
                    Ok(response)
                }
                None => Err(not_served(
                    404,
                    format!("run {run} has saved no checkpoint"),
                )),
            }
        }
        Method::PUT => {
            let limit = checkpoints.max_bytes;
            let data = Limited::new(req.into_body(), limit)
                .collect()
                .await
                .map_err(|_| not_served(413, format!("a checkpoint is at most {limit} bytes")))?
                .to_bytes();
            let (root, size) = (run.clone(), data.len());
            let now = crate::store::now_ms();
            checkpoints
                .runs
                .call(move |s| s.save_checkpoint(&root, &data, now))
                .await
                .map_err(state_unavailable)?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"run_id": run, "saved_bytes": size}),
                request_id,
            ))
        }
        _ => Err(not_served(405, format!("{PATH} takes GET and PUT"))),
    }
}

fn state_unavailable(e: crate::store::StoreError) -> ProxyError {
    ProxyError::StateUnavailable {
        component: "store",
        reason: e.to_string(),
    }
}

fn not_served(status: u16, reason: String) -> ProxyError {
    ProxyError::NotServed { status, reason }
}
