//! Every secret this process has injected, and the one [`Scrubber`] over all of them that
//! every response goes through.
//!
//! Why every session's answers are scrubbed of every session's secrets, not only of their
//! own: an upstream that stored what it was sent (it logs the headers it receives, keeps a
//! request for replay) serves it to whoever asks, through any route or hostname. A session
//! that never fetched a credential — or another agent's session — would read it in clear
//! from an unbound host. So a secret is known from the moment it is first injected, before
//! the request that carries it is forwarded, until its credential ends:
//! - a value with an end ([`ostiary_broker::Credential::expires_at`]: leases, transit JWTs,
//!   certificates) is kept until then — a teardown revokes a lease, but a revocation can
//!   fail, and a JWT or certificate cannot be revoked at all;
//! - a value without one (`file`, `vault_kv`: the same for every session) for as long as
//!   the process runs — it outlives any session that used it. It outlives the process too,
//!   and is what every replica injects: so these are learned at start-up (and, while Vault
//!   cannot be read, by the reaper until it can), before anything was injected here —
//!   what a process before a restart or another replica left upstream comes back
//!   redacted ([`KnownSecrets::learn_lasting`]).
//!
//! Compiling a scrubber costs far more per secret the more secrets it holds at once (every
//! spelling of every form is one expression), so the set is kept in *shards*
//! ([`Scrubber::join`]): a request that brings values not known yet compiles a shard of
//! just those, before it is forwarded — what one session's first request always paid —
//! and the reaper ([`KnownSecrets::compact`], off the request path) merges small shards into
//! shards of up to [`SHARD_VALUES`] and drops values that ended. A request reads the joined
//! scrubber with one shared lock and clones an `Arc`. The set is per process: of the
//! secrets minted per session (leases, JWTs, certificates), a replica knows those it
//! injected itself (docs/credentials.md says what that leaves).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use base64::Engine;
use ostiary_broker::{Held, Injection, Material, Secret};

use crate::scrub::Scrubber;

/// The most values [`KnownSecrets::compact`] puts in one shard. A response is scanned once
/// per shard, and past a few secrets a shard's scan no longer gets faster with fewer of
/// them (1 MiB, no match: 1 secret 0.14 ms; 64 as one shard 3.0 ms, as 8 shards of 8
/// 10.7 ms — `benches/benches/scrub.rs`); compiling 64 takes ~0.23 s, off the request path.
pub const SHARD_VALUES: usize = 64;

/// The known secrets and their scrubber.
#[derive(Debug, Default)]
pub struct KnownSecrets {
    /// Read by every request: the scrubber (`None` while nothing was injected) and the
    /// credentials it covers.
    current: RwLock<Current>,
    /// Taken to add values and to swap compacted shards in: never held while a request
    /// only reads.
    learning: Mutex<Values>,
}

#[derive(Debug, Default, Clone)]
struct Current {
    scrubber: Option<Scrubber>,
    /// [`Held::id`] of each credential whose values are in `scrubber`, with when the
    /// broker stops handing it out: a request checks its own credentials against this.
    covered: Arc<HashMap<u64, Instant>>,
}

/// Each known value and when it ends (`None`: no known end), and the shards over them.
#[derive(Debug, Default)]
struct Values {
    ends: HashMap<Secret, Option<SystemTime>>,
    shards: Vec<Shard>,
}

/// One compiled shard and the values it covers.
#[derive(Debug, Clone)]
struct Shard {
    values: Vec<Secret>,
    scrubber: Scrubber,
}

impl Shard {
    fn new(values: Vec<Secret>) -> Self {
        let scrubber = Scrubber::new(values.iter().map(Secret::expose));
        Shard { values, scrubber }
    }
}

impl KnownSecrets {
    /// The scrubber over every known secret; `None` while none was ever injected.
    pub fn scrubber(&self) -> Option<Scrubber> {
        self.current
            .read()
            .expect("known secrets poisoned")
            .scrubber
            .clone()
    }

