//! What policies remember of a session: its labels (`context.session.labels`) and its recent
//! tool calls (`context.session.recent`).
//!
//! # Labels
//! A request that policy allowed to a labelled tool or host (`labels` in `tools.toml`,
//! [`ostiary_policies::labels`]) adds those labels to its session before it is forwarded,
//! so a session is tainted even when the upstream then fails or times out: what was sent
//! may have been read. Labels are never taken off, and a child session starts with its
//! parent's (taint does not wash out by spawning). The store is their record: written
//! before the request leaves (a store that cannot take them refuses the request, `503
//! state_unavailable`), shared by every replica on it and kept across restarts. Each replica
//! also keeps those it has seen; with `state.redis` they are in Redis too, read at every
//! decision that a policy reading them asks about, so a label added on one replica is seen by
//! the next request on any other. Without Redis a replica sees those it added and those the
//! store held when it first saw the session (as it counts budgets alone then).
//!
//! # Recent calls
//! Each tool call policy allowed is counted, when it is forwarded, under its tool and its
//! tier; a decision sees the counts of the request's tool and tier over the last 10 minutes
//! and the last hour, itself not counted. They live in memory, or in Redis with
//! `state.redis` (then shared by replicas), for the session's life; no more than an hour of
//! calls is kept. Like the budgets' counters without Redis, they start again from zero when
//! the process restarts.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ostiary_policies::{Recent, Tier};

use crate::counters::Counters;
use crate::error::ProxyError;
use crate::ids::IdMap;
use crate::store::sessions::SessionStore;
use crate::store::{Call, StoreError};

/// The two windows of `context.session.recent`, shortest first.
pub const WINDOWS: [Duration; 2] = [Duration::from_secs(600), Duration::from_secs(3600)];

/// What one session's requests did, as this replica knows it.
#[derive(Debug, Default)]
struct Local {
    /// Loaded from the store, plus every label added or read here since.
    labels: BTreeSet<String>,
    /// Whether the store's labels were read in.
    loaded: bool,
    /// Per window (`tool:<name>`, `tier:<tier>`), the times (ms) of the calls of the last
    /// hour, oldest first. Unused with Redis.
    calls: HashMap<String, VecDeque<i64>>,
}

/// A session's labels and recent calls, for `ostiary sessions show`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Shown {
    pub labels: Vec<String>,
    /// Per window (`tool:<name>`, `tier:<tier>`) with calls in the last hour: its counts
    /// over the last 10 minutes and the last hour.
    pub recent: BTreeMap<String, RecentCounts>,
}

/// One window's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecentCounts {
    #[serde(rename = "10m")]
    pub ten_minutes: i64,
    #[serde(rename = "1h")]
    pub hour: i64,
}

/// Every session's memory.
pub struct SessionMemory {
    db: Arc<dyn SessionStore>,
    local: Mutex<IdMap<String, Local>>,
}

impl std::fmt::Debug for SessionMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionMemory").finish_non_exhaustive()
    }
}

fn store_unavailable(e: StoreError) -> ProxyError {
    ProxyError::StateUnavailable {
        component: "store",
        reason: e.to_string(),
    }
}

// Joined rather than `format!`ed: both are made for every tool call.
fn tool_key(tool: &str) -> String {
    ["tool:", tool].concat()
}

fn tier_key(tier: Tier) -> String {
    ["tier:", tier.as_str()].concat()
}

impl SessionMemory {
    pub fn new(db: Arc<dyn SessionStore>) -> Self {
        Self {
            db,
            local: Mutex::new(IdMap::default()),
        }
    }

    fn with_local<T>(&self, session: &str, f: impl FnOnce(&mut Local) -> T) -> T {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        // Only a session's first call allocates its id as a key.
        match local.get_mut(session) {
            Some(l) => f(l),
            None => f(local.entry(session.to_owned()).or_default()),
        }
    }

