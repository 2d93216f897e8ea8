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
        let started = Instant::now();
        let deadline = started + tier.budget;
        let mut ran = Vec::new();
        let mut late: Option<String> = None;

        // Local checks, cheapest first; the first failure ends the run.
        for name in ["limits", "args_schema", "dlp"] {
            if !tier.checks.iter().any(|c| c == name) {
                continue;
            }
            let t0 = Instant::now();
            let result = match name {
                "limits" => self.limits(tier, &subject),
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
            record(&mut ran, metrics, name, outcome, t0.elapsed());
            if let Err(detail) = result {
                return Report {
                    ran,
                    verdict: Verdict::Fail {
                        check: name.to_owned(),
                        detail,
                    },
                    budget_exceeded: false,
                };
            }
        }
        if Instant::now() > deadline {
            late = Some(ran.last().map(|r| r.check.clone()).unwrap_or_default());
        }

        // Remote checks, under what is left of the budget.
        if late.is_none() && tier.checks.iter().any(|c| c == "webhook") {
            if let Some(webhook) = &self.webhook {
                let t0 = Instant::now();
                let asked = tokio::time::timeout_at(
                    tokio::time::Instant::from_std(deadline),
                    webhook.ask(&describe(&subject)),
                )
                .await;
                let took = t0.elapsed();
                match asked {
                    Ok(Ok(answer)) => {
                        let reason = answer.reason.unwrap_or_default();
                        match answer.decision {
                            webhook::Decision::Allow => {
                                record(&mut ran, metrics, "webhook", Outcome::Pass, took)
                            }
                            webhook::Decision::Deny => {
                                record(&mut ran, metrics, "webhook", Outcome::Fail, took);
                                return Report {
                                    ran,
                                    verdict: Verdict::Fail {
                                        check: "webhook".into(),
                                        detail: if reason.is_empty() {
                                            "the external check refused this action".into()
                                        } else {
                                            reason
                                        },
                                    },
                                    budget_exceeded: false,
                                };
                            }
                            webhook::Decision::Escalate => {
                                record(&mut ran, metrics, "webhook", Outcome::Escalate, took);
                                return Report {
                                    ran,
                                    verdict: Verdict::Escalate {
                                        check: "webhook".into(),
                                        reason,
                                    },
                                    budget_exceeded: false,
                                };
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "webhook check gave no usable answer");
                        record(&mut ran, metrics, "webhook", Outcome::Error, took);
                        late = Some("webhook".into());
                    }
                    Err(_) => {
                        record(&mut ran, metrics, "webhook", Outcome::Timeout, took);
                        late = Some("webhook".into());
                    }
                }
            }
        }

        let Some(check) = late else {
            return Report {
                ran,
                verdict: Verdict::Pass,
                budget_exceeded: false,
            };
        };
        metrics.check_budget_exceeded(subject.tier, tier.on_budget.as_str());
        let budget = humantime::format_duration(tier.budget);
        let verdict = match tier.on_budget {
            OnBudget::Allow => Verdict::Unchecked { check },
            OnBudget::Deny => Verdict::Fail {
                detail: format!(
                    "{check} did not answer within the {} tier's {budget} budget",
                    subject.tier
                ),
                check,
            },
            OnBudget::Escalate => Verdict::Escalate {
                reason: format!(
                    "{check} did not answer within the {} tier's {budget} budget",
                    subject.tier
                ),
                check,
            },
        };
        Report {
            ran,
            verdict,
            budget_exceeded: true,
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
