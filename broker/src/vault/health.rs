//! `GET sys/health`: whether Vault answers at an address and in what state, asked without a
//! token, for `ostiary doctor` — so that a deployment can be checked from a shell that does
//! not hold the token `ostiary serve` logs in with. The HTTP client is built as the
//! logged-in one is (no proxy, TLS verified, `VAULT_CACERT` roots trusted), so the answer
//! is the one `serve` would get.

use std::time::Duration;

use serde::Deserialize;
use vaultrs::client::Client as _;

use super::VaultError;
use crate::error_chain as chain;

/// What `sys/health` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Health {
    pub initialized: bool,
    pub sealed: bool,
    /// A standby of a cluster: it forwards requests to the active node.
    #[serde(default)]
    pub standby: bool,
}

/// Ask `addr` for its health. The query asks for 200 in every state (Vault otherwise
/// answers 429, 501 or 503 with the same body), so the state comes from the body alone.
pub async fn health(addr: &str, timeout: Duration) -> Result<Health, VaultError> {
    let client = super::auth::build_client(addr, String::new(), timeout)?;
    let url = format!(
        "{}/v1/sys/health?standbyok=true&perfstandbyok=true&sealedcode=200&uninitcode=200",
        addr.trim_end_matches('/')
    );
    let answer = client
        .http()
        .http
        .get(&url)
        .send()
        .await
        .map_err(|e| VaultError::Unreachable(chain(&e)))?;
    let status = answer.status();
    if !status.is_success() {
        return Err(VaultError::Malformed {
            path: "sys/health".into(),
            reason: format!("status {}", status.as_u16()),
        });
    }
    answer
        .json::<Health>()
        .await
        .map_err(|e| VaultError::Malformed {
            path: "sys/health".into(),
            reason: chain(&e),
        })
}
