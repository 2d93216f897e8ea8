//! The one body type the proxy hands around: a boxed stream of `Bytes`, so upstream and
//! agent bodies stream through without ever being collected. Bodies rewritten or watched
//! on their way are [`filter::Filtered`]; answers streamed to an agent are [`paced::Paced`]
//! last; an answer whose end something waits for is [`Holding`] a guard.

pub mod filter;
pub mod paced;

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

/// Errors carried by body streams.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Body of every request and response the proxy produces or forwards.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body made of one buffer (Ostiary's own small responses).
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Box any streaming body whose error converts into [`BoxError`].
pub fn stream<B>(body: B) -> ProxyBody
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// Box the agent's request body and remember why it failed, if it does: a failure of the
/// agent's own stream (framing broken mid-body, a hang-up) surfaces upstream-side as an
/// opaque send error, and must be reported as the agent's, not blamed on the upstream.
pub fn watched<B>(body: B) -> (ProxyBody, Arc<OnceLock<String>>)
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let failed = Arc::new(OnceLock::new());
    let slot = failed.clone();
    let body = body
        .map_err(move |e| {
            let e: BoxError = e.into();
            let _ = slot.set(e.to_string());
            e
        })
        .boxed();
    (body, failed)
}

/// An answer's body that holds `guard` until hyper drops it: hyper drops a body once it has
/// taken the last frame (or the stream was reset), so the guard's drop marks the end of the
/// request as the connection sees it — what counting requests in flight needs.
#[derive(Debug)]
pub struct Holding<B, G> {
    body: B,
    _guard: G,
}

impl<B, G> Holding<B, G> {
    pub fn new(body: B, guard: G) -> Self {
        Self {
            body,
            _guard: guard,
        }
    }
}

impl<B: Body + Unpin, G: Unpin> Body for Holding<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
