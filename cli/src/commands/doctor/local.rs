//! Doctor's checks of this machine's files: the state directory (the CA, its key and
//! validity, the admin token's permissions) and whether this shell's clients trust that
//! CA. They need nothing running, so they come first and hold when the proxy is down.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ostiary::config::Config;
use ostiary::state::{self, files};

use super::{Report, CA_EXPIRY_WARNING};

/// The CA as clients must trust it (DER), the admin token; `None` when there is no CA.
pub(super) fn state_dir(report: &mut Report, config: &Config) -> Option<Vec<u8>> {
    let dir = &config.state.dir;
    if !dir.is_dir() {
        report.fail(
            "state",
            format!("no state directory at {}", dir.display()),
            "`ostiary serve` makes it at its first start; or give doctor the deployment's --config",
        );
        return None;
    }
    admin_token(report, dir);
    let keys = config.state.keys_dir.as_ref().unwrap_or(dir);
    match inspect_ca(keys) {
        Ok(ca) => {
            let until = humantime::format_rfc3339_seconds(ca.not_after);
            let left = ca
                .not_after
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            if left.is_zero() {
                report.fail(
                    "CA",
                    format!("{} expired at {until}", ca.path.display()),
                    renew_ca(keys),
                );
            } else if left < CA_EXPIRY_WARNING {
                report.warn(
                    "CA",
                    format!("{} expires at {until}", ca.path.display()),
                    renew_ca(keys),
                );
            } else {
                report.ok(
                    "CA",
                    format!(
                        "{}: {}, valid until {until}; its key matches",
                        ca.path.display(),
                        ca.subject
                    ),
                );
            }
            Some(ca.der)
        }
        Err(problem) => {
            report.fail("CA", problem.found, problem.fix);
            None
        }
    }
}

fn renew_ca(keys: &Path) -> String {
    format!(
        "move {} and {} aside and restart `ostiary serve` (it makes a new CA), then give \
         clients the new one (`ostiary session new`, `ostiary run`)",
        keys.join(files::CA_CERT).display(),
        keys.join(files::CA_KEY).display()
    )
}

fn admin_token(report: &mut Report, dir: &Path) {
    match state::admin_token_from_env() {
        Ok(Some(_)) => {
            report.ok("token", "the admin token comes from OSTIARY_ADMIN_TOKEN");
            return;
        }
        Ok(None) => {}
        Err(e) => {
            report.fail(
                "token",
                e,
                "OSTIARY_ADMIN_TOKEN must hold 32 characters or more, for serve and the CLI alike",
            );
            return;
        }
    }
    let path = dir.join(files::ADMIN_TOKEN);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => report.warn(
            "token",
            format!(
                "{} is readable by others (mode {:o})",
                path.display(),
                meta.permissions().mode() & 0o777
            ),
            format!(
                "chmod 600 {}: whoever reads it can approve, mint sessions and read the audit",
                path.display()
            ),
        ),
        Ok(_) => report.ok(
            "token",
            format!("{} (readable by its owner only)", path.display()),
        ),
        Err(e) => report.fail(
            "token",
            format!("no admin token at {}: {e}", path.display()),
            "`ostiary serve` makes it at its first start, or set OSTIARY_ADMIN_TOKEN for serve and the CLI",
        ),
    }
}

/// A CA certificate as read from the keys directory.
struct Ca {
    path: PathBuf,
    der: Vec<u8>,
    subject: String,
    not_after: SystemTime,
}

/// Why the CA cannot be used, and what to do.
struct Problem {
    found: String,
    fix: String,
}

fn inspect_ca(keys: &Path) -> Result<Ca, Problem> {
    let path = keys.join(files::CA_CERT);
    let key_path = keys.join(files::CA_KEY);
    let remake = || {
        format!(
            "`ostiary serve` makes a CA at its first start; with state.keys_dir, `ostiary state \
             init --dir {}`",
            keys.display()
        )
    };
    let pem = std::fs::read(&path).map_err(|e| Problem {
        found: format!("no CA certificate at {}: {e}", path.display()),
        fix: remake(),
    })?;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).map_err(|e| Problem {
        found: format!("{} is not a PEM certificate: {e}", path.display()),
        fix: remake(),
    })?;
    let cert = block.parse_x509().map_err(|e| Problem {
        found: format!("{} does not parse as X.509: {e}", path.display()),
        fix: remake(),
    })?;
    if !cert.is_ca() {
        return Err(Problem {
            found: format!("{} is not a CA certificate", path.display()),
            fix: remake(),
        });
    }
    // The key must be the certificate's: leaves signed by another key would not chain to
    // the CA clients were given, and every intercepted handshake would fail.
    let key_pem = std::fs::read_to_string(&key_path).map_err(|e| Problem {
        found: format!("no CA key at {}: {e}", key_path.display()),
        fix: format!(
            "restore {} beside its certificate (the pair comes from one state directory or `ostiary state init`)",
            key_path.display()
        ),
    })?;
    let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|e| Problem {
        found: format!("{} does not parse as a key: {e}", key_path.display()),
        fix: "restore the CA key that belongs to the certificate".into(),
    })?;
    if key.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
        return Err(Problem {
            found: format!(
                "{} is not the key of {}: intercepted connections would not chain to the CA clients trust",
                key_path.display(),
                path.display()
            ),
            fix: "restore the matching pair (both files from one state directory or `ostiary state init`)"
                .into(),
        });
    }
    let not_after = cert.validity().not_after.timestamp();
    Ok(Ca {
        der: block.contents.clone(),
        subject: cert.subject().to_string(),
        not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(not_after.max(0) as u64),
        path,
    })
}

