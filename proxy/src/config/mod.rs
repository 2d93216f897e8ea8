//! `ostiary.toml`: one serde tree, `deny_unknown_fields` everywhere, every field documented.
//!
//! The names are the contract of docs/design.md §8: fields may be added, none renamed. Sections
//! that later capabilities implement (`state.redis`)
//! are parsed and type-checked now so that a config written against the design loads, and
//! `ostiary serve` says at start-up which of them are not enforced yet.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

mod audit;
mod control;
pub mod sandbox;
mod sessions;
mod tiers;
pub mod triggers;

pub use audit::{Audit, Siem, SiemFormat};
pub use control::Control;
pub use sandbox::{Isolation, Profile, Sandbox};
pub use sessions::{Sessions, Watchdog, LIMIT_NAMES, PENDING_APPROVALS_CEILING};
pub use tiers::{tier_name, OnBudget, Rate, Tier, TierToml, Tiers, CHECK_NAMES};

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config: {0}")]
    Invalid(String),
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: Listen,
    pub state: State,
    pub policy: Policy,
    pub egress: Egress,
    pub sessions: Sessions,
    pub proxy: ProxyLimits,
    pub broker: Broker,
    /// Credential bindings: which secret goes to which hosts, injected how (docs/design.md §9).
    pub credential: Vec<ostiary_broker::Binding>,
    /// The approval queue (docs/design.md §10): who decides, through which channels, how long.
    pub approvals: Approvals,
    /// The checks each risk tier pays for, within a latency budget (docs/design.md §3, §8).
    pub tiers: Tiers,
    /// Settings of individual checks (the external `webhook`, extra DLP values).
    pub checks: Checks,
    /// The control API's own settings (who may read `/metrics`).
    pub control: Control,
    /// `ostiary run --sandbox`: isolation levels, limits and views, by profile.
    pub sandbox: Sandbox,
    /// The audit trail's signed checkpoints.
    pub audit: Audit,
    /// OpenTelemetry spans of the decisions (`crate::telemetry`).
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// What starts runs (`[[trigger]]`, docs/runs.md).
    pub trigger: Vec<triggers::Trigger>,
    /// How this process runs what triggers start.
    pub runs: Runs,
    /// The file this config was read from (`None`: the built-in defaults): the runs a
    /// trigger starts are `ostiary run` processes reading the same file.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[runs]`: how the runs triggers start are run here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Runs {
    /// Runs at once in this process (more wait, queued).
    pub concurrency: usize,
    /// Where each run's working directory (with its payload) is made, outside the state
    /// directory, which a sandbox never sees. Default: `ostiary-runs` in the system's
    /// temporary directory.
    pub dir: Option<PathBuf>,
    /// How long a run asked to stop (cancelled, replaced) has before it is killed.
    #[serde(deserialize_with = "duration")]
    pub stop_grace: std::time::Duration,
    /// The largest checkpoint a run may save (`PUT https://ostiary.internal/v1/checkpoint`).
    pub checkpoint_max_bytes: usize,
    /// How long this process's hold on its running runs lasts past each renewal (renewed
    /// six times within it): another replica takes over the runs of one that died after it.
    #[serde(deserialize_with = "duration")]
    pub lease: std::time::Duration,
    /// How long the checkpoint of a run that ended for good is kept (an operator's retry
    /// within it resumes from it); older ones are swept.
    #[serde(deserialize_with = "duration")]
    pub checkpoint_retention: std::time::Duration,
}

impl Default for Runs {
    fn default() -> Self {
        Self {
            concurrency: 4,
            dir: None,
            stop_grace: std::time::Duration::from_secs(5),
            checkpoint_max_bytes: 1 << 20,
            lease: std::time::Duration::from_secs(30),
            checkpoint_retention: std::time::Duration::from_secs(7 * 86_400),
        }
    }
}

impl Runs {
    /// Where run directories are made.
    pub fn dir(&self) -> PathBuf {
        self.dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("ostiary-runs"))
    }
}

