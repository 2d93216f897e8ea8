//! A held `tools/call` as the 2026-07-28 revision lets a long-running request be followed
//! up: a multi-round-trip result (`resultType: "input_required"`, SEP-2322) carrying only
//! an opaque `requestState`, which the client echoes back on its retry of the same call.
//!
//! Clients of earlier revisions get the `-32002 approval_pending` JSON-RPC error and collect
//! with `Ostiary-Approval` ([`crate::escalate::redeem`]); a client that says it speaks
//! 2026-07-28 (`MCP-Protocol-Version`) gets the result instead, and its SDK retries on its
//! own (with a backoff, for as many rounds as it is configured to), so an agent waits on a
//! human without a client timeout and without knowing Ostiary's headers. The state names
//! the approval (`ostiary-approval:<id>`); a retry carrying it is a collection — decided
//! when held and again when executed, it is compared with the held call and answered by
//! the proxy, never forwarded. A `requestState` that is not Ostiary's is the server's and
//! goes through untouched.

use http::{HeaderMap, Method, Request};
use serde_json::{json, Value};

use crate::body::{self, ProxyBody};
use crate::error::ProxyError;

/// The first revision whose clients follow an `input_required` result up.
const FIRST_REVISION: &str = "2026-07-28";

/// What an Ostiary `requestState` starts with; the approval id follows.
const STATE_PREFIX: &str = "ostiary-approval:";

/// Whether the client of this exchange speaks a revision that follows `input_required`
/// results up. Revisions are dates, so they order as strings.
pub fn follows_up(headers: &HeaderMap) -> bool {
    headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.len() == FIRST_REVISION.len() && v >= FIRST_REVISION)
}

/// The result a held call is answered with: the state to echo, and the hold (the body an
/// HTTP refusal carries) in `_meta` for clients that want to show who is asked.
pub fn input_required(id: &Value, approval_id: &str, hold: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {
            "resultType": "input_required",
            "requestState": format!("{STATE_PREFIX}{approval_id}"),
            "_meta": { "dev.ostiary/approval": hold },
        },
    })
}

/// The approval a retry follows up, when `req` is a POST whose JSON-RPC body is a
/// `tools/call` echoing an Ostiary `requestState`. The body is read (bounded by `limit`)
/// and put back as it was, for the collection or the usual phases to read again; a body
/// that does not parse is left for the MCP parser to refuse.
pub async fn followed_up(
    req: &mut Request<ProxyBody>,
    limit: usize,
) -> Result<Option<String>, ProxyError> {
    if req.method() != Method::POST || !follows_up(req.headers()) {
        return Ok(None);
    }
    let bytes = crate::recognise::read_body(req, limit).await?;
    let state = crate::strict_json::parse(&bytes).ok().and_then(|message| {
        (message.get("method")?.as_str()? == "tools/call")
            .then(|| {
                message
                    .get("params")?
                    .get("requestState")?
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten()
    });
    *req.body_mut() = body::full(bytes);
    Ok(state.and_then(|s| s.strip_prefix(STATE_PREFIX).map(str::to_owned)))
}

/// A `tools/call` as compared with the call held: what was asked (method, tool,
/// arguments), not how this round of asking was numbered or annotated — the JSON-RPC id,
/// the echoed state, input responses and `_meta` differ from round to round.
pub fn as_asked(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(object) = message.as_object_mut() {
        object.remove("id");
        if let Some(params) = object.get_mut("params").and_then(Value::as_object_mut) {
            for key in ["requestState", "inputResponses", "_meta"] {
                params.remove(key);
            }
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(version: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("mcp-protocol-version", version.parse().unwrap());
        headers
    }

    #[test]
    fn only_clients_of_the_2026_revision_on_are_answered_with_a_follow_up() {
        assert!(follows_up(&headers("2026-07-28")));
        assert!(follows_up(&headers("2027-01-01")));
        assert!(!follows_up(&headers("2025-11-25")));
        assert!(!follows_up(&headers("2025-06-18")));
        assert!(!follows_up(&HeaderMap::new()));
        // Not a revision: a longer string sorting after it is not taken for one.
        assert!(!follows_up(&headers("2026-07-28-beta")));
        assert!(!follows_up(&headers("9")));
    }

    #[test]
    fn a_round_is_compared_without_what_changes_between_rounds() {
        let held = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "delete_file", "arguments": {"path": "/a"}}});
        let retry = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                           "params": {"name": "delete_file", "arguments": {"path": "/a"},
                                      "requestState": "ostiary-approval:x",
                                      "_meta": {"progressToken": 3}}});
        assert_eq!(as_asked(&held), as_asked(&retry));
        let other = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                           "params": {"name": "delete_file", "arguments": {"path": "/b"},
                                      "requestState": "ostiary-approval:x"}});
        assert_ne!(as_asked(&held), as_asked(&other));
    }
}
