//! Phase `recognise`: whether a classified request is a call of a catalogued REST tool, and
//! if it is, its arguments (DESIGN §4).
//!
//! A request is a call of the first `[[tool]]` in `tools.toml` (file order) whose REST route
//! matches: the route's host equals the canonical target host, its method equals the
//! request's, and its path template matches the raw path, segment for segment, exactly as
//! received (the path that policy sees and the upstream gets, see [`crate::classify`]).
//! Scheme and port are not part of a route, so a call cannot leave its tool's policies by
//! taking another port. A request no route matches stays `Action::"http"`.
//!
//! The arguments of a call are one JSON object, built from three sources:
//! - **path parameters** (`{owner}` in the template): strings, percent-decoded;
//! - **query parameters**: strings, `application/x-www-form-urlencoded` decoded; of a repeated
//!   key only the first value counts (`?a=1&a=2` gives `a = "1"`), the way most frameworks
//!   read a scalar parameter;
//! - **the JSON body's members**: the body must be empty or a JSON object (by
//!   `Content-Type: application/json` or `*+json`, or no `Content-Type` at all); any other body
//!   is refused, since arguments that cannot be read cannot be checked.
//!
//! On a conflict, path parameters win over everything (the route itself is the most
//! authoritative statement of what is acted on), and body members win over query
//! parameters (the body is where a REST API takes its arguments; the query usually carries
//! options).
//!
//! Only a recognised call's body is read: it is buffered up to `proxy.max_tool_body_bytes`
//! (a larger one is refused before or while reading and never forwarded) and the buffered
//! bytes are forwarded unchanged. Bodies of all other requests keep streaming untouched.
//! JSON nesting is bounded by serde_json's recursion limit (128), so a deeply nested body is
//! a parse error, not a stack overflow.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use ostiary_policies::{Action, Catalog, SessionState, Tool, ToolMatch};
use serde_json::{Map, Value};

use crate::body::{self, ProxyBody};
use crate::classify::Target;
use crate::error::ProxyError;

/// A request recognised as a call of a catalogued REST tool, before its body is read.
#[derive(Debug)]
pub struct Route<'a> {
    pub tool: &'a Tool,
    /// Path parameters, as they appear in the path (still percent-encoded).
    params: Vec<(String, String)>,
}

/// A recognised call with its arguments.
#[derive(Debug)]
pub struct ToolCall<'a> {
    pub tool: &'a Tool,
    pub args: Value,
    /// The body as read (what is forwarded), for checks that scan it.
    pub body: Bytes,
}

/// The first REST route in `catalog` that `target` matches.
pub fn route<'a>(catalog: &'a Catalog, target: &Target) -> Option<Route<'a>> {
    let host = target.host.to_string();
    catalog
        .tools()
        .iter()
        .find_map(|tool| match tool.matcher() {
            ToolMatch::Rest {
                host: route_host,
                method,
                path,
            } if *route_host == host && method == target.method.as_str() => path
                .captures(&target.path)
                .map(|params| Route { tool, params }),
            _ => None,
        })
}

/// Whether `host` (canonical text) serves any catalogued REST tool.
pub fn serves_tools(catalog: &Catalog, host: &str) -> bool {
    catalog
        .tools()
        .iter()
        .any(|tool| matches!(tool.matcher(), ToolMatch::Rest { host: h, .. } if h == host))
}

impl<'a> Route<'a> {
    /// Read the call's body (bounded by `limit`), put it back buffered for forwarding, and
    /// assemble the arguments.
    pub async fn read(
        self,
        req: &mut Request<ProxyBody>,
        target: &Target,
        limit: usize,
    ) -> Result<ToolCall<'a>, ProxyError> {
        let bytes = read_body(req, limit).await?;
        let mut args = body_args(req.headers(), &bytes)?;
        *req.body_mut() = body::full(bytes.clone());
        for (key, value) in url::form_urlencoded::parse(target.query.as_bytes()) {
            // Body members win over query parameters, and the first of a repeated key wins.
            args.entry(key.into_owned())
                .or_insert_with(|| Value::String(value.into_owned()));
        }
        for (name, raw) in self.params {
            let value = percent_decode(&raw).ok_or_else(|| {
                ProxyError::bad_request(format!(
                    "path parameter {{{name}}} is not valid percent-encoded UTF-8"
                ))
            })?;
            // Path parameters always win.
            args.insert(name, Value::String(value));
        }
        Ok(ToolCall {
            tool: self.tool,
            args: Value::Object(args),
            body: bytes,
        })
    }
}

impl ToolCall<'_> {
    /// The Cedar action of this call; `approval` is the approver once a human approved it
    /// (`context.approval.granted`), `None` when the agent asks.
    /// The Cedar action of this call; `session` is what the session used before it
    /// (`context.session`).
    pub fn action(self, approval: Option<String>, session: SessionState) -> Action {
        Action::Tool {
            name: self.tool.name().to_owned(),
            // No extractor, or nothing usable at its pointer: the call touches no counted
            // records as far as policy can tell.
            impact_records: self.tool.impact_records(&self.args).unwrap_or(0),
            cost_micros: self.tool.cost_micros(),
            session,
            approval,
            args: self.args,
        }
    }
}

/// The whole body, or a refusal if it is larger than `limit`. A declared `Content-Length`
/// over the limit is refused before anything is read.
pub(crate) async fn read_body(
    req: &mut Request<ProxyBody>,
    limit: usize,
) -> Result<Bytes, ProxyError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let mut body = std::mem::replace(req.body_mut(), body::empty());
    // Read frame by frame rather than through `http_body_util::Limited`, whose error
    // conversion trips rustc's higher-ranked `Send` check in the connection futures.
    let mut buffer = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProxyError::bad_request(format!("request body: {e}")))?;
        // Trailers of a tool call are not forwarded: the buffered body carries data only.
        if let Ok(data) = frame.into_data() {
            if buffer.len() + data.len() > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buffer))
}

