//! TLS on both sides of the proxy: the interception CA and leaf minting towards the agent,
//! and the verifying client configuration towards upstreams.

pub mod ca;
pub mod upstream;

use std::sync::Arc;

/// The one crypto provider used on both sides (ring), chosen explicitly so that no other
/// provider can be picked up from the dependency graph.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Built once: every leaf minted and every upstream client config asks for it.
    static PROVIDER: std::sync::OnceLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}
