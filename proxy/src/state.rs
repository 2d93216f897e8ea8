//! The state directory: everything Ostiary must keep between runs and never put in config.
//!
//! Created at first start: the CA that signs intercepted leaf certificates, the admin token
//! of the control API, the Ed25519 key that signs session tokens, the key that seals the
//! audit chain, the key that signs approval links, and the SQLite database. Secret files are written `0600`; nothing here is
//! ever logged.

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rand::RngCore;

/// Why the state directory could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating {what}: {message}")]
    Generate { what: &'static str, message: String },
}

/// A secret string whose `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wrap a secret.
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The secret itself, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Paths and loaded secrets of the state directory.
#[derive(Debug)]
pub struct StateDir {
    pub dir: PathBuf,
    pub ca_cert_pem: String,
    pub ca_key_pem: SecretString,
    pub admin_token: SecretString,
    pub signing_key_pem: SecretString,
    pub verify_key_pem: String,
    pub audit_key: SecretString,
    /// Signs approval review links.
    pub approvals_key: SecretString,
}

/// File names inside the state directory.
pub mod files {
    pub const CA_CERT: &str = "ca.pem";
    pub const CA_KEY: &str = "ca.key.pem";
    pub const ADMIN_TOKEN: &str = "admin.token";
    pub const SIGNING_KEY: &str = "session-signing.key.pem";
    pub const VERIFY_KEY: &str = "session-signing.pub.pem";
    pub const AUDIT_KEY: &str = "audit.key";
    pub const APPROVALS_KEY: &str = "approvals.key";
    pub const DATABASE: &str = "ostiary.db";
    pub const AUDIT_HEAD: &str = "audit.head";
}

impl StateDir {
    /// Open the state directory, creating whatever is missing.
    pub fn open_or_create(dir: &Path) -> Result<Self, StateError> {
        fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
        let (ca_cert_pem, ca_key_pem) = ensure_ca(dir)?;
        let admin_token = ensure_secret(dir, files::ADMIN_TOKEN, || random_hex(32))?;
        let audit_key = ensure_secret(dir, files::AUDIT_KEY, || random_hex(32))?;
        let approvals_key = ensure_secret(dir, files::APPROVALS_KEY, || random_hex(32))?;
        let (signing_key_pem, verify_key_pem) = ensure_signing_key(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            ca_cert_pem,
            ca_key_pem: SecretString(ca_key_pem),
            admin_token: SecretString(admin_token),
            signing_key_pem: SecretString(signing_key_pem),
            verify_key_pem,
            audit_key: SecretString(audit_key),
            approvals_key: SecretString(approvals_key),
        })
    }

    /// Path of a file in the state directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Read the admin token of a state directory without creating anything (CLI side).
pub fn read_admin_token(dir: &Path) -> Result<SecretString, StateError> {
    let path = dir.join(files::ADMIN_TOKEN);
    fs::read_to_string(&path)
        .map(|t| SecretString(t.trim().to_owned()))
        .map_err(|source| io_err(&path, source))
}

/// Read the CA certificate of a state directory without creating anything.
pub fn read_ca_cert(dir: &Path) -> Result<String, StateError> {
    let path = dir.join(files::CA_CERT);
    fs::read_to_string(&path).map_err(|source| io_err(&path, source))
}

fn io_err(path: &Path, source: std::io::Error) -> StateError {
    StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Random bytes as lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

fn write_private(path: &Path, contents: &str) -> Result<(), StateError> {
    // create_new: never overwrite a secret another process wrote meanwhile.
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| io_err(path, source))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| io_err(path, source))
}

fn write_public(path: &Path, contents: &str) -> Result<(), StateError> {
    fs::write(path, contents).map_err(|source| io_err(path, source))
}

fn ensure_secret(
    dir: &Path,
    name: &str,
    make: impl FnOnce() -> String,
) -> Result<String, StateError> {
    let path = dir.join(name);
    match fs::read_to_string(&path) {
        Ok(existing) => Ok(existing.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = make();
            write_private(&path, &value)?;
            Ok(value)
        }
        Err(source) => Err(io_err(&path, source)),
    }
}

fn ensure_ca(dir: &Path) -> Result<(String, String), StateError> {
    let cert_path = dir.join(files::CA_CERT);
    let key_path = dir.join(files::CA_KEY);
    if key_path.exists() {
        let key = fs::read_to_string(&key_path).map_err(|s| io_err(&key_path, s))?;
        let cert = fs::read_to_string(&cert_path).map_err(|s| io_err(&cert_path, s))?;
        return Ok((cert, key));
    }
    let (cert, key) = crate::tls::ca::generate_ca().map_err(|e| StateError::Generate {
        what: "the interception CA",
        message: e.to_string(),
    })?;
    write_private(&key_path, &key)?;
    write_public(&cert_path, &cert)?;
    Ok((cert, key))
}

fn ensure_signing_key(dir: &Path) -> Result<(String, String), StateError> {
    let key_path = dir.join(files::SIGNING_KEY);
    let pub_path = dir.join(files::VERIFY_KEY);
    if key_path.exists() {
        let key = fs::read_to_string(&key_path).map_err(|s| io_err(&key_path, s))?;
        let public = fs::read_to_string(&pub_path).map_err(|s| io_err(&pub_path, s))?;
        return Ok((key, public));
    }
    let pair =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(|e| StateError::Generate {
            what: "the session signing key",
            message: e.to_string(),
        })?;
    let key = pair.serialize_pem();
    let public = pair.public_key_pem();
    write_private(&key_path, &key)?;
    write_public(&pub_path, &public)?;
    Ok((key, public))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_then_reuses_state() {
        let tmp = tempfile::tempdir().unwrap();
        let first = StateDir::open_or_create(tmp.path()).unwrap();
        let second = StateDir::open_or_create(tmp.path()).unwrap();
        assert_eq!(first.admin_token, second.admin_token);
        assert_eq!(first.ca_cert_pem, second.ca_cert_pem);
        assert_eq!(first.verify_key_pem, second.verify_key_pem);
        let mode = fs::metadata(tmp.path().join(files::CA_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "CA key must not be group/world readable");
        assert_eq!(format!("{:?}", first.admin_token), "***");
    }
}
