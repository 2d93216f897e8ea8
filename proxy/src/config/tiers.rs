//! `[tiers.*]`: what each risk tier pays for — its checks and their latency budget, its
//! rate limits, and how many identical calls the watchdog lets it make.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// `[tiers.read]`, `[tiers.write]`, `[tiers.irreversible]`, `[tiers.high_impact]`. A tier
/// left out, and a field left out of a tier, keep their defaults ([`Tier::default_for`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "BTreeMap<String, TierToml>")]
pub struct Tiers {
    pub read: Tier,
    pub write: Tier,
    pub irreversible: Tier,
    pub high_impact: Tier,
}

impl Default for Tiers {
    fn default() -> Self {
        Self {
            read: Tier::default_for("read"),
            write: Tier::default_for("write"),
            irreversible: Tier::default_for("irreversible"),
            high_impact: Tier::default_for("high_impact"),
        }
    }
}

impl Tiers {
    /// The settings of tier `name` (`read`, `write`, `irreversible`, `high_impact`).
    pub fn get(&self, name: &str) -> Option<&Tier> {
        match name {
            "read" => Some(&self.read),
            "write" => Some(&self.write),
            "irreversible" => Some(&self.irreversible),
            "high_impact" => Some(&self.high_impact),
            _ => None,
        }
    }
}

impl TryFrom<BTreeMap<String, TierToml>> for Tiers {
    type Error = String;

    fn try_from(written: BTreeMap<String, TierToml>) -> Result<Self, String> {
        let mut tiers = Tiers::default();
        for (name, given) in written {
            let tier = match name.as_str() {
                "read" => &mut tiers.read,
                "write" => &mut tiers.write,
                "irreversible" => &mut tiers.irreversible,
                "high_impact" => &mut tiers.high_impact,
                other => {
                    return Err(format!(
                        "unknown tier {other:?} (read, write, irreversible, high_impact)"
                    ))
                }
            };
            if let Some(budget) = given.budget {
                tier.budget = humantime::parse_duration(&budget)
                    .map_err(|e| format!("tiers.{name}.budget: {e}"))?;
            }
            if let Some(on_budget) = given.on_budget {
                tier.on_budget = on_budget;
            }
            if let Some(checks) = given.checks {
                tier.checks = checks;
            }
            if let Some(max) = given.max_body_bytes {
                tier.max_body_bytes = max;
            }
            if let Some(text) = given.rate_agent {
                tier.rate_agent =
                    Some(Rate::parse(&text).map_err(|e| format!("tiers.{name}.rate_agent: {e}"))?);
            }
            if let Some(text) = given.rate_tenant {
                tier.rate_tenant =
                    Some(Rate::parse(&text).map_err(|e| format!("tiers.{name}.rate_tenant: {e}"))?);
            }
            if let Some(burst) = given.rate_burst {
                if burst == 0 {
                    return Err(format!("tiers.{name}.rate_burst must be at least 1"));
                }
                for rate in [&mut tier.rate_agent, &mut tier.rate_tenant]
                    .into_iter()
                    .flatten()
                {
                    rate.burst = burst;
                }
            }
            if let Some(max) = given.repeat_max {
                tier.repeat_max = max;
            }
            if let Some(window) = given.repeat_window {
                tier.repeat_window = humantime::parse_duration(&window)
                    .map_err(|e| format!("tiers.{name}.repeat_window: {e}"))?;
            }
        }
        Ok(tiers)
    }
}

/// One `[tiers.<name>]` table as written: every field optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierToml {
    budget: Option<String>,
    on_budget: Option<OnBudget>,
    checks: Option<Vec<String>>,
    max_body_bytes: Option<u64>,
    rate_agent: Option<String>,
    rate_tenant: Option<String>,
    rate_burst: Option<u32>,
    repeat_max: Option<u32>,
    repeat_window: Option<String>,
}

