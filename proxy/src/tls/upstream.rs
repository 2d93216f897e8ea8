//! The TLS client towards upstreams: webpki roots plus `egress.ca_file`, ALPN `h2` and
//! `http/1.1`, full certificate verification for the exact host being reached.
//!
//! Verification is never relaxed: an upstream that presents an invalid certificate is
//! refused (502), and credentials are injected only on connections whose certificate was
//! verified for that host. An mTLS credential gets a configuration of its own, with the
//! same roots and the client certificate added.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why the upstream TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    #[error("egress.ca_file {path}: {message}")]
    CaFile { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client certificate: {0}")]
    ClientCert(String),
}

/// A configuration without a client certificate.
pub fn plain_config(roots: Arc<RootCertStore>) -> Result<ClientConfig, UpstreamTlsError> {
    build(roots, None)
}

/// The roots upstream certificates are verified against: webpki roots plus `ca_file`
/// (which may be empty).
pub fn root_store(ca_file: &Path) -> Result<RootCertStore, UpstreamTlsError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if !ca_file.as_os_str().is_empty() {
        let err = |message: String| UpstreamTlsError::CaFile {
            path: ca_file.display().to_string(),
            message,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca_file)
            .map_err(|e| err(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| err(e.to_string()))?;
        if certs.is_empty() {
            return Err(err("no certificate in file".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(roots)
}

/// A configuration presenting the client certificate `chain_pem` with `key_pem` (mTLS).
/// Errors describe the PEM's shape, never its content.
pub fn mtls_config(
    roots: Arc<RootCertStore>,
    chain_pem: &str,
    key_pem: &str,
) -> Result<ClientConfig, UpstreamTlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| UpstreamTlsError::ClientCert(format!("certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(UpstreamTlsError::ClientCert(
            "no certificate in the chain".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| UpstreamTlsError::ClientCert(format!("private key: {}", pem_error(&e))))?;
    build(roots, Some((chain, key)))
}

fn build(
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, UpstreamTlsError> {
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The kind of a PEM error without the bytes some variants carry (they may be key material).
fn pem_error(e: &rustls_pki_types::pem::Error) -> &'static str {
    use rustls_pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { .. } => "a section has no END line",
        Error::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        Error::Base64Decode(_) => "invalid base64",
        Error::NoItemsFound => "no private key found",
        _ => "unreadable PEM",
    }
}
