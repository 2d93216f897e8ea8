//! One adapter for every body the proxy rewrites or watches as it streams (response scrub,
//! decoding, DLP, the placeholder guard, the MCP SSE filter, byte counting): each is a
//! [`ChunkFilter`] that says what to do with a chunk, at the end and with the trailers, and
//! [`Filtered`] drives the frames. End of stream, trailers, empty frames, errors and size
//! hints are decided here once, so no two filters can disagree about them:
//!
//! - Data frames are fed in order; empty ones are not fed. What a filter puts out leaves
//!   in order, one frame per non-empty piece, before the source is polled again.
//! - A filter whose output for one chunk has no bound (a decoder: a few KiB can inflate
//!   to gigabytes) gives it a piece at a time from [`ChunkFilter::resume`], called while
//!   it [has more](ChunkFilter::has_more) and only once the previous piece has left: the
//!   reader's pace bounds what is held, and the source waits meanwhile.
//! - The end of the source (its end, or its trailers) calls [`ChunkFilter::finish`] once,
//!   then [`ChunkFilter::trailers`]: the flushed data leaves before the trailers, and the
//!   source is not polled after its trailers (they end a body).
//! - An error from the filter ends the body with that error, after what the filter put out
//!   before failing; the source is not polled again, and later data is never passed on.
//! - An error from the source goes through [`ChunkFilter::failed`] (which drops what is held
//!   back: bytes held when a body fails may be half a secret) and ends the body.
//! - [`ChunkFilter::poll_cut`] can end the body with an error at any poll (a teardown).
//!
//! After its end (or an error) the body yields `None`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::BoxError;

/// How a filter's output relates to its input in length: what the body's size hint and
/// end-of-stream answer can promise before it has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// The filter may rewrite the bytes: the size is unknown until the source has ended.
    Changed,
    /// The bytes leave unchanged but some may wait; `held` are waiting now.
    Delayed { held: u64 },
    /// Every byte leaves unchanged as it arrives: the body ends when its source does.
    Unchanged,
}

/// A transform or watch over a body's chunks, driven by [`Filtered`] (see the module docs
/// for the order of the calls).
pub trait ChunkFilter {
    /// What the filter ends a body with (a finding, a refusal, a teardown).
    type Error: Into<BoxError>;

    /// A non-empty data chunk arrived: push what passes on (all of it, part, or nothing
    /// yet) to `out`.
    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), Self::Error>;

    /// The source ended, with or without trailers: push what was held back. Called once.
    fn finish(&mut self, _out: &mut VecDeque<Bytes>) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The source's trailers, after [`Self::finish`]: what follows the data (default: the
    /// trailers as they came).
    fn trailers(&mut self, trailers: HeaderMap) -> Result<Option<HeaderMap>, Self::Error> {
        Ok(Some(trailers))
    }

    /// The next piece of output for what was fed, once everything put out before has left
    /// (called while [`Self::has_more`], before the source is read again or the end is
    /// yielded). A call that puts out nothing is taken as nothing more for now.
    fn resume(&mut self, _out: &mut VecDeque<Bytes>) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Whether [`Self::resume`] has output to give (default: never; all of it is put out
    /// by [`Self::feed`] and [`Self::finish`]).
    fn has_more(&self) -> bool {
        false
    }

    /// The source failed: drop what is held back, and say what the body ends with
    /// (default: the source's error).
    fn failed(&mut self, error: BoxError) -> BoxError {
        error
    }

    /// Checked at every poll until the body ends: `Ready` ends it at once with that error,
    /// dropping what has not left yet. `cx` is to be woken when it becomes ready.
    fn poll_cut(&mut self, _cx: &mut Context<'_>) -> Poll<Self::Error> {
        Poll::Pending
    }

    /// How the output's length relates to the input's (default: it may change).
    fn length(&self) -> Length {
        Length::Changed
    }
}

/// Where a [`Filtered`] body is.
enum State {
    /// Polling the source.
    Streaming,
    /// The source is finished: `out` leaves, then this, if anything.
    Ending(Option<Result<HeaderMap, BoxError>>),
    /// Nothing more will be yielded.
    Done,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The trailers are not shown, as the data is not.
        f.write_str(match self {
            State::Streaming => "Streaming",
            State::Ending(_) => "Ending",
            State::Done => "Done",
        })
    }
}

