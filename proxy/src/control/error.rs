//! The control API's refusals, and their one mapping to a status and a JSON problem body
//! (`{"error": kind, "message": …}`, plus `request_id` added by the router) — the control
//! listener's counterpart of [`crate::respond`] on the data plane. Handlers say what went
//! wrong; only [`ControlError::status`] and [`ControlError::kind`] say how it is answered.

use http::StatusCode;
use serde_json::{json, Value};

use super::Reply;
use crate::approvals::store::DecideError;
use crate::error::ProxyError;

/// Why a control call was refused. The message is the operator's to read: never a secret.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    /// The call is malformed: body, query, field values.
    #[error("{0}")]
    BadRequest(String),
    /// No admin token, or a session token that does not verify.
    #[error("{0}")]
    Unauthenticated(String),
    /// Authenticated, but this caller may not do this (a session outside its own tree).
    #[error("{0}")]
    Denied(String),
    /// The approver named may not decide this approval (or is its requester).
    #[error("{0}")]
    NotAnApprover(String),
    #[error("{0}")]
    NotFound(String),
    /// The approval was already decided.
    #[error("{0}")]
    NotPending(String),
    /// The single-use link was used.
    #[error("{0}")]
    LinkUsed(String),
    /// The state the call assumes is not the state there is (e.g. not paused).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    SessionPaused(String),
    /// A policy reload found the new set invalid; the old one stays in force.
    #[error("{0}")]
    PolicyInvalid(String),
    /// A limit refused it; the body says which, how much and how much is allowed.
    #[error("the {limit} limit is reached ({used} of {max})")]
    LimitExceeded {
        limit: String,
        used: Value,
        max: Value,
    },
    /// The data plane's own refusal (e.g. a spawn Cedar did not permit), answered as the
    /// data plane answers it.
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    /// A trigger's delivery or an API call that started no run.
    #[error(transparent)]
    Intake(#[from] crate::runs::intake::IntakeError),
    #[error("{0}")]
    Internal(String),
}

impl ControlError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Denied(_) | Self::NotAnApprover(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::NotPending(_) | Self::Conflict(_) => StatusCode::CONFLICT,
            Self::LinkUsed(_) => StatusCode::GONE,
            Self::SessionPaused(_) => StatusCode::LOCKED,
            Self::PolicyInvalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::LimitExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Proxy(e) => crate::respond::status(e),
            Self::Intake(e) => intake_status(e),
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::Denied(_) => "denied",
            Self::NotAnApprover(_) => "not_an_approver",
            Self::NotFound(_) => "not_found",
            Self::NotPending(_) => "not_pending",
            Self::LinkUsed(_) => "link_used",
            Self::Conflict(_) => "conflict",
            Self::SessionPaused(_) => "session_paused",
            Self::PolicyInvalid(_) => "policy_invalid",
            Self::LimitExceeded { .. } => "limit_exceeded",
            Self::Proxy(e) => e.kind(),
            Self::Intake(e) => e.kind(),
            Self::Internal(_) => "internal_error",
        }
    }

    /// The problem body.
    fn body(&self) -> Value {
        match self {
            Self::LimitExceeded { limit, used, max } => json!({
                "error": self.kind(),
                "message": self.to_string(),
                "limit": limit,
                "used": used,
                "max": max,
                "retry_after": null,
            }),
            Self::Proxy(e) => crate::respond::error_body(e, ""),
            Self::Intake(e) => intake_body(e),
            _ => json!({ "error": self.kind(), "message": self.to_string() }),
        }
    }
}

fn intake_status(e: &crate::runs::intake::IntakeError) -> StatusCode {
    use crate::runs::intake::IntakeError as E;
    match e {
        E::UnknownTrigger(_) | E::WrongKind { .. } => StatusCode::NOT_FOUND,
        E::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        E::BadSignature(_) | E::Unauthenticated => StatusCode::UNAUTHORIZED,
        E::SecretUnavailable { .. } | E::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        E::BadPayload(_) => StatusCode::BAD_REQUEST,
        E::SchemaMismatch(_) => StatusCode::UNPROCESSABLE_ENTITY,
        E::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        E::Denied { .. } => StatusCode::FORBIDDEN,
    }
}

