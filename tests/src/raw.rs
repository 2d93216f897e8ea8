//! Hand-driven clients for the adversarial tests: raw HTTP/1 over TCP or TLS, CONNECT by
//! hand, TLS with a chosen SNI, and the checks every refusal of Ostiary must pass.
//!
//! Well-behaved clients refuse to send what an attacker sends (two `Content-Length`s, a bare
//! LF, an SNI that differs from the CONNECT host) and hide what came back, so these tests
//! write the bytes themselves and read the answer off the wire. Every read has a deadline
//! ([`IO_DEADLINE`]): a proxy that hangs fails the test instead of stalling the run.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ostiary::audit::AuditRecord;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::proxy::TestProxy;

/// The longest any single exchange may take before the test calls the proxy hung.
pub const IO_DEADLINE: Duration = Duration::from_secs(15);

/// Header carrying the request id on every response Ostiary produces.
pub const REQUEST_ID: &str = "ostiary-request-id";

/// A response as it came off the wire (raw HTTP/1 or a hyper client).
#[derive(Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.status)?;
        for (name, value) in &self.headers {
            writeln!(f, "{name}: {}", String::from_utf8_lossy(value.as_bytes()))?;
        }
        write!(f, "\n{}", String::from_utf8_lossy(&self.body))
    }
}

impl Reply {
    /// The first value of `name`, if it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `ostiary-request-id` header.
    pub fn request_id(&self) -> Option<&str> {
        self.header(REQUEST_ID)
    }

    /// The body as JSON; panics with the whole response when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}):\n{self}"))
    }

    /// Collect a hyper response.
    pub async fn from_hyper(response: http::Response<hyper::body::Incoming>) -> Self {
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(IO_DEADLINE, body.collect())
            .await
            .expect("response body within the deadline")
            .expect("response body")
            .to_bytes();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }
}

/// A byte stream with a read-ahead buffer, for speaking HTTP/1 by hand.
#[derive(Debug)]
pub struct Wire<S> {
    io: S,
    buf: Vec<u8>,
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no answer within the deadline")
}

impl<S: AsyncRead + AsyncWrite + Unpin> Wire<S> {
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::new(),
        }
    }

    /// Write `bytes` and flush.
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    /// Read one response to an ordinary request (body framed by its headers).
    pub async fn response(&mut self) -> io::Result<Reply> {
        tokio::time::timeout(IO_DEADLINE, self.read_response(false))
            .await
            .map_err(|_| timed_out())?
    }

    /// Read the response to a CONNECT: a 2xx has no body, the tunnel starts after its head.
    pub async fn connect_response(&mut self) -> io::Result<Reply> {
        tokio::time::timeout(IO_DEADLINE, self.read_response(true))
            .await
            .map_err(|_| timed_out())?
    }

    /// Whether the peer closes (EOF or error) within `within`, discarding whatever it sends.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        let read_to_end = async {
            let mut chunk = [0u8; 4096];
            loop {
                match self.io.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(within, read_to_end).await.is_ok()
    }

    /// The stream itself, for TLS on top of an accepted CONNECT.
    pub fn into_inner(self) -> S {
        assert!(
            self.buf.is_empty(),
            "the proxy sent bytes after the CONNECT response head: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        self.io
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.io.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed (buffered: {:?})",
                    String::from_utf8_lossy(&self.buf)
                ),
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..at].to_vec();
                self.buf.drain(..at + 2);
                return Ok(line);
            }
            self.fill().await?;
        }
    }

    async fn exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill().await?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    async fn read_response(&mut self, connect: bool) -> io::Result<Reply> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let status_line = self.line().await?;
        let status_line = String::from_utf8_lossy(&status_line).into_owned();
        let code = status_line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| bad(format!("status line {status_line:?}")))?;
        let mut headers = HeaderMap::new();
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                break;
            }
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| bad(format!("header line {:?}", String::from_utf8_lossy(&line))))?;
            let name = HeaderName::from_bytes(&line[..colon]).map_err(|e| bad(e.to_string()))?;
            let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii())
                .map_err(|e| bad(e.to_string()))?;
            headers.append(name, value);
        }
        let no_body = code.is_informational()
            || code == StatusCode::NO_CONTENT
            || code == StatusCode::NOT_MODIFIED
            || (connect && code.is_success());
        let chunked = headers
            .get(http::header::TRANSFER_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
        let length = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        let body = if no_body {
            Vec::new()
        } else if chunked {
            let mut body = Vec::new();
            loop {
                let size_line = self.line().await?;
                let size = String::from_utf8_lossy(&size_line);
                let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|e| bad(format!("chunk size {size:?}: {e}")))?;
                if size == 0 {
                    while !self.line().await?.is_empty() {}
                    break;
                }
                body.extend(self.exact(size).await?);
                self.exact(2).await?;
            }
            body
        } else if let Some(n) = length {
            self.exact(n).await?
        } else {
            loop {
                match self.fill().await {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
            }
            std::mem::take(&mut self.buf)
        };
        Ok(Reply {
            status: code,
            headers,
            body: body.into(),
        })
    }
}

