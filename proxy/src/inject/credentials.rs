//! Brokered credentials into the upstream request, and the scrubber for its response.
//!
//! Runs after policy allowed the request and after the request was pointed at its checked
//! upstream URI. For a host that some `[[credential]]` binding names:
//! 1. the credential must travel over https: the connector verifies the upstream's
//!    certificate for this exact host before a byte of the request is written, so a secret
//!    never goes to an unverified peer (plain http to a bound host is refused);
//! 2. each binding's credential comes from the broker (cached per session; a failure is
//!    `503 credential_unavailable` and nothing is forwarded);
//! 3. placeholders of those credentials are swapped in headers and the query;
//! 4. the agent's `Authorization`, `Cookie` and the bindings' own headers are removed — the
//!    agent never chooses which secret is used — and the credentials are written;
//! 5. the upstream is asked for identity encoding and a whole (not ranged) response, and a
//!    [`Scrubber`] over every injected value is handed back for the response.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use http::header::{AUTHORIZATION, COOKIE, IF_RANGE, RANGE};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Uri};
use ostiary_broker::{Broker, Held, Injection, Material, MintFor, Secret};

use super::body_guard::{BodyGuard, Tripped};
use super::placeholders::{self, Found};
use crate::body::ProxyBody;
use crate::classify::Target;
use crate::error::ProxyError;
use crate::metrics::{CredentialLabels, Metrics};
use crate::scrub::{self, Scrubber};
use crate::session::Principal;
use prometheus_client::metrics::counter::Counter;

/// The broker and what the proxy derives from its credentials.
#[derive(Debug)]
pub struct Credentials {
    pub broker: Arc<Broker>,
    /// One scrubber per set of several injected credentials (by the broker's credential
    /// ids): building one compiles an automaton, which must not happen per request. A
    /// single credential's scrubber is kept with the credential itself.
    scrubbers: moka::sync::Cache<Vec<u64>, Scrubber>,
    /// The `cached` outcome counter of each binding, made once: counting a cache hit must
    /// not allocate label strings on every request.
    cache_hits: HashMap<String, Counter>,
    /// Placeholders in streamed request bodies.
    body_guard: BodyGuard,
}

/// What was injected into one request.
#[derive(Debug, Default)]
pub struct Injected {
    pub held: Vec<Arc<Held>>,
    /// Redacts every injected value from the response; `None` when nothing was injected.
    pub scrubber: Option<Scrubber>,
    /// The mTLS client certificate to present, if a binding asks for one.
    pub identity: Option<Arc<Held>>,
}

impl Injected {
    /// Binding names, for audit and metrics.
    pub fn names(&self) -> Vec<String> {
        self.held.iter().map(|h| h.binding.name.clone()).collect()
    }

    /// Lease ids, for audit.
    pub fn leases(&self) -> Vec<String> {
        self.held
            .iter()
            .filter_map(|h| h.credential.lease_id().map(str::to_owned))
            .collect()
    }
}

/// What the injection needs to know of the request besides its head.
#[derive(Debug, Clone, Copy)]
pub struct Bound<'a> {
    pub target: &'a Target,
    pub principal: &'a Principal,
    /// The catalogued tool, if the request is a tool call (a transit JWT names it).
    pub tool: Option<&'a str>,
    /// A WebSocket handshake: credentials never ride one.
    pub upgrade: bool,
}

impl Credentials {
    pub fn new(broker: Arc<Broker>, metrics: &Metrics) -> Self {
        let cache_hits = broker
            .bindings()
            .iter()
            .map(|b| {
                let counter = metrics
                    .credentials
                    .get_or_create(&CredentialLabels {
                        credential: b.name.clone(),
                        source: b.source.kind().to_owned(),
                        outcome: "cached".to_owned(),
                    })
                    .clone();
                (b.name.clone(), counter)
            })
            .collect();
        Self {
            body_guard: BodyGuard::new(&broker),
            broker,
            cache_hits,
            scrubbers: moka::sync::Cache::builder()
                .max_capacity(10_000)
                // Teardown drops the scrubbers of a session's credentials by predicate.
                .support_invalidation_closures()
                .time_to_idle(std::time::Duration::from_secs(600))
                .build(),
        }
    }

