//! Session teardown and the reaper: the one place where a session's end reaches the broker.
//!
//! A session ends by `DELETE /v1/sessions/{id}` (or `ostiary run` exiting, which calls it),
//! `terminate` after a watchdog pause, or expiry. Either way, and for its descendants first
//! (a child never outlives its parent): the session is refused from then on (the registry);
//! requests in flight may finish within `sessions.grace`, then are cancelled; its cached
//! credentials are dropped and its leases revoked (the broker), what the proxy derived from
//! those credentials (mTLS clients, scrubbers) is dropped, its budget account closed (a
//! child's unused budget goes back to its parent), and the audit chain records the
//! session's totals and which leases were revoked and which could not be (quarantined,
//! retried by the reaper). Every step is idempotent: tearing down twice is harmless.

use std::future::Future;
use std::sync::Arc;

use ostiary_broker::Revoked;

use crate::audit::AuditGuard;
use crate::ids;
use crate::server::Shared;

/// Tear down `session` and its descendants: refuse them, drain their requests, end them.
/// Returns whether `session` itself was live.
pub async fn teardown(
    shared: &Shared,
    session: &str,
    why: &str,
) -> Result<bool, crate::session::SessionError> {
    let descendants = shared.sessions.descendants(session);
    let principal = shared.sessions.get(session);
    // Refuse new requests of the whole tree before waiting for any of it.
    for child in &descendants {
        shared.sessions.revoke(&child.session_id).await?;
    }
    let was_live = shared.sessions.revoke(session).await?;
    let child_why = format!("{why} (its parent {session} ended)");
    let mut ending: Vec<(String, String, String, &str)> = descendants
        .iter()
        .map(|c| {
            (
                c.session_id.clone(),
                c.agent.clone(),
                c.tenant.clone(),
                child_why.as_str(),
            )
        })
        .collect();
    // The broker side runs whatever the registry said: a session that expired but was not
    // reaped yet still holds leases, and ending them twice is harmless.
    let (agent, tenant) = principal
        .as_ref()
        .map(|p| (p.agent.clone(), p.tenant.clone()))
        .unwrap_or_default();
    ending.push((session.to_owned(), agent, tenant, why));
    let grace = shared.guardrails.grace();
    futures_util::future::join_all(ending.iter().map(|(id, _, _, _)| async move {
        let drained = shared.guardrails.inflight.drain(id, grace).await;
        if drained.cancelled > 0 {
            tracing::warn!(session = %id, cancelled = drained.cancelled, "teardown cancelled requests still running after the grace period");
        }
    }))
    .await;
    // Deepest first, so each child's unused budget is back with its parent when the
    // parent's totals are recorded.
    for (id, agent, tenant, why) in &ending {
        end_session(shared, id, agent, tenant, why).await;
    }
    Ok(was_live)
}

/// End a session's credentials and record it. The registry side (refusing the session) is
/// the caller's: teardown revokes first, expiry has already happened.
pub async fn end_session(shared: &Shared, session: &str, agent: &str, tenant: &str, why: &str) {
    // Its approvals first: none of them could run any more (execution re-checks the
    // session), so approvers are not asked about them again.
    let queue = &shared.approvals;
    let owner = session.to_owned();
    match queue
        .store
        .call(move |s| s.expire_session(&owner, crate::store::now_ms()))
        .await
    {
        Ok(expired) => {
            for approval in &expired {
                queue.record(
                    approval,
                    "expired",
                    "deny",
                    Some("approval_expired"),
                    format!("the session ended ({why}) before anyone decided"),
                    None,
                );
            }
            if !expired.is_empty() {
                queue.flush_audit().await;
            }
        }
        Err(e) => tracing::error!(session, error = %e, "expiring a session's approvals failed"),
    }
    let report = shared.credentials.broker.end_session(session).await;
    for id in &report.dropped {
        shared.upstreams.forget(*id);
    }
    shared.credentials.forget(&report.dropped);
    shared.metrics.revoked(&report);
    // A paused session that ends is resolved as terminated.
    if shared.guardrails.clear_paused(session) {
        let owned = session.to_owned();
        if let Err(e) = shared
            .guardrails
            .store
            .call(move |s| s.unpause(&owned, "terminated"))
            .await
        {
            tracing::error!(session, error = %e, "resolving a paused session's dead letter failed");
        }
    }
    let totals = shared.guardrails.close(session).await;
    record(shared, Some((session, agent, tenant)), why, &report, totals);
    update_gauges(shared);
}

/// Run the reaper until `shutdown`: end expired sessions, revoke leases that reached their
/// end, retry quarantined revocations.
pub async fn reap(shared: Arc<Shared>, shutdown: impl Future<Output = ()>) {
    let interval = shared.config.broker.reap_interval;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ticker.tick() => {}
        }
        for principal in shared.sessions.take_expired() {
            let grace = shared.guardrails.grace();
            shared
                .guardrails
                .inflight
                .drain(&principal.session_id, grace)
                .await;
            end_session(
                &shared,
                &principal.session_id,
                &principal.agent,
                &principal.tenant,
                "session expired",
            )
            .await;
        }
        shared.guardrails.save().await;
        shared.guardrails.rate.sweep(std::time::Instant::now());
        let report = shared.credentials.broker.reap().await;
        if !report.revoked.is_empty() || !report.quarantined.is_empty() {
            shared.metrics.revoked(&report);
            record(&shared, None, "leases reaped", &report, None);
        }
        update_gauges(&shared);
    }
}

fn update_gauges(shared: &Shared) {
    let broker = &shared.credentials.broker;
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    shared
        .metrics
        .quarantined_leases
        .set(gauge(broker.quarantined().len()));
    shared.metrics.live_leases.set(gauge(broker.live_leases()));
}

/// One `session` record for the teardown, one `lease` record per failed revocation (each
/// names its lease, so an operator can finish the job by hand if Vault never comes back).
fn record(
    shared: &Shared,
    who: Option<(&str, &str, &str)>,
    why: &str,
    report: &Revoked,
    totals: Option<crate::guardrails::meter::Account>,
) {
    let request_id = ids::request_id();
    if let Some((session, agent, tenant)) = who {
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "session");
        audit.update(|r| {
            r.session = Some(session.to_owned());
            r.agent = (!agent.is_empty()).then(|| agent.to_owned());
            r.tenant = (!tenant.is_empty()).then(|| tenant.to_owned());
            r.reason = Some(why.to_owned());
            r.totals = totals.as_ref().map(|a| a.usage);
            r.parent = totals.as_ref().and_then(|a| a.parent.clone());
            r.credentials = report.revoked.iter().map(|(b, _)| b.clone()).collect();
            r.leases = report.revoked.iter().map(|(_, l)| l.clone()).collect();
        });
        audit.allow(0);
    } else if !report.revoked.is_empty() {
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "lease");
        audit.update(|r| {
            r.reason = Some(why.to_owned());
            r.credentials = report.revoked.iter().map(|(b, _)| b.clone()).collect();
            r.leases = report.revoked.iter().map(|(_, l)| l.clone()).collect();
        });
        audit.allow(0);
    }
    for (binding, lease, error) in &report.quarantined {
        tracing::warn!(credential = %binding, lease, error, "lease revocation failed; quarantined");
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "lease");
        audit.update(|r| {
            if let Some((session, _, _)) = who {
                r.session = Some(session.to_owned());
            }
            r.reason = Some(format!("revocation failed, quarantined: {error}"));
            r.credentials = vec![binding.clone()];
            r.leases = vec![lease.clone()];
        });
        audit.event("error", Some("revocation_failed"));
    }
}
