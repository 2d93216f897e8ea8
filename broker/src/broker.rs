//! The broker: the per-session credential cache and the ledger of leases to revoke.
//!
//! A credential is fetched once per (session, binding) — per host and tool too for
//! transit JWTs, whose claims name them — and cached until shortly before its lease or
//! expiry ends, never beyond. Concurrent requests of one session coalesce on one fetch, so
//! the first use costs one Vault round trip per session, not per request.
//!
//! Every lease is recorded against its session. Teardown drops the session's cache entries
//! first (so nothing is handed out again), then revokes the leases. A revoke that fails
//! puts the lease in quarantine: it is never handed out (it left the cache before the
//! revoke was tried) and the reaper retries it with backoff until Vault confirms.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::binding::Binding;
use crate::credential::{Credential, Lease, MintFor};
use crate::source::SourceSpec;
use crate::vault::VaultClient;
use crate::{BrokerError, FileSource, Secret};

/// Never hand out a credential closer than this to its end: the request still has to
/// reach the upstream and be checked there.
const MAX_MARGIN: Duration = Duration::from_secs(30);
/// Retry schedule of quarantined revocations.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
/// How long an ended session is remembered, to revoke what a racing fetch mints after it.
const ENDED_MEMORY: Duration = Duration::from_secs(24 * 3600);

/// Where the broker writes down the leases it owes a revocation, so that a restart does
/// not forget them: the process that fetched a credential held it in memory only, so after
/// a restart nothing can use it any more and it is revoked at once ([`Broker::adopt`]).
pub trait LeaseJournal: Send + Sync + std::fmt::Debug {
    /// A lease was fetched for `session`.
    fn owed(&self, session: &str, owed: &OwedLease);
    /// The lease was revoked (or found already gone): nothing is owed any more.
    fn settled(&self, lease_id: &str);
}

/// A credential as handed to the proxy: what it is, for which binding, and until when.
#[derive(Debug)]
pub struct Held {
    /// Unique per fetched credential, for what is keyed on it (the scrubber's coverage, mTLS
    /// clients).
    pub id: u64,
    pub binding: Arc<Binding>,
    pub credential: Credential,
    /// When the cache lets go of it.
    cache_until: Instant,
}

impl Held {
    /// Whether this may still be used at `now`.
    pub fn usable(&self, now: Instant) -> bool {
        now < self.cache_until
    }

    /// When the broker stops handing it out (a fetch replaces it after that).
    pub fn cache_until(&self) -> Instant {
        self.cache_until
    }
}

/// Key of the cache. `target` is set only for sources minted per host and tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    session: Arc<str>,
    binding: Arc<str>,
    target: Option<(String, Option<String>)>,
}

/// A lease the broker still owes a revocation.
#[derive(Debug, Clone)]
pub struct OwedLease {
    pub binding: String,
    pub lease: Lease,
    pub expires_at: Option<SystemTime>,
}

/// A lease whose revocation failed, waiting for the next try.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub owed: OwedLease,
    pub session: String,
    pub attempts: u32,
    pub last_error: String,
    next_try: Instant,
}

/// What a teardown or reap did, for audit and metrics. Names and lease ids only.
#[derive(Debug, Default, Clone)]
pub struct Revoked {
    /// `(binding, lease id)` revoked.
    pub revoked: Vec<(String, String)>,
    /// `(binding, lease id, error)` that failed and are quarantined.
    pub quarantined: Vec<(String, String, String)>,
    /// Ids of the cached credentials dropped ([`Held::id`]), so that what callers derived
    /// from them (clients holding a certificate key) goes too.
    pub dropped: Vec<u64>,
}

#[derive(Debug, Default)]
struct SessionLedger {
    keys: Vec<Key>,
    leases: Vec<OwedLease>,
}

