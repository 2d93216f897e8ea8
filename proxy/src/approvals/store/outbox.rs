//! The notification outbox: each notification owed to an approver, committed with the
//! approval (or its reminder round) it belongs to, and its delivery state, so a channel that
//! is down delays notifications without losing them.

use rusqlite::params;

use super::ApprovalStore;
use crate::store::StoreError;

/// One notification owed to one recipient on one channel for one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: i64,
    pub approval_id: String,
    /// `slack` or `email`.
    pub channel: String,
    /// The approver mailed; empty for Slack (one message to the webhook's channel).
    pub recipient: String,
    pub round: u32,
    pub attempts: u32,
}

/// Where one notification stands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeliveryState {
    pub channel: String,
    pub recipient: String,
    pub round: u32,
    pub attempts: u32,
    pub sent_ms: Option<i64>,
    pub last_error: Option<String>,
}

impl ApprovalStore {
    /// Owe one notification (idempotent per approval, channel, recipient and round).
    pub fn enqueue(
        &self,
        approval_id: &str,
        channel: &str,
        recipient: &str,
        round: u32,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT OR IGNORE INTO approval_notifications
                   (approval_id, channel, recipient, round, attempts, next_ms)
                 VALUES (?1, ?2, ?3, ?4, 0, ?5)",
                params![approval_id, channel, recipient, round, now_ms],
            )
            .map(drop)
        })
    }

    /// Deliveries due now, oldest first.
    pub fn due_deliveries(&self, now_ms: i64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, approval_id, channel, recipient, round, attempts
                 FROM approval_notifications
                 WHERE sent_ms IS NULL AND next_ms <= ?1 ORDER BY next_ms, id LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![now_ms, limit as i64], |r| {
                Ok(Delivery {
                    id: r.get(0)?,
                    approval_id: r.get(1)?,
                    channel: r.get(2)?,
                    recipient: r.get(3)?,
                    round: r.get(4)?,
                    attempts: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }

    /// A delivery went through.
    pub fn delivered(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE approval_notifications SET sent_ms = ?2, attempts = attempts + 1,
                   last_error = NULL WHERE id = ?1",
                params![id, now_ms],
            )
            .map(drop)
        })
    }

    /// A delivery failed; try again at `next_ms`. The error names the cause, never a
    /// secret (webhook URL, SMTP password).
    pub fn delivery_failed(&self, id: i64, error: &str, next_ms: i64) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE approval_notifications SET attempts = attempts + 1, last_error = ?2,
                   next_ms = ?3 WHERE id = ?1",
                params![id, error, next_ms],
            )
            .map(drop)
        })
    }

    /// A delivery that is no longer worth making (the approval was decided meanwhile).
    pub fn delivery_dropped(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE approval_notifications SET sent_ms = ?2,
                   last_error = COALESCE(last_error, 'dropped: decided before delivery')
                 WHERE id = ?1",
                params![id, now_ms],
            )
            .map(drop)
        })
    }

    /// Notifications of one approval: (channel, recipient, round, attempts, sent, last error).
    pub fn deliveries_of(&self, approval_id: &str) -> Result<Vec<DeliveryState>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT channel, recipient, round, attempts, sent_ms, last_error
                 FROM approval_notifications WHERE approval_id = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([approval_id], |r| {
                Ok(DeliveryState {
                    channel: r.get(0)?,
                    recipient: r.get(1)?,
                    round: r.get(2)?,
                    attempts: r.get(3)?,
                    sent_ms: r.get(4)?,
                    last_error: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }
}
