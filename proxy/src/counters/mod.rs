//! Counters several replicas share (`state.redis`, docs/design.md §8): session budgets
//! (calls, cost, bytes), GCRA rate limits, spawn fan-out, pauses, the loop watchdog's trail
//! ([`trail`]), the news that a session was torn down, and what policies remember of a
//! session: its labels and recent tool calls ([`memory`]). Without `state.redis` all of it
//! lives in the process ([`crate::guardrails`]).
//!
//! Every check-and-charge is one server-side script ([`scripts`]), so replicas racing on a
//! session or a rate key cannot together pass a limit. Calls and cost are charged in Redis
//! before a call is forwarded; bytes are counted where they flow and added to Redis at the
//! session's next request (at most every [`SYNC_FRESH`], and every [`SYNC_EVERY`] for long
//! streams), so a byte budget shared by replicas can be passed by what the others move in
//! between, and a pause set on one replica reaches the others' gates within [`SYNC_FRESH`].
//!
//! Fail closed: when Redis cannot be reached, nothing whose limits live here is admitted
//! (`503 state_unavailable`, `component: "redis"`), `/readyz` fails and
//! `ostiary_state_available{component="redis"}` is 0, until Redis answers again. An account
//! that Redis lost (a restart of a Redis that keeps nothing on disk) is refused the same
//! way rather than restarted from zero.

pub mod accounts;
pub mod memory;
pub mod news;
pub mod scripts;
pub mod trail;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Script};

use crate::error::ProxyError;
use crate::metrics::Metrics;

/// How often a replica adds the bytes its open streams moved to the shared accounts.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// How long a session's shared figures (bytes, a pause set elsewhere) are taken as they were
/// at its last sync: its requests within this of the last one skip the gate's round trip. A
/// pause another replica set, or bytes the others moved, reach this replica's gate within it.
pub const SYNC_FRESH: Duration = Duration::from_millis(100);

/// How long one Redis call may take before the request it serves is refused.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(750);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(750);

/// Why a shared counter could not be read or charged.
#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    #[error("redis unreachable: {0}")]
    Unreachable(String),
    #[error("redis answered unexpectedly: {0}")]
    Protocol(String),
    /// The account of a live session is not in Redis: lost, not restarted from zero.
    #[error("the shared account of session {0} is gone (did Redis restart without its data?)")]
    AccountLost(String),
    #[error("state.redis {0:?}: {1}")]
    Config(String, String),
}

impl From<CountersError> for ProxyError {
    fn from(e: CountersError) -> Self {
        ProxyError::StateUnavailable {
            component: "redis",
            reason: e.to_string(),
        }
    }
}