/// `source` with `filter` applied to its frames.
pub struct Filtered<B, F> {
    source: B,
    filter: F,
    /// What the filter put out and has not left yet, in order.
    out: VecDeque<Bytes>,
    state: State,
}

impl<B, F: std::fmt::Debug> std::fmt::Debug for Filtered<B, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The queued bytes are not shown: they may be what the filter is there to judge.
        f.debug_struct("Filtered")
            .field("filter", &self.filter)
            .field("queued", &self.out.len())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<B, F: ChunkFilter> Filtered<B, F> {
    /// `source`, filtered by `filter`.
    pub fn wrap(source: B, filter: F) -> Self {
        Self {
            source,
            filter,
            out: VecDeque::new(),
            state: State::Streaming,
        }
    }

    /// Send `prefix` before anything from the source (the proxy's own events first).
    pub fn with_prefix(mut self, prefix: Bytes) -> Self {
        self.out.push_front(prefix);
        self
    }

    /// The source ended, with `trailers` maybe: flush the filter, then the trailers.
    fn end(&mut self, trailers: Option<HeaderMap>) {
        let ending = self
            .filter
            .finish(&mut self.out)
            .and_then(|()| match trailers {
                Some(trailers) => self.filter.trailers(trailers),
                None => Ok(None),
            });
        self.state = State::Ending(ending.map_err(Into::into).transpose());
    }

    fn queued(&self) -> u64 {
        self.out.iter().map(|b| b.len() as u64).sum()
    }
}

impl<B, F> Body for Filtered<B, F>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    F: ChunkFilter + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if matches!(this.state, State::Done) {
            return Poll::Ready(None);
        }
        if let Poll::Ready(error) = this.filter.poll_cut(cx) {
            this.out.clear();
            this.state = State::Done;
            return Poll::Ready(Some(Err(error.into())));
        }
        loop {
            if let Some(data) = this.out.pop_front() {
                if data.is_empty() {
                    continue;
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.filter.has_more() && !matches!(this.state, State::Ending(Some(Err(_)))) {
                match this.filter.resume(&mut this.out) {
                    Err(e) => {
                        this.state = State::Ending(Some(Err(e.into())));
                        continue;
                    }
                    Ok(()) if !this.out.is_empty() => continue,
                    Ok(()) => {}
                }
            }
            if let State::Ending(last) = &mut this.state {
                let last = last.take();
                this.state = State::Done;
                return Poll::Ready(last.map(|l| l.map(Frame::trailers)));
            }
            // A source that knows it is done (its length reached) is not polled again: one
            // more poll of an HTTP/1 body returns `Pending` until its connection task
            // catches up, and the end would go out in a write (and a TLS record) of its own.
            if this.source.is_end_stream() {
                this.end(None);
                continue;
            }
            let frame = match ready!(Pin::new(&mut this.source).poll_frame(cx)) {
                None => {
                    this.end(None);
                    continue;
                }
                Some(Err(e)) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(this.filter.failed(e.into()))));
                }
                Some(Ok(frame)) => frame,
            };
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => {
                    if let Err(e) = this.filter.feed(data, &mut this.out) {
                        this.state = State::Ending(Some(Err(e.into())));
                    } else if this.source.is_end_stream() && !this.filter.has_more() {
                        // Ended with this frame: known before the frame leaves, so that the
                        // writer (and `Paced`) see the body's end with its last bytes.
                        this.end(None);
                    }
                }
                Err(frame) => this.end(frame.into_trailers().ok()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let drained = self.out.iter().all(Bytes::is_empty) && !self.filter.has_more();
        match &self.state {
            State::Done => true,
            State::Ending(last) => drained && last.is_none(),
            State::Streaming => {
                drained && self.filter.length() == Length::Unchanged && self.source.is_end_stream()
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        let queued = self.queued();
        let mut unknown = SizeHint::new();
        unknown.set_lower(queued);
        if self.filter.has_more() {
            return unknown;
        }
        if !matches!(self.state, State::Streaming) {
            return SizeHint::with_exact(queued);
        }
        let ahead = match self.filter.length() {
            Length::Changed => return unknown,
            Length::Delayed { held } => queued.saturating_add(held),
            Length::Unchanged => queued,
        };
        // What the source has yet to send leaves as it is, after what is ahead of it.
        let source = self.source.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(source.lower().saturating_add(ahead));
        if let Some(upper) = source.upper() {
            hint.set_upper(upper.saturating_add(ahead));
        }
        hint
    }
}

#[cfg(test)]
mod tests;