/// Where the two listeners bind.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// What agents put in `HTTP_PROXY` / `HTTPS_PROXY`.
    pub proxy: SocketAddr,
    /// Sessions, audit, metrics; never reachable through the proxy.
    pub control: SocketAddr,
    /// A Unix socket the proxy also serves, the one way out of a sandbox
    /// (`ostiary run --sandbox` binds it into the sandbox). Default: `proxy.sock` in the
    /// state directory, whose `0700` keeps every other local user from reaching it.
    pub proxy_unix: Option<PathBuf>,
    /// A listener for webhook deliveries alone (`POST /v1/triggers/{name}`), so that what
    /// faces the senders is not the control API; unset: they arrive on `control`.
    pub triggers: Option<SocketAddr>,
    /// On shutdown (SIGTERM), how long connections in flight may finish after the
    /// listeners stopped accepting; then they are cut and the audit trail is flushed.
    #[serde(deserialize_with = "duration")]
    pub drain: std::time::Duration,
    /// How many threads serve the proxy's listeners (TCP and the Unix socket), each an event
    /// loop of its own that keeps the connections it took ([`crate::shards`]). Unset: one
    /// per core the process may use. `0`: the connections share the runtime's work-stealing
    /// workers instead.
    pub proxy_threads: Option<usize>,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            proxy: SocketAddr::from(([127, 0, 0, 1], 8080)),
            control: SocketAddr::from(([127, 0, 0, 1], 8081)),
            proxy_unix: None,
            triggers: None,
            drain: std::time::Duration::from_secs(5),
            proxy_threads: None,
        }
    }
}

/// More event loops than this would be threads that cannot all run: no machine this is
/// deployed on has that many cores.
const MAX_PROXY_THREADS: usize = 1024;

impl Listen {
    /// `proxy_threads`, or one per core the process may use (its CPU quota and affinity
    /// included, as [`std::thread::available_parallelism`] counts them).
    pub fn proxy_threads(&self) -> usize {
        self.proxy_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }
}

impl Config {
    /// The proxy's Unix socket: `listen.proxy_unix`, or `proxy.sock` in the state directory.
    pub fn proxy_unix_path(&self) -> PathBuf {
        self.listen
            .proxy_unix
            .clone()
            .unwrap_or_else(|| self.state.dir.join(crate::state::files::PROXY_SOCKET))
    }
}

/// Where Ostiary keeps its own state.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    /// CA key + cert, admin token, signing key, SQLite database.
    pub dir: PathBuf,
    /// `sqlite` (the database file in `dir`), or a `postgres://` URL ([`crate::stores`]).
    /// May carry a password: never printed as it is ([`State`]'s `Debug`).
    pub store: String,
    /// Redis for the counters several replicas share (budgets, rate limits, spawn
    /// fan-out) and for teardown across them ([`crate::counters`]); in memory when absent.
    pub redis: Option<String>,
    /// Where the keys every replica shares are read from (a mounted secret): the CA, the
    /// session signing key, the audit key, the approval-link key. When set, none is
    /// generated and a missing one stops start-up ([`crate::state::StateDir::open_shared`]).
    pub keys_dir: Option<PathBuf>,
    /// What every Redis key of this deployment starts with: replicas that share counters
    /// share it; deployments sharing one Redis keep apart by it.
    pub redis_prefix: String,
}

/// `state.store` from the environment, for containers: it may carry a password.
pub const STORE_ENV: &str = "OSTIARY_STATE_STORE";
/// `state.redis` from the environment.
pub const REDIS_ENV: &str = "OSTIARY_STATE_REDIS";

impl State {
    /// `OSTIARY_STATE_STORE` and `OSTIARY_STATE_REDIS` override the file: a container's
    /// secrets come from its environment, never from a config map. Empty means unset.
    pub fn from_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(store) = var(STORE_ENV).filter(|v| !v.is_empty()) {
            self.store = store;
        }
        if let Some(redis) = var(REDIS_ENV).filter(|v| !v.is_empty()) {
            self.redis = Some(redis);
        }
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("dir", &self.dir)
            .field("store", &crate::stores::redacted(&self.store))
            .field("redis", &self.redis.as_deref().map(crate::stores::redacted))
            .field("keys_dir", &self.keys_dir)
            .field("redis_prefix", &self.redis_prefix)
            .finish()
    }
}

impl Default for State {
    fn default() -> Self {
        Self {
            dir: PathBuf::from(".ostiary"),
            store: "sqlite".to_owned(),
            redis: None,
            keys_dir: None,
            redis_prefix: "ostiary".to_owned(),
        }
    }
}