    /// The scrubber, once the values of `held` (about to be injected) are among those it
    /// covers: a shard of those it lacks is compiled first. Called before the request that
    /// carries them is forwarded, so no upstream holds a secret the scrubber does not know.
    pub fn learn(&self, held: &[Arc<Held>]) -> Option<Scrubber> {
        {
            let current = self.current.read().expect("known secrets poisoned");
            if held.iter().all(|h| current.covered.contains_key(&h.id)) {
                return current.scrubber.clone();
            }
        }
        let ids: Vec<(u64, Instant)> = held.iter().map(|h| (h.id, h.cache_until())).collect();
        let values = held
            .iter()
            .flat_map(|h| {
                let ends = h.credential.expires_at;
                values_of(h).into_iter().map(move |v| (v, ends))
            })
            .collect();
        self.add(&ids, values)
    }

    /// [`KnownSecrets::learn`] once the values are read off the credentials: `ids` are the
    /// credentials' (with when the broker lets go of them), `values` what they carry.
    fn add(
        &self,
        ids: &[(u64, Instant)],
        values: Vec<(Secret, Option<SystemTime>)>,
    ) -> Option<Scrubber> {
        let mut known = self.learning.lock().expect("known secrets poisoned");
        // Another request may have added them while this one waited.
        let covered = self
            .current
            .read()
            .expect("known secrets poisoned")
            .covered
            .clone();
        if ids.iter().all(|(id, _)| covered.contains_key(id)) {
            return self.scrubber();
        }
        let mut added = Vec::new();
        for (value, ends) in values {
            if known.extend(value.clone(), ends) && !added.contains(&value) {
                added.push(value);
            }
        }
        let grown = !added.is_empty();
        if grown {
            known.shards.push(Shard::new(added));
        }
        let now = Instant::now();
        let mut covered: HashMap<u64, Instant> = covered
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(id, until)| (*id, *until))
            .collect();
        covered.extend(ids.iter().copied());
        let mut current = self.current.write().expect("known secrets poisoned");
        current.covered = Arc::new(covered);
        if grown {
            current.scrubber = joined(&known);
        }
        current.scrubber.clone()
    }

    /// Learn `values` of credentials that outlive any process (`file`, `vault_kv`: the
    /// value one process or replica injected is the value every other one reads), kept for
    /// the process's life; whether any was new. Called at start-up, so that what an earlier
    /// process or another replica left upstream is redacted before this one injected it.
    pub fn learn_lasting(&self, values: Vec<Secret>) -> bool {
        let mut known = self.learning.lock().expect("known secrets poisoned");
        let mut added = Vec::new();
        for value in values {
            let new = known.extend(value.clone(), None);
            // A value learned with an end lasts now.
            known.ends.insert(value.clone(), None);
            if new && !added.contains(&value) {
                added.push(value);
            }
        }
        if added.is_empty() {
            return false;
        }
        known.shards.push(Shard::new(added));
        let scrubber = joined(&known);
        self.current
            .write()
            .expect("known secrets poisoned")
            .scrubber = scrubber;
        true
    }

    /// Merge the shards of fewer than [`SHARD_VALUES`] values, and rebuild those holding
    /// values that ended without them. Compiles outside the lock, so requests that learn
    /// meanwhile are not held up; blocking (the reaper runs it off the runtime's workers).
    pub fn compact(&self) {
        let (picked, live) = {
            let mut values = self.learning.lock().expect("known secrets poisoned");
            values.prune(SystemTime::now());
            let ended = |shard: &Shard| shard.values.iter().any(|v| !values.ends.contains_key(v));
            let picked: Vec<Shard> = values
                .shards
                .iter()
                .filter(|s| s.values.len() < SHARD_VALUES || ended(s))
                .cloned()
                .collect();
            if picked.len() < 2 && !picked.iter().any(ended) {
                return;
            }
            let mut live: Vec<Secret> = Vec::new();
            for value in picked.iter().flat_map(|s| &s.values) {
                if values.ends.contains_key(value) && !live.contains(value) {
                    live.push(value.clone());
                }
            }
            (picked, live)
        };
        let rebuilt: Vec<Shard> = live
            .chunks(SHARD_VALUES)
            .map(|chunk| Shard::new(chunk.to_vec()))
            .collect();
        let mut values = self.learning.lock().expect("known secrets poisoned");
        // Only learning adds shards (at the end) and only this removes them, so the picked
        // ones are all still there.
        values
            .shards
            .retain(|s| !picked.iter().any(|p| p.scrubber.same_as(&s.scrubber)));
        values.shards.splice(0..0, rebuilt);
        let scrubber = joined(&values);
        self.current
            .write()
            .expect("known secrets poisoned")
            .scrubber = scrubber;
    }

    /// Stop tracking credentials the broker dropped (teardown). Their values stay known:
    /// only their ends let go of them.
    pub fn forget(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let _learning = self.learning.lock().expect("known secrets poisoned");
        let mut current = self.current.write().expect("known secrets poisoned");
        if ids.iter().any(|id| current.covered.contains_key(id)) {
            let mut covered = (*current.covered).clone();
            for id in ids {
                covered.remove(id);
            }
            current.covered = Arc::new(covered);
        }
    }

    /// How many values are known (for tests and metrics; never the values).
    pub fn len(&self) -> usize {
        self.learning
            .lock()
            .expect("known secrets poisoned")
            .ends
            .len()
    }

    /// Whether no value is known yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many shards the scrubber joins.
    pub fn shards(&self) -> usize {
        self.learning
            .lock()
            .expect("known secrets poisoned")
            .shards
            .len()
    }
}

