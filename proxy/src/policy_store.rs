//! The live policy set and its hot reload (docs/design.md §8: the policy directory is
//! hot-reloaded).
//!
//! Requests take the current set once ([`PolicyStore::current`], an `Arc`) and are decided
//! under it to the end, so a reload never changes the rules under a request already running:
//! the swap replaces the `Arc`, and the old set lives until its last request drops it.
//!
//! Three triggers — a change in the policy directory ([`watch`]), `SIGHUP` (`ostiary serve`)
//! and `POST /v1/policy/reload` — all end in [`reload`], which builds the new set with
//! [`build`], the one function that turns configuration into a policy set (start-up,
//! `ostiary policy validate` and every reload use it; the tool catalog joins the set there).
//! A set that fails to build or validate is never swapped in: the last good one keeps
//! serving, and the failure is logged, counted and audited.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use ostiary_policies::{LoadError, PolicyEngine, Triggers};

use crate::audit::{AuditGuard, AuditSink};
use crate::check::Checks;
use crate::config::{self, DEFAULT_POLICY_DIR};
use crate::ids;
use crate::metrics::Metrics;
use crate::store::policy_versions::{PolicyVersionStore, Replaces, WentLive};
use crate::store::StoreError;

/// What a reload touches: the set it swaps, the checks that compile the new catalog's
/// schemas, and where the outcome is counted and recorded. Held by the control plane, the
/// directory watch and the `SIGHUP` handler.
#[derive(Debug, Clone)]
pub struct Reloader {
    pub policies: Arc<PolicyStore>,
    pub checks: Arc<Checks>,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
    /// The triggers, read again from the config file with each reload.
    pub triggers: Option<Arc<crate::runs::reload::TriggerReload>>,
}

/// Build a policy set from the `[policy]` config: every `*.cedar` file of `policy.dir`,
/// strictly validated — or the embedded library (policies and tool catalog) when `dir` is the
/// default and absent, so that `ostiary serve` works from any directory.
///
/// `triggers` are the config's (`[[trigger]]`): their payload schemas type
/// `Action::"trigger"`, so a policy reading a payload attribute no trigger declares does not
/// load.
pub fn build(policy: &config::Policy, triggers: &Triggers) -> Result<PolicyEngine, LoadError> {
    match source_of(policy) {
        Source::Dir(dir) => PolicyEngine::load_dir_with(dir, triggers),
        // The embedded policies together with the embedded catalog they are written against.
        Source::Embedded => PolicyEngine::embedded_with(triggers),
    }
}

/// Where a policy set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source<'a> {
    Dir(&'a Path),
    /// The copy compiled into the binary; it cannot change while the process runs, so it is
    /// never watched.
    Embedded,
}

fn source_of(policy: &config::Policy) -> Source<'_> {
    if policy.dir.as_os_str() == DEFAULT_POLICY_DIR && !policy.dir.exists() {
        Source::Embedded
    } else {
        Source::Dir(&policy.dir)
    }
}

/// What a successful reload swapped in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// Policies in the new set.
    pub policies: usize,
    /// The new set's generation (the set loaded at start-up is generation 1).
    pub generation: u64,
    /// The new set's content-addressed version (the same as the old one's when no input
    /// file changed).
    pub version: String,
}

/// Why an asynchronous reload did not produce a new set.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new set is invalid; the last good one keeps serving.
    #[error(transparent)]
    Invalid(#[from] LoadError),
    /// The blocking reload task did not finish (it panicked or the runtime is shutting down).
    #[error("policy reload did not complete: {0}")]
    Interrupted(#[from] tokio::task::JoinError),
}

/// What started a reload; logged with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `POST /v1/policy/reload`.
    Api,
    /// `SIGHUP` to `ostiary serve`.
    Signal,
    /// The directory watcher saw a change.
    Watch,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::Api => "api",
            Trigger::Signal => "sighup",
            Trigger::Watch => "watch",
        })
    }
}

/// What the policy directory looked like: each input file's name, mtime and length, or the
/// kind of error listing it. Compared, never interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot(Result<Vec<(String, Option<SystemTime>, u64)>, std::io::ErrorKind>);

impl Snapshot {
    /// The files [`build`] reads: the `*.cedar` files of `dir`, the catalog `tools.toml`, and
    /// `*.json` argument schemas the catalog may name.
    fn take(dir: &Path) -> Self {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => return Self(Err(e.kind())),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => return Self(Err(e.kind())),
            };
            let path = entry.path();
            let read_by_build = path.file_name().is_some_and(|n| n == "tools.toml")
                || path
                    .extension()
                    .is_some_and(|e| e == "cedar" || e == "json");
            if !read_by_build {
                continue;
            }
            // Follows symlinks, as loading does: a re-pointed link is a change.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.is_file() {
                let name = entry.file_name().to_string_lossy().into_owned();
                files.push((name, meta.modified().ok(), meta.len()));
            }
        }
        files.sort();
        Self(Ok(files))
    }
}

