//! The routes of the test upstream (see the parent module's doc for what each answers):
//! request-body reading that records what arrived, and the handlers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::time::Duration;

use super::*;

pub(super) struct BodyRead {
    pub(super) len: u64,
    pub(super) sha256: [u8; 32],
    pub(super) complete: bool,
    pub(super) data: Option<Bytes>,
}

pub(super) async fn read_body(
    mut body: Incoming,
    state: &ServerState,
    id: u64,
    keep: bool,
) -> BodyRead {
    let mut len = 0u64;
    let mut hasher = Sha256::new();
    let mut data = keep.then(Vec::new);
    let complete = loop {
        match body.frame().await {
            None => break true,
            Some(Err(_)) => break false,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    len += chunk.len() as u64;
                    hasher.update(&chunk);
                    if let Some(data) = data.as_mut() {
                        data.extend_from_slice(&chunk);
                    }
                    // Updated per chunk so a test can observe a partial delivery.
                    state.update(id, |s| s.body_len = len);
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        state.update(id, |s| s.trailers = Some(trailers));
                    }
                }
            },
        }
    };
    let sha256: [u8; 32] = hasher.finalize().into();
    state.update(id, |s| {
        s.body_complete = complete;
        s.body_sha256 = complete.then(|| hex(&sha256));
    });
    BodyRead {
        len,
        sha256,
        complete,
        data: data.map(Bytes::from),
    }
}

pub(super) fn echo(
    parts: &hyper::http::request::Parts,
    sni: Option<&str>,
    read: &BodyRead,
) -> Response<Body> {
    let mut headers = Map::new();
    for name in parts.headers.keys() {
        let values: Vec<Value> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let value = if values.len() == 1 {
            values.into_iter().next().unwrap_or_default()
        } else {
            Value::Array(values)
        };
        headers.insert(name.as_str().to_owned(), value);
    }
    let authority = parts.uri.authority().map(|a| a.to_string()).or_else(|| {
        parts
            .headers
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    });
    json_response(
        StatusCode::OK,
        json!({
            "method": parts.method.as_str(),
            "path": parts.uri.path(),
            "query": parts.uri.query(),
            "uri": parts.uri.to_string(),
            "authority": authority,
            "version": format!("{:?}", parts.version),
            "headers": headers,
            "body_len": read.len,
            "body_sha256": hex(&read.sha256),
            "sni": sni,
        }),
    )
}

pub(super) fn stream(query: Option<&str>) -> Response<Body> {
    let param = |name: &str, default: u64| -> u64 {
        query
            .unwrap_or_default()
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(default)
    };
    let chunks = param("chunks", 8);
    let size = param("size", 1024) as usize;
    let delay = Duration::from_millis(param("delay_ms", 5));
    // Bounded so a typo in a test cannot exhaust the machine.
    if chunks > 1_000_000 || size > 16 << 20 || chunks.saturating_mul(size as u64) > 4 << 30 {
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "stream too large", "max_chunks": 1_000_000, "max_size": 16 << 20}),
        );
    }
    let frames = futures_util::stream::unfold(0u64, move |i| async move {
        if i >= chunks {
            return None;
        }
        if i > 0 && !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let byte = b'a' + (i % 26) as u8;
        let frame = Frame::data(Bytes::from(vec![byte; size]));
        Some((Ok::<_, Infallible>(frame), i + 1))
    });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp
}

pub(super) fn grpc(body: Bytes) -> Response<Body> {
    let well_framed = grpc_frames_ok(&body);
    let mut trailers = HeaderMap::new();
    let (status, message, data) = if well_framed {
        ("0", "ok", body)
    } else {
        ("13", "malformed length-prefixed message", Bytes::new())
    };
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    trailers.insert("grpc-message", HeaderValue::from_static(message));
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(data)),
        Ok(Frame::trailers(trailers)),
    ];
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(
        futures_util::stream::iter(frames),
    )));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// Whether `body` is a sequence of whole gRPC messages: 1 flag byte, a 4-byte
