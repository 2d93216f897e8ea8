//! Placeholders: the worthless stand-ins (`ostiary:github`) that a session's environment
//! carries instead of secrets, so SDKs that insist on an API key start.
//!
//! A placeholder is honoured in one place only: its binding's own injection point, on a
//! host the binding names — the binding's header (`inject = { header = "Authorization",
//! … }`), the `Authorization` header (raw or inside its Basic `user:password`) of a
//! `{ basic = … }` binding, the query parameter of a `{ query = "name" }` binding. There the
//! proxy writes the credential over whatever the agent sent, so the agent's value,
//! placeholder and all, never travels. Nothing is ever swapped in anywhere else: an upstream
//! that stores what it receives (a message body, a query argument, a header it logs) could
//! otherwise be made to keep the secret and hand it back through another route.
//!
//! So the proxy looks for placeholders in all it reads of a request — header values (raw,
//! percent-decoded, and the user:password of Basic credentials, which hide them in base64),
//! header names, the URI's authority, path and query (raw and percent-decoded, each query
//! parameter on its own) and the bodies it already holds (tool calls, MCP; JSON escapes
//! decoded) — and refuses a request that carries one anywhere but its injection point, or
//! towards a host its credential is not bound to: an exfiltration attempt, even though the
//! value is worthless, audited as one ([`ProxyError::PlaceholderExfiltration`]). Streamed
//! bodies are checked on their way out ([`super::body_guard`]).
//!
//! Only names of configured credentials count: `ostiary:` followed by anything else is text.
//!
//! A child session's placeholders carry its own session id (`ostiary:github@ses_…`): a
//! child inherits none of its parent's credentials, so the parent's placeholders (plain,
//! or tagged with the parent's id) are refused in the child's requests, and a tag naming
//! another session is refused in any session's.

use std::borrow::Cow;

use base64::Engine;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue, Uri};
use ostiary_broker::{Binding, Broker, Injection, PLACEHOLDER_PREFIX};

use crate::error::ProxyError;

/// Where in a request a placeholder was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spot {
    /// The value of a header (raw or percent-decoded); the name is lowercase.
    Header(String),
    /// Inside the base64 `user:password` of a Basic `Authorization` header.
    BasicCredentials,
    /// A header's name (`x-ostiary%3Agithub: 1`).
    HeaderName,
    /// The URI's authority (user info of an absolute-form target).
    Authority,
    Path,
    /// The value of a query parameter, by its decoded name.
    QueryValue(String),
    /// A query parameter's name.
    QueryName,
    /// A request body.
    Body,
}

impl Spot {
    /// The spot in words, for the refusal and the audit record. Agent-chosen names are cut
    /// short: a refusal is no place for a kilobyte of header name.
    pub fn describe(&self) -> String {
        fn short(name: &str) -> &str {
            let end = name.char_indices().nth(64).map_or(name.len(), |(at, _)| at);
            &name[..end]
        }
        match self {
            Spot::Header(name) => format!("header {}", short(name)),
            Spot::BasicCredentials => "Basic credentials of the authorization header".into(),
            Spot::HeaderName => "name of a header".into(),
            Spot::Authority => "authority of the URI".into(),
            Spot::Path => "path".into(),
            Spot::QueryValue(name) => format!("query parameter {}", short(name)),
            Spot::QueryName => "name of a query parameter".into(),
            Spot::Body => "body".into(),
        }
    }
}

/// Whether `spot` is where `binding` injects its credential: the only place its
/// placeholder may stand (the proxy writes the credential over it).
pub fn at_injection_point(binding: &Binding, spot: &Spot) -> bool {
    match (&binding.inject, spot) {
        (Injection::Header { name, .. }, Spot::Header(header)) => name.eq_ignore_ascii_case(header),
        (Injection::Basic { .. }, Spot::Header(header)) => header == AUTHORIZATION.as_str(),
        (Injection::Basic { .. }, Spot::BasicCredentials) => true,
        (Injection::Query(param), Spot::QueryValue(name)) => param == name,
        _ => false,
    }
}

