//! The routes of the test upstream (see the parent module's doc for what each answers):
//! request-body reading that records what arrived, and the handlers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
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
