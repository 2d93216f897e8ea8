//! Runs on PostgreSQL ([`crate::runs::RunStore`]), shared by replicas.
//!
//! Every move is one `UPDATE … WHERE status = … RETURNING`: a second replica's concurrent
//! update waits on the row lock, re-reads the row and finds it moved on, so a move happens
//! once. A claim picks its run `FOR UPDATE SKIP LOCKED`, so two replicas claiming at once
//! take different runs instead of queueing behind one. A delivery's dedup key is taken by
//! `INSERT … ON CONFLICT`, which lets one of two replicas racing on one key win and makes
//! the other see the winner's run; the trigger's rate is its row of `run_rates`, locked by
//! the same transaction, so replicas enqueueing one trigger spend its rate one after the
//! other. A one-at-a-time claim serialises on an advisory lock of its trigger, taken before
//! the `UPDATE` whose `WHERE` says no run of the trigger is running: the next claimer's
//! statement starts after the first committed, and sees its run. A cancel or requeue reads,
//! then compares on the status it read, and reads again if the run moved meanwhile.

use std::sync::Arc;

use postgres::{GenericClient, Row};

use super::Db;
use crate::runs::{
    final_statuses_sql, Cancel, Dedup, Enqueued, Finished, RateLimit, RunFilter, RunRow, RunStatus,
    RunStore, Swept, UNRENEWED_LEASE_MS,
};
use crate::StoreError;

#[derive(Debug)]
pub(super) struct PgRuns(pub(super) Arc<Db>);

// `limit_hit` holds `RunRow::limit` (LIMIT is a reserved word).
const COLUMNS: &str = "id, trigger, kind, status, spec, payload, payload_sha256, attempt, \
     created_ms, not_before_ms, started_ms, ended_ms, session, holder, exit_code, limit_hit, \
     error, stderr_tail, cost_micros, dead_letter, cancel_requested, parent_run, approval";

/// A run moved to `running` for `$1`, started at `started`: a new attempt, with the last
/// one's outcome cleared (its stderr tail and cost stay until this one ends, as the last
/// attempt's).
fn start_set(started: &str) -> String {
    format!(
        "status = 'running', holder = $1, attempt = attempt + 1, started_ms = {started}, \
         ended_ms = NULL, exit_code = NULL, limit_hit = NULL, error = NULL"
    )
}

/// A one-at-a-time trigger's (`$2`) run starts at `$3`, or when its last run ended if that
/// is later (another replica's clock ahead of this one's).
const AFTER_LAST: &str =
    "GREATEST($3, (SELECT MAX(last.ended_ms) FROM runs last WHERE last.trigger = $2))";

/// The first key of the advisory lock one-at-a-time claims take, the trigger's hash the
/// second (any constant; the same in every replica). Two-key locks are a space apart from
/// the one-key locks of the rest of the store.
const SERIAL_LOCK: i32 = 0x6f73_7365;

/// A one-at-a-time claim's guard: no run of the trigger (`$2`) is running.
const NONE_RUNNING: &str =
    "AND NOT EXISTS (SELECT 1 FROM runs going WHERE going.trigger = $2 AND going.status = 'running')";

/// The oldest due queued run (at `$3`; of trigger `$2` unless it is null) moved to `running`
/// for `$1`, started at `started`, if `guard` (more of the `WHERE`) holds as it moves.
fn claim_sql(guard: &str, started: &str) -> String {
    format!(
        "UPDATE runs SET {}
         WHERE id = (SELECT id FROM runs
                     WHERE status = 'queued' AND not_before_ms <= $3
                       AND ($2::TEXT IS NULL OR trigger = $2)
                     ORDER BY created_ms, id LIMIT 1
                     FOR UPDATE SKIP LOCKED)
           AND status = 'queued' {guard}
         RETURNING {COLUMNS}",
        start_set(started)
    )
}

/// [`RunStore::list`]'s page when the filter names none, and the most it returns.
const LIST_DEFAULT: u32 = 100;
const LIST_MAX: u32 = 10_000;

