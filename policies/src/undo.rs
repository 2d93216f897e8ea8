//! A tool's `undo`: the request that reverses a call of it, as a template over the call's
//! arguments and its response (docs/undo.md).
//!
//! ```toml
//! undo = { method = "DELETE", path = "/records/{response.id}" }
//! undo = { method = "PATCH", path = "/repos/{args.owner}/{args.repo}/issues/{response.number}",
//!          body = { state = "closed" } }
//! ```
//! A placeholder is `{args.<name>[.<key>…]}` or `{response.<key>[.<key>…]}` (a key that is
//! a number indexes an array). In the path each value fills its place percent-encoded, so
//! that a value (the agent's argument, the upstream's answer) can never add a segment, a
//! query or a fragment; `.` and `..` are refused outright. In the body, a string that is
//! exactly one placeholder takes the value as it is (a number stays a number); a string
//! with text around a placeholder takes it as text.
//!
//! Checked when the catalog loads; rendered by the proxy when a call succeeds, and what it
//! renders is what is kept and, on `ostiary sessions undo`, sent.

use serde_json::Value;

use std::collections::HashSet;

use crate::args::{self, RecordType};
use crate::catalog::{Tier, ToolMatch, ToolProblem};

/// Where a placeholder's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `args.<name>…`: the call's arguments (path parameters, query, JSON body).
    Args,
    /// `response.<key>…`: the upstream's JSON answer to the call.
    Response,
}

/// One `{…}` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placeholder {
    source: Source,
    keys: Vec<String>,
}

impl Placeholder {
    fn parse(text: &str) -> Result<Self, String> {
        let mut parts = text.split('.');
        let source = match parts.next() {
            Some("args") => Source::Args,
            Some("response") => Source::Response,
            _ => {
                return Err(format!(
                    "{{{text}}}: a placeholder is {{args.<name>}} or {{response.<key>}}"
                ))
            }
        };
        let keys: Vec<String> = parts.map(str::to_owned).collect();
        if keys.is_empty() {
            return Err(format!("{{{text}}}: name what it takes ({{{text}.<key>}})"));
        }
        if let Some(bad) = keys.iter().find(|k| !is_key(k)) {
            return Err(format!(
                "{{{text}}}: key {bad:?} must be letters, digits, `_` or `-`"
            ));
        }
        if source == Source::Args && !args::is_identifier(&keys[0]) {
            return Err(format!(
                "{{{text}}}: {:?} is not an argument name (letters, digits, `_`)",
                keys[0]
            ));
        }
        Ok(Self { source, keys })
    }

    fn lookup<'v>(&self, values: &Values<'v>) -> Result<&'v Value, RenderError> {
        let (mut at, what) = match self.source {
            Source::Args => (values.args, "args"),
            Source::Response => (
                values.response.ok_or_else(|| RenderError::Missing {
                    placeholder: self.to_string(),
                    why: "the response is not JSON".into(),
                })?,
                "response",
            ),
        };
        for key in &self.keys {
            let next = match at {
                Value::Object(map) => map.get(key),
                Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
                _ => None,
            };
            at = next.ok_or_else(|| RenderError::Missing {
                placeholder: self.to_string(),
                why: format!("the {what} has no such value"),
            })?;
        }
        Ok(at)
    }
}

impl std::fmt::Display for Placeholder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match self.source {
            Source::Args => "args",
            Source::Response => "response",
        };
        write!(f, "{{{source}.{}}}", self.keys.join("."))
    }
}

fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

/// A piece of a template string.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Value(Placeholder),
}

/// A string with placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err(format!("{text:?}: `}}` without `{{`"));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("{text:?}: `{{` without `}}`"))?;
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let inner = &rest[open + 1..open + close];
            if inner.contains('{') {
                return Err(format!("{text:?}: placeholders do not nest"));
            }
            pieces.push(Piece::Value(Placeholder::parse(inner)?));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Ok(Self { pieces })
    }

    fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Value(ph) => Some(ph),
            Piece::Text(_) => None,
        })
    }

    /// Rendered as text, each value passed through `encode`.
    fn text(
        &self,
        values: &Values<'_>,
        encode: impl Fn(&Placeholder, &str) -> Result<String, RenderError>,
    ) -> Result<String, RenderError> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Value(ph) => out.push_str(&encode(ph, &scalar(ph, ph.lookup(values)?)?)?),
            }
        }
        Ok(out)
    }
}

/// A value as text: only strings, numbers and booleans fill a place in text.
fn scalar(ph: &Placeholder, value: &Value) -> Result<String, RenderError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(RenderError::Missing {
            placeholder: ph.to_string(),
            why: format!(
                "the value is {}, not a string, number or boolean",
                args::kind(other)
            ),
        }),
    }
}

/// The values a template is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct Values<'v> {
    /// The call's arguments.
    pub args: &'v Value,
    /// The upstream's answer, if it was JSON.
    pub response: Option<&'v Value>,
}

