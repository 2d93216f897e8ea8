//! The lease-shaped sources: KV v2 reads, PKI client certificates and database dynamic
//! credentials. (Transit JWTs live in `jwt.rs`.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::http::{str_field, Method};
use super::{VaultClient, VaultError};
use crate::credential::{ClientIdentity, Credential, Lease, Material, MintFor, Revocation};
use crate::source::{DatabaseSpec, KvSpec, PkiSpec};
use crate::Secret;

/// One string field of a KV v2 secret (latest version).
pub(crate) async fn kv(client: &VaultClient, spec: &KvSpec) -> Result<Credential, VaultError> {
    let path = format!("{}/data/{}", spec.mount, spec.path.trim_start_matches('/'));
    let answer = client.call(Method::Get, &path, None).await?;
    let value = answer
        .pointer("/data/data")
        .and_then(|d| d.get(&spec.field))
        .ok_or_else(|| VaultError::NotFound(format!("{path} field {}", spec.field)))?;
    let value = value.as_str().ok_or_else(|| VaultError::Malformed {
        path: path.clone(),
        reason: format!("field {} is not a string", spec.field),
    })?;
    Ok(Credential::token(Secret::new(value)))
}

/// A client certificate from `<mount>/issue/<role>`; the lease is its serial number.
pub(crate) async fn pki(
    client: &VaultClient,
    spec: &PkiSpec,
    who: &MintFor<'_>,
) -> Result<Credential, VaultError> {
    let path = format!("{}/issue/{}", spec.mount, spec.role);
    let common_name = spec
        .common_name
        .replace("{agent}", who.agent)
        .replace("{session}", who.session);
    let body = json!({
        "common_name": common_name,
        "ttl": format!("{}s", spec.ttl.as_secs().max(1)),
        // PKCS#8 whatever the key type: one PEM shape for every TLS stack.
        "private_key_format": "pkcs8",
    });
    let answer = client.call(Method::Post, &path, Some(body)).await?;
    let certificate = str_field(&answer, &path, "certificate")?;
    let key = str_field(&answer, &path, "private_key")?;
    let serial = str_field(&answer, &path, "serial_number")?;
    let mut chain = certificate.trim_end().to_string();
    let ca_chain: Vec<&str> = answer
        .pointer("/data/ca_chain")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let intermediates = if ca_chain.is_empty() {
        answer
            .pointer("/data/issuing_ca")
            .and_then(Value::as_str)
            .into_iter()
            .collect()
    } else {
        ca_chain
    };
    for pem in intermediates {
        chain.push('\n');
        chain.push_str(pem.trim_end());
    }
    chain.push('\n');
    let expires_at = answer
        .pointer("/data/expiration")
        .and_then(Value::as_u64)
        .map(|secs| UNIX_EPOCH + Duration::from_secs(secs));
    Ok(Credential {
        material: Material::ClientCert(ClientIdentity {
            cert_chain_pem: chain,
            key_pem: Secret::new(key),
        }),
        lease: Some(Lease {
            id: format!("pki:{}:{serial}", spec.mount),
            revocation: Revocation::PkiSerial {
                mount: spec.mount.clone(),
                serial: serial.to_string(),
            },
            renewable: false,
        }),
        expires_at,
    })
}

/// Dynamic credentials from `<mount>/creds/<role>`, with their lease.
pub(crate) async fn database(
    client: &VaultClient,
    spec: &DatabaseSpec,
) -> Result<Credential, VaultError> {
    let path = format!("{}/creds/{}", spec.mount, spec.role);
    let answer = client.call(Method::Get, &path, None).await?;
    let username = str_field(&answer, &path, "username")?;
    let password = str_field(&answer, &path, "password")?;
    let lease_id = answer
        .get("lease_id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| VaultError::Malformed {
            path: path.clone(),
            reason: "database credentials came without a lease".into(),
        })?;
    let duration = answer
        .get("lease_duration")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let renewable = answer
        .get("renewable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Credential {
        material: Material::Basic {
            username: Secret::new(username),
            password: Secret::new(password),
        },
        lease: Some(Lease {
            id: lease_id.to_string(),
            revocation: Revocation::VaultLease,
            renewable,
        }),
        expires_at: (duration > 0).then(|| SystemTime::now() + Duration::from_secs(duration)),
    })
}
