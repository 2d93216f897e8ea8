//! Session guardrails (docs/design.md §5, §6): every session is bounded by the proxy, not by luck.
//!
//! - [`meter`] — budgets: tool calls, cost, bytes; children carved out of their parent.
//! - [`rate`] — GCRA rate limits per agent and per tenant, per tier.
//! - [`inflight`] — requests in flight, so teardown can drain them within a grace period.
//! - [`store`] — accounts, pauses, dead letters and `Idempotency-Key` outcomes on disk
//!   (the guard aggregate of `ostiary-store`).
//! - the loop watchdog ([`crate::session::watchdog`]) pauses a session that repeats itself;
//!   a human resumes or terminates it.
//!
//! The pipeline asks in this order: the session's gate (paused → `423`, bytes spent →
//! `429`) right after authentication; the rate limits once the request's tier is known;
//! the call budget after policy and checks allowed the call, so a refused call costs
//! nothing. Limits hold regardless of policy; policy sees usage as `context.session`.

pub mod counted;
pub mod idempotency;
pub mod inflight;
pub mod meter;
pub mod pause;
pub mod rate;
pub mod sharded;
/// The guardrails' store: the guard aggregate of `ostiary-store`.
pub use ostiary_store::guard as store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ostiary_policies::SessionState;

use crate::config::{Sessions, Tiers};
use crate::error::ProxyError;
use crate::session::watchdog::{self, Watchdog};
use crate::session::Principal;
use crate::store::Call;
use meter::{Account, LimitHit, Limits, Meter};
use rate::RateLimiter;
use store::{GuardStore, Paused};

/// The guardrails of every session.
#[derive(Debug)]
pub struct Guardrails {
    pub meter: Arc<Meter>,
    pub rate: RateLimiter,
    pub inflight: Arc<inflight::InFlight>,
    pub watchdog: Watchdog,
    pub store: Arc<dyn GuardStore>,
    paused: sharded::Sharded<Paused>,
    /// Sessions paused now: when none is (nearly always), the gate does not look further.
    paused_count: std::sync::atomic::AtomicUsize,
    settings: Sessions,
}

impl Guardrails {
    /// Load what a previous run left (accounts, pauses) from `store`.
    pub fn load(
        store: Arc<dyn GuardStore>,
        settings: Sessions,
    ) -> Result<Self, crate::store::StoreError> {
        let meter = Arc::new(Meter::default());
        for (session, account) in store.load_accounts()? {
            // An account a newer or broken version wrote is not guessed at: the session
            // starts from its limits again, which the log says.
            match serde_json::from_value::<Account>(account) {
                Ok(account) => meter.open(&session, account),
                Err(e) => {
                    tracing::warn!(session, error = %e, "a stored session account does not parse; not restored")
                }
            }
        }
        let paused = sharded::Sharded::default();
        let mut n = 0;
        for (session, pause) in store.pauses()? {
            paused.insert(&session, pause);
            n += 1;
        }
        // `enabled = false` is honoured where events are fed (`pause::observe`).
        let w = &settings.watchdog;
        let watchdog = Watchdog::new(watchdog::WatchdogSettings {
            cycle_repeats: w.cycle_repeats,
            denials: w.denials,
            denial_window: w.denial_window,
            baseline_calls: w.baseline_calls,
            tier_jumps: w.tier_jumps,
            tier_jump_window: w.tier_jump_window,
            holds: w.holds,
            hold_window: w.hold_window,
        });
        Ok(Self {
            meter,
            rate: RateLimiter::default(),
            inflight: Arc::default(),
            watchdog,
            store,
            paused,
            paused_count: std::sync::atomic::AtomicUsize::new(n),
            settings,
        })
    }

    pub fn settings(&self) -> &Sessions {
        &self.settings
    }

    /// The limits a session gets when its creator names none (`0` in config: none).
    pub fn default_limits(&self) -> Limits {
        let s = &self.settings;
        Limits {
            max_calls: (s.max_calls > 0).then_some(s.max_calls),
            max_cost_micros: (s.max_cost > 0.0)
                .then(|| ostiary_policies::catalog::cost_to_micros(s.max_cost)),
            max_bytes_sent: (s.max_bytes_sent > 0).then_some(s.max_bytes_sent),
            max_bytes_received: (s.max_bytes_received > 0).then_some(s.max_bytes_received),
        }
    }

    /// Open a new session's account.
    pub fn open(&self, session: &str, limits: Limits, parent: Option<String>) {
        self.meter.open(
            session,
            Account {
                limits,
                parent,
                ..Default::default()
            },
        );
    }

