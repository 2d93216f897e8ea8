//! Vault/OpenBao: authentication, token renewal, and the four sources (KV v2, transit JWT,
//! PKI, database) plus lease revocation.
//!
//! The client logs in once (a token from the environment, or AppRole), keeps its token
//! alive in the background, and is shared by every session (`&self` everywhere): the token
//! lives only inside vaultrs's client, which is swapped whole when AppRole logs in again.
//! Every request has a timeout, so a hung Vault fails a request instead of hanging the
//! proxy, and every failure maps to a [`VaultError`] that never carries Vault's error body
//! or a secret.

mod auth;
pub mod health;
mod http;
mod jwt;
mod sources;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Deserialize;

use crate::credential::{Credential, Lease, MintFor, Revocation};
use crate::source::SourceSpec;

use self::http::Method;

/// Tracing targets that must be capped at `warn` (e.g. `rustify=warn,vaultrs=warn,reqwest=warn`
/// in the filter), because below that they describe Vault traffic. Read from their source
/// (rustify 0.6.1, vaultrs 0.7.4) and checked at TRACE by the `broker_vault` tests, which
/// assert that no token, secret id or secret value reaches the log even at TRACE:
/// - `rustify` (DEBUG `rustify::client`, `rustify::endpoint`, `rustify::http`): each
///   request's method, full URL and body size, each response's status and body size; its
///   `#[instrument]` spans (INFO level) record the base URL, path and method. At ERROR,
///   `#[instrument(err)]` logs "Server returned error" (no body) for every non-2xx answer,
///   including the 404s the broker expects (e.g. probing a revoked certificate): a filter
///   that wants no noise sets `rustify=off`; our [`VaultError`] carries what matters.
/// - `vaultrs` (DEBUG `vaultrs::client`: where the address/token came from, not the token;
///   TRACE `vaultrs::api`: middleware steps such as "adding token to header", final URLs).
///   Its ERROR/WARN events carrying Vault's own error and warning strings
///   (`vaultrs::api::{parse_err, strip}`) are never reached: Ostiary does not call those
///   helpers (see `http.rs`), and the cap keeps it that way if someone does.
/// - `reqwest` (DEBUG/TRACE): connection and redirect details of the same requests.
///
/// `hyper_util` (DEBUG/TRACE: connection pool and connect events, no headers or bodies)
/// is left to the proxy's own filter.
pub const QUIET_TARGETS: &[&str] = &["rustify", "vaultrs", "reqwest"];

/// How long one Vault request may take before it fails as [`VaultError::Unreachable`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// `[broker.vault]` of the config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VaultConfig {
    #[serde(default = "default_addr")]
    pub addr: String,
    #[serde(default)]
    pub auth: VaultAuth,
}

fn default_addr() -> String {
    "http://127.0.0.1:8200".into()
}

/// How Ostiary logs in: `{ token_env = "VAULT_TOKEN" }` or
/// `{ approle = { role_id = "...", secret_id_env = "..." } }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VaultAuth {
    pub token_env: Option<String>,
    pub approle: Option<AppRoleAuth>,
}

impl Default for VaultAuth {
    fn default() -> Self {
        Self {
            token_env: Some("VAULT_TOKEN".into()),
            approle: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppRoleAuth {
    #[serde(default = "default_approle_mount")]
    pub mount: String,
    pub role_id: String,
    pub secret_id_env: String,
}

fn default_approle_mount() -> String {
    "approle".into()
}

/// Why Vault did not give what was asked. Never holds a secret or Vault's raw error body.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VaultError {
    #[error("vault is unreachable: {0}")]
    Unreachable(String),
    #[error("vault is sealed")]
    Sealed,
    #[error("vault denied the request ({status}) at {path}")]
    Denied { status: u16, path: String },
    #[error("nothing at {0}")]
    NotFound(String),
    #[error("vault answered something unexpected at {path}: {reason}")]
    Malformed { path: String, reason: String },
    #[error("logging in to vault: {0}")]
    Auth(String),
}

impl VaultError {
    pub fn kind(&self) -> &'static str {
        match self {
            VaultError::Unreachable(_) => "vault_unreachable",
            VaultError::Sealed => "vault_sealed",
            VaultError::Denied { .. } => "vault_denied",
            VaultError::NotFound(_) => "vault_not_found",
            VaultError::Malformed { .. } => "vault_malformed",
            VaultError::Auth(_) => "vault_auth",
        }
    }
}

/// A logged-in Vault client. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct VaultClient {
    addr: String,
    auth: VaultAuth,
    timeout: Duration,
    /// vaultrs's client holds the token. Swapped whole when AppRole logs in again; readers
    /// clone the `Arc` and never hold the lock across an await.
    inner: RwLock<Arc<vaultrs::client::VaultClient>>,
    /// What lookup-self said about the current token.
    token: Mutex<auth::TokenInfo>,
    /// Transit key type and latest version, per (mount, key).
    transit_keys: Mutex<HashMap<(String, String), jwt::KeyInfo>>,
}

