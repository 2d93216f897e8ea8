//! Session teardown and the reaper: the one place where a session's end reaches the broker.
//!
//! A session ends by `DELETE /v1/sessions/{id}` (or `ostiary run` exiting, which calls it),
//! `terminate` after a watchdog pause, or expiry. Either way, and for its descendants first
//! (a child never outlives its parent): the session is refused from then on (the registry);
//! requests in flight may finish within `sessions.grace`, then are cancelled; its cached
//! credentials are dropped and its leases revoked (the broker), what the proxy derived from
//! those credentials (mTLS clients) is dropped — their values stay in the response scrubber
//! until they end, as an upstream may still hold them —, its budget account closed (a
//! child's unused budget goes back to its parent), and the audit chain records the
//! session's totals and which leases were revoked and which could not be (quarantined,
//! retried by the reaper). Every step is idempotent: tearing down twice is harmless.
//!
//! Long-lived byte streams — WebSocket splices, `egress.tunnel` relays, intercepted TLS
//! connections — are not requests to wait for: each is tied to its session by a
//! [`StreamWatch`] and ends the moment the session is refused (teardown) or its TTL is over
//! (the watch's own timer; the reaper ends them too).
//!
//! Several replicas: the replica that ends a session tells the others ([`News`]), and each
//! ends what it holds of it — streams, requests in flight, credentials and leases it minted
//! — within moments; the reaper's reconciliation with the store catches news that was
//! missed, within one `broker.reap_interval`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ostiary_broker::Revoked;

use crate::approvals::ApprovalQueue;
use crate::audit::{AuditGuard, AuditSink};
use crate::classify::Tunnel;
use crate::forward::Upstreams;
use crate::guardrails::inflight::StreamTicket;
use crate::guardrails::Guardrails;
use crate::ids;
use crate::inject::credentials::Credentials;
use crate::metrics::Metrics;
use crate::session::{Principal, SessionRegistry};
use crate::store::Call;
use crate::tunnel::Ended;

/// What ending a session touches: the registry that refuses it, its requests and streams,
/// its approvals, its credentials and what was derived from them, its budget account, and
/// the audit chain. Held by the control plane, the watchdog's desk and the reaper.
#[derive(Debug, Clone)]
pub struct Teardown {
    pub sessions: Arc<SessionRegistry>,
    pub guardrails: Arc<Guardrails>,
    pub approvals: Arc<ApprovalQueue>,
    pub credentials: Arc<Credentials>,
    pub upstreams: Upstreams,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
    /// How the other replicas hear of a teardown here (`state.redis`).
    pub news: Option<News>,
}

/// Teardown news: this replica's name and the Redis it publishes on.
#[derive(Debug, Clone)]
pub struct News {
    pub replica: String,
    pub counters: Arc<crate::counters::Counters>,
}

/// A long-lived byte stream's tie to its session: [`StreamWatch::ended`] resolves when the
/// session is torn down or expires, whichever comes first. Held for the stream's life.
#[derive(Debug)]
pub struct StreamWatch {
    ticket: StreamTicket,
    expires: tokio::time::Instant,
}

impl StreamWatch {
    /// Resolves once the stream's session is over (cancellation-safe; call it again freely).
    pub async fn ended(&self) {
        tokio::select! {
            () = self.ticket.ended.cancelled() => {}
            () = tokio::time::sleep_until(self.expires) => {}
        }
    }
}

/// A year: longer than any session lives.
const MAX_WATCH_MS: u64 = 365 * 24 * 3600 * 1000;

/// Tie a stream of `principal`'s session to the session's life; `None` when the session is
/// already over (refused or expired), and the stream must not start.
pub fn watch_stream(
    guardrails: &Guardrails,
    sessions: &SessionRegistry,
    principal: &Principal,
) -> Option<StreamWatch> {
    // Counted in before liveness is read: teardown refuses the session before it ends its
    // streams, so a stream either sees the refusal here or is ended by the teardown.
    let ticket = guardrails.inflight.open_stream(&principal.session_id);
    if !sessions.is_live(&principal.session_id) {
        return None;
    }
    let left_ms = principal
        .expires_at
        .saturating_mul(1000)
        .saturating_sub(crate::store::now_ms());
    // Capped so that the deadline is always representable (TTLs are far shorter).
    let left = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0).min(MAX_WATCH_MS));
    Some(StreamWatch {
        ticket,
        expires: tokio::time::Instant::now() + left,
    })
}

