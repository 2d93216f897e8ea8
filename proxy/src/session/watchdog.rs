//! The loop watchdog: notices when a session's agent is stuck or probing, and says why.
//!
//! Agents fail in ways that no single request reveals: a docker agent once sent 629 identical
//! `read_file` calls, each one allowed on its own. Policy judges one call; this module judges
//! the *trail* of a session — identical repeats, short A→B→A→B cycles, bursts of denials,
//! bursts of holds for a human and sudden attempts on tiers the session never used — so the
//! caller can pause it before it burns budget, floods the approvers or finds a hole. It only observes and reports a [`Trip`]; pausing, storage and
//! notification belong to the caller.
//!
//! `observe` runs on every request, so the state per session is a bounded ring of recent calls
//! plus a few counters, calls are identified by a 64-bit fingerprint, and sessions live in
//! sharded maps so concurrent sessions rarely contend for a lock.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::ids::{IdHasher, IdMap};

/// Most recent calls one session keeps. It bounds memory per session, and also the repeat
/// rule: a `repeat_max` above it is treated as this (a trail full of one call is a loop).
pub const TRAIL_CAPACITY: usize = 256;

/// Shards of the session map; a power of two so a shard is picked with a mask.
const SHARDS: usize = 16;

const SEC: Duration = Duration::from_secs(1);

/// Keys are agent-controlled; keep what a reason or snapshot repeats short.
const MAX_KEY_CHARS: usize = 200;

/// Settings (the repeat threshold and window travel with each [`Event`], from its tier).
///
/// A cycle is a pattern of period 2 or 3 repeated `cycle_repeats` times in a row; a denial
/// burst is `denials` denied events within `denial_window`; a tier jump is, after the first
/// `baseline_calls` events, `tier_jumps` events within `tier_jump_window` on a tier rank above
/// the highest rank of those first events; a hold burst is `holds` held events within
/// `hold_window`. A count of 0 turns its rule off (and `cycle_repeats` of 1 too: one period
/// is not a repetition).
#[derive(Debug, Clone, PartialEq)]
pub struct WatchdogSettings {
    pub cycle_repeats: u32,
    pub denials: u32,
    pub denial_window: Duration,
    pub baseline_calls: u32,
    pub tier_jumps: u32,
    pub tier_jump_window: Duration,
    pub holds: u32,
    pub hold_window: Duration,
}

impl Default for WatchdogSettings {
    fn default() -> Self {
        Self {
            cycle_repeats: 10,
            denials: 10,
            denial_window: Duration::from_secs(60),
            baseline_calls: 20,
            tier_jumps: 3,
            tier_jump_window: Duration::from_secs(60),
            holds: 10,
            hold_window: Duration::from_secs(60),
        }
    }
}

/// One observed call of a session. `key` names what was called (a tool name, or for plain
/// HTTP e.g. "GET api.example.com/path"); `args_hash` is the caller's hash of the arguments or
/// body, so argument values never reach the watchdog. `tier_rank`: 0 read, 1 write,
/// 2 irreversible, 3 high_impact. `repeat_max`/`repeat_window` come from the call's tier
/// (default 20 within 60 s); `repeat_max` 0 turns the repeat rule off for this call. `held`:
/// the call was put before a human (or refused because the session's holds were at their
/// cap) — a session that keeps asking for approvals is flooding the approvers.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    pub key: &'a str,
    pub args_hash: u64,
    pub tier_rank: u8,
    pub denied: bool,
    pub held: bool,
    pub repeat_max: u32,
    pub repeat_window: Duration,
    pub at: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TripKind {
    Repeat,
    Cycle,
    DenialBurst,
    TierJump,
    HoldBurst,
}

/// Why the watchdog tripped: a kind, a human sentence (names the key and the counts, never
/// argument values), and counters (JSON) for the diagnostic snapshot.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Trip {
    pub kind: TripKind,
    pub reason: String,
    pub counters: Value,
}

