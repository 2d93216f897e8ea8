//! Logging in to Vault and keeping the token alive.
//!
//! Two ways in: a token read from an environment variable, or AppRole (role id from the
//! config, secret id from an environment variable, read again at each login so it is never
//! kept in our memory). Either way the token is checked with lookup-self, whose TTL drives
//! renewal: renew-self at about half the remaining TTL; when Vault refuses (or the token
//! reached its max TTL) and AppRole is configured, log in again and swap the client.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vaultrs::client::{Client as _, VaultClient as Inner, VaultClientSettingsBuilder};

use super::http::{call, Method};
use super::{VaultAuth, VaultClient, VaultError};

/// What Vault said about our token, and when.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenInfo {
    /// Remaining TTL at `seen`; zero for a non-expiring token (a root token).
    pub ttl: Duration,
    /// The TTL the token was created with: when a renewal gives much less, the max TTL is
    /// near and only a new login helps.
    pub creation_ttl: Duration,
    pub renewable: bool,
    pub seen: Instant,
}

impl TokenInfo {
    fn remaining(&self) -> Duration {
        self.ttl.saturating_sub(self.seen.elapsed())
    }
}

/// Log in as `auth` says and look the token up.
pub(crate) async fn login(
    addr: &str,
    auth: &VaultAuth,
    timeout: Duration,
) -> Result<(Inner, TokenInfo), VaultError> {
    // vaultrs's address setter panics on a bad URL: check first.
    let url = url::Url::parse(addr)
        .map_err(|e| VaultError::Auth(format!("vault address {addr:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(VaultError::Auth(format!(
            "vault address {addr:?} must be http:// or https://"
        )));
    }
    let (token, approle) = match (&auth.token_env, &auth.approle) {
        (Some(var), None) => {
            let token = std::env::var(var).map_err(|e| {
                VaultError::Auth(format!("reading the vault token from ${var}: {e}"))
            })?;
            if token.trim().is_empty() {
                return Err(VaultError::Auth(format!("${var} is empty")));
            }
            (token, None)
        }
        (None, Some(role)) => (String::new(), Some(role)),
        (Some(_), Some(_)) => {
            return Err(VaultError::Auth(
                "vault auth sets both token_env and approle; choose one".into(),
            ))
        }
        (None, None) => {
            return Err(VaultError::Auth(
                "vault auth sets neither token_env nor approle".into(),
            ))
        }
    };
    let mut client = build_client(addr, token, timeout)?;

    if let Some(role) = approle {
        let secret_id = std::env::var(&role.secret_id_env).map_err(|e| {
            VaultError::Auth(format!(
                "reading the AppRole secret id from ${}: {e}",
                role.secret_id_env
            ))
        })?;
        let path = format!("auth/{}/login", role.mount);
        let body = json!({ "role_id": role.role_id, "secret_id": secret_id });
        let answer = call(&client, Method::Post, &path, Some(body))
            .await
            .map_err(|e| as_auth_error(e, &format!("AppRole login at {path}")))?;
        let token = answer
            .pointer("/auth/client_token")
            .and_then(Value::as_str)
            .ok_or_else(|| VaultError::Auth(format!("{path} answered without a token")))?;
        client.set_token(token);
    }

    let info = lookup_self(&client)
        .await
        .map_err(|e| as_auth_error(e, "checking the token (lookup-self)"))?;
    Ok((client, info))
}

/// vaultrs's client, with an HTTP client we build ourselves: vaultrs's own honours
/// `HTTP(S)_PROXY` from the environment, which would send our token through whatever proxy
/// the process happens to be configured with (possibly Ostiary itself). TLS verification
/// is always on (`VAULT_SKIP_VERIFY` is ignored); extra roots from `VAULT_CACERT` /
/// `VAULT_CAPATH` are still trusted, as operators expect.
pub(crate) fn build_client(
    addr: &str,
    token: String,
    timeout: Duration,
) -> Result<Inner, VaultError> {
    let settings = VaultClientSettingsBuilder::default()
        .address(addr)
        .token(token)
        .timeout(Some(timeout))
        .verify(true)
        .build()
        .map_err(|e| VaultError::Auth(format!("vault client settings: {e}")))?;
    let mut http = reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout);
    for path in &settings.ca_certs {
        let pem = std::fs::read(path)
            .map_err(|e| VaultError::Auth(format!("reading CA certificate {path}: {e}")))?;
        let cert = reqwest::Certificate::from_pem(&pem)
            .map_err(|e| VaultError::Auth(format!("CA certificate {path}: {e}")))?;
        http = http.add_root_certificate(cert);
    }
    if let Some(identity) = &settings.identity {
        http = http.identity(identity.clone());
    }
    let http = http
        .build()
        .map_err(|e| VaultError::Auth(format!("building the HTTP client: {e}")))?;
    let middle = vaultrs::api::EndpointMiddleware {
        token: settings.token.clone(),
        version: format!("v{}", settings.version),
        wrap: None,
        namespace: settings.namespace.clone(),
    };
    Ok(Inner {
        http: rustify::clients::reqwest::Client::new(settings.address.as_str(), http),
        middle,
        settings,
    })
}

