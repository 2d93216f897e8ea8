//! The environment a command gets from `ostiary run`.
//!
//! Inside a sandbox: cleared, then the allowlist (`[sandbox] env` and the profile's `env`)
//! taken from the operator's environment, then the session's own variables (the proxy URL
//! with the in-sandbox address, the CA bundle variables, the placeholders), then `HOME`.
//! Never a variable of the proxy's own (`OSTIARY_*`), Vault's or OpenBao's (`VAULT_*`,
//! `BAO_*`), nor one the config names as holding a secret — whatever an allowlist says.
//!
//! Without a sandbox the command inherits the operator's environment minus the same
//! never-passed variables, plus the session's.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use ostiary_sdk::Session;

use crate::config::sandbox::NEVER_ENV_PREFIXES;
use crate::config::{Config, Profile};

use super::inside;

/// The variables the config names as holding a secret (Vault's token or AppRole secret id,
/// Slack's webhook and signing secret, the SMTP login, the webhook check's token).
pub fn secret_names(config: &Config) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    if let Some(vault) = &config.broker.vault {
        names.extend(vault.auth.token_env.clone());
        if let Some(role) = &vault.auth.approle {
            names.insert(role.secret_id_env.clone());
        }
    }
    // Vault's default login variable, whether or not [broker.vault] is configured.
    names.insert("VAULT_TOKEN".to_owned());
    names.insert(config.approvals.slack_webhook_env.clone());
    names.insert(config.approvals.slack_signing_secret_env.clone());
    if let Some(smtp) = &config.approvals.smtp {
        names.extend(smtp.username_env.clone());
        names.extend(smtp.password_env.clone());
    }
    if let Some(webhook) = &config.checks.webhook {
        names.extend(webhook.token_env.clone());
    }
    names.retain(|n| !n.is_empty());
    names
}

/// Whether `name` may never reach a command `ostiary run` starts.
pub fn never_passed(name: &OsStr, secrets: &BTreeSet<String>) -> bool {
    let Some(name) = name.to_str() else {
        // A name that is not UTF-8 cannot be compared with the config's: not passed.
        return true;
    };
    NEVER_ENV_PREFIXES.iter().any(|p| name.starts_with(p)) || secrets.contains(name)
}

/// The names of the operator's variables an unsandboxed command must not inherit.
pub fn unsandboxed_removals(
    config: &Config,
    operator: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<OsString> {
    let secrets = secret_names(config);
    operator
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| never_passed(name, &secrets))
        .collect()
}

/// The proxy URL a sandboxed command uses: the forwarder inside, on `listen.proxy`'s port.
pub fn inside_proxy_url(token: &str, port: u16) -> String {
    format!("http://agent:{token}@127.0.0.1:{port}")
}

/// The whole environment of a sandboxed command (see the module doc).
pub fn sandbox_env(
    config: &Config,
    profile: &Profile,
    session: &Session,
    proxy_port: u16,
    home: &Path,
    operator: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(String, String)> {
    let secrets = secret_names(config);
    let allowed: BTreeSet<&str> = config
        .sandbox
        .env
        .iter()
        .chain(&profile.env)
        .map(String::as_str)
        .collect();
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
    };
    for (name, value) in operator {
        if never_passed(&name, &secrets) {
            continue;
        }
        let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
            continue;
        };
        if allowed.contains(name) && name != "HOME" {
            set(&mut env, name.to_owned(), value.to_owned());
        }
    }
    let url = inside_proxy_url(&session.token, proxy_port);
    for (name, value) in session.env(Path::new(inside::CA)) {
        // The session's id is the proxy's variable: the command has no use for it, and
        // nothing named OSTIARY_* enters a sandbox.
        if never_passed(OsStr::new(&name), &secrets) {
            continue;
        }
        let value = if value == session.proxy_url {
            url.clone()
        } else {
            value
        };
        set(&mut env, name, value);
    }
    set(&mut env, "HOME".to_owned(), home.display().to_string());
    env
}