/// The credential broker.
pub struct Broker {
    bindings: Vec<Arc<Binding>>,
    file: Option<PathBuf>,
    /// Set once logged in; empty while Vault has not been reached yet (a broker made with
    /// [`Broker::awaiting_vault`] serves `file` sources meanwhile and refuses Vault ones).
    vault: std::sync::OnceLock<Arc<VaultClient>>,
    vault_expected: bool,
    cache: moka::future::Cache<Key, Arc<Held>>,
    ledger: Mutex<HashMap<Arc<str>, SessionLedger>>,
    quarantine: Mutex<Vec<Quarantined>>,
    ended: moka::sync::Cache<Arc<str>, ()>,
    journal: Option<Arc<dyn LeaseJournal>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("bindings", &self.bindings.len())
            .field("cached", &self.cache.entry_count())
            .field("vault", &self.vault.get().is_some())
            .finish_non_exhaustive()
    }
}

struct ExpireAtHeld;

impl moka::Expiry<Key, Arc<Held>> for ExpireAtHeld {
    fn expire_after_create(&self, _: &Key, held: &Arc<Held>, now: Instant) -> Option<Duration> {
        Some(held.cache_until.saturating_duration_since(now))
    }
}

impl Broker {
    /// A broker over validated bindings. `file` is the file backend's path; `vault` the
    /// logged-in client when any binding needs it.
    pub fn new(
        bindings: Vec<Binding>,
        file: Option<PathBuf>,
        vault: Option<Arc<VaultClient>>,
    ) -> Result<Self, BrokerError> {
        let expected = vault.is_some();
        let broker = Self::build(bindings, file, expected)?;
        if let Some(vault) = vault {
            broker.set_vault(vault);
        }
        Ok(broker)
    }

    /// A broker whose Vault client arrives later ([`Broker::set_vault`]): Ostiary starts
    /// and serves while Vault is down or sealed, answering `credential_unavailable` for
    /// Vault sources until it is logged in.
    pub fn awaiting_vault(
        bindings: Vec<Binding>,
        file: Option<PathBuf>,
    ) -> Result<Self, BrokerError> {
        Self::build(bindings, file, true)
    }

    /// Hand over the logged-in client; a second call is ignored.
    pub fn set_vault(&self, vault: Arc<VaultClient>) {
        let _ = self.vault.set(vault);
    }

    /// Whether Vault sources are configured but no client is logged in yet.
    pub fn awaits_vault(&self) -> bool {
        self.vault_expected && self.vault.get().is_none()
    }

    fn build(
        bindings: Vec<Binding>,
        file: Option<PathBuf>,
        vault_expected: bool,
    ) -> Result<Self, BrokerError> {
        for binding in &bindings {
            if binding.source.needs_vault() && !vault_expected {
                return Err(BrokerError::NoVault);
            }
        }
        Ok(Self {
            bindings: bindings.into_iter().map(Arc::new).collect(),
            file,
            vault: std::sync::OnceLock::new(),
            vault_expected,
            cache: moka::future::Cache::builder()
                .max_capacity(100_000)
                .expire_after(ExpireAtHeld)
                .build(),
            ledger: Mutex::new(HashMap::new()),
            quarantine: Mutex::new(Vec::new()),
            ended: moka::sync::Cache::builder()
                .max_capacity(1_000_000)
                .time_to_live(ENDED_MEMORY)
                .build(),
            journal: None,
        })
    }

    /// Write every lease to `journal` as it is fetched and settled.
    pub fn with_journal(mut self, journal: Arc<dyn LeaseJournal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Take over leases a previous process owed (read from the journal at start-up). No
    /// cache holds them any more, so they are revoked on the reaper's next pass, with the
    /// quarantine's retries if Vault refuses.
    pub fn adopt(&self, leftovers: Vec<(String, OwedLease)>) {
        let now = Instant::now();
        let mut q = self.quarantine.lock().expect("broker quarantine poisoned");
        for (session, owed) in leftovers {
            q.push(Quarantined {
                owed,
                session,
                attempts: 0,
                last_error: "left by a previous run".to_owned(),
                next_try: now,
            });
        }
    }

    /// Every binding.
    pub fn bindings(&self) -> &[Arc<Binding>] {
        &self.bindings
    }

    /// The bindings whose credential may be sent to `host`.
    pub fn for_host<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a Arc<Binding>> + 'a {
        self.bindings.iter().filter(move |b| b.allows_host(host))
    }

