//! A body that counts the bytes it carries into its session's budget and keeps the
//! request in flight ([`Ticket`]) until it ends — so teardown waits for an answer still
//! streaming, and cuts it when the grace period is over.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::inflight::Ticket;
use super::meter::Meter;
use crate::body::BoxError;

/// Which way the bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Sent,
    Received,
}

/// A body counted into `session`'s usage as it flows.
pub struct Counted<B> {
    inner: B,
    meter: Arc<Meter>,
    session: Arc<str>,
    direction: Direction,
    /// Held until the body ends (answers only).
    ticket: Option<Ticket>,
    cancelled: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl<B> std::fmt::Debug for Counted<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("session", &self.session)
            .field("direction", &self.direction)
            .finish_non_exhaustive()
    }
}

impl<B> Counted<B> {
    pub fn new(
        inner: B,
        meter: Arc<Meter>,
        session: &str,
        direction: Direction,
        ticket: Option<Ticket>,
    ) -> Self {
        let cancelled = ticket
            .as_ref()
            .map(|t| Box::pin(t.cancelled.clone().cancelled_owned()));
        Self {
            inner,
            meter,
            session: Arc::from(session),
            direction,
            ticket,
            cancelled,
        }
    }
}

/// The session ended and its grace period ran out while this body was still flowing.
#[derive(Debug, thiserror::Error)]
#[error("the session was torn down while the body was still flowing")]
pub struct TornDown;

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(cancelled) = self.cancelled.as_mut() {
            if cancelled.as_mut().poll(cx).is_ready() {
                self.cancelled = None;
                self.ticket = None;
                return Poll::Ready(Some(Err(Box::new(TornDown))));
            }
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    match self.direction {
                        Direction::Sent => self.meter.add_bytes(&self.session, n, 0),
                        Direction::Received => self.meter.add_bytes(&self.session, 0, n),
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.ticket = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                // Out of flight as soon as the last byte left, not when the connection
                // gets round to dropping the body.
                self.ticket = None;
                self.cancelled = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