/// Where policies live.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Directory of `*.cedar` files. When it is the default and does not exist, the copy
    /// embedded in the binary is used so that `ostiary serve` works from any directory.
    pub dir: PathBuf,
    /// How often the directory is polled for changes, which are then hot-reloaded; `0s`
    /// turns watching off (`SIGHUP` and `POST /v1/policy/reload` still reload).
    #[serde(deserialize_with = "duration")]
    pub watch_interval: Duration,
    /// A candidate set evaluated beside the enforced one, never enforced: every
    /// disagreement is an audit record of kind `shadow` (docs/policies.md).
    pub shadow_dir: Option<PathBuf>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            dir: PathBuf::from(DEFAULT_POLICY_DIR),
            watch_interval: Duration::from_secs(2),
            shadow_dir: None,
        }
    }
}

/// Where credentials come from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Broker {
    /// `file` or `vault`. With `vault`, Ostiary logs in to `[broker.vault]` at start-up;
    /// if Vault is unreachable, sealed or refuses the login, Ostiary serves anyway and
    /// retries in the background (Vault sources answer `credential_unavailable` meanwhile).
    /// `vault_*` sources need it; `file` sources work with either.
    pub backend: String,
    /// The file backend: `name = "value"` pairs. Relative paths are taken from the working
    /// directory; the file should be readable only by Ostiary.
    pub file: PathBuf,
    pub vault: Option<ostiary_broker::vault::VaultConfig>,
    /// How often expired leases are revoked and failed revocations retried.
    #[serde(deserialize_with = "duration")]
    pub reap_interval: Duration,
}

impl Default for Broker {
    fn default() -> Self {
        Self {
            backend: "file".to_owned(),
            file: PathBuf::from(".ostiary/secrets.toml"),
            vault: None,
            reap_interval: Duration::from_secs(5),
        }
    }
}

/// `[checks]`: settings of individual checks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Checks {
    /// The external check; tiers that list `webhook` skip it while this is absent.
    pub webhook: Option<WebhookCheck>,
}

/// `[checks.webhook]`: an external service (an LLM guard, a company's own rules) asked
/// about each action: `POST` of a JSON description, answered `{"decision": "allow" |
/// "deny" | "escalate", "reason": "..."}` within the tier's remaining budget.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookCheck {
    pub url: String,
    /// Environment variable holding a bearer token sent as `Authorization`, if the service
    /// wants one.
    #[serde(default)]
    pub token_env: Option<String>,
}

/// The approval queue: escalated requests wait here for a human (docs/design.md §10).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Approvals {
    /// Base of the links sent to approvers (Slack, email): the control listener as
    /// approvers' browsers reach it. Empty: `http://<listen.control>`.
    pub public_url: String,
    /// Without a decision after this long, approvers are notified again (and again after
    /// each further `ttl`); the approval stays pending.
    #[serde(deserialize_with = "duration")]
    pub ttl: Duration,
    /// Without a decision after this long, the approval becomes `approval_expired`.
    #[serde(deserialize_with = "duration")]
    pub deadline: Duration,
    /// Who may decide. Addresses with an `@` are also mailed when `smtp` is set. Empty: only
    /// holders of the admin token (CLI, control API) decide, under any name but the agent's.
    pub approvers: Vec<String>,
    /// Environment variable holding the Slack incoming-webhook URL; unset or empty: no Slack.
    pub slack_webhook_env: String,
    /// Environment variable holding the Slack app's signing secret, which verifies
    /// interactive callbacks at `POST /v1/slack/interactions`; unset: callbacks refused.
    pub slack_signing_secret_env: String,
    /// Slack user id → approver name (one of `approvers`): who a Slack button click is.
    pub slack_users: BTreeMap<String, String>,
    /// Whether Slack messages carry a "Review as <approver>" link button per approver:
    /// `"none"` (the default) or `"shared"`. A channel is shared, and a link is bound to one
    /// approver: anyone who reads the channel could follow it and decide as that approver.
    /// With `"none"` Slack carries only the interactive Approve/Deny buttons, whose clicks
    /// are bound to Slack identities (`slack_users`, verified callbacks); approvers get
    /// their own links by email.
    pub slack_links: SlackLinks,
    /// Notifications to one approver (one mailbox, the Slack channel) are rate-limited:
    /// the first goes out at once, and the ones that come due within this window after it
    /// are collected and sent as one digest when it ends. `0s`: every notification at once.
    #[serde(deserialize_with = "duration")]
    pub digest_window: Duration,
    /// Email over SMTP; absent: no email.
    pub smtp: Option<Smtp>,
    /// Largest request body held for approval; larger requests are refused (413).
    pub max_body_bytes: usize,
    /// Largest upstream response body kept for the agent; a longer one is cut and marked.
    pub max_response_bytes: usize,
    /// Longest `Prefer: wait=<s>` honoured.
    #[serde(deserialize_with = "duration")]
    pub max_wait: Duration,
    /// How often deadlines, re-notifications, executions and notification retries are
    /// looked at.
    #[serde(deserialize_with = "duration")]
    pub tick: Duration,
    /// First retry delay of a failed notification; doubles up to `retry_max`.
    #[serde(deserialize_with = "duration")]
    pub retry_initial: Duration,
    #[serde(deserialize_with = "duration")]
    pub retry_max: Duration,
    /// How long an execution's claim holds without its executor renewing it: past that,
    /// the executor is taken for dead (a replica killed mid-execution) and another replica
    /// sends the request again, with the same idempotency key. Renewed every third of it.
    #[serde(deserialize_with = "duration")]
    pub claim_lease: Duration,
}