/// Reads of a run a cancel or requeue makes before giving up on a run that keeps moving:
/// it can start and end between two reads (queued → running → ended), and the third read
/// then finds it ended, which needs no compare.
const TRIES: usize = 3;

impl PgRuns {
    /// One `UPDATE … RETURNING` of at most one run.
    fn moved(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<RunRow>, StoreError> {
        let row = self.0.with(|c| c.query_opt(sql, params))?;
        row.as_ref().map(from_row).transpose()
    }
}

impl RunStore for PgRuns {
    fn enqueue(
        &self,
        run: &RunRow,
        dedup: Option<Dedup<'_>>,
        rate: Option<RateLimit>,
        now_ms: i64,
    ) -> Result<Enqueued, StoreError> {
        self.0.with(|c| {
            let mut tx = c.transaction()?;
            if let Some(dedup) = dedup {
                // Inserted, or an expired key taken over: this delivery's. A live key is
                // left as it is (and locked until this transaction ends, so that it cannot
                // expire and be taken over between this statement and the next).
                let taken = tx.query_opt(
                    "INSERT INTO run_dedup (trigger, key, run_id, expires_ms)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (trigger, key) DO UPDATE
                       SET run_id = EXCLUDED.run_id, expires_ms = EXCLUDED.expires_ms
                       WHERE run_dedup.expires_ms <= $5
                     RETURNING run_id",
                    &[
                        &run.trigger,
                        &dedup.key,
                        &run.id,
                        &dedup.expires_ms,
                        &now_ms,
                    ],
                )?;
                if taken.is_none() {
                    let first = tx.query_one(
                        "SELECT run_id FROM run_dedup WHERE trigger = $1 AND key = $2",
                        &[&run.trigger, &dedup.key],
                    )?;
                    return Ok(Enqueued::Duplicate(first.get(0)));
                }
            }
            // After the key (a duplicate spends nothing); a refusal rolls the key back. The
            // row is locked (inserted, or "updated" to itself) until this transaction ends:
            // another replica's delivery of the trigger reads it once this one committed.
            if let Some(rate) = rate {
                let full_at: i64 = tx
                    .query_one(
                        "INSERT INTO run_rates (trigger, full_at_us) VALUES ($1, $2)
                         ON CONFLICT (trigger) DO UPDATE SET full_at_us = run_rates.full_at_us
                         RETURNING full_at_us",
                        &[&run.trigger, &now_ms.saturating_mul(1000)],
                    )?
                    .get(0);
                match rate.take(Some(full_at), now_ms) {
                    Ok(next) => {
                        tx.execute(
                            "UPDATE run_rates SET full_at_us = $2 WHERE trigger = $1",
                            &[&run.trigger, &next],
                        )?;
                    }
                    Err(retry_after_ms) => return Ok(Enqueued::RateLimited { retry_after_ms }),
                }
            }
            insert_on(&mut tx, run)?;
            tx.commit()?;
            Ok(Enqueued::New)
        })
    }

    fn get(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let row = self
            .0
            .with(|c| c.query_opt(&format!("SELECT {COLUMNS} FROM runs WHERE id = $1"), &[&id]))?;
        row.as_ref().map(from_row).transpose()
    }

    fn list(&self, filter: &RunFilter) -> Result<Vec<RunRow>, StoreError> {
        let limit = i64::from(filter.limit.unwrap_or(LIST_DEFAULT).min(LIST_MAX));
        let status = filter.status.map(RunStatus::as_str);
        let rows = self.0.with(|c| {
            c.query(
                &format!(
                    "SELECT {COLUMNS} FROM runs
                     WHERE ($1::TEXT IS NULL OR status = $1) AND ($2::TEXT IS NULL OR trigger = $2)
                       AND (NOT $3::BOOLEAN OR dead_letter IS NOT NULL)
                     ORDER BY created_ms DESC, id DESC LIMIT $4"
                ),
                &[&status, &filter.trigger, &filter.dead_letters, &limit],
            )
        })?;
        rows.iter().map(from_row).collect()
    }