/// A shell configured as a client of this proxy (`eval "$(ostiary session new …)"`) must
/// have every CA bundle variable name a file holding the CA: those are what `session new`
/// exports and `run` sets, and what its clients read. A shell that does not use the proxy may
/// point them anywhere: its clients are not the proxy's.
pub(super) fn trust(report: &mut Report, config: &Config, ca: &[u8]) {
    let keys = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
    let ca_file = keys.join(files::CA_CERT);
    let Some(proxy_var) = proxy_var_for(config.listen.proxy) else {
        report.ok(
            "trust",
            format!(
                "this shell does not use the proxy (no HTTP(S)_PROXY naming {}); `ostiary run` \
                 and `session new` point the clients they configure at {}",
                config.listen.proxy,
                ca_file.display()
            ),
        );
        return;
    };
    let mut set = 0;
    for var in ostiary_sdk::CA_BUNDLE_VARS {
        let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) else {
            continue;
        };
        set += 1;
        let path = PathBuf::from(value);
        match bundle_holds(&path, ca) {
            Ok(true) => report.ok(
                "trust",
                format!("{var}={} holds this proxy's CA", path.display()),
            ),
            Ok(false) => report.fail(
                "trust",
                format!(
                    "{var}={} does not hold this proxy's CA, and {proxy_var} sends this shell's \
                     clients through the proxy: they refuse every intercepted connection",
                    path.display()
                ),
                format!(
                    "the state directory was made again since? eval \"$(ostiary session new \
                     --agent NAME)\" again, or point {var} at {}",
                    ca_file.display()
                ),
            ),
            Err(e) => report.fail(
                "trust",
                format!("{var}={} cannot be read: {e}", path.display()),
                format!("point {var} at {}", ca_file.display()),
            ),
        }
    }
    if set == 0 {
        report.warn(
            "trust",
            format!("{proxy_var} names the proxy but no CA bundle variable is set"),
            format!(
                "clients will not trust intercepted connections: eval \"$(ostiary session new \
                 --agent NAME)\", which sets SSL_CERT_FILE and four others to {}",
                ca_file.display()
            ),
        );
    }
}

/// The proxy variable of this shell that names the proxy listener, if any. Its value is
/// never printed: it carries a session token.
fn proxy_var_for(listener: std::net::SocketAddr) -> Option<&'static str> {
    const VARS: [&str; 6] = [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ];
    VARS.into_iter().find(|var| {
        std::env::var(var)
            .ok()
            .and_then(|value| url::Url::parse(&value).ok())
            .is_some_and(|url| names_listener(&url, listener))
    })
}

/// Whether `url` reaches `listener` (its port, and its address or a loopback name for it).
fn names_listener(url: &url::Url, listener: std::net::SocketAddr) -> bool {
    if url.port_or_known_default() != Some(listener.port()) {
        return false;
    }
    match url.host() {
        Some(url::Host::Ipv4(ip)) => {
            std::net::IpAddr::V4(ip) == listener.ip() || listener.ip().is_unspecified()
        }
        Some(url::Host::Ipv6(ip)) => {
            std::net::IpAddr::V6(ip) == listener.ip() || listener.ip().is_unspecified()
        }
        Some(url::Host::Domain(name)) => {
            name.eq_ignore_ascii_case("localhost")
                && (listener.ip().is_loopback() || listener.ip().is_unspecified())
        }
        None => false,
    }
}

/// Whether the PEM bundle at `path` has a certificate equal to `ca` (DER).
fn bundle_holds(path: &Path, ca: &[u8]) -> std::io::Result<bool> {
    let bytes = std::fs::read(path)?;
    Ok(x509_parser::pem::Pem::iter_from_buffer(&bytes)
        .filter_map(Result::ok)
        .any(|block| block.label == "CERTIFICATE" && block.contents == ca))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(url: &str, listener: &str) -> bool {
        names_listener(&url::Url::parse(url).unwrap(), listener.parse().unwrap())
    }

    #[test]
    fn a_proxy_url_names_the_listener_by_address_port_or_loopback_name() {
        assert!(names("http://agent:tok@127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(names("http://localhost:8080/", "127.0.0.1:8080"));
        assert!(names("http://10.0.0.5:8080", "0.0.0.0:8080"), "any address");
        assert!(
            !names("http://127.0.0.1:8081", "127.0.0.1:8080"),
            "another port"
        );
        assert!(
            !names("http://10.0.0.5:8080", "127.0.0.1:8080"),
            "another host"
        );
        assert!(
            !names("http://proxy.corp:8080", "127.0.0.1:8080"),
            "a corporate proxy"
        );
        assert!(names("http://[::1]:8080", "[::1]:8080"));
    }

    #[test]
    fn a_bundle_holds_the_ca_among_other_certificates() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["other.test".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(&bundle, format!("{}{}", other.cert.pem(), ca.cert.pem())).unwrap();
        assert!(bundle_holds(&bundle, ca.cert.der()).unwrap());
        std::fs::write(&bundle, other.cert.pem()).unwrap();
        assert!(!bundle_holds(&bundle, ca.cert.der()).unwrap());
        assert!(bundle_holds(&dir.path().join("absent.pem"), ca.cert.der()).is_err());
    }
}
