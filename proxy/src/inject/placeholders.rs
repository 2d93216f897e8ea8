//! Placeholders: the worthless stand-ins (`ostiary:github`) that a session's environment
//! carries instead of secrets, so SDKs that insist on an API key start.
//!
//! The proxy looks for them in what it reads of every request — header values (and the
//! user:password of Basic credentials, which hide them in base64), the target URI raw and
//! percent-decoded, and the bodies it already holds (tool calls, MCP) — and refuses a
//! request that carries one towards a host its credential is not bound to: that is an
//! exfiltration attempt, even though the value is worthless, and it is audited as one.
//! Towards a bound host, the placeholder is swapped for the secret in headers and the query.
//!
//! Only names of configured credentials count: `ostiary:` followed by anything else is text.

use base64::Engine;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue, Uri};
use ostiary_broker::{Broker, PLACEHOLDER_PREFIX};

use crate::error::ProxyError;

/// Names of configured credentials whose placeholders appear in a request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Found(Vec<String>);

impl Found {
    /// Whether no placeholder was found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The credential names found.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    fn add(&mut self, broker: &Broker, name: &str) {
        if broker.binding(name).is_some() && !self.0.iter().any(|n| n == name) {
            self.0.push(name.to_owned());
        }
    }

    /// Look for placeholders in `bytes`.
    pub fn scan(&mut self, broker: &Broker, bytes: &[u8]) {
        if broker.bindings().is_empty() {
            return;
        }
        scan_raw(bytes, |name| self.add(broker, name));
        // `ostiary%3Agithub` in a URL or a form body.
        if bytes.contains(&b'%') {
            let decoded = percent_decode(bytes);
            scan_raw(&decoded, |name| self.add(broker, name));
        }
    }

    /// Look for placeholders in the request head.
    pub fn scan_head(&mut self, broker: &Broker, headers: &HeaderMap, uri: &Uri) {
        if broker.bindings().is_empty() {
            return;
        }
        if let Some(pq) = uri.path_and_query() {
            self.scan(broker, pq.as_str().as_bytes());
        }
        for (name, value) in headers {
            self.scan(broker, value.as_bytes());
            if name == AUTHORIZATION {
                if let Some(decoded) = basic_credentials(value) {
                    self.scan(broker, &decoded);
                }
            }
        }
    }

    /// Refuse the request if a placeholder is headed for a host its credential is not
    /// bound to.
    pub fn check(&self, broker: &Broker, host: &str) -> Result<(), ProxyError> {
        for name in &self.0 {
            let bound = broker.binding(name).is_some_and(|b| b.allows_host(host));
            if !bound {
                return Err(ProxyError::PlaceholderExfiltration {
                    credential: name.clone(),
                    host: host.to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Call `found` with each name following a (case-insensitive) `ostiary:` in `bytes`.
fn scan_raw(bytes: &[u8], mut found: impl FnMut(&str)) {
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
        if let Ok(name) = std::str::from_utf8(trimmed) {
            if !name.is_empty() {
                found(name);
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

/// `ostiary%3Aname` (a URL-encoded placeholder) spelled `ostiary:name`; nothing else of
/// `text` is decoded.
pub fn unescape_colons(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let needle = "ostiary%3a";
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut from = 0;
    while let Some(pos) = lower[from..].find(needle) {
        let start = from + pos;
        out.push_str(&text[last..start]);
        out.push_str(PLACEHOLDER_PREFIX);
        last = start + needle.len();
        from = last;
    }
    out.push_str(&text[last..]);
    out
}

/// Replace every placeholder of `name` in `text` with `value`.
pub fn swap(text: &str, name: &str, value: &str) -> Option<String> {
    let placeholder = format!("{PLACEHOLDER_PREFIX}{name}");
    let lower = text.to_ascii_lowercase();
    if !lower.contains(&placeholder) {
        return None;
    }
    // Case-insensitive replacement: walk the lowercase copy for positions, copy from the
    // original (ASCII lowercasing keeps byte offsets).
    let mut out = String::with_capacity(text.len() + value.len());
    let mut last = 0;
    let mut from = 0;
    while let Some(pos) = lower[from..].find(&placeholder) {
        let start = from + pos;
        let end = start + placeholder.len();
        // A longer name that merely starts with this one is not this placeholder.
        let continues = lower[end..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        if !continues {
            out.push_str(&text[last..start]);
            out.push_str(value);
            last = end;
        }
        from = end;
    }
    out.push_str(&text[last..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker() -> Broker {
        let bindings = ["github", "stripe.live"]
            .iter()
            .map(|name| {
                toml::from_str(&format!(
                    "name = \"{name}\"\nsource = {{ file = \"{name}\" }}\nhosts = [\"api.{name}.com\"]\ninject = {{ query = \"k\" }}"
                ))
                .unwrap()
            })
            .collect();
        Broker::new(bindings, None, None).unwrap()
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
            found.scan(&b, text.as_bytes());
            assert_eq!(found.names(), want, "{text}");
        }
        // Case: names are matched as configured; an uppercased name is another name.
        let mut found = Found::default();
        found.scan(&b, b"OSTIARY:github");
        assert_eq!(found.names(), ["github"]);
    }

    #[test]
    fn basic_credentials_are_looked_into() {
        let b = broker();
        let mut headers = HeaderMap::new();
        let basic = base64::engine::general_purpose::STANDARD.encode("x:ostiary:github");
        headers.insert(AUTHORIZATION, format!("Basic {basic}").parse().unwrap());
        let mut found = Found::default();
        found.scan_head(&b, &headers, &Uri::from_static("/p?q=1"));
        assert_eq!(found.names(), ["github"]);
        assert!(found.check(&b, "api.github.com").is_ok());
        let err = found.check(&b, "evil.example").unwrap_err();
        assert!(matches!(err, ProxyError::PlaceholderExfiltration { .. }));
    }

    #[test]
    fn swap_replaces_only_whole_placeholders() {
        assert_eq!(
            swap("Bearer ostiary:github", "github", "S").as_deref(),
            Some("Bearer S")
        );
        assert_eq!(
            swap("a ostiary:githubx ostiary:github.", "github", "S").as_deref(),
            Some("a ostiary:githubx S.")
        );
        assert_eq!(swap("none", "github", "S"), None);
    }

    #[test]
    fn encoded_prefixes_are_unescaped_alone() {
        assert_eq!(
            unescape_colons("/a%3Ab?k=OSTIARY%3agithub"),
            "/a%3Ab?k=ostiary:github"
        );
    }

    #[test]
    fn percent_decoding_is_lenient() {
        assert_eq!(percent_decode(b"a%3Ab%2"), b"a:b%2");
        assert_eq!(percent_decode(b"%zz%41"), b"%zzA");
    }
}