/// All sessions' trails; shared by reference between request tasks.
pub struct Watchdog {
    settings: WatchdogSettings,
    /// Keyed randomly per process so an agent cannot craft calls whose fingerprints collide.
    hasher: RandomState,
    /// Which shard a session is in (session ids are the proxy's own: [`IdHasher`]).
    sharding: IdHasher,
    shards: Box<[Mutex<Shard>]>,
    /// A shard drops idle sessions at most this often, so the sweep's cost is amortized.
    sweep_every: Duration,
}

impl std::fmt::Debug for Watchdog {
    // Trails hold what agents called; a Debug print should not dump them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("settings", &self.settings)
            .field("sessions", &self.sessions())
            .finish_non_exhaustive()
    }
}

impl Watchdog {
    pub fn new(settings: WatchdogSettings) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        let sweep_every = (settings.denial_window.max(settings.tier_jump_window))
            .max(settings.hold_window)
            .max(SEC);
        Self {
            settings,
            hasher: RandomState::new(),
            sharding: IdHasher::default(),
            shards,
            sweep_every,
        }
    }

    /// Record `event` for `session`; `Some(trip)` the first time a rule trips. After a trip the
    /// session's recent calls and rule counters are cleared so that one burst trips once; its
    /// tier baseline is kept, so a session that keeps going (monitor-only mode) is not judged
    /// against a baseline learned from the very burst that tripped.
    pub fn observe(&self, session: &str, event: Event<'_>) -> Option<Trip> {
        let fp = self.hasher.hash_one((event.key, event.args_hash));
        let mut shard = self.shard(session);
        if shard
            .last_sweep
            .is_none_or(|t| event.at.saturating_duration_since(t) >= self.sweep_every)
        {
            shard.sweep(event.at);
        }
        if let Some(trail) = shard.trails.get_mut(session) {
            return trail.observe(fp, &event, &self.settings);
        }
        // Only a new session allocates its id.
        let trail = shard
            .trails
            .entry(session.to_owned())
            .or_insert_with(|| Trail::new(event.at, &self.settings));
        trail.observe(fp, &event, &self.settings)
    }

    /// Forget a session (teardown).
    pub fn forget(&self, session: &str) {
        self.shard(session).trails.remove(session);
    }

    /// Start a session's counts over, baseline included — after a human resumed it, what it
    /// does next is judged afresh.
    pub fn reset(&self, session: &str) {
        self.forget(session);
    }

    /// Counters of a session right now, for a snapshot (zeros for an unknown session).
    pub fn counters(&self, session: &str) -> Value {
        match self.shard(session).trails.get(session) {
            Some(trail) => trail.counters(&self.settings),
            None => Trail::new(Instant::now(), &self.settings).counters(&self.settings),
        }
    }

    /// Drop every session idle longer than the longest window it used. `observe` does this for
    /// its own shard now and then; a caller may also call it from a periodic task.
    pub fn sweep(&self, now: Instant) {
        for shard in self.shards.iter() {
            lock(shard).sweep(now);
        }
    }

    /// How many sessions are tracked (for metrics).
    pub fn sessions(&self) -> usize {
        self.shards.iter().map(|s| lock(s).trails.len()).sum()
    }

    fn shard(&self, session: &str) -> MutexGuard<'_, Shard> {
        let index = self.sharding.hash_one(session) as usize & (SHARDS - 1);
        lock(&self.shards[index])
    }
}

/// The watchdog is advisory; a panic elsewhere while a shard was locked must not take the
/// proxy's hot path down with it, and a half-updated trail is at worst a missed or early trip.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct Shard {
    trails: IdMap<String, Trail>,
    last_sweep: Option<Instant>,
}

impl Shard {
    fn sweep(&mut self, now: Instant) {
        self.last_sweep = Some(now);
        self.trails
            .retain(|_, t| now.saturating_duration_since(t.last_seen) <= t.longest_window);
    }
}

#[derive(Debug, Clone, Copy)]
struct Call {
    fp: u64,
    at: Instant,
    denied: bool,
}

#[derive(Debug)]
struct Distinct {
    key: Box<str>,
    /// Occurrences in the ring, so the repeat rule scans only when it could trip.
    in_ring: u32,
}

