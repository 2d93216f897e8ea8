//! Short-lived JWTs signed by a transit key: the signing key never leaves Vault.
//!
//! We build `base64url(header).base64url(claims)` ourselves and ask transit to sign it
//! with the key's latest version; the header's `kid` is `<key>:<version>` so a verifier can
//! pick the right public key after a rotation. Key type and latest version are read once
//! per key and cached briefly, so a rotation is picked up within a minute.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};

use super::http::{str_field, Method};
use super::{VaultClient, VaultError};
use crate::credential::{Credential, Material, MintFor};
use crate::source::JwtSpec;
use crate::Secret;

/// How long a transit key's type and latest version are trusted.
const KEY_CACHE_TTL: Duration = Duration::from_secs(60);

/// A transit key's signing shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyInfo {
    alg: Alg,
    version: u64,
    read_at: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    /// ed25519: transit returns the raw 64-byte signature.
    EdDsa,
    /// ecdsa-p256 with `marshaling_algorithm = jws`: already r||s, base64url.
    Es256,
    /// rsa-*: PKCS#1 v1.5 with SHA-256, raw signature bytes.
    Rs256,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::EdDsa => "EdDSA",
            Alg::Es256 => "ES256",
            Alg::Rs256 => "RS256",
        }
    }
}

pub(crate) async fn mint(
    client: &VaultClient,
    spec: &JwtSpec,
    who: &MintFor<'_>,
) -> Result<Credential, VaultError> {
    let key = key_info(client, spec).await?;
    let now = SystemTime::now();
    let iat = now
        .duration_since(UNIX_EPOCH)
        .map_err(|e| VaultError::Malformed {
            path: "clock".into(),
            reason: format!("system clock before 1970: {e}"),
        })?
        .as_secs();
    let exp = iat + spec.ttl.as_secs().max(1);
    let header = json!({
        "alg": key.alg.name(),
        "typ": "JWT",
        "kid": format!("{}:{}", spec.key, key.version),
    });
    let mut claims = json!({
        "iss": spec.issuer,
        "sub": who.agent,
        "aud": who.host,
        "iat": iat,
        "nbf": iat,
        "exp": exp,
        "jti": hex_id(),
        "ostiary_session": who.session,
        "tenant": who.tenant,
    });
    if let Some(tool) = &who.tool {
        claims["tool"] = Value::String((*tool).to_owned());
    }
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );

    let path = format!("{}/sign/{}", spec.mount, spec.key);
    let mut body = json!({
        "input": STANDARD.encode(&signing_input),
        "key_version": key.version,
    });
    match key.alg {
        Alg::EdDsa => {}
        Alg::Es256 => {
            body["hash_algorithm"] = "sha2-256".into();
            body["marshaling_algorithm"] = "jws".into();
        }
        Alg::Rs256 => {
            body["hash_algorithm"] = "sha2-256".into();
            body["signature_algorithm"] = "pkcs1v15".into();
        }
    }
    let answer = client.call(Method::Post, &path, Some(body)).await?;
    let signature = str_field(&answer, &path, "signature")?;
    // "vault:v<N>:<signature>"
    let encoded = signature
        .splitn(3, ':')
        .nth(2)
        .ok_or_else(|| VaultError::Malformed {
            path: path.clone(),
            reason: "signature is not vault:v<N>:<base64>".into(),
        })?;
    let signature = match key.alg {
        // JWS marshaling already answers base64url without padding.
        Alg::Es256 => encoded.trim_end_matches('=').to_string(),
        Alg::EdDsa | Alg::Rs256 => {
            let raw = STANDARD
                .decode(encoded)
                .map_err(|e| VaultError::Malformed {
                    path: path.clone(),
                    reason: format!("signature is not base64: {e}"),
                })?;
            URL_SAFE_NO_PAD.encode(raw)
        }
    };
    Ok(Credential {
        material: Material::Token(Secret::new(format!("{signing_input}.{signature}"))),
        lease: None,
        expires_at: Some(UNIX_EPOCH + Duration::from_secs(exp)),
    })
}

/// The key's type and latest version, from the cache or `GET <mount>/keys/<key>`.
async fn key_info(client: &VaultClient, spec: &JwtSpec) -> Result<KeyInfo, VaultError> {
    let id = (spec.mount.clone(), spec.key.clone());
    if let Some(info) = client
        .transit_keys
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .filter(|i| i.read_at.elapsed() < KEY_CACHE_TTL)
    {
        return Ok(*info);
    }
    let path = format!("{}/keys/{}", spec.mount, spec.key);
    let answer = client.call(Method::Get, &path, None).await?;
    let kind = str_field(&answer, &path, "type")?;
    let alg = match kind {
        "ed25519" => Alg::EdDsa,
        "ecdsa-p256" => Alg::Es256,
        k if k.starts_with("rsa-") => Alg::Rs256,
        other => {
            return Err(VaultError::Malformed {
                path,
                reason: format!("transit key type {other} cannot sign JWTs here"),
            })
        }
    };
    let version = answer
        .pointer("/data/latest_version")
        .and_then(Value::as_u64)
        .ok_or_else(|| VaultError::Malformed {
            path: path.clone(),
            reason: "no data.latest_version".into(),
        })?;
    let info = KeyInfo {
        alg,
        version,
        read_at: Instant::now(),
    };
    client
        .transit_keys
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, info);
    Ok(info)
}

/// 128 random bits, hex: the `jti`.
fn hex_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