/// `HOME` inside: `/home/agent`, or the operator's own `HOME` path when the allowlist names
/// `HOME` (a private empty tmpfs either way: the operator's files are never the agent's).
pub fn sandbox_home(
    config: &Config,
    profile: &Profile,
    operator_home: Option<&OsStr>,
) -> std::path::PathBuf {
    let named = config
        .sandbox
        .env
        .iter()
        .chain(&profile.env)
        .any(|n| n == "HOME");
    match operator_home.map(Path::new) {
        Some(home) if named && home.is_absolute() && home != Path::new("/") => home.to_owned(),
        _ => inside::HOME.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn session() -> Session {
        serde_json::from_value(serde_json::json!({
            "session_id": "s-1", "agent": "a", "tenant": "default", "token": "tok",
            "expires_at": 0, "proxy_url": "http://agent:tok@127.0.0.1:8080", "ca_pem": "",
            "placeholders": {"GITHUB_TOKEN": "ostiary:github"}
        }))
        .unwrap()
    }

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn only_the_allowlist_and_the_session_enter() {
        let config = Config::from_toml(
            r#"
            [approvals]
            slack_webhook_env = "TEAM_HOOK"
            [sandbox]
            env = ["PATH", "LANG", "TEAM_HOOK", "VAULT_TOKEN", "HTTPS_PROXY"]
            [sandbox.profiles.p]
            env = ["EXTRA"]
            "#,
            Path::new("t"),
        )
        .unwrap_err();
        // VAULT_TOKEN in an allowlist is refused by the config itself.
        assert!(config.to_string().contains("never enter"), "{config}");
        let config = Config::from_toml(
            r#"
            [approvals]
            slack_webhook_env = "TEAM_HOOK"
            [sandbox]
            env = ["PATH", "LANG", "TEAM_HOOK", "HTTPS_PROXY"]
            [sandbox.profiles.p]
            env = ["EXTRA"]
            "#,
            Path::new("t"),
        )
        .unwrap();
        let profile = config.sandbox.profile("p").unwrap();
        let env = sandbox_env(
            &config,
            &profile,
            &session(),
            9999,
            Path::new("/home/agent"),
            os(&[
                ("PATH", "/usr/bin"),
                ("EXTRA", "1"),
                ("NOT_LISTED", "x"),
                ("TEAM_HOOK", "https://hooks.slack/secret"),
                ("OSTIARY_ADMIN_TOKEN", "admin"),
                ("VAULT_TOKEN", "root"),
                ("HTTPS_PROXY", "http://elsewhere"),
                ("HOME", "/root"),
            ]),
        );
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/usr/bin"));
        assert_eq!(get("EXTRA"), Some("1"), "the profile's allowlist");
        for gone in [
            "NOT_LISTED",
            "TEAM_HOOK",
            "OSTIARY_ADMIN_TOKEN",
            "VAULT_TOKEN",
        ] {
            assert_eq!(get(gone), None, "{gone}");
        }
        assert!(
            env.iter().all(|(k, _)| !k.starts_with("OSTIARY_")),
            "{env:?}"
        );
        assert_eq!(get("HTTPS_PROXY"), Some("http://agent:tok@127.0.0.1:9999"));
        assert_eq!(get("SSL_CERT_FILE"), Some(inside::CA));
        assert_eq!(get("GITHUB_TOKEN"), Some("ostiary:github"));
        assert_eq!(get("HOME"), Some("/home/agent"));
        assert_eq!(env.iter().filter(|(k, _)| k == "HTTPS_PROXY").count(), 1);
    }

    #[test]
    fn unsandboxed_runs_lose_the_never_passed_variables() {
        let config = Config::from_toml(
            "[checks.webhook]\nurl = \"http://127.0.0.1:1\"\ntoken_env = \"GUARD_TOKEN\"\n",
            Path::new("t"),
        )
        .unwrap();
        let gone = unsandboxed_removals(
            &config,
            os(&[
                ("PATH", "/usr/bin"),
                ("GUARD_TOKEN", "s"),
                ("BAO_TOKEN", "s"),
                ("OSTIARY_CONFIG", "c"),
                ("OSTIARY_SLACK_WEBHOOK", "s"),
            ]),
        );
        assert_eq!(
            gone,
            [
                "GUARD_TOKEN",
                "BAO_TOKEN",
                "OSTIARY_CONFIG",
                "OSTIARY_SLACK_WEBHOOK"
            ]
        );
    }

    #[test]
    fn home_is_private_unless_named() {
        let config = Config::default();
        let profile = Profile::default();
        assert_eq!(
            sandbox_home(&config, &profile, Some(OsStr::new("/root"))),
            Path::new(inside::HOME)
        );
        let profile = Profile {
            env: vec!["HOME".into()],
            ..Profile::default()
        };
        assert_eq!(
            sandbox_home(&config, &profile, Some(OsStr::new("/root"))),
            Path::new("/root")
        );
        assert_eq!(
            sandbox_home(&config, &profile, Some(OsStr::new("relative"))),
            Path::new(inside::HOME)
        );
    }
}
