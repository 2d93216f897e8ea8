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
//!
//! A child session's placeholders carry its own session id (`ostiary:github@ses_…`): a
//! child inherits none of its parent's credentials, so the parent's placeholders (plain,
//! or tagged with the parent's id) are refused in the child's requests, and a tag naming
//! another session is refused in any session's.

use base64::Engine;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue, Uri};
use ostiary_broker::{Broker, PLACEHOLDER_PREFIX};

use crate::error::ProxyError;

/// Names of configured credentials whose placeholders appear in a request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Found {
    names: Vec<String>,
    /// Each distinct (name, session tag) seen; `None`: an untagged placeholder.
    tags: Vec<(String, Option<String>)>,
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

    fn add(&mut self, broker: &Broker, name: &str, tag: Option<&str>) {
        if broker.binding(name).is_none() {
            return;
        }
        if !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_owned());
        }
        if !self
            .tags
            .iter()
            .any(|(n, t)| n == name && t.as_deref() == tag)
        {
            self.tags.push((name.to_owned(), tag.map(str::to_owned)));
        }
    }

    /// Refuse placeholders that belong to another session: one tagged with another
    /// session's id, or an untagged one in a child session (whose own are tagged).
    pub fn check_owner(&self, session: &str, child: bool) -> Result<(), ProxyError> {
        for (name, tag) in &self.tags {
            let foreign = match tag {
                Some(tag) => tag != session,
                None => child,
            };
            if foreign {
                return Err(ProxyError::PlaceholderForeign {
                    credential: name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Look for placeholders in `bytes`.
    pub fn scan(&mut self, broker: &Broker, bytes: &[u8]) {
        if broker.bindings().is_empty() {
            return;
        }
        scan_raw(bytes, |name, tag| self.add(broker, name, tag));
        // `ostiary%3Agithub` in a URL or a form body.
        if bytes.contains(&b'%') {
            let decoded = percent_decode(bytes);
            scan_raw(&decoded, |name, tag| self.add(broker, name, tag));
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
        for name in &self.names {
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
            // A session tag goes with the placeholder (only the session's own tag gets
            // here: `Found::check_owner` refused the others).
            let mut end = end;
            if lower[end..].starts_with('@') {
                end += 1 + lower[end + 1..].bytes().take_while(is_tag_byte).count();
            }
            out.push_str(&text[last..start]);
            out.push_str(value);
            last = end;
            from = end;
            continue;
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
    fn session_tags_belong_to_their_session() {
        let b = broker();
        let mut found = Found::default();
        found.scan(&b, b"Bearer ostiary:github@ses_abc12");
        assert_eq!(found.names(), ["github"]);
        assert!(found.check_owner("ses_abc12", true).is_ok());
        assert!(found.check_owner("ses_other", true).is_err());
        assert!(found.check_owner("ses_other", false).is_err());
        let mut plain = Found::default();
        plain.scan(&b, b"Bearer ostiary:github");
        assert!(plain.check_owner("ses_root", false).is_ok());
        assert!(matches!(
            plain.check_owner("ses_child", true),
            Err(ProxyError::PlaceholderForeign { .. })
        ));
        assert_eq!(
            swap("Bearer ostiary:github@ses_abc12 x", "github", "S").as_deref(),
            Some("Bearer S x")
        );
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
