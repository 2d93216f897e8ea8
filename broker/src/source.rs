//! Where a credential comes from: the `source = {...}` of a `[[credential]]` binding.

use std::time::Duration;

use serde::Deserialize;

/// One source, as written in the config (`source = { vault_kv = { ... } }`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// A name in the file backend.
    File(String),
    /// A field of a KV v2 secret.
    VaultKv(KvSpec),
    /// A JWT signed by a transit key, minted per session, tool and host.
    VaultJwt(JwtSpec),
    /// A client certificate issued by a PKI role, for mTLS.
    VaultPki(PkiSpec),
    /// Dynamic database credentials from the database secrets engine.
    VaultDatabase(DatabaseSpec),
}

impl SourceSpec {
    /// Whether this source needs `[broker.vault]`.
    pub fn needs_vault(&self) -> bool {
        !matches!(self, SourceSpec::File(_))
    }

    /// Whether a credential of this source differs per host or tool (a JWT's `aud` and
    /// claims), so the cache must key on them too.
    pub fn per_request_target(&self) -> bool {
        matches!(self, SourceSpec::VaultJwt(_))
    }

    /// Short name for audit and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceSpec::File(_) => "file",
            SourceSpec::VaultKv(_) => "vault_kv",
            SourceSpec::VaultJwt(_) => "vault_jwt",
            SourceSpec::VaultPki(_) => "vault_pki",
            SourceSpec::VaultDatabase(_) => "vault_database",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvSpec {
    #[serde(default = "default_kv_mount")]
    pub mount: String,
    pub path: String,
    pub field: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtSpec {
    #[serde(default = "default_transit_mount")]
    pub mount: String,
    /// The transit key (ed25519, ecdsa-p256 or rsa-2048/3072/4096).
    pub key: String,
    /// Lifetime of each JWT.
    #[serde(default = "default_jwt_ttl", with = "humantime_serde")]
    pub ttl: Duration,
    /// The `iss` claim.
    #[serde(default = "default_issuer")]
    pub issuer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PkiSpec {
    #[serde(default = "default_pki_mount")]
    pub mount: String,
    pub role: String,
    /// Common name of the certificate; `{agent}` and `{session}` are replaced.
    #[serde(default = "default_common_name")]
    pub common_name: String,
    #[serde(default = "default_pki_ttl", with = "humantime_serde")]
    pub ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSpec {
    #[serde(default = "default_database_mount")]
    pub mount: String,
    pub role: String,
}

fn default_kv_mount() -> String {
    "secret".into()
}
fn default_transit_mount() -> String {
    "transit".into()
}
fn default_pki_mount() -> String {
    "pki".into()
}
fn default_database_mount() -> String {
    "database".into()
}
fn default_jwt_ttl() -> Duration {
    Duration::from_secs(300)
}
fn default_pki_ttl() -> Duration {
    Duration::from_secs(3600)
}
fn default_issuer() -> String {
    "ostiary".into()
}
fn default_common_name() -> String {
    "{agent}".into()
}

/// `ttl = "5m"` in TOML, via humantime, without another dependency.
mod humantime_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_from_config_shapes() {
        #[derive(Deserialize)]
        struct W {
            source: SourceSpec,
        }
        let kv: W = toml::from_str(
            r#"source = { vault_kv = { mount = "secret", path = "github", field = "token" } }"#,
        )
        .unwrap();
        assert_eq!(kv.source.kind(), "vault_kv");
        let file: W = toml::from_str(r#"source = { file = "github" }"#).unwrap();
        assert_eq!(file.source, SourceSpec::File("github".into()));
        let jwt: W =
            toml::from_str(r#"source = { vault_jwt = { key = "agents", ttl = "2m" } }"#).unwrap();
        match jwt.source {
            SourceSpec::VaultJwt(j) => {
                assert_eq!(j.ttl, Duration::from_secs(120));
                assert_eq!(j.mount, "transit");
            }
            other => panic!("{other:?}"),
        }
        assert!(toml::from_str::<W>(r#"source = { vault_kv = { path = "x" } }"#).is_err());
        assert!(toml::from_str::<W>(r#"source = { smoke_signal = "x" }"#).is_err());
    }
}