/// Why a call's undo could not be rendered (it is then recorded as unavailable). Names the
/// placeholder, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("{placeholder}: {why}")]
    Missing { placeholder: String, why: String },
    #[error("{placeholder}: the value may not be empty, `.` or `..` in a path")]
    Segment { placeholder: String },
}

/// The undo request of one call, rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub method: String,
    /// Path and query, every value percent-encoded.
    pub path: String,
    pub body: Option<Value>,
}

/// A checked `undo` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoSpec {
    method: String,
    path: Template,
    body: Option<Value>,
}

impl UndoSpec {
    /// Check an `undo` entry: an uppercase method, a path starting with `/` whose
    /// placeholders are well formed, and a body whose strings' placeholders are.
    pub fn parse(method: &str, path: &str, body: Option<Value>) -> Result<Self, String> {
        if method.is_empty() || !method.chars().all(|c| c.is_ascii_uppercase()) {
            return Err(format!(
                "method {method:?} must be an uppercase HTTP method (\"DELETE\")"
            ));
        }
        if !path.starts_with('/') || path.contains('#') {
            return Err(format!(
                "path {path:?} must start with `/` and hold no fragment"
            ));
        }
        let path = Template::parse(path).map_err(|e| format!("path {e}"))?;
        if let Some(body) = &body {
            let mut problem = Ok(());
            each_string(body, &mut |s| {
                if problem.is_ok() {
                    problem = Template::parse(s).map(drop);
                }
            });
            problem.map_err(|e| format!("body: {e}"))?;
        }
        Ok(Self {
            method: method.to_owned(),
            path,
            body,
        })
    }

    pub fn method(&self) -> &str {
        &self.method
    }

    /// Every `args.<name>` the template reads (the first key: the argument itself).
    pub fn arg_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        self.each_placeholder(&mut |ph| {
            if ph.source == Source::Args {
                names.push(ph.keys[0].clone());
            }
        });
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Whether it reads the call's response (then the proxy must read the answer's body
    /// to record it).
    pub fn reads_response(&self) -> bool {
        let mut reads = false;
        self.each_placeholder(&mut |ph| reads |= ph.source == Source::Response);
        reads
    }

    fn each_placeholder(&self, f: &mut dyn FnMut(&Placeholder)) {
        self.path.placeholders().for_each(&mut *f);
        if let Some(body) = &self.body {
            each_string(body, &mut |s| {
                if let Ok(t) = Template::parse(s) {
                    t.placeholders().for_each(&mut *f);
                }
            });
        }
    }

    /// The undo request of a call with these values.
    pub fn render(&self, values: &Values<'_>) -> Result<Rendered, RenderError> {
        let path = self.path.text(values, |ph, value| {
            if value.is_empty() || value == "." || value == ".." {
                return Err(RenderError::Segment {
                    placeholder: ph.to_string(),
                });
            }
            Ok(encode(value))
        })?;
        let body = match &self.body {
            Some(body) => Some(render_value(body, values)?),
            None => None,
        };
        Ok(Rendered {
            method: self.method.clone(),
            path,
            body,
        })
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters: a value fills exactly
/// the place it was put in.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn each_string(value: &Value, f: &mut dyn FnMut(&str)) {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|v| each_string(v, f)),
        Value::Object(map) => map.values().for_each(|v| each_string(v, f)),
        _ => {}
    }
}

fn render_value(value: &Value, values: &Values<'_>) -> Result<Value, RenderError> {
    Ok(match value {
        Value::String(s) => {
            // Checked at load: every string of the body parses.
            let template = Template::parse(s).map_err(|why| RenderError::Missing {
                placeholder: s.clone(),
                why,
            })?;
            match template.pieces.as_slice() {
                [Piece::Value(ph)] => ph.lookup(values)?.clone(),
                _ => Value::String(template.text(values, |_, v| Ok(v.to_owned()))?),
            }
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| render_value(v, values))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), render_value(v, values)?)))
                .collect::<Result<_, RenderError>>()?,
        ),
        other => other.clone(),
    })
}

/// `undo = { method, path, body }` as written in `tools.toml`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUndo {
    method: String,
    path: String,
    body: Option<Value>,
}