/// The current policy set, swapped atomically by reloads.
#[derive(Debug)]
pub struct PolicyStore {
    config: config::Policy,
    current: RwLock<Arc<PolicyEngine>>,
    /// Written only under the `current` write lock, so a reader sees a generation no older
    /// than the set it took before reading it.
    generation: AtomicU64,
    /// Serialises reloads (two concurrent ones could otherwise swap in the older read last)
    /// and holds the directory as the last reload found it, so that the watcher reloads once
    /// per change — also after a failed reload, which is retried only when the files change.
    last_seen: Mutex<Option<Snapshot>>,
    /// Where each set that goes live is recorded (`ostiary policy versions`), once the
    /// store is open ([`PolicyStore::record_history`]).
    history: OnceLock<Arc<dyn PolicyVersionStore>>,
    /// The config's triggers, which type `Action::"trigger"`; replaced when they are
    /// reloaded, just before the set is ([`PolicyStore::set_triggers`]).
    triggers: RwLock<Triggers>,
    /// The candidate set of `[policy] shadow_dir`, compared and never enforced.
    shadow: Option<Arc<crate::shadow::Shadow>>,
}

impl PolicyStore {
    /// Load the initial set (generation 1) for a config with `triggers`.
    pub fn open(config: config::Policy, triggers: Triggers) -> Result<Self, LoadError> {
        let seen = watched(&config).map(Snapshot::take);
        let engine = build(&config, &triggers)?;
        let shadow = config
            .shadow_dir
            .as_deref()
            .map(|dir| crate::shadow::Shadow::load(dir, &triggers).map(Arc::new))
            .transpose()?;
        Ok(Self {
            shadow,
            triggers: RwLock::new(triggers),
            config,
            current: RwLock::new(Arc::new(engine)),
            generation: AtomicU64::new(1),
            last_seen: Mutex::new(seen),
            history: OnceLock::new(),
        })
    }

    /// Record in `history` the set in force (the start-up's) and, from now on, every set a
    /// reload swaps in. `sole`: this process is the only one on its store (SQLite), so the
    /// set it served before it last stopped is replaced now; replicas sharing a store leave
    /// the others' sets alone. Blocking (a store call).
    pub fn record_history(
        &self,
        history: Arc<dyn PolicyVersionStore>,
        sole: bool,
    ) -> Result<(), StoreError> {
        // Under the reloads' lock, so that a reload racing start-up is recorded after it.
        let _serial = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let replaces = if sole {
            Replaces::AllOthers
        } else {
            Replaces::Nothing
        };
        went_live(&*history, &self.current(), replaces)?;
        let _ = self.history.set(history);
        Ok(())
    }

    /// Type `Action::"trigger"` by these triggers from the next reload on (the triggers were
    /// reloaded).
    pub fn set_triggers(&self, triggers: Triggers) {
        *self
            .triggers
            .write()
            .unwrap_or_else(PoisonError::into_inner) = triggers;
    }

