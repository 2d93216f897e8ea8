//! The notification outbox: each notification owed to an approver, committed with the
//! approval (or its reminder round) it belongs to, and its delivery state, so a channel that
//! is down delays notifications without losing them.
//!
//! Also the rate state of each recipient (`approval_notify_state`): until `open_ms` a
//! recipient gets nothing (its deliveries are not due), and `collecting` says that some
//! came due meanwhile and are to go out as one digest. Kept in the database with the
//! deliveries, so a restart sends neither a second "first" notice nor loses a digest.

use rusqlite::{params, Connection, OptionalExtension};

use super::approvals::SqliteApprovals;
use crate::approvals::{Delivery, DeliveryState, RecipientState};
use crate::StoreError;

impl SqliteApprovals {
    /// Owe one notification (idempotent per approval, channel, recipient and round).
    pub(super) fn enqueue(
        &self,
        approval_id: &str,
        channel: &str,
        recipient: &str,
        round: u32,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.with(|c| enqueue_on(c, approval_id, channel, recipient, round, now_ms))
    }

    /// Deliveries due now, oldest first; none to a recipient whose rate limit is closed.
    pub(super) fn due_deliveries(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT n.id, n.approval_id, n.channel, n.recipient, n.round, n.attempts
                 FROM approval_notifications n
                 WHERE n.sent_ms IS NULL AND n.next_ms <= ?1
                   AND NOT EXISTS (SELECT 1 FROM approval_notify_state r
                                   WHERE r.channel = n.channel AND r.recipient = n.recipient
                                     AND r.open_ms > ?1)
                 ORDER BY n.next_ms, n.id LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![now_ms, limit as i64], delivery)?;
            rows.collect()
        })
    }

    /// Every delivery due now to one recipient, oldest first (a digest takes them all).
    pub(super) fn due_for(
        &self,
        channel: &str,
        recipient: &str,
        now_ms: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, approval_id, channel, recipient, round, attempts
                 FROM approval_notifications
                 WHERE sent_ms IS NULL AND next_ms <= ?1 AND channel = ?2 AND recipient = ?3
                 ORDER BY next_ms, id LIMIT 10000",
            )?;
            let rows = stmt.query_map(params![now_ms, channel, recipient], delivery)?;
            rows.collect()
        })
    }

    /// A delivery went through.
    pub(super) fn delivered(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
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
    pub(super) fn delivery_failed(
        &self,
        id: i64,
        error: &str,
        next_ms: i64,
    ) -> Result<(), StoreError> {
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
    pub(super) fn delivery_dropped(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
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

    /// A recipient's rate state (the default for one never sent to).
    pub(super) fn recipient_state(
        &self,
        channel: &str,
        recipient: &str,
    ) -> Result<RecipientState, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT open_ms, collecting FROM approval_notify_state
                 WHERE channel = ?1 AND recipient = ?2",
                params![channel, recipient],
                |r| {
                    Ok(RecipientState {
                        open_ms: r.get(0)?,
                        collecting: r.get(1)?,
                    })
                },
            )
            .optional()
            .map(Option::unwrap_or_default)
        })
    }

    /// Something was sent to a recipient: closed until `open_ms`, and collecting if any
    /// notification to it is still unsent — read here, after the sent ones were marked, so
    /// one owed while the message was on its way is not mistaken for a fresh one later.
    pub(super) fn close_recipient(
        &self,
        channel: &str,
        recipient: &str,
        open_ms: i64,
    ) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO approval_notify_state (channel, recipient, open_ms, collecting)
                 VALUES (?1, ?2, ?3, EXISTS (SELECT 1 FROM approval_notifications
                     WHERE channel = ?1 AND recipient = ?2 AND sent_ms IS NULL))
                 ON CONFLICT (channel, recipient) DO UPDATE SET open_ms = ?3,
                   collecting = EXISTS (SELECT 1 FROM approval_notifications
                     WHERE channel = ?1 AND recipient = ?2 AND sent_ms IS NULL)",
                params![channel, recipient, open_ms],
            )
            .map(drop)
        })
    }

    /// Notifications of one approval: (channel, recipient, round, attempts, sent, last error).
    pub(super) fn deliveries_of(
        &self,
        approval_id: &str,
    ) -> Result<Vec<DeliveryState>, StoreError> {
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

/// Owe one notification on `c` (a connection or the transaction of the hold it belongs
/// to). A recipient whose rate limit is closed now collects it for its next digest.
pub(super) fn enqueue_on(
    c: &Connection,
    approval_id: &str,
    channel: &str,
    recipient: &str,
    round: u32,
    now_ms: i64,
) -> rusqlite::Result<()> {
    c.execute(
        "INSERT OR IGNORE INTO approval_notifications
           (approval_id, channel, recipient, round, attempts, next_ms)
         VALUES (?1, ?2, ?3, ?4, 0, ?5)",
        params![approval_id, channel, recipient, round, now_ms],
    )?;
    c.execute(
        "UPDATE approval_notify_state SET collecting = 1
         WHERE channel = ?1 AND recipient = ?2 AND open_ms > ?3",
        params![channel, recipient, now_ms],
    )?;
    Ok(())
}

fn delivery(r: &rusqlite::Row<'_>) -> rusqlite::Result<Delivery> {
    Ok(Delivery {
        id: r.get(0)?,
        approval_id: r.get(1)?,
        channel: r.get(2)?,
        recipient: r.get(3)?,
        round: r.get(4)?,
        attempts: r.get(5)?,
    })
}
