//! Prometheus metrics (`GET /metrics`): requests by decision, decision latency (Cedar
//! evaluation only), upstream latency (time to the response head), policy reloads by
//! outcome and the generation of the policy set in force; credentials by binding and
//! outcome, broker fetch latency, revocations, quarantined leases and placeholder
//! exfiltration attempts. Labels name credentials, never values or lease ids (unbounded).

use std::sync::{Mutex, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `http`, `connect`, `tunnel`, `tls`.
    pub kind: String,
    /// `allow`, `deny`, `error`, `cancel`.
    pub decision: String,
}

/// Labels of the policy reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` or `failed`.
    pub outcome: String,
}

/// Labels of the shadow set's counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowLabels {
    /// `agree`, `disagree`, `dropped`, `partial`, `unreadable`.
    pub outcome: String,
}

/// Labels of the credential counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CredentialLabels {
    pub credential: String,
    /// `file`, `vault_kv`, `vault_jwt`, `vault_pki`, `vault_database`.
    pub source: String,
    /// `cached`, `fetched`, or the failure kind (`vault_sealed`, `vault_unreachable`, ...).
    pub outcome: String,
}

/// Labels of counters keyed by credential only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabels {
    pub credential: String,
}

/// Labels of the revocation counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevocationLabels {
    pub credential: String,
    /// `revoked` or `failed` (then quarantined and retried).
    pub outcome: String,
}

/// Labels of the proxy's open connections, by the event loop that serves them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoopLabels {
    /// The event loop's number, from 0 (`listen.proxy_threads`); `shared` (TCP) and `unix`
    /// (the sandbox's socket) when the connections share the runtime's workers.
    pub thread: String,
}

/// All metrics of one proxy.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    pub decision_seconds: Histogram,
    pub upstream_seconds: Histogram,
    pub policy_reloads: Family<ReloadLabels, Counter>,
    /// Decisions the shadow set compared, by outcome.
    pub shadow: Family<ShadowLabels, Counter>,
    pub policy_generation: Gauge,
    /// Proxy connections open, by event loop ([`crate::shards`]).
    pub proxy_connections: Family<LoopLabels, Gauge>,
    /// HTTP/1 connections at rest, holding no HTTP state until their next request
    /// ([`crate::hibernate`]).
    pub proxy_connections_resting: Gauge,
    pub credentials: Family<CredentialLabels, Counter>,
    pub credential_fetch_seconds: Histogram,
    pub revocations: Family<RevocationLabels, Counter>,
    pub quarantined_leases: Gauge,
    pub live_leases: Gauge,
    pub exfiltration_attempts: Family<NameLabels, Counter>,
    pub approval_transitions: Family<TransitionLabels, Counter>,
    pub approval_notifications: Family<NotificationLabels, Counter>,
    pub approvals_pending: Gauge,
    pub approvals_executing: Gauge,
    pub approval_notifications_failing: Gauge,
    pub check_seconds: Family<CheckLabels, Histogram, fn() -> Histogram>,
    pub checks: Family<CheckOutcomeLabels, Counter>,
    pub check_budget_exceeded: Family<BudgetLabels, Counter>,
    pub watchdog_trips: Family<KindLabels, Counter>,
    pub limits_exceeded: Family<LimitLabels, Counter>,
    /// The per-request families' metrics by label values (see [`Handles`]).
    request_handles: Handles<Counter>,
    check_second_handles: Handles<Histogram>,
    check_handles: Handles<Counter>,
}

/// Metrics of a family already looked up, by their label values. A family's own lookup
/// builds a label set of owned strings and SipHashes it under a lock, per call: with a
/// request counted and each of its checks timed and counted, ~1% of the proxy's CPU flat
/// out. Label values are few (kinds, decisions, check names, outcomes), so a short list
/// scanned under a read lock finds them; past [`Handles::MAX`] the family is asked
/// directly. The metric handles share their values with the family's.
#[derive(Debug)]
struct Handles<M> {
    known: RwLock<Vec<(LabelValues, M)>>,
}

type LabelValues = Box<[Box<str>]>;

impl<M> Default for Handles<M> {
    fn default() -> Self {
        Self {
            known: RwLock::new(Vec::new()),
        }
    }
}

impl<M: Clone> Handles<M> {
    const MAX: usize = 256;

