//! MCP over Streamable HTTP (DESIGN §4, §5): JSON-RPC to a catalogued MCP endpoint.
//!
//! An endpoint is catalogued when some `[[tool]]` has `match = { mcp = "<url>", tool }`; a
//! request is *to* it when its scheme, host, port and path equal the URL's (the query is not
//! compared: Streamable HTTP endpoints take none, and a query cannot be used to step around
//! the endpoint's rules because every POST body to that path is parsed).
//!
//! Only a `POST` carries JSON-RPC. Its body is read whole (bounded by
//! `proxy.max_tool_body_bytes`) and must be one JSON-RPC message or a batch (a JSON array of
//! at most [`MAX_BATCH`] of them); anything else is a `400 bad_request`. Each message is one
//! of:
//! - `tools/call` with `params.name` = an MCP tool the catalog lists *for this endpoint*:
//!   decided as `Action::"tool:<catalog name>"` with `args = params.arguments`;
//! - `tools/call` of a tool the catalog does not list for this endpoint: denied by default,
//!   without asking Cedar (there is no action to ask about);
//! - anything else (`initialize`, `ping`, `tools/list`, notifications, and responses the
//!   client sends back to server requests): decided once, as `Action::"http"` on the
//!   endpoint's host — the same decision the request would get without the catalog.
//!
//! Deciding is two steps ([`plan`]): Cedar decides every call ([`Exchange::decide`]), the
//! pipeline runs each allowed or escalated call's checks ([`plan::Decided::checked`]), and
//! then what is forwarded is worked out ([`plan::Decided::finish`]). A call policy or a
//! check escalates is listed in [`plan::Plan::escalated`]; the pipeline holds it in the
//! approval queue as that one call and its refusal becomes `approval_pending` (`-32002`).
//!
//! Refused calls are never forwarded. A lone refused call, or a batch whose calls are all
//! refused, is answered by the proxy ([`ProxyError::McpRefused`], rendered in
//! [`crate::respond`]). A batch with some allowed messages is forwarded without the refused
//! calls and the answer merged in [`reply`]. `GET` (the SSE stream) and `DELETE` (session
//! end) have no JSON-RPC body and stay plain `Action::"http"` requests.
//!
//! Each `tools/call` of a batch is also audited on its own ([`DecidedCall`], written by the
//! pipeline as a record of kind `mcp_call` under the request's id), so that a refused call
//! in a partly forwarded batch leaves a record; the request keeps its own `http` record.

pub mod plan;
pub mod reply;

use ostiary_policies::{Action, Catalog, PolicyEngine, SessionState, Tool, ToolMatch};
use serde_json::{Map, Value};

use crate::classify::Target;
use crate::error::ProxyError;
use crate::evaluate::{self, Verdict};
use crate::metrics::Metrics;
use crate::session::Principal;

/// The most messages one batch may hold. Each message is decided on its own, so the cap
/// bounds the work one request can cause regardless of how small its messages are; real
/// clients send a handful (MCP 2025-06-18 dropped batching altogether).
pub const MAX_BATCH: usize = 1000;

/// A catalogued MCP endpoint a request is addressed to.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The catalog's `mcp` URL, as written there.
    pub url: url::Url,
}

/// The catalogued MCP endpoint `target` is addressed to, if any.
pub fn endpoint(catalog: &Catalog, target: &Target) -> Option<Endpoint> {
    let host = target.host.to_string();
    catalog
        .tools()
        .iter()
        .find_map(|tool| match tool.matcher() {
            ToolMatch::Mcp { endpoint, .. }
                if endpoint.scheme() == target.scheme
                    && endpoint
                        .host_str()
                        .is_some_and(|h| h.eq_ignore_ascii_case(&host))
                    && endpoint.port_or_known_default() == Some(target.port)
                    && endpoint.path() == target.path =>
            {
                Some(Endpoint {
                    url: endpoint.clone(),
                })
            }
            _ => None,
        })
}

