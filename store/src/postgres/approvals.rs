//! The approvals aggregate on PostgreSQL ([`crate::approvals::ApprovalStore`]).
//!
//! Every transition is one `UPDATE … WHERE status = <expected> … RETURNING`: PostgreSQL's
//! row lock makes a concurrent second one re-read the row after the first commits and find
//! it moved on, so a transition happens once whoever races it. A decision locks its row
//! (`FOR UPDATE`) for the deadline check and the link nonce it consumes. The bounds on holds
//! and the outbox are in [`super::bounds`] and [`super::outbox`].

use std::sync::Arc;

use postgres::Row;

use super::{count, json, parse_json, Db};
use crate::approvals::{
    Admission, Approval, ApprovalStore, Channel, DecideError, Decision, Delivery, DeliveryState,
    Hold, QueueCounts, RecipientState, Status, StoredResponse, Verdict,
};
use crate::StoreError;

const COLUMNS: &str = "id, status, created_ms, deadline_ms, renotify_ms, rounds, session, agent, \
     tenant, request_id, policies, policy_generation, request, observed, approver, channel, \
     decided_ms, reason, attempts, result, held_policy_version, executed_policy_version";

#[derive(Debug)]
pub(super) struct PgApprovals(pub(super) Arc<Db>);

impl PgApprovals {
    fn get_many(&self, ids: &[String]) -> Result<Vec<Approval>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(a) = self.get(id)? {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// Run a transition (`UPDATE … RETURNING id`) and return the approvals it moved.
    fn transition(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Approval>, StoreError> {
        let rows = self.0.with(|c| c.query(sql, params))?;
        let mut ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort();
        self.get_many(&ids)
    }
}

impl ApprovalStore for PgApprovals {
    fn insert(&self, a: &Approval) -> Result<(), StoreError> {
        self.0.with(|c| insert_on(c, a))
    }

    fn get(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let row = self.0.with(|c| {
            c.query_opt(
                &format!("SELECT {COLUMNS} FROM approvals WHERE id = $1"),
                &[&id],
            )
        })?;
        row.as_ref().map(from_row).transpose()
    }

    fn list(
        &self,
        status: Option<Status>,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let status = status.map(Status::as_str);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.0.with(|c| {
            c.query(
                &format!(
                    "SELECT {COLUMNS} FROM approvals
                     WHERE ($1::TEXT IS NULL OR status = $1) AND ($2::TEXT IS NULL OR session = $2)
                     ORDER BY created_ms DESC, id LIMIT $3"
                ),
                &[&status, &session, &limit],
            )
        })?;
        rows.iter().map(from_row).collect()
    }

    fn decide(&self, d: &Decision<'_>) -> Result<Approval, DecideError> {
        let outcome = self.0.with(|c| {
            let mut tx = c.transaction()?;
            let Some(row) = tx.query_opt(
                "SELECT status, deadline_ms FROM approvals WHERE id = $1 FOR UPDATE",
                &[&d.id],
            )?
            else {
                return Ok(Err(DecideError::Unknown(d.id.to_owned())));
            };
            let (status, deadline_ms): (String, i64) = (row.get(0), row.get(1));
            let status = Status::parse(&status).unwrap_or(Status::Failed);
            if status != Status::Pending {
                return Ok(Err(DecideError::NotPending(status)));
            }
            // Past its deadline it is expired, even if the sweep has not said so yet.
            if deadline_ms <= d.now_ms {
                return Ok(Err(DecideError::NotPending(Status::Expired)));
            }
            if let Some(nonce) = d.nonce {
                let fresh = tx.execute(
                    "INSERT INTO approval_links_used (nonce, approval_id, used_ms)
                     VALUES ($1, $2, $3) ON CONFLICT (nonce) DO NOTHING",
                    &[&nonce, &d.id, &d.now_ms],
                )?;
                if fresh == 0 {
                    return Ok(Err(DecideError::LinkUsed));
                }
            }
            let next = match d.verdict {
                Verdict::Approve => Status::Approved,
                Verdict::Deny => Status::Denied,
            };
            tx.execute(
                "UPDATE approvals SET status = $2, approver = $3, channel = $4, decided_ms = $5,
                   reason = $6, updated_ms = $5
                 WHERE id = $1 AND status = 'pending'",
                &[
                    &d.id,
                    &next.as_str(),
                    &d.approver,
                    &d.channel.as_str(),
                    &d.now_ms,
                    &d.reason,
                ],
            )?;
            tx.commit()?;
            Ok(Ok(()))
        })?;
        outcome?;
        self.get(d.id)?
            .ok_or_else(|| DecideError::Unknown(d.id.to_owned()))
    }

    fn link_used(&self, nonce: &str) -> Result<bool, StoreError> {
        self.0.with(|c| {
            Ok(c.query_opt(
                "SELECT 1 FROM approval_links_used WHERE nonce = $1",
                &[&nonce],
            )?
            .is_some())
        })
    }

    fn claim(&self, id: &str, now_ms: i64) -> Result<Option<Approval>, StoreError> {
        let changed = self.0.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'executing', attempts = attempts + 1,
                   updated_ms = $2
                 WHERE id = $1 AND status = 'approved'",
                &[&id, &now_ms],
            )
        })?;
        if changed == 0 {
            return Ok(None);
        }
        self.get(id)
    }

    fn finish(
        &self,
        id: &str,
        status: Status,
        result: Option<&StoredResponse>,
        reason: Option<&str>,
        executed_policy_version: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let result = result.map(json);
        let changed = self.0.with(|c| {
            c.execute(
                "UPDATE approvals SET status = $2, result = $3,
                   reason = COALESCE($4, reason), updated_ms = $5,
                   executed_policy_version = $6
                 WHERE id = $1 AND status = 'executing'",
                &[
                    &id,
                    &status.as_str(),
                    &result,
                    &reason,
                    &now_ms,
                    &executed_policy_version,
                ],
            )
        })?;
        Ok(changed == 1)
    }

    fn recover(&self, now_ms: i64, stale_before_ms: i64) -> Result<Vec<String>, StoreError> {
        // `updated_ms` of an executing approval is its claim's heartbeat (`renew`); rows
        // another replica is recovering at this moment are skipped, not waited for.
        let rows = self.0.with(|c| {
            c.query(
                "UPDATE approvals SET status = 'approved', updated_ms = $1
                 WHERE id IN (SELECT id FROM approvals
                              WHERE status = 'executing' AND updated_ms <= $2
                              FOR UPDATE SKIP LOCKED)
                   AND status = 'executing'
                 RETURNING id",
                &[&now_ms, &stale_before_ms],
            )
        })?;
        let mut ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort();
        Ok(ids)
    }

    fn release(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let changed = self.0.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'approved', updated_ms = $2
                 WHERE id = $1 AND status = 'executing'",
                &[&id, &now_ms],
            )
        })?;
        Ok(changed == 1)
    }

    fn renew(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let changed = self.0.with(|c| {
            c.execute(
                "UPDATE approvals SET updated_ms = $2 WHERE id = $1 AND status = 'executing'",
                &[&id, &now_ms],
            )
        })?;
        Ok(changed == 1)
    }

    fn approved(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.0.with(|c| {
            c.query(
                "SELECT id FROM approvals WHERE status = 'approved' ORDER BY decided_ms, id",
                &[],
            )
        })?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn expire_due(&self, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        self.transition(
            "UPDATE approvals SET status = 'expired', decided_ms = $1, updated_ms = $1,
               reason = 'the deadline passed without a decision'
             WHERE status = 'pending' AND deadline_ms <= $1 RETURNING id",
            &[&now_ms],
        )
    }

    fn expire_session(&self, session: &str, now_ms: i64) -> Result<Vec<Approval>, StoreError> {
        let rows = self.0.with(|c| {
            let mut tx = c.transaction()?;
            let rows = tx.query(
                "UPDATE approvals SET status = 'expired', decided_ms = $2, updated_ms = $2,
                   reason = 'the session ended before anyone decided'
                 WHERE status = 'pending' AND session = $1 RETURNING id",
                &[&session, &now_ms],
            )?;
            super::bounds::forget_bounds_on(&mut tx, session)?;
            tx.commit()?;
            Ok(rows)
        })?;
        let mut ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort();
        self.get_many(&ids)
    }

    fn withdraw_resume(
        &self,
        session: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        self.transition(
            "UPDATE approvals SET status = 'expired', decided_ms = $2, updated_ms = $2,
               reason = $3
             WHERE status = 'pending' AND session = $1
               AND (request::jsonb ->> 'url') LIKE 'ostiary:session/%' RETURNING id",
            &[&session, &now_ms, &reason],
        )
    }

    fn renotify_due(&self, now_ms: i64, ttl_ms: i64) -> Result<Vec<Approval>, StoreError> {
        self.transition(
            "UPDATE approvals SET rounds = rounds + 1, renotify_ms = $1 + $2, updated_ms = $1
             WHERE status = 'pending' AND renotify_ms <= $1 AND deadline_ms > $1 RETURNING id",
            &[&now_ms, &ttl_ms],
        )
    }

    fn slack_first_seen(&self, signature: &str, now_ms: i64) -> Result<bool, StoreError> {
        self.0.with(|c| {
            c.execute(
                "DELETE FROM slack_callbacks_seen WHERE seen_ms < $1",
                &[&(now_ms - 11 * 60 * 1000)],
            )?;
            let fresh = c.execute(
                "INSERT INTO slack_callbacks_seen (signature, seen_ms) VALUES ($1, $2)
                 ON CONFLICT (signature) DO NOTHING",
                &[&signature, &now_ms],
            )?;
            Ok(fresh == 1)
        })
    }

    fn counts(&self) -> Result<QueueCounts, StoreError> {
        self.0.with(|c| {
            let mut counts = QueueCounts::default();
            for row in c.query(
                "SELECT status, COUNT(*) FROM approvals
                 WHERE status IN ('pending', 'approved', 'executing') GROUP BY status",
                &[],
            )? {
                let (status, n): (String, i64) = (row.get(0), row.get(1));
                match status.as_str() {
                    "pending" => counts.pending = n,
                    "approved" => counts.approved = n,
                    _ => counts.executing = n,
                }
            }
            counts.failing_deliveries = c
                .query_one(
                    "SELECT COUNT(*) FROM approval_notifications
                     WHERE sent_ms IS NULL AND attempts > 0",
                    &[],
                )?
                .get(0);
            Ok(counts)
        })
    }

    fn set_cap(&self, session: &str, parent: Option<&str>, max: u32) -> Result<(), StoreError> {
        super::bounds::set_cap(&self.0, session, parent, max)
    }
    fn cap(&self, session: &str) -> Result<Option<u32>, StoreError> {
        super::bounds::cap(&self.0, session)
    }
    fn pending_holds(&self, session: &str, now_ms: i64) -> Result<u32, StoreError> {
        super::bounds::pending_holds(&self.0, session, now_ms)
    }
    fn hold_bounded(&self, hold: Hold<'_>, now_ms: i64) -> Result<Admission, StoreError> {
        match super::bounds::hold_bounded(&self.0, &hold, now_ms)? {
            Ok(admission) => Ok(admission),
            // Read after the transaction, as on SQLite.
            Err(id) => Ok(match self.get(&id)? {
                Some(existing) => Admission::Joined(Box::new(existing)),
                None => Admission::Full(crate::approvals::CapReached {
                    session: hold.approval.session.clone(),
                    used: 0,
                    max: 0,
                    frees_at_ms: None,
                }),
            }),
        }
    }

    fn enqueue(
        &self,
        approval_id: &str,
        channel: &str,
        recipient: &str,
        round: u32,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.0
            .with(|c| super::outbox::enqueue_on(c, approval_id, channel, recipient, round, now_ms))
    }
    fn due_deliveries(&self, now_ms: i64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        super::outbox::due_deliveries(&self.0, now_ms, limit)
    }
    fn due_for(
        &self,
        channel: &str,
        recipient: &str,
        now_ms: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        super::outbox::due_for(&self.0, channel, recipient, now_ms)
    }
    fn delivered(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
        super::outbox::delivered(&self.0, id, now_ms)
    }
    fn delivery_failed(&self, id: i64, error: &str, next_ms: i64) -> Result<(), StoreError> {
        super::outbox::delivery_failed(&self.0, id, error, next_ms)
    }
    fn delivery_dropped(&self, id: i64, now_ms: i64) -> Result<(), StoreError> {
        super::outbox::delivery_dropped(&self.0, id, now_ms)
    }
    fn recipient_state(
        &self,
        channel: &str,
        recipient: &str,
    ) -> Result<RecipientState, StoreError> {
        super::outbox::recipient_state(&self.0, channel, recipient)
    }
    fn close_recipient(
        &self,
        channel: &str,
        recipient: &str,
        open_ms: i64,
    ) -> Result<(), StoreError> {
        super::outbox::close_recipient(&self.0, channel, recipient, open_ms)
    }
    fn deliveries_of(&self, approval_id: &str) -> Result<Vec<DeliveryState>, StoreError> {
        super::outbox::deliveries_of(&self.0, approval_id)
    }
}

