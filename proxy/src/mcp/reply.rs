//! The answer to a forwarded MCP POST: `tools/list` results filtered to the tools this
//! session may call, and the proxy's errors for refused calls merged into a batch answer.
//!
//! - `application/json`: read whole (bounded by [`MAX_REPLY_BYTES`]), filtered, merged
//!   (the refused calls' errors are appended to the upstream's array; a single upstream
//!   answer — the proxy forwards a lone survivor unbatched — is wrapped into one).
//! - `text/event-stream`: the refused calls' errors go out first, as one `message` event
//!   each (a batch's answers may arrive as separate events in any order, so clients match
//!   them by id), then the upstream's events. Events are parsed incrementally; only an event
//!   carrying the answer to a forwarded `tools/list` is rewritten, every other event passes
//!   through byte for byte. One event may be at most [`MAX_EVENT_BYTES`]; once every
//!   `tools/list` has been answered the stream is passed through unparsed.
//! - `202 Accepted` with refused calls (everything forwarded was a notification): the
//!   proxy answers `200` with the errors alone.
//! - Anything else (an upstream error status, another content type) passes through
//!   unchanged: the refused calls were not executed, and the client learns of the failure
//!   from the upstream's own answer.
//!
//! The upstream's answer reaches this module scrubbed, but what it rewrites is decoded
//! and serialised anew (`\u002B` becomes `+`), so every rewritten answer is scrubbed once
//! more as written, with the same [`Scrubber`].
//!
//! A listed tool stays when its call with empty arguments would be allowed or escalated
//! (docs/design.md §4: escalatable tools stay), or cannot be decided without arguments (its
//! schema requires some): the list is a courtesy to the agent, every call is still decided
//! on its own. Tools the catalog does not list for the endpoint are removed.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::BodyExt;
use ostiary_policies::PolicyEngine;
use serde_json::Value;

use super::{Asker, Endpoint};
use crate::body::filter::{ChunkFilter, Filtered};
use crate::body::{self, ProxyBody};
use crate::classify::Target;
use crate::error::{McpRefusal, ProxyError};
use crate::metrics::Metrics;
use crate::respond;
use crate::scrub::Scrubber;
use crate::session::Principal;

/// The largest JSON answer read to filter or merge it.
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;
/// The largest single SSE event buffered while looking for a `tools/list` answer.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Decides, after the fact, which listed tools the session may see.
#[derive(Debug)]
pub struct ToolFilter {
    pub engine: Arc<PolicyEngine>,
    pub metrics: Arc<Metrics>,
    pub principal: Principal,
    /// `context.session` as the listing request found it: the list is a courtesy, decided
    /// as a call made now would be (a child sees what a child may call).
    pub session: ostiary_policies::SessionState,
    pub target: Target,
    pub endpoint: Endpoint,
}

impl ToolFilter {
    fn keep(&self, name: &str) -> bool {
        let asker = Asker {
            engine: &self.engine,
            metrics: &self.metrics,
            principal: &self.principal,
            target: &self.target,
            // Every call is still decided with the session's usage when it is made.
            session: &self.session,
            approval: None,
            // A listing is not a call: no tool's recent calls are counted against it.
            recent: None,
            // Nor is it a decision the trail keeps.
            keep: None,
        };
        // Allowed and escalatable tools stay listed (a call is decided when it is made).
        matches!(
            asker.call(
                &self.endpoint,
                name,
                Value::Object(Default::default()),
                None
            ),
            Ok(_) | Err(ProxyError::CheckFailed { .. })
        )
    }

    /// Filter `message` if it answers one of `listed` (removing that id). Whether it did.
    fn apply(&self, message: &mut Value, listed: &mut Vec<Value>) -> bool {
        let Some(pos) = message
            .get("id")
            .and_then(|id| listed.iter().position(|l| l == id))
        else {
            return false;
        };
        let Some(tools) = message
            .get_mut("result")
            .and_then(|r| r.get_mut("tools"))
            .and_then(Value::as_array_mut)
        else {
            return false;
        };
        listed.swap_remove(pos);
        tools.retain(|tool| {
            tool.get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| self.keep(name))
        });
        true
    }

    /// [`Self::apply`] to one message or each message of a batch.
    fn apply_all(&self, value: &mut Value, listed: &mut Vec<Value>) -> bool {
        match value {
            Value::Array(items) => {
                // Every item, not the first hit: one batch answer may hold several lists.
                let mut hit = false;
                for item in items {
                    hit |= self.apply(item, listed);
                }
                hit
            }
            one => self.apply(one, listed),
        }
    }
}

