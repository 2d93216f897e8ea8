//! A bare hudsucker MITM proxy for the load harness: CONNECT, a leaf certificate per host
//! from the given CA, and every request relayed unchanged over a pooled upstream client that
//! trusts the given roots. No authentication, no policy, no audit: the floor a team would
//! start from when writing its own intercepting proxy.
//!
//! `hudsucker-relay ADDR CA_CERT_PEM CA_KEY_PEM UPSTREAM_ROOTS_PEM`

use std::net::SocketAddr;
use std::sync::Arc;

use hudsucker::certificate_authority::RcgenAuthority;
use hudsucker::rcgen::{Issuer, KeyPair};
use hudsucker::Proxy;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, ca_cert, ca_key, roots] = args.as_slice() else {
        return Err("usage: hudsucker-relay ADDR CA_CERT_PEM CA_KEY_PEM UPSTREAM_ROOTS_PEM".into());
    };
    let addr: SocketAddr = addr.parse()?;
    let provider = rustls::crypto::ring::default_provider();

    let key = KeyPair::from_pem(&std::fs::read_to_string(ca_key)?)?;
    let issuer = Issuer::from_ca_cert_pem(&std::fs::read_to_string(ca_cert)?, key)?;
    let ca = RcgenAuthority::new(issuer, 1_000, provider.clone());

    let mut store = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(roots)? {
        store.add(cert?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(store)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build();

    let proxy = Proxy::builder()
        .with_addr(addr)
        .with_ca(ca)
        .with_http_connector(connector)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .build()?;
    eprintln!("hudsucker-relay listening on {addr}");
    proxy.start().await?;
    Ok(())
}