    /// Read the store's labels of `session` in, once per replica (a restart, a session
    /// another replica made, a child that inherited some).
    async fn load(&self, session: &str) -> Result<(), ProxyError> {
        if self.with_local(session, |l| l.loaded) {
            return Ok(());
        }
        let stored = self.stored(session).await?;
        self.with_local(session, |l| {
            l.labels.extend(stored);
            l.loaded = true;
        });
        Ok(())
    }

    /// The store's labels of `session`: every replica's.
    async fn stored(&self, session: &str) -> Result<Vec<String>, ProxyError> {
        let id = session.to_owned();
        self.db
            .call(move |db| db.labels(&id))
            .await
            .map_err(store_unavailable)
    }

    /// `context.session.labels` and `.recent` for a decision of `session`, `tool` its tool
    /// call (none: recent counts are 0). `reads` says whether any policy in force reads
    /// them: when none does, nothing is fetched and they are empty.
    pub async fn state(
        &self,
        shared: Option<&Counters>,
        session: &str,
        tool: Option<(&str, Tier)>,
        reads: bool,
        now_ms: i64,
    ) -> Result<(BTreeSet<String>, Recent), ProxyError> {
        if !reads {
            return Ok((BTreeSet::new(), Recent::default()));
        }
        self.load(session).await?;
        let windows: Vec<String> = tool
            .map(|(name, tier)| vec![tool_key(name), tier_key(tier)])
            .unwrap_or_default();
        let counts = match shared {
            Some(shared) => {
                let names: Vec<&str> = windows.iter().map(String::as_str).collect();
                let remembered = shared.remembered(session, &names, &WINDOWS, now_ms).await?;
                self.with_local(session, |l| l.labels.extend(remembered.labels));
                remembered.counts
            }
            None => self.with_local(session, |l| {
                windows
                    .iter()
                    .map(|w| count(l.calls.get_mut(w), now_ms))
                    .collect()
            }),
        };
        let labels = self.with_local(session, |l| l.labels.clone());
        let at = |i: usize, w: usize| {
            counts
                .get(i)
                .and_then(|c| c.get(w))
                .copied()
                .unwrap_or_default()
        };
        let recent = Recent {
            tool_10m: at(0, 0),
            tool_1h: at(0, 1),
            tier_10m: at(1, 0),
            tier_1h: at(1, 1),
        };
        Ok((labels, recent))
    }

    /// Remember what an allowed request did: `labels` on `session` (the store first, so a
    /// label is never only in a cache), and one call of `tool`, at `now_ms`. `expires_at`
    /// (seconds) bounds how long Redis keeps them.
    pub async fn record(
        &self,
        shared: Option<&Counters>,
        session: &str,
        labels: Vec<String>,
        tool: Option<(&str, Tier)>,
        now_ms: i64,
        expires_at: i64,
    ) -> Result<(), ProxyError> {
        let new: Vec<String> = self.with_local(session, |l| {
            labels
                .into_iter()
                .filter(|label| !l.labels.contains(label))
                .collect()
        });
        if !new.is_empty() {
            let (id, labels) = (session.to_owned(), new.clone());
            self.db
                .call(move |db| db.add_labels(&id, &labels, now_ms))
                .await
                .map_err(store_unavailable)?;
        }
        let windows: Vec<String> = tool
            .map(|(name, tier)| vec![tool_key(name), tier_key(tier)])
            .unwrap_or_default();
        match shared {
            Some(shared) if !new.is_empty() || !windows.is_empty() => {
                let names: Vec<&str> = windows.iter().map(String::as_str).collect();
                let ttl = Duration::from_millis(
                    u64::try_from(expires_at.saturating_mul(1000) - now_ms).unwrap_or(1),
                );
                shared.remember(session, &new, &names, now_ms, ttl).await?;
            }
            _ => {}
        }
        self.with_local(session, |l| {
            l.labels.extend(new);
            if shared.is_none() {
                for window in windows {
                    let calls = l.calls.entry(window).or_default();
                    calls.push_back(now_ms);
                    trim(calls, now_ms);
                }
            }
        });
        Ok(())
    }