impl Endpoint {
    /// The catalog entry for the MCP tool `name` on this endpoint.
    pub fn tool<'a>(&self, catalog: &'a Catalog, name: &str) -> Option<&'a Tool> {
        catalog.tools().iter().find(|tool| {
            matches!(tool.matcher(), ToolMatch::Mcp { endpoint, tool } if *endpoint == self.url && tool == name)
        })
    }
}

/// What one JSON-RPC message asks for, as far as policy is concerned.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `tools/call`; `id` is `None` for a (strange, but legal) notification.
    Call {
        id: Option<Value>,
        name: String,
        args: Value,
    },
    /// `tools/list` with this id: its answer is filtered.
    List { id: Value },
    /// Everything else.
    Other,
}

/// A parsed JSON-RPC POST body.
#[derive(Debug)]
pub struct Exchange {
    messages: Vec<(Value, Kind)>,
    batch: bool,
}

/// Parse a POST body to an MCP endpoint. serde_json's recursion limit (128) turns deeply
/// nested JSON into a parse error; the body limit and [`MAX_BATCH`] bound the rest.
pub fn parse(bytes: &[u8]) -> Result<Exchange, ProxyError> {
    // serde_json's error names line and column, never the content.
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ProxyError::bad_request(format!("JSON-RPC body: {e}")))?;
    let (values, batch) = match value {
        Value::Array(items) if items.is_empty() => {
            return Err(ProxyError::bad_request("JSON-RPC batch is empty"))
        }
        Value::Array(items) if items.len() > MAX_BATCH => {
            return Err(ProxyError::bad_request(format!(
                "JSON-RPC batch of {} messages is larger than the {MAX_BATCH} this proxy decides",
                items.len()
            )))
        }
        Value::Array(items) => (items, true),
        other => (vec![other], false),
    };
    let messages = values
        .into_iter()
        .enumerate()
        .map(|(i, value)| {
            let kind = kind(&value).map_err(|reason| {
                let at = if batch {
                    format!("JSON-RPC message {i}")
                } else {
                    "JSON-RPC message".to_owned()
                };
                ProxyError::bad_request(format!("{at}: {reason}"))
            })?;
            Ok((value, kind))
        })
        .collect::<Result<_, ProxyError>>()?;
    Ok(Exchange { messages, batch })
}

fn kind(value: &Value) -> Result<Kind, &'static str> {
    let Value::Object(message) = value else {
        return Err("not a JSON object");
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err("`jsonrpc` is not \"2.0\"");
    }
    let id = message.get("id").cloned();
    if id
        .as_ref()
        .is_some_and(|id| !(id.is_string() || id.is_number() || id.is_null()))
    {
        return Err("`id` is not a string or number");
    }
    let Some(method) = message.get("method") else {
        // A response the client sends back to a server request (sampling, elicitation):
        // legal on this endpoint and not a tool call.
        return if id.is_some() && (message.contains_key("result") || message.contains_key("error"))
        {
            Ok(Kind::Other)
        } else {
            Err("no `method`")
        };
    };
    let Some(method) = method.as_str() else {
        return Err("`method` is not a string");
    };
    match method {
        "tools/call" => {
            let params = message.get("params").and_then(Value::as_object);
            let name = params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .ok_or("tools/call without a string `params.name`")?;
            let args = match params.and_then(|p| p.get("arguments")) {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(args @ Value::Object(_)) => args.clone(),
                Some(_) => return Err("tools/call `params.arguments` is not an object"),
            };
            Ok(Kind::Call {
                id,
                name: name.to_owned(),
                args,
            })
        }
        "tools/list" => Ok(id.map_or(Kind::Other, |id| Kind::List { id })),
        _ => Ok(Kind::Other),
    }
}

/// Who asks, and under which policies: what deciding a call needs.
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    pub engine: &'a PolicyEngine,
    pub metrics: &'a Metrics,
    pub principal: &'a Principal,
    pub target: &'a Target,
    /// `context.session`: what the session used before this request.
    pub session: SessionState,
}