    /// The binding named `name`.
    pub fn binding(&self, name: &str) -> Option<&Arc<Binding>> {
        self.bindings.iter().find(|b| b.name == name)
    }

    /// The Vault client, if configured.
    pub fn vault(&self) -> Option<&Arc<VaultClient>> {
        self.vault.get()
    }

    /// The value of credential `name` for Ostiary's own use — a webhook's signing secret, an
    /// API trigger's token — read from its source now (the file backend or a Vault KV
    /// field), never cached, never tied to a session. Other sources mint per session and
    /// are refused.
    pub async fn static_secret(&self, name: &str) -> Result<Secret, BrokerError> {
        let binding = self
            .binding(name)
            .ok_or_else(|| BrokerError::UnknownCredential(name.to_owned()))?;
        match &binding.source {
            SourceSpec::File(entry) => {
                let path = self.file.as_ref().ok_or(BrokerError::NoFile)?;
                FileSource::load(path)?.get(entry)
            }
            SourceSpec::VaultKv(kv) => {
                let vault = self.vault.get().ok_or(BrokerError::VaultNotConnected)?;
                let credential = vault.read_kv(kv).await?;
                credential
                    .secret_values()
                    .first()
                    .map(|s| (*s).clone())
                    .ok_or_else(|| BrokerError::UnknownCredential(name.to_owned()))
            }
            other => Err(BrokerError::NotStatic {
                name: name.to_owned(),
                kind: other.kind(),
            }),
        }
    }

    /// The credential of `binding` for `who`: cached, or fetched once for all concurrent
    /// askers of the session. The second value says whether this call fetched it.
    pub async fn credential(
        &self,
        binding: &Arc<Binding>,
        who: &MintFor<'_>,
    ) -> Result<(Arc<Held>, bool), Arc<BrokerError>> {
        let session: Arc<str> = Arc::from(who.session);
        if self.ended.contains_key(&session) {
            return Err(Arc::new(BrokerError::SessionEnded));
        }
        let key = Key {
            session: session.clone(),
            binding: Arc::from(binding.name.as_str()),
            target: binding
                .source
                .per_request_target()
                .then(|| (who.host.to_owned(), who.tool.map(str::to_owned))),
        };
        let mut fetched = false;
        // A hit first; the fetch, boxed, only on a miss: it runs once per session and binding,
        // and its future (Vault's client's) would otherwise be part of every injecting
        // request's, or be boxed — allocated and copied — for each of them.
        let entry = match self.cache.get(&key).await {
            Some(entry) => entry,
            None => {
                self.cache
                    .try_get_with(
                        key.clone(),
                        Box::pin(async {
                            fetched = true;
                            self.fetch(binding, who, key.clone()).await.map(Arc::new)
                        }),
                    )
                    .await?
            }
        };
        // moka expires entries lazily; never use one past its time.
        if !entry.usable(Instant::now()) {
            self.cache.invalidate(&key).await;
            return Box::pin(self.credential(binding, who)).await;
        }
        Ok((entry, fetched))
    }

