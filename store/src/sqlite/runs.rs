//! Runs on SQLite ([`crate::runs::RunStore`]).
//!
//! SQLite has one writer at a time, across connections and processes: a move that is one
//! `UPDATE … WHERE status = … RETURNING` (a claim, a finish) is a compare-and-set as it
//! stands, and a move that must read before it writes (a delivery's dedup key and its
//! trigger's rate, a cancel, a requeue) runs in an `IMMEDIATE` transaction, which takes the
//! write lock before the read, so nothing moves between the two. A one-at-a-time claim is
//! one `UPDATE` whose `WHERE` says no run of the trigger is running: checked under the same
//! write lock as the move.

use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::Db;
use crate::runs::{
    final_statuses_sql, Cancel, Dedup, Enqueued, Finished, RateLimit, RunFilter, RunRow, RunStatus,
    RunStore, Swept, UNRENEWED_LEASE_MS,
};
use crate::StoreError;

/// The runs' connection.
#[derive(Debug)]
pub(super) struct SqliteRuns(pub(super) Db);

// `limit_hit` holds `RunRow::limit` (LIMIT is a reserved word).
const COLUMNS: &str = "id, trigger, kind, status, spec, payload, payload_sha256, attempt, \
     created_ms, not_before_ms, started_ms, ended_ms, session, holder, exit_code, limit_hit, \
     error, stderr_tail, cost_micros, dead_letter, cancel_requested, parent_run, approval";

/// A run moved to `running` for `?1`, started at `started`: a new attempt, with the last
/// one's outcome cleared (its stderr tail and cost stay until this one ends, as the last
/// attempt's).
fn start_set(started: &str) -> String {
    format!(
        "status = 'running', holder = ?1, attempt = attempt + 1, started_ms = {started}, \
         ended_ms = NULL, exit_code = NULL, limit_hit = NULL, error = NULL"
    )
}

/// A one-at-a-time trigger's (`?2`) run starts at `?3`, or when its last run ended if that
/// is later (another replica's clock ahead of this one's).
const AFTER_LAST: &str =
    "MAX(?3, COALESCE((SELECT MAX(ended_ms) FROM runs WHERE trigger = ?2), ?3))";

/// A one-at-a-time claim's guard: no run of the trigger (`?2`) is running.
const NONE_RUNNING: &str =
    "AND NOT EXISTS (SELECT 1 FROM runs going WHERE going.trigger = ?2 AND going.status = 'running')";

/// The oldest due queued run (at `?3`; of trigger `?2` unless it is null) moved to `running`
/// for `?1`, started at `started`, if `guard` (more of the `WHERE`) holds as it moves.
fn claim_sql(guard: &str, started: &str) -> String {
    format!(
        "UPDATE runs SET {}
         WHERE id = (SELECT id FROM runs
                     WHERE status = 'queued' AND not_before_ms <= ?3
                       AND (?2 IS NULL OR trigger = ?2)
                     ORDER BY created_ms, id LIMIT 1)
           AND status = 'queued' {guard}
         RETURNING {COLUMNS}",
        start_set(started)
    )
}

/// [`RunStore::list`]'s page when the filter names none, and the most it returns.
const LIST_DEFAULT: u32 = 100;
const LIST_MAX: u32 = 10_000;