/// big-endian length, then that many bytes.
pub(super) fn grpc_frames_ok(mut body: &[u8]) -> bool {
    while !body.is_empty() {
        if body.len() < 5 {
            return false;
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let Some(rest) = body[5..].get(len..) else {
            return false;
        };
        body = rest;
    }
    true
}

pub(super) fn status(code: &str) -> Response<Body> {
    let Some(status) = code
        .parse::<u16>()
        .ok()
        .filter(|c| *c >= 200)
        .and_then(|c| StatusCode::from_u16(c).ok())
    else {
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "expected a final status code 200..=999", "got": code}),
        );
    };
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        let mut resp = Response::new(empty());
        *resp.status_mut() = status;
        return resp;
    }
    json_response(status, json!({"status": status.as_u16()}))
}

pub(super) fn json_response(status: StatusCode, value: Value) -> Response<Body> {
    let mut resp = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from(
        value.to_string(),
    ))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) fn empty() -> Body {
    BodyExt::boxed_unsync(Full::new(Bytes::new()))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of query parameter `name` (not decoded), if present.
pub(super) fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A fixed body for `/reflect?mode=plain`: bytes that look like secrets in the making
/// (a canary-like prefix, base64-ish runs) without being any, so a scrubber that holds
/// back or rewrites too eagerly changes it.
pub fn plain_reflect_body() -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..200u32 {
        out.extend_from_slice(
            format!("{i:04} ghp_CANARY_5f3a Z2hwX0NBTkFSWV9 %2B%2F== Bearer x-access-token:\n")
                .as_bytes(),
        );
    }
    out
}

/// Header values, lossily as text, for the echoes.
pub(super) fn text(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// `bytes` as a body of `size`-byte frames, each its own frame on the wire.
pub(super) fn chunked(bytes: Vec<u8>, size: usize, delay: Duration) -> Body {
    let bytes = Bytes::from(bytes);
    let frames = futures_util::stream::unfold(0usize, move |at| {
        let bytes = bytes.clone();
        async move {
            if at >= bytes.len() {
                return None;
            }
            if at > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let end = (at + size).min(bytes.len());
            let frame = Frame::data(bytes.slice(at..end));
            Some((Ok::<_, Infallible>(frame), end))
        }
    });
    BodyExt::boxed_unsync(StreamBody::new(frames))
}

/// `/messages`: `GET` hands back every stored request; any other method stores this one
/// (path with query, headers, body) without echoing it.
pub(super) fn messages(
    state: &ServerState,
    parts: &http::request::Parts,
    body: Bytes,
) -> Response<Body> {
    let mut stored = state.messages.lock().unwrap_or_else(|e| e.into_inner());
    if parts.method == hyper::Method::GET {
        return json_response(StatusCode::OK, json!({ "messages": *stored }));
    }
    let headers: Vec<Value> = parts
        .headers
        .iter()
        .map(|(n, v)| json!([n.as_str(), text(v)]))
        .collect();
    stored.push(json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/"),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }));
    json_response(StatusCode::CREATED, json!({ "stored": stored.len() }))
}

/// `/records`: create (`POST /records`), remove (`DELETE /records/{id}`), list (`GET`).
pub(super) fn records(
    state: &ServerState,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
) -> Response<Body> {
    let mut guard = state.records.lock().unwrap_or_else(|e| e.into_inner());
    let (records, made) = &mut *guard;
    match (&parts.method, path.strip_prefix("/records/")) {
        (&hyper::Method::GET, None) => {
            json_response(StatusCode::OK, json!({ "records": *records }))
        }
        (&hyper::Method::POST, None) => {
            *made += 1;
            let id = query_param(parts.uri.query(), "id")
                .map(str::to_owned)
                .unwrap_or_else(|| format!("r{made}"));
            let mut record: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
            record["id"] = json!(id);
            records.push(record);
            json_response(StatusCode::CREATED, json!({ "id": id, "n": *made }))
        }
        (&hyper::Method::DELETE, Some(id)) => {
            let before = records.len();
            records.retain(|r| r["id"] != json!(id));
            if records.len() < before {
                let mut resp = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::new())));
                *resp.status_mut() = StatusCode::NO_CONTENT;
                resp
            } else {
                json_response(
                    StatusCode::NOT_FOUND,
                    json!({"error": "no such record", "id": id}),
                )
            }
        }
        _ => json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error": "method not allowed"}),
        ),
    }
}

