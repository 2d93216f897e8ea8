//! The guardrails' aggregate: what they keep across a restart — session accounts (limits
//! and usage, as the meter serialises them), paused sessions, the dead-letter table of
//! watchdog trips, and `Idempotency-Key` outcomes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approvals::StoredResponse;
use crate::StoreError;

/// A paused session, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub kind: String,
    pub reason: String,
    pub at_ms: i64,
    /// The dead-letter row holding the diagnostic snapshot.
    pub dead_letter: i64,
}

/// One watchdog trip with its diagnostic snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub id: i64,
    pub session: String,
    pub kind: String,
    pub reason: String,
    pub at_ms: i64,
    pub snapshot: Value,
    /// `resumed` or `terminated`, once a human decided.
    pub resolved: Option<String>,
    pub resolved_ms: Option<i64>,
}

/// Where an `Idempotency-Key` stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Begun {
    /// First use: the request runs; [`GuardStore::idempotency_done`] stores its outcome.
    Fresh,
    /// Same key, same request, finished: its stored outcome (`None`: too large to keep).
    Done(Option<StoredResponse>),
    /// Same key, same request, still running.
    Running,
    /// Same key, another request.
    Mismatch,
}

/// Where the guardrails' state is kept.
pub trait GuardStore: Send + Sync + std::fmt::Debug {
    /// Write every account (one transaction): `(session, account as JSON)`.
    fn save_accounts(&self, accounts: &[(String, Value)], now_ms: i64) -> Result<(), StoreError>;
    /// Every stored account.
    fn load_accounts(&self) -> Result<Vec<(String, Value)>, StoreError>;
    fn forget_account(&self, session: &str) -> Result<(), StoreError>;
    /// Pause `session`: the dead letter and the pause in one transaction. A session
    /// already paused keeps its first pause (`None`: this trip is not recorded again).
    fn pause(
        &self,
        session: &str,
        kind: &str,
        reason: &str,
        snapshot: &Value,
        at_ms: i64,
    ) -> Result<Option<Paused>, StoreError>;
    /// End a pause (`resumed` or `terminated`); false when the session was not paused.
    fn unpause(&self, session: &str, resolution: &str, now_ms: i64) -> Result<bool, StoreError>;
    fn pauses(&self) -> Result<Vec<(String, Paused)>, StoreError>;
    fn dead_letters(&self, session: Option<&str>) -> Result<Vec<DeadLetter>, StoreError>;
    /// Claim `key` for a request with `fingerprint`, or say what became of it before.
    /// Outcomes older than `ttl_ms` are forgotten first.
    fn idempotency_begin(
        &self,
        session: &str,
        key: &str,
        fingerprint: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Begun, StoreError>;
    /// Store the outcome of a key's request (`None`: too large to keep).
    fn idempotency_done(
        &self,
        session: &str,
        key: &str,
        response: Option<&StoredResponse>,
    ) -> Result<(), StoreError>;
    /// The request never reached the upstream: free the key so a retry runs afresh (a
    /// finished key is kept).
    fn idempotency_abandon(&self, session: &str, key: &str) -> Result<(), StoreError>;
    /// A session's keys go with it.
    fn idempotency_forget(&self, session: &str) -> Result<(), StoreError>;
}