impl Default for Approvals {
    fn default() -> Self {
        Self {
            public_url: String::new(),
            ttl: Duration::from_secs(15 * 60),
            deadline: Duration::from_secs(24 * 3600),
            approvers: Vec::new(),
            slack_webhook_env: "OSTIARY_SLACK_WEBHOOK".to_owned(),
            slack_signing_secret_env: "OSTIARY_SLACK_SIGNING_SECRET".to_owned(),
            slack_users: BTreeMap::new(),
            slack_links: SlackLinks::None,
            digest_window: Duration::from_secs(60),
            smtp: None,
            max_body_bytes: 1024 * 1024,
            max_response_bytes: 1024 * 1024,
            max_wait: Duration::from_secs(60),
            tick: Duration::from_secs(1),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            claim_lease: Duration::from_secs(30),
        }
    }
}

/// `approvals.slack_links`: whether approver-bound review links go to the Slack channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlackLinks {
    /// No approver-bound link in Slack: the channel cannot be used to act as an approver.
    #[default]
    None,
    /// One "Review as <approver>" button per approver: only for a channel that nobody but
    /// the approvers reads.
    Shared,
}

impl<'de> Deserialize<'de> for SlackLinks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `true`/`false` were this field's type before; they stay accepted as the explicit
        // choice they are.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(false) => Ok(Self::None),
            Raw::Flag(true) => Ok(Self::Shared),
            Raw::Name(name) => match name.as_str() {
                "none" => Ok(Self::None),
                "shared" => Ok(Self::Shared),
                other => Err(serde::de::Error::custom(format!(
                    "slack_links = {other:?}: \"none\" or \"shared\""
                ))),
            },
        }
    }
}

/// An SMTP relay for approval mail.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Smtp {
    /// `smtp://host:port` (plain; `?tls=required` for STARTTLS) or `smtps://host:port`
    /// (implicit TLS), as lettre reads it.
    pub url: String,
    /// The sender address.
    pub from: String,
    /// Environment variables holding the login, when the relay wants one.
    #[serde(default)]
    pub username_env: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
}

/// The default policy directory (relative to the working directory).
pub const DEFAULT_POLICY_DIR: &str = "policies/library";

/// The egress guard.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Egress {
    /// Ports CONNECT (and plain http) may reach unless a `connect` policy permits more.
    pub ports: Vec<u16>,
    /// CIDRs of private/loopback space that may be reached. Never the proxy's own listeners.
    pub allow_private: Vec<ipnet::IpNet>,
    /// Static name → IP map, like curl's `--resolve`.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Extra roots trusted for upstream TLS (PEM file); empty for none.
    pub ca_file: PathBuf,
    /// Hosts relayed without interception, decided as `Action::"connect"`.
    pub tunnel: Vec<String>,
}

impl Default for Egress {
    fn default() -> Self {
        Self {
            ports: vec![80, 443],
            allow_private: Vec::new(),
            resolve: BTreeMap::new(),
            ca_file: PathBuf::new(),
            tunnel: Vec::new(),
        }
    }
}