/// One tier: the checks it pays for, their common latency budget, and what happens when
/// the budget runs out before they all answered.
#[derive(Debug, Clone)]
pub struct Tier {
    /// Wall-clock budget for all of the tier's checks of one request.
    pub budget: Duration,
    /// `allow` (forwarded, audited as unchecked), `deny` (422 naming the late check), or
    /// `escalate` (held for a human, like an `@escalate` decision).
    pub on_budget: OnBudget,
    /// `args_schema`, `limits`, `dlp`, `response_dlp`, `webhook`.
    pub checks: Vec<String>,
    /// The `limits` check: largest request body of this tier (bytes).
    pub max_body_bytes: u64,
    /// Requests of this tier one agent may make (GCRA; `None`: unlimited).
    pub rate_agent: Option<Rate>,
    /// Requests of this tier one tenant's agents may make together.
    pub rate_tenant: Option<Rate>,
    /// The watchdog pauses a session after this many identical calls (same tool or
    /// destination, same arguments) within `repeat_window`; 0 turns the rule off.
    pub repeat_max: u32,
    pub repeat_window: Duration,
}

/// A rate limit: `count` requests per `period`, with bursts of up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub period: Duration,
    pub burst: u32,
}

impl Rate {
    /// `"<count>/<s|m|h>"` (also `sec`, `min`, `hour`); the burst defaults to `count`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (count, unit) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not <count>/<s|m|h>"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|e| format!("{text:?}: count: {e}"))?;
        if count == 0 {
            return Err(format!("{text:?}: the count must be at least 1"));
        }
        let period = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            other => return Err(format!("{text:?}: unknown unit {other:?} (s, m, h)")),
        };
        Ok(Rate {
            count,
            period,
            burst: count,
        })
    }

    /// Time between two requests at the sustained rate (GCRA's emission interval).
    pub fn interval(&self) -> Duration {
        self.period / self.count
    }
}

/// The tier called `name`, as the `'static` name the guardrails key rate limits by.
pub fn tier_name(name: &str) -> Option<&'static str> {
    ["read", "write", "irreversible", "high_impact"]
        .into_iter()
        .find(|t| *t == name)
}

/// What a tier does when its budget runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBudget {
    Allow,
    Deny,
    Escalate,
}

impl OnBudget {
    pub fn as_str(self) -> &'static str {
        match self {
            OnBudget::Allow => "allow",
            OnBudget::Deny => "deny",
            OnBudget::Escalate => "escalate",
        }
    }
}

/// The check names a tier may list.
pub const CHECK_NAMES: &[&str] = &["args_schema", "limits", "dlp", "response_dlp", "webhook"];

impl Tier {
    /// The shipped defaults (docs/checks.md explains the reasoning): reads pay only for
    /// what costs microseconds and are let through when even that runs late; writes add
    /// outbound DLP and fail closed; irreversible and high-impact calls add the external
    /// webhook (when configured) and go to a human when the budget runs out.
    pub fn default_for(tier: &str) -> Self {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        match tier {
            "read" => Tier {
                budget: Duration::from_millis(2),
                on_budget: OnBudget::Allow,
                checks: names(&["limits", "args_schema"]),
                max_body_bytes: 1024 * 1024,
                ..Tier::unlimited()
            },
            "write" => Tier {
                budget: Duration::from_millis(20),
                on_budget: OnBudget::Deny,
                checks: names(&["limits", "args_schema", "dlp"]),
                // Uploads through the proxy (packages, artifacts) are writes too.
                max_body_bytes: 64 * 1024 * 1024,
                ..Tier::unlimited()
            },
            _ => Tier {
                budget: Duration::from_millis(200),
                on_budget: OnBudget::Escalate,
                checks: names(&["limits", "args_schema", "dlp", "webhook"]),
                max_body_bytes: 10 * 1024 * 1024,
                ..Tier::unlimited()
            },
        }
    }

    /// What every tier shares by default: no rate limit, the watchdog's 20 identical calls
    /// within 60 s (the docker-agent loop of 629 identical `read_file` calls is the pattern).
    fn unlimited() -> Self {
        Tier {
            budget: Duration::ZERO,
            on_budget: OnBudget::Allow,
            checks: Vec::new(),
            max_body_bytes: 0,
            rate_agent: None,
            rate_tenant: None,
            repeat_max: 20,
            repeat_window: Duration::from_secs(60),
        }
    }
}
