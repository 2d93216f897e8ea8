//! Phase `check` (docs/design.md §3): the checks a request's risk tier pays for, within the tier's
//! latency budget, and what happens when the budget runs out (`[tiers.*]`, docs/design.md §8).
//!
//! Checks run cheapest first. The local ones (`limits`, `args_schema`, `dlp` on a body in
//! hand) cost microseconds and run in order, stopping at the first failure; only then do
//! the remote ones (`webhook`) start, under whatever is left of the budget, and are
//! cancelled when it runs out. A check that could not answer — late, unreachable, or a
//! nonsense answer — is treated as the budget running out: the tier's `on_budget` says
//! whether the request is let through (audited as unchecked), refused, or put before a
//! human. A check that answered "no" is a `422 check_failed` naming it.
//!
//! `dlp` on a body that streams (plain requests whose body is not read before forwarding)
//! cannot finish before the request is sent: it runs on the way ([`dlp::DlpBody`]) and
//! aborts the upstream request at the first finding; `response_dlp` does the same to
//! answers. Neither counts against the budget, which bounds the wait *before* forwarding.
//!
//! - [`args_schema`] — the full JSON Schema of a tool's arguments, compiled once.
//! - [`dlp`] — secrets and PII in bodies: multi-pattern automata, streaming.
//! - [`webhook`] — the external check.

pub mod args_schema;
pub mod calls;
pub mod dlp;
pub mod webhook;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ostiary_policies::Tool;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{self, OnBudget, Tier};
use crate::metrics::Metrics;

/// How one check ended, as audited and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    /// The webhook asked for a human.
    Escalate,
    /// Cancelled when the budget ran out.
    Timeout,
    /// No usable answer (unreachable, bad answer): handled like a timeout.
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Escalate => "escalate",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// One check as it ran (for the audit record: name, outcome, duration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ran {
    pub check: String,
    pub outcome: Outcome,
    pub duration_us: u64,
}

/// What the checks of one request decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every check passed (or none applied).
    Pass,
    /// The budget ran out (or a check could not answer) and the tier lets it through:
    /// forwarded, audited as unchecked.
    Unchecked { check: String },
    /// A check said no, or the budget ran out in a tier that refuses then.
    Fail { check: String, detail: String },
    /// The webhook asked for a human, or the budget ran out in a tier that escalates.
    Escalate { check: String, reason: String },
}

/// The checks of one request, with the verdict.
#[derive(Debug, Clone)]
pub struct Report {
    pub ran: Vec<Ran>,
    pub verdict: Verdict,
    /// The budget ran out (or a check could not answer) before every check had answered.
    pub budget_exceeded: bool,
}

/// What a request offers its checks: what the proxy observed, nothing the agent claims.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub tier: &'a str,
    pub agent: &'a str,
    pub tenant: &'a str,
    pub session: &'a str,
    pub host: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// The catalogued tool and its parsed arguments, for tool calls.
    pub tool: Option<&'a Tool>,
    pub args: Option<&'a Value>,
    pub records: i64,
    /// A body already read whole (tool calls); `None` while it streams.
    pub body: Option<&'a [u8]>,
    /// `Content-Length` of a body that streams.
    pub declared_len: Option<u64>,
    /// The DLP detectors with the session's credential values added, when it holds any;
    /// `None`: the default set.
    pub detectors: Option<&'a dlp::Detectors>,
}

/// The checks and what they need, built once.
#[derive(Debug)]
pub struct Checks {
    pub tiers: config::Tiers,
    schemas: args_schema::Schemas,
    webhook: Option<webhook::Webhook>,
    pub detectors: Arc<dlp::Detectors>,
}

impl Checks {
    pub fn new(
        tiers: config::Tiers,
        settings: &config::Checks,
    ) -> Result<Self, webhook::WebhookError> {
        Ok(Self {
            tiers,
            schemas: args_schema::Schemas::default(),
            webhook: settings
                .webhook
                .as_ref()
                .map(webhook::Webhook::new)
                .transpose()?,
            detectors: Arc::new(dlp::Detectors::default_set()),
        })
    }

