//! Triggers reloaded without a restart: `SIGHUP`, `POST /v1/policy/reload` and a change of
//! the policy directory read the config file again, and its `[[trigger]]` tables are put in
//! force — new deliveries are admitted by the new set, schedules start again from it (their
//! cursors keep their place), the runner's one-at-a-time triggers follow. A config that does
//! not load, or a trigger that does not compile, leaves the triggers in force as they were,
//! and says why. Runs already made keep what they were made with (their spec is theirs).
//!
//! Only the triggers are taken from the file: the rest of the config (listeners, store,
//! credentials) needs a restart, as before. A trigger naming a credential added since the
//! start cannot read it until then.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::intake::Intake;
use crate::config::triggers::{Concurrency, Kind, Trigger};
use crate::config::Config;

/// What a reload of the triggers touches.
#[derive(Debug)]
pub struct TriggerReload {
    /// The config file the proxy started with (`None`: built-in defaults, nothing to read).
    source: Option<PathBuf>,
    intake: Arc<Intake>,
    schedules: tokio::sync::watch::Sender<Arc<Vec<Trigger>>>,
    serial: Arc<RwLock<HashSet<String>>>,
    /// What runs read: rewritten once a reload took.
    snapshot: Option<Arc<ConfigSnapshot>>,
}

impl TriggerReload {
    pub fn new(
        source: Option<PathBuf>,
        intake: Arc<Intake>,
        schedules: tokio::sync::watch::Sender<Arc<Vec<Trigger>>>,
        serial: Arc<RwLock<HashSet<String>>>,
        snapshot: Option<Arc<ConfigSnapshot>>,
    ) -> Self {
        Self {
            source,
            intake,
            schedules,
            serial,
            snapshot,
        }
    }

    /// Read the config file again and put its triggers in force: the triggers now, or why
    /// the ones in force stay.
    pub fn reload(&self) -> Result<Vec<Trigger>, String> {
        let Some(path) = &self.source else {
            return Err("the proxy runs on the built-in defaults: no config file to read".into());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let config = Config::from_toml(&text, path).map_err(|e| e.to_string())?;
        if config.trigger.is_empty() {
            return Err(
                "the config now has no [[trigger]]: removing them all needs a restart".into(),
            );
        }
        self.intake.replace(&config.trigger)?;
        *self.serial.write().unwrap_or_else(|p| p.into_inner()) = serial(&config.trigger);
        self.schedules
            .send_replace(Arc::new(config.trigger.clone()));
        if let Some(snapshot) = &self.snapshot {
            snapshot.replace(&text).map_err(|e| {
                format!("the triggers took, but runs still read the old config: {e}")
            })?;
        }
        Ok(config.trigger)
    }
}

/// The config as the proxy last loaded it, in a file of its own that runs read (`ostiary
/// run --config`): an edit of the config file reaches runs once the proxy has loaded it (a
/// reload, a restart), and an edit that does not load breaks none. Removed with the proxy.
#[derive(Debug)]
pub struct ConfigSnapshot {
    path: PathBuf,
}

impl ConfigSnapshot {
    /// `text` in a new file of `dir` (the runs' directory), readable by this user only.
    pub fn create(dir: &Path, text: &str) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)?;
        let snapshot = Self {
            path: dir.join(format!("config-{}.toml", crate::state::random_hex(8))),
        };
        snapshot.replace(text)?;
        Ok(snapshot)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its text is `text` now, whole (written beside it, then renamed over it).
    pub fn replace(&self, text: &str) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let staged = self.path.with_extension("toml.new");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&staged)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&staged, &self.path)
    }
}

impl Drop for ConfigSnapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Triggers whose runs go one at a time: schedules with `forbid` or `queue`.
pub fn serial(triggers: &[Trigger]) -> HashSet<String> {
    triggers
        .iter()
        .filter(|t| t.kind == Kind::Schedule && t.concurrency != Concurrency::Replace)
        .map(|t| t.name.clone())
        .collect()
}