#[derive(Debug)]
struct Trail {
    ring: VecDeque<Call>,
    /// The ring's distinct calls: one key allocation per new call, none per repeat. Keyed
    /// by fingerprints made with [`Watchdog`]'s keyed hasher, which no agent can aim.
    distinct: IdMap<u64, Distinct>,
    denied_in_ring: u32,
    /// How many consecutive latest calls equal the call 2 (3) before them: a cycle of period p
    /// repeated k times is a run of (k - 1) * p, kept incrementally to stay O(1).
    run: [u32; 2],
    /// Times of recent denials and tier jumps, apart from the ring (and capped at their
    /// threshold) so that bursts are counted however many other calls come in between.
    denials: VecDeque<Instant>,
    jumps: VecDeque<Instant>,
    holds: VecDeque<Instant>,
    calls: u64,
    baseline_max: u8,
    last_seen: Instant,
    longest_window: Duration,
}

impl Trail {
    fn new(now: Instant, s: &WatchdogSettings) -> Self {
        Self {
            ring: VecDeque::new(),
            distinct: IdMap::default(),
            denied_in_ring: 0,
            run: [0; 2],
            denials: VecDeque::new(),
            jumps: VecDeque::new(),
            holds: VecDeque::new(),
            calls: 0,
            baseline_max: 0,
            last_seen: now,
            longest_window: s.denial_window.max(s.tier_jump_window).max(s.hold_window),
        }
    }

    fn observe(&mut self, fp: u64, ev: &Event<'_>, s: &WatchdogSettings) -> Option<Trip> {
        // Concurrent requests of one session may report slightly out of order.
        self.last_seen = self.last_seen.max(ev.at);
        self.longest_window = self.longest_window.max(ev.repeat_window);
        let len = self.ring.len();
        for (i, period) in [2, 3].into_iter().enumerate() {
            let same = len >= period && self.ring[len - period].fp == fp;
            self.run[i] = self.run[i].saturating_add(1) * u32::from(same);
        }
        self.push(fp, ev);
        self.calls = self.calls.saturating_add(1);
        let (mut jumps, mut denials) = (0, 0);
        if self.calls <= u64::from(s.baseline_calls) {
            self.baseline_max = self.baseline_max.max(ev.tier_rank);
        } else if s.baseline_calls > 0 && s.tier_jumps > 0 && ev.tier_rank > self.baseline_max {
            jumps = within(&mut self.jumps, ev.at, s.tier_jump_window, s.tier_jumps);
        }
        if ev.denied && s.denials > 0 {
            denials = within(&mut self.denials, ev.at, s.denial_window, s.denials);
        }
        let holds = if ev.held && s.holds > 0 {
            within(&mut self.holds, ev.at, s.hold_window, s.holds)
        } else {
            0
        };
        let (kind, reason, rule) = self.repeat(fp, ev).or_else(|| self.cycle(s)).or_else(|| {
            let key = short(ev.key);
            if denials > 0 && denials >= s.denials {
                let reason = format!(
                    "{denials} calls were denied within {} (limit {}), the last to {key:?}",
                    secs(s.denial_window),
                    s.denials
                );
                let rule = json!({"count": denials, "limit": s.denials,
                    "window_ms": millis(s.denial_window), "last_key": key});
                Some((TripKind::DenialBurst, reason, rule))
            } else if jumps > 0 && jumps >= s.tier_jumps {
                let (usual, tier) = (tier_name(self.baseline_max), tier_name(ev.tier_rank));
                let reason = format!(
                    "{jumps} calls above the session's usual tier ({usual}, the highest of its \
                     first {} calls) within {} (limit {}), the last to {key:?} ({tier})",
                    s.baseline_calls,
                    secs(s.tier_jump_window),
                    s.tier_jumps
                );
                let rule = json!({"count": jumps, "limit": s.tier_jumps, "tier": ev.tier_rank,
                    "window_ms": millis(s.tier_jump_window), "baseline_tier": self.baseline_max,
                    "last_key": key});
                Some((TripKind::TierJump, reason, rule))
            } else if holds > 0 && holds >= s.holds {
                let reason = format!(
                    "{holds} requests were held for approval (or refused at the session's cap \
                     of pending approvals) within {} (limit {}), the last to {key:?}",
                    secs(s.hold_window),
                    s.holds
                );
                let rule = json!({"count": holds, "limit": s.holds,
                    "window_ms": millis(s.hold_window), "last_key": key});
                Some((TripKind::HoldBurst, reason, rule))
            } else {
                None
            }
        })?;
        let counters = json!({"rule": rule, "session": self.counters(s)});
        self.clear();
        Some(Trip {
            kind,
            reason,
            counters,
        })
    }

