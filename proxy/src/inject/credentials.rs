//! Brokered credentials into the upstream request, and the scrubber for its response.
//!
//! Runs after policy allowed the request and after the request was pointed at its checked
//! upstream URI. For a host that some `[[credential]]` binding names:
//! 1. the credential must travel over https: the connector verifies the upstream's
//!    certificate for this exact host before a byte of the request is written, so a secret
//!    never goes to an unverified peer (plain http to a bound host is refused);
//! 2. each binding's credential comes from the broker (cached per session; a failure is
//!    `503 credential_unavailable` and nothing is forwarded);
//! 3. the agent's `Authorization`, `Cookie`, the bindings' own headers and the query
//!    parameter of a query binding are removed — the agent never chooses which secret is
//!    used — and the credentials are written there. That is also what becomes of a
//!    placeholder at its injection point (`Authorization: Bearer ostiary:github`): it is
//!    overwritten, never swapped in place; a placeholder anywhere else was refused before
//!    policy ([`super::placeholders`]), so no secret lands where the agent put it.
//!
//! Every response — of any session, towards a bound host or not — is scrubbed of every
//! secret the process has injected ([`KnownSecrets`]): an upstream that stored a secret (it
//! logs the headers it receives) may hand it back through another route or another host,
//! to whoever asks, in the answer to a request that carried no credential. The values of
//! this request's credentials join the scrubber before it is forwarded. Once any secret is
//! known, requests ask for identity encoding and whole (not ranged) responses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine;
use http::header::{AUTHORIZATION, COOKIE, IF_RANGE, RANGE};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Uri};
use ostiary_broker::{Binding, Broker, Held, Injection, Material, MintFor, Secret, SourceSpec};

use super::body_guard::{BodyGuard, Tripped};
use super::known::{self, KnownSecrets};
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
    /// Every secret injected so far, and the scrubber over them all.
    known: Arc<KnownSecrets>,
    /// The `cached` outcome counter of each binding, made once: counting a cache hit must
    /// not allocate label strings on every request.
    cache_hits: HashMap<String, Counter>,
    /// Placeholders in streamed request bodies.
    body_guard: BodyGuard,
    /// The lasting credentials not read yet ([`Credentials::learn_lasting`]), which the
    /// reaper tries again; `None` before the first try.
    lasting_unread: Mutex<Option<Vec<String>>>,
}