impl std::fmt::Debug for VaultClient {
    // Hand-written: vaultrs's settings derive Debug and would print the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = self.token_info();
        f.debug_struct("VaultClient")
            .field("addr", &self.addr)
            .field(
                "auth",
                &if self.auth.approle.is_some() {
                    "approle"
                } else {
                    "token"
                },
            )
            .field("token_ttl", &token.ttl)
            .field("token_renewable", &token.renewable)
            .finish_non_exhaustive()
    }
}

impl VaultClient {
    /// Log in (token from the environment, or AppRole) and check the token with
    /// lookup-self.
    pub async fn connect(config: &VaultConfig) -> Result<Self, VaultError> {
        Self::connect_with_timeout(config, DEFAULT_TIMEOUT).await
    }

    /// [`connect`](Self::connect) with a per-request timeout other than [`DEFAULT_TIMEOUT`].
    pub async fn connect_with_timeout(
        config: &VaultConfig,
        timeout: Duration,
    ) -> Result<Self, VaultError> {
        let (inner, token) = auth::login(&config.addr, &config.auth, timeout).await?;
        Ok(Self {
            addr: config.addr.clone(),
            auth: config.auth.clone(),
            timeout,
            inner: RwLock::new(Arc::new(inner)),
            token: Mutex::new(token),
            transit_keys: Mutex::new(HashMap::new()),
        })
    }

    /// Renew the client's own token before it expires (re-login with AppRole when renewal
    /// is refused) until `shutdown` resolves.
    pub async fn keep_token_alive(&self, shutdown: impl std::future::Future<Output = ()>) {
        auth::keep_alive(self, shutdown).await
    }

    /// Mint or read a credential for `who` from a Vault source. `File` sources are not Vault's.
    pub async fn mint(
        &self,
        spec: &SourceSpec,
        who: &MintFor<'_>,
    ) -> Result<Credential, VaultError> {
        match spec {
            SourceSpec::File(name) => Err(VaultError::Malformed {
                path: format!("file:{name}"),
                reason: "a file source is read by the file backend, not by Vault".into(),
            }),
            SourceSpec::VaultKv(kv) => sources::kv(self, kv).await,
            SourceSpec::VaultJwt(j) => jwt::mint(self, j, who).await,
            SourceSpec::VaultPki(p) => sources::pki(self, p, who).await,
            SourceSpec::VaultDatabase(d) => sources::database(self, d).await,
        }
    }

    /// One field of a KV v2 secret, read now (a static secret of Ostiary's own).
    pub async fn read_kv(&self, spec: &crate::source::KvSpec) -> Result<Credential, VaultError> {
        sources::kv(self, spec).await
    }

    /// Revoke a lease; revoking one that is already gone succeeds.
    pub async fn revoke(&self, lease: &Lease) -> Result<(), VaultError> {
        match &lease.revocation {
            Revocation::VaultLease => {
                let path = "sys/leases/revoke";
                let body = serde_json::json!({ "lease_id": lease.id });
                // OpenBao answers 204 for an unknown or already revoked lease too.
                self.call(Method::Put, path, Some(body)).await.map(drop)
            }
            Revocation::PkiSerial { mount, serial } => {
                let path = format!("{mount}/revoke");
                let body = serde_json::json!({ "serial_number": serial });
                match self.call(Method::Post, &path, Some(body)).await {
                    Ok(_) => Ok(()),
                    // An unknown serial: nothing left to revoke (expired and tidied, or
                    // never issued here). OpenBao answers 400 for it.
                    Err(VaultError::Malformed { .. }) | Err(VaultError::NotFound(_)) => {
                        match self.pki_cert_known(mount, serial).await? {
                            false => Ok(()),
                            true => Err(VaultError::Malformed {
                                path,
                                reason: "revocation refused for a known certificate".into(),
                            }),
                        }
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Whether `<mount>/cert/<serial>` exists.
    async fn pki_cert_known(&self, mount: &str, serial: &str) -> Result<bool, VaultError> {
        match self
            .call(Method::Get, &format!("{mount}/cert/{serial}"), None)
            .await
        {
            Ok(_) => Ok(true),
            Err(VaultError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The Vault address this client talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// One API call with the current token.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, VaultError> {
        let client = self.current();
        http::call(&client, method, path, body).await
    }

    fn current(&self) -> Arc<vaultrs::client::VaultClient> {
        // A poisoned lock still holds a usable client (it is only ever replaced whole).
        let guard = self.inner.read().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&guard)
    }

    fn token_info(&self) -> auth::TokenInfo {
        *self.token.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The proxy drives these from a multi-threaded runtime: their futures must be `Send`
    /// (no lock guard may live across an await).
    #[allow(dead_code)]
    fn futures_are_send(client: &VaultClient, spec: &SourceSpec, who: &MintFor<'_>, lease: &Lease) {
        assert_send(&client.mint(spec, who));
        assert_send(&client.revoke(lease));
        assert_send(&client.keep_token_alive(async {}));
    }

    #[test]
    fn errors_have_stable_kinds() {
        assert_eq!(VaultError::Sealed.kind(), "vault_sealed");
        assert_eq!(VaultError::NotFound("x".into()).kind(), "vault_not_found");
    }
}
