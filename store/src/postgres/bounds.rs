//! Holds are bounded (on PostgreSQL): each session's cap on pending approvals, and the
//! fingerprints identical holds of one session are joined on. A hold counts against its
//! session's cap and every ancestor's, so concurrent holds of one tree — on one replica or
//! several — serialise on one advisory lock for the check, the join and the insert.

use postgres::{GenericClient, Transaction};

use super::{count, Db};
use crate::approvals::{Admission, CapReached, Hold};
use crate::StoreError;

/// Longest chain of parents followed (only stops a corrupted table from looping).
const MAX_ANCESTORS: usize = 64;

/// The advisory lock holds take (any constant; the same in every replica).
const HOLD_LOCK: i64 = 0x6f73_7469_686f_6c64;

pub(super) fn set_cap(
    db: &Db,
    session: &str,
    parent: Option<&str>,
    max: u32,
) -> Result<(), StoreError> {
    db.with(|c| {
        c.execute(
            "INSERT INTO approval_caps (session, parent, max) VALUES ($1, $2, $3)
             ON CONFLICT (session) DO UPDATE SET parent = $2, max = $3",
            &[&session, &parent, &i64::from(max)],
        )
        .map(drop)
    })
}

pub(super) fn cap(db: &Db, session: &str) -> Result<Option<u32>, StoreError> {
    db.with(|c| {
        Ok(c.query_opt(
            "SELECT max FROM approval_caps WHERE session = $1",
            &[&session],
        )?
        .map(|r| count(r.get(0))))
    })
}

pub(super) fn pending_holds(db: &Db, session: &str, now_ms: i64) -> Result<u32, StoreError> {
    db.with(|c| Ok(count_tree(c, session, now_ms)?.0))
}

/// Join, refuse or store a hold in one transaction: `Err(id)` is the pending approval it
/// joins (read by the caller after the transaction).
pub(super) fn hold_bounded(
    db: &Db,
    hold: &Hold<'_>,
    now_ms: i64,
) -> Result<Result<Admission, String>, StoreError> {
    let a = hold.approval;
    db.with(|c| {
        let mut tx = c.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&HOLD_LOCK])?;
        let same = tx.query_opt(
            "SELECT a.id FROM approval_holds h JOIN approvals a ON a.id = h.approval_id
             WHERE h.session = $1 AND h.fingerprint = $2 AND a.status = 'pending'
               AND a.deadline_ms > $3
             ORDER BY a.created_ms, a.id LIMIT 1",
            &[&a.session, &hold.fingerprint, &now_ms],
        )?;
        if let Some(row) = same {
            return Ok(Err(row.get(0)));
        }
        if let Some(full) = first_full(&mut tx, &a.session, hold.default_max, now_ms)? {
            return Ok(Ok(Admission::Full(full)));
        }
        super::approvals::insert_on(&mut tx, a)?;
        tx.execute(
            "INSERT INTO approval_holds (approval_id, session, fingerprint) VALUES ($1, $2, $3)",
            &[&a.id, &a.session, &hold.fingerprint],
        )?;
        for (channel, recipient) in hold.notify {
            super::outbox::enqueue_on(&mut tx, &a.id, channel, recipient, 1, a.created_ms)?;
        }
        tx.commit()?;
        Ok(Ok(Admission::Held))
    })
}

/// A session ended: its cap and fingerprints are of no further use.
pub(super) fn forget_bounds_on(
    tx: &mut Transaction<'_>,
    session: &str,
) -> Result<(), postgres::Error> {
    tx.execute("DELETE FROM approval_holds WHERE session = $1", &[&session])?;
    tx.execute("DELETE FROM approval_caps WHERE session = $1", &[&session])?;
    Ok(())
}

/// The first cap, from `session` up through its ancestors, that one more hold would exceed.
fn first_full(
    tx: &mut Transaction<'_>,
    session: &str,
    default_max: u32,
    now_ms: i64,
) -> Result<Option<CapReached>, postgres::Error> {
    let mut at = Some(session.to_owned());
    for _ in 0..MAX_ANCESTORS {
        let Some(scope) = at.take() else { break };
        let row = tx.query_opt(
            "SELECT max, parent FROM approval_caps WHERE session = $1",
            &[&scope],
        )?;
        let (max, parent) = row
            .map(|r| (count(r.get(0)), r.get::<_, Option<String>>(1)))
            .unwrap_or((default_max, None));
        let (used, frees_at_ms) = count_tree(tx, &scope, now_ms)?;
        if used >= max {
            return Ok(Some(CapReached {
                session: scope,
                used,
                max,
                frees_at_ms,
            }));
        }
        at = parent;
    }
    Ok(None)
}

/// Pending holds of `session`'s tree and the soonest deadline among them; an approval past
/// its deadline that the sweep has not expired yet no longer counts.
fn count_tree(
    c: &mut impl GenericClient,
    session: &str,
    now_ms: i64,
) -> Result<(u32, Option<i64>), postgres::Error> {
    let row = c.query_one(
        "WITH RECURSIVE tree(s) AS (
             SELECT $1::TEXT
             UNION
             SELECT c.session FROM approval_caps c JOIN tree t ON c.parent = t.s
         )
         SELECT COUNT(*), MIN(a.deadline_ms)
         FROM approval_holds h JOIN approvals a ON a.id = h.approval_id
         WHERE h.session IN (SELECT s FROM tree) AND a.status = 'pending'
           AND a.deadline_ms > $2",
        &[&session, &now_ms],
    )?;
    Ok((count(row.get(0)), row.get(1)))
}