    fn push(&mut self, fp: u64, ev: &Event<'_>) {
        if self.ring.len() >= TRAIL_CAPACITY {
            if let Some(old) = self.ring.pop_front() {
                self.denied_in_ring -= u32::from(old.denied);
                if let Some(d) = self.distinct.get_mut(&old.fp) {
                    d.in_ring -= 1;
                    if d.in_ring == 0 {
                        self.distinct.remove(&old.fp);
                    }
                }
            }
        }
        let (at, denied) = (ev.at, ev.denied);
        self.ring.push_back(Call { fp, at, denied });
        self.denied_in_ring += u32::from(denied);
        let new = || Distinct {
            key: short(ev.key).into(),
            in_ring: 0,
        };
        self.distinct.entry(fp).or_insert_with(new).in_ring += 1;
    }

    fn repeat(&self, fp: u64, ev: &Event<'_>) -> Option<(TripKind, String, Value)> {
        let limit = (ev.repeat_max as usize).min(TRAIL_CAPACITY);
        let in_ring = self.distinct.get(&fp).map_or(0, |d| d.in_ring as usize);
        if limit == 0 || in_ring < limit {
            return None;
        }
        // One comparison per call, not a subtraction: a looping agent runs this scan every call.
        let cutoff = ev.at.checked_sub(ev.repeat_window);
        let recent = |c: &&Call| cutoff.is_none_or(|cutoff| c.at >= cutoff);
        let same = self.ring.iter().rev().filter(|c| c.fp == fp);
        let count = same.filter(recent).take(limit).count();
        (count >= limit).then(|| {
            let (key, window) = (short(ev.key), secs(ev.repeat_window));
            let reason = format!(
                "{key:?} was called {count} times with identical arguments within {window} \
                 (limit {})",
                ev.repeat_max
            );
            let rule = json!({"key": key, "count": count, "limit": ev.repeat_max,
                "window_ms": millis(ev.repeat_window)});
            (TripKind::Repeat, reason, rule)
        })
    }

    fn cycle(&self, s: &WatchdogSettings) -> Option<(TripKind, String, Value)> {
        let len = self.ring.len();
        [2, 3].into_iter().enumerate().find_map(|(i, period)| {
            let need = u64::from(s.cycle_repeats.checked_sub(1)?) * period as u64;
            if need == 0 || u64::from(self.run[i]) < need || len < period {
                return None;
            }
            let fp = |i: usize| self.ring[len - period + i].fp;
            // A→A→A is the repeat rule's business, and A→A→B is not what a cycle means here.
            if (0..period).any(|a| (a + 1..period).any(|b| fp(a) == fp(b))) {
                return None;
            }
            let keys: Vec<&str> = (0..period)
                .map(|i| self.distinct.get(&fp(i)).map_or("?", |d| &*d.key))
                .collect();
            let path: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
            let reason = format!(
                "calls cycled {} with the same arguments {} times in a row",
                path.join(" → "),
                s.cycle_repeats
            );
            let rule = json!({"period": period, "keys": keys, "repeats": s.cycle_repeats});
            Some((TripKind::Cycle, reason, rule))
        })
    }

    fn clear(&mut self) {
        // `clear` keeps the capacity, so a session that trips often does not reallocate.
        self.ring.clear();
        self.distinct.clear();
        self.denied_in_ring = 0;
        self.run = [0; 2];
        self.denials.clear();
        self.jumps.clear();
        self.holds.clear();
    }

