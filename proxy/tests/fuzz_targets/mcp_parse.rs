//! MCP/JSON-RPC parsing: `mcp::parse` on raw bytes and generated messages.

use super::*;

// ---------------------------------------------------------------------------------------
// MCP / JSON-RPC
// ---------------------------------------------------------------------------------------

/// The longest `400` reason `mcp::parse` may give. Its reasons are fixed sentences, a
/// message index, serde_json's line/column and, for an ambiguity, the two keys shortened to
/// a bounded length; they must never grow with the agent's body, which is echoed into error
/// responses and audit records.
const MAX_REASON: usize = 320;

/// The documented shape of one JSON-RPC message (mcp.rs module docs), written out
/// independently of the parser: `Some(true)` for a `tools/call`, `Some(false)` for any other
/// accepted message, `None` for a message `parse` must refuse.
fn expected_kind(message: &Value) -> Option<bool> {
    let message = message.as_object()?;
    if message.get("jsonrpc") != Some(&json!("2.0")) {
        return None;
    }
    let id = message.get("id");
    if id.is_some_and(|id| !matches!(id, Value::String(_) | Value::Number(_) | Value::Null)) {
        return None;
    }
    let Some(method) = message.get("method") else {
        let response = message.contains_key("result") || message.contains_key("error");
        return (id.is_some() && response).then_some(false);
    };
    match method.as_str()? {
        // An empty method would be confused with a response's (decided as method "").
        "" => None,
        "tools/call" => {
            let params = message.get("params")?.as_object()?;
            params.get("name")?.as_str()?;
            match params.get("arguments") {
                None | Some(Value::Null | Value::Object(_)) => Some(true),
                Some(_) => None,
            }
        }
        _ => Some(false),
    }
}

/// Checks `mcp::parse(bytes)` against the documented contract.
fn check_mcp(bytes: &[u8]) {
    let parsed = mcp::parse(&http::HeaderMap::new(), bytes);
    // The oracle parses with serde_json too, so nesting beyond its recursion limit is
    // refused by both; a body the reference finds ambiguous must be refused whatever its
    // shape.
    let value: Option<Value> = serde_json::from_slice(bytes)
        .ok()
        .filter(|_| !super::strict_json::ambiguous_reference(bytes));
    let expected: Option<Vec<bool>> = value.as_ref().and_then(|value| match value {
        Value::Array(items) if items.is_empty() || items.len() > mcp::MAX_BATCH => None,
        Value::Array(items) => items.iter().map(expected_kind).collect(),
        single => expected_kind(single).map(|kind| vec![kind]),
    });
    match (parsed, expected) {
        (Ok(exchange), Some(kinds)) => {
            let batch = matches!(value, Some(Value::Array(_)));
            let lone_call = !batch && kinds == [true];
            assert_eq!(exchange.single_call().is_some(), lone_call);
            assert_eq!(exchange.has_plumbing(), kinds.contains(&false));
            if let (Some((id, name, args)), Some(Value::Object(message))) =
                (exchange.single_call(), &value)
            {
                // The decided call is the one in the body: same id, name and arguments.
                assert_eq!(id, message.get("id"));
                assert_eq!(Some(name), message["params"]["name"].as_str());
                match message["params"].get("arguments") {
                    None | Some(Value::Null) => assert_eq!(args, &json!({})),
                    Some(given) => assert_eq!(args, given),
                }
            }
        }
        (Err(ProxyError::BadRequest { reason }), None) => {
            assert!(
                reason.len() <= MAX_REASON,
                "a {}-byte reason for a {}-byte body: {reason}",
                reason.len(),
                bytes.len()
            );
        }
        (Ok(_), None) => panic!("accepted a body the contract refuses: {bytes:?}"),
        (Err(e), Some(_)) => panic!("refused a valid JSON-RPC body ({e}): {bytes:?}"),
        (Err(e), None) => panic!("refused with {} instead of bad_request: {e}", e.kind()),
    }
}

#[test]
fn mcp_parse_arbitrary_bytes() {
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| check_mcp(bytes));
}