    async fn fetch(
        &self,
        binding: &Arc<Binding>,
        who: &MintFor<'_>,
        key: Key,
    ) -> Result<Held, BrokerError> {
        let credential = match &binding.source {
            SourceSpec::File(name) => {
                // Read at each fetch (once per session and TTL), so an edited file is seen
                // without a restart.
                let path = self.file.as_ref().ok_or(BrokerError::NoFile)?;
                Credential::token(FileSource::load(path)?.get(name)?)
            }
            spec => {
                let vault = self.vault.get().ok_or(BrokerError::VaultNotConnected)?;
                vault.mint(spec, who).await?
            }
        };
        let now = Instant::now();
        let lifetime = credential
            .remaining(SystemTime::now())
            .unwrap_or(binding.ttl);
        let margin = (lifetime / 10).min(MAX_MARGIN);
        let cache_for = match credential.expires_at {
            Some(_) => lifetime.saturating_sub(margin),
            None => binding.ttl,
        };
        let held = Held {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            binding: binding.clone(),
            cache_until: now + cache_for,
            credential,
        };
        // Record the lease under the ledger lock, checking for a teardown that ran while
        // this fetch was in flight: its lease must not escape revocation.
        let owed = held.credential.lease.clone().map(|lease| OwedLease {
            binding: binding.name.clone(),
            lease,
            expires_at: held.credential.expires_at,
        });
        let ended = {
            let mut ledger = self.ledger.lock().expect("broker ledger poisoned");
            let ended = self.ended.contains_key(&key.session);
            if !ended {
                let entry = ledger.entry(key.session.clone()).or_default();
                entry.keys.push(key.clone());
                entry.leases.extend(owed.clone());
                if let (Some(journal), Some(owed)) = (&self.journal, &owed) {
                    journal.owed(&key.session, owed);
                }
            }
            ended
        };
        if ended {
            if let Some(owed) = owed {
                self.revoke_or_quarantine(&key.session, owed, &mut Revoked::default())
                    .await;
            }
            return Err(BrokerError::SessionEnded);
        }
        if held.cache_until <= now {
            return Err(BrokerError::Expired {
                credential: binding.name.clone(),
            });
        }
        Ok(held)
    }

    /// Teardown of a session: drop its cached credentials, revoke its leases (failures are
    /// quarantined and retried by [`Broker::reap`]). Idempotent.
    pub async fn end_session(&self, session: &str) -> Revoked {
        let session: Arc<str> = Arc::from(session);
        let ledger = {
            let mut ledger = self.ledger.lock().expect("broker ledger poisoned");
            self.ended.insert(session.clone(), ());
            ledger.remove(&session).unwrap_or_default()
        };
        let mut report = Revoked::default();
        for key in &ledger.keys {
            if let Some(held) = self.cache.remove(key).await {
                report.dropped.push(held.id);
            }
        }
        for owed in ledger.leases {
            self.revoke_or_quarantine(&session, owed, &mut report).await;
        }
        report
    }

    async fn revoke_or_quarantine(&self, session: &str, owed: OwedLease, report: &mut Revoked) {
        match self.revoke(&owed.lease).await {
            Ok(()) => report
                .revoked
                .push((owed.binding.clone(), owed.lease.id.clone())),
            Err(e) => {
                report.quarantined.push((
                    owed.binding.clone(),
                    owed.lease.id.clone(),
                    e.to_string(),
                ));
                self.quarantine
                    .lock()
                    .expect("broker quarantine poisoned")
                    .push(Quarantined {
                        owed,
                        session: session.to_owned(),
                        attempts: 1,
                        last_error: e.to_string(),
                        next_try: Instant::now() + RETRY_FIRST,
                    });
            }
        }
    }

    async fn revoke(&self, lease: &Lease) -> Result<(), BrokerError> {
        let vault = self.vault.get().ok_or(BrokerError::VaultNotConnected)?;
        vault.revoke(lease).await?;
        if let Some(journal) = &self.journal {
            journal.settled(&lease.id);
        }
        Ok(())
    }