impl Asker<'_> {
    /// Decide a call of the MCP tool `name` on `endpoint` with `args`; `approval` is the
    /// approver of a held call being executed.
    pub fn call(
        &self,
        endpoint: &Endpoint,
        name: &str,
        args: Value,
        approval: Option<String>,
    ) -> Result<Verdict, ProxyError> {
        let Some(tool) = endpoint.tool(self.engine.catalog(), name) else {
            return Err(unknown_tool(self.target, name));
        };
        let action = Action::Tool {
            name: tool.name().to_owned(),
            impact_records: tool.impact_records(&args).unwrap_or(0),
            cost_micros: tool.cost_micros(),
            session: self.session,
            approval,
            args,
        };
        evaluate::decide_or_escalate(
            self.engine,
            self.metrics,
            self.principal,
            &self.target.host,
            action,
        )
    }
}

/// The default deny of a tool the catalog does not list for this endpoint. No policy
/// decided it, so `policies` is empty; the action is the one the request would have been
/// decided as, had the catalog not claimed the endpoint.
fn unknown_tool(target: &Target, name: &str) -> ProxyError {
    ProxyError::Denied {
        policies: Vec::new(),
        action: format!("{}::Action::\"http\"", ostiary_policies::schema::NAMESPACE),
        resource: format!(
            "{}::Host::{:?}",
            ostiary_policies::schema::NAMESPACE,
            target.host.to_string()
        ),
        reason: format!(
            "the MCP tool {name:?} is not in the tool catalog for this endpoint, and unknown \
             tools are denied by default"
        ),
    }
}

impl Exchange {
    /// The one `tools/call` of a body holding exactly that (a held call being executed):
    /// its id, the agent's tool name and arguments.
    pub fn single_call(&self) -> Option<(Option<&Value>, &str, &Value)> {
        match self.messages.as_slice() {
            [(_, Kind::Call { id, name, args })] if !self.batch => {
                Some((id.as_ref(), name.as_str(), args))
            }
            _ => None,
        }
    }

    /// Whether any message is decided as `Action::"http"` (everything but `tools/call`).
    pub fn needs_http(&self) -> bool {
        self.messages
            .iter()
            .any(|(_, kind)| !matches!(kind, Kind::Call { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(text: &str) -> Result<Vec<Kind>, ProxyError> {
        parse(text.as_bytes()).map(|e| e.messages.into_iter().map(|(_, k)| k).collect())
    }

    #[test]
    fn messages_are_classified() {
        let k = kinds(
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":1}}},
                {"jsonrpc":"2.0","id":"l","method":"tools/list"},
                {"jsonrpc":"2.0","method":"notifications/initialized"},
                {"jsonrpc":"2.0","id":7,"result":{}}]"#,
        )
        .unwrap();
        assert_eq!(
            k,
            vec![
                Kind::Call {
                    id: Some(json!(1)),
                    name: "a".into(),
                    args: json!({"x": 1})
                },
                Kind::List { id: json!("l") },
                Kind::Other,
                Kind::Other,
            ]
        );
        let k = kinds(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}"#)
            .unwrap();
        assert!(matches!(&k[0], Kind::Call { args, .. } if *args == json!({})));
    }

    #[test]
    fn malformed_json_rpc_is_a_bad_request() {
        let nested = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let too_many = format!(
            "[{}]",
            vec![r#"{"jsonrpc":"2.0","method":"ping","id":1}"#; MAX_BATCH + 1].join(",")
        );
        for text in [
            "not json",
            "[]",
            "1",
            r#"{"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":[1]}}"#,
            &nested,
            &too_many,
        ] {
            let err = kinds(text).unwrap_err();
            assert!(
                matches!(err, ProxyError::BadRequest { .. }),
                "{text:.60}: {err}"
            );
        }
    }
}
