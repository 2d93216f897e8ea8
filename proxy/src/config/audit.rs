//! `[audit]`: how often the chain is signed for auditors who hold no key of ours
//! (docs/audit.md, docs/audit-export.md).

use std::time::Duration;

use serde::Deserialize;

/// The audit trail's signed checkpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Audit {
    /// At most this long after the previous signed checkpoint while records come (and at
    /// shutdown) the writer signs the records since: the longest an export can lag the chain.
    #[serde(deserialize_with = "super::duration")]
    pub signed_checkpoint_interval: Duration,
}

impl Default for Audit {
    fn default() -> Self {
        Self {
            signed_checkpoint_interval: Duration::from_secs(60),
        }
    }
}

/// Below this, a checkpoint record would follow nearly every batch: more chain than records.
const SHORTEST: Duration = Duration::from_millis(100);

impl Audit {
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.signed_checkpoint_interval < SHORTEST {
            return Err(format!(
                "audit.signed_checkpoint_interval is {:?}; it must be at least {SHORTEST:?}",
                self.signed_checkpoint_interval
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::Config;
    use super::*;

    #[test]
    fn the_interval_defaults_to_a_minute_and_is_bounded_below() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        assert_eq!(c.audit.signed_checkpoint_interval, Duration::from_secs(60));
        let c = Config::from_toml(
            "[audit]\nsigned_checkpoint_interval = \"5s\"\n",
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(c.audit.signed_checkpoint_interval, Duration::from_secs(5));
        for short in ["0s", "10ms"] {
            let toml = format!("[audit]\nsigned_checkpoint_interval = \"{short}\"\n");
            let e = Config::from_toml(&toml, Path::new("t")).unwrap_err();
            assert!(e.to_string().contains("at least 100ms"), "{short}: {e}");
        }
        for bad in ["\"soon\"", "5"] {
            let toml = format!("[audit]\nsigned_checkpoint_interval = {bad}\n");
            assert!(Config::from_toml(&toml, Path::new("t")).is_err(), "{bad}");
        }
        assert!(Config::from_toml("[audit]\nsigned_every = \"5s\"\n", Path::new("t")).is_err());
    }
}