    /// Placeholders in the request head, refused when headed for a host they are not
    /// bound to. `body` is a body already read whole (tool calls, MCP), if any.
    pub fn placeholders(
        &self,
        headers: &http::HeaderMap,
        uri: &Uri,
        body: Option<&[u8]>,
        host: &str,
        principal: &crate::session::Principal,
        metrics: &Metrics,
    ) -> Result<Found, ProxyError> {
        let mut found = Found::default();
        found.scan_head(&self.broker, headers, uri);
        if let Some(body) = body {
            found.scan(&self.broker, body);
        }
        found
            .check_owner(&principal.session_id, principal.parent.is_some())
            .inspect_err(|_| {
                // Counted with the exfiltration attempts: a placeholder where it does not
                // belong, whichever way.
                if let Some(name) = found.names().first() {
                    metrics.placeholder_exfiltration(name);
                }
            })?;
        found.check(&self.broker, host).inspect_err(|e| {
            if let ProxyError::PlaceholderExfiltration { credential, .. } = e {
                metrics.placeholder_exfiltration(credential);
            }
        })?;
        Ok(found)
    }

    /// Guard a streamed body going to `host` against placeholders of credentials not bound
    /// to it; `Err` gives the body back unchanged when nothing could be refused there.
    pub fn guard_body(
        &self,
        host: &str,
        body: ProxyBody,
    ) -> Result<(ProxyBody, Tripped), ProxyBody> {
        self.body_guard.wrap(&self.broker, host, body)
    }

    /// Inject the credentials bound to the target's host into `parts` (see the module docs).
    pub async fn apply(
        &self,
        parts: &mut Parts,
        request: Bound<'_>,
        found: &Found,
        metrics: &Metrics,
    ) -> Result<Injected, ProxyError> {
        let Bound {
            target,
            principal,
            tool,
            upgrade,
        } = request;
        let host = target.host.to_string();
        let bindings: Vec<_> = self.broker.for_host(&host).cloned().collect();
        let Some(first) = bindings.first() else {
            return Ok(Injected::default());
        };
        if target.scheme != "https" {
            return Err(ProxyError::CredentialRefused {
                credential: first.name.clone(),
                reason: "credential_needs_tls",
            });
        }
        // An upgraded connection is spliced raw: nothing could scrub a secret echoed in its
        // frames, so a credential never rides one.
        if upgrade {
            return Err(ProxyError::CredentialRefused {
                credential: first.name.clone(),
                reason: "credential_over_upgrade",
            });
        }
        let who = MintFor {
            session: &principal.session_id,
            agent: &principal.agent,
            tenant: &principal.tenant,
            host: &host,
            tool,
        };
        let mut injected = Injected::default();
        for binding in &bindings {
            let started = Instant::now();
            let result = self.broker.credential(binding, &who).await;
            let source = binding.source.kind();
            match result {
                Ok((held, fetched)) => {
                    match (fetched, self.cache_hits.get(&binding.name)) {
                        (false, Some(hits)) => {
                            hits.inc();
                        }
                        _ => metrics.credential_outcome(
                            &binding.name,
                            source,
                            if fetched { "fetched" } else { "cached" },
                            fetched.then(|| started.elapsed()),
                        ),
                    }
                    injected.held.push(held);
                }
                Err(e) => {
                    metrics.credential_outcome(&binding.name, source, e.kind(), None);
                    tracing::warn!(credential = %binding.name, error = %e, "credential unavailable");
                    return Err(ProxyError::CredentialUnavailable {
                        credential: binding.name.clone(),
                        cause: e.kind().to_owned(),
                    });
                }
            }
        }

        // Placeholders first: some sit in headers removed below, and the rest must carry
        // the secret, never the placeholder, upstream.
        for held in &injected.held {
            if found.names().contains(&held.binding.name) {
                swap_placeholders(parts, held)?;
            }
        }
        parts.headers.remove(AUTHORIZATION);
        parts.headers.remove(COOKIE);
        for held in &injected.held {
            if let Some(name) = held.binding.inject.header_name() {
                parts.headers.remove(name);
            }
        }
        for held in &injected.held {
            write(parts, held)?;
            if matches!(held.binding.inject, Injection::Mtls) {
                injected.identity = Some(held.clone());
            }
        }
        scrub::request_identity(&mut parts.headers);
        // A partial response could start inside an echoed secret, and its rest would not
        // match any pattern: credentialed requests get whole responses.
        parts.headers.remove(RANGE);
        parts.headers.remove(IF_RANGE);
        injected.scrubber = Some(self.scrubber(&injected.held));
        Ok(injected)
    }