    /// Give the child session `child` the labels its parent `parent` has now.
    pub async fn inherit(&self, parent: &str, child: &str) -> Result<(), ProxyError> {
        // The parent's labels this replica knows of that the store may not (none, as they
        // are stored first; but a parent loaded here is read from here).
        self.load(parent).await?;
        let known: Vec<String> = self.with_local(parent, |l| l.labels.iter().cloned().collect());
        let (parent, id) = (parent.to_owned(), child.to_owned());
        let now = crate::store::now_ms();
        self.db
            .call(move |db| {
                db.inherit_labels(&parent, &id, now)?;
                db.add_labels(&id, &known, now)
            })
            .await
            .map_err(store_unavailable)?;
        Ok(())
    }

    /// A session's labels (from the store: every replica's) and recent calls.
    pub async fn show(
        &self,
        shared: Option<&Counters>,
        session: &str,
        now_ms: i64,
    ) -> Result<Shown, ProxyError> {
        let labels = self.stored(session).await?;
        let recent = match shared {
            Some(shared) => shared
                .recent_windows(session, &WINDOWS, now_ms)
                .await?
                .into_iter()
                .map(|(window, counts)| {
                    let counts = RecentCounts {
                        ten_minutes: counts.first().copied().unwrap_or_default(),
                        hour: counts.get(1).copied().unwrap_or_default(),
                    };
                    (window, counts)
                })
                .filter(|(_, c)| c.hour > 0)
                .collect(),
            None => self.with_local(session, |l| {
                l.calls
                    .iter_mut()
                    .map(|(window, calls)| {
                        let [ten_minutes, hour] = count(Some(calls), now_ms)[..] else {
                            unreachable!("two windows")
                        };
                        (window.clone(), RecentCounts { ten_minutes, hour })
                    })
                    .filter(|(_, c)| c.hour > 0)
                    .collect()
            }),
        };
        Ok(Shown { labels, recent })
    }

    /// Drop what this replica kept of an ended session (the store keeps its labels).
    pub fn forget(&self, session: &str) {
        if let Ok(mut local) = self.local.lock() {
            local.remove(session);
        }
    }
}

/// Drop the calls older than the longest window.
fn trim(calls: &mut VecDeque<i64>, now_ms: i64) {
    let oldest = now_ms - window_ms(WINDOWS[1]);
    while calls.front().is_some_and(|t| *t <= oldest) {
        calls.pop_front();
    }
}

fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX)
}

/// The calls newer than each window before `now_ms`.
fn count(calls: Option<&mut VecDeque<i64>>, now_ms: i64) -> Vec<i64> {
    let Some(calls) = calls else {
        return vec![0; WINDOWS.len()];
    };
    trim(calls, now_ms);
    WINDOWS
        .iter()
        .map(|w| {
            let since = now_ms - window_ms(*w);
            let older = calls.partition_point(|t| *t <= since);
            i64::try_from(calls.len() - older).unwrap_or(i64::MAX)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_the_calls_newer_than_their_length() {
        let min = 60_000;
        let now = 10 * 3_600_000;
        let mut calls: VecDeque<i64> = [
            now - 61 * min,
            now - 60 * min,
            now - 59 * min,
            now - 10 * min,
            now - 9 * min,
            now,
        ]
        .into();
        // An hour ago exactly is out of the hour; ten minutes ago exactly out of ten minutes.
        assert_eq!(count(Some(&mut calls), now), [2, 4]);
        assert_eq!(calls.len(), 4, "older than an hour is dropped");
        assert_eq!(count(None, now), [0, 0]);
        assert_eq!(count(Some(&mut calls), now + 59 * min), [0, 1]);
        assert_eq!(count(Some(&mut calls), now + 60 * min), [0, 0]);
    }
}