    fn claim(
        &self,
        holder: &str,
        trigger: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        self.moved(&claim_sql("", "$3"), &[&holder, &trigger, &now_ms])
    }

    fn claim_serial(
        &self,
        holder: &str,
        trigger: &str,
        now_ms: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        let row = self.0.with(|c| {
            let mut tx = c.transaction()?;
            // Read committed: the `UPDATE` below reads as of its own start, after the lock,
            // so it sees the run a claimer before this one started.
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&SERIAL_LOCK, &trigger],
            )?;
            let row = tx.query_opt(
                &claim_sql(NONE_RUNNING, AFTER_LAST),
                &[&holder, &Some(trigger), &now_ms],
            )?;
            tx.commit()?;
            Ok(row)
        })?;
        row.as_ref().map(from_row).transpose()
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
        self.moved(
            &format!(
                "UPDATE runs SET {} WHERE id = $2 AND status = $4 RETURNING {COLUMNS}",
                start_set("$3")
            ),
            &[&holder, &id, &now_ms, &from.as_str()],
        )
    }

    fn release(&self, id: &str, now_ms: i64) -> Result<Option<RunRow>, StoreError> {
        self.moved(
            &format!(
                "UPDATE runs SET status = 'queued', not_before_ms = $2
                 WHERE id = $1 AND status = 'awaiting_approval' RETURNING {COLUMNS}"
            ),
            &[&id, &now_ms],
        )
    }

    fn set_session(&self, id: &str, holder: &str, session: &str) -> Result<bool, StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE runs SET session = $3
                 WHERE id = $1 AND status = 'running' AND holder = $2",
                &[&id, &holder, &session],
            )
            .map(|n| n == 1)
        })
    }

    fn finish(&self, id: &str, holder: &str, finished: &Finished) -> Result<bool, StoreError> {
        let f = finished;
        let changed = match f.status {
            // A retry: back in the queue until `retry_at_ms` (at once without one), holding
            // the attempt's outcome so that a waiting run says why it waits; a dead letter
            // kept from an operator's requeue stays unless the attempt brings its own.
            RunStatus::Queued => self.0.with(|c| {
                c.execute(
                    "UPDATE runs SET status = 'queued', not_before_ms = COALESCE($3::BIGINT, $4),
                       holder = NULL, cancel_requested = FALSE, ended_ms = $4, exit_code = $5,
                       limit_hit = $6, error = $7, stderr_tail = $8, cost_micros = $9,
                       dead_letter = COALESCE($10, dead_letter)
                     WHERE id = $1 AND status = 'running' AND holder = $2",
                    &[
                        &id,
                        &holder,
                        &f.retry_at_ms,
                        &f.ended_ms,
                        &f.exit_code,
                        &f.limit,
                        &f.error,
                        &f.stderr_tail,
                        &f.cost_micros,
                        &f.dead_letter,
                    ],
                )
            })?,
            status if status.is_final() => self.0.with(|c| {
                c.execute(
                    "UPDATE runs SET status = $3, cancel_requested = FALSE, ended_ms = $4,
                       exit_code = $5, limit_hit = $6, error = $7, stderr_tail = $8,
                       cost_micros = $9, dead_letter = $10
                     WHERE id = $1 AND status = 'running' AND holder = $2",
                    &[
                        &id,
                        &holder,
                        &status.as_str(),
                        &f.ended_ms,
                        &f.exit_code,
                        &f.limit,
                        &f.error,
                        &f.stderr_tail,
                        &f.cost_micros,
                        &f.dead_letter,
                    ],
                )
            })?,
            status => return Err(not_an_end(status)),
        };
        Ok(changed == 1)
    }

    fn cancel(&self, id: &str, reason: &str, now_ms: i64) -> Result<Option<Cancel>, StoreError> {
        for _ in 0..TRIES {
            let Some(row) = self.get(id)? else {
                return Ok(None);
            };
            let outcome = match row.status {
                RunStatus::Queued | RunStatus::AwaitingApproval => self
                    .moved(
                        &format!(
                            "UPDATE runs SET status = 'cancelled', ended_ms = $3, error = $2,
                               cancel_requested = FALSE
                             WHERE id = $1 AND status = $4 RETURNING {COLUMNS}"
                        ),
                        &[&id, &reason, &now_ms, &row.status.as_str()],
                    )?
                    .map(Cancel::Cancelled),
                RunStatus::Running => self
                    .moved(
                        &format!(
                            "UPDATE runs SET cancel_requested = TRUE
                             WHERE id = $1 AND status = 'running' RETURNING {COLUMNS}"
                        ),
                        &[&id],
                    )?
                    .map(Cancel::Requested),
                _ => Some(Cancel::Over(row)),
            };
            if let Some(outcome) = outcome {
                return Ok(Some(outcome));
            }
        }
        Err(moving(id))
    }

    fn requeue(&self, id: &str, now_ms: i64) -> Result<Option<RunRow>, StoreError> {
        for _ in 0..TRIES {
            let Some(row) = self.get(id)? else {
                return Ok(None);
            };
            if !row.status.is_final() {
                return Ok(Some(row));
            }
            let queued = self.moved(
                &format!(
                    "UPDATE runs SET status = 'queued', not_before_ms = $2, holder = NULL,
                       session = NULL, cancel_requested = FALSE
                     WHERE id = $1 AND status = $3 RETURNING {COLUMNS}"
                ),
                &[&id, &now_ms, &row.status.as_str()],
            )?;
            if queued.is_some() {
                return Ok(queued);
            }
        }
        Err(moving(id))
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
            "holder = $1",
            &holder,
            "holder IS NOT DISTINCT FROM $2",
            reason,
            now_ms,
            dead_letter,
        )
    }

    fn renew(&self, holder: &str, until_ms: i64) -> Result<u64, StoreError> {
        self.0.with(|c| {
            c.execute(
                "UPDATE runs SET lease_until_ms = $2 WHERE status = 'running' AND holder = $1",
                &[&holder, &until_ms],
            )
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
            &format!("COALESCE(lease_until_ms, started_ms + {UNRENEWED_LEASE_MS}) < $1"),
            &now_ms,
            &format!(
                "holder IS NOT DISTINCT FROM $2
                   AND COALESCE(lease_until_ms, started_ms + {UNRENEWED_LEASE_MS}) < $3"
            ),
            reason,
            now_ms,
            dead_letter,
        )
    }

    fn running(&self, trigger: &str) -> Result<i64, StoreError> {
        self.0.with(|c| {
            c.query_one(
                "SELECT COUNT(*) FROM runs WHERE trigger = $1 AND status = 'running'",
                &[&trigger],
            )
            .map(|r| r.get(0))
        })
    }

    fn save_checkpoint(&self, root: &str, data: &[u8], now_ms: i64) -> Result<(), StoreError> {
        self.0.with(|c| {
            c.execute(
                "INSERT INTO run_checkpoints (root, data, saved_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (root) DO UPDATE SET data = EXCLUDED.data, saved_ms = EXCLUDED.saved_ms",
                &[&root, &data, &now_ms],
            )
            .map(drop)
        })
    }

    fn checkpoint(&self, root: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.with(|c| {
            c.query_opt("SELECT data FROM run_checkpoints WHERE root = $1", &[&root])
                .map(|row| row.map(|r| r.get(0)))
        })
    }

    fn sweep(&self, now_ms: i64, ended_before_ms: i64) -> Result<Swept, StoreError> {
        let finals = final_statuses_sql();
        self.0.with(|c| {
            // A key an enqueue is taking over meanwhile is locked by it: the delete waits,
            // then finds it live again and leaves it.
            let dedup_keys =
                c.execute("DELETE FROM run_dedup WHERE expires_ms <= $1", &[&now_ms])?;
            let checkpoints = c.execute(
                &format!(
                    "DELETE FROM run_checkpoints WHERE root IN (
                       SELECT id FROM runs WHERE status IN ({finals}) AND ended_ms < $1)"
                ),
                &[&ended_before_ms],
            )?;
            Ok(Swept {
                dedup_keys,
                checkpoints,
            })
        })
    }
}

