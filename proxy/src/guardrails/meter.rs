//! Session budgets: what each session has used (tool calls, cost, bytes) against its hard
//! limits, and the carving of a child's budget out of its parent's.
//!
//! Counters live in memory — they are touched by every request — and are written to the
//! store by the reaper's tick and at teardown, and read back at start-up, so a restart does
//! not hand a session a fresh budget (at most one tick's usage can be lost in a crash).
//!
//! A limit is checked and charged in one step under the session's lock, so concurrent calls
//! cannot together overshoot it. Bytes cannot be known before they flow: they are counted
//! as they pass and the limit refuses the session's next request.

use std::sync::{Arc, Mutex};

use super::sharded::Sharded;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// One session's hard limits (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_calls: Option<u64>,
    pub max_cost_micros: Option<i64>,
    pub max_bytes_sent: Option<u64>,
    pub max_bytes_received: Option<u64>,
}

impl Limits {
    /// These limits, with `defaults` for each one left out.
    pub fn or(self, defaults: Limits) -> Limits {
        Limits {
            max_calls: self.max_calls.or(defaults.max_calls),
            max_cost_micros: self.max_cost_micros.or(defaults.max_cost_micros),
            max_bytes_sent: self.max_bytes_sent.or(defaults.max_bytes_sent),
            max_bytes_received: self.max_bytes_received.or(defaults.max_bytes_received),
        }
    }
}

/// What a session has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub calls: u64,
    pub cost_micros: i64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// A limit reached: the body of `429 limit_exceeded` (docs/design.md §5).
#[derive(Debug, Clone, PartialEq)]
pub struct LimitHit {
    /// `calls`, `cost`, `bytes_sent`, `bytes_received`, `rate:agent`, `rate:tenant`,
    /// `children`, `depth`.
    pub limit: String,
    /// In the limit's own unit (cost in catalog units, not micros).
    pub used: Value,
    pub max: Value,
    /// Seconds until trying again can succeed; `None` when only a human or a new session
    /// can help (a budget does not refill by itself).
    pub retry_after: Option<u64>,
}