/// The details each refusal carries (docs/design.md §5's shapes where one fits).
fn intake_body(e: &crate::runs::intake::IntakeError) -> Value {
    use crate::runs::intake::IntakeError as E;
    let mut body = json!({ "error": e.kind(), "message": e.to_string() });
    match e {
        E::TooLarge { limit } => body["max"] = json!(limit),
        E::BadSignature(reason) => body["reason"] = json!(reason),
        E::SecretUnavailable { credential, .. } => body["credential"] = json!(credential),
        E::SchemaMismatch(detail) => {
            body["check"] = json!("schema");
            body["detail"] = json!(detail);
        }
        E::RateLimited {
            name,
            count,
            retry_after,
            ..
        } => {
            body["limit"] = json!(format!("trigger_rate:{name}"));
            body["max"] = json!(count);
            body["used"] = json!(count);
            body["retry_after"] = json!(retry_after.as_secs().max(1));
        }
        E::Store(_) => body["component"] = json!("store"),
        E::Denied {
            trigger, policies, ..
        } => {
            body["policies"] = json!(policies);
            body["action"] = json!("Ostiary::Action::\"trigger\"");
            body["resource"] = json!(format!("Ostiary::Trigger::{trigger:?}"));
        }
        _ => {}
    }
    body
}

impl From<ControlError> for Reply {
    fn from(e: ControlError) -> Self {
        Reply(e.status(), e.body())
    }
}

impl From<DecideError> for ControlError {
    fn from(e: DecideError) -> Self {
        let message = e.to_string();
        match e {
            DecideError::Unknown(_) => Self::NotFound(message),
            DecideError::NotPending(_) => Self::NotPending(message),
            DecideError::LinkUsed => Self::LinkUsed(message),
            DecideError::NotApprover(_) | DecideError::SelfApproval => Self::NotAnApprover(message),
            DecideError::Store(_) => Self::Internal(message),
        }
    }
}

impl From<crate::store::StoreError> for ControlError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_its_status_and_kind() {
        let cases = [
            (ControlError::BadRequest("x".into()), 400, "bad_request"),
            (
                ControlError::Unauthenticated("x".into()),
                401,
                "unauthenticated",
            ),
            (ControlError::Denied("x".into()), 403, "denied"),
            (
                ControlError::NotAnApprover("x".into()),
                403,
                "not_an_approver",
            ),
            (ControlError::NotFound("x".into()), 404, "not_found"),
            (ControlError::NotPending("x".into()), 409, "not_pending"),
            (ControlError::LinkUsed("x".into()), 410, "link_used"),
            (ControlError::Conflict("x".into()), 409, "conflict"),
            (
                ControlError::SessionPaused("x".into()),
                423,
                "session_paused",
            ),
            (
                ControlError::PolicyInvalid("x".into()),
                422,
                "policy_invalid",
            ),
            (ControlError::Internal("x".into()), 500, "internal_error"),
        ];
        for (e, status, kind) in cases {
            let Reply(got, body) = Reply::from(e);
            assert_eq!(got.as_u16(), status, "{body}");
            assert_eq!(body["error"], kind);
            assert_eq!(body["message"], "x");
        }
    }

    #[test]
    fn a_limit_names_itself_in_the_body() {
        let Reply(status, body) = ControlError::LimitExceeded {
            limit: "children".into(),
            used: json!(4),
            max: json!(4),
        }
        .into();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(body["limit"], "children");
        assert_eq!(body["used"], 4);
        assert_eq!(body["message"], "the children limit is reached (4 of 4)");
    }
}