/// Network and seal problems stay what they are; a refusal is a login failure.
fn as_auth_error(e: VaultError, what: &str) -> VaultError {
    match e {
        VaultError::Unreachable(_) | VaultError::Sealed => e,
        VaultError::Denied { status, .. } => {
            VaultError::Auth(format!("{what}: refused ({status})"))
        }
        other => VaultError::Auth(format!("{what}: {other}")),
    }
}

async fn lookup_self(client: &Inner) -> Result<TokenInfo, VaultError> {
    let path = "auth/token/lookup-self";
    let answer = call(client, Method::Get, path, None).await?;
    let data = answer.get("data").ok_or_else(|| VaultError::Malformed {
        path: path.into(),
        reason: "no data".into(),
    })?;
    let secs = |field: &str| data.get(field).and_then(Value::as_u64).unwrap_or(0);
    Ok(TokenInfo {
        ttl: Duration::from_secs(secs("ttl")),
        creation_ttl: Duration::from_secs(secs("creation_ttl")),
        renewable: data
            .get("renewable")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        seen: Instant::now(),
    })
}

async fn renew_self(client: &Inner, previous: TokenInfo) -> Result<TokenInfo, VaultError> {
    let path = "auth/token/renew-self";
    let answer = call(client, Method::Post, path, Some(json!({}))).await?;
    let auth = answer.get("auth").ok_or_else(|| VaultError::Malformed {
        path: path.into(),
        reason: "no auth in the answer".into(),
    })?;
    Ok(TokenInfo {
        ttl: Duration::from_secs(
            auth.get("lease_duration")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        ),
        creation_ttl: previous.creation_ttl,
        renewable: auth
            .get("renewable")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        seen: Instant::now(),
    })
}

/// The renewal loop behind [`VaultClient::keep_token_alive`].
pub(crate) async fn keep_alive(client: &VaultClient, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let approle = client.auth.approle.is_some();
    loop {
        let info = client.token_info();
        if info.ttl.is_zero() {
            // A non-expiring token (root): nothing to renew, ever.
            tracing::debug!("vault token does not expire; no renewal needed");
            shutdown.await;
            return;
        }
        if !info.renewable && !approle {
            tracing::warn!(
                remaining = ?info.remaining(),
                "vault token is not renewable and there is no AppRole to log in again; it will expire"
            );
            shutdown.await;
            return;
        }
        // Half the remaining TTL, but not a busy loop when little is left.
        let wait = (info.remaining() / 2).max(Duration::from_millis(500));
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(wait) => {}
        }

        let renewed = if info.renewable {
            renew_self(&client.current(), info).await
        } else {
            Err(VaultError::Auth("token is not renewable".into()))
        };
        match renewed {
            Ok(new) if approle && new.ttl < new.creation_ttl / 3 => {
                // Capped by the max TTL: renewing further cannot help.
                tracing::info!(ttl = ?new.ttl, "vault token nears its max TTL; logging in again");
                store(client, new);
                relogin(client).await;
            }
            Ok(new) => {
                tracing::debug!(ttl = ?new.ttl, "vault token renewed");
                store(client, new);
            }
            Err(e) if approle => {
                tracing::warn!(error = %e, "vault token renewal failed; logging in again");
                relogin(client).await;
            }
            Err(e) => {
                // Keep trying at half of what is left; the broker's requests will report
                // the failure if the token does expire.
                tracing::warn!(error = %e, "vault token renewal failed");
            }
        }
    }
}

fn store(client: &VaultClient, info: TokenInfo) {
    *client.token.lock().unwrap_or_else(|p| p.into_inner()) = info;
}

async fn relogin(client: &VaultClient) {
    match login(&client.addr, &client.auth, client.timeout).await {
        Ok((inner, info)) => {
            *client.inner.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(inner);
            store(client, info);
            tracing::info!(ttl = ?info.ttl, "logged in to vault again");
        }
        Err(e) => {
            tracing::warn!(error = %e, "logging in to vault again failed; will retry");
            // Retry soon, but without hammering Vault: pretend a short TTL remains.
            let mut info = client.token_info();
            info.ttl = Duration::from_secs(4);
            info.seen = Instant::now();
            info.renewable = false;
            store(client, info);
        }
    }
}