/// The members of the body, which must be empty or a JSON object.
fn body_args(headers: &HeaderMap, bytes: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    if bytes.is_empty() {
        return Ok(Map::new());
    }
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        });
    if let Some(ct) = content_type.filter(|ct| !is_json(ct)) {
        return Err(ProxyError::bad_request(format!(
            "the body of a tool call must be JSON, not {ct}"
        )));
    }
    // serde_json's error names line and column, never the content.
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ProxyError::bad_request(
            "the JSON body of a tool call must be an object",
        )),
        Err(e) => Err(ProxyError::bad_request(format!("JSON body: {e}"))),
    }
}

fn is_json(content_type: &str) -> bool {
    content_type == "application/json"
        || content_type
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// `%XX` decoding of a path segment (`+` is literal in a path); `None` for a malformed
/// escape or bytes that are not UTF-8.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    const CATALOG: &str = r#"
        [[tool]]
        name = "gh.create_issue"
        tier = "write"
        match = { host = "api.example.test", method = "POST", path = "/repos/{owner}/{repo}/issues" }

        [[tool]]
        name = "gh.get_repo"
        tier = "read"
        match = { host = "api.example.test", method = "GET", path = "/repos/{owner}/{repo}" }

        [[tool]]
        name = "gh.any_repo"
        tier = "read"
        match = { host = "api.example.test", method = "GET", path = "/repos/{owner}/{repo}" }
    "#;

    fn target(method: Method, host: &str, path: &str, query: &str) -> Target {
        Target {
            scheme: "https",
            host: crate::egress::address::normalize_host(host).unwrap(),
            port: 443,
            method,
            path: path.into(),
            query: query.into(),
        }
    }

    fn catalog() -> Catalog {
        Catalog::parse("tools.toml", CATALOG, None).unwrap()
    }

    fn name(t: &Target) -> Option<String> {
        let catalog = catalog();
        route(&catalog, t).map(|r| r.tool.name().to_owned())
    }

    #[test]
    fn routes_match_on_host_method_and_path() {
        let t = |m, p| target(m, "API.example.test", p, "");
        assert_eq!(
            name(&t(Method::POST, "/repos/a/b/issues")).as_deref(),
            Some("gh.create_issue")
        );
        // First match wins.
        assert_eq!(
            name(&t(Method::GET, "/repos/a/b")).as_deref(),
            Some("gh.get_repo")
        );
        assert_eq!(name(&t(Method::GET, "/repos/a/b/issues")), None);
        assert_eq!(name(&t(Method::POST, "/repos/a/issues")), None);
        assert_eq!(name(&t(Method::POST, "/repos/a/b/issues/")), None);
        assert_eq!(name(&t(Method::POST, "/repos//b/issues")), None);
        assert_eq!(
            name(&target(Method::GET, "other.test", "/repos/a/b", "")),
            None
        );
    }

    async fn args(path: &str, query: &str, content_type: Option<&str>, body: &str) -> Value {
        let catalog = catalog();
        let t = target(Method::POST, "api.example.test", path, query);
        let mut req = Request::post("/")
            .body(body::full(body.to_owned()))
            .unwrap();
        if let Some(ct) = content_type {
            req.headers_mut().insert(CONTENT_TYPE, ct.parse().unwrap());
        }
        let call = route(&catalog, &t)
            .unwrap()
            .read(&mut req, &t, 1024)
            .await
            .unwrap();
        let forwarded = std::mem::replace(req.body_mut(), body::empty())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(forwarded, body.as_bytes(), "the buffered body is forwarded");
        call.args
    }

    #[tokio::test]
    async fn arguments_merge_path_body_and_query() {
        let a = args(
            "/repos/o%20x/r/issues",
            "title=q&extra=1&extra=2&owner=q",
            Some("application/json; charset=utf-8"),
            r#"{"title": "b", "owner": "b", "n": 3}"#,
        )
        .await;
        assert_eq!(
            a,
            serde_json::json!({"owner": "o x", "repo": "r", "title": "b", "n": 3, "extra": "1"})
        );
        let no_body = args("/repos/o/r/issues", "", None, "").await;
        assert_eq!(no_body, serde_json::json!({"owner": "o", "repo": "r"}));
    }

    #[tokio::test]
    async fn bad_bodies_are_refused() {
        let catalog = catalog();
        let t = target(Method::POST, "api.example.test", "/repos/o/r/issues", "");
        let cases = [
            (Some("application/json"), "[1]".to_owned()),
            (Some("application/json"), "{".to_owned()),
            (Some("text/plain"), "{}".to_owned()),
            (
                None,
                format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
            ),
        ];
        for (ct, text) in cases {
            let mut req = Request::post("/").body(body::full(text)).unwrap();
            if let Some(ct) = ct {
                req.headers_mut().insert(CONTENT_TYPE, ct.parse().unwrap());
            }
            let err = route(&catalog, &t)
                .unwrap()
                .read(&mut req, &t, 1 << 20)
                .await
                .unwrap_err();
            assert!(matches!(err, ProxyError::BadRequest { .. }), "{err}");
        }
        let mut req = Request::post("/").body(body::full("{}    ")).unwrap();
        let err = route(&catalog, &t)
            .unwrap()
            .read(&mut req, &t, 4)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProxyError::BodyTooLarge { limit: 4 }),
            "{err}"
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb+c").as_deref(), Some("a/b+c"));
        assert_eq!(percent_decode("%e2%82%ac").as_deref(), Some("€"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}