    fn counters(&self, s: &WatchdogSettings) -> Value {
        let top = self
            .distinct
            .values()
            .max_by(|a, b| a.in_ring.cmp(&b.in_ring).then_with(|| b.key.cmp(&a.key)))
            .map(|d| json!({"key": d.key, "count": d.in_ring}));
        let baseline_done = s.baseline_calls > 0 && self.calls >= u64::from(s.baseline_calls);
        json!({
            "events": self.ring.len(),
            "denied": self.denied_in_ring,
            "calls": self.calls,
            "top_repeat": top,
            "highest_baseline_tier": (self.calls > 0).then_some(self.baseline_max),
            "baseline_complete": baseline_done,
            "cycle_run": {"period_2": self.run[0], "period_3": self.run[1]},
            "recent_denials": self.denials.len(),
            "recent_tier_jumps": self.jumps.len(),
            "recent_holds": self.holds.len(),
        })
    }
}

/// Records `now` in `times` (bounded by `limit`) and says how many fall within `window` of it.
fn within(times: &mut VecDeque<Instant>, now: Instant, window: Duration, limit: u32) -> u32 {
    while times
        .front()
        .is_some_and(|&t| now.saturating_duration_since(t) > window)
    {
        times.pop_front();
    }
    times.push_back(now);
    while times.len() > limit as usize {
        times.pop_front();
    }
    times.len() as u32
}

fn short(key: &str) -> &str {
    key.char_indices()
        .nth(MAX_KEY_CHARS)
        .map_or(key, |(end, _)| &key[..end])
}

fn tier_name(rank: u8) -> &'static str {
    ["read", "write", "irreversible", "high_impact"]
        .get(usize::from(rank))
        .unwrap_or(&"custom")
}

