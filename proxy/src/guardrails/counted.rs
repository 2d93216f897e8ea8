//! A body that counts the bytes it carries into its session's budget and keeps the
//! request in flight ([`Ticket`]) until it ends — so teardown waits for an answer still
//! streaming, and cuts it when the grace period is over.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::inflight::Ticket;
use super::meter::Meter;
use crate::body::filter::{ChunkFilter, Filtered, Length};
use crate::body::BoxError;

/// Which way the bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Sent,
    Received,
}

/// A body counted into its session's usage as it flows.
pub type Counted<B> = Filtered<B, Counter>;

/// Counts the bytes passing into `session`'s usage.
pub struct Counter {
    meter: Arc<Meter>,
    session: Arc<str>,
    direction: Direction,
    /// Held until the body ends (answers only).
    ticket: Option<Ticket>,
    cancelled: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter")
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
        let counter = Counter {
            meter,
            session: Arc::from(session),
            direction,
            ticket,
            cancelled,
        };
        Filtered::wrap(inner, counter)
    }
}

/// The session ended and its grace period ran out while this body was still flowing.
#[derive(Debug, thiserror::Error)]
#[error("the session was torn down while the body was still flowing")]
pub struct TornDown;

impl ChunkFilter for Counter {
    type Error = TornDown;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), TornDown> {
        let n = chunk.len() as u64;
        match self.direction {
            Direction::Sent => self.meter.add_bytes(&self.session, n, 0),
            Direction::Received => self.meter.add_bytes(&self.session, 0, n),
        }
        out.push_back(chunk);
        Ok(())
    }

    fn finish(&mut self, _: &mut VecDeque<Bytes>) -> Result<(), TornDown> {
        // Out of flight as soon as the last byte left, not when the connection gets round
        // to dropping the body.
        self.ticket = None;
        self.cancelled = None;
        Ok(())
    }

    fn failed(&mut self, error: BoxError) -> BoxError {
        self.ticket = None;
        error
    }

    fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<TornDown> {
        let Some(cancelled) = self.cancelled.as_mut() else {
            return Poll::Pending;
        };
        if cancelled.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.cancelled = None;
        self.ticket = None;
        Poll::Ready(TornDown)
    }

    fn length(&self) -> Length {
        Length::Unchanged
    }
}