    /// Compile every tool's schema of `catalog` ahead of its first call (at start-up and
    /// after each reload), so no request pays for it inside its budget.
    pub fn prepare(&self, catalog: &ostiary_policies::Catalog) {
        for tool in catalog.tools() {
            let _ = self.schemas.check(tool, &Value::Null);
        }
    }

    /// The tier of a plain request (no tool): reads are `read`, everything that can change
    /// something is `write`.
    pub fn http_tier(method: &http::Method) -> &'static str {
        if method.is_safe() {
            "read"
        } else {
            "write"
        }
    }

    /// The detectors for a session that holds `secrets` (binding name, value): the default
    /// set plus those values, so a credential the broker holds never leaves in a body.
    /// `None` when it holds none.
    pub fn detectors_with(
        &self,
        secrets: Vec<(String, ostiary_broker::Secret)>,
    ) -> Option<Arc<dlp::Detectors>> {
        if secrets.is_empty() {
            return None;
        }
        let literals = secrets
            .into_iter()
            .map(|(name, value)| (name, value.expose().as_bytes().to_vec()))
            .collect();
        Some(Arc::new(dlp::Detectors::with_literals(
            &self.detectors,
            literals,
        )))
    }

    /// Whether `tier` lists `check`.
    pub fn wants(&self, tier: &str, check: &str) -> bool {
        self.tiers
            .get(tier)
            .is_some_and(|t| t.checks.iter().any(|c| c == check))
    }

    /// Run the checks of `subject`'s tier.
    pub async fn run(&self, subject: Subject<'_>, metrics: &Metrics) -> Report {
        let Some(tier) = self.tiers.get(subject.tier) else {
            return Report {
                ran: Vec::new(),
                verdict: Verdict::Pass,
                budget_exceeded: false,
            };
        };
        let deadline = Instant::now() + tier.budget;
        let mut ran = Vec::new();
        let decided = |ran, verdict| Report {
            ran,
            verdict,
            budget_exceeded: false,
        };
        // Local checks, cheapest first; the first failure ends the run.
        if let Err(failed) = self.local(tier, &subject, metrics, &mut ran) {
            return decided(ran, failed);
        }
        let mut late = (Instant::now() > deadline)
            .then(|| ran.last().map(|r| r.check.clone()).unwrap_or_default());
        // Remote checks, under what is left of the budget.
        if late.is_none() && tier.checks.iter().any(|c| c == "webhook") {
            match self.remote(&subject, deadline, metrics, &mut ran).await {
                Remote::Passed => {}
                Remote::Decided(verdict) => return decided(ran, verdict),
                Remote::Late(check) => late = Some(check),
            }
        }
        match late {
            None => decided(ran, Verdict::Pass),
            Some(check) => Report {
                ran,
                verdict: self.over_budget(tier, subject.tier, check, metrics),
                budget_exceeded: true,
            },
        }
    }

    /// `limits`, `args_schema` and `dlp` on the buffered body, in that order; the failure
    /// that ends the run, if one does.
    fn local(
        &self,
        tier: &Tier,
        subject: &Subject<'_>,
        metrics: &Metrics,
        ran: &mut Vec<Ran>,
    ) -> Result<(), Verdict> {
        for name in ["limits", "args_schema", "dlp"] {
            if !tier.checks.iter().any(|c| c == name) {
                continue;
            }
            let t0 = Instant::now();
            let result = match name {
                "limits" => self.limits(tier, subject),
                "args_schema" => match (subject.tool, subject.args) {
                    (Some(tool), Some(args)) => self.schemas.check(tool, args),
                    _ => Ok(()),
                },
                // A body that streams is scanned on its way (see the module docs).
                _ => match subject.body {
                    Some(body) => match subject.detectors.unwrap_or(&self.detectors).scan(body) {
                        Some(finding) => Err(format!(
                            "the request body carries {} at byte {}",
                            finding.kind, finding.offset
                        )),
                        None => Ok(()),
                    },
                    None => Ok(()),
                },
            };
            let outcome = if result.is_ok() {
                Outcome::Pass
            } else {
                Outcome::Fail
            };
            record(ran, metrics, name, outcome, t0.elapsed());
            if let Err(detail) = result {
                return Err(Verdict::Fail {
                    check: name.to_owned(),
                    detail,
                });
            }
        }
        Ok(())
    }

    /// The external `webhook` check, until `deadline`.
    async fn remote(
        &self,
        subject: &Subject<'_>,
        deadline: Instant,
        metrics: &Metrics,
        ran: &mut Vec<Ran>,
    ) -> Remote {
        let Some(webhook) = &self.webhook else {
            return Remote::Passed;
        };
        let t0 = Instant::now();
        let asked = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline),
            webhook.ask(&describe(subject)),
        )
        .await;
        let took = t0.elapsed();
        let answer = match asked {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "webhook check gave no usable answer");
                record(ran, metrics, "webhook", Outcome::Error, took);
                return Remote::Late("webhook".into());
            }
            Err(_) => {
                record(ran, metrics, "webhook", Outcome::Timeout, took);
                return Remote::Late("webhook".into());
            }
        };
        let reason = answer.reason.unwrap_or_default();
        match answer.decision {
            webhook::Decision::Allow => {
                record(ran, metrics, "webhook", Outcome::Pass, took);
                Remote::Passed
            }
            webhook::Decision::Deny => {
                record(ran, metrics, "webhook", Outcome::Fail, took);
                Remote::Decided(Verdict::Fail {
                    check: "webhook".into(),
                    detail: if reason.is_empty() {
                        "the external check refused this action".into()
                    } else {
                        reason
                    },
                })
            }
            webhook::Decision::Escalate => {
                record(ran, metrics, "webhook", Outcome::Escalate, took);
                Remote::Decided(Verdict::Escalate {
                    check: "webhook".into(),
                    reason,
                })
            }
        }
    }

    /// What the tier's `on_budget` makes of `check` not answering within the budget.
    fn over_budget(&self, tier: &Tier, name: &str, check: String, metrics: &Metrics) -> Verdict {
        metrics.check_budget_exceeded(name, tier.on_budget.as_str());
        let budget = humantime::format_duration(tier.budget);
        let why = format!("{check} did not answer within the {name} tier's {budget} budget");
        match tier.on_budget {
            OnBudget::Allow => Verdict::Unchecked { check },
            OnBudget::Deny => Verdict::Fail { detail: why, check },
            OnBudget::Escalate => Verdict::Escalate { reason: why, check },
        }
    }

    /// `limits`: the tier's body size (session budgets arrive with issue 7).
    fn limits(&self, tier: &Tier, subject: &Subject<'_>) -> Result<(), String> {
        let len = subject
            .body
            .map(|b| b.len() as u64)
            .or(subject.declared_len)
            .unwrap_or(0);
        if len > tier.max_body_bytes {
            return Err(format!(
                "the request body ({len} bytes) is larger than the {} tier allows ({} bytes)",
                subject.tier, tier.max_body_bytes
            ));
        }
        Ok(())
    }
}

fn record(ran: &mut Vec<Ran>, metrics: &Metrics, check: &str, outcome: Outcome, took: Duration) {
    metrics.check_ran(check, outcome.as_str(), took);
    ran.push(Ran {
        check: check.to_owned(),
        outcome,
        duration_us: took.as_micros() as u64,
    });
}

/// What the webhook is told: the proxy's own observation of the action.
fn describe(subject: &Subject<'_>) -> Value {
    json!({
        "agent": subject.agent,
        "tenant": subject.tenant,
        "session": subject.session,
        "tier": subject.tier,
        "tool": subject.tool.map(|t| t.name()),
        "host": subject.host,
        "method": subject.method,
        "path": subject.path,
        "args": subject.args,
        "impact": {
            "records": subject.records,
            "cost": subject.tool.and_then(|t| t.cost()),
        },
    })
}
/// What the remote check came to.
enum Remote {
    Passed,
    /// It decided the run (refused, or asked for a human).
    Decided(Verdict),
    /// It did not answer usably within the budget.
    Late(String),
}