/// Connection-level limits of the proxy listener (added by Ostiary; not in docs/design.md §8).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyLimits {
    /// A request head must arrive within this time (slowloris).
    #[serde(deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// Largest request head accepted; larger ones get 431.
    pub max_header_bytes: usize,
    /// Dialing an upstream gives up after this long (504).
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// Waiting for an upstream's response head gives up after this long (504).
    #[serde(deserialize_with = "duration")]
    pub upstream_timeout: Duration,
    /// An uninspected tunnel with no traffic either way is closed after this long.
    #[serde(deserialize_with = "duration")]
    pub tunnel_idle_timeout: Duration,
    /// A TLS handshake with the agent must finish within this time.
    #[serde(deserialize_with = "duration")]
    pub tls_handshake_timeout: Duration,
    /// Largest request body of a recognised tool call. Tool calls are buffered whole so
    /// their arguments can be read before the decision; larger ones are refused (400
    /// `body_too_large`). So are plain POSTs to hosts that serve tools, read for a `_method`
    /// override (form and JSON bodies; untyped and multipart ones are watched as they
    /// stream instead). Bodies of other requests stream and are not bounded by this.
    pub max_tool_body_bytes: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            connect_timeout: Duration::from_secs(10),
            upstream_timeout: Duration::from_secs(60),
            tunnel_idle_timeout: Duration::from_secs(300),
            tls_handshake_timeout: Duration::from_secs(10),
            max_tool_body_bytes: 1024 * 1024,
        }
    }
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(serde::de::Error::custom)
}

