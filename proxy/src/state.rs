//! The state directory: everything Ostiary must keep between runs and never put in config.
//!
//! Created at first start: the CA that signs intercepted leaf certificates, the admin token
//! of the control API, the Ed25519 key that signs session tokens, the key that seals the
//! audit chain, the key that signs approval links, and the SQLite database. Secret files are
//! written `0600`; nothing here is ever logged.
//!
//! The admin token may come from the environment instead (`OSTIARY_ADMIN_TOKEN`,
//! docs/design.md §8), so a deployment can inject it from a secret store: then `admin.token`
//! is neither read nor written, and a value too weak to be a credential stops the start.

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
    /// The value itself is never part of the message.
    #[error("{ADMIN_TOKEN_ENV} is {0}; set it to a random token of at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters (e.g. `openssl rand -hex 32`), or unset it to use the state directory's admin.token")]
    AdminToken(&'static str),
}

/// The environment variable holding the admin token, for `serve` and the CLI alike.
pub const ADMIN_TOKEN_ENV: &str = "OSTIARY_ADMIN_TOKEN";

/// Shortest admin token taken from the environment: 128 bits as hex. (The generated one
/// is 256 bits.)
pub const MIN_ADMIN_TOKEN_LEN: usize = 32;

/// The admin token from `OSTIARY_ADMIN_TOKEN`, if it is set; refused when it is empty,
/// short, or not something an `Authorization: Bearer` header can carry.
pub fn admin_token_from_env() -> Result<Option<SecretString>, StateError> {
    std::env::var_os(ADMIN_TOKEN_ENV)
        .map(|value| admin_token_from(&value))
        .transpose()
}

/// Check a configured admin token (see [`admin_token_from_env`]).
pub fn admin_token_from(value: &std::ffi::OsStr) -> Result<SecretString, StateError> {
    let text = value
        .to_str()
        .ok_or(StateError::AdminToken("not valid UTF-8"))?;
    if text.is_empty() {
        return Err(StateError::AdminToken("set but empty"));
    }
    // Whitespace (a stray newline from a secret file), controls or non-ASCII would be
    // trimmed, mangled or refused on the way through a header: the token would not be the
    // one the operator holds.
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(StateError::AdminToken(
            "not all visible ASCII (it has whitespace, control or non-ASCII characters)",
        ));
    }
    if text.len() < MIN_ADMIN_TOKEN_LEN {
        return Err(StateError::AdminToken("too short"));
    }
    Ok(SecretString(text.to_owned()))
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
    /// The proxy's Unix socket (`listen.proxy_unix` by default).
    pub const PROXY_SOCKET: &str = "proxy.sock";
}

impl StateDir {
    /// Open the state directory, creating whatever is missing; the admin token is
    /// `OSTIARY_ADMIN_TOKEN` when that is set ([`admin_token_from_env`]).
    pub fn open_or_create(dir: &Path) -> Result<Self, StateError> {
        Self::open_with(dir, admin_token_from_env()?)
    }

    /// Like [`StateDir::open_or_create`], with the admin token given (`None`: the state
    /// directory's `admin.token`, created if missing). A given token leaves that file alone.
    pub fn open_with(dir: &Path, admin_token: Option<SecretString>) -> Result<Self, StateError> {
        fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
        tighten(dir)?;
        let (ca_cert_pem, ca_key_pem) = ensure_ca(dir)?;
        let admin_token = match admin_token {
            Some(given) => {
                tracing::info!(
                    "admin token from {ADMIN_TOKEN_ENV}; {} is not used",
                    dir.join(files::ADMIN_TOKEN).display()
                );
                given.0
            }
            None => ensure_secret(dir, files::ADMIN_TOKEN, || random_hex(32))?,
        };
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

/// The directory `0700` and every regular file in it `0600`, however they were made (an
/// older version, a restore, a umask): nothing here is anyone else's to read, and SQLite
/// gives its `-wal` and `-shm` files the database's mode.
fn tighten(dir: &Path) -> Result<(), StateError> {
    use std::os::unix::fs::PermissionsExt;
    let set = |path: &Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|source| io_err(path, source))
    };
    set(dir, 0o700)?;
    for entry in fs::read_dir(dir).map_err(|source| io_err(dir, source))? {
        let entry = entry.map_err(|source| io_err(dir, source))?;
        let path = entry.path();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let mode = entry.metadata().map(|m| m.permissions().mode() & 0o777);
        if is_file && mode.is_ok_and(|m| m != 0o600) {
            set(&path, 0o600)?;
        }
    }
    Ok(())
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
    // Public, yet in a directory no one else may enter: 0600 like the rest.
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|source| io_err(path, source))
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

    #[test]
    fn an_existing_state_directory_is_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.join(files::DATABASE), "").unwrap();
        fs::set_permissions(dir.join(files::DATABASE), fs::Permissions::from_mode(0o644)).unwrap();
        StateDir::open_or_create(&dir).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }

    #[test]
    fn a_given_admin_token_leaves_the_file_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let token = "t0ken-from-a-secret-store-0123456789abcdef";
        let given = admin_token_from(std::ffi::OsStr::new(token)).unwrap();
        let state = StateDir::open_with(tmp.path(), Some(given)).unwrap();
        assert_eq!(state.admin_token.expose(), token);
        assert!(!tmp.path().join(files::ADMIN_TOKEN).exists(), "not written");
        // An existing file is not read either.
        fs::write(tmp.path().join(files::ADMIN_TOKEN), "from-the-file").unwrap();
        let given = admin_token_from(std::ffi::OsStr::new(token)).unwrap();
        let state = StateDir::open_with(tmp.path(), Some(given)).unwrap();
        assert_eq!(state.admin_token.expose(), token);
        // Without one, the file is the token.
        let state = StateDir::open_with(tmp.path(), None).unwrap();
        assert_eq!(state.admin_token.expose(), "from-the-file");
    }

    #[test]
    fn weak_admin_tokens_are_refused_without_echoing_them() {
        use std::os::unix::ffi::OsStrExt;
        for (value, why) in [
            (&b""[..], "empty"),
            (b"short-but-not-empty", "too short"),
            (&[b'a'; 31][..], "too short"),
            (b"0123456789abcdef0123456789abcdef\n", "visible ASCII"),
            (b"0123456789abcdef 0123456789abcdef", "visible ASCII"),
            (b"0123456789abcdef0123456789abcdef\xff", "UTF-8"),
            (
                "0123456789abcdef0123456789abcdefé".as_bytes(),
                "visible ASCII",
            ),
        ] {
            let err = admin_token_from(std::ffi::OsStr::from_bytes(value)).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(why), "{value:?}: {text}");
            assert!(text.contains("OSTIARY_ADMIN_TOKEN"), "{text}");
            if value.len() > 8 {
                let shown = String::from_utf8_lossy(&value[..8]).into_owned();
                assert!(!text.contains(&shown), "the value is echoed: {text}");
            }
        }
        assert!(admin_token_from(std::ffi::OsStr::new(&"a".repeat(32))).is_ok());
    }
}