/// A loopback port that refuses connections for as long as the returned socket lives: it
/// is bound, never listened on. A port bound and released instead ("closed a moment ago")
/// may be taken by a parallel test's listener before it is dialled.
pub fn refusing_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("binding 127.0.0.1:0");
    let addr = socket.local_addr().expect("its address");
    (socket, addr)
}

/// `Proxy-Authorization: Bearer <token>\r\n`, the line a raw request carries.
pub fn auth_line(token: &str) -> String {
    format!("Proxy-Authorization: Bearer {token}\r\n")
}

/// Send `bytes` on a fresh connection to `addr` and read one response.
pub async fn exchange(addr: SocketAddr, bytes: &[u8]) -> io::Result<Reply> {
    let mut wire = Wire::new(TcpStream::connect(addr).await?);
    wire.send(bytes).await?;
    wire.response().await
}

/// A `GET <url>` in absolute form on the proxy listener, with `extra` header lines
/// (each ending in CRLF), answered on a fresh connection.
pub async fn absolute_get(proxy: &TestProxy, url: &str, extra: &str) -> Reply {
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default();
    let request = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    exchange(proxy.proxy_addr, request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("GET {url} through the proxy: {e}"))
}

/// Send `CONNECT <authority>` with `extra` header lines; the connection and the answer.
pub async fn connect(proxy: SocketAddr, authority: &str, extra: &str) -> (Wire<TcpStream>, Reply) {
    let mut wire = Wire::new(TcpStream::connect(proxy).await.expect("proxy accepts"));
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n");
    wire.send(request.as_bytes()).await.expect("CONNECT sent");
    let reply = wire
        .connect_response()
        .await
        .unwrap_or_else(|e| panic!("CONNECT {authority}: {e}"));
    (wire, reply)
}

/// A root store holding every certificate of `pem`.
pub fn roots(pem: &str) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert.expect("PEM certificate")).expect("root");
    }
    roots
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client config trusting the CA in `ca_pem`, offering `alpn`.
pub fn client_config(ca_pem: &str, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots(ca_pem))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A certificate verifier that remembers whether the server ever presented a certificate,
/// so a test can prove a handshake was refused *before* a leaf was shown.
#[derive(Debug)]
pub struct WatchingVerifier {
    inner: Arc<WebPkiServerVerifier>,
    saw: AtomicBool,
}

impl WatchingVerifier {
    /// Whether `verify_server_cert` was ever called.
    pub fn saw_certificate(&self) -> bool {
        self.saw.load(Ordering::SeqCst)
    }
}

impl ServerCertVerifier for WatchingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.saw.store(true, Ordering::SeqCst);
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A client config trusting `ca_pem` whose verifier reports whether a certificate arrived.
pub fn watching_config(ca_pem: &str) -> (Arc<ClientConfig>, Arc<WatchingVerifier>) {
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca_pem)), provider())
        .build()
        .expect("verifier");
    let verifier = Arc::new(WatchingVerifier {
        inner,
        saw: AtomicBool::new(false),
    });
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (Arc::new(config), verifier)
}

/// TLS over `stream` to `name` (a DNS name is sent as SNI; an IP address sends none).
pub async fn tls<S>(stream: S, config: Arc<ClientConfig>, name: &str) -> io::Result<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(name.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    tokio::time::timeout(
        IO_DEADLINE,
        TlsConnector::from(config).connect(name, stream),
    )
    .await
    .map_err(|_| timed_out())?
}

/// CONNECT to `host:port` with `token`, then TLS trusting the proxy's CA with SNI `host`:
/// an intercepted tunnel ready for inner requests. Panics if any step fails.
pub async fn intercepted(
    proxy: &TestProxy,
    token: &str,
    host: &str,
    port: u16,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let (wire, reply) = connect(
        proxy.proxy_addr,
        &format!("{host}:{port}"),
        &auth_line(token),
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "CONNECT {host}:{port}:\n{reply}"
    );
    tls(wire.into_inner(), client_config(&proxy.ca_pem, alpn), host)
        .await
        .unwrap_or_else(|e| panic!("TLS with the proxy for {host}: {e}"))
}

/// `method path` with a JSON `body` and extra `headers` to `host:port`, over a fresh tunnel
/// the proxy intercepts (HTTP/1.1): what an agent's tool call looks like on the wire.
#[allow(clippy::too_many_arguments)]
pub async fn send_json(
    proxy: &TestProxy,
    token: &str,
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let tls = intercepted(proxy, token, host, port, &[b"http/1.1"]).await;
    let mut sender = h1(tls).await;
    let mut req = Request::builder()
        .method(http::Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(path)
        .header("host", format!("{host}:{port}"))
        .header("accept", "application/json, text/event-stream");
    // JSON unless `headers` name content types themselves (`content-type: ""` for none).
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    for (name, value) in headers {
        if !value.is_empty() || !name.eq_ignore_ascii_case("content-type") {
            req = req.header(*name, *value);
        }
    }
    let req = req.body(Full::new(body.into())).expect("request");
    send_h1(&mut sender, req).await.expect("exchange")
}

/// Body type of the hyper client helpers.
pub type ReqBody = Full<Bytes>;

/// An HTTP/1.1 client connection over `io`.
pub async fn h1<S>(io: S) -> hyper::client::conn::http1::SendRequest<ReqBody>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    sender
}

