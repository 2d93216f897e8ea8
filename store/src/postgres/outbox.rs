//! The notification outbox on PostgreSQL: each notification owed to an approver, committed
//! with the approval (or reminder round) it belongs to, its delivery state, and each
//! recipient's rate state.

use postgres::GenericClient;

use super::{count, Db};
use crate::approvals::{Delivery, DeliveryState, RecipientState};
use crate::StoreError;

/// Owe one notification on `c` (a connection or the transaction of the hold it belongs to);
/// a recipient whose rate limit is closed now collects it for its next digest.
pub(super) fn enqueue_on(
    c: &mut impl GenericClient,
    approval_id: &str,
    channel: &str,
    recipient: &str,
    round: u32,
    now_ms: i64,
) -> Result<(), postgres::Error> {
    c.execute(
        "INSERT INTO approval_notifications (approval_id, channel, recipient, round, attempts,
           next_ms)
         VALUES ($1, $2, $3, $4, 0, $5)
         ON CONFLICT (approval_id, channel, recipient, round) DO NOTHING",
        &[
            &approval_id,
            &channel,
            &recipient,
            &i64::from(round),
            &now_ms,
        ],
    )?;
    c.execute(
        "UPDATE approval_notify_state SET collecting = TRUE
         WHERE channel = $1 AND recipient = $2 AND open_ms > $3",
        &[&channel, &recipient, &now_ms],
    )?;
    Ok(())
}

fn delivery(r: &postgres::Row) -> Delivery {
    Delivery {
        id: r.get(0),
        approval_id: r.get(1),
        channel: r.get(2),
        recipient: r.get(3),
        round: count(r.get(4)),
        attempts: count(r.get(5)),
    }
}

pub(super) fn due_deliveries(
    db: &Db,
    now_ms: i64,
    limit: usize,
) -> Result<Vec<Delivery>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = db.with(|c| {
        c.query(
            "SELECT n.id, n.approval_id, n.channel, n.recipient, n.round, n.attempts
             FROM approval_notifications n
             WHERE n.sent_ms IS NULL AND n.next_ms <= $1
               AND NOT EXISTS (SELECT 1 FROM approval_notify_state r
                               WHERE r.channel = n.channel AND r.recipient = n.recipient
                                 AND r.open_ms > $1)
             ORDER BY n.next_ms, n.id LIMIT $2",
            &[&now_ms, &limit],
        )
    })?;
    Ok(rows.iter().map(delivery).collect())
}

pub(super) fn due_for(
    db: &Db,
    channel: &str,
    recipient: &str,
    now_ms: i64,
) -> Result<Vec<Delivery>, StoreError> {
    let rows = db.with(|c| {
        c.query(
            "SELECT id, approval_id, channel, recipient, round, attempts
             FROM approval_notifications
             WHERE sent_ms IS NULL AND next_ms <= $1 AND channel = $2 AND recipient = $3
             ORDER BY next_ms, id LIMIT 10000",
            &[&now_ms, &channel, &recipient],
        )
    })?;
    Ok(rows.iter().map(delivery).collect())
}

pub(super) fn delivered(db: &Db, id: i64, now_ms: i64) -> Result<(), StoreError> {
    db.with(|c| {
        c.execute(
            "UPDATE approval_notifications SET sent_ms = $2, attempts = attempts + 1,
               last_error = NULL WHERE id = $1",
            &[&id, &now_ms],
        )
        .map(drop)
    })
}

pub(super) fn delivery_failed(
    db: &Db,
    id: i64,
    error: &str,
    next_ms: i64,
) -> Result<(), StoreError> {
    db.with(|c| {
        c.execute(
            "UPDATE approval_notifications SET attempts = attempts + 1, last_error = $2,
               next_ms = $3 WHERE id = $1",
            &[&id, &error, &next_ms],
        )
        .map(drop)
    })
}

pub(super) fn delivery_dropped(db: &Db, id: i64, now_ms: i64) -> Result<(), StoreError> {
    db.with(|c| {
        c.execute(
            "UPDATE approval_notifications SET sent_ms = $2,
               last_error = COALESCE(last_error, 'dropped: decided before delivery')
             WHERE id = $1",
            &[&id, &now_ms],
        )
        .map(drop)
    })
}

pub(super) fn recipient_state(
    db: &Db,
    channel: &str,
    recipient: &str,
) -> Result<RecipientState, StoreError> {
    db.with(|c| {
        Ok(c.query_opt(
            "SELECT open_ms, collecting FROM approval_notify_state
                 WHERE channel = $1 AND recipient = $2",
            &[&channel, &recipient],
        )?
        .map(|r| RecipientState {
            open_ms: r.get(0),
            collecting: r.get(1),
        })
        .unwrap_or_default())
    })
}

pub(super) fn close_recipient(
    db: &Db,
    channel: &str,
    recipient: &str,
    open_ms: i64,
) -> Result<(), StoreError> {
    db.with(|c| {
        c.execute(
            "INSERT INTO approval_notify_state (channel, recipient, open_ms, collecting)
             VALUES ($1, $2, $3, EXISTS (SELECT 1 FROM approval_notifications
                 WHERE channel = $1 AND recipient = $2 AND sent_ms IS NULL))
             ON CONFLICT (channel, recipient) DO UPDATE SET open_ms = $3,
               collecting = EXISTS (SELECT 1 FROM approval_notifications
                 WHERE channel = $1 AND recipient = $2 AND sent_ms IS NULL)",
            &[&channel, &recipient, &open_ms],
        )
        .map(drop)
    })
}

pub(super) fn deliveries_of(db: &Db, approval_id: &str) -> Result<Vec<DeliveryState>, StoreError> {
    let rows = db.with(|c| {
        c.query(
            "SELECT channel, recipient, round, attempts, sent_ms, last_error
             FROM approval_notifications WHERE approval_id = $1 ORDER BY id",
            &[&approval_id],
        )
    })?;
    Ok(rows
        .iter()
        .map(|r| DeliveryState {
            channel: r.get(0),
            recipient: r.get(1),
            round: count(r.get(2)),
            attempts: count(r.get(3)),
            sent_ms: r.get(4),
            last_error: r.get(5),
        })
        .collect())
}