    fn get(&self, labels: &[&str], create: impl FnOnce() -> M) -> M {
        let same = |known: &[Box<str>]| known.iter().map(|k| &**k).eq(labels.iter().copied());
        if let Ok(known) = self.known.read() {
            if let Some((_, m)) = known.iter().find(|(k, _)| same(k)) {
                return m.clone();
            }
        }
        let m = create();
        if let Ok(mut known) = self.known.write() {
            if known.len() < Self::MAX && !known.iter().any(|(k, _)| same(k)) {
                let key = labels.iter().map(|l| Box::from(*l)).collect();
                known.push((key, m.clone()));
            }
        }
        m
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `repeat`, `cycle`, `denial_burst`, `tier_jump`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `calls`, `cost`, `bytes_sent`, `bytes_received`, `rate:agent`, `rate:tenant`, ...
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    pub check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckOutcomeLabels {
    pub check: String,
    /// `pass`, `fail`, `escalate`, `timeout`, `error`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    pub tier: String,
    /// What the tier did: `allow`, `deny`, `escalate`.
    pub action: String,
}

fn check_histogram() -> Histogram {
    // 1 µs .. ~16 s: local checks live in microseconds, webhooks in milliseconds.
    Histogram::new(exponential_buckets(1e-6, 2.0, 25))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// `held`, `approved`, `denied`, `expired`, `reminded`, `executed`, `failed`,
    /// `refused`, `recovered`.
    pub transition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotificationLabels {
    /// `slack` or `email`.
    pub channel: String,
    /// `sent`, `failed` (will be retried) or `dropped` (decided before delivery).
    pub outcome: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let policy_reloads = Family::<ReloadLabels, Counter>::default();
        // Both series exist from the start, so an alert on `failed` sees 0 rather than
        // nothing until the first failure.
        for outcome in ["ok", "failed"] {
            let _ = policy_reloads.get_or_create(&ReloadLabels {
                outcome: outcome.to_owned(),
            });
        }
        let mut metrics = Self {
            request_handles: Handles::default(),
            check_second_handles: Handles::default(),
            check_handles: Handles::default(),
            registry: Mutex::default(),
            requests: Family::default(),
            // 1 µs .. ~8 ms: Cedar decisions live in microseconds.
            decision_seconds: Histogram::new(exponential_buckets(1e-6, 2.0, 14)),
            // 100 µs .. ~100 s.
            upstream_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 21)),
            policy_reloads,
            shadow: Family::default(),
            policy_generation: Gauge::default(),
            proxy_connections: Family::default(),
            proxy_connections_resting: Gauge::default(),
            credentials: Family::default(),
            // 100 µs .. ~6.5 s: one Vault round trip.
            credential_fetch_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 17)),
            revocations: Family::default(),
            quarantined_leases: Gauge::default(),
            live_leases: Gauge::default(),
            exfiltration_attempts: Family::default(),
            approval_transitions: Family::default(),
            approval_notifications: Family::default(),
            approvals_pending: Gauge::default(),
            approvals_executing: Gauge::default(),
            approval_notifications_failing: Gauge::default(),
            check_seconds: Family::new_with_constructor(check_histogram),
            checks: Family::default(),
            check_budget_exceeded: Family::default(),
            watchdog_trips: Family::default(),
            limits_exceeded: Family::default(),
        };
        let mut registry = Registry::with_prefix("ostiary");
        metrics.register_decisions(&mut registry);
        metrics.register_credentials(&mut registry);
        metrics.register_approvals(&mut registry);
        metrics.register_guardrails(&mut registry);
        metrics.registry = Mutex::new(registry);
        metrics
    }
}