impl Config {
    /// Parse a config from TOML text; `path` is only used in messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        config.state.from_env(|name| std::env::var(name).ok());
        config.validate()?;
        Ok(config)
    }

    /// Read and parse a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::from_toml(&text, path)?;
        config.source = Some(path.to_owned());
        Ok(config)
    }

    /// Checks that serde cannot express.
    fn validate(&self) -> Result<(), ConfigError> {
        crate::stores::Backend::of(&self.state).map_err(ConfigError::Invalid)?;
        if self.egress.ports.contains(&0) {
            return Err(ConfigError::Invalid("egress.ports contains 0".into()));
        }
        self.sessions.validate().map_err(ConfigError::Invalid)?;
        self.sandbox.validate().map_err(ConfigError::Invalid)?;
        self.audit.validate().map_err(ConfigError::Invalid)?;
        self.telemetry.validate().map_err(ConfigError::Invalid)?;
        triggers::validate(&self.trigger, &self.sandbox.profile_names())
            .map_err(ConfigError::Invalid)?;
        if self.runs.concurrency == 0 {
            return Err(ConfigError::Invalid(
                "runs.concurrency must be at least 1".into(),
            ));
        }
        if self.runs.lease < std::time::Duration::from_secs(1) {
            return Err(ConfigError::Invalid(
                "runs.lease must be at least 1s".into(),
            ));
        }
        // Shorter, a run that just failed could lose its checkpoint before anyone retries it.
        if self.runs.checkpoint_retention < std::time::Duration::from_secs(60) {
            return Err(ConfigError::Invalid(
                "runs.checkpoint_retention must be at least 1m".into(),
            ));
        }
        if self.sessions.default_ttl > self.sessions.max_ttl {
            return Err(ConfigError::Invalid(
                "sessions.default_ttl exceeds sessions.max_ttl".into(),
            ));
        }
        for limit in &self.sessions.escalate_limits {
            if !LIMIT_NAMES.contains(&limit.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "sessions.escalate_limits: unknown limit {limit:?} ({})",
                    LIMIT_NAMES.join(", ")
                )));
            }
        }
        if self.sessions.max_cost < 0.0 || !self.sessions.max_cost.is_finite() {
            return Err(ConfigError::Invalid(
                "sessions.max_cost must be a finite number ≥ 0".into(),
            ));
        }
        if self
            .listen
            .proxy_threads
            .is_some_and(|n| n > MAX_PROXY_THREADS)
        {
            return Err(ConfigError::Invalid(format!(
                "listen.proxy_threads must be at most {MAX_PROXY_THREADS} (0: the runtime's workers)"
            )));
        }
        if self.proxy.max_header_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "proxy.max_header_bytes must be at least 1024".into(),
            ));
        }
        match self.broker.backend.as_str() {
            "file" => {}
            "vault" if self.broker.vault.is_some() => {}
            "vault" => {
                return Err(ConfigError::Invalid(
                    "broker.backend = \"vault\" needs a [broker.vault] section".into(),
                ))
            }
            other => {
                return Err(ConfigError::Invalid(format!(
                    "broker.backend = {other:?}: \"file\" or \"vault\""
                )))
            }
        }
        self.validate_approvals()?;
        for (name, tier) in [
            ("read", &self.tiers.read),
            ("write", &self.tiers.write),
            ("irreversible", &self.tiers.irreversible),
            ("high_impact", &self.tiers.high_impact),
        ] {
            for check in &tier.checks {
                if !CHECK_NAMES.contains(&check.as_str()) {
                    return Err(ConfigError::Invalid(format!(
                        "tiers.{name}.checks: unknown check {check:?} (known: {})",
                        CHECK_NAMES.join(", ")
                    )));
                }
            }
        }
        self.validate_credentials()
    }

    fn validate_approvals(&self) -> Result<(), ConfigError> {
        if self.approvals.deadline < self.approvals.ttl {
            return Err(ConfigError::Invalid(
                "approvals.deadline is shorter than approvals.ttl".into(),
            ));
        }
        if self.approvals.tick.is_zero() {
            return Err(ConfigError::Invalid(
                "approvals.tick must be positive".into(),
            ));
        }
        for (user, approver) in &self.approvals.slack_users {
            if !self.approvals.approvers.contains(approver) {
                return Err(ConfigError::Invalid(format!(
                    "approvals.slack_users: {user} maps to {approver:?}, which is not in approvals.approvers"
                )));
            }
        }
        Ok(())
    }

    /// Each binding on its own, then across them: names and placeholder variables unique,
    /// Vault sources only with the Vault backend.
    fn validate_credentials(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        let mut envs = std::collections::HashSet::new();
        for binding in &self.credential {
            binding
                .validate()
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
            if !names.insert(binding.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "credential {:?} is defined twice",
                    binding.name
                )));
            }
            if let Some(env) = binding.env_var() {
                if !envs.insert(env.clone()) {
                    return Err(ConfigError::Invalid(format!(
                        "credential {:?}: placeholder variable {env} is used twice",
                        binding.name
                    )));
                }
            }
            if binding.source.needs_vault() && self.broker.backend != "vault" {
                return Err(ConfigError::Invalid(format!(
                    "credential {:?} uses a {} source: set broker.backend = \"vault\" and [broker.vault]",
                    binding.name,
                    binding.source.kind()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_the_default() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        assert_eq!(c.listen.proxy, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.listen.control, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(c.egress.ports, vec![80, 443]);
        assert_eq!(c.sessions.default_ttl, Duration::from_secs(3600));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e =
            Config::from_toml("[listen]\nproxi = \"127.0.0.1:1\"\n", Path::new("t")).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn durations_parse() {
        let c = Config::from_toml("[sessions]\ndefault_ttl = \"15m\"\n", Path::new("t")).unwrap();
        assert_eq!(c.sessions.default_ttl, Duration::from_secs(900));
        assert!(Config::from_toml("[sessions]\ndefault_ttl = \"soon\"\n", Path::new("t")).is_err());
    }

    #[test]
    fn checkpoints_are_kept_a_week_unless_told_and_never_under_a_minute() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        assert_eq!(c.runs.checkpoint_retention, Duration::from_secs(7 * 86_400));
        let c =
            Config::from_toml("[runs]\ncheckpoint_retention = \"36h\"\n", Path::new("t")).unwrap();
        assert_eq!(c.runs.checkpoint_retention, Duration::from_secs(36 * 3600));
        let e = Config::from_toml("[runs]\ncheckpoint_retention = \"0s\"\n", Path::new("t"))
            .unwrap_err();
        assert!(e.to_string().contains("checkpoint_retention"), "{e}");
    }

    #[test]
    fn proxy_threads_default_to_the_cores_and_are_bounded() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(c.listen.proxy_threads(), cores);
        let c = Config::from_toml("[listen]\nproxy_threads = 0\n", Path::new("t")).unwrap();
        assert_eq!(c.listen.proxy_threads(), 0);
        let c = Config::from_toml("[listen]\nproxy_threads = 1024\n", Path::new("t")).unwrap();
        assert_eq!(c.listen.proxy_threads(), 1024);
        let e = Config::from_toml("[listen]\nproxy_threads = 1025\n", Path::new("t")).unwrap_err();
        assert!(e.to_string().contains("listen.proxy_threads"), "{e}");
        for bad in ["-1", "\"two\"", "1.5"] {
            let text = format!("[listen]\nproxy_threads = {bad}\n");
            let e = Config::from_toml(&text, Path::new("t")).unwrap_err();
            assert!(e.to_string().contains("proxy_threads"), "{bad}: {e}");
        }
    }
}