/// The one scrubber of all of `values`' shards; `None` when there are none.
fn joined(values: &Values) -> Option<Scrubber> {
    let parts: Vec<Scrubber> = values.shards.iter().map(|s| s.scrubber.clone()).collect();
    (!parts.is_empty()).then(|| Scrubber::join(&parts))
}

impl Values {
    /// Add `value`, or move its end later; whether the set of values changed.
    fn extend(&mut self, value: Secret, ends: Option<SystemTime>) -> bool {
        match self.ends.get_mut(&value) {
            None => {
                self.ends.insert(value, ends);
                true
            }
            Some(known) => {
                // Kept until the latest end any credential carrying it has.
                *known = match (*known, ends) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                false
            }
        }
    }

    /// Drop the values whose credentials have all ended.
    fn prune(&mut self, now: SystemTime) {
        self.ends.retain(|_, ends| ends.is_none_or(|at| at > now));
    }
}

/// Every value injected from `held` that must never come back: the secret values, and for
/// a Basic injection the `user:password` pair and its base64 (what the header carries is
/// neither part on its own).
pub fn values_of(held: &Held) -> Vec<Secret> {
    let secrets = held
        .credential
        .secret_values()
        .into_iter()
        .cloned()
        .collect();
    values_from(&held.binding.inject, &held.credential.material, secrets)
}

/// [`values_of`] a credential of `inject` whose material is `material` and whose secret
/// values are `secrets`.
pub fn values_from(inject: &Injection, material: &Material, secrets: Vec<Secret>) -> Vec<Secret> {
    let mut values: Vec<Secret> = secrets
        .into_iter()
        .filter(|s| !s.expose().is_empty())
        .collect();
    if let Some(pair) = pair_of(inject, material) {
        values.push(Secret::new(
            base64::engine::general_purpose::STANDARD.encode(pair.expose()),
        ));
        values.push(pair);
    }
    values
}

/// `user:password` for a Basic injection.
pub fn basic_pair(held: &Held) -> Option<Secret> {
    pair_of(&held.binding.inject, &held.credential.material)
}