/// Each family and gauge in the registry `/metrics` encodes, by concern.
impl Metrics {
    /// Requests, decisions and the policy set in force.
    fn register_decisions(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Requests handled, by kind and decision",
            self.requests.clone(),
        );
        registry.register(
            "decision_seconds",
            "Time spent in policy evaluation per decision",
            self.decision_seconds.clone(),
        );
        registry.register(
            "upstream_seconds",
            "Time from dialing an upstream to its response head",
            self.upstream_seconds.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy set reloads, by outcome (a failed one keeps the last good set)",
            self.policy_reloads.clone(),
        );
        registry.register(
            "shadow_decisions",
            "Decisions the shadow policy set compared, by outcome (agree, disagree, dropped: \
             the queue was full, partial: kept without their arguments, unreadable)",
            self.shadow.clone(),
        );
        registry.register(
            "policy_generation",
            "Generation of the policy set in force (1 at start-up, +1 per successful reload)",
            self.policy_generation.clone(),
        );
        registry.register(
            "proxy_connections",
            "Connections open on the proxy listener, by the event loop that serves them",
            self.proxy_connections.clone(),
        );
        registry.register(
            "proxy_connections_resting",
            "HTTP/1 connections (the agent's, and intercepted ones) idle between requests, \
             holding no HTTP server state until their next request arrives",
            self.proxy_connections_resting.clone(),
        );
    }

    /// The open-connection gauge of event loop `thread` (shared with the family's).
    pub fn proxy_connections(&self, thread: &str) -> Gauge {
        self.proxy_connections
            .get_or_create(&LoopLabels {
                thread: thread.to_owned(),
            })
            .clone()
    }

    /// The broker: credentials, their leases, and placeholders sent where they may not go.
    fn register_credentials(&self, registry: &mut Registry) {
        registry.register(
            "credentials",
            "Credentials asked of the broker, by binding, source and outcome",
            self.credentials.clone(),
        );
        registry.register(
            "credential_fetch_seconds",
            "Time to fetch a credential the cache did not hold (file read or Vault round trip)",
            self.credential_fetch_seconds.clone(),
        );
        registry.register(
            "lease_revocations",
            "Lease revocations at teardown or expiry, by binding and outcome",
            self.revocations.clone(),
        );
        registry.register(
            "quarantined_leases",
            "Leases whose revocation failed and is being retried",
            self.quarantined_leases.clone(),
        );
        registry.register(
            "live_leases",
            "Leases held for live sessions",
            self.live_leases.clone(),
        );
        registry.register(
            "placeholder_exfiltration_attempts",
            "Requests refused for carrying a credential placeholder to a host it is not bound to, or outside its binding's injection point",
            self.exfiltration_attempts.clone(),
        );
    }

    /// The approval queue and its notifications.
    fn register_approvals(&self, registry: &mut Registry) {
        registry.register(
            "approval_transitions",
            "Approval state transitions (held, approved, denied, expired, reminded, executed, failed, refused, recovered)",
            self.approval_transitions.clone(),
        );
        registry.register(
            "approval_notifications",
            "Notifications to approvers, by channel and outcome (failed ones are retried)",
            self.approval_notifications.clone(),
        );
        registry.register(
            "approvals_pending",
            "Approvals waiting for a human",
            self.approvals_pending.clone(),
        );
        registry.register(
            "approvals_executing",
            "Approved requests claimed for execution and not yet finished",
            self.approvals_executing.clone(),
        );
        registry.register(
            "approval_notifications_failing",
            "Notifications that failed at least once and are still being retried",
            self.approval_notifications_failing.clone(),
        );
    }

    /// Tier checks, the loop watchdog and session limits.
    fn register_guardrails(&self, registry: &mut Registry) {
        registry.register(
            "check_seconds",
            "Time each tier check took, by check",
            self.check_seconds.clone(),
        );
        registry.register(
            "checks",
            "Tier checks run, by check and outcome (pass, fail, escalate, timeout, error)",
            self.checks.clone(),
        );
        registry.register(
            "check_budget_exceeded",
            "Requests whose checks did not all answer within the tier's budget, by tier and what the tier did",
            self.check_budget_exceeded.clone(),
        );
        registry.register(
            "watchdog_trips",
            "Sessions paused by the loop watchdog, by rule",
            self.watchdog_trips.clone(),
        );
        registry.register(
            "limits_exceeded",
            "Requests refused (429) or escalated because a session limit was reached, by limit",
            self.limits_exceeded.clone(),
        );
    }
}

impl Metrics {
    /// Time and count one check.
    pub fn check_ran(&self, check: &str, outcome: &str, took: std::time::Duration) {
        self.check_second_handles
            .get(&[check], || {
                self.check_seconds
                    .get_or_create(&CheckLabels {
                        check: check.to_owned(),
                    })
                    .clone()
            })
            .observe(took.as_secs_f64());
        self.check_handles
            .get(&[check, outcome], || {
                self.checks
                    .get_or_create(&CheckOutcomeLabels {
                        check: check.to_owned(),
                        outcome: outcome.to_owned(),
                    })
                    .clone()
            })
            .inc();
    }

