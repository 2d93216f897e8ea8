//! The `file` source: `name = "value"` pairs in a TOML file readable only by Ostiary.
//!
//! It is the embedded default of docs/design.md §8, so `ostiary serve` injects credentials
//! without a Vault. Its credentials have no lease; the broker caches them for the binding's TTL.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{BrokerError, Secret};

/// The `file` backend: `name = "value"` pairs in a TOML file readable only by Ostiary.
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    values: BTreeMap<String, Secret>,
}

impl FileSource {
    /// Load the file.
    pub fn load(path: &Path) -> Result<Self, BrokerError> {
        let text = std::fs::read_to_string(path).map_err(|source| BrokerError::Read {
            path: path.to_owned(),
            source,
        })?;
        let table: BTreeMap<String, String> =
            toml::from_str(&text).map_err(|e| BrokerError::Parse {
                path: path.to_owned(),
                // toml's message quotes the offending line, which may hold a secret: keep
                // only the position.
                message: match e.span() {
                    Some(span) => format!("invalid TOML at byte {}", span.start),
                    None => "invalid TOML".to_owned(),
                },
            })?;
        Ok(Self {
            path: path.to_owned(),
            values: table
                .into_iter()
                .map(|(k, v)| (k, Secret::new(v)))
                .collect(),
        })
    }

    /// The secret named `name`.
    pub fn get(&self, name: &str) -> Result<Secret, BrokerError> {
        self.values
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::Unknown(name.to_owned()))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_source_reads_and_errors_without_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.toml");
        std::fs::write(&path, "github = \"ghp_canary\"\n").unwrap();
        let source = FileSource::load(&path).unwrap();
        assert_eq!(source.get("github").unwrap().expose(), "ghp_canary");
        assert!(matches!(source.get("x"), Err(BrokerError::Unknown(_))));

        std::fs::write(&path, "github = ghp_canary_unquoted\n").unwrap();
        let err = FileSource::load(&path).unwrap_err().to_string();
        assert!(!err.contains("ghp_canary"), "error leaks the value: {err}");
    }
}