    fn scrubber(&self, held: &[Arc<Held>]) -> Scrubber {
        if let [one] = held {
            let derived = one.derived.get_or_init(|| Arc::new(build_scrubber(held)));
            if let Some(scrubber) = derived.downcast_ref::<Scrubber>() {
                return scrubber.clone();
            }
        }
        let mut key: Vec<u64> = held.iter().map(|h| h.id).collect();
        key.sort_unstable();
        self.scrubbers.get_with(key, || build_scrubber(held))
    }

    /// Drop what the proxy derived from a session's credentials (teardown).
    pub fn forget(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let ids = ids.to_vec();
        if let Err(e) = self
            .scrubbers
            .invalidate_entries_if(move |key, _| key.iter().any(|id| ids.contains(id)))
        {
            // Only a builder without invalidation closures fails here; they then idle out.
            tracing::warn!(error = %e, "scrubbers of ended credentials not dropped");
        }
    }
}

/// A scrubber over every value injected from `held`.
fn build_scrubber(held: &[Arc<Held>]) -> Scrubber {
    let mut values: Vec<String> = Vec::new();
    for h in held {
        values.extend(
            h.credential
                .secret_values()
                .iter()
                .map(|s| s.expose().to_owned()),
        );
        // What a Basic header carries is base64 of the pair, not of either part.
        if let Some(pair) = basic_pair(h) {
            values.push(pair.expose().to_owned());
            values.push(base64::engine::general_purpose::STANDARD.encode(pair.expose()));
        }
    }
    Scrubber::new(values.iter().map(String::as_str))
}

/// The value a placeholder stands for: the token, or the password of a pair.
fn placeholder_value(held: &Held) -> Option<&Secret> {
    match &held.credential.material {
        Material::Token(s) => Some(s),
        Material::Basic { password, .. } => Some(password),
        Material::ClientCert(_) => None,
    }
}

/// `user:password` for a Basic injection.
fn basic_pair(held: &Held) -> Option<Secret> {
    let Injection::Basic { username } = &held.binding.inject else {
        return None;
    };
    let (user, password) = match (&held.credential.material, username) {
        (Material::Basic { username, password }, None) => (username.expose().to_owned(), password),
        (Material::Basic { password, .. }, Some(user)) => (user.clone(), password),
        (Material::Token(token), Some(user)) => (user.clone(), token),
        (Material::Token(token), None) => (String::new(), token),
        (Material::ClientCert(_), _) => return None,
    };
    Some(Secret::new(format!("{user}:{}", password.expose())))
}

fn unusable(held: &Held, why: &str) -> ProxyError {
    ProxyError::CredentialUnavailable {
        credential: held.binding.name.clone(),
        cause: why.to_owned(),
    }
}

/// A header value from a secret-bearing string; CR, LF and NUL are refused, never sent.
fn header_value(held: &Held, text: &str) -> Result<HeaderValue, ProxyError> {
    let mut value =
        HeaderValue::from_str(text).map_err(|_invalid| unusable(held, "value_not_header_safe"))?;
    value.set_sensitive(true);
    Ok(value)
}