fn secs(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(key: &str, args_hash: u64, at: Instant) -> Event<'_> {
        let repeat_window = Duration::from_secs(60);
        let (tier_rank, denied, repeat_max) = (0, false, 20);
        Event {
            key,
            args_hash,
            tier_rank,
            denied,
            held: false,
            repeat_max,
            repeat_window,
            at,
        }
    }

    fn with<'a>(mut e: Event<'a>, f: impl FnOnce(&mut Event<'a>)) -> Event<'a> {
        f(&mut e);
        e
    }

    /// Feeds `n` events to `s`: all but the last must pass; returns what the last one did.
    fn feed<'a>(w: &Watchdog, s: &str, n: usize, f: impl Fn(usize) -> Event<'a>) -> Option<Trip> {
        for i in 0..n - 1 {
            assert_eq!(
                w.observe(s, f(i)),
                None,
                "{s}: tripped early at event {}",
                i + 1
            );
        }
        w.observe(s, f(n - 1))
    }

    fn kind(trip: Option<Trip>) -> Option<TripKind> {
        trip.map(|t| t.kind)
    }

    #[test]
    fn repeat_trips_at_threshold_and_once_per_burst() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let trip = feed(&w, "s", 20, |i| {
            ev("read_file", 7, t0 + i as u32 * SEC / 10)
        });
        let trip = trip.expect("the 20th identical call trips");
        assert_eq!(trip.kind, TripKind::Repeat);
        assert!(
            trip.reason.contains("\"read_file\" was called 20 times"),
            "{}",
            trip.reason
        );
        assert_eq!(trip.counters["rule"]["count"], 20);
        assert_eq!(trip.counters["session"]["top_repeat"]["count"], 20);
        assert_eq!(
            feed(&w, "s", 19, |_| ev("read_file", 7, t0 + 3 * SEC)),
            None
        );
    }

    #[test]
    fn varying_args_never_trip_repeat_and_zero_turns_it_off() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        assert_eq!(feed(&w, "s", 1000, |i| ev("read_file", i as u64, t0)), None);
        // Nor is A→A→A a cycle.
        let off = |_| with(ev("ping", 1, t0), |e| e.repeat_max = 0);
        assert_eq!(feed(&w, "off", 1000, off), None);
    }

    #[test]
    fn calls_older_than_the_window_do_not_count() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let read = |at| ev("read_file", 7, at);
        // Exactly 60 s after the first still counts.
        assert_eq!(feed(&w, "edge", 19, |_| read(t0)), None);
        assert!(w.observe("edge", read(t0 + 60 * SEC)).is_some());
        // 10 at t0 and 9 at t0+30 s: at t0+61 s the first 10 have left the window.
        assert_eq!(feed(&w, "s", 10, |_| read(t0)), None);
        assert_eq!(feed(&w, "s", 9, |_| read(t0 + 30 * SEC)), None);
        assert_eq!(feed(&w, "s", 10, |_| read(t0 + 61 * SEC)), None);
        assert_eq!(w.counters("s")["events"], 29);
        assert!(w.observe("s", read(t0 + 61 * SEC)).is_some());
    }

    #[test]
    fn docker_agent_read_file_loop_trips_every_20_calls() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let trips: Vec<u32> = (1..=629u32)
            .filter(|&i| {
                let trip = w.observe("docker", ev("read_file", 42, t0 + i * SEC / 20));
                trip.is_some() && {
                    w.reset("docker");
                    true
                }
            })
            .collect();
        assert_eq!(trips[..2], [20, 40]);
        assert_eq!(trips, (1..=31).map(|k| k * 20).collect::<Vec<_>>());
    }

    #[test]
    fn cycles_of_period_two_and_three_trip_at_the_configured_repeats() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let keys = ["list_dir", "read_file", "stat"];
        for period in [2, 3] {
            let trip = feed(&w, &format!("p{period}"), 10 * period, |i| {
                ev(keys[i % period], 1, t0)
            });
            let trip = trip.expect("10 full periods trip");
            assert_eq!(
                (trip.kind, trip.counters["rule"]["period"].as_u64()),
                (TripKind::Cycle, Some(period as u64))
            );
            assert!(
                trip.reason.contains("\"list_dir\" → \"read_file\""),
                "{}",
                trip.reason
            );
        }
        // Elements of a period must be distinct: A→A→B is not a cycle.
        let aab = |i: usize| with(ev(["a", "a", "b"][i % 3], 1, t0), |e| e.repeat_max = 0);
        assert_eq!(feed(&w, "aab", 300, aab), None);
    }

    #[test]
    fn legit_mixed_workload_never_trips() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let keys = [
            "read_file",
            "list_dir",
            "grep",
            "write_file",
            "GET api.example.com/x",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..1000u32 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let r = x >> 33;
            let key = keys[(r % 5) as usize];
            let e = with(ev(key, (r >> 8) % 40, t0 + i * SEC / 5), |e| {
                (e.tier_rank, e.denied) = (
                    u8::from(key == "write_file" || i == 0),
                    r.is_multiple_of(100),
                );
            });
            assert_eq!(w.observe("s", e), None, "event {i}");
        }
        assert_eq!(w.counters("s")["calls"], 1000);
    }

    #[test]
    fn denial_burst_trips_within_the_window_only() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let denied = |i: usize, gap: u32| {
            with(ev("delete", i as u64, t0 + i as u32 * gap * SEC), |e| {
                e.denied = true
            })
        };
        assert_eq!(
            kind(feed(&w, "s", 10, |i| denied(i, 1))),
            Some(TripKind::DenialBurst)
        );
        assert_eq!(feed(&w, "slow", 10, |i| denied(i, 7)), None);
    }

    #[test]
    fn a_burst_of_holds_trips_within_the_window_only() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        // Distinct calls (no repeat, no cycle), each held for a human.
        let held = |i: usize, gap: u32| {
            with(
                ev(
                    ["refund", "delete", "wire"][i % 3],
                    i as u64,
                    t0 + i as u32 * gap * SEC,
                ),
                |e| (e.held, e.repeat_max) = (true, 0),
            )
        };
        let trip = feed(&w, "s", 10, |i| held(i, 1)).expect("the 10th hold trips");
        assert_eq!(trip.kind, TripKind::HoldBurst);
        assert!(
            trip.reason.contains("10 requests were held"),
            "{}",
            trip.reason
        );
        assert_eq!(trip.counters["rule"]["count"], 10);
        // Spread out, or allowed calls between them: nothing.
        assert_eq!(feed(&w, "slow", 30, |i| held(i, 7)), None);
        let mixed = |i: usize| {
            with(ev("read", i as u64, t0), |e| {
                e.held = i.is_multiple_of(2) && i < 18
            })
        };
        assert_eq!(feed(&w, "mixed", 40, mixed), None);
        // Holds are not denials, and 0 turns the rule off.
        assert_eq!(w.counters("mixed")["recent_denials"], 0);
        let off = Watchdog::new(WatchdogSettings {
            holds: 0,
            ..Default::default()
        });
        assert_eq!(feed(&off, "s", 100, |i| held(i, 0)), None);
    }

    #[test]
    fn tier_jump_trips_after_the_baseline_only() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        let call = |rank, i: usize, at| with(ev("tool", i as u64, at), |e| e.tier_rank = rank);
        assert_eq!(feed(&w, "s", 20, |i| call(0, i, t0)), None);
        let trip = feed(&w, "s", 3, |i| call(2, 100 + i, t0)).expect("the 3rd jump trips");
        assert_eq!(trip.kind, TripKind::TierJump);
        assert!(trip.reason.contains("(read,") && trip.reason.contains("(irreversible)"));
        assert_eq!(trip.counters["session"]["highest_baseline_tier"], 0);
        // An irreversible call inside the baseline makes irreversible usual.
        assert_eq!(
            feed(&w, "b", 20, |i| call(2 * u8::from(i == 19), i, t0)),
            None
        );
        assert_eq!(feed(&w, "b", 3, |i| call(2, 100 + i, t0)), None);
        // Jumps further apart than the window do not add up.
        assert_eq!(feed(&w, "slow", 20, |i| call(0, i, t0)), None);
        assert_eq!(
            feed(&w, "slow", 5, |i| call(3, 0, t0 + i as u32 * 31 * SEC)),
            None
        );
    }

    #[test]
    fn reset_and_forget_clear_state_and_sessions_are_independent() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        for s in ["a", "b", "c"] {
            assert_eq!(feed(&w, s, 19, |_| ev("read_file", 7, t0)), None);
        }
        w.reset("a");
        w.forget("b");
        assert_eq!(w.counters("b")["events"], 0);
        assert_eq!(w.counters("c")["events"], 19);
        assert!(w.observe("c", ev("read_file", 7, t0)).is_some());
        for s in ["a", "b"] {
            assert!(feed(&w, s, 20, |_| ev("read_file", 7, t0)).is_some());
        }
    }

    #[test]
    fn memory_is_bounded_and_idle_sessions_are_dropped() {
        let (w, t0) = (Watchdog::new(WatchdogSettings::default()), Instant::now());
        assert_eq!(
            feed(&w, "s", 100_000, |i| ev("read_file", i as u64, t0)),
            None
        );
        {
            let shard = w.shard("s");
            let trail = &shard.trails["s"];
            assert!(trail.ring.len() <= TRAIL_CAPACITY);
            assert!(trail.distinct.len() <= TRAIL_CAPACITY);
        }
        w.observe("t", ev("x", 0, t0 + 60 * SEC));
        w.sweep(t0 + 61 * SEC);
        assert_eq!(w.sessions(), 1);
        w.sweep(t0 + 121 * SEC);
        assert_eq!(w.sessions(), 0);
    }

    #[test]
    fn a_threshold_above_capacity_is_clamped_and_threads_share_one_watchdog() {
        let w = std::sync::Arc::new(Watchdog::new(WatchdogSettings::default()));
        let t0 = Instant::now();
        let big = |_| with(ev("read_file", 7, t0), |e| e.repeat_max = 1000);
        assert!(feed(&w, "s", TRAIL_CAPACITY, big).is_some());
        let threads: Vec<_> = (0..4)
            .map(|n| {
                let w = w.clone();
                std::thread::spawn(move || {
                    let s = format!("t{n}");
                    (0..20)
                        .filter_map(|_| w.observe(&s, ev("read_file", 7, t0)))
                        .count()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 1);
        }
    }
}