/// What to do with the upstream's answer.
#[derive(Debug)]
pub struct ReplyPlan {
    /// The refused calls' JSON-RPC errors.
    pub refused: Vec<Value>,
    /// Ids of forwarded `tools/list` requests.
    pub listed: Vec<Value>,
    pub filter: Arc<ToolFilter>,
}

impl ReplyPlan {
    /// A plan, or `None` when the answer passes through untouched.
    pub fn new(
        refused: &[McpRefusal],
        listed: Vec<Value>,
        filter: ToolFilter,
        request_id: &str,
    ) -> Option<Self> {
        if refused.is_empty() && listed.is_empty() {
            return None;
        }
        Some(Self {
            refused: refused
                .iter()
                .map(|r| respond::jsonrpc_error(&r.id, &r.error, request_id))
                .collect(),
            listed,
            filter: Arc::new(filter),
        })
    }

    /// Ask the upstream for an uncompressed answer: a compressed one could not be filtered.
    pub fn prepare(headers: &mut HeaderMap) {
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }

    /// Filter and merge the upstream's answer; what is rewritten is scrubbed with
    /// `scrubber` (the one the answer was scrubbed with) as it is written.
    pub async fn apply(
        self,
        response: Response<ProxyBody>,
        scrubber: Option<&Scrubber>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let media = crate::recognise::media_type(response.headers()).unwrap_or_default();
        let status = response.status();
        let (mut parts, incoming) = response.into_parts();
        if status == StatusCode::ACCEPTED && !self.refused.is_empty() {
            parts.status = StatusCode::OK;
            parts.headers.remove(CONTENT_LENGTH);
            parts
                .headers
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            let body = Value::Array(self.refused).to_string();
            return Ok(Response::from_parts(parts, body::full(body)));
        }
        if !status.is_success() {
            return Ok(Response::from_parts(parts, incoming));
        }
        match media.as_str() {
            "application/json" => {
                let bytes = collect(incoming, MAX_REPLY_BYTES).await?;
                let body = self.rewrite_json(bytes, scrubber)?;
                parts.headers.remove(CONTENT_LENGTH);
                Ok(Response::from_parts(parts, body::full(body)))
            }
            "text/event-stream" => {
                parts.headers.remove(CONTENT_LENGTH);
                let prelude: Vec<u8> = self
                    .refused
                    .iter()
                    .flat_map(|e| format!("event: message\ndata: {e}\n\n").into_bytes())
                    .collect();
                let filter = SseFilter {
                    buffer: Vec::new(),
                    scanned: 0,
                    listed: self.listed,
                    filter: self.filter,
                    scrubber: scrubber.cloned(),
                };
                let body = Filtered::wrap(incoming, filter).with_prefix(Bytes::from(prelude));
                Ok(Response::from_parts(parts, body.boxed()))
            }
            _ => Ok(Response::from_parts(parts, incoming)),
        }
    }

    fn rewrite_json(self, bytes: Bytes, scrubber: Option<&Scrubber>) -> Result<Bytes, ProxyError> {
        let mut value: Value = match serde_json::from_slice(&bytes) {
            Ok(value) => value,
            // Not ours to judge when nothing needs merging: pass it on as it came.
            Err(_) if self.refused.is_empty() => return Ok(bytes),
            Err(e) => {
                return Err(ProxyError::Upstream {
                    reason: format!("the MCP server's JSON answer does not parse: {e}"),
                })
            }
        };
        let mut listed = self.listed;
        self.filter.apply_all(&mut value, &mut listed);
        if !self.refused.is_empty() {
            let mut items = match value {
                Value::Array(items) => items,
                one => vec![one],
            };
            items.extend(self.refused);
            value = Value::Array(items);
        }
        Ok(Bytes::from(rescrub(scrubber, value.to_string())))
    }
}