    /// The config's triggers as they are now.
    fn triggers(&self) -> Triggers {
        self.triggers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The shadow set, when one is configured.
    pub fn shadow(&self) -> Option<&Arc<crate::shadow::Shadow>> {
        self.shadow.as_ref()
    }

    /// The set to decide a request under. Take it once per request.
    pub fn current(&self) -> Arc<PolicyEngine> {
        // Poisoning cannot leave a half-written value here (the guarded write is a single
        // assignment), so a poisoned lock still holds a good set.
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Where the sets that went live are recorded, once [`PolicyStore::record_history`] said.
    pub fn history(&self) -> Option<Arc<dyn PolicyVersionStore>> {
        self.history.get().cloned()
    }

    /// The generation of the current set: 1 at start-up, +1 per successful reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The directory the watcher polls; `None` for the embedded library.
    pub fn watched_dir(&self) -> Option<&Path> {
        watched(&self.config)
    }

    /// How often the watcher polls; zero turns it off.
    /// The configured policy directory (for log lines; it may be absent: embedded library).
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    pub fn watch_interval(&self) -> Duration {
        self.config.watch_interval
    }

    /// Build and validate the set anew and swap it in; on error the current set stays.
    /// Blocking (file reads, Cedar validation): call it off the async workers.
    pub fn reload(&self) -> Result<ReloadReport, LoadError> {
        let mut seen = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Taken before the files are read: an edit landing during the read then shows up as
        // a difference at the next poll, and is loaded again.
        *seen = self.watched_dir().map(Snapshot::take);
        let triggers = self.triggers();
        // The shadow set is read again with the enforced one; one that does not load keeps
        // the last (it decides nothing).
        if let Some(shadow) = &self.shadow {
            if let Err(e) = shadow.reload(&triggers) {
                tracing::error!(error = %e, dir = %shadow.dir().display(), "the shadow set does not load; the last one stays");
            }
        }
        let engine = Arc::new(build(&self.config, &triggers)?);
        Ok(self.swap_in(engine))
    }

    /// Make the shadow set the enforced one ([`crate::promote`]). Blocking.
    pub fn promote(&self) -> Result<ReloadReport, crate::promote::PromoteError> {
        use crate::promote::PromoteError;
        let shadow = self.shadow.as_ref().ok_or(PromoteError::NoShadow)?;
        let live = self
            .watched_dir()
            .ok_or_else(|| PromoteError::Embedded(self.config.dir.clone()))?;
        let mut seen = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let triggers = self.triggers();
        // Checked before anything is written: a shadow set that no longer loads is not
        // copied over a good one.
        PolicyEngine::load_dir_with(shadow.dir(), &triggers)?;
        crate::promote::copy_over(shadow.dir(), live)?;
        *seen = Some(Snapshot::take(live));
        let engine = Arc::new(build(&self.config, &triggers)?);
        Ok(self.swap_in(engine))
    }

    /// Swap `engine` in, under the reloads' lock; record it in the history.
    fn swap_in(&self, engine: Arc<PolicyEngine>) -> ReloadReport {
        let policies = engine.len();
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let replaced = std::mem::replace(&mut *current, engine.clone());
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        drop(current);
        // Still under `last_seen`, so sets are recorded in the order they went live. The set
        // is live whatever the store says: a failure to record it is logged, not undone.
        if let Some(history) = self.history.get() {
            let replaces = Replaces::Version(replaced.version().as_str());
            if let Err(e) = went_live(&**history, &engine, replaces) {
                tracing::error!(
                    error = %e,
                    version = %engine.version(),
                    "the policy set is live but could not be recorded in the version history"
                );
            }
        }
        ReloadReport {
            policies,
            generation,
            version: engine.version().to_string(),
        }
    }

    /// Whether the policy directory differs from what the last load read. Blocking (stats).
    pub fn changed_on_disk(&self) -> bool {
        let Some(dir) = self.watched_dir() else {
            return false;
        };
        let now = Snapshot::take(dir);
        let seen = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.as_ref() != Some(&now)
    }
}

/// Record that `engine` went live now, replacing `replaces`.
fn went_live(
    history: &dyn PolicyVersionStore,
    engine: &PolicyEngine,
    replaces: Replaces<'_>,
) -> Result<(), StoreError> {
    history.went_live(&WentLive {
        version: engine.version().as_str(),
        policies: i64::try_from(engine.len()).unwrap_or(i64::MAX),
        tools: i64::try_from(engine.catalog().len()).unwrap_or(i64::MAX),
        at_ms: crate::store::now_ms(),
        replaces,
    })
}

fn watched(config: &config::Policy) -> Option<&Path> {
    match source_of(config) {
        Source::Dir(dir) => Some(dir),
        Source::Embedded => None,
    }
}

/// Reload the set and record the outcome: a log line, the reload metrics and an audit record
/// of kind `policy`. Every trigger goes through here. Blocking; see [`reload`].
pub fn reload_recorded(reloader: &Reloader, trigger: Trigger) -> Result<ReloadReport, LoadError> {
    let request_id = ids::request_id();
    // Started first so that the record's duration is the reload's.
    let mut audit = AuditGuard::start(&reloader.audit, &reloader.metrics, &request_id, "policy");
    // The triggers first: a policy set that does not load does not keep the triggers from
    // being read again, nor the other way round.
    if let Some(triggers) = &reloader.triggers {
        reload_triggers(reloader, triggers, trigger);
    }
    let result = reloader.policies.reload();
    match &result {
        Ok(report) => {
            tracing::info!(
                %trigger,
                policies = report.policies,
                generation = report.generation,
                version = %report.version,
                dir = %reloader.policies.dir().display(),
                "policy set reloaded"
            );
            reloader.metrics.policy_reloaded(true, report.generation);
            // The new catalog's schemas are compiled now, not inside a request's budget.
            reloader
                .checks
                .prepare(reloader.policies.current().catalog());
            audit.update(|r| {
                r.reason = Some(format!(
                    "policy set reloaded: {} policies, version {}",
                    report.policies, report.version
                ));
                // The set this reload swapped in, even if another reload followed it at once.
                r.policy_version = Some(report.version.clone());
            });
            audit.event("allow", None);
        }
        Err(e) => {
            let generation = reloader.policies.generation();
            tracing::error!(
                %trigger,
                error = %e,
                generation,
                dir = %reloader.policies.dir().display(),
                "policy reload failed; the last good set stays in force"
            );
            reloader.metrics.policy_reloaded(false, generation);
            audit.update(|r| r.reason = Some(e.to_string()));
            audit.event("error", Some("policy_invalid"));
        }
    }
    result
}

/// Read the triggers again and record the outcome (a trigger that no longer compiles keeps
/// the ones in force, on record as a failure).
fn reload_triggers(
    reloader: &Reloader,
    triggers: &crate::runs::reload::TriggerReload,
    trigger: Trigger,
) {
    let request_id = ids::request_id();
    let mut audit = AuditGuard::start(&reloader.audit, &reloader.metrics, &request_id, "policy");
    match triggers.reload() {
        Ok(now) => {
            // The set about to be built types `Action::"trigger"` by them.
            reloader
                .policies
                .set_triggers(crate::runs::authorize::policy_triggers(&now));
            let n = now.len();
            tracing::info!(%trigger, triggers = n, "triggers reloaded");
            audit.update(|r| r.reason = Some(format!("triggers reloaded: {n} triggers")));
            audit.event("allow", None);
        }
        Err(e) => {
            tracing::error!(%trigger, error = %e, "trigger reload failed; the triggers in force stay");
            audit.update(|r| r.reason = Some(format!("triggers not reloaded: {e}")));
            audit.event("error", Some("config_invalid"));
        }
    }
}

/// [`reload_recorded`] on a blocking thread, for async callers (control API, signal handler).
pub async fn reload(reloader: Reloader, trigger: Trigger) -> Result<ReloadReport, ReloadError> {
    Ok(tokio::task::spawn_blocking(move || reload_recorded(&reloader, trigger)).await??)
}

/// Poll the policy directory every `watch_interval` and reload when it changed, until `stop`
/// resolves. Returns at once for the embedded library or a zero interval.
///
/// Polling rather than inotify: no extra crate, and it works the same on every file system
/// (network mounts, container volumes, editors that replace files by rename).
pub async fn watch(reloader: Reloader, stop: impl std::future::Future<Output = ()>) {
    let interval = reloader.policies.watch_interval();
    let Some(dir) = reloader.policies.watched_dir() else {
        return;
    };
    if interval.is_zero() {
        return;
    }
    tracing::debug!(dir = %dir.display(), ?interval, "watching the policy directory");
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {
                let reloader = reloader.clone();
                let polled = tokio::task::spawn_blocking(move || {
                    if reloader.policies.changed_on_disk() {
                        // The outcome is logged, counted and audited inside.
                        let _ = reload_recorded(&reloader, Trigger::Watch);
                    }
                })
                .await;
                if let Err(e) = polled {
                    tracing::error!(error = %e, "policy directory poll did not complete");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const ALLOW: &str = r#"
@id("allow-example")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"example.com");
"#;
    const TWO: &str = r#"
@id("allow-example")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"example.com");
@id("allow-other")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"other.example");
"#;

    fn store_in(dir: &Path, text: &str) -> PolicyStore {
        std::fs::write(dir.join("p.cedar"), text).unwrap();
        PolicyStore::open(
            config::Policy {
                dir: dir.to_owned(),
                watch_interval: Duration::from_millis(10),
                shadow_dir: None,
            },
            Triggers::default(),
        )
        .unwrap()
    }

    #[test]
    fn reload_swaps_the_set_and_counts_generations() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), ALLOW);
        assert_eq!(store.generation(), 1);
        let before = store.current();
        assert_eq!(before.len(), 1);

        std::fs::write(dir.path().join("p.cedar"), TWO).unwrap();
        let report = store.reload().unwrap();
        assert_eq!((report.policies, report.generation), (2, 2));
        assert_eq!(report.version, store.current().version().to_string());
        assert_ne!(report.version, before.version().to_string());
        assert_eq!(store.generation(), 2);
        assert_eq!(store.current().len(), 2);
        // A request holding the old set keeps it, unchanged.
        assert_eq!(before.len(), 1);
        assert!(!Arc::ptr_eq(&before, &store.current()));
    }

    #[test]
    fn every_set_that_goes_live_is_recorded_once_the_history_is_attached() {
        let dir = tempfile::tempdir().unwrap();
        let policies = tempfile::tempdir().unwrap();
        let store = store_in(policies.path(), ALLOW);
        let history = crate::store::sqlite::open(&dir.path().join("db"))
            .unwrap()
            .policy_versions;
        let v1 = store.current().version().to_string();
        store.record_history(history.clone(), true).unwrap();

        std::fs::write(policies.path().join("p.cedar"), TWO).unwrap();
        let v2 = store.reload().unwrap().version;
        assert_ne!(v1, v2);
        // A set that does not load never went live.
        std::fs::write(policies.path().join("p.cedar"), "nonsense").unwrap();
        assert!(store.reload().is_err());

        let rows = history.list(10).unwrap();
        let listed: Vec<(&str, bool)> = rows
            .iter()
            .map(|r| (r.version.as_str(), r.replaced_ms.is_some()))
            .collect();
        assert_eq!(listed, [(v2.as_str(), false), (v1.as_str(), true)]);
        assert_eq!((rows[0].policies, rows[1].policies), (2, 1));
        assert_eq!(rows[1].replaced_ms, Some(rows[0].first_live_ms));
    }

    #[test]
    fn an_invalid_set_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), ALLOW);
        let good = store.current();

        std::fs::write(
            dir.path().join("p.cedar"),
            "permit (principal, action, resource",
        )
        .unwrap();
        let err = store.reload().unwrap_err();
        assert!(matches!(err, LoadError::Parse { .. }), "{err}");
        assert!(err.to_string().starts_with("p.cedar:"), "{err}");

        // Parses, but fails strict validation (no such attribute).
        std::fs::write(
            dir.path().join("p.cedar"),
            "permit (principal, action == Ostiary::Action::\"http\", resource) when { context.nope };",
        )
        .unwrap();
        assert!(matches!(store.reload(), Err(LoadError::Validation(_))));

        std::fs::remove_file(dir.path().join("p.cedar")).unwrap();
        assert!(matches!(store.reload(), Err(LoadError::Empty(_))));

        assert!(Arc::ptr_eq(&good, &store.current()));
        assert_eq!(store.generation(), 1);
    }

    #[test]
    fn changes_on_disk_are_seen_once_per_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), ALLOW);
        assert!(!store.changed_on_disk(), "nothing changed since open");

        std::fs::write(dir.path().join("p.cedar"), TWO).unwrap();
        assert!(store.changed_on_disk());
        store.reload().unwrap();
        assert!(!store.changed_on_disk(), "the reload read this state");

        // A failed reload is not retried until the files change again.
        std::fs::write(dir.path().join("p.cedar"), "nonsense").unwrap();
        assert!(store.changed_on_disk());
        assert!(store.reload().is_err());
        assert!(!store.changed_on_disk());

        // Files other than *.cedar are not inputs of the set.
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert!(!store.changed_on_disk());
        std::fs::write(dir.path().join("q.cedar"), "").unwrap();
        assert!(store.changed_on_disk());
    }

    #[test]
    fn the_embedded_library_is_not_watched() {
        let policy = config::Policy {
            dir: PathBuf::from(DEFAULT_POLICY_DIR),
            watch_interval: Duration::from_secs(2),
            shadow_dir: None,
        };
        // Only meaningful where the default directory is absent (the crate's own directory).
        if policy.dir.exists() {
            return;
        }
        let store = PolicyStore::open(policy, Triggers::default()).unwrap();
        assert_eq!(store.watched_dir(), None);
        assert!(!store.changed_on_disk());
        assert_eq!(store.current().len(), build_embedded_len());
        // Reloading the embedded library rebuilds the same set.
        assert_eq!(store.reload().unwrap().generation, 2);
    }

    fn build_embedded_len() -> usize {
        build(
            &config::Policy {
                dir: PathBuf::from(DEFAULT_POLICY_DIR),
                watch_interval: Duration::ZERO,
                shadow_dir: None,
            },
            &Triggers::default(),
        )
        .unwrap()
        .len()
    }

    #[test]
    fn concurrent_readers_always_see_a_whole_set() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(store_in(dir.path(), ALLOW));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let generation = store.generation();
                        let len = store.current().len();
                        assert!(len == 1 || len == 2);
                        assert!(store.generation() >= generation);
                    }
                })
            })
            .collect();
        for i in 0..20 {
            let text = if i % 2 == 0 { TWO } else { ALLOW };
            std::fs::write(dir.path().join("p.cedar"), text).unwrap();
            store.reload().unwrap();
        }
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(store.generation(), 21);
    }
}
