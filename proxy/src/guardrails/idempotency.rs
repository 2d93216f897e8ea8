//! `Idempotency-Key` on a mutating request (docs/design.md §5): within one session, a retry with
//! the same key gets the stored outcome instead of a second execution; the same key on a
//! different request is refused (`422 idempotency_mismatch`).
//!
//! The key is claimed before the request is decided; the claim is released if the request
//! never reaches the upstream (refused, held, failed to connect), so a retry is decided
//! afresh; once the upstream answered, its answer (status, headers, body up to
//! `sessions.idempotency_max_bytes`) is stored with the key. A retry while the first is
//! still running, or whose answer was too large to keep, gets `409`: running it again could
//! apply it twice.

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

use std::sync::Arc;

use super::store::{Begun, GuardStore};
use crate::approvals::model::StoredResponse;
use crate::body::{self, ProxyBody};
use crate::classify::Target;
use crate::error::ProxyError;
use crate::store::Call;

pub const HEADER: &str = "idempotency-key";
/// Marks an answer replayed from the store.
pub const REPLAYED: &str = "idempotency-replayed";
const MAX_KEY: usize = 255;

/// The request's `Idempotency-Key`, if it is a mutating request carrying a usable one.
pub fn key(headers: &HeaderMap, method: &Method) -> Result<Option<String>, ProxyError> {
    if method.is_safe() {
        return Ok(None);
    }
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ProxyError::bad_request("more than one Idempotency-Key"));
    }
    let key = value
        .to_str()
        .ok()
        .filter(|k| {
            !k.is_empty()
                && k.len() <= MAX_KEY
                && k.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        })
        .ok_or_else(|| {
            ProxyError::bad_request(format!(
                "Idempotency-Key must be 1-{MAX_KEY} printable ASCII characters"
            ))
        })?;
    Ok(Some(key.to_owned()))
}

/// What makes two requests "the same": method, destination and body.
pub fn fingerprint(target: &Target, body: &[u8]) -> String {
    let mut h = Sha256::new();
    for part in [
        target.method.as_str().as_bytes(),
        target.scheme.as_bytes(),
        target.host.to_string().as_bytes(),
        target.port.to_string().as_bytes(),
        target.path.as_bytes(),
        target.query.as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update((body.len() as u64).to_be_bytes());
    h.update(body);
    hex::encode(h.finalize())
}

/// A claimed key: released on drop unless [`Claim::store`] recorded an outcome.
#[derive(Debug)]
pub struct Claim {
    store: Arc<dyn GuardStore>,
    session: String,
    key: String,
    max_bytes: usize,
    settled: bool,
}

/// What the key says about this request.
#[derive(Debug)]
pub enum Begin {
    /// Run it; keep the claim to store the outcome.
    Run(Claim),
    /// Answer with this (a replay).
    Replay(Response<ProxyBody>),
}

/// Claim `key` for the request, or answer from what an earlier request with it left.
pub async fn begin(
    store: &Arc<dyn GuardStore>,
    session: &str,
    key: String,
    fingerprint: String,
    ttl_ms: i64,
    max_bytes: usize,
) -> Result<Begin, ProxyError> {
    let (s, k) = (session.to_owned(), key.clone());
    let begun = store
        .call(move |st| st.idempotency_begin(&s, &k, &fingerprint, ttl_ms, crate::store::now_ms()))
        .await
        .map_err(|e| ProxyError::Internal {
            reason: format!("idempotency store: {e}"),
        })?;
    match begun {
        Begun::Fresh => Ok(Begin::Run(Claim {
            store: store.clone(),
            session: session.to_owned(),
            key,
            max_bytes,
            settled: false,
        })),
        Begun::Done(Some(stored)) => Ok(Begin::Replay(replay(&stored))),
        Begun::Done(None) => Err(ProxyError::IdempotencyConflict {
            key,
            reason: "its first answer could not be kept (too large, or cut short), so it cannot \
                     be replayed",
        }),
        Begun::Running => Err(ProxyError::IdempotencyConflict {
            key,
            reason: "the first request with this key is still running",
        }),
        Begun::Mismatch => Err(ProxyError::IdempotencyMismatch { key }),
    }
}

fn replay(stored: &StoredResponse) -> Response<ProxyBody> {
    let mut response = Response::new(body::full(stored.body.clone()));
    *response.status_mut() =
        http::StatusCode::from_u16(stored.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(REPLAYED, http::HeaderValue::from_static("true"));
    response
}

impl Claim {
    /// Keep the upstream's answer with the key and hand it on. The answer is read whole
    /// (up to the limit) so that what is stored is what the agent got; a longer one is
    /// passed on as it streams and the key remembers only that it ran.
    pub async fn store(mut self, response: Response<ProxyBody>) -> Response<ProxyBody> {
        let (parts, mut body) = response.into_parts();
        let mut buffer = Vec::new();
        let mut too_large = false;
        let mut failed = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        buffer.extend_from_slice(&data);
                        if buffer.len() > self.max_bytes {
                            too_large = true;
                            break;
                        }
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let stored = (!too_large && failed.is_none()).then(|| StoredResponse {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .filter_map(|(n, v)| Some((n.to_string(), v.to_str().ok()?.to_owned())))
                .collect(),
            body: buffer.clone(),
            truncated: false,
        });
        let (store, session, key) = (self.store.clone(), self.session.clone(), self.key.clone());
        let kept = stored.clone();
        if let Err(e) = store
            .call(move |s| s.idempotency_done(&session, &key, kept.as_ref()))
            .await
        {
            tracing::error!(error = %e, "storing an idempotent outcome failed");
        }
        self.settled = true;
        let head = Bytes::from(buffer);
        let body = if let Some(error) = failed {
            // The agent sees the answer fail as it did, after what arrived of it.
            let frames =
                futures_util::stream::iter([Ok(hyper::body::Frame::data(head)), Err(error)]);
            body::stream(http_body_util::StreamBody::new(frames))
        } else if too_large {
            // The rest still streams to the agent after what was read.
            let rest = body;
            let head_frame = futures_util::stream::once(async move {
                Ok::<_, crate::body::BoxError>(hyper::body::Frame::data(head))
            });
            let tail = http_body_util::BodyStream::new(rest);
            body::stream(http_body_util::StreamBody::new(
                futures_util::StreamExt::chain(head_frame, tail),
            ))
        } else {
            body::full(head)
        };
        Response::from_parts(parts, body)
    }

    /// The request never reached the upstream (refused, held, failed): free the key before
    /// the answer goes out, so that a retry sent the moment the agent reads it is decided
    /// afresh rather than told the first is still running.
    pub async fn release(mut self) {
        self.settled = true;
        self.releasing().await;
    }

    fn releasing(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (store, session, key) = (self.store.clone(), self.session.clone(), self.key.clone());
        async move {
            if let Err(e) = store
                .call(move |s| s.idempotency_abandon(&session, &key))
                .await
            {
                tracing::error!(error = %e, "releasing an idempotency key failed");
            }
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // Dropped unanswered (the agent hung up mid-request): released in the background.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(self.releasing());
        }
    }
}
