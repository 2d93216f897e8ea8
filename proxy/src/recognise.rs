//! Phase `recognise`: whether a classified request is a call of a catalogued REST tool, and
//! if it is, its arguments (docs/design.md §4).
//!
//! A request is a call of the first `[[tool]]` in `tools.toml` (file order) whose REST route
//! matches: the route's host equals the canonical target host, its method equals the
//! request's in any case (`delete` is `DELETE`: some servers take it so) and a `GET` route
//! also takes `HEAD` (which most frameworks route to the `GET` handler), and its path
//! template matches the path segment for segment — the normalised path that policy sees
//! and the upstream gets (see [`crate::classify`] and [`crate::path_forms`]), a trailing
//! slash either way. Scheme and port are not part of a route, so a call cannot leave its
//! tool's policies by taking another port. A request no route matches stays
//! `Action::"http"` — unless a lenient upstream would route it to a tool (doubled slashes,
//! `;parameters`, `%2F` as a separator: [`crate::path_forms::routed`]) or the path differs
//! from a route only in letter case (Express and ASP.NET Core route case-insensitively by
//! default), in which case it is refused (`400`), never decided as plain `http`.
//!
//! The arguments of a call are one JSON object, built from three sources:
//! - **path parameters** (`{owner}` in the template): strings, percent-decoded;
//! - **query parameters**: strings, `application/x-www-form-urlencoded` decoded;
//! - **the JSON body's members**: the body must be empty or a JSON object (by
//!   `Content-Type: application/json` or `*+json`, or no `Content-Type` at all); any other body
//!   is refused, since arguments that cannot be read cannot be checked.
//!
//! Arguments that upstreams could read differently are refused (`400`), not resolved:
//! frameworks disagree on which of two values counts, so whichever the proxy picked, the
//! upstream may run the other. That is a body that is ambiguous JSON
//! ([`crate::strict_json`]: duplicate or case-folded keys, at any depth), a query key given
//! twice (`?a=1&a=2`, or `a` and `A`: some frameworks match case-insensitively), and one
//! argument named by two sources (a path parameter also in the query or body, a query key
//! also in the body; compared ignoring case).
//!
//! Only a recognised call's body is read: it is buffered up to `proxy.max_tool_body_bytes`
//! (a larger one is refused before or while reading and never forwarded) and the buffered
//! bytes are forwarded unchanged. Bodies of all other requests keep streaming untouched.
//! JSON nesting is bounded by serde_json's recursion limit (128), so a deeply nested body is
//! a parse error, not a stack overflow.

use std::collections::HashMap;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Method, Request};
use http_body_util::BodyExt;
use ostiary_policies::{Action, Catalog, Tool, ToolMatch};
use serde_json::{Map, Value};

use crate::body::{self, ProxyBody};
use crate::classify::Target;
use crate::error::ProxyError;
use crate::path_forms;

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

/// The first REST route in `catalog` that `target` matches; a refusal when the path is
/// not one but a lenient upstream would route it to one (see the module doc).
pub fn route<'a>(catalog: &'a Catalog, target: &Target) -> Result<Option<Route<'a>>, ProxyError> {
    let host = target.host.to_string();
    let found = find(catalog, &host, &target.method, &target.path);
    let routed = path_forms::routed(&target.path);
    if let Some(routed) = &routed {
        if let Some(other) = find(catalog, &host, &target.method, routed) {
            return Err(ProxyError::bad_request(format!(
                "the path is ambiguous: upstreams that merge slashes, cut `;` parameters or \
                 decode %2F (once or twice) route it as {routed}, the catalogued tool {}; send that path",
                other.tool.name()
            )));
        }
    }
    if found.is_none() {
        let lenient = routed.as_deref().unwrap_or(&target.path);
        if let Some(other) = find_ignoring_case(catalog, &host, &target.method, lenient) {
            return Err(ProxyError::bad_request(format!(
                "the path is ambiguous: it differs only in letter case from the route of the \
                 catalogued tool {} ({}), which upstreams that route paths ignoring case \
                 run; send the catalogued spelling",
                other.name(),
                match other.matcher() {
                    ToolMatch::Rest { path, .. } => path.as_str(),
                    ToolMatch::Mcp { .. } => "",
                }
            )));
        }
    }
    Ok(found)
}