    /// One pass of the reaper: revoke leases that reached their end (Vault ends them too,
    /// but a revoke makes it certain and idempotent), and retry quarantined revocations
    /// that are due.
    pub async fn reap(&self) -> Revoked {
        let now = SystemTime::now();
        let expired: Vec<(Arc<str>, OwedLease)> = {
            let mut ledger = self.ledger.lock().expect("broker ledger poisoned");
            let mut out = Vec::new();
            for (session, entry) in ledger.iter_mut() {
                entry.leases.retain(|owed| {
                    let done = owed.expires_at.is_some_and(|at| at <= now);
                    if done {
                        out.push((session.clone(), owed.clone()));
                    }
                    !done
                });
            }
            ledger.retain(|_, entry| !entry.leases.is_empty() || !entry.keys.is_empty());
            out
        };
        let mut report = Revoked::default();
        for (session, owed) in expired {
            self.revoke_or_quarantine(&session, owed, &mut report).await;
        }
        let due: Vec<Quarantined> = {
            let mut q = self.quarantine.lock().expect("broker quarantine poisoned");
            let at = Instant::now();
            let (due, wait): (Vec<_>, Vec<_>) = q.drain(..).partition(|e| e.next_try <= at);
            *q = wait;
            due
        };
        for mut entry in due {
            match self.revoke(&entry.owed.lease).await {
                Ok(()) => report
                    .revoked
                    .push((entry.owed.binding.clone(), entry.owed.lease.id.clone())),
                Err(e) => {
                    entry.attempts += 1;
                    entry.last_error = e.to_string();
                    let backoff = RETRY_FIRST
                        .saturating_mul(1 << entry.attempts.min(6))
                        .min(RETRY_MAX);
                    entry.next_try = Instant::now() + backoff;
                    self.quarantine
                        .lock()
                        .expect("broker quarantine poisoned")
                        .push(entry);
                }
            }
        }
        report
    }

    /// Leases waiting for a successful revoke.
    pub fn quarantined(&self) -> Vec<Quarantined> {
        self.quarantine
            .lock()
            .expect("broker quarantine poisoned")
            .clone()
    }

    /// Leases currently held for live sessions.
    pub fn live_leases(&self) -> usize {
        self.ledger
            .lock()
            .expect("broker ledger poisoned")
            .values()
            .map(|e| e.leases.len())
            .sum()
    }

