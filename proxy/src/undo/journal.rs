//! Recording the undo of a call that succeeded: the tool's `undo` template rendered from the
//! call's arguments and its (scrubbed) answer, checked for secrets, and kept in the store's
//! undo journal with what its decision will need — who made the call and with which
//! arguments — so that `ostiary sessions undo` can send it later, even after the session
//! ended.
//!
//! The agent's call has already happened upstream when this runs: nothing here refuses
//! it. An undo that cannot be recorded is said so in the call's audit record (`undo`) and,
//! where the journal can hold it, as an `unavailable` entry the undo report names.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::Response;
use http_body::Frame;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use ostiary_policies::undo::Values;
use ostiary_policies::{PolicyEngine, Tool};
use serde_json::{json, Value};

use crate::audit::AuditGuard;
use crate::body::{self, BoxError, ProxyBody};
use crate::check::dlp::Detectors;
use crate::classify::Target;
use crate::error::ProxyError;
use crate::session::Principal;
use crate::store::undo::{NewUndo, UndoStatus, UndoStore};
use crate::store::{now_ms, Call as _};

/// The most of an answer read to fill `{response.…}`: a larger answer streams on, and
/// the call's undo is unavailable.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// The most of a call's arguments kept for its undo's decision.
pub const MAX_ARGS_BYTES: usize = 64 * 1024;

/// A call whose undo is to be recorded once it succeeds (from `decide`).
#[derive(Debug, Clone)]
pub struct Plan {
    pub tool: String,
    /// The arguments policy saw.
    pub args: Value,
}

/// What recording needs: the journal, the detectors a kept value must pass, the policy
/// set the call was decided under (its catalog has the template).
#[derive(Debug)]
pub struct Journal<'a> {
    pub store: &'a Arc<dyn UndoStore>,
    pub detectors: &'a Detectors,
    pub engine: &'a PolicyEngine,
}

/// The call being recorded.
#[derive(Debug)]
pub struct Call<'a> {
    pub request_id: &'a str,
    pub principal: &'a Principal,
    pub target: &'a Target,
    pub host: &'a str,
}

/// The undo request as the journal keeps it (`request`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Stored {
    pub method: String,
    pub scheme: String,
    pub host: String,
    pub port: u16,
    /// Path and query, every value percent-encoded.
    pub path: String,
    /// A JSON body, if the template has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
}

/// The tool `name` as `engine`'s catalog has it, if it still declares an undo served at
/// `host`.
pub fn tool_now<'e>(
    engine: &'e PolicyEngine,
    name: &str,
    host: &str,
) -> Result<&'e Tool, ProxyError> {
    let refused = |why: String| ProxyError::Denied {
        policies: Vec::new(),
        action: format!("tool:{name}.undo"),
        resource: format!("Ostiary::Tool::{name:?}"),
        reason: why,
    };
    let tool = engine
        .catalog()
        .get(name)
        .ok_or_else(|| refused(format!("the tool {name:?} is no longer in the catalog")))?;
    if tool.undo().is_none() {
        return Err(refused(format!(
            "the tool {name:?} no longer declares an undo"
        )));
    }
    if tool.server() != host {
        return Err(refused(format!(
            "the tool {name:?} is now served at {}, not {host}",
            tool.server()
        )));
    }
    Ok(tool)
}

