//! MCP over Streamable HTTP (docs/design.md §4, §5): JSON-RPC to a catalogued MCP endpoint.
//!
//! An endpoint is catalogued when some `[[tool]]` has `match = { mcp = "<url>", tool }`; a
//! request is *to* it when its scheme, host, port and path equal the URL's, the path up to a
//! trailing slash (the query is not compared: Streamable HTTP endpoints take none, and a
//! query cannot be used to step around the endpoint's rules because every POST body to that
//! path is parsed). A path that only a lenient server routes to the endpoint (`//mcp`,
//! `/mcp;x`, [`crate::path_forms::routed`], or `/MCP` where paths are routed ignoring case)
//! is refused rather than decided as plain `http`.
//!
//! Only a `POST` carries JSON-RPC. Its body is read whole (bounded by
//! `proxy.max_tool_body_bytes`) and must be one JSON-RPC message or a batch (a JSON array of
//! at most [`MAX_BATCH`] of them), parsed strictly ([`crate::strict_json`]: duplicate or
//! case-folded keys are refused, since the server's decoder may read the other one);
//! anything else is a `400 bad_request`. `Mcp-Method` and `Mcp-Name` headers (the stateless
//! 2026-07-28 revision) must agree with the body, which is what decides. Each message is one
//! of:
//! - `tools/call` with `params.name` = an MCP tool the catalog lists *for this endpoint*:
//!   decided as `Action::"tool:<catalog name>"` with `args = params.arguments`;
//! - `tools/call` of a tool the catalog does not list for this endpoint: denied by default,
//!   without asking Cedar (there is no action to ask about);
//! - anything else (`initialize`, `ping`, `tools/list`, notifications, `resources/read`,
//!   `prompts/get`, vendor methods, and responses the client sends back to server requests):
//!   decided on its own as `Action::"mcp"` on the endpoint's host, with `context.method`
//!   the JSON-RPC method (empty for a response) and `context.server` the endpoint's URL.
//!
//! Deciding is two steps ([`plan`]): Cedar decides every message ([`Exchange::decide`]), the
//! pipeline runs each allowed or escalated call's checks ([`plan::Decided::checked`]), and
//! then what is forwarded is worked out ([`plan::Decided::finish`]). A call policy or a
//! check escalates is listed in [`plan::Plan::escalated`]; the pipeline holds it in the
//! approval queue as that one call and its refusal becomes `approval_pending` (`-32002`),
//! or for a 2026-07-28 client a result it follows up ([`rounds`]).
//!
//! Refused messages are never forwarded. A lone refused request, or a batch whose messages
//! are all refused, is answered by the proxy ([`ProxyError::McpRefused`], rendered in
//! [`crate::respond`]); a refused notification has no id to answer, so a POST of nothing
//! but refused notifications gets the refusal as an HTTP error. A batch with some allowed
//! messages is forwarded without the refused ones and the answer merged in [`reply`]. `GET`
//! (the SSE stream) and `DELETE` (session end) have no JSON-RPC body and stay plain
//! `Action::"http"` requests.
//!
//! Each `tools/call` of a batch is also audited on its own ([`DecidedCall`], written by the
//! pipeline as a record of kind `mcp_call` under the request's id), so that a refused call
//! in a partly forwarded batch leaves a record; the request keeps its own `http` record.

pub mod plan;
pub mod reply;
pub mod rounds;

use http::HeaderMap;
use ostiary_policies::recorded::Kept;
use ostiary_policies::{Action, Catalog, PolicyEngine, SessionState, Tool, ToolMatch};
use serde_json::{Map, Value};

use crate::classify::Target;
use crate::error::ProxyError;
use crate::evaluate::{self, Verdict};
use crate::metrics::Metrics;
use crate::path_forms;
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

/// The catalogued MCP endpoint `target` is addressed to, if any; a refusal when only a
/// lenient server would route its path to one.
pub fn endpoint(catalog: &Catalog, target: &Target) -> Result<Option<Endpoint>, ProxyError> {
    let found = endpoint_at(
        catalog,
        target,
        path_forms::trim_trailing(&target.path),
        false,
    );
    let routed = path_forms::routed(&target.path);
    if let Some(routed) = &routed {
        if let Some(other) = endpoint_at(catalog, target, routed, false) {
            return Err(ProxyError::bad_request(format!(
                "the path is ambiguous: upstreams that merge slashes, cut `;` parameters or \
                 decode %2F (once or twice) route it to the MCP endpoint {}; send that path",
                other.url
            )));
        }
    }
    if found.is_none() {
        // Express (the TypeScript SDK's usual host) and ASP.NET Core route paths ignoring
        // case: `/MCP` reaches the endpoint there.
        let lenient = routed
            .as_deref()
            .unwrap_or(path_forms::trim_trailing(&target.path));
        if let Some(other) = endpoint_at(catalog, target, lenient, true) {
            return Err(ProxyError::bad_request(format!(
                "the path is ambiguous: it differs only in letter case from the MCP endpoint \
                 {}, which upstreams that route paths ignoring case run; send that path",
                other.url
            )));
        }
    }
    Ok(found)
}

