//! One connection to the test upstream: its TLS handshake (SNI and client certificate
//! recorded), HTTP/1.1 or h2, each request recorded and dispatched to its route, and the
//! WebSocket echo.

use super::reflect::reflect;
use super::routes::*;
use super::*;

#[derive(Clone)]
pub(super) struct Connection {
    pub(super) state: ServerState,
    pub(super) options: ServeOptions,
    pub(super) peer: SocketAddr,
    pub(super) stop: watch::Receiver<bool>,
}

impl Connection {
    pub(super) async fn run(self, stream: TcpStream, acceptor: Option<TlsAcceptor>) {
        let _ = stream.set_nodelay(true);
        match acceptor {
            None => self.serve_io(stream, None).await,
            Some(acceptor) => {
                let accepted =
                    tokio::time::timeout(self.options.handshake_timeout, acceptor.accept(stream))
                        .await;
                // Handshake failures are expected in tests (a client that distrusts the CA);
                // the client reports them, so the server stays quiet.
                if let Ok(Ok(tls)) = accepted {
                    let sni = tls.get_ref().1.server_name().map(str::to_owned);
                    if let Some(leaf) = tls.get_ref().1.peer_certificates().and_then(|c| c.first())
                    {
                        self.state
                            .client_certs
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(leaf.to_vec());
                    }
                    self.serve_io(tls, sni).await;
                }
            }
        }
    }

    async fn serve_io<I>(self, io: I, sni: Option<String>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut stop = self.stop.clone();
        let sni: Option<Arc<str>> = sni.map(Into::into);
        let http2 = self.options.http2;
        let this = Arc::new(self);
        let service = hyper::service::service_fn(move |req| {
            let this = this.clone();
            let sni = sni.clone();
            async move { Ok::<_, Infallible>(this.handle(req, sni.as_deref()).await) }
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        if !http2 {
            builder = builder.http1_only();
        }
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = stop.wait_for(|stop| *stop) => {}
        }
    }

    async fn handle(&self, mut req: Request<Incoming>, sni: Option<&str>) -> Response<Body> {
        let id = self.state.record(&req, self.peer, sni);
        let path = req.uri().path().to_owned();
        if path == "/ws" {
            // The upgrade must be claimed before the request is consumed.
            return self.websocket(&mut req, id);
        }
        let keep = path == "/grpc"
            || path == "/reflect"
            || path == "/messages"
            || path.starts_with("/records")
            || path.starts_with("/v1/")
            || path.starts_with("/git/");
        let (parts, body) = req.into_parts();
        let read = read_body(body, &self.state, id, keep).await;
        if !read.complete {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": "request body did not complete", "received": read.len}),
            );
        }
        match path.as_str() {
            "/echo" => echo(&parts, sni, &read),
            "/stream" => stream(parts.uri.query()),
            "/upload" => json_response(
                StatusCode::OK,
                json!({"received": read.len, "sha256": hex(&read.sha256)}),
            ),
            "/grpc" => grpc(read.data.unwrap_or_default()),
            "/reflect" => reflect(&parts, read.data.unwrap_or_default()).await,
            "/messages" => messages(&self.state, &parts, read.data.unwrap_or_default()),
            _ if path == "/records" || path.starts_with("/records/") => {
                records(&self.state, &parts, &path, read.data.unwrap_or_default())
            }
            "/v1/chat/completions" | "/v1/messages" => {
                model_stand_in(&path, &read.data.unwrap_or_default())
            }
            _ if path.starts_with("/git/") => match &self.options.git_root {
                Some(root) => git_http_backend(root, &parts, read.data.unwrap_or_default()).await,
                None => json_response(
                    StatusCode::NOT_FOUND,
                    json!({"error": "not_found", "path": path}),
                ),
            },
            _ if path.starts_with("/idem/") => {
                let response = idempotent(&self.state, &parts, &path, &read);
                // `?delay_ms=N`: applied at once, answered late, so a test can kill the
                // caller after the effect and before it learns the outcome.
                if let Some(ms) =
                    query_param(parts.uri.query(), "delay_ms").and_then(|v| v.parse().ok())
                {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                response
            }
            _ => match path.strip_prefix("/status/") {
                Some(code) => status(code),
                None => json_response(
                    StatusCode::NOT_FOUND,
                    json!({"error": "not_found", "path": path}),
                ),
            },
        }
    }

    fn websocket(&self, req: &mut Request<Incoming>, id: u64) -> Response<Body> {
        let headers = req.headers();
        let has_token = |name: HeaderName, token: &str| {
            headers.get_all(name).iter().any(|v| {
                v.to_str()
                    .unwrap_or_default()
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case(token))
            })
        };
        let is_upgrade = req.version() == Version::HTTP_11
            && has_token(hyper::header::CONNECTION, "upgrade")
            && has_token(hyper::header::UPGRADE, "websocket");
        let key = headers.get(hyper::header::SEC_WEBSOCKET_KEY).cloned();
        let (true, Some(key)) = (is_upgrade, key) else {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": "expected an HTTP/1.1 WebSocket upgrade"}),
            );
        };
        // An upgrade request carries no body, so its record is complete as it stands.
        self.state.update(id, |s| s.body_complete = true);
        let on_upgrade = hyper::upgrade::on(req);
        let mut stop = self.stop.clone();
        let stored = self.state.messages.clone();
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let mut ws =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            loop {
                let msg = tokio::select! {
                    msg = ws.next() => msg,
                    _ = stop.wait_for(|stop| *stop) => break,
                };
                match msg {
                    // What `/messages` stored, handed back over the socket: one message, or
                    // one message in fragments of 7 bytes.
                    Some(Ok(Message::Text(ask))) if ask.as_str().starts_with("messages") => {
                        let text = json!({
                            "messages": *stored.lock().unwrap_or_else(|e| e.into_inner())
                        })
                        .to_string();
                        let sent = if ask.as_str() == "messages in fragments" {
                            send_fragments(&mut ws, text.as_bytes(), 7).await
                        } else {
                            ws.send(Message::text(text)).await
                        };
                        if sent.is_err() {
                            break;
                        }
                    }
                    Some(Ok(msg @ (Message::Text(_) | Message::Binary(_)))) => {
                        if ws.send(msg).await.is_err() {
                            break;
                        }
                    }
                    // tungstenite answers pings and closes by itself while we keep reading.
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
        });
        let mut resp = Response::new(empty());
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(
            hyper::header::CONNECTION,
            HeaderValue::from_static("upgrade"),
        );
        h.insert(
            hyper::header::UPGRADE,
            HeaderValue::from_static("websocket"),
        );
        h.insert(
            hyper::header::SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
                .expect("base64 is a valid header value"),
        );
        resp
    }
}

/// `text` as one text message in fragments of `size` bytes.
async fn send_fragments<S>(
    ws: &mut WebSocketStream<S>,
    text: &[u8],
    size: usize,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    let pieces: Vec<&[u8]> = text.chunks(size).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let opcode = if i == 0 { Data::Text } else { Data::Continue };
        let last = i + 1 == pieces.len();
        let frame = Frame::message(piece.to_vec(), OpCode::Data(opcode), last);
        ws.send(Message::Frame(frame)).await?;
    }
    Ok(())
}