impl Journal<'_> {
    /// Record the undo of `call` if its answer is a success; the answer comes back whole
    /// (read into memory first, up to [`MAX_RESPONSE_BYTES`], when the template reads it).
    pub async fn record(
        &self,
        call: Call<'_>,
        plan: Plan,
        response: Response<ProxyBody>,
        audit: &mut AuditGuard,
    ) -> Response<ProxyBody> {
        if !response.status().is_success() {
            return response;
        }
        let Some(tool) = self.engine.catalog().get(&plan.tool) else {
            return response;
        };
        let Some(spec) = tool.undo() else {
            return response;
        };
        let (response, answer) = if spec.reads_response() {
            let (parts, body) = response.into_parts();
            let (body, read) = read_answer(body).await;
            (Response::from_parts(parts, body), read)
        } else {
            (response, Ok(None))
        };
        let outcome = answer.and_then(|answer| {
            let rendered = spec
                .render(&Values {
                    args: &plan.args,
                    response: answer.as_ref(),
                })
                .map_err(|e| e.to_string())?;
            self.check(&rendered.path, rendered.body.as_ref())?;
            Ok(Stored {
                method: rendered.method,
                scheme: call.target.scheme.to_owned(),
                host: call.host.to_owned(),
                port: call.target.port,
                path: rendered.path,
                body: rendered.body,
            })
        });
        let kept = self.kept_args(&plan.args);
        let (request, status, detail) = match (outcome, kept.as_ref().err()) {
            (Ok(stored), None) => (Some(stored), UndoStatus::Pending, None),
            (Err(why), _) => (None, UndoStatus::Unavailable, Some(why)),
            (Ok(_), Some(why)) => (None, UndoStatus::Unavailable, Some(why.clone())),
        };
        let args = kept.unwrap_or_else(|_| json!({}));
        let entry = Owned {
            id: call.request_id.to_owned(),
            session: call.principal.session_id.clone(),
            tool: tool.name().to_owned(),
            tier: tool.tier().as_str().to_owned(),
            // Who made the call, as policy saw them: an undo after the session ended is
            // decided for the same principal.
            subject: json!(call.principal).to_string(),
            args: args.to_string(),
            request: request.map(|r| json!(r).to_string()),
            status,
            detail: detail.clone(),
        };
        let stored = self
            .store
            .call(move |s| s.record(&entry.as_new(now_ms())))
            .await;
        let note = match (stored, detail) {
            (Ok(()), None) => "recorded".to_owned(),
            (Ok(()), Some(why)) => format!("unavailable: {why}"),
            (Err(e), _) => {
                tracing::error!(request_id = call.request_id, error = %e, "the undo of a call could not be recorded");
                format!("unrecorded: {e}")
            }
        };
        audit.update(|r| r.undo = Some(note));
        response
    }

    /// A kept value must not carry a secret: the journal is not a place for one, and an
    /// undo must not send one anywhere.
    fn check(&self, path: &str, body: Option<&Value>) -> Result<(), String> {
        let body = body.map(Value::to_string).unwrap_or_default();
        for text in [path, &body] {
            if let Some(finding) = self.detectors.scan(text.as_bytes()) {
                return Err(format!(
                    "a value the undo needs looks like a secret ({})",
                    finding.kind
                ));
            }
        }
        Ok(())
    }

    /// The arguments kept for the undo's decision: strings the detectors flag replaced
    /// by `"***"`, bounded by [`MAX_ARGS_BYTES`].
    fn kept_args(&self, args: &Value) -> Result<Value, String> {
        let secret = |s: &str| self.detectors.scan(s.as_bytes()).is_some();
        let (kept, _) = ostiary_policies::recorded::redact(args, &secret);
        if kept.to_string().len() > MAX_ARGS_BYTES {
            return Err(format!(
                "the call's arguments are over {} KiB: too large to keep for the undo's decision",
                MAX_ARGS_BYTES / 1024
            ));
        }
        Ok(kept)
    }
}

/// An entry, owned, to be written on the store's thread.
struct Owned {
    id: String,
    session: String,
    tool: String,
    tier: String,
    subject: String,
    args: String,
    request: Option<String>,
    status: UndoStatus,
    detail: Option<String>,
}

impl Owned {
    fn as_new(&self, recorded_ms: i64) -> NewUndo<'_> {
        NewUndo {
            id: &self.id,
            session: &self.session,
            recorded_ms,
            tool: &self.tool,
            tier: &self.tier,
            subject: &self.subject,
            args: &self.args,
            request: self.request.as_deref(),
            status: self.status,
            detail: self.detail.as_deref(),
        }
    }
}

/// Read the answer's body, up to [`MAX_RESPONSE_BYTES`]: the body to hand on (what was
/// read, then the rest as it streams) and the answer as JSON (`None` if it is not JSON), or
/// why it could not be read whole.
async fn read_answer(mut body: ProxyBody) -> (ProxyBody, Result<Option<Value>, String>) {
    let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = Vec::new();
    let mut data = BytesMut::new();
    let outcome = loop {
        match body.frame().await {
            None => break Ok(()),
            Some(Ok(frame)) => {
                if let Some(chunk) = frame.data_ref() {
                    data.extend_from_slice(chunk);
                }
                frames.push(Ok(frame));
                if data.len() > MAX_RESPONSE_BYTES {
                    break Err(format!(
                        "the answer is over {} KiB",
                        MAX_RESPONSE_BYTES / 1024
                    ));
                }
            }
            Some(Err(e)) => {
                frames.push(Err(e));
                break Err("the answer's body failed".to_owned());
            }
        }
    };
    let rest = BodyStream::new(body);
    let handed_on = body::stream(StreamBody::new(
        futures_util::stream::iter(frames).chain(rest),
    ));
    let answer = outcome.map(|()| serde_json::from_slice(&data).ok());
    (handed_on, answer)
}