impl RunStore for SqliteRuns {
    fn enqueue(
        &self,
        run: &RunRow,
        dedup: Option<Dedup<'_>>,
        rate: Option<RateLimit>,
        now_ms: i64,
    ) -> Result<Enqueued, StoreError> {
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some(dedup) = dedup {
                let first: Option<String> = tx
                    .query_row(
                        "SELECT run_id FROM run_dedup
                         WHERE trigger = ?1 AND key = ?2 AND expires_ms > ?3",
                        params![run.trigger, dedup.key, now_ms],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(first) = first {
                    return Ok(Enqueued::Duplicate(first));
                }
            }
            // After the key (a duplicate spends nothing), before anything is written (a
            // refusal takes no key).
            if let Some(rate) = rate {
                let full_at: Option<i64> = tx
                    .query_row(
                        "SELECT full_at_us FROM run_rates WHERE trigger = ?1",
                        [&run.trigger],
                        |r| r.get(0),
                    )
                    .optional()?;
                match rate.take(full_at, now_ms) {
                    Ok(next) => {
                        tx.execute(
                            "INSERT INTO run_rates (trigger, full_at_us) VALUES (?1, ?2)
                             ON CONFLICT (trigger) DO UPDATE SET full_at_us = ?2",
                            params![run.trigger, next],
                        )?;
                    }
                    Err(retry_after_ms) => return Ok(Enqueued::RateLimited { retry_after_ms }),
                }
            }
            if let Some(dedup) = dedup {
                // An expired key of the same name is taken over by this delivery.
                tx.execute(
                    "INSERT INTO run_dedup (trigger, key, run_id, expires_ms)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (trigger, key) DO UPDATE SET run_id = ?3, expires_ms = ?4",
                    params![run.trigger, dedup.key, run.id, dedup.expires_ms],
                )?;
            }
            insert_on(&tx, run)?;
            tx.commit()?;
            Ok(Enqueued::New)
        })
    }

    fn get(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        self.0.with(|c| get_on(c, id))
    }

    fn list(&self, filter: &RunFilter) -> Result<Vec<RunRow>, StoreError> {
        let limit = i64::from(filter.limit.unwrap_or(LIST_DEFAULT).min(LIST_MAX));
        self.0.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM runs
                 WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR trigger = ?2)
                   AND (?3 = 0 OR dead_letter IS NOT NULL)
                 ORDER BY created_ms DESC, id DESC LIMIT ?4"
            ))?;
            let rows = stmt.query_map(
                params![
                    filter.status.map(RunStatus::as_str),
                    filter.trigger,
                    filter.dead_letters,
                    limit
                ],
                from_row,
            )?;
            rows.collect()
        })
    }

    fn claim(
        &self,
        holder: &str,
        trigger: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        self.0.with(|c| {
            c.query_row(
                &claim_sql("", "?3"),
                params![holder, trigger, now_ms],
                from_row,
            )
            .optional()
        })
    }

    fn claim_serial(
        &self,
        holder: &str,
        trigger: &str,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        self.0.with(|c| {
            c.query_row(
                &claim_sql(NONE_RUNNING, AFTER_LAST),
                params![holder, trigger, now_ms],
                from_row,
            )
            .optional()
        })
    }

    fn start(
        &self,
        id: &str,
        from: RunStatus,
        holder: &str,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        // Only a run that has not started may start: `from = running` would hand a running
        // run to a second holder.
        if !matches!(from, RunStatus::Queued | RunStatus::AwaitingApproval) {
            return Ok(None);
        }
        self.0.with(|c| {
            c.query_row(
                &format!(
                    "UPDATE runs SET {} WHERE id = ?2 AND status = ?4 RETURNING {COLUMNS}",
                    start_set("?3")
                ),
                params![holder, id, now_ms, from.as_str()],
                from_row,
            )
            .optional()
        })
    }

    fn release(&self, id: &str, now_ms: i64) -> Result<Option<RunRow>, StoreError> {
        self.0.with(|c| {
            c.query_row(
                &format!(
                    "UPDATE runs SET status = 'queued', not_before_ms = ?2
                     WHERE id = ?1 AND status = 'awaiting_approval' RETURNING {COLUMNS}"
                ),
                params![id, now_ms],
                from_row,
            )
            .optional()
        })
    }

    fn set_session(&self, id: &str, holder: &str, session: &str) -> Result<bool, StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE runs SET session = ?3
                 WHERE id = ?1 AND status = 'running' AND holder = ?2",
                params![id, holder, session],
            )
            .map(|n| n == 1)
        })
    }

    fn finish(&self, id: &str, holder: &str, finished: &Finished) -> Result<bool, StoreError> {
        let f = finished;
        let sql = match f.status {
            // A retry: back in the queue until `retry_at_ms` (at once without one), holding
            // the attempt's outcome so that a waiting run says why it waits; a dead letter
            // kept from an operator's requeue stays unless the attempt brings its own.
            RunStatus::Queued => {
                "UPDATE runs SET status = 'queued', not_before_ms = COALESCE(?4, ?5),
                   holder = NULL, cancel_requested = 0, ended_ms = ?5, exit_code = ?6,
                   limit_hit = ?7, error = ?8, stderr_tail = ?9, cost_micros = ?10,
                   dead_letter = COALESCE(?11, dead_letter)
                 WHERE id = ?1 AND status = 'running' AND holder = ?2"
            }
            status if status.is_final() => {
                "UPDATE runs SET status = ?3, cancel_requested = 0, ended_ms = ?5,
                   exit_code = ?6, limit_hit = ?7, error = ?8, stderr_tail = ?9,
                   cost_micros = ?10, dead_letter = ?11
                 WHERE id = ?1 AND status = 'running' AND holder = ?2"
            }
            status => return Err(not_an_end(status)),
        };
        self.0.with(|c| {
            c.execute(
                sql,
                params![
                    id,
                    holder,
                    f.status.as_str(),
                    f.retry_at_ms,
                    f.ended_ms,
                    f.exit_code,
                    f.limit,
                    f.error,
                    f.stderr_tail,
                    f.cost_micros,
                    f.dead_letter
                ],
            )
            .map(|n| n == 1)
        })
    }

    fn cancel(&self, id: &str, reason: &str, now_ms: i64) -> Result<Option<Cancel>, StoreError> {
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(row) = get_on(&tx, id)? else {
                return Ok(None);
            };
            // The write lock is held since the read: the compares below cannot fail.
            let outcome = match row.status {
                RunStatus::Queued | RunStatus::AwaitingApproval => {
                    Cancel::Cancelled(tx.query_row(
                        &format!(
                            "UPDATE runs SET status = 'cancelled', ended_ms = ?3, error = ?2,
                               cancel_requested = 0
                             WHERE id = ?1 AND status = ?4 RETURNING {COLUMNS}"
                        ),
                        params![id, reason, now_ms, row.status.as_str()],
                        from_row,
                    )?)
                }
                RunStatus::Running => Cancel::Requested(tx.query_row(
                    &format!(
                        "UPDATE runs SET cancel_requested = 1
                         WHERE id = ?1 AND status = 'running' RETURNING {COLUMNS}"
                    ),
                    [id],
                    from_row,
                )?),
                _ => Cancel::Over(row),
            };
            tx.commit()?;
            Ok(Some(outcome))
        })
    }

    fn requeue(&self, id: &str, now_ms: i64) -> Result<Option<RunRow>, StoreError> {
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(row) = get_on(&tx, id)? else {
                return Ok(None);
            };
            if !row.status.is_final() {
                return Ok(Some(row));
            }
            let queued = tx.query_row(
                &format!(
                    "UPDATE runs SET status = 'queued', not_before_ms = ?2, holder = NULL,
                       session = NULL, cancel_requested = 0
                     WHERE id = ?1 AND status = ?3 RETURNING {COLUMNS}"
                ),
                params![id, now_ms, row.status.as_str()],
                from_row,
            )?;
            tx.commit()?;
            Ok(Some(queued))
        })
    }

    fn recover(
        &self,
        holder: &str,
        reason: &str,
        now_ms: i64,
        dead_letter: &dyn Fn(&RunRow) -> String,
    ) -> Result<Vec<RunRow>, StoreError> {
        // Skipped if it ended meanwhile (its holder was not dead after all).
        self.kill_running(
            "holder = ?1",
            &holder,
            "holder IS ?2",
            reason,
            now_ms,
            dead_letter,
        )
    }

    fn renew(&self, holder: &str, until_ms: i64) -> Result<u64, StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE runs SET lease_until_ms = ?2 WHERE status = 'running' AND holder = ?1",
                params![holder, until_ms],
            )
            .map(|n| n as u64)
        })
    }

    fn reclaim(
        &self,
        now_ms: i64,
        reason: &str,
        dead_letter: &dyn Fn(&RunRow) -> String,
    ) -> Result<Vec<RunRow>, StoreError> {
        // Skipped if its holder renewed or ended it meanwhile (it was alive).
        self.kill_running(
            &format!("COALESCE(lease_until_ms, started_ms + {UNRENEWED_LEASE_MS}) < ?1"),
            &now_ms,
            &format!(
                "holder IS ?2 AND COALESCE(lease_until_ms, started_ms + {UNRENEWED_LEASE_MS}) < ?3"
            ),
            reason,
            now_ms,
            dead_letter,
        )
    }

    fn running(&self, trigger: &str) -> Result<i64, StoreError> {
        self.0.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM runs WHERE trigger = ?1 AND status = 'running'",
                [trigger],
                |r| r.get(0),
            )
        })
    }

    fn save_checkpoint(&self, root: &str, data: &[u8], now_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO run_checkpoints (root, data, saved_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (root) DO UPDATE SET data = ?2, saved_ms = ?3",
                params![root, data, now_ms],
            )
            .map(drop)
        })
    }

    fn checkpoint(&self, root: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.with(|c| {
            c.query_row(
                "SELECT data FROM run_checkpoints WHERE root = ?1",
                [root],
                |r| r.get(0),
            )
            .optional()
        })
    }

    fn sweep(&self, now_ms: i64, ended_before_ms: i64) -> Result<Swept, StoreError> {
        let finals = final_statuses_sql();
        self.0.with(|c| {
            let dedup_keys = c.execute("DELETE FROM run_dedup WHERE expires_ms <= ?1", [now_ms])?;
            let checkpoints = c.execute(
                &format!(
                    "DELETE FROM run_checkpoints WHERE root IN (
                       SELECT id FROM runs WHERE status IN ({finals}) AND ended_ms < ?1)"
                ),
                [ended_before_ms],
            )?;
            Ok(Swept {
                dedup_keys: dedup_keys as u64,
                checkpoints: checkpoints as u64,
            })
        })
    }
}

