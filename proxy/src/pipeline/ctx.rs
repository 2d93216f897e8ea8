//! What the phases of one request share: the per-request context, and the mode that says
//! whether the request is an agent's, live, or an approved one being executed.

use std::sync::Arc;

use ostiary_policies::PolicyEngine;

use crate::approvals::Approved;
use crate::audit::AuditGuard;
use crate::classify::Target;
use crate::guardrails::inflight::Ticket;
use crate::guardrails::pause::Seen;
use crate::plane::DataPlane;
use crate::session::Principal;

/// Whose request this is, and when.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    /// An agent's request, now.
    Live {
        /// It came in absolute form on the proxy listener (not inside a tunnel, whose
        /// port was decided at CONNECT).
        plain: bool,
    },
    /// A held request a human approved, being executed once.
    Approved(Approved),
    /// The recorded undo of an earlier call, being sent once (`ostiary sessions undo`).
    Undo(Reversal),
}

/// What an undo carries into the request phases.
#[derive(Debug, Clone)]
pub(crate) struct Reversal {
    /// Sent upstream as `Idempotency-Key`, derived from the call it reverses: an undo sent
    /// twice (a crash between sending and recording it) is applied once by an upstream that
    /// honours the key.
    pub idempotency_key: String,
    /// Where its credentials are minted when the session already ended (whose own are
    /// refused for good): a scope the undo ends once it is done.
    pub lease_scope: Option<String>,
    /// Decide it, send nothing (`ostiary sessions undo --dry-run`).
    pub dry_run: bool,
}

impl Mode {
    pub(crate) fn approved(&self) -> Option<&Approved> {
        match self {
            Mode::Approved(approved) => Some(approved),
            Mode::Live { .. } | Mode::Undo(_) => None,
        }
    }

    /// Whose credentials the request mints, when not its session's.
    pub(crate) fn lease_scope(&self) -> Option<&str> {
        match self {
            Mode::Undo(reversal) => reversal.lease_scope.as_deref(),
            Mode::Live { .. } | Mode::Approved(_) => None,
        }
    }

    /// The key that makes a re-send apply once upstream: an approved execution's, an undo's.
    pub(crate) fn idempotency_key(&self) -> Option<&str> {
        match self {
            Mode::Approved(approved) => Some(&approved.idempotency_key),
            Mode::Undo(reversal) => Some(&reversal.idempotency_key),
            Mode::Live { .. } => None,
        }
    }

    pub(crate) fn is_live(&self) -> bool {
        matches!(self, Mode::Live { .. })
    }
}

/// What the watchdog learns from a request once it is answered.
#[derive(Debug, Default)]
pub(crate) struct Note {
    /// Whose request it was, once past the session's gate.
    pub principal: Option<Arc<Principal>>,
    /// What the watchdog compares, one per decided call (an MCP batch has several).
    pub calls: Vec<Seen>,
}

/// One request, from the moment its target is known.
pub(crate) struct RequestCtx<'a> {
    pub plane: &'a Arc<DataPlane>,
    pub request_id: &'a str,
    pub mode: &'a Mode,
    pub audit: &'a mut AuditGuard,
    pub note: &'a mut Note,
    pub principal: Arc<Principal>,
    pub target: Target,
    /// The target's host as text, made once: audit, placeholder checks and errors name it.
    pub host: String,
    /// The policy set the whole request is recognised and decided under (taken once: the
    /// catalog comes with the policies it was validated with).
    pub engine: &'a Arc<PolicyEngine>,
    /// In flight until the answer's last byte (live requests), so teardown can wait for it.
    pub ticket: Option<Ticket>,
    /// What the watch over a streamed body found of a method override (`recognise` sets
    /// it, `forward` reports it: the upstream send fails opaquely when the watch stops it).
    pub body_watch: Option<crate::method_override::Finding>,
}

impl<'a> RequestCtx<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        plane: &'a Arc<DataPlane>,
        request_id: &'a str,
        mode: &'a Mode,
        audit: &'a mut AuditGuard,
        note: &'a mut Note,
        principal: Arc<Principal>,
        target: Target,
        engine: &'a Arc<PolicyEngine>,
    ) -> Self {
        let host = target.host.to_string();
        audit.update(|r| {
            r.method = Some(target.method.to_string());
            r.scheme = Some(target.scheme.into());
            r.host = Some(host.clone());
            r.port = Some(target.port);
            r.path = Some(target.path.clone());
            // The set that decides it, whatever a reload swaps in before the record is written.
            r.policy_version = Some(engine.version().as_ref().to_owned());
        });
        Self {
            plane,
            request_id,
            mode,
            audit,
            note,
            principal,
            target,
            host,
            engine,
            ticket: None,
            body_watch: None,
        }
    }
}

impl std::fmt::Debug for RequestCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestCtx")
            .field("request_id", &self.request_id)
            .field("session", &self.principal.session_id)
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}