fn swap_placeholders(parts: &mut Parts, held: &Held) -> Result<(), ProxyError> {
    let Some(secret) = placeholder_value(held) else {
        return Ok(());
    };
    let name = &held.binding.name;
    let mut replaced: Vec<(HeaderName, HeaderValue)> = Vec::new();
    let names: Vec<HeaderName> = parts.headers.keys().cloned().collect();
    for header in names {
        let values: Vec<HeaderValue> = parts.headers.get_all(&header).iter().cloned().collect();
        let mut changed = false;
        let mut new_values = Vec::with_capacity(values.len());
        for value in values {
            match value
                .to_str()
                .ok()
                .and_then(|v| placeholders::swap(v, name, secret.expose()))
            {
                Some(text) => {
                    changed = true;
                    new_values.push(header_value(held, &text)?);
                }
                None => new_values.push(value),
            }
        }
        if changed {
            parts.headers.remove(&header);
            replaced.extend(new_values.into_iter().map(|v| (header.clone(), v)));
        }
    }
    for (header, value) in replaced {
        parts.headers.append(header, value);
    }
    if let Some(pq) = parts.uri.path_and_query() {
        let encoded = percent_encode(secret.expose());
        let spelled = placeholders::unescape_colons(pq.as_str());
        let swapped = placeholders::swap(&spelled, name, &encoded);
        if let Some(new) = swapped {
            set_path_and_query(parts, &new, held)?;
        }
    }
    Ok(())
}

fn write(parts: &mut Parts, held: &Held) -> Result<(), ProxyError> {
    match &held.binding.inject {
        Injection::Header { name, template } => {
            let mut text = template.clone();
            match &held.credential.material {
                Material::Token(s) => text = text.replace("{secret}", s.expose()),
                Material::Basic { username, password } => {
                    text = text
                        .replace("{username}", username.expose())
                        .replace("{password}", password.expose())
                        .replace("{secret}", password.expose());
                }
                Material::ClientCert(_) => return Err(unusable(held, "certificate_in_header")),
            }
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_invalid| unusable(held, "invalid_header_name"))?;
            parts.headers.insert(header, header_value(held, &text)?);
        }
        Injection::Basic { .. } => {
            let pair = basic_pair(held).ok_or_else(|| unusable(held, "no_basic_pair"))?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair.expose());
            parts.headers.insert(
                AUTHORIZATION,
                header_value(held, &format!("Basic {encoded}"))?,
            );
        }
        Injection::Query(param) => {
            let secret = placeholder_value(held).ok_or_else(|| unusable(held, "no_query_value"))?;
            let pq = parts
                .uri
                .path_and_query()
                .map(|pq| pq.as_str().to_owned())
                .unwrap_or_else(|| "/".to_owned());
            let (path, query) = pq.split_once('?').unwrap_or((&pq, ""));
            // The agent's own parameter of that name goes: the agent does not choose.
            let mut kept: Vec<&str> = query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .filter(|pair| {
                    let key = pair.split('=').next().unwrap_or_default();
                    percent_decode_str(key) != *param
                })
                .collect();
            let ours = format!("{param}={}", percent_encode(secret.expose()));
            kept.push(&ours);
            set_path_and_query(parts, &format!("{path}?{}", kept.join("&")), held)?;
        }
        Injection::Mtls => {
            if !matches!(held.credential.material, Material::ClientCert(_)) {
                return Err(unusable(held, "not_a_certificate"));
            }
        }
    }
    Ok(())
}

fn set_path_and_query(parts: &mut Parts, pq: &str, held: &Held) -> Result<(), ProxyError> {
    let mut uri = std::mem::take(&mut parts.uri).into_parts();
    uri.path_and_query = Some(
        pq.parse()
            .map_err(|_invalid| unusable(held, "value_not_uri_safe"))?,
    );
    parts.uri = Uri::from_parts(uri).map_err(|_invalid| unusable(held, "value_not_uri_safe"))?;
    Ok(())
}

/// RFC 3986 unreserved characters pass; everything else is `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode_str(text: &str) -> String {
    url::form_urlencoded::parse(format!("{text}=").as_bytes())
        .next()
        .map(|(k, _)| k.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_is_strict() {
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(percent_decode_str("api%5Fkey"), "api_key");
    }
}