/// `row` as [`RunStore::recover`] ends it, before its dead letter is made (so that the
/// letter can say how it ended).
impl SqliteRuns {
    /// End as `killed` the running runs `chosen` selects (`?1` is `bound`), each only if
    /// `guard` still holds for it under the write lock (`?2` its holder, `?3` now). The
    /// dead letters are made before the lock is taken: the caller's function may read the
    /// store (the run's audit records), and must not wait on this lock.
    fn kill_running(
        &self,
        chosen: &str,
        bound: &dyn rusqlite::ToSql,
        guard: &str,
        reason: &str,
        now_ms: i64,
        dead_letter: &dyn Fn(&RunRow) -> String,
    ) -> Result<Vec<RunRow>, StoreError> {
        let left = self.0.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM runs WHERE status = 'running' AND {chosen}
                 ORDER BY created_ms, id"
            ))?;
            let rows = stmt.query_map([bound], from_row)?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        let ended: Vec<(RunRow, String)> = left
            .into_iter()
            .map(|row| {
                let row = killed(row, reason, now_ms);
                let letter = dead_letter(&row);
                (row, letter)
            })
            .collect();
        self.0.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut out = Vec::with_capacity(ended.len());
            for (row, letter) in &ended {
                let moved = tx
                    .query_row(
                        &format!(
                            "UPDATE runs SET status = 'killed', ended_ms = ?3, error = ?4,
                               dead_letter = ?5, cancel_requested = 0
                             WHERE id = ?1 AND status = 'running' AND {guard}
                             RETURNING {COLUMNS}"
                        ),
                        params![row.id, row.holder, now_ms, reason, letter],
                        from_row,
                    )
                    .optional()?;
                out.extend(moved);
            }
            tx.commit()?;
            Ok(out)
        })
    }
}

