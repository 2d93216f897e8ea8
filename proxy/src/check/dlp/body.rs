//! [`DlpBody`]: a request body scanned on its way to the upstream, stopped at the first
//! secret.
//!
//! Released bytes are forwarded as they come; bytes that could still be part of a secret
//! wait (see [`super::stream`]). On a finding the body ends with an error frame, so hyper
//! aborts the upstream request: the upstream sees an incomplete body, never the secret.
//! The finding goes into a slot the caller holds, because the error that reaches the caller
//! through hyper is an opaque send error — the slot says what happened (as the
//! placeholder guard of `inject::body_guard` does).

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::{Detectors, Finding, StreamScanner};
use crate::body::{BoxError, ProxyBody};

/// The error a [`DlpBody`] ends with. It names the kind and the offset, never the bytes.
#[derive(Debug, thiserror::Error)]
#[error("the body was stopped by the dlp check: it carries a {} at byte {}", .0.kind, .0.offset)]
pub struct Blocked(pub Finding);

/// A body scanned for secrets as it streams.
pub struct DlpBody {
    inner: ProxyBody,
    scanner: StreamScanner,
    slot: Arc<OnceLock<Finding>>,
    /// The source has ended: the held tail has been released.
    ended: bool,
    /// Trailers of the source, passed on after the data once it ended clean.
    trailers: Option<HeaderMap>,
    /// Nothing more will be yielded (blocked, failed, or finished).
    done: bool,
}

impl std::fmt::Debug for DlpBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlpBody")
            .field("scanner", &self.scanner)
            .field("ended", &self.ended)
            .field("done", &self.done)
            .finish()
    }
}

impl DlpBody {
    /// Wrap `inner`; the slot is set once a secret is found. Returns the boxed body, as
    /// the request that carries it takes a [`ProxyBody`].
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inner: ProxyBody, detectors: Arc<Detectors>) -> (ProxyBody, Arc<OnceLock<Finding>>) {
        let slot = Arc::new(OnceLock::new());
        let body = DlpBody {
            inner,
            scanner: StreamScanner::new(detectors),
            slot: slot.clone(),
            ended: false,
            trailers: None,
            done: false,
        };
        (http_body_util::BodyExt::boxed(body), slot)
    }

    fn block(&mut self, finding: Finding) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        let _ = self.slot.set(finding.clone());
        Poll::Ready(Some(Err(Box::new(Blocked(finding)))))
    }

    /// The source ended (with `trailers`, maybe): release the held tail.
    fn end(&mut self, trailers: Option<HeaderMap>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.scanner.finish() {
            Err(finding) => self.block(finding),
            Ok(rest) => {
                self.ended = true;
                self.trailers = trailers;
                if rest.is_empty() {
                    self.after_end()
                } else {
                    Poll::Ready(Some(Ok(Frame::data(rest))))
                }
            }
        }
    }

    fn after_end(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

impl Body for DlpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.ended {
            return this.after_end();
        }
        loop {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.scanner.push(data) {
                        // All of it held back: ask the source for more.
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(finding) => return this.block(finding),
                    },
                    Err(frame) => return this.end(frame.into_trailers().ok()),
                },
                Some(Err(e)) => {
                    // Held bytes of a failed body are not forwarded after its error.
                    this.scanner.discard();
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => return this.end(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.ended && self.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        if self.done || self.ended {
            return SizeHint::with_exact(0);
        }
        // A clean body comes out as it went in: the source's remainder plus what is held.
        let inner = self.inner.size_hint();
        let held = self.scanner.held() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}
