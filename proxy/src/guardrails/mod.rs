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
//!
//! With `state.redis` the budgets, rate limits, spawn counts and pauses are counted in
//! Redis ([`crate::counters`]), shared by every replica; the meter here is then this
//! replica's mirror of the shared accounts (for `context.session` and for byte streams),
//! refreshed by each request's gate. Redis unreachable: every such check refuses (503).

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
use crate::counters::trail::TrailEvent;
use crate::counters::Counters;
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
    /// The counters replicas share (`state.redis`); `None`: this process counts alone.
    pub shared: Option<Arc<Counters>>,
    /// Per session, the last shared-trail event this replica fed its watchdog; held across
    /// an exchange, so that concurrent requests of a session never feed an event twice.
    cursors: sharded::Sharded<Arc<tokio::sync::Mutex<String>>>,
}

impl Guardrails {
    /// Load what a previous run left (accounts, pauses) from `store`.
    pub fn load(
        store: Arc<dyn GuardStore>,
        settings: Sessions,
        shared: Option<Arc<Counters>>,
    ) -> Result<Self, crate::store::StoreError> {
        let meter = Arc::new(Meter::default());
        // Shared accounts are in Redis; what the store kept of a single process's does not
        // apply to them.
        let accounts = match shared {
            Some(_) => Vec::new(),
            None => store.load_accounts()?,
        };
        for (session, account) in accounts {
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
            shared,
            cursors: sharded::Sharded::default(),
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

    /// Open a new session's account, to live until `expires_at` (seconds since the epoch).
    pub async fn open(
        &self,
        session: &str,
        limits: Limits,
        parent: Option<String>,
        expires_at: i64,
    ) -> Result<(), ProxyError> {
        if let Some(shared) = &self.shared {
            // A day past its end: long enough for teardown, short enough to be forgotten.
            let left = expires_at.saturating_mul(1000) - crate::store::now_ms();
            let ttl = Duration::from_millis(u64::try_from(left).unwrap_or(0))
                + Duration::from_secs(24 * 3600);
            shared
                .open(session, &limits, parent.as_deref(), ttl)
                .await?;
        }
        self.meter.open(
            session,
            Account {
                limits,
                parent,
                ..Default::default()
            },
        );
        Ok(())
    }

    /// Carve a child's limits out of `parent`'s remaining budget (see [`Meter::carve`]).
    pub async fn carve(
        &self,
        parent: &str,
        asked: Limits,
    ) -> Result<Result<Limits, Box<LimitHit>>, ProxyError> {
        match &self.shared {
            Some(shared) => Ok(shared.carve(parent, asked).await?),
            None => Ok(self.meter.carve(parent, asked)),
        }
    }

    /// Give back a carve whose child was never created.
    pub async fn uncarve(&self, parent: &str, child: &Limits) {
        match &self.shared {
            Some(shared) => {
                if let Err(e) = shared.uncarve(parent, child).await {
                    tracing::error!(parent, error = %e, "giving back a child's carve failed");
                }
            }
            None => self.meter.uncarve(parent, child),
        }
    }

    /// Count one more child of `parent` against `max` across replicas (`state.redis`; the
    /// registry's own count of live children bounds one process). `Err` with the count.
    pub async fn reserve_child(
        &self,
        parent: &Principal,
        max: u32,
    ) -> Result<Result<(), u64>, ProxyError> {
        let Some(shared) = &self.shared else {
            return Ok(Ok(()));
        };
        let left = parent.expires_at.saturating_mul(1000) - crate::store::now_ms();
        let ttl = Duration::from_millis(u64::try_from(left).unwrap_or(0))
            + Duration::from_secs(24 * 3600);
        Ok(shared.spawn(&parent.session_id, max, ttl).await?)
    }

    /// Give back a child count whose child was never created.
    pub async fn release_child(&self, parent: &str) {
        if let Some(shared) = &self.shared {
            if let Err(e) = shared.unspawn(parent).await {
                tracing::error!(parent, error = %e, "giving back a child count failed");
            }
        }
    }

    /// The session's gate, first thing after authentication: a paused session is refused
    /// everything, and so is one that sent or received all the bytes it may. With shared
    /// counters this replica's bytes are added to the shared accounts here, and what the
    /// others counted (and a pause another replica set) comes back — at most every
    /// [`crate::counters::SYNC_FRESH`] per session, so a busy session does not pay a round
    /// trip per request for figures that only bound bytes (calls and cost are charged in
    /// Redis itself, exactly).
    pub async fn gate(&self, principal: &Principal) -> Result<(), ProxyError> {
        let session = &principal.session_id;
        if let Some(shared) = &self.shared {
            if !self
                .meter
                .synced_within(session, crate::counters::SYNC_FRESH)
            {
                self.sync(shared, session).await?;
            }
        }
        if let Some(paused) = self.paused(session) {
            return Err(ProxyError::SessionPaused {
                reason: paused.reason,
            });
        }
        self.meter.check_bytes(session).map_err(limit_exceeded)
    }

    /// Add this replica's unsynced bytes of `session` to Redis and mirror what it holds.
    async fn sync(&self, shared: &Counters, session: &str) -> Result<(), ProxyError> {
        let bytes = self.meter.take_unsynced(session);
        let synced = match shared.sync(session, bytes.0, bytes.1).await {
            Ok(synced) => synced,
            Err(e) => {
                self.meter.return_unsynced(session, bytes);
                return Err(e.into());
            }
        };
        self.meter.mirror(synced.accounts);
        // Redis holds the pause every replica honours; this replica's copy follows it.
        match synced.pause {
            Some(pause) => self.mark_paused(session, pause),
            None => {
                self.unmark_paused(session);
            }
        }
        Ok(())
    }

    /// Add the bytes long streams moved to the shared accounts ([`crate::counters::SYNC_EVERY`]).
    pub async fn sync_streams(&self) {
        let Some(shared) = &self.shared else { return };
        for session in self.meter.unsynced_sessions() {
            if let Err(e) = self.sync(shared, &session).await {
                tracing::warn!(session, error = %e, "adding streamed bytes to the shared account failed; retried");
                return;
            }
        }
    }

    /// Charge one tool call costing `cost_micros`, unless it would pass a limit (the inner
    /// `Err`, which may ask for a human); the outer `Err` when the counters cannot be reached.
    pub async fn charge_call(
        &self,
        session: &str,
        cost_micros: i64,
    ) -> Result<Result<(), Box<LimitHit>>, ProxyError> {
        Ok(match &self.shared {
            Some(shared) => shared
                .charge(session, cost_micros, true)
                .await?
                .map(|usage| self.meter.mirror_calls(session, usage)),
            None => self.meter.charge_call(session, cost_micros).map(drop),
        })
    }

    /// Charge a call a human approved (it runs whatever the budget says), after granting
    /// the limits the approval raised.
    pub async fn charge_approved(
        &self,
        session: &str,
        cost_micros: i64,
        grants: &[String],
    ) -> Result<(), ProxyError> {
        match &self.shared {
            Some(shared) => {
                for limit in grants {
                    shared.grant(session, limit).await?;
                }
                if let Ok(usage) = shared.charge(session, cost_micros, false).await? {
                    self.meter.mirror_calls(session, usage);
                }
            }
            None => {
                for limit in grants {
                    self.meter.grant(session, limit);
                }
                self.meter.charge_approved(session, cost_micros);
            }
        }
        Ok(())
    }

    /// The rate limits of `tier` for the principal's agent and tenant.
    pub async fn admit_rate(
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
            let admitted = match &self.shared {
                Some(shared) => {
                    shared
                        .admit_rate(&format!("{scope}:{tier}:{name}"), &rate)
                        .await?
                }
                None => self.rate.admit(rate::Key { scope, name, tier }, &rate, now),
            };
            if let Err(wait) = admitted {
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
            // Filled by the decision that reads them (`session::memory`): they need a
            // look-up this function does not make.
            ..SessionState::default()
        }
    }

    /// Feed the loop watchdog what one request did; the first trip among its own events. With
    /// shared counters every replica's events of the session go through the shared trail
    /// ([`crate::counters::trail`]) first, in the order Redis took them, so a loop spread
    /// over replicas is seen whole; only this request's own events can trip here (the
    /// others' were judged where they happened).
    pub async fn watch(&self, session: &str, events: Vec<TrailEvent>) -> Option<watchdog::Trip> {
        let now = Instant::now();
        let now_ms = crate::store::now_ms();
        // This replica's events alone, as a single process watches them.
        let here = |events: &[TrailEvent]| {
            events
                .iter()
                .find_map(|e| self.watchdog.observe(session, event_of(e, now, now_ms)))
        };
        let Some(shared) = &self.shared else {
            return here(&events);
        };
        let cursor = self.cursor(session);
        let mut cursor = cursor.lock().await;
        let exchanged = match shared
            .exchange_trail(session, &cursor, &events, TRAIL_TTL)
            .await
        {
            Ok(exchanged) => exchanged,
            Err(e) => {
                // Judged here alone rather than not at all.
                tracing::warn!(session, error = %e, "the shared watchdog trail is unavailable; watching this replica's calls only");
                return here(&events);
            }
        };
        cursor.clone_from(&exchanged.cursor);
        let mut trip = None;
        for (event, own) in &exchanged.events {
            if event.reset {
                self.watchdog.reset(session);
                continue;
            }
            let tripped = self.watchdog.observe(session, event_of(event, now, now_ms));
            if *own && trip.is_none() {
                trip = tripped;
            }
        }
        drop(cursor);
        if trip.is_some() {
            // Every replica starts over from here, as this one's watchdog does after a trip.
            self.reset_shared_trail(shared, session, now_ms).await;
        }
        trip
    }

    fn cursor(&self, session: &str) -> Arc<tokio::sync::Mutex<String>> {
        self.cursors
            .get_or_insert_with(session, || Arc::new(tokio::sync::Mutex::new("0-0".into())))
    }

    /// Append a reset marker to `session`'s shared trail (read back, and honoured, at the
    /// next exchange like any event).
    async fn reset_shared_trail(&self, shared: &Counters, session: &str, now_ms: i64) {
        // Nothing is read back here: the marker is fed at the next exchange, like any event.
        let cursor = "";
        let marker = [TrailEvent::reset(now_ms)];
        if let Err(e) = shared
            .exchange_trail(session, cursor, &marker, TRAIL_TTL)
            .await
        {
            tracing::warn!(session, error = %e, "resetting the shared watchdog trail failed");
        }
    }

    /// The session's pause, if it is paused.
    pub fn paused(&self, session: &str) -> Option<Paused> {
        if self.paused_count.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return None;
        }
        self.paused.get(session)
    }

    /// Mark a session paused (after [`GuardStore::pause`] stored it, or before, to refuse
    /// its next request at once): for every replica first when they share counters.
    pub async fn set_paused(&self, session: &str, paused: Paused) {
        if let Some(shared) = &self.shared {
            if let Err(e) = shared.set_pause(session, Some(&paused)).await {
                // This replica refuses it still; the others learn at the backstop's pace.
                tracing::error!(session, error = %e, "sharing a pause failed");
            }
        }
        self.mark_paused(session, paused);
    }

    /// Complete a pause already in place with what persisting it added (its dead letter),
    /// unless it was lifted meanwhile — here, or with shared counters on any replica (then it
    /// is lifted here too). Whether the session is still paused. A shared store that cannot
    /// be reached keeps the pause (fail closed).
    pub async fn refresh_paused(&self, session: &str, paused: Paused) -> bool {
        if self.paused.get(session).is_none() {
            return false;
        }
        if let Some(shared) = &self.shared {
            match shared.refresh_pause(session, &paused).await {
                Ok(true) => {}
                Ok(false) => {
                    self.forget_pause(session);
                    return false;
                }
                Err(e) => tracing::error!(session, error = %e, "sharing a pause failed"),
            }
        }
        self.mark_paused(session, paused);
        true
    }

    fn mark_paused(&self, session: &str, paused: Paused) {
        if self.paused.get(session).is_none() {
            self.paused_count
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.paused.insert(session, paused);
    }

    /// Lift a pause (everywhere, with shared counters); the watchdog starts counting afresh.
    pub async fn clear_paused(&self, session: &str) -> bool {
        if let Some(shared) = &self.shared {
            if let Err(e) = shared.set_pause(session, None).await {
                tracing::error!(session, error = %e, "lifting a shared pause failed");
            }
            self.reset_shared_trail(shared, session, crate::store::now_ms())
                .await;
        }
        self.forget_pause(session)
    }

    /// This replica's side of a lifted pause: the watchdog counts afresh, the gate lets the
    /// session through. Whether it was paused here.
    fn forget_pause(&self, session: &str) -> bool {
        self.watchdog.reset(session);
        self.unmark_paused(session)
    }

    fn unmark_paused(&self, session: &str) -> bool {
        let removed = self.paused.remove(session).is_some();
        if removed {
            self.paused_count
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        removed
    }

    /// Persist every account (the reaper's tick).
    pub async fn save(&self) {
        if self.shared.is_some() {
            // Shared accounts live in Redis; the mirror here is not the truth to keep.
            return;
        }
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
        let mut account = self.meter.close(session);
        self.cursors.remove(session);
        if let Some(shared) = &self.shared {
            // Once across replicas: the first to close gets the totals and returns the carve.
            match shared.close(session).await {
                Ok(Some(totals)) => account = Some(totals),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(session, error = %e, "closing a shared account failed; Redis forgets it at its expiry")
                }
            }
        }
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

/// How long a session's shared trail outlives its last event (past any watchdog window).
const TRAIL_TTL: Duration = Duration::from_secs(3600);

/// The watchdog's view of a shared event; its time on this replica's clock (never later
/// than now: another replica's clock may run ahead).
fn event_of(e: &TrailEvent, now: Instant, now_ms: i64) -> watchdog::Event<'_> {
    let ago = Duration::from_millis(u64::try_from(now_ms - e.at_ms).unwrap_or(0));
    watchdog::Event {
        key: &e.key,
        args_hash: e.args_hash,
        tier_rank: e.tier_rank,
        denied: e.denied,
        held: e.held,
        repeat_max: e.repeat_max,
        repeat_window: Duration::from_millis(e.repeat_window_ms),
        at: now.checked_sub(ago).unwrap_or(now),
    }
}

/// A limit reached, as the refusal the agent gets.
pub fn limit_exceeded(hit: Box<LimitHit>) -> ProxyError {
    ProxyError::LimitExceeded(hit)
}