/// An `undo` is a REST request to the tool's own host, for a tool that can be reversed,
/// reading only arguments the tool has (when its arguments are declared).
pub(crate) fn check(
    undo: RawUndo,
    (tier, reversible): (Tier, Option<bool>),
    matcher: &ToolMatch,
    declared: Option<&RecordType>,
) -> Result<UndoSpec, ToolProblem> {
    let problem = |m: String| ToolProblem::Undo(m);
    if tier == Tier::Irreversible {
        return Err(problem(
            "an irreversible tool has no undo (tier = \"irreversible\" says it cannot be reversed)"
                .into(),
        ));
    }
    if reversible == Some(false) {
        return Err(problem(
            "the tool says reversible = false, yet declares how to reverse it".into(),
        ));
    }
    if matches!(matcher, ToolMatch::Mcp { .. }) {
        return Err(problem(
            "an undo is a REST request to the tool's host; MCP tools cannot declare one".into(),
        ));
    }
    let spec = UndoSpec::parse(&undo.method, &undo.path, undo.body).map_err(problem)?;
    // Without a schema the arguments are whatever the agent sent: any name may be there.
    if let Some(args) = declared {
        let known: HashSet<&str> = args.names().collect();
        if let Some(missing) = spec
            .arg_names()
            .into_iter()
            .find(|n| !known.contains(n.as_str()))
        {
            return Err(problem(format!(
                "{{args.{missing}}}: the tool has no argument {missing:?} (neither its path nor its args_schema names one)"
            )));
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(method: &str, path: &str, body: Option<Value>) -> UndoSpec {
        UndoSpec::parse(method, path, body).unwrap()
    }

    #[test]
    fn renders_path_and_body_from_args_and_response() {
        let s = spec(
            "PATCH",
            "/repos/{args.owner}/{args.repo}/issues/{response.number}",
            Some(
                json!({"state": "closed", "n": "{response.number}", "why": "undo of #{response.number}"}),
            ),
        );
        let args = json!({"owner": "acme", "repo": "site"});
        let response = json!({"number": 42});
        let r = s
            .render(&Values {
                args: &args,
                response: Some(&response),
            })
            .unwrap();
        assert_eq!(r.method, "PATCH");
        assert_eq!(r.path, "/repos/acme/site/issues/42");
        assert_eq!(
            r.body,
            Some(json!({"state": "closed", "n": 42, "why": "undo of #42"}))
        );
        assert!(s.reads_response());
        assert_eq!(s.arg_names(), ["owner", "repo"]);
    }

    #[test]
    fn a_value_never_adds_a_segment_query_or_fragment() {
        let s = spec("DELETE", "/records/{response.id}", None);
        for (id, want) in [
            ("a/../../admin", "/records/a%2F..%2F..%2Fadmin"),
            ("x?all=1#f", "/records/x%3Fall%3D1%23f"),
            ("%2e%2e", "/records/%252e%252e"),
            ("é", "/records/%C3%A9"),
        ] {
            let response = json!({ "id": id });
            let r = s
                .render(&Values {
                    args: &json!({}),
                    response: Some(&response),
                })
                .unwrap();
            assert_eq!(r.path, want);
        }
        for id in ["", ".", ".."] {
            let response = json!({ "id": id });
            let e = s
                .render(&Values {
                    args: &json!({}),
                    response: Some(&response),
                })
                .unwrap_err();
            assert!(matches!(e, RenderError::Segment { .. }), "{id:?}: {e}");
        }
    }

    #[test]
    fn missing_and_unusable_values_name_the_placeholder_not_the_value() {
        let s = spec("DELETE", "/records/{response.data.0.id}", None);
        let cases = [
            (None, "not JSON"),
            (Some(json!({"data": []})), "no such value"),
            (
                Some(json!({"data": [{"id": {"secret": "x"}}]})),
                "an object",
            ),
            (Some(json!({"data": [{"id": null}]})), "null"),
        ];
        for (response, want) in cases {
            let e = s
                .render(&Values {
                    args: &json!({}),
                    response: response.as_ref(),
                })
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("{response.data.0.id}") && e.contains(want),
                "{e}"
            );
            assert!(!e.contains("secret"), "{e}");
        }
        let r = s
            .render(&Values {
                args: &json!({}),
                response: Some(&json!({"data": [{"id": 7}]})),
            })
            .unwrap();
        assert_eq!(r.path, "/records/7");
    }

    #[test]
    fn bad_templates_are_refused_at_load() {
        for (method, path, body, want) in [
            ("delete", "/r", None, "uppercase"),
            ("", "/r", None, "uppercase"),
            ("DELETE", "r/{response.id}", None, "start with `/`"),
            ("DELETE", "/r#{response.id}", None, "fragment"),
            ("DELETE", "/r/{response.id", None, "without `}`"),
            ("DELETE", "/r/response.id}", None, "without `{`"),
            ("DELETE", "/r/{response}", None, "name what it takes"),
            ("DELETE", "/r/{secrets.x}", None, "a placeholder is"),
            ("DELETE", "/r/{args.a b}", None, "must be letters"),
            ("DELETE", "/r/{args.9x}", None, "not an argument name"),
            ("DELETE", "/r/{response..id}", None, "must be letters"),
            ("DELETE", "/r/{{response.id}}", None, "do not nest"),
            (
                "POST",
                "/r",
                Some(json!({"a": ["{nope.x}"]})),
                "body: {nope.x}",
            ),
        ] {
            let e = UndoSpec::parse(method, path, body).unwrap_err();
            assert!(e.contains(want), "{method} {path}: {e}");
        }
    }

    #[test]
    fn a_template_without_response_values_does_not_read_the_answer() {
        let s = spec("DELETE", "/records/{args.id}?force=true", None);
        assert!(!s.reads_response());
        let r = s
            .render(&Values {
                args: &json!({"id": "r 1"}),
                response: None,
            })
            .unwrap();
        assert_eq!(r.path, "/records/r%201?force=true");
    }
}
