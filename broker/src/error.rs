//! Why a credential could not be produced or revoked. Never carries a secret value.

use std::path::PathBuf;

/// Errors of the broker. Messages name credentials, paths and Vault status codes, never
/// values: Vault's own error bodies are not copied in, since some echo request data.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("reading secrets file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("secrets file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("credential {0:?} is not in the secrets file")]
    Unknown(String),
    #[error("the credential source needs Vault, but no [broker.vault] is configured")]
    NoVault,
    #[error("vault: {0}")]
    Vault(#[from] crate::vault::VaultError),
    #[error("not logged in to vault yet (it was unreachable, sealed or refused the login)")]
    VaultNotConnected,
    #[error("the file backend is not configured ([broker] file)")]
    NoFile,
    #[error("the session has ended")]
    SessionEnded,
    #[error("credential {credential:?} arrived already at the end of its lease")]
    Expired { credential: String },
    #[error("no [[credential]] is named {0:?}")]
    UnknownCredential(String),
    #[error("credential {name:?} is minted per session ({kind}): it cannot be a static secret such as a webhook's signing key")]
    NotStatic { name: String, kind: &'static str },
}

impl BrokerError {
    /// A short machine-readable cause for metrics and audit (`vault_unreachable`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            BrokerError::Read { .. } | BrokerError::Parse { .. } => "file_unreadable",
            BrokerError::Unknown(_) => "unknown_secret",
            BrokerError::NoVault => "no_vault",
            BrokerError::Vault(e) => e.kind(),
            BrokerError::NoFile => "no_file",
            BrokerError::VaultNotConnected => "vault_not_connected",
            BrokerError::SessionEnded => "session_ended",
            BrokerError::Expired { .. } => "expired",
            BrokerError::UnknownCredential(_) => "unknown_credential",
            BrokerError::NotStatic { .. } => "not_static",
        }
    }
}

/// An error with its causes ("error sending request …: connection refused"): what an
/// operator needs to fix it, where `Display` alone says only the outermost part.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
