//! What a source hands back: the secret material, its lease and when it stops being valid.

use std::time::{Duration, SystemTime};

use crate::Secret;

/// The secret material of one credential, shaped by what the source produces.
#[derive(Debug, Clone)]
pub enum Material {
    /// One opaque value: an API token, a KV field, a signed JWT.
    Token(Secret),
    /// A user name and password (database dynamic credentials, basic-auth bindings).
    /// Generated user names are treated as secret too: they name a live database role.
    Basic { username: Secret, password: Secret },
    /// A client certificate for mTLS towards the upstream.
    ClientCert(ClientIdentity),
}

/// A client certificate chain and its private key, PEM.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// Leaf first, then any intermediates. Certificates are public.
    pub cert_chain_pem: String,
    /// The private key. Never leaves the process except in the TLS handshake.
    pub key_pem: Secret,
}

/// How a lease is ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    /// A Vault lease: `PUT sys/leases/revoke` with the lease id.
    VaultLease,
    /// A PKI certificate: `POST <mount>/revoke` with its serial number (PKI issues no lease).
    PkiSerial { mount: String, serial: String },
}

/// A lease on a credential: what to revoke at teardown or expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Vault's lease id, or `pki:<mount>:<serial>` for a certificate. Safe to log and audit.
    pub id: String,
    pub revocation: Revocation,
    pub renewable: bool,
}

/// One minted or read credential.
#[derive(Debug, Clone)]
pub struct Credential {
    pub material: Material,
    /// `None` for sources without leases (file, KV, transit JWTs).
    pub lease: Option<Lease>,
    /// When the credential stops being valid (lease end, JWT `exp`, certificate `notAfter`).
    /// `None` when the source does not say; the broker then caches for the binding's TTL.
    pub expires_at: Option<SystemTime>,
}

impl Credential {
    /// A credential without lease or expiry.
    pub fn token(value: Secret) -> Self {
        Self {
            material: Material::Token(value),
            lease: None,
            expires_at: None,
        }
    }

    /// Time left before expiry, from `now`; `None` without an expiry.
    pub fn remaining(&self, now: SystemTime) -> Option<Duration> {
        self.expires_at
            .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO))
    }

    /// The lease id, for audit and metrics.
    pub fn lease_id(&self) -> Option<&str> {
        self.lease.as_ref().map(|l| l.id.as_str())
    }

    /// Every secret string in the material, for response scrubbing and DLP. A client
    /// certificate's key is included; its certificate is public and is not.
    pub fn secret_values(&self) -> Vec<&Secret> {
        match &self.material {
            Material::Token(s) => vec![s],
            Material::Basic { username, password } => vec![username, password],
            Material::ClientCert(id) => vec![&id.key_pem],
        }
    }
}

/// Who a credential is minted for: the claims of a transit JWT, the common name of a
/// certificate, the key of the cache. Borrowed: built per request, on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MintFor<'a> {
    pub session: &'a str,
    pub agent: &'a str,
    pub tenant: &'a str,
    /// The request's host (a JWT's `aud`).
    pub host: &'a str,
    /// The catalogued tool, when the request is a tool call.
    pub tool: Option<&'a str>,
}
