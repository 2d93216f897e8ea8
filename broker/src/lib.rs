//! Ostiary's credential broker: where secrets come from and how they are held.
//!
//! This version holds the secret type and the `file` source (the embedded default of
//! DESIGN §8, `name = "value"` in a TOML file). Vault/OpenBao sources, leases, the cache and
//! injection arrive with the broker capability; the proxy does not inject anything yet.
//!
//! The one rule of this crate: a secret value is never printed. [`Secret`]'s `Debug` and
//! `Display` print `***`, and errors name credentials, never values.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A secret value. Cloning is allowed (injection needs copies); printing is not.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the injection code that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why a credential could not be produced. Never carries a secret value.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("reading secrets file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("secrets file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("credential {0:?} is not in the secrets file")]
    Unknown(String),
}

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
            values: table.into_iter().map(|(k, v)| (k, Secret(v))).collect(),
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
    fn secrets_never_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "*** ***");
        assert_eq!(s.expose(), "hunter2");
    }

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
