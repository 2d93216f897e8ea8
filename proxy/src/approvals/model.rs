//! What an approval is: the held request, what the proxy observed about it, its state, and
//! the stored outcome. The types are the store's rows (`ostiary_store::approvals`),
//! re-exported here; shared by the store, the channels (page, Slack, email, CLI) and the
//! pipeline, so that every channel shows an approver the same facts.
//!
//! The state machine (each arrow is one audited transition):
//! ```text
//! pending ──approve──▶ approved ──claim──▶ executing ──▶ executed | failed | refused
//!    │ └──deny──▶ denied                       ▲   │
//!    └──deadline──▶ expired                    └───┘ crash: back to approved at start-up,
//!                                                    re-sent with the same Idempotency-Key
//! ```

use sha2::{Digest, Sha256};

pub use ostiary_store::approvals::{
    Approval, Channel, HeldRequest, Observed, Status, StoredResponse, Verdict,
};

/// Hex SHA-256: how held bodies and request identities are compared.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What a new approval is about: who asked, what is held, and why.
#[derive(Debug)]
pub struct Ask<'a> {
    pub principal: &'a crate::session::Principal,
    pub request_id: String,
    pub policies: Vec<String>,
    pub policy_generation: u64,
    pub request: HeldRequest,
    pub observed: Observed,
}

/// A new pending approval, with the queue's `ttl` and `deadline` from now.
pub fn pending(config: &crate::config::Approvals, ask: Ask<'_>, now_ms: i64) -> Approval {
    Approval {
        id: super::queue::ApprovalQueue::new_id(),
        status: Status::Pending,
        created_ms: now_ms,
        deadline_ms: now_ms + config.deadline.as_millis() as i64,
        renotify_ms: now_ms + config.ttl.as_millis() as i64,
        rounds: 1,
        session: ask.principal.session_id.clone(),
        agent: ask.principal.agent.clone(),
        tenant: ask.principal.tenant.clone(),
        request_id: ask.request_id,
        policies: ask.policies,
        policy_generation: ask.policy_generation,
        request: ask.request,
        observed: ask.observed,
        approver: None,
        channel: None,
        decided_ms: None,
        reason: None,
        attempts: 0,
        result: None,
        // Set by whoever holds it: a policy decision knows the set that made it.
        held_policy_version: None,
        executed_policy_version: None,
    }
}