/// The first tool of `catalog` whose REST route `path` matches with letter case ignored in
/// the route's literal segments. Only asked of a request no route takes as spelled, so a
/// host's ordinary traffic pays one more pass over its routes, not every request.
fn find_ignoring_case<'a>(
    catalog: &'a Catalog,
    host: &str,
    method: &Method,
    path: &str,
) -> Option<&'a Tool> {
    catalog.tools().iter().find(|tool| match tool.matcher() {
        ToolMatch::Rest {
            host: route_host,
            method: route_method,
            path: template,
        } => {
            route_host == host
                && method_matches(route_method, method)
                && template.matches_ignoring_case(path)
        }
        ToolMatch::Mcp { .. } => false,
    })
}

/// The first route of `catalog` for `host`, `method` and `path` (a trailing slash either way).
fn find<'a>(catalog: &'a Catalog, host: &str, method: &Method, path: &str) -> Option<Route<'a>> {
    catalog
        .tools()
        .iter()
        .find_map(|tool| match tool.matcher() {
            ToolMatch::Rest {
                host: route_host,
                method: route_method,
                path: template,
            } if route_host == host && method_matches(route_method, method) => {
                template.captures(path).map(|params| Route { tool, params })
            }
            _ => None,
        })
}

/// A route's method (uppercase, from the catalog) takes the request's in any case, and a
/// `GET` route takes `HEAD` too.
fn method_matches(route: &str, method: &Method) -> bool {
    route.eq_ignore_ascii_case(method.as_str()) || (route == "GET" && *method == Method::HEAD)
}

/// A message's media type, lowercased, without parameters (`application/json` of
/// `application/json; charset=utf-8`); `None` without a readable `Content-Type`.
pub(crate) fn media_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
}

/// Whether `host` (canonical text) serves any catalogued tool, REST or MCP.
pub fn serves_tools(catalog: &Catalog, host: &str) -> bool {
    catalog.tools().iter().any(|tool| tool.server() == host)
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
        // Every key once, ignoring case, across the three sources: the body's are checked
        // among themselves by the strict parser.
        let mut seen: HashMap<String, &'static str> = args
            .keys()
            .map(|k| (crate::strict_json::fold(k), "the JSON body"))
            .collect();
        let mut claim = |key: &str, source: &'static str| {
            let quoted = crate::strict_json::quote(key);
            match seen.insert(crate::strict_json::fold(key), source) {
                None => Ok(()),
                Some(other) if other == source => Err(ProxyError::bad_request(format!(
                    "ambiguous arguments: {quoted} appears twice in {source} (ignoring case); \
                     upstreams disagree on which one counts"
                ))),
                Some(other) => Err(ProxyError::bad_request(format!(
                    "ambiguous arguments: {quoted} is given both in {other} and in {source}; \
                     upstreams disagree on which one counts"
                ))),
            }
        };
        let mut query = Vec::new();
        if target.query.contains(';') {
            return Err(ProxyError::bad_request(
                "ambiguous arguments: the query holds `;`, which Rack and other servers take \
                 as a separator between parameters; encode it as %3B",
            ));
        }
        for (key, value) in url::form_urlencoded::parse(target.query.as_bytes()) {
            if key.contains(['[', ']']) {
                return Err(ProxyError::bad_request(format!(
                    "ambiguous arguments: the query key {} holds brackets, which PHP, Rails \
                     and Express (qs) read as an array or object; send structured arguments \
                     in a JSON body",
                    crate::strict_json::quote(&key)
                )));
            }
            claim(&key, "the query")?;
            query.push((key.into_owned(), value.into_owned()));
        }
        let mut path = Vec::with_capacity(self.params.len());
        for (name, raw) in self.params {
            claim(&name, "the path")?;
            let value = percent_decode(&raw).ok_or_else(|| {
                ProxyError::bad_request(format!(
                    "path parameter {{{name}}} is not valid percent-encoded UTF-8"
                ))
            })?;
            path.push((name, value));
        }
        for (key, value) in query.into_iter().chain(path) {
            args.insert(key, Value::String(value));
        }
        if args
            .keys()
            .any(|key| crate::method_override::is_method_override(key))
        {
            // Laravel and Symfony read `_method` from a JSON body too (see `classify` for
            // the query's).
            return Err(crate::method_override::refused("the body"));
        }
        let args = Value::Object(args);
        spelled_as_declared(self.tool, &args)?;
        Ok(ToolCall {
            tool: self.tool,
            args,
            body: bytes,
        })
    }
}