/// What was injected into one request.
#[derive(Debug, Default)]
pub struct Injected {
    pub held: Vec<Arc<Held>>,
    /// Redacts every secret the process has injected (those injected here among them)
    /// from the response; `None` while it has injected none.
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
    /// Whose credentials these are, when not the principal's session: an undo of a session
    /// that already ended mints under a scope of its own, ended when the undo is done.
    pub scope: Option<&'a str>,
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
            known: Arc::default(),
            lasting_unread: Mutex::new(None),
        }
    }

    /// Placeholders in the request head (and `body`, a body already read whole: tool
    /// calls, MCP), refused when headed for a host they are not bound to, when they stand
    /// anywhere but their binding's injection point, or belong to another session.
    pub fn placeholders(
        &self,
        headers: &http::HeaderMap,
        uri: &Uri,
        body: Option<&[u8]>,
        host: &str,
        principal: &crate::session::Principal,
        metrics: &Metrics,
    ) -> Result<(), ProxyError> {
        let mut found = Found::default();
        found.scan_head(&self.broker, headers, uri);
        if let Some(body) = body {
            found.scan_body(&self.broker, body);
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
        })
    }

    /// Guard a streamed body against placeholders (none belongs in a body); `Err` gives
    /// the body back unchanged when no placeholder is configured.
    pub fn guard_body(&self, body: ProxyBody) -> Result<(ProxyBody, Tripped), ProxyBody> {
        self.body_guard.wrap(body)
    }

    /// The refusal for a body guard that tripped on its way to `host` (counted), if it did.
    pub fn tripped(&self, tripped: &Tripped, host: &str, metrics: &Metrics) -> Option<ProxyError> {
        let credential = tripped.get()?;
        metrics.placeholder_exfiltration(credential);
        let binding = self.broker.binding(credential);
        Some(ProxyError::PlaceholderExfiltration {
            credential: credential.clone(),
            host: host.to_owned(),
            at: placeholders::Spot::Body.describe(),
            point: binding
                .filter(|b| b.allows_host(host))
                .map(|b| placeholders::injection_point(b).unwrap_or_else(|| "nowhere".into())),
        })
    }

    /// Inject the credentials bound to the target's host into `parts`, and hand back the
    /// session's response scrubber (see the module docs).
    pub async fn apply(
        &self,
        parts: &mut Parts,
        request: Bound<'_>,
        metrics: &Metrics,
    ) -> Result<Injected, ProxyError> {
        let Bound {
            target,
            principal,
            tool,
            upgrade,
            scope,
        } = request;
        let session = scope.unwrap_or(&principal.session_id);
        let host = target.host.to_string();
        let bindings: Vec<_> = self.broker.for_host(&host).cloned().collect();
        let Some(first) = bindings.first() else {
            let scrubber = self.known.scrubber();
            if scrubber.is_some() {
                protect_response(&mut parts.headers);
            }
            return Ok(Injected {
                scrubber,
                ..Injected::default()
            });
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
            session,
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

        // A placeholder at a binding's injection point goes with the agent's value it sits
        // in: the credential is written over it.
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
        protect_response(&mut parts.headers);
        // Before the request leaves: from then on an upstream may hold these values.
        injected.scrubber = self.known.learn(&injected.held);
        Ok(injected)
    }

    /// Stop tracking credentials the broker dropped (teardown); their values stay known
    /// until they end ([`KnownSecrets::forget`]).
    pub fn forget(&self, ids: &[u64]) {
        self.known.forget(ids);
    }

    /// Every secret injected so far.
    pub fn known(&self) -> &Arc<KnownSecrets> {
        &self.known
    }

    /// Learn the values of every credential whose value outlives a process (`file`,
    /// `vault_kv`), read from their sources now, so that answers are scrubbed of them
    /// before this process injected any ([`KnownSecrets::learn_lasting`]). One that cannot
    /// be read (Vault not connected yet, a name missing from the file) is tried again at
    /// the reaper's next round, alone: those read are not read again. Returns how many
    /// could not be read.
    pub async fn learn_lasting(&self) -> usize {
        let due: Vec<Arc<Binding>> = {
            let unread = self
                .lasting_unread
                .lock()
                .expect("lasting credentials poisoned");
            self.broker
                .bindings()
                .iter()
                .filter(|b| matches!(b.source, SourceSpec::File(_) | SourceSpec::VaultKv(_)))
                .filter(|b| unread.as_ref().is_none_or(|names| names.contains(&b.name)))
                .cloned()
                .collect()
        };
        let mut values = Vec::new();
        let mut unread = Vec::new();
        for binding in due {
            match self.broker.static_secret(&binding.name).await {
                Ok(secret) => values.extend(known::values_from(
                    &binding.inject,
                    &Material::Token(secret.clone()),
                    vec![secret],
                )),
                Err(e) => {
                    tracing::debug!(credential = %binding.name, error = %e,
                        "a lasting credential could not be read to be scrubbed; tried again");
                    unread.push(binding.name.clone());
                }
            }
        }
        if !values.is_empty() {
            // Compiling takes milliseconds per value: not on a runtime worker.
            let known = self.known.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || known.learn_lasting(values)).await {
                tracing::error!(error = %e, "learning the lasting credentials failed");
                // Nothing was learned: every one is tried again.
                *self
                    .lasting_unread
                    .lock()
                    .expect("lasting credentials poisoned") = None;
                return usize::MAX;
            }
        }
        let count = unread.len();
        *self
            .lasting_unread
            .lock()
            .expect("lasting credentials poisoned") = Some(unread);
        count
    }
}

/// Ask for a response that can be scrubbed: identity-encoded, and whole — a partial
/// response could start inside an echoed secret, and its rest would match no pattern.
fn protect_response(headers: &mut http::HeaderMap) {
    scrub::request_identity(headers);
    headers.remove(RANGE);
    headers.remove(IF_RANGE);
}