/// `row` as [`RunStore::recover`] ends it, before its dead letter is made (so that the
/// letter can say how it ended).
impl PgRuns {
    /// End as `killed` the running runs `chosen` selects (`$1` is `bound`), each only if
    /// `guard` still holds for it as it is updated (`$2` its holder, `$3` now). The dead
    /// letters are made before any row is locked: the caller's function may read the store
    /// (the run's audit records) on another connection.
    fn kill_running(
        &self,
        chosen: &str,
        bound: &(dyn postgres::types::ToSql + Sync),
        guard: &str,
        reason: &str,
        now_ms: i64,
        dead_letter: &dyn Fn(&RunRow) -> String,
    ) -> Result<Vec<RunRow>, StoreError> {
        let left = self.0.with(|c| {
            c.query(
                &format!(
                    "SELECT {COLUMNS} FROM runs WHERE status = 'running' AND {chosen}
                     ORDER BY created_ms, id"
                ),
                &[bound],
            )
        })?;
        let mut ended = Vec::with_capacity(left.len());
        for row in &left {
            let row = killed(from_row(row)?, reason, now_ms);
            let letter = dead_letter(&row);
            ended.push((row, letter));
        }
        let rows = self.0.with(|c| {
            let mut tx = c.transaction()?;
            let mut out = Vec::with_capacity(ended.len());
            for (row, letter) in &ended {
                out.extend(tx.query_opt(
                    &format!(
                        "UPDATE runs SET status = 'killed', ended_ms = $3, error = $4,
                           dead_letter = $5, cancel_requested = FALSE
                         WHERE id = $1 AND status = 'running' AND {guard}
                         RETURNING {COLUMNS}"
                    ),
                    &[&row.id, &row.holder, &now_ms, &reason, letter],
                )?);
            }
            tx.commit()?;
            Ok(out)
        })?;
        rows.iter().map(from_row).collect()
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

/// A cancel or requeue that found the run moved on at every read.
fn moving(id: &str) -> StoreError {
    StoreError::Busy(format!(
        "run {id} changed at each of {TRIES} reads; try again"
    ))
}

fn insert_on(c: &mut impl GenericClient, run: &RunRow) -> Result<(), postgres::Error> {
    c.execute(
        &format!(
            "INSERT INTO runs ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
               $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)"
        ),
        &[
            &run.id,
            &run.trigger,
            &run.kind,
            &run.status.as_str(),
            &run.spec,
            &run.payload,
            &run.payload_sha256,
            &run.attempt,
            &run.created_ms,
            &run.not_before_ms,
            &run.started_ms,
            &run.ended_ms,
            &run.session,
            &run.holder,
            &run.exit_code,
            &run.limit,
            &run.error,
            &run.stderr_tail,
            &run.cost_micros,
            &run.dead_letter,
            &run.cancel_requested,
            &run.parent_run,
            &run.approval,
        ],
    )
    .map(drop)
}

fn from_row(r: &Row) -> Result<RunRow, StoreError> {
    let id: String = r.get(0);
    let status: String = r.get(3);
    // Unknown, it is corrupt (or a newer binary's): no move is made on a guess.
    let status = RunStatus::parse(&status)
        .ok_or_else(|| StoreError::Corrupt(format!("run {id}: unknown status {status:?}")))?;
    Ok(RunRow {
        id,
        trigger: r.get(1),
        kind: r.get(2),
        status,
        spec: r.get(4),
        payload: r.get(5),
        payload_sha256: r.get(6),
        attempt: r.get(7),
        created_ms: r.get(8),
        not_before_ms: r.get(9),
        started_ms: r.get(10),
        ended_ms: r.get(11),
        session: r.get(12),
        holder: r.get(13),
        exit_code: r.get(14),
        limit: r.get(15),
        error: r.get(16),
        stderr_tail: r.get(17),
        cost_micros: r.get(18),
        dead_letter: r.get(19),
        cancel_requested: r.get(20),
        parent_run: r.get(21),
        approval: r.get(22),
    })
}