/// Refuse arguments holding a key spelled in another case than the property the tool's
/// schema declares there: policy and the schema check read `path`, a case-insensitive
/// decoder upstream runs `Path` as `path` (REST bodies and queries, MCP `arguments` alike).
pub(crate) fn spelled_as_declared(tool: &Tool, args: &Value) -> Result<(), ProxyError> {
    match tool.misspelled_arg(args) {
        None => Ok(()),
        Some(m) => Err(ProxyError::bad_request(format!(
            "ambiguous arguments: {} in {} differs only in case from the declared {}, which \
             upstreams that decode case-insensitively run it as; send it spelled as declared",
            crate::strict_json::quote(&m.given),
            m.at,
            crate::strict_json::quote(&m.declared),
        ))),
    }
}

impl ToolCall<'_> {
    /// The Cedar action of this call; `approval` is the approver once a human approved it
    /// (`context.approval.granted`), `None` when the agent asks. Refused (`400`) when the
    /// argument `impact.records` points at is not a count of records
    /// ([`Tool::impact_records`]): policy would read it as 0.
    pub fn action(self, approval: Option<String>) -> Result<Action, ProxyError> {
        Ok(Action::Tool {
            name: self.tool.name().to_owned(),
            impact_records: self
                .tool
                .impact_records(&self.args)
                .map_err(|e| ProxyError::bad_request(e.to_string()))?,
            cost_micros: self.tool.cost_micros(),
            approval,
            args: self.args,
            undo: false,
        })
    }
}

