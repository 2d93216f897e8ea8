//! Why a trigger's delivery, tick or call started nothing ([`IntakeError`]): each refusal
//! with the `error` kind of its answer and audit record. The control API maps them to
//! statuses (`control/error.rs`), the data plane at `ostiary.internal` to its own answers.

use std::time::Duration;

use crate::store::StoreError;

/// Why a delivery or a call started nothing. Mapped to a status in the control API.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("no trigger is named {0:?}")]
    UnknownTrigger(String),
    #[error("trigger {name:?} is a {kind} trigger: it is not started this way")]
    WrongKind { name: String, kind: &'static str },
    #[error("the payload is over the trigger's {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the delivery's signature does not verify: {0}")]
    BadSignature(String),
    #[error("this call needs the admin token or the trigger's own token")]
    Unauthenticated,
    #[error("the trigger's secret {credential:?} cannot be read: {cause}")]
    SecretUnavailable { credential: String, cause: String },
    #[error("{0}")]
    BadPayload(String),
    #[error("the payload does not satisfy the trigger's schema: {0}")]
    SchemaMismatch(String),
    #[error("trigger {name:?} starts at most {count} runs per {per:?}")]
    RateLimited {
        name: String,
        count: u32,
        per: Duration,
        retry_after: Duration,
    },
    /// The policy decision on `Action::"trigger"` said no.
    #[error("policy denies starting a run of trigger {trigger:?}: {why}")]
    Denied {
        trigger: String,
        policies: Vec<String>,
        why: String,
    },
    #[error("the run store is unavailable: {0}")]
    Store(#[from] StoreError),
}

impl IntakeError {
    /// The `error` kind of the answer and the audit record.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownTrigger(_) | Self::WrongKind { .. } => "not_found",
            Self::TooLarge { .. } => "payload_too_large",
            Self::BadSignature(_) | Self::Unauthenticated => "unauthenticated",
            Self::SecretUnavailable { .. } => "credential_unavailable",
            Self::BadPayload(_) => "bad_request",
            Self::SchemaMismatch(_) => "check_failed",
            Self::RateLimited { .. } => "limit_exceeded",
            Self::Denied { .. } => "denied",
            Self::Store(_) => "state_unavailable",
        }
    }
}