    /// The credentials the broker holds for `session` (while cached). Looks up the
    /// session's own cache keys in its ledger, so the cost follows what this session holds,
    /// not how many sessions there are.
    pub async fn holdings(&self, session: &str) -> Vec<Arc<Held>> {
        let mut keys = {
            let ledger = self.ledger.lock().expect("broker ledger poisoned");
            match ledger.get(session) {
                Some(entry) => entry.keys.clone(),
                None => return Vec::new(),
            }
        };
        // A credential fetched again after its cache entry expired is listed twice.
        keys.sort_by(|a, b| (&a.binding, &a.target).cmp(&(&b.binding, &b.target)));
        keys.dedup();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            // Also a credential past its cache margin: the upstream still accepts it.
            if let Some(held) = self.cache.get(&key).await {
                out.push(held);
            }
        }
        out
    }

    /// The secret values the broker holds for `session` (binding name, value): what an
    /// outbound scan must never see leave.
    pub async fn secrets_of(&self, session: &str) -> Vec<(String, Secret)> {
        let held = self.holdings(session).await;
        held.iter()
            .flat_map(|held| {
                held.credential
                    .secret_values()
                    .into_iter()
                    .map(|value| (held.binding.name.clone(), value.clone()))
            })
            .collect()
    }

    /// Cached credentials (approximate, as moka counts).
    pub fn cached(&self) -> u64 {
        self.cache.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_binding(name: &str, ttl: Duration) -> Binding {
        let mut b: Binding = toml::from_str(&format!(
            "name = \"{name}\"\nsource = {{ file = \"{name}\" }}\nhosts = [\"api.example.com\"]\ninject = {{ header = \"Authorization\", value = \"Bearer {{secret}}\" }}"
        ))
        .unwrap();
        b.ttl = ttl;
        b
    }

    fn who(session: &str) -> MintFor<'_> {
        MintFor {
            session,
            agent: "a",
            tenant: "default",
            host: "api.example.com",
            tool: None,
        }
    }

    #[tokio::test]
    async fn file_credentials_are_cached_per_session_and_dropped_at_teardown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        std::fs::write(&path, "gh = \"one\"\n").unwrap();
        let broker = Broker::new(
            vec![file_binding("gh", Duration::from_secs(60))],
            Some(path.clone()),
            None,
        )
        .unwrap();
        let binding = broker.binding("gh").unwrap().clone();
        let (held, fetched) = broker.credential(&binding, &who("s1")).await.unwrap();
        assert!(fetched);
        assert_eq!(held.credential.secret_values()[0].expose(), "one");
        std::fs::write(&path, "gh = \"two\"\n").unwrap();
        let (held, fetched) = broker.credential(&binding, &who("s1")).await.unwrap();
        assert!(!fetched, "second use of a session is served from the cache");
        assert_eq!(held.credential.secret_values()[0].expose(), "one");
        let (held, _) = broker.credential(&binding, &who("s2")).await.unwrap();
        assert_eq!(held.credential.secret_values()[0].expose(), "two");

        broker.end_session("s1").await;
        let err = broker.credential(&binding, &who("s1")).await.unwrap_err();
        assert!(matches!(*err, BrokerError::SessionEnded));
        broker.end_session("s1").await;
    }

    #[tokio::test]
    async fn the_holdings_are_what_the_session_fetched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        std::fs::write(&path, "gh = \"one\"\nnpm = \"two\"\n").unwrap();
        let broker = Broker::new(
            vec![
                file_binding("gh", Duration::from_secs(60)),
                file_binding("npm", Duration::from_secs(60)),
            ],
            Some(path),
            None,
        )
        .unwrap();
        let (gh, npm) = (
            broker.binding("gh").unwrap().clone(),
            broker.binding("npm").unwrap().clone(),
        );
        assert!(broker.holdings("s").await.is_empty(), "nothing held yet");
        broker.credential(&gh, &who("s")).await.unwrap();
        assert_eq!(broker.holdings("s").await.len(), 1);
        // A cache hit changes nothing; another session's fetch neither.
        broker.credential(&gh, &who("s")).await.unwrap();
        broker.credential(&gh, &who("other")).await.unwrap();
        assert_eq!(broker.holdings("s").await.len(), 1);
        broker.credential(&npm, &who("s")).await.unwrap();
        let held = broker.holdings("s").await;
        let mut names: Vec<_> = held.iter().map(|h| h.binding.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["gh", "npm"]);
        assert_eq!(broker.secrets_of("s").await.len(), 2);
        broker.end_session("s").await;
        assert!(
            broker.holdings("s").await.is_empty(),
            "teardown forgets it all"
        );
    }

    #[tokio::test]
    async fn a_credential_is_not_used_past_its_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        std::fs::write(&path, "gh = \"one\"\n").unwrap();
        let broker = Broker::new(
            vec![file_binding("gh", Duration::from_millis(50))],
            Some(path.clone()),
            None,
        )
        .unwrap();
        let binding = broker.binding("gh").unwrap().clone();
        broker.credential(&binding, &who("s")).await.unwrap();
        std::fs::write(&path, "gh = \"two\"\n").unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        let (held, fetched) = broker.credential(&binding, &who("s")).await.unwrap();
        assert!(fetched);
        assert_eq!(held.credential.secret_values()[0].expose(), "two");
    }

    #[tokio::test]
    async fn concurrent_first_uses_fetch_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        std::fs::write(&path, "gh = \"one\"\n").unwrap();
        let broker = Arc::new(
            Broker::new(
                vec![file_binding("gh", Duration::from_secs(60))],
                Some(path),
                None,
            )
            .unwrap(),
        );
        let binding = broker.binding("gh").unwrap().clone();
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let broker = broker.clone();
                let binding = binding.clone();
                tokio::spawn(async move { broker.credential(&binding, &who("s")).await.unwrap().1 })
            })
            .collect();
        let mut fetches = 0;
        for t in tasks {
            fetches += usize::from(t.await.unwrap());
        }
        assert_eq!(fetches, 1);
    }

    #[test]
    fn vault_sources_need_vault() {
        let b: Binding = toml::from_str(
            "name = \"x\"\nsource = { vault_kv = { path = \"p\", field = \"f\" } }\nhosts = [\"h\"]\ninject = { query = \"k\" }",
        )
        .unwrap();
        assert!(matches!(
            Broker::new(vec![b], None, None),
            Err(BrokerError::NoVault)
        ));
    }
}
