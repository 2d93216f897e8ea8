//! The interception CA and the leaf certificates it mints, one per server name.
//!
//! A leaf is minted only for a name the caller has already checked (the CONNECT host, equal
//! to the SNI); minted server configs are cached so that a busy host costs one signature per
//! cache lifetime, not one per connection. All leaves share one key pair generated at start:
//! signing is the cost, key generation would double it, and the key never leaves the process.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::sign::{CertifiedKey, SigningKey, SingleCertAndKey};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

/// Why a certificate could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("invalid server name {0:?}")]
    Name(String),
}

/// Generate a new CA: (certificate PEM, private key PEM).
pub fn generate_ca() -> Result<(String, String), CaError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Ostiary interception CA");
    dn.push(DnType::OrganizationName, "Ostiary");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + Duration::from_secs(10 * 365 * 24 * 3600);
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Mints and caches leaf server configurations signed by the CA.
pub struct LeafMinter {
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    /// `leaf_key` loaded into rustls once: parsing it again for every leaf cost a third of
    /// a mint (the phases bench).
    leaf_signer: Arc<dyn SigningKey>,
    ca_der: CertificateDer<'static>,
    cache: moka::sync::Cache<String, Arc<ServerConfig>>,
}

impl std::fmt::Debug for LeafMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafMinter")
            .field("cached", &self.cache.entry_count())
            .finish_non_exhaustive()
    }
}

/// How long a minted leaf is valid, and how long it is cached (well inside its validity).
const LEAF_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
const LEAF_CACHE_TTL: Duration = Duration::from_secs(24 * 3600);

impl LeafMinter {
    /// Build from the CA's PEM certificate and key.
    pub fn new(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, CaError> {
        let ca_key = KeyPair::from_pem(ca_key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
        let ca_der = rustls_pki_types::pem::PemObject::from_pem_slice(ca_cert_pem.as_bytes())
            .map_err(|_| CaError::Name("CA certificate PEM".into()))?;
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let leaf_signer =
            crate::tls::provider()
                .key_provider
                .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                    leaf_key.serialize_der(),
                )))?;
        Ok(Self {
            issuer,
            leaf_key,
            leaf_signer,
            ca_der,
            cache: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(LEAF_CACHE_TTL)
                .build(),
        })
    }

    /// A server config presenting a leaf for `name` (a checked, canonical DNS name).
    pub fn server_config(&self, name: &str) -> Result<Arc<ServerConfig>, CaError> {
        if let Some(hit) = self.cache.get(name) {
            return Ok(hit);
        }
        let config = Arc::new(self.mint(name)?);
        self.cache.insert(name.to_owned(), config.clone());
        Ok(config)
    }

    fn mint(&self, name: &str) -> Result<ServerConfig, CaError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.subject_alt_names = vec![SanType::DnsName(
            name.try_into()
                .map_err(|_| CaError::Name(name.to_owned()))?,
        )];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::from_secs(3600);
        params.not_after = now + LEAF_VALIDITY;
        let leaf = params.signed_by(&self.leaf_key, &self.issuer)?;

        let chain = vec![leaf.der().clone(), self.ca_der.clone()];
        // The leaf and its key are made together here, so rustls's check that they match
        // (`with_single_cert`) would only repeat the key parse this avoids.
        let certified = CertifiedKey::new(chain, Arc::clone(&self.leaf_signer));
        let mut config = ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}