/// The value a placeholder stands for: the token, or the password of a pair.
fn placeholder_value(held: &Held) -> Option<&Secret> {
    match &held.credential.material {
        Material::Token(s) => Some(s),
        Material::Basic { password, .. } => Some(password),
        Material::ClientCert(_) => None,
    }
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
            let pair = known::basic_pair(held).ok_or_else(|| unusable(held, "no_basic_pair"))?;
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
                .filter(|pair| placeholders::query_param_name(pair) != param.as_str())
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
        // Never bound to a host, so never reached; refused rather than sent if it were.
        Injection::Nowhere => return Err(unusable(held, "not_for_injection")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::address::normalize_host;

    struct Fixture {
        credentials: Credentials,
        metrics: Metrics,
        _dir: tempfile::TempDir,
    }

    /// `one` on `one.example`, `two` on `two.example`; `none.example` is bound to nothing.
    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets.toml");
        std::fs::write(
            &file,
            "one = \"secret-one-0123\"\ntwo = \"secret-two-4567\"\n",
        )
        .unwrap();
        let binding = |name: &str| {
            toml::from_str(&format!(
                "name = \"{name}\"\nsource = {{ file = \"{name}\" }}\nhosts = [\"{name}.example\"]\n\
                 inject = {{ header = \"Authorization\", value = \"Bearer {{secret}}\" }}"
            ))
            .unwrap()
        };
        let broker = Broker::new(vec![binding("one"), binding("two")], Some(file), None).unwrap();
        let metrics = Metrics::default();
        Fixture {
            credentials: Credentials::new(Arc::new(broker), &metrics),
            metrics,
            _dir: dir,
        }
    }

    fn principal(session: &str) -> Principal {
        Principal {
            session_id: session.into(),
            agent: "a".into(),
            tenant: "default".into(),
            depth: 0,
            parent: None,
            parent_agent: None,
            profile: None,
            expires_at: i64::MAX,
        }
    }

    /// One request of `session` to `host`: what reached the upstream's head, and the scrubber.
    async fn send(f: &Fixture, session: &str, host: &str) -> (http::HeaderMap, Option<Scrubber>) {
        let target = Target {
            scheme: "https",
            host: normalize_host(host).unwrap(),
            port: 443,
            method: http::Method::GET,
            path: "/".into(),
            query: String::new(),
        };
        let req = http::Request::builder()
            .uri(format!("https://{host}/"))
            .header("accept-encoding", "gzip")
            .header("range", "bytes=0-1")
            .body(())
            .unwrap();
        let (mut parts, ()) = req.into_parts();
        let principal = principal(session);
        let bound = Bound {
            target: &target,
            principal: &principal,
            tool: None,
            upgrade: false,
            scope: None,
        };
        let injected = f
            .credentials
            .apply(&mut parts, bound, &f.metrics)
            .await
            .unwrap();
        (parts.headers, injected.scrubber)
    }

    fn scrubs(scrubber: &Scrubber, secret: &str) -> bool {
        scrubber.scrub_bytes(secret.as_bytes()) != secret.as_bytes()
    }

    #[tokio::test]
    async fn every_answer_of_every_session_is_scrubbed_of_every_secret_injected() {
        let f = fixture();
        // Nothing injected yet: no scrubber, and the request passes as it came.
        let (headers, scrubber) = send(&f, "s", "none.example").await;
        assert!(scrubber.is_none());
        assert_eq!(headers["accept-encoding"], "gzip");
        assert!(headers.contains_key("range"));

        let (_, scrubber) = send(&f, "s", "one.example").await;
        let built = scrubber.unwrap();
        assert!(scrubs(&built, "secret-one-0123"));
        assert_eq!(f.credentials.known().len(), 1);

        // To an unbound host: the scrubber already built, not another.
        let (headers, scrubber) = send(&f, "s", "none.example").await;
        let again = scrubber.unwrap();
        assert!(scrubs(&again, "secret-one-0123"));
        assert!(again.same_as(&built), "not rebuilt");
        assert_eq!(headers["accept-encoding"], "identity");
        assert!(!headers.contains_key("range"));
        // Nor for the same credential again.
        let (_, scrubber) = send(&f, "s", "one.example").await;
        assert!(scrubber.unwrap().same_as(&built));

        // Another credential: rebuilt once, covering both.
        let (_, scrubber) = send(&f, "s", "two.example").await;
        let scrubber = scrubber.unwrap();
        assert!(scrubs(&scrubber, "secret-one-0123") && scrubs(&scrubber, "secret-two-4567"));
        assert_eq!(f.credentials.known().len(), 2);

        // A session that holds nothing — an upstream stored what `s` sent it — is scrubbed
        // of it all the same, and asks for what can be scrubbed.
        let (headers, scrubber) = send(&f, "other", "none.example").await;
        let scrubber = scrubber.unwrap();
        assert!(scrubs(&scrubber, "secret-one-0123") && scrubs(&scrubber, "secret-two-4567"));
        assert_eq!(headers["accept-encoding"], "identity");

        // The same file secret fetched by another session adds no value: no rebuild.
        let (_, mine) = send(&f, "other", "one.example").await;
        assert!(mine.unwrap().same_as(&scrubber));

        // Teardown: a file secret outlives the session, so it stays known.
        let report = f.credentials.broker.end_session("s").await;
        assert!(!report.dropped.is_empty());
        f.credentials.forget(&report.dropped);
        let (_, scrubber) = send(&f, "third", "none.example").await;
        assert!(scrubs(&scrubber.unwrap(), "secret-one-0123"));
    }

    #[test]
    fn percent_encoding_is_strict() {
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(placeholders::query_param_name("api%5Fkey=1"), "api_key");
        assert_eq!(placeholders::query_param_name("api_key"), "api_key");
    }
}
