//! A `[[credential]]` binding: which secret, sent to which hosts, injected how.
//!
//! The binding is the whole of what decides where a secret may go. It is checked when the
//! config loads (names, hosts, header names, templates), so that a request never meets a
//! binding that cannot be applied.

use std::time::Duration;

use serde::Deserialize;

use crate::source::SourceSpec;

/// The prefix of placeholders: `GITHUB_TOKEN=ostiary:github`.
pub const PLACEHOLDER_PREFIX: &str = "ostiary:";

/// One `[[credential]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// Name used by placeholders (`ostiary:<name>`), the catalog's `credential`, audit and metrics.
    pub name: String,
    pub source: SourceSpec,
    /// Hosts the credential may be sent to: exact names, or `*.example.com` for any name
    /// under `example.com` (anchored at the dot; `example.com` itself is not included).
    /// Empty (with no `inject`): Ostiary's own secret, never sent anywhere (a webhook's
    /// signing secret, an API trigger's token).
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub inject: Injection,
    /// The environment variable carrying the placeholder in a session's environment;
    /// `<NAME>_TOKEN` by default. Empty: no placeholder is exported.
    #[serde(default)]
    pub env: Option<String>,
    /// How long a credential without a lease (file, KV) is cached per session.
    #[serde(default = "default_ttl", deserialize_with = "duration")]
    pub ttl: Duration,
}

fn default_ttl() -> Duration {
    Duration::from_secs(300)
}

fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(serde::de::Error::custom)
}

/// How a credential goes into the request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "InjectionTable")]
pub enum Injection {
    /// `{ header = "Authorization", value = "Bearer {secret}" }`. `{secret}` is the token;
    /// for user/password material `{username}` and `{password}` are available too.
    Header { name: String, template: String },
    /// `{ basic = { username = "x-access-token" } }`: HTTP basic auth. Without a username,
    /// the credential's own (database credentials).
    Basic { username: Option<String> },
    /// `{ query = "api_key" }`: a query parameter of that name (set, replacing the agent's).
    Query(String),
    /// `{ mtls = true }`: the credential is a client certificate for the upstream connection.
    Mtls,
    /// No `inject` (and no `hosts`): never injected; read only by Ostiary itself.
    #[default]
    Nowhere,
}