/// `binding`'s injection point in words (`None`: it has none an agent could write to).
pub fn injection_point(binding: &Binding) -> Option<String> {
    match &binding.inject {
        Injection::Header { name, .. } => Some(format!("header {}", name.to_ascii_lowercase())),
        Injection::Basic { .. } => Some("authorization header".into()),
        Injection::Query(param) => Some(format!("query parameter {param}")),
        Injection::Mtls | Injection::Nowhere => None,
    }
}

/// The decoded name of one `key=value` pair of a query, as the query injection compares
/// it (form decoding: `%5F` and `+` decoded), so that the pair it replaces and the pair
/// whose placeholder it accepts are the same.
pub fn query_param_name(pair: &str) -> Cow<'_, str> {
    let key = pair.split('=').next().unwrap_or_default();
    if !key.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(key);
    }
    url::form_urlencoded::parse(format!("{key}=").as_bytes())
        .next()
        .map(|(k, _)| Cow::Owned(k.into_owned()))
        .unwrap_or_default()
}

/// One placeholder seen in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hit {
    name: String,
    /// The session tag (`@ses_…`); `None`: an untagged placeholder.
    tag: Option<String>,
    spot: Spot,
}

/// The placeholders of configured credentials that appear in a request, and where.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Found {
    names: Vec<String>,
    hits: Vec<Hit>,
}