/// The endpoint at `path` on `target`'s origin; with `ignoring_case`, compared as servers
/// that route paths case-insensitively compare them.
fn endpoint_at(
    catalog: &Catalog,
    target: &Target,
    path: &str,
    ignoring_case: bool,
) -> Option<Endpoint> {
    // Compared in place: every request to a catalogued host passes here.
    let host: std::borrow::Cow<'_, str> = match &target.host {
        crate::egress::address::Host::Name(name) => name.as_str().into(),
        ip => ip.to_string().into(),
    };
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
                    && same_path(
                        path_forms::trim_trailing(endpoint.path()),
                        path,
                        ignoring_case,
                    ) =>
            {
                Some(Endpoint {
                    url: endpoint.clone(),
                })
            }
            _ => None,
        })
}

fn same_path(endpoint: &str, path: &str, ignoring_case: bool) -> bool {
    if ignoring_case {
        endpoint.eq_ignore_ascii_case(path)
    } else {
        endpoint == path
    }
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
    /// Any other message, decided as `Action::"mcp"`: its JSON-RPC `method` (empty for a
    /// response to a server request); `list` is the id of a `tools/list` request, whose
    /// answer is filtered.
    Message { method: String, list: Option<Value> },
}

/// A parsed JSON-RPC POST body.
#[derive(Debug)]
pub struct Exchange {
    messages: Vec<(Value, Kind)>,
    batch: bool,
}

/// Parse a POST body to an MCP endpoint, with the request's headers (`Mcp-Method`,
/// `Mcp-Name` must agree with it). serde_json's recursion limit (128) turns deeply nested
/// JSON into a parse error; the body limit and [`MAX_BATCH`] bound the rest.
pub fn parse(headers: &HeaderMap, bytes: &[u8]) -> Result<Exchange, ProxyError> {
    // The error names line and column, or the ambiguous keys, never a value.
    let value = crate::strict_json::parse(bytes)
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
    let exchange = Exchange { messages, batch };
    exchange.agrees_with(headers)?;
    Ok(exchange)
}

/// The stateless revision's routing headers: a server (or a gateway in front of it) may
/// route on them without reading the body, so one that says something else than the body
/// would be decided as one thing and run as another.
const MCP_METHOD: &str = "mcp-method";
const MCP_NAME: &str = "mcp-name";
const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";

impl Exchange {
    /// Refuse `Mcp-Method`/`Mcp-Name` headers that disagree with the body (or are given
    /// twice, or with a batch, which they cannot describe).
    fn agrees_with(&self, headers: &HeaderMap) -> Result<(), ProxyError> {
        // The revision says how a held call is answered (`rounds`) and how the server
        // reads the body: two of them would be read one way here and maybe another there.
        // `Mcp_Method` is `Mcp-Method` to CGI, WSGI, PHP and Rack servers
        // (`HTTP_MCP_METHOD`), so both spellings are one header here.
        let all = |name: &'static str| {
            headers
                .iter()
                .filter(move |(n, _)| crate::inject::header_key(n) == name)
                .map(|(_, v)| v)
        };
        if all(MCP_PROTOCOL_VERSION).nth(1).is_some() {
            return Err(ProxyError::bad_request(format!(
                "{MCP_PROTOCOL_VERSION} is given twice"
            )));
        }
        for name in [MCP_METHOD, MCP_NAME] {
            let mut values = all(name);
            let Some(value) = values.next() else {
                continue;
            };
            if values.next().is_some() {
                return Err(ProxyError::bad_request(format!("{name} is given twice")));
            }
            let (message, kind) = match self.messages.as_slice() {
                [one] if !self.batch => one,
                _ => {
                    return Err(ProxyError::bad_request(format!(
                        "{name} names one message; the body is a batch"
                    )))
                }
            };
            let said = value.to_str().unwrap_or_default();
            let body = match name {
                MCP_METHOD => Some(kind.method().to_owned()),
                _ => message_name(message),
            };
            if body.as_deref() != Some(said) {
                return Err(ProxyError::bad_request(format!(
                    "{name} says {said:?} but the body says {}: the body decides, and the two must agree",
                    body.map_or_else(|| "nothing".to_owned(), |b| format!("{b:?}"))
                )));
            }
        }
        Ok(())
    }
}