impl Injection {
    /// The header this injection writes, which the agent may not supply itself.
    pub fn header_name(&self) -> Option<&str> {
        match self {
            Injection::Header { name, .. } => Some(name),
            Injection::Basic { .. } => Some("authorization"),
            Injection::Query(_) | Injection::Mtls | Injection::Nowhere => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InjectionTable {
    header: Option<String>,
    value: Option<String>,
    basic: Option<BasicTable>,
    query: Option<String>,
    mtls: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicTable {
    username: Option<String>,
}

impl TryFrom<InjectionTable> for Injection {
    type Error = String;

    fn try_from(t: InjectionTable) -> Result<Self, String> {
        let forms = [
            t.header.is_some(),
            t.basic.is_some(),
            t.query.is_some(),
            t.mtls.is_some(),
        ];
        if forms.iter().filter(|set| **set).count() != 1 {
            return Err(
                "inject takes exactly one of header (with value), basic, query, mtls".into(),
            );
        }
        if t.value.is_some() && t.header.is_none() {
            return Err("inject.value needs inject.header".into());
        }
        if let Some(name) = t.header {
            let template = t.value.unwrap_or_else(|| "{secret}".into());
            if !valid_token(&name) {
                return Err(format!("inject.header {name:?} is not a valid header name"));
            }
            if !(template.contains("{secret}")
                || template.contains("{password}")
                || template.contains("{username}"))
            {
                return Err("inject.value must contain {secret}, {username} or {password}".into());
            }
            if template.bytes().any(|b| b.is_ascii_control()) {
                return Err("inject.value must not contain control characters".into());
            }
            return Ok(Injection::Header { name, template });
        }
        if let Some(basic) = t.basic {
            if let Some(user) = &basic.username {
                if user.contains(':') || user.bytes().any(|b| b.is_ascii_control()) {
                    return Err(
                        "inject.basic.username must not contain ':' or control characters".into(),
                    );
                }
            }
            return Ok(Injection::Basic {
                username: basic.username,
            });
        }
        if let Some(param) = t.query {
            if param.is_empty()
                || !param
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
            {
                return Err(format!(
                    "inject.query {param:?} must be a plain parameter name"
                ));
            }
            return Ok(Injection::Query(param));
        }
        match t.mtls {
            Some(true) => Ok(Injection::Mtls),
            _ => Err("inject.mtls must be true".into()),
        }
    }
}

/// An RFC 9110 token (header names).
fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Why a binding is unusable.
#[derive(Debug, thiserror::Error)]
#[error("credential {name:?}: {reason}")]
pub struct BindingError {
    pub name: String,
    pub reason: String,
}

impl Binding {
    /// Check what serde cannot: names, hosts, and that the source suits the injection.
    pub fn validate(&self) -> Result<(), BindingError> {
        let fail = |reason: String| BindingError {
            name: self.name.clone(),
            reason,
        };
        if self.name.is_empty()
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(fail("names are letters, digits, '-', '_' and '.'".into()));
        }
        match (self.hosts.is_empty(), &self.inject) {
            // Ostiary's own secret: read by triggers, never sent.
            (true, Injection::Nowhere) => return Ok(()),
            (true, _) => {
                return Err(fail(
                    "hosts is empty: the credential could go nowhere (leave out inject too for a secret only Ostiary reads)"
                        .into(),
                ))
            }
            (false, Injection::Nowhere) => {
                return Err(fail(
                    "inject is missing: how would the credential go to its hosts?".into(),
                ))
            }
            (false, _) => {}
        }
        for host in &self.hosts {
            let bare = host.strip_prefix("*.").unwrap_or(host);
            let ok = !bare.is_empty()
                && !bare.contains('*')
                && bare == bare.to_ascii_lowercase()
                && bare
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
                || bare.parse::<std::net::Ipv6Addr>().is_ok();
            if !ok {
                return Err(fail(format!(
                    "host {host:?} must be a lowercase name or IP (optionally *.suffix), no port"
                )));
            }
        }
        let certificate = matches!(self.source, SourceSpec::VaultPki(_));
        let mtls = matches!(self.inject, Injection::Mtls);
        if certificate != mtls {
            return Err(fail(
                "a vault_pki source is injected with { mtls = true }, and only it".into(),
            ));
        }
        if let Some(env) = &self.env {
            let valid = env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !env.starts_with(|c: char| c.is_ascii_digit());
            if !env.is_empty() && !valid {
                return Err(fail(format!("env {env:?} is not a variable name")));
            }
        }
        Ok(())
    }

    /// Whether the credential may be sent to `host` (lowercase, no port).
    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|pattern| match pattern.strip_prefix("*.") {
                Some(suffix) => host
                    .strip_suffix(suffix)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                None => pattern == host,
            })
    }

    /// The placeholder the agent's environment carries for this credential.
    pub fn placeholder(&self) -> String {
        format!("{PLACEHOLDER_PREFIX}{}", self.name)
    }

    /// The environment variable for the placeholder, if one is exported. mTLS credentials
    /// have nothing an agent could put in a request, so they export none.
    pub fn env_var(&self) -> Option<String> {
        if matches!(self.inject, Injection::Mtls) {
            return None;
        }
        match &self.env {
            Some(env) if env.is_empty() => None,
            Some(env) => Some(env.clone()),
            None => Some(format!(
                "{}_TOKEN",
                self.name
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    })
                    .collect::<String>()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Binding, String> {
        let b: Binding = toml::from_str(text).map_err(|e| e.to_string())?;
        b.validate().map_err(|e| e.to_string())?;
        Ok(b)
    }

    const BASE: &str = "name = \"github\"\nsource = { file = \"github\" }\nhosts = [\"api.github.com\", \"*.example.com\"]\n";

    #[test]
    fn injection_forms_parse() {
        let b = parse(&format!(
            "{BASE}inject = {{ header = \"Authorization\", value = \"Bearer {{secret}}\" }}"
        ))
        .unwrap();
        assert_eq!(b.inject.header_name(), Some("Authorization"));
        assert_eq!(b.env_var().as_deref(), Some("GITHUB_TOKEN"));
        assert_eq!(b.placeholder(), "ostiary:github");
        let b = parse(&format!("{BASE}inject = {{ basic = {{}} }}")).unwrap();
        assert_eq!(b.inject, Injection::Basic { username: None });
        let b = parse(&format!(
            "{BASE}inject = {{ query = \"api_key\" }}\nenv = \"GH\""
        ))
        .unwrap();
        assert_eq!(b.inject, Injection::Query("api_key".into()));
        assert_eq!(b.env_var().as_deref(), Some("GH"));
    }

    #[test]
    fn bad_bindings_are_refused() {
        for inject in [
            "{ header = \"Authorization\", query = \"x\" }",
            "{ header = \"Bad Header\" }",
            "{ header = \"X\", value = \"static\" }",
            "{ value = \"{secret}\" }",
            "{ query = \"a&b\" }",
            "{ mtls = true }",
            "{ mtls = false }",
            "{}",
        ] {
            assert!(
                parse(&format!("{BASE}inject = {inject}")).is_err(),
                "{inject}"
            );
        }
        let no_hosts =
            "name = \"x\"\nsource = { file = \"x\" }\nhosts = []\ninject = { query = \"k\" }";
        assert!(parse(no_hosts).is_err());
        // Neither hosts nor inject: a secret only Ostiary reads (a webhook's signing key).
        let own = parse("name = \"x\"\nsource = { file = \"x\" }").unwrap();
        assert_eq!(own.inject, Injection::Nowhere);
        assert!(own.hosts.is_empty());
        let no_inject = "name = \"x\"\nsource = { file = \"x\" }\nhosts = [\"x.com\"]";
        assert!(parse(no_inject).is_err());
        let upper = "name = \"x\"\nsource = { file = \"x\" }\nhosts = [\"API.x.com\"]\ninject = { query = \"k\" }";
        assert!(parse(upper).is_err());
        let port = "name = \"x\"\nsource = { file = \"x\" }\nhosts = [\"x.com:443\"]\ninject = { query = \"k\" }";
        assert!(parse(port).is_err());
        let v6 = "name = \"x\"\nsource = { file = \"x\" }\nhosts = [\"::1\"]\ninject = { query = \"k\" }";
        assert!(parse(v6).is_ok());
        let pki_as_header = "name = \"x\"\nsource = { vault_pki = { role = \"r\" } }\nhosts = [\"x.com\"]\ninject = { query = \"k\" }";
        assert!(parse(pki_as_header).is_err());
    }

    #[test]
    fn wildcards_are_anchored_at_a_dot() {
        let b = parse(&format!("{BASE}inject = {{ query = \"k\" }}")).unwrap();
        assert!(b.allows_host("api.github.com"));
        assert!(!b.allows_host("evilapi.github.com"));
        assert!(!b.allows_host("api.github.com.evil.io"));
        assert!(b.allows_host("a.example.com"));
        assert!(b.allows_host("a.b.example.com"));
        assert!(!b.allows_host("example.com"));
        assert!(!b.allows_host("evilexample.com"));
        assert!(!b.allows_host(".example.com"));
    }
}
