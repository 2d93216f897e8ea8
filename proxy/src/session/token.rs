//! Session tokens: Ed25519-signed JWTs issued by this proxy, for this proxy.
//!
//! The pitfalls of JWT libraries are closed explicitly: one algorithm allowlisted (EdDSA, so
//! `alg: none` and HS256-signed-with-the-public-key fail), `exp`, `nbf`, `iss`, `aud`, `sub`
//! and `jti` required, `nbf` validated, the leeway set explicitly, and any header that points
//! at a key (`kid`, `jku`, `x5u`, `jwk`, `x5c`) refused: nothing is ever fetched, and there is
//! only one key.

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Issuer and audience of every session token.
pub const ISSUER: &str = "ostiary";
pub const AUDIENCE: &str = "ostiary-proxy";

/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 5;

/// Claims of a session token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub iss: String,
    pub aud: String,
    /// The agent name.
    pub sub: String,
    pub exp: i64,
    pub nbf: i64,
    pub iat: i64,
    /// The session id.
    pub jti: String,
    /// Tenant of the session.
    pub ten: String,
}

/// Why a token was refused. The text is safe to show the agent: it never repeats the token.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("token header refers to a key (kid/jku/x5u/jwk/x5c); none is accepted")]
    KeyReference,
    #[error("token is invalid: {0}")]
    Invalid(String),
    #[error("signing failed: {0}")]
    Sign(String),
}

/// The signing and verification keys with the validation rules.
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKeys(***)")
    }
}

impl TokenKeys {
    /// Build from the PKCS#8 private key PEM and the SPKI public key PEM.
    pub fn from_pem(private_pem: &str, public_pem: &str) -> Result<Self, TokenError> {
        let encoding = EncodingKey::from_ed_pem(private_pem.as_bytes())
            .map_err(|e| TokenError::Sign(e.to_string()))?;
        let decoding = DecodingKey::from_ed_pem(public_pem.as_bytes())
            .map_err(|e| TokenError::Sign(e.to_string()))?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.algorithms = vec![Algorithm::EdDSA];
        validation.leeway = LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[ISSUER]);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
        Ok(Self {
            encoding,
            decoding,
            validation,
        })
    }

    /// Sign claims.
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), claims, &self.encoding)
            .map_err(|e| TokenError::Sign(e.to_string()))
    }

    /// Verify a token's header, signature and claims.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Invalid(e.to_string()))?;
        if header.kid.is_some()
            || header.jku.is_some()
            || header.x5u.is_some()
            || header.jwk.is_some()
            || header.x5c.is_some()
        {
            return Err(TokenError::KeyReference);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| TokenError::Invalid(e.to_string()))?;
        if data.claims.jti.is_empty() || data.claims.sub.is_empty() {
            return Err(TokenError::Invalid("empty jti or sub".into()));
        }
        Ok(data.claims)
    }
}