/// Record a stream the proxy cut (teardown, expiry, a byte budget spent): no HTTP exchange
/// is left to answer, so the `stream` record is its only trace. `what` says which stream
/// (`tunnel`, `websocket`); `at` is the session and destination it belonged to.
pub fn record_cut(
    audit: &AuditSink,
    metrics: &Arc<Metrics>,
    at: &Tunnel,
    what: &str,
    ended: Ended,
) {
    let request_id = ids::request_id();
    let mut audit = AuditGuard::start(audit, metrics, &request_id, "stream");
    audit.update(|r| {
        r.set_tunnel(at);
        r.reason = Some(format!("{what} {ended}"));
    });
    tracing::info!(request_id, host = %at.host, what, %ended, "stream cut");
    match ended {
        Ended::Budget(_) => audit.event("deny", Some("limit_exceeded")),
        _ => audit.event("cancel", None),
    }
}

impl Teardown {
    /// End the open streams of `session` (teardown, expiry), and say so in the log.
    fn end_streams(&self, session: &str) {
        let ended = self.guardrails.inflight.end_streams(session);
        if ended > 0 {
            tracing::info!(
                session,
                streams = ended,
                "session over: its open streams are closed"
            );
        }
    }

    /// Tear down `session` and its descendants: refuse them, drain their requests, end them.
    /// Returns whether `session` itself was live.
    pub async fn tear_down(
        &self,
        session: &str,
        why: &str,
    ) -> Result<bool, crate::session::SessionError> {
        // A session (or children) another replica made is brought here first, so that the
        // whole tree is refused and ended, and so that this answer knows it was live.
        let principal = self.sessions.find(session).await;
        self.sessions.load_tree(session).await?;
        let descendants = self.sessions.descendants(session);
        // Refuse new requests of the whole tree before waiting for any of it.
        for child in &descendants {
            self.sessions.revoke(&child.session_id).await?;
        }
        let was_live = self.sessions.revoke(session).await?;
        // Then the other replicas: they refuse it and end their part as this one does.
        if let Some(news) = &self.news {
            for id in descendants
                .iter()
                .map(|c| c.session_id.as_str())
                .chain([session])
            {
                if let Err(e) = news.counters.publish_ended(&news.replica, id).await {
                    tracing::warn!(session = id, error = %e, "telling other replicas of a teardown failed; their reconciliation will catch it");
                }
            }
        }
        self.finish(session, principal, descendants, why).await;
        Ok(was_live)
    }

    /// Another replica ended `session`: end what this one holds of it (nothing to publish,
    /// nothing when it never served the session).
    pub async fn ended_elsewhere(&self, session: &str, replica: &str) {
        let Some(principal) = self.sessions.get(session) else {
            self.sessions.forget_ended(session);
            return;
        };
        let descendants = self.sessions.descendants(session);
        for id in descendants
            .iter()
            .map(|c| c.session_id.as_str())
            .chain([session])
        {
            self.sessions.forget_ended(id);
        }
        let why = format!("session ended on replica {replica}");
        self.finish(session, Some(principal), descendants, &why)
            .await;
    }

