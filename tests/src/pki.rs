//! A throwaway certificate authority for the test upstreams.
//!
//! End-to-end tests need HTTPS servers whose certificates the proxy (and, in the
//! self-tests, real clients such as curl) can verify without touching the machine's
//! trust store. Each test makes its own [`TestCa`], issues leaf certificates for the
//! names its upstreams answer to (`api.example.test`, `localhost`, `127.0.0.1`, ...),
//! and hands the CA's PEM to whoever must trust it (`egress.ca_file`, `--cacert`).
//!
//! The certificates are shaped to pass strict verifiers, not only rustls: the CA has a
//! critical basicConstraints and keyCertSign usage, and leaves carry an Authority Key
//! Identifier and the serverAuth EKU, as OpenSSL 3 and Python's `VERIFY_X509_STRICT`
//! (default since Python 3.13) require.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A self-signed ECDSA P-256 CA that lives only as long as the test holds it.
///
/// Cheap to clone: clones share the same key, so several upstreams can be issued by one
/// CA and a single PEM file trusts them all.
#[derive(Clone)]
pub struct TestCa {
    inner: Arc<Inner>,
}

struct Inner {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    // The signing key is deliberately left out: test output should never carry it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// Generates a fresh CA key and self-signed certificate.
    ///
    /// Panics only if rcgen cannot produce a P-256 key, which would mean the crypto
    /// provider is broken and no test could run anyway.
    pub fn new() -> Self {
        Self::try_new().expect("generating the test CA")
    }

    /// Like [`TestCa::new`], with the error returned instead of a panic.
    pub fn try_new() -> Result<Self> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("CA key")?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Ostiary Test Upstream CA");
        dn.push(DnType::OrganizationName, "Ostiary tests");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).context("self-signing the CA")?;
        Ok(Self {
            inner: Arc::new(Inner {
                cert_pem: cert.pem(),
                cert_der: cert.der().clone(),
                issuer: Issuer::new(params, key),
            }),
        })
    }

    /// The CA certificate, PEM encoded.
    pub fn ca_pem(&self) -> String {
        self.inner.cert_pem.clone()
    }

    /// The CA certificate, DER encoded.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.inner.cert_der.clone()
    }

    /// Writes the CA certificate to `dir/upstream-ca.pem` and returns that path, for
    /// programs that take a bundle file (`curl --cacert`, `egress.ca_file`, `SSL_CERT_FILE`).
    /// The file name is fixed, so upstreams meant to share a directory should share a CA
    /// ([`crate::upstream::UpstreamBuilder::ca`]).
    pub fn write_ca(&self, dir: impl AsRef<Path>) -> PathBuf {
        let path = dir.as_ref().join("upstream-ca.pem");
        std::fs::write(&path, &self.inner.cert_pem)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Issues a server certificate for `names`; each name that parses as an IP address
    /// becomes an IP SAN, every other one a DNS SAN. The first name is also the CN.
    ///
    /// Returns `(cert_chain_pem, key_pem)`: the chain is the leaf followed by this CA's
    /// certificate (harmless to send, and it lets a file of it double as a bundle); the
    /// key is PKCS#8.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let (leaf_pem, key) = self.issue_leaf(names).expect("issuing a leaf certificate");
        (
            format!("{leaf_pem}{}", self.inner.cert_pem),
            key.serialize_pem(),
        )
    }

    /// Same as [`TestCa::issue`], already parsed for a rustls `ServerConfig`.
    pub fn issue_rustls(
        &self,
        names: &[&str],
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let (chain_pem, key_pem) = self.issue(names);
        let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("parsing our own certificate PEM");
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("parsing our own key PEM");
        (chain, key)
    }

    /// A root store that trusts only this CA.
    pub fn root_store(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der())
            .expect("our own CA certificate is valid");
        roots
    }

    /// A rustls client configuration trusting only this CA and offering `alpn`
    /// (e.g. `&[b"h2", b"http/1.1"]`), for tests that talk TLS to an upstream directly.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(self.root_store())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    fn issue_leaf(&self, names: &[&str]) -> Result<(String, KeyPair)> {
        anyhow::ensure!(
            !names.is_empty(),
            "a leaf certificate needs at least one name"
        );
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("leaf key")?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = names
            .iter()
            .map(|name| {
                Ok(match name.parse::<IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => SanType::DnsName((*name).try_into().context("DNS name")?),
                })
            })
            .collect::<Result<_>>()?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, names[0]);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.inner.issuer)
            .context("signing the leaf")?;
        Ok((cert.pem(), key))
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}