/// `/idem/...` (`?delay_ms=N` answers N ms late): a mutating endpoint that honours
/// `Idempotency-Key` the way payment APIs do: the first request with a key is applied (recorded in `effects`) and answered 201;
/// a repeat is answered the same, marked `idempotent-replayed: true`, and applies
/// nothing.
pub(super) fn idempotent(
    state: &ServerState,
    parts: &http::request::Parts,
    path: &str,
    read: &BodyRead,
) -> Response<Body> {
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut effects = state.effects.lock().unwrap_or_else(|e| e.into_inner());
    let earlier = key
        .as_ref()
        .and_then(|k| effects.iter().position(|e| e.key.as_ref() == Some(k)));
    let (number, replayed) = match earlier {
        Some(i) => (i + 1, true),
        None => {
            effects.push(Effect {
                key: key.clone(),
                method: parts.method.to_string(),
                path: path.to_owned(),
                body_sha256: hex(&read.sha256),
            });
            (effects.len(), false)
        }
    };
    let mut response = json_response(
        StatusCode::CREATED,
        json!({"applied": number, "key": key, "path": path}),
    );
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// `POST /v1/chat/completions` and `POST /v1/messages`: stand-ins for the OpenAI and
/// Anthropic APIs, answering what their SDKs parse (a chat completion, a message) with the
/// text `Hello from the stand-in.` and the request's `model`.
pub(super) fn model_stand_in(path: &str, body: &Bytes) -> Response<Body> {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let model = request["model"].as_str().unwrap_or("stand-in").to_owned();
    let text = "Hello from the stand-in.";
    let answer = if path == "/v1/chat/completions" {
        json!({
            "id": "chatcmpl-stand-in",
            "object": "chat.completion",
            "created": 1_767_225_600,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        })
    } else {
        json!({
            "id": "msg_stand_in",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 5},
        })
    };
    json_response(StatusCode::OK, answer)
}

/// `/git/<repo>/...`: git's smart HTTP through `git http-backend` as a CGI program (RFC 3875
/// variables in, `Status:` and headers out), over the repositories under `root`.
pub(super) async fn git_http_backend(
    root: &std::path::Path,
    parts: &hyper::http::request::Parts,
    body: Bytes,
) -> Response<Body> {
    use tokio::io::AsyncWriteExt;
    let path_info = parts.uri.path().strip_prefix("/git").unwrap_or("/");
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", root)
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", path_info)
        .env("QUERY_STRING", parts.uri.query().unwrap_or_default())
        .env("CONTENT_TYPE", header(hyper::header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let encoding = header(hyper::header::CONTENT_ENCODING);
    if !encoding.is_empty() {
        cmd.env("HTTP_CONTENT_ENCODING", encoding);
    }
    if let Some(protocol) = parts
        .headers
        .get("git-protocol")
        .and_then(|v| v.to_str().ok())
    {
        cmd.env("HTTP_GIT_PROTOCOL", protocol);
    }
    let failed = |what: String| {
        json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "git http-backend", "detail": what}),
        )
    };
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return failed(format!("cannot start git http-backend: {e}")),
    };
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Written while the output is read, so neither pipe can fill up and stall the other.
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let out = match child.wait_with_output().await {
        Ok(out) => out,
        Err(e) => return failed(format!("waiting for git http-backend: {e}")),
    };
    let _ = writer.await;
    let stdout = out.stdout;
    let Some((head_len, sep)) = [&b"\r\n\r\n"[..], b"\n\n"]
        .iter()
        .filter_map(|sep| {
            stdout
                .windows(sep.len())
                .position(|w| w == *sep)
                .map(|at| (at, sep.len()))
        })
        .min()
    else {
        return failed(format!(
            "no CGI header in its output (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    };
    let head = String::from_utf8_lossy(&stdout[..head_len]).into_owned();
    let mut resp = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::copy_from_slice(
        &stdout[head_len + sep..],
    ))));
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("200");
            if let Some(status) = code
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
            {
                *resp.status_mut() = status;
            }
        } else if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            resp.headers_mut().append(name, value);
        }
    }
    resp
}