/// Insert a new pending approval on `c` (a connection or an open transaction).
pub(super) fn insert_on(
    c: &mut impl postgres::GenericClient,
    a: &Approval,
) -> Result<(), postgres::Error> {
    c.execute(
        "INSERT INTO approvals (id, status, created_ms, deadline_ms, renotify_ms, rounds,
           session, agent, tenant, request_id, policies, policy_generation, request,
           observed, attempts, updated_ms, held_policy_version)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 0, $3,
           $15)",
        &[
            &a.id,
            &a.status.as_str(),
            &a.created_ms,
            &a.deadline_ms,
            &a.renotify_ms,
            &i64::from(a.rounds),
            &a.session,
            &a.agent,
            &a.tenant,
            &a.request_id,
            &json(&a.policies),
            &(a.policy_generation as i64),
            &json(&a.request),
            &json(&a.observed),
            &a.held_policy_version,
        ],
    )
    .map(drop)
}

fn from_row(r: &Row) -> Result<Approval, StoreError> {
    let status: String = r.get(1);
    let channel: Option<String> = r.get(15);
    let result: Option<String> = r.get(19);
    Ok(Approval {
        id: r.get(0),
        // An unknown status string can only come from a newer version's row: treat it as
        // final so that nothing executes it.
        status: Status::parse(&status).unwrap_or(Status::Failed),
        created_ms: r.get(2),
        deadline_ms: r.get(3),
        renotify_ms: r.get(4),
        rounds: count(r.get(5)),
        session: r.get(6),
        agent: r.get(7),
        tenant: r.get(8),
        request_id: r.get(9),
        policies: parse_json(r.get(10), "policies")?,
        policy_generation: r.get::<_, i64>(11) as u64,
        request: parse_json(r.get(12), "request")?,
        observed: parse_json(r.get(13), "observed")?,
        approver: r.get(14),
        channel: channel.as_deref().and_then(|c| match c {
            "api" => Some(Channel::Api),
            "page" => Some(Channel::Page),
            "slack" => Some(Channel::Slack),
            _ => None,
        }),
        decided_ms: r.get(16),
        reason: r.get(17),
        attempts: count(r.get(18)),
        result: result
            .as_deref()
            .map(|text| parse_json(text, "result"))
            .transpose()?,
        held_policy_version: r.get(20),
        executed_policy_version: r.get(21),
    })
}