    /// Follow the teardown news of the other replicas until `shutdown`.
    pub async fn follow(self, shutdown: impl Future<Output = ()>) {
        let Some(news) = self.news.clone() else {
            return;
        };
        tokio::pin!(shutdown);
        loop {
            let followed = tokio::select! {
                () = &mut shutdown => return,
                followed = news.counters.follow_ended() => followed,
            };
            match followed {
                Ok(stream) => {
                    tokio::pin!(stream);
                    loop {
                        let next = tokio::select! {
                            () = &mut shutdown => return,
                            next = futures_util::StreamExt::next(&mut stream) => next,
                        };
                        let Some(ended) = next else { break };
                        if ended.replica != news.replica {
                            self.ended_elsewhere(&ended.session, &ended.replica).await;
                        }
                    }
                    tracing::warn!("teardown news: the subscription ended; subscribing again");
                }
                Err(e) => tracing::warn!(error = %e, "teardown news: cannot subscribe; retrying"),
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Refuse-already-done teardown of `session` and `descendants`: end streams, drain
    /// requests, end each session's credentials and account, record it.
    async fn finish(
        &self,
        session: &str,
        principal: Option<Arc<Principal>>,
        descendants: Vec<Arc<Principal>>,
        why: &str,
    ) {
        // Streams do not finish by themselves: they end now, with the session refused.
        for child in &descendants {
            self.end_streams(&child.session_id);
        }
        self.end_streams(session);
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
        let grace = self.guardrails.grace();
        futures_util::future::join_all(ending.iter().map(|(id, _, _, _)| async move {
            let drained = self.guardrails.inflight.drain(id, grace).await;
            if drained.cancelled > 0 {
                tracing::warn!(session = %id, cancelled = drained.cancelled, "teardown cancelled requests still running after the grace period");
            }
        }))
        .await;
        // Deepest first, so each child's unused budget is back with its parent when the
        // parent's totals are recorded.
        for (id, agent, tenant, why) in &ending {
            self.end_session(id, agent, tenant, why).await;
        }
    }

    /// Drop a session's cached credentials and revoke its leases, with what the proxy
    /// derived from them (mTLS clients; the scrubber keeps their values until they end).
    /// Also what an undo of an ended session
    /// does with the credentials it minted to send its requests.
    pub async fn end_credentials(&self, session: &str) -> Revoked {
        let report = self.credentials.broker.end_session(session).await;
        for id in &report.dropped {
            self.upstreams.forget(*id);
        }
        self.credentials.forget(&report.dropped);
        self.metrics.revoked(&report);
        report
    }

    /// End a session's credentials and record it. The registry side (refusing the session) is
    /// the caller's: teardown revokes first, expiry has already happened.
    pub async fn end_session(&self, session: &str, agent: &str, tenant: &str, why: &str) {
        // Its approvals first: none of them could run any more (execution re-checks the
        // session), so approvers are not asked about them again.
        let queue = &self.approvals;
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
        let report = self.end_credentials(session).await;
        // A paused session that ends is resolved as terminated.
        if self.guardrails.clear_paused(session).await {
            let owned = session.to_owned();
            if let Err(e) = self
                .guardrails
                .store
                .call(move |s| s.unpause(&owned, "terminated", crate::store::now_ms()))
                .await
            {
                tracing::error!(session, error = %e, "resolving a paused session's dead letter failed");
            }
        }
        let totals = self.guardrails.close(session).await;
        self.record(Some((session, agent, tenant)), why, &report, totals);
        self.update_gauges();
    }

    /// Run the reaper until `shutdown`: end expired sessions, revoke leases that reached their
    /// end, retry quarantined revocations.
    pub async fn reap(self, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            for principal in self.sessions.take_expired() {
                // Each stream's watch has its own timer at the session's expiry; this catches
                // any that a clock step made miss it.
                self.end_streams(&principal.session_id);
                let grace = self.guardrails.grace();
                self.guardrails
                    .inflight
                    .drain(&principal.session_id, grace)
                    .await;
                self.end_session(
                    &principal.session_id,
                    &principal.agent,
                    &principal.tenant,
                    "session expired",
                )
                .await;
            }
            // The backstop of teardown news: sessions another replica ended.
            match self.sessions.reconcile().await {
                Ok(gone) => {
                    for principal in gone {
                        self.end_streams(&principal.session_id);
                        let descendants = self.sessions.descendants(&principal.session_id);
                        let id = principal.session_id.clone();
                        self.finish(
                            &id,
                            Some(principal),
                            descendants,
                            "session ended on another replica",
                        )
                        .await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reconciling sessions with the store failed"),
            }
            self.guardrails.save().await;
            self.guardrails.rate.sweep(std::time::Instant::now());
            // Lasting credentials start-up could not read (Vault not connected yet).
            self.credentials.learn_lasting().await;
            // Merges the response scrubber's small shards and drops secrets that ended:
            // compiling takes milliseconds, so not on a runtime worker.
            let known = self.credentials.known().clone();
            if let Err(e) = tokio::task::spawn_blocking(move || known.compact()).await {
                tracing::error!(error = %e, "compacting the response scrubber failed");
            }
            let report = self.credentials.broker.reap().await;
            if !report.revoked.is_empty() || !report.quarantined.is_empty() {
                self.metrics.revoked(&report);
                self.record(None, "leases reaped", &report, None);
            }
            self.update_gauges();
        }
    }

    fn update_gauges(&self) {
        let broker = &self.credentials.broker;
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics
            .quarantined_leases
            .set(gauge(broker.quarantined().len()));
        self.metrics.live_leases.set(gauge(broker.live_leases()));
    }

    /// One `session` record for the teardown, one `lease` record per failed revocation (each
    /// names its lease, so an operator can finish the job by hand if Vault never comes back).
    fn record(
        &self,
        who: Option<(&str, &str, &str)>,
        why: &str,
        report: &Revoked,
        totals: Option<crate::guardrails::meter::Account>,
    ) {
        let request_id = ids::request_id();
        if let Some((session, agent, tenant)) = who {
            let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, "session");
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
            let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, "lease");
            audit.update(|r| {
                r.reason = Some(why.to_owned());
                r.credentials = report.revoked.iter().map(|(b, _)| b.clone()).collect();
                r.leases = report.revoked.iter().map(|(_, l)| l.clone()).collect();
            });
            audit.allow(0);
        }
        for (binding, lease, error) in &report.quarantined {
            tracing::warn!(credential = %binding, lease, error, "lease revocation failed; quarantined");
            let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, "lease");
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
}