/// A JSON scalar.
#[derive(Debug, TypeGenerator)]
enum Leaf {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

/// JSON up to two levels of nesting. bolero skips a value whose lists nest past its depth
/// limit, so a freely recursive type is mostly skipped; deep nesting is covered by the
/// byte-level target and by `mcp_parse_regressions`.
#[derive(Debug, TypeGenerator)]
enum Json {
    Leaf(Leaf),
    Array(Vec<Inner>),
    Object(Vec<(String, Inner)>),
}

#[derive(Debug, TypeGenerator)]
enum Inner {
    Leaf(Leaf),
    Array(Vec<Leaf>),
    Object(Vec<(String, Leaf)>),
}

impl Leaf {
    fn value(&self) -> Value {
        match self {
            Leaf::Null => Value::Null,
            Leaf::Bool(b) => json!(b),
            Leaf::Int(i) => json!(i),
            // Non-finite floats become null, as serde_json would serialise them.
            Leaf::Float(f) => json!(f),
            Leaf::Str(s) => json!(s),
        }
    }
}

impl Inner {
    fn value(&self) -> Value {
        match self {
            Inner::Leaf(leaf) => leaf.value(),
            Inner::Array(items) => items.iter().map(Leaf::value).collect(),
            Inner::Object(fields) => fields
                .iter()
                .map(|(k, v)| (k.clone(), v.value()))
                .collect::<Map<_, _>>()
                .into(),
        }
    }
}

impl Json {
    fn value(&self) -> Value {
        match self {
            Json::Leaf(leaf) => leaf.value(),
            Json::Array(items) => items.iter().map(Inner::value).collect(),
            Json::Object(fields) => fields
                .iter()
                .map(|(k, v)| (k.clone(), v.value()))
                .collect::<Map<_, _>>()
                .into(),
        }
    }
}

#[derive(Debug, TypeGenerator)]
enum RpcMethod {
    Call,
    List,
    Ping,
    Named(String),
}

/// One JSON-RPC message, well-formed unless `damage` applies (one in four messages), so
/// that batches of several messages are still often accepted. Once bolero's byte budget is
/// spent every further byte is 0, so 0 must mean "well-formed" and `damage` comes first.
#[derive(Debug, TypeGenerator)]
struct Message {
    damage: (u8, u8, Option<Json>),
    id: Option<Option<String>>,
    method: RpcMethod,
    name: String,
    arguments: Option<Vec<(String, Json)>>,
    result: Option<Json>,
    extra: Vec<(String, Json)>,
}

impl Message {
    fn value(&self) -> Value {
        let mut m: Map<String, Value> = self
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), v.value()))
            .collect();
        m.insert("jsonrpc".into(), json!("2.0"));
        if let Some(id) = &self.id {
            m.insert("id".into(), id.as_ref().map_or(json!(7), |s| json!(s)));
        }
        let method = match &self.method {
            RpcMethod::Call => "tools/call",
            RpcMethod::List => "tools/list",
            RpcMethod::Ping => "ping",
            RpcMethod::Named(n) => n,
        };
        m.insert("method".into(), json!(method));
        let mut params = Map::new();
        params.insert("name".into(), json!(self.name));
        if let Some(args) = &self.arguments {
            let args: Map<String, Value> =
                args.iter().map(|(k, v)| (k.clone(), v.value())).collect();
            params.insert("arguments".into(), args.into());
        }
        if let Some(result) = &self.result {
            m.insert("result".into(), result.value());
        }
        // Damage replaces one field the contract looks at with any JSON, or removes it.
        let (when, what, json) = &self.damage;
        let (fields, key) = match what % 5 {
            0 => (&mut m, "jsonrpc"),
            1 => (&mut m, "id"),
            2 => (&mut m, "method"),
            3 => (&mut params, "name"),
            _ => (&mut params, "arguments"),
        };
        if when % 4 == 1 {
            match json {
                Some(json) => fields.insert(key.into(), json.value()),
                None => fields.remove(key),
            };
        }
        m.insert("params".into(), params.into());
        m.into()
    }
}

#[test]
fn mcp_parse_structured_messages() {
    check!()
        .with_type::<(bool, Vec<Message>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(single, messages)| {
            let body = match (single, messages.first()) {
                (true, Some(first)) => first.value(),
                // Small batches: every message must be well-formed for the batch to be.
                _ => messages.iter().take(6).map(Message::value).collect(),
            };
            check_mcp(&serde_json::to_vec(&body).unwrap());
        });
}

#[test]
fn mcp_parse_regressions() {
    // A batch one over the cap, and JSON nested past serde_json's recursion limit: both a
    // short bad_request, whatever their size.
    let ping = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    check_mcp(format!("[{}]", vec![ping; mcp::MAX_BATCH + 1].join(",")).as_bytes());
    check_mcp(format!("[{}]", vec![ping; mcp::MAX_BATCH].join(",")).as_bytes());
    check_mcp(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).as_bytes());
    check_mcp(format!("\"{}", "x".repeat(100_000)).as_bytes());
}
