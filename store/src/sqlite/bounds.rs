//! Holds are bounded (on SQLite): each session's cap on pending approvals, and the fingerprints that
//! identical holds of one session are joined on. Both live in the database, next to the
//! approvals they bound, so a restart neither forgets a cap nor hands a session a fresh
//! allowance.
//!
//! A session's holds count against its own cap and against every ancestor's: the holds of
//! a whole session tree are bounded by its root's cap, however many children an agent
//! spawns. The check, the join and the insert run in one `IMMEDIATE` transaction, so
//! concurrent holds cannot together overshoot a cap or make two approvals of one request.

use rusqlite::{params, OptionalExtension, Transaction};

use super::approvals::SqliteApprovals;
use crate::approvals::{Admission, CapReached, Hold};
use crate::StoreError;

/// Longest chain of parents followed (a session tree is `sessions.max_depth` deep; this
/// only stops a corrupted table from looping).
const MAX_ANCESTORS: usize = 64;

impl SqliteApprovals {
    /// Remember `session`'s cap and its parent (whose cap its holds count against too).
    pub(super) fn set_cap(
        &self,
        session: &str,
        parent: Option<&str>,
        max: u32,
    ) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO approval_caps (session, parent, max) VALUES (?1, ?2, ?3)
                 ON CONFLICT (session) DO UPDATE SET parent = ?2, max = ?3",
                params![session, parent, max],
            )
            .map(drop)
        })
    }

    /// `session`'s stored cap, if it has one.
    pub(super) fn cap(&self, session: &str) -> Result<Option<u32>, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT max FROM approval_caps WHERE session = ?1",
                [session],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Pending holds of `session` and its descendants (what its cap counts).
    pub(super) fn pending_holds(&self, session: &str, now_ms: i64) -> Result<u32, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            Ok(count_tree(&tx, session, now_ms)?.0)
        })
    }

    /// Join, refuse or store a hold, in one transaction (see the module's doc).
    pub(super) fn hold_bounded(
        &self,
        hold: Hold<'_>,
        now_ms: i64,
    ) -> Result<Admission, StoreError> {
        let a = hold.approval;
        let outcome = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let same: Option<String> = tx
                .query_row(
                    "SELECT a.id FROM approval_holds h JOIN approvals a ON a.id = h.approval_id
                     WHERE h.session = ?1 AND h.fingerprint = ?2 AND a.status = 'pending'
                       AND a.deadline_ms > ?3
                     ORDER BY a.created_ms, a.id LIMIT 1",
                    params![a.session, hold.fingerprint, now_ms],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(id) = same {
                return Ok(Err(id));
            }
            if let Some(full) = first_full(&tx, &a.session, hold.default_max, now_ms)? {
                return Ok(Ok(Admission::Full(full)));
            }
            super::approvals::insert_on(&tx, a)?;
            tx.execute(
                "INSERT INTO approval_holds (approval_id, session, fingerprint) VALUES (?1, ?2, ?3)",
                params![a.id, a.session, hold.fingerprint],
            )?;
            for (channel, recipient) in hold.notify {
                super::outbox::enqueue_on(&tx, &a.id, channel, recipient, 1, a.created_ms)?;
            }
            tx.commit()?;
            Ok(Ok(Admission::Held))
        })?;
        match outcome {
            Ok(admission) => Ok(admission),
            // Read after the transaction: the lock is not re-entrant.
            Err(id) => Ok(match self.get(&id)? {
                Some(existing) => Admission::Joined(Box::new(existing)),
                // Gone between the two reads (it cannot be: approvals are never deleted);
                // refusing to join is the safe answer, and the agent may try again.
                None => Admission::Full(CapReached {
                    session: a.session.clone(),
                    used: 0,
                    max: 0,
                    frees_at_ms: None,
                }),
            }),
        }
    }
}

/// The first cap, from `session` up through its ancestors, that one more hold would
/// exceed.
fn first_full(
    tx: &Transaction<'_>,
    session: &str,
    default_max: u32,
    now_ms: i64,
) -> rusqlite::Result<Option<CapReached>> {
    let mut at = Some(session.to_owned());
    for _ in 0..MAX_ANCESTORS {
        let Some(scope) = at.take() else { break };
        let row: Option<(u32, Option<String>)> = tx
            .query_row(
                "SELECT max, parent FROM approval_caps WHERE session = ?1",
                [&scope],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (max, parent) = row.unwrap_or((default_max, None));
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

/// Pending holds of `session`'s tree, and the soonest deadline among them. An approval
/// past its deadline that the sweep has not expired yet no longer counts.
fn count_tree(
    tx: &Transaction<'_>,
    session: &str,
    now_ms: i64,
) -> rusqlite::Result<(u32, Option<i64>)> {
    tx.query_row(
        "WITH RECURSIVE tree(s) AS (
             SELECT ?1
             UNION
             SELECT c.session FROM approval_caps c JOIN tree t ON c.parent = t.s
         )
         SELECT COUNT(*), MIN(a.deadline_ms)
         FROM approval_holds h JOIN approvals a ON a.id = h.approval_id
         WHERE h.session IN (SELECT s FROM tree) AND a.status = 'pending'
           AND a.deadline_ms > ?2",
        params![session, now_ms],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// A session ended: its cap and fingerprints are of no further use.
pub(super) fn forget_bounds_on(tx: &Transaction<'_>, session: &str) -> rusqlite::Result<()> {
    tx.execute("DELETE FROM approval_holds WHERE session = ?1", [session])?;
    tx.execute("DELETE FROM approval_caps WHERE session = ?1", [session])?;
    Ok(())
}
