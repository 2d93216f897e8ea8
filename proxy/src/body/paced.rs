//! The last wrapper of every answer the proxy streams to an agent: it lets the connection
//! write what it holds after the first piece of the body and every [`BATCH`] bytes after.
//!
//! hyper's HTTP/1 writer flushes only when the body it is writing has nothing ready, or when
//! its buffer is full (~400 KiB). An upstream that sends faster than the agent's TLS session
//! is written (nginx with a file, any stream with a backlog) always has something ready, so
//! the head and the first event of a stream waited in that buffer until hundreds of KiB
//! behind them had been read, decrypted and re-encrypted: the time to first byte of an event
//! stream was a millisecond above direct, and every streaming connection held a full buffer.
//! Saying "not ready" once (and waking at once) is what lets the writer flush in between;
//! it costs one task poll per [`BATCH`] and nothing for a body whose first piece is its last.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};

/// Bytes handed to the writer between two chances to flush.
pub const BATCH: usize = 64 * 1024;

/// hyper's bound on an HTTP/1 agent connection's buffers (`max_buf_size`): the head the agent
/// may send, and what the writer holds before it must flush — a batch and the piece that
/// passed it, rather than hyper's default ~400 KiB per streaming connection.
pub fn h1_buffer(max_header_bytes: usize) -> usize {
    max_header_bytes.max(BATCH)
}

/// See the module's documentation.
#[derive(Debug)]
pub struct Paced<B> {
    inner: B,
    /// Bytes handed out since the last chance to flush.
    unflushed: usize,
    /// Whether a piece has been handed out yet: the first one is flushed alone.
    started: bool,
    /// A chance to flush is owed before the next piece.
    owed: bool,
}

impl<B> Paced<B> {
    pub fn new(inner: B) -> Self {
        Paced {
            inner,
            unflushed: 0,
            started: false,
            owed: false,
        }
    }
}

impl<B> Body for Paced<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.owed {
            // Ready again at once: the writer flushes between this and the next poll.
            this.owed = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            let len = data.map_or(0, Buf::remaining);
            this.unflushed += len;
            let first = !this.started && len > 0;
            this.started |= len > 0;
            // A body with nothing after this piece is flushed by its end.
            if (first || this.unflushed >= BATCH) && !this.inner.is_end_stream() {
                this.owed = true;
                this.unflushed = 0;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    use bytes::Bytes;

    use super::*;

    /// A body whose frames are all ready, as a fast upstream's are.
    struct Ready(VecDeque<Bytes>);

    impl Body for Ready {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Polls to the end: `P` for each pending (with the wake it must come with), the
    /// length of each piece otherwise.
    fn drive(pieces: &[usize]) -> Vec<String> {
        let body = Ready(pieces.iter().map(|&n| Bytes::from(vec![b'x'; n])).collect());
        let mut paced = Paced::new(body);
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Arc::clone(&wakes).into();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        loop {
            let before = wakes.0.load(Ordering::SeqCst);
            match Pin::new(&mut paced).poll_frame(&mut cx) {
                Poll::Pending => {
                    assert_eq!(wakes.0.load(Ordering::SeqCst), before + 1, "woken at once");
                    out.push("P".to_owned());
                }
                Poll::Ready(Some(Ok(frame))) => {
                    out.push(frame.into_data().unwrap().len().to_string())
                }
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => return out,
            }
        }
    }

    #[test]
    fn the_first_piece_and_every_batch_after_it_get_a_chance_to_flush() {
        let kib = 1024;
        let pieces = [kib, 16 * kib, 16 * kib, 16 * kib, 16 * kib, 16 * kib, kib];
        let got = drive(&pieces);
        // 1 KiB alone; then 16+16+16+16 = 64 KiB reached at the fifth piece.
        let want = [
            "1024", "P", "16384", "16384", "16384", "16384", "P", "16384", "1024",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_body_whose_first_piece_is_its_last_never_waits() {
        assert_eq!(drive(&[1024]), ["1024"]);
        assert_eq!(drive(&[BATCH * 2]), [(BATCH * 2).to_string()]);
        assert!(drive(&[]).is_empty());
    }

    #[test]
    fn empty_pieces_do_not_count_as_the_first() {
        assert_eq!(drive(&[0, 10, 10]), ["0", "10", "P", "10"]);
    }
}