fn killed(row: RunRow, reason: &str, now_ms: i64) -> RunRow {
    RunRow {
        status: RunStatus::Killed,
        ended_ms: Some(now_ms),
        error: Some(reason.to_owned()),
        cancel_requested: false,
        ..row
    }
}

/// A [`Finished`] whose status is not how an attempt ends (`running`, `awaiting_approval`):
/// a caller's mistake, refused rather than stored.
fn not_an_end(status: RunStatus) -> StoreError {
    StoreError::Backend(format!(
        "a run's attempt cannot finish as {}: it ends in a final status or goes back to queued",
        status.as_str()
    ))
}

fn get_on(c: &Connection, id: &str) -> rusqlite::Result<Option<RunRow>> {
    c.query_row(
        &format!("SELECT {COLUMNS} FROM runs WHERE id = ?1"),
        [id],
        from_row,
    )
    .optional()
}

fn insert_on(c: &Connection, run: &RunRow) -> rusqlite::Result<()> {
    c.execute(
        &format!(
            "INSERT INTO runs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
               ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)"
        ),
        params![
            run.id,
            run.trigger,
            run.kind,
            run.status.as_str(),
            run.spec,
            run.payload,
            run.payload_sha256,
            run.attempt,
            run.created_ms,
            run.not_before_ms,
            run.started_ms,
            run.ended_ms,
            run.session,
            run.holder,
            run.exit_code,
            run.limit,
            run.error,
            run.stderr_tail,
            run.cost_micros,
            run.dead_letter,
            run.cancel_requested,
            run.parent_run,
            run.approval,
        ],
    )
    .map(drop)
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<RunRow> {
    let status: String = r.get(3)?;
    // Unknown, it is corrupt (or a newer binary's): no move is made on a guess.
    let status = RunStatus::parse(&status).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            3,
            Type::Text,
            format!("unknown run status {status:?}").into(),
        )
    })?;
    Ok(RunRow {
        id: r.get(0)?,
        trigger: r.get(1)?,
        kind: r.get(2)?,
        status,
        spec: r.get(4)?,
        payload: r.get(5)?,
        payload_sha256: r.get(6)?,
        attempt: r.get(7)?,
        created_ms: r.get(8)?,
        not_before_ms: r.get(9)?,
        started_ms: r.get(10)?,
        ended_ms: r.get(11)?,
        session: r.get(12)?,
        holder: r.get(13)?,
        exit_code: r.get(14)?,
        limit: r.get(15)?,
        error: r.get(16)?,
        stderr_tail: r.get(17)?,
        cost_micros: r.get(18)?,
        dead_letter: r.get(19)?,
        cancel_requested: r.get(20)?,
        parent_run: r.get(21)?,
        approval: r.get(22)?,
    })
}