/// What `Mcp-Name` stands for in a message: `params.name` (tools, prompts) or `params.uri`
/// (resources).
fn message_name(message: &Value) -> Option<String> {
    let params = message.get("params")?;
    params
        .get("name")
        .or_else(|| params.get("uri"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

impl Kind {
    /// The JSON-RPC method (empty for a response).
    fn method(&self) -> &str {
        match self {
            Kind::Call { .. } => "tools/call",
            Kind::Message { method, .. } => method,
        }
    }
}

/// The members of a JSON-RPC message, and of a `tools/call`'s `params`, that decide.
const ENVELOPE: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];
const CALL_PARAMS: [&str; 3] = ["name", "arguments", "_meta"];

/// Whether `object` has a key that differs only in case from one of `members` (`Params`,
/// `Arguments`): the decision reads the member as spelled, a case-insensitive decoder on
/// the server reads that key as the member.
fn misspells(object: &Map<String, Value>, members: &[&str]) -> bool {
    object.keys().any(|key| {
        !members.contains(&key.as_str())
            && members
                .iter()
                .any(|m| ostiary_policies::args::same_folded(m, key))
    })
}

fn kind(value: &Value) -> Result<Kind, &'static str> {
    let Value::Object(message) = value else {
        return Err("not a JSON object");
    };
    if misspells(message, &ENVELOPE) {
        return Err(
            "ambiguous: a member differs only in case from `jsonrpc`, `id`, `method`, \
                    `params`, `result` or `error`, which case-insensitive servers read it as",
        );
    }
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
        // legal on this endpoint and not a tool call; decided with an empty method.
        return if id.is_some() && (message.contains_key("result") || message.contains_key("error"))
        {
            Ok(Kind::Message {
                method: String::new(),
                list: None,
            })
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
            if params.is_some_and(|p| misspells(p, &CALL_PARAMS)) {
                return Err("ambiguous: a member of `params` differs only in case from \
                            `name`, `arguments` or `_meta`, which case-insensitive servers read \
                            it as");
            }
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
        "" => Err("`method` is empty"),
        other => Ok(Kind::Message {
            method: other.to_owned(),
            list: id.filter(|_| other == "tools/list"),
        }),
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
    pub session: &'a SessionState,
    /// The approver of a held call being executed (`context.approval`); `None` live.
    pub approval: Option<&'a str>,
    /// `context.session.recent` of each tool (by catalog name) a call may name; a tool not
    /// in it, or no map, is decided with the session's as it is.
    pub recent: Option<&'a std::collections::HashMap<String, ostiary_policies::Recent>>,
    /// Keep each decision for its audit record (replay, the shadow set), argument strings
    /// these detectors flag redacted; `None`: keep nothing.
    pub keep: Option<&'a crate::check::dlp::Detectors>,
}

impl Asker<'_> {
    /// Whether an argument string is a credential (kept decisions redact it).
    fn secret(&self, s: &str) -> bool {
        self.keep
            .is_some_and(|detectors| detectors.scan(s.as_bytes()).is_some())
    }

    /// Decide a message other than `tools/call` on `endpoint` (`Action::"mcp"`).
    pub fn message(&self, endpoint: &Endpoint, method: &str) -> Result<Verdict, ProxyError> {
        self.message_keeping(endpoint, method, &mut None)
    }

    /// [`Self::message`], the decision kept in `kept` when the asker keeps decisions.
    pub fn message_keeping(
        &self,
        endpoint: &Endpoint,
        method: &str,
        kept: &mut Option<Kept>,
    ) -> Result<Verdict, ProxyError> {
        let action = Action::Mcp {
            method: method.to_owned(),
            server: endpoint.url.to_string(),
        };
        let secret = |s: &str| self.secret(s);
        evaluate::decide_keeping(
            self.engine,
            self.metrics,
            self.principal,
            self.session,
            &self.target.host,
            action,
            self.keep.map(|_| (kept, &secret as &dyn Fn(&str) -> bool)),
        )
    }

    /// Decide a call of the MCP tool `name` on `endpoint` with `args`; `approval` is the
    /// approver of a held call being executed.
    pub fn call(
        &self,
        endpoint: &Endpoint,
        name: &str,
        args: Value,
        approval: Option<String>,
    ) -> Result<Verdict, ProxyError> {
        self.call_keeping(endpoint, name, args, approval, &mut None)
    }

    /// [`Self::call`], the decision kept in `kept` when the asker keeps decisions.
    pub fn call_keeping(
        &self,
        endpoint: &Endpoint,
        name: &str,
        args: Value,
        approval: Option<String>,
        kept: &mut Option<Kept>,
    ) -> Result<Verdict, ProxyError> {
        let Some(tool) = endpoint.tool(self.engine.catalog(), name) else {
            return Err(unknown_tool(self.target, name));
        };
        crate::recognise::spelled_as_declared(tool, &args)?;
        let action = Action::Tool {
            name: tool.name().to_owned(),
            // Before policy: a count it cannot read refuses the call (`400` in its JSON-RPC
            // error), never decided as 0.
            impact_records: tool
                .impact_records(&args)
                .map_err(|e| ProxyError::bad_request(e.to_string()))?,
            cost_micros: tool.cost_micros(),
            approval,
            args,
            undo: false,
        };
        let with_recent;
        let session = match self.recent.and_then(|r| r.get(tool.name())) {
            Some(recent) => {
                with_recent = SessionState {
                    recent: *recent,
                    ..self.session.clone()
                };
                &with_recent
            }
            None => self.session,
        };
        let secret = |s: &str| self.secret(s);
        evaluate::decide_keeping(
            self.engine,
            self.metrics,
            self.principal,
            session,
            &self.target.host,
            action,
            self.keep.map(|_| (kept, &secret as &dyn Fn(&str) -> bool)),
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

    /// The tool names (the agent's, as sent) of the body's `tools/call` messages.
    pub fn call_names(&self) -> impl Iterator<Item = &str> {
        self.messages.iter().filter_map(|(_, kind)| match kind {
            Kind::Call { name, .. } => Some(name.as_str()),
            _ => None,
        })
    }

    /// Whether any message is session plumbing rather than a `tools/call` (rated, and
    /// watched, as the request it travels in).
    pub fn has_plumbing(&self) -> bool {
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
        parse(&HeaderMap::new(), text.as_bytes())
            .map(|e| e.messages.into_iter().map(|(_, k)| k).collect())
    }

    fn message(method: &str, list: Option<Value>) -> Kind {
        Kind::Message {
            method: method.into(),
            list,
        }
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
                message("tools/list", Some(json!("l"))),
                message("notifications/initialized", None),
                message("", None),
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

    #[test]
    fn ambiguous_json_rpc_is_refused_before_policy() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"del"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read","Name":"delete"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"path":"/a","PATH":"/etc"}}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","ID":3}]"#,
            // One member alone, spelled in another case than the protocol's: the server
            // reads it, the decision would not.
            r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"del"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"del"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Arguments":{"path":"/etc"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","ARGUMENTS":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"NAME":"a"}}"#,
            r#"{"JSONRPC":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","Id":1,"method":"ping"}"#,
        ] {
            let err = kinds(text).unwrap_err();
            assert!(
                matches!(&err, ProxyError::BadRequest { reason } if reason.contains("ambiguous")),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn members_beyond_the_envelope_are_left_to_the_server() {
        // `_meta`, vendor members and a member that only resembles one are not ambiguous.
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{},"_meta":{"progressToken":1}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","methods":["x"],"x-vendor":1}"#,
        ] {
            assert!(kinds(text).is_ok(), "{text}");
        }
    }

    #[test]
    fn routing_headers_must_agree_with_the_body() {
        let call =
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file"}}"#;
        let read =
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}"#;
        let headers = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            h
        };
        let ok = |h: HeaderMap, body: &str| parse(&h, body.as_bytes()).is_ok();
        assert!(ok(headers(&[("Mcp-Method", "tools/call")]), call));
        assert!(ok(
            headers(&[("mcp-method", "tools/call"), ("Mcp-Name", "read_file")]),
            call
        ));
        assert!(ok(headers(&[("Mcp-Name", "file:///a")]), read));
        for (h, body) in [
            (headers(&[("Mcp-Method", "ping")]), call),
            (headers(&[("Mcp-Method", "Tools/Call")]), call),
            (headers(&[("Mcp-Name", "delete_file")]), call),
            (headers(&[("Mcp-Name", "file:///etc/passwd")]), read),
            (
                headers(&[("Mcp-Method", "tools/call"), ("Mcp-Method", "tools/call")]),
                call,
            ),
            (
                headers(&[
                    ("MCP-Protocol-Version", "2026-07-28"),
                    ("mcp-protocol-version", "2025-06-18"),
                ]),
                call,
            ),
            (
                headers(&[("Mcp-Method", "ping")]),
                "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
            ),
            (
                headers(&[("Mcp-Name", "x")]),
                r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            ),
            // CGI, WSGI, PHP and Rack read `_` as `-` in header names.
            (
                headers(&[("Mcp_Method", "tools/call")]),
                r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            ),
            (
                headers(&[("mcp-method", "tools/call"), ("mcp_method", "tools/call")]),
                call,
            ),
        ] {
            let err = parse(&h, body.as_bytes()).unwrap_err();
            assert!(
                matches!(err, ProxyError::BadRequest { .. }),
                "{h:?} {body}: {err}"
            );
        }
    }
}