/// The body's length as its `Content-Length` declares it (classify refused two).
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// The whole body, or a refusal if it is larger than `limit`. A declared `Content-Length`
/// over the limit is refused before anything is read.
pub(crate) async fn read_body(
    req: &mut Request<ProxyBody>,
    limit: usize,
) -> Result<Bytes, ProxyError> {
    if declared_length(req.headers()).is_some_and(|n| n > limit as u64) {
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
    let content_type = media_type(headers);
    if let Some(ct) = content_type.filter(|ct| !is_json(ct)) {
        return Err(ProxyError::bad_request(format!(
            "the body of a tool call must be JSON, not {ct}"
        )));
    }
    // The error names line and column, or the ambiguous keys, never a value.
    match crate::strict_json::parse(bytes) {
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
        route(&catalog, t)
            .unwrap()
            .map(|r| r.tool.name().to_owned())
    }

    fn refused(t: &Target) -> String {
        match route(&catalog(), t) {
            Err(ProxyError::BadRequest { reason }) => reason,
            other => panic!(
                "{}: {:?}",
                t.path,
                other.map(|r| r.map(|r| r.tool.name().to_owned()))
            ),
        }
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
        assert_eq!(name(&t(Method::POST, "/repos//b/issues")), None);
        assert_eq!(
            name(&target(Method::GET, "other.test", "/repos/a/b", "")),
            None
        );
    }

    #[test]
    fn spellings_an_upstream_routes_alike_are_the_tool_or_refused() {
        let t = |m: &str, p| {
            target(
                Method::from_bytes(m.as_bytes()).unwrap(),
                "api.example.test",
                p,
                "",
            )
        };
        // Decided as the tool: a trailing slash, the method in another case, HEAD for GET.
        for (m, p) in [
            ("POST", "/repos/a/b/issues/"),
            ("post", "/repos/a/b/issues"),
            ("Post", "/repos/a/b/issues/"),
        ] {
            assert_eq!(
                name(&t(m, p)).as_deref(),
                Some("gh.create_issue"),
                "{m} {p}"
            );
        }
        assert_eq!(
            name(&t("HEAD", "/repos/a/b")).as_deref(),
            Some("gh.get_repo")
        );
        assert_eq!(
            name(&t("get", "/repos/a/b/")).as_deref(),
            Some("gh.get_repo")
        );
        // Refused: a lenient upstream would route them to the tool.
        for p in [
            "/repos//a/b/issues",
            "//repos/a/b/issues",
            "/repos/a/b//issues",
            "/repos/a/b/issues;x=1",
            "/repos/a;v=2/b/issues",
            "/repos;/a/b/issues",
            "/repos/a/b%2Fissues",
            "/repos/a/b%2fissues",
            "/repos/a/b%5Cissues",
        ] {
            assert!(refused(&t("POST", p)).contains("gh.create_issue"), "{p}");
        }
        // An encoded slash inside a parameter that routes nowhere else stays the parameter.
        assert_eq!(
            name(&t("GET", "/repos/a%2Fb/c")).as_deref(),
            Some("gh.get_repo")
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
            "extra=1&label=a+b",
            Some("application/json; charset=utf-8"),
            r#"{"title": "b", "n": 3}"#,
        )
        .await;
        assert_eq!(
            a,
            serde_json::json!({"owner": "o x", "repo": "r", "title": "b", "n": 3, "extra": "1", "label": "a b"})
        );
        let no_body = args("/repos/o/r/issues", "", None, "").await;
        assert_eq!(no_body, serde_json::json!({"owner": "o", "repo": "r"}));
    }

    #[tokio::test]
    async fn ambiguous_arguments_are_refused() {
        let catalog = catalog();
        for (query, body) in [
            // Within one source.
            ("extra=1&extra=2", ""),
            ("extra=1&EXTRA=2", ""),
            ("a=1&a%3D=2&a=3", ""),
            ("", r#"{"ids":["a"],"IDS":["a","b","c"]}"#),
            ("", r#"{"ids":["a"],"ids":["a","b"]}"#),
            ("", r#"{"n":{"k":1,"K":2}}"#),
            // Across sources.
            ("title=q", r#"{"title":"b"}"#),
            ("Title=q", r#"{"title":"b"}"#),
            ("owner=q", ""),
            ("", r#"{"owner":"b"}"#),
            ("", r#"{"REPO":"b"}"#),
        ] {
            let t = target(Method::POST, "api.example.test", "/repos/o/r/issues", query);
            let mut req = Request::post("/")
                .body(body::full(body.to_owned()))
                .unwrap();
            let err = route(&catalog, &t)
                .unwrap()
                .unwrap()
                .read(&mut req, &t, 1 << 20)
                .await
                .unwrap_err();
            assert!(
                matches!(&err, ProxyError::BadRequest { reason } if reason.contains("ambiguous")),
                "{query} {body}: {err}"
            );
        }
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
                .unwrap()
                .read(&mut req, &t, 1 << 20)
                .await
                .unwrap_err();
            assert!(matches!(err, ProxyError::BadRequest { .. }), "{err}");
        }
        let mut req = Request::post("/").body(body::full("{}    ")).unwrap();
        let err = route(&catalog, &t)
            .unwrap()
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