    /// The session's gate, first thing after authentication: a paused session is refused
    /// everything, and so is one that sent or received all the bytes it may.
    pub fn gate(&self, principal: &Principal) -> Result<(), ProxyError> {
        if let Some(paused) = self.paused(&principal.session_id) {
            return Err(ProxyError::SessionPaused {
                reason: paused.reason,
            });
        }
        self.meter
            .check_bytes(&principal.session_id)
            .map_err(limit_exceeded)
    }

    /// The rate limits of `tier` for the principal's agent and tenant.
    pub fn admit_rate(
        &self,
        principal: &Principal,
        tier: &'static str,
        tiers: &Tiers,
    ) -> Result<(), ProxyError> {
        let Some(settings) = tiers.get(tier) else {
            return Ok(());
        };
        let now = Instant::now();
        for (scope, rate) in [
            ("agent", settings.rate_agent),
            ("tenant", settings.rate_tenant),
        ] {
            let Some(rate) = rate else { continue };
            // Built only for a tier with a rate: most requests pay nothing here.
            let name = match scope {
                "agent" => format!("{}/{}", principal.tenant, principal.agent),
                _ => principal.tenant.clone(),
            };
            let key = rate::Key { scope, name, tier };
            if let Err(wait) = self.rate.admit(key, &rate, now) {
                return Err(limit_exceeded(Box::new(LimitHit {
                    limit: format!("rate:{scope}"),
                    // The window is full: as many as the burst allows, of as many.
                    used: serde_json::json!(rate.burst),
                    max: serde_json::json!(rate.burst),
                    // Rounded up: a client retrying after `Retry-After` must get through.
                    retry_after: Some(wait.as_millis().div_ceil(1000).max(1) as u64),
                })));
            }
        }
        Ok(())
    }

    /// `context.session` for Cedar: what the session has used before this request, and
    /// where it sits in the spawn tree.
    pub fn session_state(&self, principal: &Principal) -> SessionState {
        let usage = self.meter.usage(&principal.session_id).unwrap_or_default();
        SessionState {
            calls: i64::try_from(usage.calls).unwrap_or(i64::MAX),
            cost_micros: usage.cost_micros,
            depth: i64::from(principal.depth),
            parent_agent: principal.parent_agent.clone().unwrap_or_default(),
            profile: principal.profile.clone().unwrap_or_default(),
        }
    }

    /// The session's pause, if it is paused.
    pub fn paused(&self, session: &str) -> Option<Paused> {
        if self.paused_count.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return None;
        }
        self.paused.get(session)
    }

    /// Mark a session paused in memory (after [`GuardStore::pause`] stored it).
    pub fn set_paused(&self, session: &str, paused: Paused) {
        if self.paused.get(session).is_none() {
            self.paused_count
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.paused.insert(session, paused);
    }

    /// Lift a pause in memory; the watchdog starts counting afresh.
    pub fn clear_paused(&self, session: &str) -> bool {
        self.watchdog.reset(session);
        let removed = self.paused.remove(session).is_some();
        if removed {
            self.paused_count
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        removed
    }

    /// Persist every account (the reaper's tick).
    pub async fn save(&self) {
        let accounts = self.meter.all();
        if accounts.is_empty() {
            return;
        }
        let accounts: Vec<(String, serde_json::Value)> = accounts
            .into_iter()
            .map(|(session, account)| (session, serde_json::to_value(account).unwrap_or_default()))
            .collect();
        let now = crate::store::now_ms();
        if let Err(e) = self
            .store
            .call(move |s| s.save_accounts(&accounts, now))
            .await
        {
            tracing::error!(error = %e, "saving session accounts failed");
        }
    }

    /// A session ended: close its account (its totals are returned for the audit record),
    /// forget its watchdog trail and its idempotency keys.
    pub async fn close(&self, session: &str) -> Option<Account> {
        let account = self.meter.close(session);
        self.watchdog.forget(session);
        let owned = session.to_owned();
        let result = self
            .store
            .call(move |s| {
                s.forget_account(&owned)?;
                s.idempotency_forget(&owned)
            })
            .await;
        if let Err(e) = result {
            tracing::error!(session, error = %e, "forgetting a session's guardrail state failed");
        }
        account
    }

    /// How long teardown lets requests finish.
    pub fn grace(&self) -> Duration {
        self.settings.grace
    }
}

/// A limit reached, as the refusal the agent gets.
pub fn limit_exceeded(hit: Box<LimitHit>) -> ProxyError {
    ProxyError::LimitExceeded(hit)
}