/// An HTTP/2 client connection over `io`.
pub async fn h2<S>(io: S) -> hyper::client::conn::http2::SendRequest<ReqBody>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    h2_watched(io).await.0
}

/// An HTTP/2 client connection over `io`, with the task that ends when the connection does
/// (`Ok` when the server sent GOAWAY and closed, `Err` when it was cut).
pub async fn h2_watched<S>(
    io: S,
) -> (
    hyper::client::conn::http2::SendRequest<ReqBody>,
    tokio::task::JoinHandle<hyper::Result<()>>,
)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
    (sender, tokio::spawn(conn))
}

/// A bodiless request; `host` becomes the `Host` header (h1 needs one, h2 takes the URI).
pub fn request(method: &str, uri: &str, host: Option<&str>) -> Request<ReqBody> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(host) = host {
        builder = builder.header(http::header::HOST, host);
    }
    builder.body(Full::new(Bytes::new())).expect("request")
}

/// Send with h1 and collect, within the deadline.
pub async fn send_h1(
    sender: &mut hyper::client::conn::http1::SendRequest<ReqBody>,
    req: Request<ReqBody>,
) -> hyper::Result<Reply> {
    let response = tokio::time::timeout(IO_DEADLINE, async {
        sender.ready().await?;
        sender.send_request(req).await
    })
    .await
    .expect("h1 response within the deadline")?;
    Ok(Reply::from_hyper(response).await)
}

/// Send with h2 and collect, within the deadline.
pub async fn send_h2(
    sender: &mut hyper::client::conn::http2::SendRequest<ReqBody>,
    req: Request<ReqBody>,
) -> hyper::Result<Reply> {
    let response = tokio::time::timeout(IO_DEADLINE, async {
        sender.ready().await?;
        sender.send_request(req).await
    })
    .await
    .expect("h2 response within the deadline")?;
    Ok(Reply::from_hyper(response).await)
}

/// Checks that `reply` is a refusal Ostiary produced (docs/design.md §5): `status`, JSON with
/// `error == kind`, a non-empty `message`, and `request_id` equal to the
/// `ostiary-request-id` header; a 407 also asks for Basic. Returns the JSON body.
pub fn assert_ostiary_error(reply: &Reply, status: u16, kind: &str) -> Value {
    assert_eq!(reply.status.as_u16(), status, "unexpected status:\n{reply}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/json"),
        "an Ostiary refusal is JSON:\n{reply}"
    );
    let id = reply
        .request_id()
        .unwrap_or_else(|| panic!("no {REQUEST_ID} header:\n{reply}"));
    let body = reply.json();
    assert_eq!(body["error"], kind, "{reply}");
    assert_eq!(body["request_id"], id, "{reply}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "a refusal explains itself in `message`:\n{reply}"
    );
    if status == 407 {
        assert_eq!(
            reply.header("proxy-authenticate"),
            Some("Basic realm=\"ostiary\""),
            "{reply}"
        );
    }
    body
}

/// [`assert_ostiary_error`], then the audit record of the same request id, checked to
/// record the same outcome. Returns the body and the record.
pub async fn assert_refused(
    proxy: &TestProxy,
    reply: &Reply,
    status: u16,
    kind: &str,
) -> (Value, AuditRecord) {
    let body = assert_ostiary_error(reply, status, kind);
    let id = reply.request_id().expect("checked above");
    let record = proxy.audit_of(id).await;
    let decision = if kind.starts_with("upstream_") || kind == "internal_error" {
        "error"
    } else {
        "deny"
    };
    assert_eq!(record.decision, decision, "{record:#?}");
    assert_eq!(record.error.as_deref(), Some(kind), "{record:#?}");
    assert_eq!(record.status, Some(status), "{record:#?}");
    (body, record)
}

/// Waits (polling, up to [`IO_DEADLINE`]) for an audit record matching `pred`: records of
/// refused handshakes and tunnels are written after the client already saw the drop.
pub async fn wait_for_audit(
    proxy: &TestProxy,
    what: &str,
    pred: impl Fn(&AuditRecord) -> bool,
) -> AuditRecord {
    let deadline = tokio::time::Instant::now() + IO_DEADLINE;
    loop {
        let records = proxy.audit().await;
        if let Some(r) = records.iter().find(|r| pred(r)) {
            return r.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no audit record for {what}; records: {records:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