fn pair_of(inject: &Injection, material: &Material) -> Option<Secret> {
    let Injection::Basic { username } = inject else {
        return None;
    };
    let (user, password) = match (material, username) {
        (Material::Basic { username, password }, None) => (username.expose().to_owned(), password),
        (Material::Basic { password, .. }, Some(user)) => (user.clone(), password),
        (Material::Token(token), Some(user)) => (user.clone(), token),
        (Material::Token(token), None) => (String::new(), token),
        (Material::ClientCert(_), _) => return None,
    };
    Some(Secret::new(format!("{user}:{}", password.expose())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn scrubs(scrubber: &Scrubber, secret: &str) -> bool {
        scrubber.scrub_bytes(secret.as_bytes()) != secret.as_bytes()
    }

    #[test]
    fn each_learning_adds_a_shard_of_what_is_new_and_compaction_merges_them() {
        let known = KnownSecrets::default();
        let until = Instant::now() + Duration::from_secs(600);
        let later = SystemTime::now() + Duration::from_secs(600);
        assert!(known.scrubber().is_none());
        // Credentials of one value each, then one carrying a value known already.
        for i in 0..(SHARD_VALUES as u64 + 6) {
            let value = Secret::new(format!("secret-value-{i:04}"));
            known.add(&[(i, until)], vec![(value, Some(later))]);
        }
        let before = known.scrubber().unwrap();
        let n = SHARD_VALUES + 6;
        assert_eq!((known.len(), known.shards()), (n, n));
        known.add(
            &[(99, until)],
            vec![(Secret::new("secret-value-0003"), None)],
        );
        assert_eq!(known.shards(), n, "nothing new: no shard");
        // Covered already: not even looked at.
        let same = known.add(&[(99, until)], vec![(Secret::new("new-but-unseen"), None)]);
        assert!(same.unwrap().same_as(&known.scrubber().unwrap()));
        assert_eq!(known.len(), n);

        known.compact();
        assert_eq!(known.shards(), 2, "one full shard and one of the rest");
        let after = known.scrubber().unwrap();
        for i in 0..n {
            let value = format!("secret-value-{i:04}");
            assert!(scrubs(&before, &value) && scrubs(&after, &value), "{value}");
        }
        // Compacting again changes nothing: one shard is short, and nothing ended.
        known.compact();
        assert!(known.scrubber().unwrap().same_as(&after));
    }

    #[test]
    fn compaction_drops_values_that_ended() {
        let known = KnownSecrets::default();
        let until = Instant::now() + Duration::from_secs(600);
        let past = SystemTime::now() - Duration::from_secs(1);
        known.add(
            &[(1, until)],
            vec![(Secret::new("lease-password-1"), Some(past))],
        );
        known.add(&[(2, until)], vec![(Secret::new("kv-value-forever"), None)]);
        assert!(scrubs(&known.scrubber().unwrap(), "lease-password-1"));
        known.compact();
        assert_eq!(known.len(), 1);
        let scrubber = known.scrubber().unwrap();
        assert!(!scrubs(&scrubber, "lease-password-1"), "ended");
        assert!(scrubs(&scrubber, "kv-value-forever"));
        assert_eq!(known.shards(), 1);
    }

    #[test]
    fn a_value_is_kept_until_the_latest_end_of_any_credential_carrying_it() {
        let mut values = Values::default();
        let now = SystemTime::now();
        let soon = now + Duration::from_secs(1);
        let later = now + Duration::from_secs(60);
        assert!(values.extend(Secret::new("a"), Some(soon)));
        assert!(
            !values.extend(Secret::new("a"), Some(later)),
            "known already"
        );
        assert!(values.extend(Secret::new("b"), Some(soon)));
        assert!(values.extend(Secret::new("c"), None));
        values.prune(soon + Duration::from_millis(1));
        let mut left: Vec<&str> = values.ends.keys().map(Secret::expose).collect();
        left.sort_unstable();
        assert_eq!(left, ["a", "c"], "b ended; a lives on; c has no end");
        // A value once without end stays so.
        assert!(!values.extend(Secret::new("c"), Some(soon)));
        values.prune(later + Duration::from_secs(1));
        assert_eq!(values.ends.len(), 1);
        assert!(values.ends.contains_key(&Secret::new("c")));
    }

    #[test]
    fn lasting_values_are_known_before_any_injection_and_never_end() {
        let known = KnownSecrets::default();
        assert!(known.scrubber().is_none());
        // One of them was injected already, with an end.
        let until = Instant::now() + Duration::from_secs(600);
        let soon = SystemTime::now() + Duration::from_millis(1);
        known.add(
            &[(1, until)],
            vec![(Secret::new("file-value-one"), Some(soon))],
        );
        let lasting = vec![Secret::new("file-value-one"), Secret::new("kv-value-two")];
        assert!(known.learn_lasting(lasting.clone()));
        assert!(!known.learn_lasting(lasting), "nothing new the second time");
        assert_eq!((known.len(), known.shards()), (2, 2));
        std::thread::sleep(Duration::from_millis(5));
        known.compact();
        let scrubber = known.scrubber().unwrap();
        assert!(scrubs(&scrubber, "file-value-one"), "lasting now");
        assert!(scrubs(&scrubber, "kv-value-two"));
        assert_eq!(known.len(), 2);
    }
}