impl Found {
    /// Whether no placeholder was found.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The credential names found.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn add(&mut self, broker: &Broker, name: &str, tag: Option<&str>, spot: &Spot) {
        let binding = match broker.binding(name) {
            Some(b) => b,
            // Header names reach the proxy lowercased: match them ignoring case.
            None if *spot == Spot::HeaderName => match broker
                .bindings()
                .iter()
                .find(|b| b.name.eq_ignore_ascii_case(name))
            {
                Some(b) => b,
                None => return,
            },
            None => return,
        };
        if !self.names.contains(&binding.name) {
            self.names.push(binding.name.clone());
        }
        let hit = Hit {
            name: binding.name.clone(),
            tag: tag.map(str::to_owned),
            spot: spot.clone(),
        };
        if !self.hits.contains(&hit) {
            self.hits.push(hit);
        }
    }

    /// Refuse placeholders that belong to another session: one tagged with another
    /// session's id, or an untagged one in a child session (whose own are tagged).
    pub fn check_owner(&self, session: &str, child: bool) -> Result<(), ProxyError> {
        for hit in &self.hits {
            let foreign = match &hit.tag {
                Some(tag) => tag != session,
                None => child,
            };
            if foreign {
                return Err(ProxyError::PlaceholderForeign {
                    credential: hit.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Look for placeholders in `bytes`, found at `spot`.
    pub fn scan(&mut self, broker: &Broker, bytes: &[u8], spot: &Spot) {
        if broker.bindings().is_empty() {
            return;
        }
        scan_raw(bytes, |name, tag| self.add(broker, name, tag, spot));
        // `ostiary%3Agithub` in a URL or a form body.
        if bytes.contains(&b'%') {
            let decoded = percent_decode(bytes);
            scan_raw(&decoded, |name, tag| self.add(broker, name, tag, spot));
        }
    }

    /// Look for placeholders in a body read whole: as sent, and with its JSON escapes
    /// decoded (`ostiary\u003agithub` is the placeholder to whoever parses the JSON).
    pub fn scan_body(&mut self, broker: &Broker, body: &[u8]) {
        if broker.bindings().is_empty() {
            return;
        }
        self.scan(broker, body, &Spot::Body);
        if body.windows(2).any(|w| w == b"\\u") {
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
                if let Ok(decoded) = serde_json::to_vec(&value) {
                    self.scan(broker, &decoded, &Spot::Body);
                }
            }
        }
    }

    /// Look for placeholders in the request head.
    pub fn scan_head(&mut self, broker: &Broker, headers: &HeaderMap, uri: &Uri) {
        if broker.bindings().is_empty() {
            return;
        }
        if let Some(authority) = uri.authority() {
            self.scan(broker, authority.as_str().as_bytes(), &Spot::Authority);
        }
        if let Some(pq) = uri.path_and_query() {
            self.scan(broker, pq.path().as_bytes(), &Spot::Path);
            for pair in pq.query().unwrap_or_default().split('&') {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                self.scan(broker, key.as_bytes(), &Spot::QueryName);
                let spot = Spot::QueryValue(query_param_name(pair).into_owned());
                self.scan(broker, value.as_bytes(), &spot);
            }
        }
        for (name, value) in headers {
            self.scan(broker, name.as_str().as_bytes(), &Spot::HeaderName);
            self.scan(
                broker,
                value.as_bytes(),
                &Spot::Header(name.as_str().to_owned()),
            );
            if name == AUTHORIZATION {
                if let Some(decoded) = basic_credentials(value) {
                    self.scan(broker, &decoded, &Spot::BasicCredentials);
                }
            }
        }
    }

    /// Refuse the request if a placeholder is headed for a host its credential is not
    /// bound to, or stands anywhere but its binding's injection point.
    pub fn check(&self, broker: &Broker, host: &str) -> Result<(), ProxyError> {
        let bindings = self
            .hits
            .iter()
            .filter_map(|hit| broker.binding(&hit.name).map(|b| (hit, b)));
        // Towards a host it is not bound to first: the graver of the two.
        for (hit, binding) in bindings.clone() {
            if !binding.allows_host(host) {
                return Err(ProxyError::PlaceholderExfiltration {
                    credential: hit.name.clone(),
                    host: host.to_owned(),
                    at: hit.spot.describe(),
                    point: None,
                });
            }
        }
        for (hit, binding) in bindings {
            if !at_injection_point(binding, &hit.spot) {
                return Err(ProxyError::PlaceholderExfiltration {
                    credential: hit.name.clone(),
                    host: host.to_owned(),
                    at: hit.spot.describe(),
                    point: Some(injection_point(binding).unwrap_or_else(|| "nowhere".into())),
                });
            }
        }
        Ok(())
    }
}

/// Whether `b` may appear in a session tag (`@ses_0123abcd…`).
fn is_tag_byte(b: &u8) -> bool {
    b.is_ascii_alphanumeric() || *b == b'_'
}

/// Call `found` with each name following a (case-insensitive) `ostiary:` in `bytes`, and
/// the session tag after it (`@…`), if any.
fn scan_raw(bytes: &[u8], mut found: impl FnMut(&str, Option<&str>)) {
    let prefix = PLACEHOLDER_PREFIX.as_bytes();
    let mut at = 0;
    while let Some(offset) = find_prefix(&bytes[at..], prefix) {
        let start = at + offset + prefix.len();
        let len = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
            .count();
        // Names never end in '.', but prose does ("use ostiary:github.").
        let name = &bytes[start..start + len];
        let trimmed = name
            .iter()
            .rposition(|b| *b != b'.')
            .map_or(&name[..0], |end| &name[..=end]);
        let after = start + trimmed.len();
        let tag = (trimmed.len() == len && bytes.get(after) == Some(&b'@'))
            .then(|| {
                let tag = &bytes[after + 1..];
                let n = tag.iter().take_while(|b| is_tag_byte(b)).count();
                std::str::from_utf8(&tag[..n])
                    .ok()
                    .filter(|t| !t.is_empty())
            })
            .flatten();
        if let Ok(name) = std::str::from_utf8(trimmed) {
            if !name.is_empty() {
                found(name, tag);
            }
        }
        at = start;
    }
}

fn find_prefix(haystack: &[u8], prefix: &[u8]) -> Option<usize> {
    haystack
        .windows(prefix.len())
        .position(|w| w.eq_ignore_ascii_case(prefix))
}

/// `%XX` decoded, `+` left alone; invalid escapes kept as they are.
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// The decoded `user:password` of a Basic `Authorization` value.
fn basic_credentials(value: &HeaderValue) -> Option<Vec<u8>> {
    let text = value.to_str().ok()?;
    let (scheme, rest) = text.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    // Padding optional: clients that omit it are still looked into.
    const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(rest.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `github` injects a header, `basic` Basic auth, `stripe.live` a query parameter.
    fn broker() -> Broker {
        let binding = |name: &str, inject: &str| {
            toml::from_str(&format!(
                "name = \"{name}\"\nsource = {{ file = \"{name}\" }}\nhosts = [\"api.{name}.com\"]\ninject = {inject}"
            ))
            .unwrap()
        };
        let bindings = vec![
            binding(
                "github",
                r#"{ header = "Authorization", value = "Bearer {secret}" }"#,
            ),
            binding("basic", "{ basic = { username = \"u\" } }"),
            binding("stripe.live", r#"{ query = "k" }"#),
        ];
        Broker::new(bindings, None, None).unwrap()
    }

    /// Request headers, as `(name, value)`.
    type Headers<'a> = &'a [(&'a str, &'a str)];

    fn found_in(headers: Headers, uri: &str) -> Found {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let mut found = Found::default();
        found.scan_head(&broker(), &map, &uri.parse().unwrap());
        found
    }

    fn basic(pair: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }

    #[test]
    fn finds_placeholders_wherever_the_agent_hides_them() {
        let b = broker();
        let cases: [(&str, &[&str]); 7] = [
            ("Bearer ostiary:github", &["github"]),
            ("token=OSTIARY:GITHUB&x=1", &[]),
            ("x ostiary:stripe.live.", &["stripe.live"]),
            ("a=ostiary%3Agithub", &["github"]),
            ("ostiary:unknown ostiary: ostiary:", &[]),
            ("ostiary:githubx", &[]),
            (
                "ostiary:github ostiary:stripe.live",
                &["github", "stripe.live"],
            ),
        ];
        for (text, want) in cases {
            let mut found = Found::default();
            found.scan(&b, text.as_bytes(), &Spot::Body);
            assert_eq!(found.names(), want, "{text}");
        }
        // Case: names are matched as configured; an uppercased name is another name.
        let mut found = Found::default();
        found.scan(&b, b"OSTIARY:github", &Spot::Body);
        assert_eq!(found.names(), ["github"]);
    }

    #[test]
    fn session_tags_belong_to_their_session() {
        let b = broker();
        let mut found = Found::default();
        found.scan(&b, b"Bearer ostiary:github@ses_abc12", &Spot::Body);
        assert_eq!(found.names(), ["github"]);
        assert!(found.check_owner("ses_abc12", true).is_ok());
        assert!(found.check_owner("ses_other", true).is_err());
        assert!(found.check_owner("ses_other", false).is_err());
        let mut plain = Found::default();
        plain.scan(&b, b"Bearer ostiary:github", &Spot::Body);
        assert!(plain.check_owner("ses_root", false).is_ok());
        assert!(matches!(
            plain.check_owner("ses_child", true),
            Err(ProxyError::PlaceholderForeign { .. })
        ));
    }

    /// `(credential, at, point)` of a refusal.
    fn refusal(found: &Found, host: &str) -> Option<(String, String, Option<String>)> {
        match found.check(&broker(), host) {
            Ok(()) => None,
            Err(ProxyError::PlaceholderExfiltration {
                credential,
                at,
                point,
                ..
            }) => Some((credential, at, point)),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn the_injection_point_is_the_only_place_a_placeholder_may_stand() {
        let cases: [(Headers, &str, &str); 6] = [
            (
                &[("authorization", "Bearer ostiary:github")],
                "/",
                "api.github.com",
            ),
            // Any spelling in the binding's own header: the whole value is overwritten.
            (
                &[("Authorization", "token ostiary%3Agithub")],
                "/",
                "api.github.com",
            ),
            (
                &[("authorization", &basic("u:ostiary:basic"))],
                "/",
                "api.basic.com",
            ),
            (
                &[("authorization", "Bearer ostiary:basic")],
                "/",
                "api.basic.com",
            ),
            (&[], "/v1?k=ostiary:stripe.live&x=1", "api.stripe.live.com"),
            (&[], "/v1?k=ostiary%3Astripe.live", "api.stripe.live.com"),
        ];
        for (headers, uri, host) in cases {
            let found = found_in(headers, uri);
            assert!(!found.is_empty(), "{headers:?} {uri}");
            assert_eq!(refusal(&found, host), None, "{headers:?} {uri}");
        }
    }

    #[test]
    fn a_placeholder_anywhere_else_is_refused_even_towards_its_host() {
        let gh = "api.github.com";
        let cases: [(Headers, &str, &str, &str); 9] = [
            (
                &[("x-api-key", "ostiary:github")],
                "/",
                gh,
                "header x-api-key",
            ),
            (&[("cookie", "t=ostiary:github")], "/", gh, "header cookie"),
            (&[], "/repos/ostiary:github", gh, "path"),
            (&[], "/repos/ostiary%3agithub/x", gh, "path"),
            (&[], "/r?q=ostiary:github", gh, "query parameter q"),
            (
                &[],
                "/r?ostiary%3Agithub=1",
                gh,
                "name of a query parameter",
            ),
            (
                &[("authorization", &basic("x:ostiary:github"))],
                "/",
                gh,
                "Basic credentials of the authorization header",
            ),
            (&[("x-ostiary%3agithub", "1")], "/", gh, "name of a header"),
            (
                &[],
                "/v1?x=1;k=ostiary:stripe.live",
                "api.stripe.live.com",
                "query parameter x",
            ),
        ];
        for (headers, uri, host, at) in cases {
            let found = found_in(headers, uri);
            let (_, found_at, point) = refusal(&found, host)
                .unwrap_or_else(|| panic!("{headers:?} {uri} was not refused"));
            assert_eq!(found_at, at, "{headers:?} {uri}");
            assert!(point.is_some(), "bound host: the refusal names the point");
        }
        // Another binding's injection point is not this one's.
        let found = found_in(&[("authorization", "Bearer ostiary:stripe.live")], "/");
        assert!(refusal(&found, "api.stripe.live.com").is_some());
        let mut body = Found::default();
        body.scan_body(&broker(), br#"{"t":"ostiary\u003agithub"}"#);
        assert_eq!(
            refusal(&body, gh).map(|r| r.1).as_deref(),
            Some("body"),
            "JSON escapes are decoded"
        );
    }

    #[test]
    fn towards_an_unbound_host_every_spot_is_refused() {
        let basic = basic("u:ostiary:basic");
        for (headers, uri) in [
            (&[("authorization", "Bearer ostiary:github")][..], "/"),
            (&[][..], "/?k=ostiary:stripe.live"),
            (&[("authorization", basic.as_str())][..], "/"),
        ] {
            let found = found_in(headers, uri);
            let (_, _, point) = refusal(&found, "evil.example").expect("refused");
            assert_eq!(point, None, "unbound: no point to name");
        }
    }

    #[test]
    fn unpadded_basic_credentials_are_looked_into() {
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("x:ostiary:github");
        let found = found_in(&[("authorization", &format!("Basic {unpadded}"))], "/");
        assert_eq!(found.names(), ["github"]);
    }

    #[test]
    fn query_param_names_decode_like_the_injection() {
        assert_eq!(query_param_name("k=1"), "k");
        assert_eq!(query_param_name("%6B=1"), "k");
        assert_eq!(query_param_name("a+b=1"), "a b");
        assert_eq!(query_param_name("k"), "k");
    }

    #[test]
    fn long_names_are_cut_in_descriptions() {
        let spot = Spot::Header("x".repeat(500));
        assert!(spot.describe().len() < 80);
    }

    #[test]
    fn percent_decoding_is_lenient() {
        assert_eq!(percent_decode(b"a%3Ab%2"), b"a:b%2");
        assert_eq!(percent_decode(b"%zz%41"), b"%zzA");
    }
}
