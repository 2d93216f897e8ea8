//! The upstream connector: every dial of the pooled client goes through the egress guard,
//! then TLS with full verification for the exact host of the URI.
//!
//! Because the guard sits inside the connector, it applies to every new connection the pool
//! opens, not just the first one: a pooled client cannot be talked into dialing an address
//! that was never checked.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::body::BoxError;
use crate::egress::address::{split_authority, Host};
use crate::egress::{EgressError, Guard};

/// A TLS handshake with an upstream failed (certificate rejected, protocol error).
#[derive(Debug, thiserror::Error)]
#[error("TLS with {host}: {message}")]
pub struct UpstreamTlsFailure {
    pub host: String,
    pub message: String,
}

/// Connects to upstreams for the pooled client.
#[derive(Debug, Clone)]
pub struct UpstreamConnector {
    guard: Arc<Guard>,
    tls: Arc<ClientConfig>,
}

impl UpstreamConnector {
    /// A connector dialing through `guard` and speaking TLS with `tls`.
    pub fn new(guard: Arc<Guard>, tls: Arc<ClientConfig>) -> Self {
        Self { guard, tls }
    }
}

/// A plain or TLS upstream connection.
#[derive(Debug)]
pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The address a response's connection was dialed to, found in response extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DialedAddr(pub std::net::SocketAddr);

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        let (tcp, h2) = match self {
            UpstreamStream::Plain(tcp) => (tcp, false),
            UpstreamStream::Tls(tls) => (
                tls.get_ref().0,
                tls.get_ref().1.alpn_protocol() == Some(b"h2"),
            ),
        };
        let mut connected = Connected::new();
        if let Ok(addr) = tcp.peer_addr() {
            connected = connected.extra(DialedAddr(addr));
        }
        if h2 {
            connected = connected.negotiated_h2();
        }
        connected
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    // Passed through, so that hyper hands a request's head and body pieces over in one
    // call rather than copying them into its own buffer first.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = TokioIo<UpstreamStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect(uri).await })
    }
}

impl UpstreamConnector {
    async fn connect(&self, uri: Uri) -> Result<TokioIo<UpstreamStream>, BoxError> {
        let authority = uri.authority().ok_or("upstream URI has no authority")?;
        let (host, port) = split_authority(authority.as_str())?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => return Err(format!("unsupported upstream scheme {other:?}").into()),
        };
        let port = port.unwrap_or(if tls { 443 } else { 80 });
        let (tcp, _addr) = self
            .guard
            .connect(&host, port)
            .await
            .map_err(|e: EgressError| -> BoxError { Box::new(e) })?;
        if !tls {
            return Ok(TokioIo::new(UpstreamStream::Plain(tcp)));
        }
        let name = match &host {
            Host::Name(n) => ServerName::try_from(n.clone())?,
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let stream = TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| UpstreamTlsFailure {
                host: host.to_string(),
                message: e.to_string(),
            })?;
        Ok(TokioIo::new(UpstreamStream::Tls(Box::new(stream))))
    }
}