/// The shared counters: one Redis, the scripts, and whether Redis answers.
pub struct Counters {
    client: redis::Client,
    conn: tokio::sync::OnceCell<ConnectionManager>,
    prefix: String,
    scripts: Scripts,
    health: Health,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("prefix", &self.prefix)
            .field("available", &self.health.ok.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

struct Scripts {
    open: Script,
    sync: Script,
    charge: Script,
    carve: Script,
    uncarve: Script,
    close: Script,
    grant: Script,
    pause: Script,
    trail: Script,
    gcra: Script,
    spawn: Script,
    unspawn: Script,
}

/// Whether Redis answered the last call, and why not; exported on `/metrics`.
struct Health {
    ok: AtomicBool,
    reason: Mutex<Option<String>>,
    available: Gauge,
    errors: Counter,
}

impl Health {
    fn observe<T>(&self, result: &Result<T, CountersError>) {
        match result {
            Ok(_) | Err(CountersError::AccountLost(_)) => {
                if !self.ok.swap(true, Ordering::AcqRel) {
                    tracing::info!("redis answers again: shared counters are back");
                }
                self.available.set(1);
            }
            Err(e) => {
                self.errors.inc();
                if self.ok.swap(false, Ordering::AcqRel) {
                    tracing::error!(error = %e, "redis unavailable: budgets and rate limits refuse until it is back");
                }
                self.available.set(0);
                if let Ok(mut reason) = self.reason.lock() {
                    *reason = Some(e.to_string());
                }
            }
        }
    }
}

/// What `/readyz` says of Redis.
#[derive(Debug, Clone)]
pub struct Status {
    pub ok: bool,
    pub reason: Option<String>,
}

impl Counters {
    /// Counters on the Redis at `url`, keys under `prefix`. Nothing is dialed yet: the first
    /// call connects, and a Redis down at start-up is a readiness failure, not a crash.
    pub fn new(url: &str, prefix: &str, metrics: &Metrics) -> Result<Self, CountersError> {
        let client = redis::Client::open(url)
            .map_err(|e| CountersError::Config(crate::stores::redacted(url), e.to_string()))?;
        let available = Gauge::default();
        let errors = Counter::default();
        metrics.register(
            "state_available",
            "Whether Redis, which holds the shared counters, answers (1) or not (0)",
            available.clone(),
        );
        metrics.register(
            "state_errors",
            "Redis calls that failed (the requests they served were refused)",
            errors.clone(),
        );
        available.set(1);
        Ok(Self {
            client,
            conn: tokio::sync::OnceCell::new(),
            prefix: prefix.to_owned(),
            scripts: Scripts {
                open: Script::new(scripts::OPEN),
                sync: Script::new(scripts::SYNC),
                charge: Script::new(scripts::CHARGE),
                carve: Script::new(scripts::CARVE),
                uncarve: Script::new(scripts::UNCARVE),
                close: Script::new(scripts::CLOSE),
                grant: Script::new(scripts::GRANT),
                pause: Script::new(scripts::PAUSE),
                trail: Script::new(trail::EXCHANGE),
                gcra: Script::new(scripts::GCRA),
                spawn: Script::new(scripts::SPAWN),
                unspawn: Script::new(scripts::UNSPAWN),
            },
            health: Health {
                ok: AtomicBool::new(true),
                reason: Mutex::new(None),
                available,
                errors,
            },
        })
    }

    /// Whether the last call reached Redis.
    pub fn status(&self) -> Status {
        Status {
            ok: self.health.ok.load(Ordering::Acquire),
            reason: self
                .health
                .reason
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// Ask Redis whether it answers (`/readyz`), and remember the answer.
    pub async fn ping(&self) -> Status {
        let result = async {
            let mut conn = self.conn().await?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map_err(classify)
        }
        .await;
        self.health.observe(&result);
        Status {
            ok: result.is_ok(),
            reason: result.err().map(|e| e.to_string()),
        }
    }

    async fn conn(&self) -> Result<ConnectionManager, CountersError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(RESPONSE_TIMEOUT)
            .set_number_of_retries(1);
        self.conn
            .get_or_try_init(|| async {
                self.client
                    .get_connection_manager_with_config(config)
                    .await
                    .map_err(classify)
            })
            .await
            .cloned()
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.prefix)
    }

    /// Run `script` on `keys` with `args`; the outcome feeds the health.
    async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<T, CountersError> {
        // Boxed: the Redis client's futures take ~4 KiB, and every phase that may touch the
        // shared counters (gate, rate, charge, remember, the watchdog) would otherwise carry
        // that much in every request's future, shared counters or not; a request's future
        // is copied whole when it is boxed (docs/benchmarks.md, "Smaller request futures").
        let result = Box::pin(async {
            let mut conn = self.conn().await?;
            let mut call = script.prepare_invoke();
            for key in keys {
                call.key(*key);
            }
            for arg in args {
                call.arg(arg);
            }
            call.invoke_async(&mut conn).await.map_err(classify)
        })
        .await;
        self.health.observe(&result);
        result
    }
}

fn classify(e: redis::RedisError) -> CountersError {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        CountersError::Unreachable(e.to_string())
    } else {
        CountersError::Protocol(e.to_string())
    }
}
