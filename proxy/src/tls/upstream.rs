//! The TLS client towards upstreams: webpki roots plus `egress.ca_file`, ALPN `h2` and
//! `http/1.1`, full certificate verification for the exact host being reached.
//!
//! Verification is never relaxed: an upstream that presents an invalid certificate is
//! refused (502), and credentials (a later capability) are injected only on connections
//! whose certificate was verified for that host.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Why the upstream TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    #[error("egress.ca_file {path}: {message}")]
    CaFile { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Build the client configuration; `ca_file` may be empty.
pub fn client_config(ca_file: &Path) -> Result<Arc<ClientConfig>, UpstreamTlsError> {
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
    let mut config = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
