//! A proxy in front of the lenient upstream (`clients::LenientUpstream`), with one agent's
//! session: the rig of the tests that show what the proxy decides is what an upstream that
//! reads leniently runs (`ambiguity`, `impact_counts`).

use bytes::Bytes;

use crate::clients::LenientUpstream;
use crate::pki::TestCa;
use crate::proxy::{ProxySpec, TestProxy};
use crate::raw::{self, Reply};

#[derive(Debug)]
pub struct LenientRig {
    pub upstream: LenientUpstream,
    pub proxy: TestProxy,
    pub token: String,
}

impl LenientRig {
    /// The upstream serving `hosts`, a proxy with `policies`, the catalog `tools_toml` gives
    /// for the upstream's port and `extra_toml`, and a session of agent `agent`.
    pub async fn start(
        hosts: &[&str],
        policies: &str,
        tools_toml: impl FnOnce(u16) -> String,
        extra_toml: &str,
    ) -> Self {
        let ca = TestCa::new();
        let upstream = LenientUpstream::start(&ca, hosts).await;
        let proxy = TestProxy::start(ProxySpec {
            policies: policies.into(),
            tools_toml: Some(tools_toml(upstream.port)),
            names: hosts.iter().map(|h| h.to_string()).collect(),
            ports: vec![upstream.port],
            upstream_ca_pem: Some(ca.ca_pem()),
            extra_toml: extra_toml.into(),
            ..Default::default()
        })
        .await;
        let token = proxy.session("agent").await.token;
        Self {
            upstream,
            proxy,
            token,
        }
    }

    /// `method path` with a JSON `body` to `host`, through an intercepted tunnel.
    pub async fn send(
        &self,
        host: &str,
        method: &str,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Reply {
        self.send_with(host, method, path, &[], body).await
    }

    /// [`Self::send`] with extra `headers` (a `content-type` among them replaces JSON's).
    pub async fn send_with(
        &self,
        host: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let port = self.upstream.port;
        raw::send_json(
            &self.proxy,
            &self.token,
            host,
            port,
            method,
            path,
            headers,
            body,
        )
        .await
    }
}