/// The whole upstream body, refused past `limit`.
async fn collect(mut incoming: ProxyBody, limit: usize) -> Result<Bytes, ProxyError> {
    let mut buffer = Vec::new();
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|e| ProxyError::Upstream {
            reason: format!("reading the MCP server's answer: {e}"),
        })?;
        if let Ok(data) = frame.into_data() {
            if buffer.len() + data.len() > limit {
                return Err(ProxyError::Upstream {
                    reason: format!("the MCP server's answer is larger than {limit} bytes"),
                });
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buffer))
}

/// The events of an SSE body that answer `listed` rewritten, the rest passed through.
struct SseFilter {
    /// Bytes of the event being assembled.
    buffer: Vec<u8>,
    /// How much of `buffer` holds no event end, so each byte is scanned once.
    scanned: usize,
    listed: Vec<Value>,
    filter: Arc<ToolFilter>,
    /// What a rewritten event is scrubbed with.
    scrubber: Option<Scrubber>,
}

/// What an SSE answer ends with when one event outgrows the buffer.
#[derive(Debug, thiserror::Error)]
#[error("an SSE event from the MCP server is larger than {MAX_EVENT_BYTES} bytes")]
struct EventTooLarge;

/// `text` written by the proxy from decoded upstream data, scrubbed.
fn rescrub(scrubber: Option<&Scrubber>, text: String) -> String {
    match scrubber {
        Some(scrubber) => scrubber.scrub_text(text),
        None => text,
    }
}

/// The end (exclusive) of the first complete event in `buf`, searching from `from`: a blank
/// line, `\n\n` or `\r\n\r\n`. (A bare-CR line ending is not recognised; such a stream
/// fails at [`MAX_EVENT_BYTES`] while a `tools/list` answer is awaited.)
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find_map(|i| {
        let blank = buf[i] == b'\n'
            && ((i >= 1 && buf[i - 1] == b'\n') || (i >= 3 && &buf[i - 3..i] == b"\r\n\r"));
        blank.then_some(i + 1)
    })
}

impl SseFilter {
    /// The event as it goes out: rewritten when it answers a listed request.
    fn rewrite(&mut self, event: Vec<u8>) -> Bytes {
        let Ok(text) = std::str::from_utf8(&event) else {
            return Bytes::from(event);
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        let data: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            return Bytes::from(event);
        }
        let Ok(mut value) = serde_json::from_str::<Value>(&data.join("\n")) else {
            return Bytes::from(event);
        };
        if !self.filter.apply_all(&mut value, &mut self.listed) {
            return Bytes::from(event);
        }
        let mut out = String::new();
        let mut data_written = false;
        for line in lines {
            if line.starts_with("data:") {
                if !data_written {
                    out.push_str(&format!("data: {value}\n"));
                    data_written = true;
                }
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push('\n');
        Bytes::from(rescrub(self.scrubber.as_ref(), out))
    }
}

impl ChunkFilter for SseFilter {
    type Error = EventTooLarge;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), EventTooLarge> {
        if self.listed.is_empty() {
            // Every list answered: the rest goes out as it comes.
            out.push_back(chunk);
            return Ok(());
        }
        if self.buffer.len() + chunk.len() > MAX_EVENT_BYTES {
            return Err(EventTooLarge);
        }
        self.buffer.extend_from_slice(&chunk);
        while let Some(end) = event_end(&self.buffer, self.scanned) {
            let rest = self.buffer.split_off(end);
            let event = std::mem::replace(&mut self.buffer, rest);
            self.scanned = 0;
            out.push_back(self.rewrite(event));
            if self.listed.is_empty() {
                out.push_back(Bytes::from(std::mem::take(&mut self.buffer)));
                return Ok(());
            }
        }
        self.scanned = self.buffer.len().saturating_sub(3);
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), EventTooLarge> {
        // An unterminated last event cannot be an answer to dispatch; pass it on.
        out.push_back(Bytes::from(std::mem::take(&mut self.buffer)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ends_are_found() {
        assert_eq!(event_end(b"data: x\n\nrest", 0), Some(9));
        assert_eq!(event_end(b"data: x\r\n\r\nrest", 0), Some(11));
        assert_eq!(event_end(b"data: x\n", 0), None);
        assert_eq!(event_end(b"a\n\n", 2), Some(3));
    }
}
