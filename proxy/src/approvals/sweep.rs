//! The queue's clock: one background task that, every `approvals.tick`, expires what passed
//! its deadline, starts a reminder round for what passed its `ttl`, executes what was
//! approved and not yet claimed, and (in a loop of its own) sends the notifications that
//! are due.
//!
//! It is also what makes the queue crash-proof: at start-up, [`recover`] puts executions a
//! previous process claimed back to `approved`, and the first sweep runs them (with the
//! same idempotency key). Decisions start their execution at once ([`super::execute::run`]);
//! the sweep is the safety net, so an approval never waits on a lost wake-up.

use std::future::Future;

use super::execute::{self, Executor};
use super::notify;
use super::ApprovalQueue;
use crate::store::{now_ms, Call};

/// When executions are recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// At start-up, by the store's only process: every claim was the previous run's.
    Restart,
    /// At a sweep (or a replica's start): claims not renewed within `approvals.claim_lease`,
    /// whose executor died (a replica killed mid-execution).
    Lapsed,
}

/// Executions whose executor is gone go back to `approved` (see [`Recovery`]).
pub async fn recover(queue: &ApprovalQueue, when: Recovery) {
    let now = now_ms();
    let lease = i64::try_from(queue.config.claim_lease.as_millis()).unwrap_or(i64::MAX);
    let (stale_before, why) = match when {
        Recovery::Restart => (now, "execution interrupted by a restart"),
        Recovery::Lapsed => (
            now.saturating_sub(lease),
            "execution abandoned: its executor stopped renewing its claim",
        ),
    };
    match queue
        .store
        .call(move |s| s.recover(now, stale_before))
        .await
    {
        Ok(ids) => {
            for id in ids {
                if let Ok(Some(approval)) = queue.get(&id).await {
                    tracing::warn!(approval = %id, why, "sending an interrupted execution again with the same idempotency key");
                    queue.record(
                        &approval,
                        "recovered",
                        "allow",
                        None,
                        format!(
                            "{why} (attempt {}); re-sent with Idempotency-Key {}",
                            approval.attempts,
                            approval.idempotency_key()
                        ),
                        None,
                    );
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "recovering interrupted executions failed"),
    }
    queue.flush_audit().await;
}

/// At shutdown: executions this process claimed and has not finished go back to `approved`
/// at once, for another replica (or the next start) to send with the same idempotency key,
/// rather than waiting out their claim's lease.
pub async fn release(queue: &ApprovalQueue) {
    let held: Vec<String> = queue
        .claimed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    for id in held {
        let owned = id.clone();
        match queue.store.call(move |s| s.release(&owned, now_ms())).await {
            Ok(true) => {
                tracing::warn!(approval = %id, "shutting down mid-execution: the claim is released for another executor");
                if let Ok(Some(approval)) = queue.get(&id).await {
                    queue.record(
                        &approval,
                        "released",
                        "allow",
                        None,
                        format!(
                            "execution released at shutdown (attempt {}); to be sent again with Idempotency-Key {}",
                            approval.attempts,
                            approval.idempotency_key()
                        ),
                        None,
                    );
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(approval = %id, error = %e, "releasing a claim at shutdown failed; it lapses after approvals.claim_lease")
            }
        }
    }
    queue.flush_audit().await;
}

/// Run the sweep until `shutdown`. Deliveries have a loop of their own: a Slack or SMTP
/// server that takes its full timeout to fail must not hold up deadlines and executions.
pub async fn run(shared: Executor, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let period = shared.queue.config.tick;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (stop, mut stopping) = tokio::sync::watch::channel(false);
    let deliveries = async {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stopping.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            // A pass, once begun, is not cut short by the shutdown: a message the server
            // took is marked sent before the proxy stops, or the next start sends it again.
            notify::deliver_due(&shared.queue).await;
        }
    };
    tokio::pin!(deliveries);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => sweep(&shared).await,
            // Returns only once told to stop, below.
            () = &mut deliveries => {}
        }
    }
    let _ = stop.send(true);
    deliveries.await;
}

/// One pass.
pub async fn sweep(shared: &Executor) {
    let queue = &shared.queue;
    let now = now_ms();
    match queue.store.call(move |s| s.expire_due(now)).await {
        Ok(expired) => {
            for approval in expired {
                tracing::info!(approval = %approval.id, "approval expired without a decision");
                queue.record(
                    &approval,
                    "expired",
                    "deny",
                    Some("approval_expired"),
                    "the deadline passed without a decision".into(),
                    None,
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "expiring approvals failed"),
    }
    let ttl_ms = queue.config.ttl.as_millis() as i64;
    match queue.store.call(move |s| s.renotify_due(now, ttl_ms)).await {
        Ok(due) => {
            let recipients = queue.notifier.recipients(&queue.config);
            for approval in due {
                let (id, round) = (approval.id.clone(), approval.rounds);
                let owed = recipients.clone();
                let enqueued = queue
                    .store
                    .call(move |s| {
                        for (channel, recipient) in &owed {
                            s.enqueue(&id, channel, recipient, round, now)?;
                        }
                        Ok::<_, crate::store::StoreError>(())
                    })
                    .await;
                if let Err(e) = enqueued {
                    tracing::error!(error = %e, "owing a reminder failed");
                }
                queue.record(
                    &approval,
                    "reminded",
                    "escalate",
                    None,
                    format!(
                        "still pending after {}; approvers notified again (round {round})",
                        humantime::format_duration(queue.config.ttl)
                    ),
                    None,
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "starting reminder rounds failed"),
    }
    // Expiries and reminders are on disk in the queue; their records follow them there.
    queue.flush_audit().await;
    // Executions whose executor stopped renewing its claim (killed mid-execution) are
    // approved again, and run below like any other.
    recover(queue, Recovery::Lapsed).await;
    match queue.store.call(|s| s.approved()).await {
        Ok(ids) => {
            for id in ids {
                // Claimed inside: a decision's own task racing this one is harmless.
                tokio::spawn(execute::run(shared.clone(), id));
            }
        }
        Err(e) => tracing::error!(error = %e, "listing approved requests failed"),
    }
    let _ = queue.refresh_gauges().await;
}