    /// Count a watchdog trip.
    pub fn watchdog_trip(&self, kind: &str) {
        self.watchdog_trips
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Count a limit reached.
    pub fn limit_exceeded(&self, limit: &str) {
        self.limits_exceeded
            .get_or_create(&LimitLabels {
                limit: limit.to_owned(),
            })
            .inc();
    }

    /// Count a budget that ran out.
    pub fn check_budget_exceeded(&self, tier: &str, action: &str) {
        self.check_budget_exceeded
            .get_or_create(&BudgetLabels {
                tier: tier.to_owned(),
                action: action.to_owned(),
            })
            .inc();
    }

    /// Count one approval transition.
    pub fn approval_transition(&self, transition: &str) {
        self.approval_transitions
            .get_or_create(&TransitionLabels {
                transition: transition.to_owned(),
            })
            .inc();
    }

    /// Count one notification attempt.
    pub fn approval_notification(&self, channel: &str, outcome: &str) {
        self.approval_notifications
            .get_or_create(&NotificationLabels {
                channel: channel.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Count one finished request.
    pub fn count(&self, kind: &str, decision: &str) {
        self.request_handles
            .get(&[kind, decision], || {
                self.requests
                    .get_or_create(&RequestLabels {
                        kind: kind.to_owned(),
                        decision: decision.to_owned(),
                    })
                    .clone()
            })
            .inc();
    }

    /// Count one policy reload and publish the generation now in force.
    /// Count one decision the shadow set compared (or could not).
    pub fn shadow_decided(&self, outcome: &str) {
        self.shadow
            .get_or_create(&ShadowLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    pub fn policy_reloaded(&self, ok: bool, generation: u64) {
        self.policy_reloads
            .get_or_create(&ReloadLabels {
                outcome: if ok { "ok" } else { "failed" }.to_owned(),
            })
            .inc();
        self.set_policy_generation(generation);
    }

    /// Publish the generation of the policy set in force.
    pub fn set_policy_generation(&self, generation: u64) {
        self.policy_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
    }

    /// Count one credential asked of the broker; `fetch` is the fetch time when the cache
    /// did not hold it.
    pub fn credential_outcome(
        &self,
        credential: &str,
        source: &str,
        outcome: &str,
        fetch: Option<std::time::Duration>,
    ) {
        self.credentials
            .get_or_create(&CredentialLabels {
                credential: credential.to_owned(),
                source: source.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
        if let Some(fetch) = fetch {
            self.credential_fetch_seconds.observe(fetch.as_secs_f64());
        }
    }

    /// Count one refused placeholder exfiltration.
    pub fn placeholder_exfiltration(&self, credential: &str) {
        self.exfiltration_attempts
            .get_or_create(&NameLabels {
                credential: credential.to_owned(),
            })
            .inc();
    }

    /// Count revocations of one teardown or reaper pass.
    pub fn revoked(&self, report: &ostiary_broker::Revoked) {
        for (credential, _) in &report.revoked {
            self.revocations
                .get_or_create(&RevocationLabels {
                    credential: credential.clone(),
                    outcome: "revoked".to_owned(),
                })
                .inc();
        }
        for (credential, _, _) in &report.quarantined {
            self.revocations
                .get_or_create(&RevocationLabels {
                    credential: credential.clone(),
                    outcome: "failed".to_owned(),
                })
                .inc();
        }
    }

    /// Register a metric a module keeps itself (the audit writer's health), so that it is
    /// exposed with the rest.
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        if let Ok(mut registry) = self.registry.lock() {
            registry.register(name, help, metric);
        }
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn cached_handles_count_into_the_families() {
        let m = Metrics::default();
        for _ in 0..3 {
            m.count("http", "allow");
            m.check_ran("dlp", "pass", std::time::Duration::from_micros(5));
        }
        m.count("http", "deny");
        m.check_ran("dlp", "fail", std::time::Duration::ZERO);
        let text = m.encode();
        let requests: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ostiary_requests_total{"))
            .collect();
        assert!(
            requests.contains(&r#"ostiary_requests_total{kind="http",decision="allow"} 3"#),
            "{requests:?}"
        );
        assert!(
            requests.contains(&r#"ostiary_requests_total{kind="http",decision="deny"} 1"#),
            "{requests:?}"
        );
        assert!(
            text.contains(r#"ostiary_checks_total{check="dlp",outcome="pass"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ostiary_checks_total{check="dlp",outcome="fail"} 1"#),
            "{text}"
        );
        assert!(
            line(&text, "ostiary_check_seconds_count{").ends_with(" 4"),
            "{text}"
        );
    }

    #[test]
    fn past_the_bound_the_family_is_asked_directly() {
        let m = Metrics::default();
        for i in 0..Handles::<Counter>::MAX + 10 {
            m.count("http", &format!("d{i}"));
        }
        m.count("http", &format!("d{}", Handles::<Counter>::MAX + 5));
        let text = m.encode();
        let last = format!(
            r#"ostiary_requests_total{{kind="http",decision="d{}"}} 2"#,
            Handles::<Counter>::MAX + 5
        );
        assert!(text.contains(&last), "{text}");
    }
}
