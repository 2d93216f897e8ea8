//! `[[trigger]]`: what starts runs — a signed webhook, a schedule, an API call — and the run
//! each one starts (docs/runs.md). Parsed and checked when the config loads, so that a
//! trigger that could never be verified (a webhook without a signature, a schedule that does
//! not parse, a schema that does not compile) stops start-up instead of failing at its first
//! delivery.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// One `[[trigger]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// Its name: the path of its webhook (`POST /v1/triggers/{name}`), the runs' `trigger`.
    pub name: String,
    pub kind: Kind,
    /// The program and its first arguments.
    pub command: Vec<String>,
    /// More arguments, after `command`'s.
    #[serde(default)]
    pub args: Vec<String>,
    /// The agent the run's session acts as.
    pub agent: String,
    #[serde(default)]
    pub tenant: Option<String>,
    /// The sandbox profile; `none` runs the command unsandboxed (not a boundary).
    #[serde(default = "default_profile")]
    pub profile: String,
    /// The run's session budget.
    #[serde(default)]
    pub max_calls: Option<u64>,
    #[serde(default)]
    pub max_cost: Option<f64>,
    /// The run's session lifetime (default: `sessions.default_ttl`).
    #[serde(default, deserialize_with = "optional_duration")]
    pub ttl: Option<Duration>,
    /// The run's wall-clock limit (default: its session's lifetime); past it the run ends as
    /// `limit_exceeded`.
    #[serde(default, deserialize_with = "optional_duration")]
    pub wall_clock: Option<Duration>,
    /// How a webhook's deliveries are signed (required for `webhook`).
    #[serde(default)]
    pub signature: Option<Signature>,
    /// The JSON Schema a payload must satisfy: inline, or a path to a JSON file.
    #[serde(default)]
    pub schema: Option<Value>,
    /// Deliveries with a key seen within the window start nothing more.
    #[serde(default)]
    pub dedup: Option<Dedup>,
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// At most this many runs started per period (`10/m`; `s`, `m`, `h`, `d`).
    #[serde(default = "default_rate", deserialize_with = "rate")]
    pub rate: Rate,
    /// Hold every run for a human before it starts.
    #[serde(default)]
    pub approval: bool,
    /// Attempts of a run that fails (not for a limit), and the wait before the first retry
    /// (doubling after each).
    #[serde(default)]
    pub retry: Retry,
    /// `schedule`: a cron expression, seconds first (`*/5 * * * * *`).
    #[serde(default)]
    pub cron: Option<String>,
    /// `schedule`: the time zone `cron` is read in (IANA name; default `UTC`).
    #[serde(default)]
    pub timezone: Option<String>,
    /// `schedule`: what a tick does while a run of this trigger is still going.
    #[serde(default)]
    pub concurrency: Concurrency,
    /// `schedule`: ticks missed while the proxy was down.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// `api`: a broker credential whose value callers may present instead of the admin
    /// token, for this trigger only.
    #[serde(default)]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Webhook,
    Schedule,
    Api,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::Schedule => "schedule",
            Kind::Api => "api",
        }
    }
}

/// `signature = { scheme = "github", secret = "github-webhook", … }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub scheme: SchemeName,
    /// A broker credential (`[[credential]]`) holding the signing secret.
    pub secret: String,
    /// Stripe, Slack and timestamped HMAC: how far a delivery's time may be from now.
    #[serde(default = "default_tolerance", deserialize_with = "duration")]
    pub tolerance: Duration,
    /// `hmac`: the header carrying the signature.
    #[serde(default)]
    pub header: Option<String>,
    /// `hmac`: `sha256` (default) or `sha512`.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// `hmac`: `hex` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<String>,
    /// `hmac`: what precedes the signature in its header (`sha256=`).
    #[serde(default)]
    pub prefix: String,
    /// `hmac`: a header with the delivery's Unix time; then `<time>.<body>` is what is
    /// signed, and the time must be within `tolerance`.
    #[serde(default)]
    pub timestamp_header: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeName {
    Github,
    Stripe,
    Slack,
    Hmac,
}

/// `dedup = { header = "X-GitHub-Delivery", window = "24h" }` or `{ pointer = "/id", … }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dedup {
    #[serde(default)]
    pub header: Option<String>,
    /// A JSON pointer into the payload (a string or a number).
    #[serde(default)]
    pub pointer: Option<String>,
    #[serde(default = "default_window", deserialize_with = "duration")]
    pub window: Duration,
}

/// At most `count` runs started per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    #[serde(deserialize_with = "duration")]
    pub backoff: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 1,
            backoff: Duration::from_secs(1),
        }
    }
}

/// As Kubernetes CronJobs name them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// A tick while a run is going starts nothing.
    #[default]
    Forbid,
    /// It waits its turn.
    Queue,
    /// The running one is cancelled and the tick's run starts.
    Replace,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// After downtime, one run for all the ticks missed, never a burst.
    #[default]
    One,
    /// Missed ticks are skipped.
    None,
}

fn default_profile() -> String {
    "default".into()
}

fn default_max_payload() -> usize {
    64 * 1024
}

fn default_rate() -> Rate {
    Rate {
        count: 60,
        per: Duration::from_secs(60),
    }
}

fn default_tolerance() -> Duration {
    Duration::from_secs(300)
}

fn default_window() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    super::duration(d)
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    super::duration(d).map(Some)
}

fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
    let text = String::deserialize(d)?;
    parse_rate(&text).map_err(serde::de::Error::custom)
}

/// `N/s`, `N/m`, `N/h` or `N/d`.
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = || format!("rate {text:?}: write it as N/s, N/m, N/h or N/d");
    let (count, per) = text.split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let per = match per.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    if count == 0 {
        return Err(format!("rate {text:?}: at least 1 per period"));
    }
    Ok(Rate {
        count,
        per: Duration::from_secs(per),
    })
}

/// The most a payload may be: a trigger payload is a task description, not a file upload.
const MOST_PAYLOAD: usize = 16 << 20;

impl Trigger {
    /// The command line the run starts: `command` then `args`.
    pub fn argv(&self) -> Vec<String> {
        self.command.iter().chain(&self.args).cloned().collect()
    }

    /// The schema as a JSON value: inline, or read from the path it names.
    pub fn schema_value(&self) -> Result<Option<Value>, String> {
        match &self.schema {
            None => Ok(None),
            Some(Value::String(path)) => {
                let path = PathBuf::from(path);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    format!("trigger {}: schema {}: {e}", self.name, path.display())
                })?;
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| format!("trigger {}: schema {}: {e}", self.name, path.display()))
            }
            Some(schema @ Value::Object(_)) | Some(schema @ Value::Bool(_)) => {
                Ok(Some(schema.clone()))
            }
            Some(_) => Err(format!(
                "trigger {}: schema must be a JSON Schema (a table) or the path of one",
                self.name
            )),
        }
    }

    fn validate(&self, profiles: &[String]) -> Result<(), String> {
        let name = &self.name;
        crate::session::registry::valid_name("trigger", name).map_err(|e| e.to_string())?;
        if self.command.first().is_none_or(|p| p.is_empty()) {
            return Err(format!("trigger {name}: command needs a program"));
        }
        crate::session::registry::valid_name("agent", &self.agent).map_err(|e| e.to_string())?;
        if self.profile != "none" && !profiles.contains(&self.profile) {
            return Err(format!(
                "trigger {name}: profile {:?} is not a sandbox profile (known: none, {})",
                self.profile,
                profiles.join(", ")
            ));
        }
        if !(1..=MOST_PAYLOAD).contains(&self.max_payload_bytes) {
            return Err(format!(
                "trigger {name}: max_payload_bytes must be 1 to {MOST_PAYLOAD}"
            ));
        }
        if !(1..=100).contains(&self.retry.attempts) {
            return Err(format!("trigger {name}: retry.attempts must be 1 to 100"));
        }
        if let Some(schema) = self.schema_value()? {
            jsonschema::validator_for(&schema)
                .map_err(|e| format!("trigger {name}: schema does not compile: {e}"))?;
        }
        if let Some(dedup) = &self.dedup {
            match (&dedup.header, &dedup.pointer) {
                (Some(h), None) => {
                    http::HeaderName::try_from(h.as_str())
                        .map_err(|e| format!("trigger {name}: dedup.header {h:?}: {e}"))?;
                }
                (None, Some(p)) if p.is_empty() || p.starts_with('/') => {}
                (None, Some(p)) => {
                    return Err(format!(
                        "trigger {name}: dedup.pointer {p:?} is not a JSON pointer (/…)"
                    ))
                }
                _ => {
                    return Err(format!(
                        "trigger {name}: dedup names either a header or a pointer"
                    ))
                }
            }
        }
        self.validate_kind()
    }

    /// What each kind needs, and what it may not have.
    fn validate_kind(&self) -> Result<(), String> {
        let name = &self.name;
        let scheduled = self.cron.is_some()
            || self.timezone.is_some()
            || self.concurrency != Concurrency::Forbid
            || self.catch_up != CatchUp::One;
        match self.kind {
            Kind::Webhook => {
                let signature = self.signature.as_ref().ok_or_else(|| {
                    format!("trigger {name}: a webhook needs a signature (scheme and secret): an unsigned payload would set an agent's task")
                })?;
                crate::runs::webhook::scheme(signature)
                    .map_err(|e| format!("trigger {name}: {e}"))?;
                if scheduled || self.token.is_some() {
                    return Err(format!(
                        "trigger {name}: cron, timezone, concurrency, catch_up and token are not for a webhook"
                    ));
                }
            }
            Kind::Schedule => {
                let cron = self
                    .cron
                    .as_deref()
                    .ok_or_else(|| format!("trigger {name}: a schedule needs cron"))?;
                crate::runs::schedule::Schedule::parse(cron, self.timezone.as_deref())
                    .map_err(|e| format!("trigger {name}: {e}"))?;
                if self.signature.is_some() || self.dedup.is_some() || self.token.is_some() {
                    return Err(format!(
                        "trigger {name}: signature, dedup and token are not for a schedule"
                    ));
                }
            }
            Kind::Api => {
                if self.signature.is_some() || scheduled {
                    return Err(format!(
                        "trigger {name}: signature, cron, timezone, concurrency and catch_up are not for an api trigger"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Every trigger's own checks, and names unique.
pub(super) fn validate(triggers: &[Trigger], profiles: &[String]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for t in triggers {
        if !seen.insert(t.name.as_str()) {
            return Err(format!("trigger {} is defined twice", t.name));
        }
        t.validate(profiles)?;
    }
    Ok(())
}