/// Whether a limit may be raised by an approval (`sessions.escalate_limits`).
impl LimitHit {
    pub fn escalatable(&self, names: &[String]) -> bool {
        names.contains(&self.limit)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Account {
    pub limits: Limits,
    pub usage: Usage,
    /// Budget handed to live children, returned (less what they used) when they end.
    pub carved_calls: u64,
    pub carved_cost_micros: i64,
    pub parent: Option<String>,
    /// Bytes counted here and not yet added to the shared account (`state.redis`; in
    /// memory alone they are never taken). Not stored: the usage above includes them.
    #[serde(skip)]
    pub unsynced: (u64, u64),
    /// When this replica last took the shared account's figures (`state.redis`).
    #[serde(skip)]
    pub synced_at: Option<std::time::Instant>,
}

impl Account {
    fn remaining_calls(&self) -> Option<u64> {
        self.limits.max_calls.map(|max| {
            max.saturating_sub(self.usage.calls)
                .saturating_sub(self.carved_calls)
        })
    }

    fn remaining_cost(&self) -> Option<i64> {
        self.limits
            .max_cost_micros
            .map(|max| (max - self.usage.cost_micros - self.carved_cost_micros).max(0))
    }
}

/// The longest spawn chain followed when charging bytes (deeper than any `max_depth` a
/// config may set is refused there; this only bounds a corrupt parent link).
const MAX_CHAIN: usize = 64;

fn cost_value(micros: i64) -> Value {
    json!(micros as f64 / 1_000_000.0)
}

/// Every live session's account.
#[derive(Debug, Default)]
pub struct Meter {
    accounts: Sharded<Arc<Mutex<Account>>>,
}

impl Meter {
    fn account(&self, session: &str) -> Option<Arc<Mutex<Account>>> {
        self.accounts.get(session)
    }

    /// Open the account of a new (or reloaded) session.
    pub fn open(&self, session: &str, account: Account) {
        self.accounts.insert(session, Arc::new(Mutex::new(account)));
    }

    /// Close a session's account: its usage, and the parent gets back what of its carved
    /// budget the child did not use.
    pub fn close(&self, session: &str) -> Option<Account> {
        let account = self.accounts.remove(session)?;
        let account = account.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(parent) = account.parent.as_deref().and_then(|p| self.account(p)) {
            let mut parent = parent.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(max) = account.limits.max_calls {
                parent.carved_calls = parent.carved_calls.saturating_sub(max);
                parent.usage.calls += account.usage.calls;
            }
            if let Some(max) = account.limits.max_cost_micros {
                parent.carved_cost_micros = (parent.carved_cost_micros - max).max(0);
                parent.usage.cost_micros += account.usage.cost_micros;
            }
        }
        Some(account)
    }

    /// What `session` has used so far.
    pub fn usage(&self, session: &str) -> Option<Usage> {
        let account = self.account(session)?;
        let usage = account.lock().unwrap_or_else(|e| e.into_inner()).usage;
        Some(usage)
    }

    /// The account of `session`, as it is now.
    pub fn snapshot(&self, session: &str) -> Option<Account> {
        let account = self.account(session)?;
        let account = account.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Some(account)
    }

    /// Every account (for the store).
    pub fn all(&self) -> Vec<(String, Account)> {
        self.accounts
            .entries()
            .into_iter()
            .map(|(id, a)| {
                let account = a.lock().unwrap_or_else(|e| e.into_inner()).clone();
                (id, account)
            })
            .collect()
    }

    /// Refuse the session's next request when it already received or sent more bytes than
    /// allowed.
    pub fn check_bytes(&self, session: &str) -> Result<(), Box<LimitHit>> {
        // A child's bytes are its ancestors' bytes too (see `add_bytes`): a spent parent
        // stops its children.
        for account in self.chain(session) {
            let a = account.lock().unwrap_or_else(|e| e.into_inner());
            for (limit, used, max) in [
                ("bytes_sent", a.usage.bytes_sent, a.limits.max_bytes_sent),
                (
                    "bytes_received",
                    a.usage.bytes_received,
                    a.limits.max_bytes_received,
                ),
            ] {
                if let Some(max) = max.filter(|max| used >= *max) {
                    return Err(Box::new(LimitHit {
                        limit: limit.into(),
                        used: json!(used),
                        max: json!(max),
                        retry_after: None,
                    }));
                }
            }
        }
        Ok(())
    }

    /// The accounts of `session` and of each of its live ancestors, nearest first. Bounded
    /// by the spawn depth; a cycle (which `create` cannot make) would stop at the bound.
    fn chain(&self, session: &str) -> Vec<Arc<Mutex<Account>>> {
        let mut out = Vec::new();
        // The session's own account is looked up by the id as given: a root session (the
        // common case, on every request's byte and call accounting) copies no id at all.
        let Some(own) = self.account(session) else {
            return out;
        };
        let mut next = own.lock().unwrap_or_else(|e| e.into_inner()).parent.clone();
        out.push(own);
        while let Some(id) = next.take() {
            let Some(account) = self.account(&id) else {
                break;
            };
            next = account
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .parent
                .clone();
            out.push(account);
            if out.len() > MAX_CHAIN {
                break;
            }
        }
        out
    }

    /// Charge one tool call costing `cost_micros`, unless it would pass a limit.
    pub fn charge_call(&self, session: &str, cost_micros: i64) -> Result<Usage, Box<LimitHit>> {
        let Some(account) = self.account(session) else {
            return Ok(Usage::default());
        };
        let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(max), Some(left)) = (a.limits.max_calls, a.remaining_calls()) {
            if left == 0 {
                return Err(Box::new(LimitHit {
                    limit: "calls".into(),
                    used: json!(a.usage.calls),
                    max: json!(max.saturating_sub(a.carved_calls)),
                    retry_after: None,
                }));
            }
        }
        if let (Some(max), Some(left)) = (a.limits.max_cost_micros, a.remaining_cost()) {
            if cost_micros > left {
                return Err(Box::new(LimitHit {
                    limit: "cost".into(),
                    used: cost_value(a.usage.cost_micros),
                    max: cost_value(max - a.carved_cost_micros),
                    retry_after: None,
                }));
            }
        }
        a.usage.calls += 1;
        a.usage.cost_micros += cost_micros;
        Ok(a.usage)
    }

    /// Charge a call a human approved: it runs whatever the budget says.
    pub fn charge_approved(&self, session: &str, cost_micros: i64) {
        if let Some(account) = self.account(session) {
            let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
            a.usage.calls += 1;
            a.usage.cost_micros += cost_micros;
        }
    }

    /// An approver granted the session more of `limit`: as much again as it started with.
    pub fn grant(&self, session: &str, limit: &str) -> bool {
        let Some(account) = self.account(session) else {
            return false;
        };
        let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
        match limit {
            "calls" => {
                if let Some(max) = a.limits.max_calls.as_mut() {
                    *max = max.saturating_mul(2).max(1);
                }
            }
            "cost" => {
                if let Some(max) = a.limits.max_cost_micros.as_mut() {
                    *max = max.saturating_mul(2).max(1);
                }
            }
            _ => return false,
        }
        true
    }

    /// Count bytes that flowed for the session.
    pub fn add_bytes(&self, session: &str, sent: u64, received: u64) {
        // Charged up the spawn chain: bytes are not carved out of a parent (a child's
        // traffic is counted where it flows), so a parent's byte budget bounds the bytes of
        // all its descendants together — sixteen children cannot each spend it again.
        for (i, account) in self.chain(session).into_iter().enumerate() {
            let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
            a.usage.bytes_sent += sent;
            a.usage.bytes_received += received;
            // The shared account's script charges the chain itself.
            if i == 0 {
                a.unsynced.0 = a.unsynced.0.saturating_add(sent);
                a.unsynced.1 = a.unsynced.1.saturating_add(received);
            }
        }
    }

    /// Take the bytes of `session` not yet added to its shared account.
    pub fn take_unsynced(&self, session: &str) -> (u64, u64) {
        self.account(session).map_or((0, 0), |a| {
            std::mem::take(&mut a.lock().unwrap_or_else(|e| e.into_inner()).unsynced)
        })
    }

    /// Give back bytes taken by [`Meter::take_unsynced`] that could not be added.
    pub fn return_unsynced(&self, session: &str, (sent, received): (u64, u64)) {
        if let Some(a) = self.account(session) {
            let mut a = a.lock().unwrap_or_else(|e| e.into_inner());
            a.unsynced.0 = a.unsynced.0.saturating_add(sent);
            a.unsynced.1 = a.unsynced.1.saturating_add(received);
        }
    }

    /// Sessions holding bytes not yet added to their shared accounts.
    pub fn unsynced_sessions(&self) -> Vec<String> {
        self.accounts
            .entries()
            .into_iter()
            .filter(|(_, a)| a.lock().unwrap_or_else(|e| e.into_inner()).unsynced != (0, 0))
            .map(|(id, _)| id)
            .collect()
    }

    /// Take the shared accounts' figures as this replica's own (`state.redis`): Redis is
    /// the truth, plus whatever bytes this replica counted since it took them.
    pub fn mirror(&self, accounts: Vec<(String, Account)>) {
        let now = std::time::Instant::now();
        for (id, mut shared) in accounts {
            shared.synced_at = Some(now);
            match self.account(&id) {
                Some(local) => {
                    let mut a = local.lock().unwrap_or_else(|e| e.into_inner());
                    shared.unsynced = a.unsynced;
                    shared.usage.bytes_sent += a.unsynced.0;
                    shared.usage.bytes_received += a.unsynced.1;
                    *a = shared;
                }
                None => self.open(&id, shared),
            }
        }
    }

    /// Whether `session`'s figures were taken from the shared account less than `fresh` ago.
    pub fn synced_within(&self, session: &str, fresh: std::time::Duration) -> bool {
        self.account(session).is_some_and(|a| {
            a.lock()
                .unwrap_or_else(|e| e.into_inner())
                .synced_at
                .is_some_and(|at| at.elapsed() < fresh)
        })
    }

    /// Take charged figures as this replica's own (`state.redis`).
    pub fn mirror_calls(&self, session: &str, usage: Usage) {
        if let Some(a) = self.account(session) {
            let mut a = a.lock().unwrap_or_else(|e| e.into_inner());
            a.usage.calls = usage.calls;
            a.usage.cost_micros = usage.cost_micros;
        }
    }

    /// Charge up to `n` bytes a byte stream (a WebSocket splice, a tunnel relay) is about to
    /// pass `direction`; returns how many of them fit the session's budget — all of them
    /// when it has none. What fits is counted, so a stream cut at its budget leaves the
    /// session at exactly its limit, and the gate refuses its next request.
    pub fn admit_bytes(&self, session: &str, direction: super::counted::Direction, n: u64) -> u64 {
        fn field(a: &mut Account, direction: super::counted::Direction) -> (Option<u64>, &mut u64) {
            match direction {
                super::counted::Direction::Sent => {
                    (a.limits.max_bytes_sent, &mut a.usage.bytes_sent)
                }
                super::counted::Direction::Received => {
                    (a.limits.max_bytes_received, &mut a.usage.bytes_received)
                }
            }
        }
        // What fits every account of the chain (see `add_bytes`), then charged to each. Each
        // account is locked on its own, never two at once; concurrent streams of one tree can
        // pass a budget by at most what they admit at the same moment.
        let chain = self.chain(session);
        let mut fits = n;
        for account in &chain {
            let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
            let (max, used) = field(&mut a, direction);
            if let Some(max) = max {
                fits = fits.min(max.saturating_sub(*used));
            }
        }
        for (i, account) in chain.iter().enumerate() {
            let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
            *field(&mut a, direction).1 += fits;
            if i == 0 {
                let unsynced = match direction {
                    super::counted::Direction::Sent => &mut a.unsynced.0,
                    super::counted::Direction::Received => &mut a.unsynced.1,
                };
                *unsynced = unsynced.saturating_add(fits);
            }
        }
        fits
    }

    /// Carve a child's limits out of `parent`'s remaining budget. `asked` are the limits
    /// the creator named; a limit the parent has and the creator left out gets half of
    /// what remains, so a parent can never be emptied by one child it did not size.
    pub fn carve(&self, parent: &str, asked: Limits) -> Result<Limits, Box<LimitHit>> {
        let Some(account) = self.account(parent) else {
            return Ok(asked);
        };
        let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
        let mut child = asked;
        if let Some(left) = a.remaining_calls() {
            let want = asked.max_calls.unwrap_or((left / 2).max(1));
            if want > left || want == 0 {
                return Err(Box::new(LimitHit {
                    limit: "calls".into(),
                    used: json!(want),
                    max: json!(left),
                    retry_after: None,
                }));
            }
            child.max_calls = Some(want);
        }
        if let Some(left) = a.remaining_cost() {
            let want = asked.max_cost_micros.unwrap_or((left / 2).max(1));
            if want > left || want == 0 {
                return Err(Box::new(LimitHit {
                    limit: "cost".into(),
                    used: cost_value(want),
                    max: cost_value(left),
                    retry_after: None,
                }));
            }
            child.max_cost_micros = Some(want);
        }
        // Bytes are not carved: the child's traffic is counted where it flows, and charged
        // to its ancestors too (`add_bytes`). What it may name is at most what the parent
        // has left, so its own figures never claim more than the parent holds.
        let clamp = |asked: Option<u64>, max: Option<u64>, used: u64| match max {
            Some(max) => Some(asked.unwrap_or(max).min(max.saturating_sub(used))),
            None => asked,
        };
        child.max_bytes_sent = clamp(
            asked.max_bytes_sent,
            a.limits.max_bytes_sent,
            a.usage.bytes_sent,
        );
        child.max_bytes_received = clamp(
            asked.max_bytes_received,
            a.limits.max_bytes_received,
            a.usage.bytes_received,
        );
        if let Some(c) = child.max_calls.filter(|_| a.limits.max_calls.is_some()) {
            a.carved_calls += c;
        }
        if let Some(c) = child
            .max_cost_micros
            .filter(|_| a.limits.max_cost_micros.is_some())
        {
            a.carved_cost_micros += c;
        }
        Ok(child)
    }
}

impl Meter {
    /// Give back a carve whose child was never created.
    pub fn uncarve(&self, parent: &str, child: &Limits) {
        if let Some(account) = self.account(parent) {
            let mut a = account.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = child.max_calls.filter(|_| a.limits.max_calls.is_some()) {
                a.carved_calls = a.carved_calls.saturating_sub(c);
            }
            if let Some(c) = child
                .max_cost_micros
                .filter(|_| a.limits.max_cost_micros.is_some())
            {
                a.carved_cost_micros = (a.carved_cost_micros - c).max(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter_with(limits: Limits) -> Meter {
        let m = Meter::default();
        m.open(
            "s",
            Account {
                limits,
                ..Default::default()
            },
        );
        m
    }

    #[test]
    fn calls_are_charged_up_to_the_limit_and_not_one_more() {
        let m = meter_with(Limits {
            max_calls: Some(3),
            ..Default::default()
        });
        for _ in 0..3 {
            m.charge_call("s", 0).unwrap();
        }
        let hit = m.charge_call("s", 0).unwrap_err();
        assert_eq!(hit.limit, "calls");
        assert_eq!(hit.used, json!(3));
        assert_eq!(hit.max, json!(3));
        assert!(m.grant("s", "calls"));
        for _ in 0..3 {
            m.charge_call("s", 0).unwrap();
        }
        assert!(m.charge_call("s", 0).is_err());
    }

    #[test]
    fn cost_is_refused_when_the_call_would_pass_it() {
        let m = meter_with(Limits {
            max_cost_micros: Some(2_500_000),
            ..Default::default()
        });
        m.charge_call("s", 1_000_000).unwrap();
        m.charge_call("s", 1_000_000).unwrap();
        let hit = m.charge_call("s", 1_000_000).unwrap_err();
        assert_eq!(hit.limit, "cost");
        assert_eq!(hit.used, json!(2.0));
        assert_eq!(hit.max, json!(2.5));
        // A cheaper call still fits.
        m.charge_call("s", 500_000).unwrap();
    }

    #[test]
    fn a_child_is_carved_out_of_the_parent_and_returns_what_it_left() {
        let m = meter_with(Limits {
            max_calls: Some(10),
            ..Default::default()
        });
        let child = m
            .carve(
                "s",
                Limits {
                    max_calls: Some(4),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(child.max_calls, Some(4));
        m.open(
            "c",
            Account {
                limits: child,
                parent: Some("s".into()),
                ..Default::default()
            },
        );
        // The parent has 6 left, so a second child asking 7 is refused.
        let hit = m
            .carve(
                "s",
                Limits {
                    max_calls: Some(7),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!((hit.used.clone(), hit.max.clone()), (json!(7), json!(6)));
        m.charge_call("c", 0).unwrap();
        for _ in 0..6 {
            m.charge_call("s", 0).unwrap();
        }
        assert!(m.charge_call("s", 0).is_err());
        // The child ends having used 1 of 4: the parent gets 3 back.
        m.close("c");
        for _ in 0..3 {
            m.charge_call("s", 0).unwrap();
        }
        assert!(m.charge_call("s", 0).is_err());
        // A child naming nothing gets half of what is left (here: nothing left, refused).
        assert!(m.carve("s", Limits::default()).is_err());
    }

    #[test]
    fn a_childs_bytes_are_its_parents_bytes() {
        use super::super::counted::Direction;
        let m = meter_with(Limits {
            max_bytes_received: Some(100),
            ..Default::default()
        });
        // A child naming more than the parent has is given what the parent has.
        let child = m
            .carve(
                "s",
                Limits {
                    max_bytes_received: Some(1_000_000),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(child.max_bytes_received, Some(100));
        for c in ["c1", "c2"] {
            m.open(
                c,
                Account {
                    limits: child,
                    parent: Some("s".into()),
                    ..Default::default()
                },
            );
        }
        // Two children share the parent's 100 bytes; they cannot spend 100 each.
        assert_eq!(m.admit_bytes("c1", Direction::Received, 70), 70);
        assert_eq!(m.admit_bytes("c2", Direction::Received, 70), 30);
        assert!(m.check_bytes("c2").is_err(), "the parent is spent");
        assert!(m.check_bytes("s").is_err());
        m.add_bytes("c1", 5, 0);
        assert_eq!(m.usage("s").unwrap().bytes_sent, 5);
    }

    #[test]
    fn bytes_refuse_the_next_request_once_passed() {
        let m = meter_with(Limits {
            max_bytes_received: Some(100),
            ..Default::default()
        });
        m.add_bytes("s", 10, 99);
        m.check_bytes("s").unwrap();
        m.add_bytes("s", 0, 1);
        let hit = m.check_bytes("s").unwrap_err();
        assert_eq!(hit.limit, "bytes_received");
    }

    #[test]
    fn a_stream_is_admitted_up_to_its_budget_and_not_one_byte_more() {
        use super::super::counted::Direction;
        let m = meter_with(Limits {
            max_bytes_received: Some(100),
            ..Default::default()
        });
        assert_eq!(m.admit_bytes("s", Direction::Received, 60), 60);
        assert_eq!(m.admit_bytes("s", Direction::Received, 60), 40);
        assert_eq!(m.admit_bytes("s", Direction::Received, 1), 0);
        assert_eq!(m.usage("s").unwrap().bytes_received, 100);
        assert_eq!(m.check_bytes("s").unwrap_err().limit, "bytes_received");
        // No limit that way: everything passes, and is counted.
        assert_eq!(m.admit_bytes("s", Direction::Sent, 5000), 5000);
        assert_eq!(m.usage("s").unwrap().bytes_sent, 5000);
        // A session without an account (none was opened) is not the meter's to bound.
        assert_eq!(m.admit_bytes("nobody", Direction::Sent, 7), 7);
    }
}
