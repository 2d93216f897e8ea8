//! Strict HTTP/1 request framing, enforced on the raw bytes before hyper sees them.
//!
//! hyper (through httparse) accepts shapes our contract forbids: bare LF line endings,
//! duplicate equal `Content-Length`s, zero-padded chunk sizes, non-UTF-8 header values.
//! A request smuggling shape must be answered `400` and never forwarded (docs/design.md §5,
//! THREATS.md "HTTP and TLS parsing"), so [`StrictH1`] wraps the accepted stream and tracks
//! request framing itself: it holds each request head until it is complete and valid, streams
//! bodies through while checking their framing, and answers a bad head on the wire itself and
//! reports EOF, so hyper never receives a byte of the bad request.
//!
//! A chunked head is held until its first chunk-size line has arrived and passed too, and
//! both go to hyper together: hyper forwards a head as soon as it has parsed it, so a bad
//! first line found after the release would already be upstream, and only a refusal before
//! the release keeps it from being forwarded. Later chunks can only abort the body.
//!
//! Limits: after a CONNECT or an HTTP/1.1 `Upgrade` head nothing more is inspected, as the
//! guard cannot see whether hyper switched protocols; a caller refusing the switch should
//! answer with `Connection: close`. The next head is inspected only once hyper has started
//! answering the previous one (after a `100 Continue` that may be before the final answer).
//! A chunked head carrying `Expect: 100-continue` is released without its first chunk line
//! (its client sends no body before hyper's `100`), so a bad first line there aborts the body.
//!
//! The parts: [`head`] finds and validates heads and trailers, [`chunked`] follows chunked
//! bodies, [`reject`] names the violations and writes the refusal; this module moves bytes.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod chunked;
mod head;
mod reject;
#[cfg(test)]
mod testing;

use chunked::{Chunk, SizeLine};
use head::{validate_head, validate_trailers, Scan};
pub use reject::Violation;

/// Default bound on one request head (request line and header section) or trailer section.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 64 * 1024;
/// One TLS record; larger reads would only zero-fill memory the inner stream never fills.
const READ_CHUNK: usize = 16 * 1024;

/// IO wrapper that releases a request to the reader only once its framing has been checked.
pub struct StrictH1<IO> {
    io: IO,
    max_head_bytes: usize,
    state: State,
    /// Bytes read from `io`: `buf[..ready]` are checked and owed to the reader, `buf[..sent]`
    /// of them already handed over. Inspection only runs once `ready == 0`, so offsets kept
    /// in `state` are always relative to `buf[0]`.
    buf: Vec<u8>,
    ready: usize,
    sent: usize,
    violation: Option<Violation>,
    rejection_id: Option<String>,
    /// A head was released and hyper has not written since: its answer is still to come.
    awaiting_response: bool,
    /// Woken by hyper's first write, when the next head may be inspected.
    read_waker: Option<Waker>,
    /// Told of every violation (with the request id of the rejection written, if one was),
    /// so the caller can audit refusals that never reach its service.
    observer: Option<Observer>,
}

/// Callback for violations: the violation and the request id of the written rejection.
pub type Observer = Box<dyn FnMut(&Violation, Option<&str>) + Send + Sync>;

#[derive(Debug)]
enum State {
    Head(Scan),
    /// A valid chunked head, `buf[..end]` with the part of its first chunk-size line seen
    /// so far, held back until that line is whole and valid. This waits for the client as
    /// long as it takes, like a slow head: the bytes held are bounded by the head limit and
    /// the chunk line's own bounds, and hyper's `header_read_timeout`, still waiting for its
    /// head, ends a client that stops here.
    FirstChunkLine {
        end: usize,
        chunk: Chunk,
    },
    Body(Body),
    Trailers(Scan),
    /// CONNECT or an upgrade: the rest of the stream belongs to another protocol.
    Raw,
    Reject {
        response: Vec<u8>,
        written: usize,
    },
    /// End of input, or the rejection is on the wire: the reader only sees EOF from now on.
    Closed,
    /// Body framing broke after hyper had the head: fail the body, never resynchronise.
    Failed(Violation),
}

impl State {
    /// Nothing of the current request has gone to the reader, so it can still be refused.
    fn before_release(&self) -> bool {
        matches!(self, State::Head(_) | State::FirstChunkLine { .. })
    }
}

#[derive(Debug)]
enum Body {
    Length(u64),
    Chunked(Chunk),
}

impl<IO> StrictH1<IO> {
    pub fn new(io: IO, max_head_bytes: usize) -> Self {
        Self {
            io,
            max_head_bytes,
            state: State::Head(Scan::new(true)),
            buf: Vec::new(),
            ready: 0,
            sent: 0,
            violation: None,
            rejection_id: None,
            awaiting_response: false,
            read_waker: None,
            observer: None,
        }
    }

    /// Report every violation to `observer`.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The framing violation that ended this connection, if any.
    pub fn violation(&self) -> Option<&Violation> {
        self.violation.as_ref()
    }

    /// The `Ostiary-Request-Id` of the rejection written to the client, if one was.
    pub fn rejection_id(&self) -> Option<&str> {
        self.rejection_id.as_deref()
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Between requests: nothing of a next request is held, the last body was passed on
    /// whole, and no head was released since the reader last wrote. Once the reader has also
    /// parsed what it was given, it may be dropped here and a new one started without a
    /// byte lost.
    pub fn at_rest(&self) -> bool {
        matches!(self.state, State::Head(_))
            && self.buf.is_empty()
            && !self.awaiting_response
            && self.violation.is_none()
    }

    /// Checks buffered bytes; returns how many may now go to the reader (`None`: need more).
    fn inspect(&mut self) -> Result<Option<usize>, Violation> {
        let max = self.max_head_bytes;
        loop {
            let (used, next) = match &mut self.state {
                State::Head(scan) => match scan.scan(&self.buf, max)? {
                    Some(len) => match validate_head(&self.buf[..len])? {
                        held @ State::FirstChunkLine { .. } => {
                            // Its first chunk line may already be buffered behind it.
                            self.state = held;
                            continue;
                        }
                        next => {
                            self.awaiting_response = true;
                            (len, Some(next))
                        }
                    },
                    None => return Ok(None),
                },
                State::FirstChunkLine { end, chunk } => {
                    match chunk.size_line(&self.buf[*end..])? {
                        SizeLine::Partial => {
                            *end = self.buf.len();
                            return Ok(None);
                        }
                        SizeLine::Done { len, size } => {
                            self.awaiting_response = true;
                            let next = match size {
                                0 => State::Trailers(Scan::new(false)),
                                size => State::Body(Body::Chunked(Chunk::Data(size))),
                            };
                            (*end + len, Some(next))
                        }
                    }
                }
                State::Trailers(scan) => match scan.scan(&self.buf, max)? {
                    Some(len) => {
                        validate_trailers(&self.buf[..len])?;
                        (len, Some(State::Head(Scan::new(true))))
                    }
                    None => return Ok(None),
                },
                State::Body(Body::Length(left)) => {
                    let take = clamp(*left, self.buf.len());
                    *left -= take as u64;
                    (take, (*left == 0).then(|| State::Head(Scan::new(true))))
                }
                State::Body(Body::Chunked(chunk)) => {
                    let (used, last) = chunk.step(&self.buf)?;
                    (used, last.then(|| State::Trailers(Scan::new(false))))
                }
                State::Raw => (self.buf.len(), None),
                _ => (0, None),
            };
            if let Some(next) = next {
                self.state = next;
            }
            return Ok((used > 0).then_some(used));
        }
    }

    /// A bad head is answered on the wire and the reader sees EOF; a bad body was already
    /// partly forwarded, so the reader gets the error back to abort it.
    fn on_violation(&mut self, v: Violation) -> Option<io::Error> {
        let unreleased = self.state.before_release();
        self.violation = Some(v.clone());
        self.buf = Vec::new();
        (self.ready, self.sent) = (0, 0);
        if !unreleased {
            if let Some(observer) = self.observer.as_mut() {
                observer(&v, None);
            }
            self.state = State::Failed(v.clone());
            return Some(io::Error::new(io::ErrorKind::InvalidData, v));
        }
        let id = format!("{:016x}", rand::random::<u64>());
        if let Some(observer) = self.observer.as_mut() {
            observer(&v, Some(&id));
        }
        let response = reject::rejection(&v, &id);
        self.state = State::Reject {
            response,
            written: 0,
        };
        self.rejection_id = Some(id);
        None
    }

    /// Body bytes that may go from `io` to the reader without being looked at.
    fn opaque_body_left(&self) -> Option<u64> {
        match self.state {
            State::Body(Body::Length(n) | Body::Chunked(Chunk::Data(n))) => Some(n),
            _ => None,
        }
    }

    fn consume_opaque_body(&mut self, n: usize) {
        let n = n as u64;
        self.state = match self.state {
            State::Body(Body::Length(left)) if left == n => State::Head(Scan::new(true)),
            State::Body(Body::Length(left)) => State::Body(Body::Length(left - n)),
            State::Body(Body::Chunked(Chunk::Data(left))) if left == n => {
                State::Body(Body::Chunked(Chunk::DataCr))
            }
            State::Body(Body::Chunked(Chunk::Data(left))) => {
                State::Body(Body::Chunked(Chunk::Data(left - n)))
            }
            _ => return,
        };
    }
}
impl<IO: AsyncRead + AsyncWrite + Unpin> StrictH1<IO> {
    /// Wait for the client's next bytes while no reader is attached, keeping them for the
    /// next reader to have checked like any others; `Ok(0)` at end of input.
    pub fn poll_arrival(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.poll_fill(cx)
    }

    /// Read once into `buf`. Through a chunk on the stack, so that `buf` holds only bytes
    /// read: a connection waiting for its next head (most of a keep-alive connection's
    /// life) holds no buffer here, where reading in place kept a 16 KiB one per connection
    /// and per wrapped stream (the CONNECT's and the tunnel's).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut chunk = [const { MaybeUninit::<u8>::uninit() }; READ_CHUNK];
        let mut rb = ReadBuf::uninit(&mut chunk);
        let res = Pin::new(&mut self.io).poll_read(cx, &mut rb);
        let n = rb.filled().len();
        self.buf.extend_from_slice(rb.filled());
        res.map_ok(|()| n)
    }

    fn poll_reject(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let State::Reject { response, written } = &mut self.state {
            while *written < response.len() {
                let res = ready!(Pin::new(&mut self.io).poll_write(cx, &response[*written..]));
                match res {
                    Ok(n) if n > 0 => *written += n,
                    other => {
                        self.state = State::Closed;
                        return Poll::Ready(other.and(Err(io::ErrorKind::WriteZero.into())));
                    }
                }
            }
        }
        let flushed = ready!(Pin::new(&mut self.io).poll_flush(cx));
        self.state = State::Closed;
        Poll::Ready(flushed)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for StrictH1<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if dst.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.sent < this.ready {
                let n = (this.ready - this.sent).min(dst.remaining());
                dst.put_slice(&this.buf[this.sent..this.sent + n]);
                this.sent += n;
                if this.sent == this.ready {
                    this.buf.drain(..this.ready);
                    if this.buf.is_empty() {
                        // Released, not kept for the next head (see `poll_fill`).
                        this.buf = Vec::new();
                    }
                    (this.ready, this.sent) = (0, 0);
                }
                return Poll::Ready(Ok(()));
            }
            match &this.state {
                State::Closed => return Poll::Ready(Ok(())),
                State::Failed(v) => {
                    let err = io::Error::new(io::ErrorKind::InvalidData, v.clone());
                    return Poll::Ready(Err(err));
                }
                State::Reject { .. } => {
                    ready!(this.poll_reject(cx))?;
                    continue;
                }
                State::Raw if this.buf.is_empty() => {
                    return Pin::new(&mut this.io).poll_read(cx, dst);
                }
                _ => {}
            }
            if this.awaiting_response && matches!(this.state, State::Head(_)) {
                // hyper reads ahead only to notice a hang-up. The next head waits until hyper
                // has begun answering the last one, so a rejection never overtakes that answer
                // nor lands inside it; meanwhile bytes are buffered (bounded) to see EOF.
                this.read_waker = Some(cx.waker().clone());
                if this.buf.len() >= this.max_head_bytes {
                    return Poll::Pending;
                }
                match ready!(this.poll_fill(cx))? {
                    0 if this.buf.is_empty() => {
                        this.state = State::Closed;
                        return Poll::Ready(Ok(()));
                    }
                    // EOF after a pipelined request: serve it first, EOF is read again later.
                    0 => return Poll::Pending,
                    _ => continue,
                }
            }
            match this.inspect() {
                Ok(Some(n)) => {
                    this.ready = n;
                    continue;
                }
                Ok(None) => {}
                Err(v) => match this.on_violation(v) {
                    Some(err) => return Poll::Ready(Err(err)),
                    None => continue,
                },
            }
            if let (true, Some(left)) = (this.buf.is_empty(), this.opaque_body_left()) {
                // Saves a copy through `buf` for the bulk of every body.
                let want = clamp(left, dst.remaining().min(READ_CHUNK));
                let mut rb = ReadBuf::new(dst.initialize_unfilled_to(want));
                ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
                let n = rb.filled().len();
                dst.advance(n);
                this.consume_opaque_body(n);
                if n == 0 {
                    this.state = State::Closed;
                }
                return Poll::Ready(Ok(()));
            }
            if ready!(this.poll_fill(cx))? == 0 {
                // A partial head at EOF is dropped: hyper sees a clean close, not half a request.
                this.buf.clear();
                this.state = State::Closed;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for StrictH1<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_through(|io| io.poll_write(cx, buf))
    }

    // Passed through, so that hyper queues a response's head and body pieces and hands
    // them to rustls in one call, rather than first copying every body byte into its own
    // buffer (its `Flatten` strategy, chosen for any IO that is not vectored).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_through(|io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: AsyncWrite + Unpin> StrictH1<IO> {
    /// Every write of hyper's, plain or vectored: none after our rejection, which must be
    /// the last bytes on the wire rather than interleaved with hyper's; and once the answer
    /// has started leaving, the agent's next request is released.
    fn write_through(
        &mut self,
        write: impl FnOnce(Pin<&mut IO>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if self.rejection_id.is_some() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let res = write(Pin::new(&mut self.io));
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.awaiting_response = false;
            if let Some(waker) = self.read_waker.take() {
                waker.wake();
            }
        }
        res
    }
}

impl<IO> fmt::Debug for StrictH1<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StrictH1")
            .field("state", &self.state)
            .field("buffered", &self.buf.len())
            .field("violation", &self.violation)
            .finish_non_exhaustive()
    }
}

fn clamp(left: u64, avail: usize) -> usize {
    usize::try_from(left).map_or(avail, |l| l.min(avail))
}

#[cfg(test)]
mod tests {
    use super::testing::{
        assert_rejected_after, passed, read_is_pending, run, run_max, through_hyper, CHUNKED, GET,
    };
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn pipelined_keep_alive_requests_pass() {
        let post = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
        let input = [GET, post, CHUNKED, b"3\r\nxyz\r\n0\r\n\r\n", GET].concat();
        assert_eq!(run(&input).await, passed(&input));
        let two_chunked = [CHUNKED, b"0\r\n\r\n", CHUNKED, b"1\r\nz\r\n0\r\n\r\n"].concat();
        assert_eq!(run(&two_chunked).await, passed(&two_chunked));
    }

    #[tokio::test]
    async fn body_larger_than_head_limit_streams_through() {
        let body = vec![b'\n'; 10_000];
        let head = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len());
        let input = [head.as_bytes(), &body, GET].concat();
        assert_eq!(run_max(&input, 128).await, passed(&input));
    }

    #[tokio::test]
    async fn connect_passes_raw_bytes_both_ways() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut guard = StrictH1::new(server, DEFAULT_MAX_HEAD_BYTES);
        let sent = b"CONNECT h:443 HTTP/1.1\r\n\r\n\0\n\x16";
        client.write_all(sent).await.unwrap();
        let mut got = [0u8; 29];
        guard.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, sent);
        let reply = b"HTTP/1.1 200 OK\r\n\r\n\x17";
        guard.write_all(reply).await.unwrap();
        let mut back = [0u8; 20];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, reply);
    }

    /// At rest only between requests: not while part of a head is held, nor once a head is
    /// released and unanswered, nor while its body is still to pass, nor after a CONNECT.
    #[tokio::test]
    async fn at_rest_only_between_requests() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut guard = StrictH1::new(server, DEFAULT_MAX_HEAD_BYTES);
        assert!(guard.at_rest(), "a new connection");
        client
            .write_all(b"POST /p HTTP/1.1\r\nHost:")
            .await
            .unwrap();
        assert!(read_is_pending(&mut guard).await);
        assert!(!guard.at_rest(), "part of a head held");
        client
            .write_all(b" h\r\nContent-Length: 4\r\n\r\nab")
            .await
            .unwrap();
        let mut got = vec![0u8; 64];
        let n = guard.read(&mut got).await.unwrap();
        assert!(got[..n].starts_with(b"POST /p"));
        assert!(!guard.at_rest(), "a head released and not answered");
        guard.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        assert!(!guard.at_rest(), "answered, but the body is still to pass");
        client.write_all(b"cd").await.unwrap();
        let mut body = Vec::new();
        while body.len() < 4 {
            let n = guard.read(&mut got).await.unwrap();
            body.extend_from_slice(&got[..n]);
        }
        assert_eq!(body, b"abcd");
        assert!(guard.at_rest(), "between requests");
        client
            .write_all(b"CONNECT h:443 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let _ = guard.read(&mut got).await.unwrap();
        guard.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert!(
            !guard.at_rest(),
            "after a CONNECT the stream is another protocol's"
        );
    }

    #[tokio::test]
    async fn writes_after_a_rejection_fail() {
        let (mut client, server) = tokio::io::duplex(1024);
        client
            .write_all(b"GET / HTTP/1.1\r\nX: \0\r\n\r\n")
            .await
            .unwrap();
        let mut guard = StrictH1::new(server, 1024);
        assert_eq!(guard.read(&mut [0u8; 64]).await.unwrap(), 0);
        let err = guard
            .write_all(b"HTTP/1.1 200 OK\r\n\r\n")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn violation_after_good_requests_releases_only_the_good_ones() {
        let good = [
            GET,
            b"POST /p HTTP/1.1\r\nContent-Length: 4\r\n\r\n\r\n\r\n",
        ]
        .concat();
        let bad = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nA";
        let reason = "duplicate_content_length";
        assert_rejected_after(&good, bad, "400 Bad Request", reason).await;
        let bad_first_chunk = [CHUNKED, b"0x1\r\nA\r\n0\r\n\r\n"].concat();
        let status = "400 Bad Request";
        assert_rejected_after(&good, &bad_first_chunk, status, "bad_chunk_size").await;
    }

    #[tokio::test]
    async fn a_chunked_head_cut_off_before_its_first_chunk_line_is_never_released() {
        assert_eq!(run(CHUNKED).await, passed(b""));
        assert_eq!(run(&[CHUNKED, b"1f;a=b"].concat()).await, passed(b""));
    }

    #[tokio::test]
    async fn next_head_waits_until_the_previous_one_is_answered() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut guard = StrictH1::new(server, 1024);
        let bad = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(100_000));
        client
            .write_all(&[GET, bad.as_bytes()].concat())
            .await
            .unwrap();
        let mut got = [0u8; 1024];
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], GET);
        assert!(
            read_is_pending(&mut guard).await,
            "the next head must wait for an answer"
        );
        // While it waits, it buffers about one head's worth, no more.
        assert!(guard.buf.len() <= 1024 + READ_CHUNK, "{}", guard.buf.len());
        let answer = "HTTP/1.1 204 No Content\r\n\r\n";
        guard.write_all(answer.as_bytes()).await.unwrap();
        assert_eq!(guard.read(&mut got).await.unwrap(), 0);
        drop(guard);
        let mut wire = String::new();
        client.read_to_string(&mut wire).await.unwrap();
        assert!(
            wire.starts_with(&format!("{answer}HTTP/1.1 431 ")),
            "{wire}"
        );
    }

    #[tokio::test]
    async fn a_connection_between_requests_holds_no_buffer() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut guard = StrictH1::new(server, 64 * 1024);
        let mut got = [0u8; 1024];
        // Two requests one after the other, then two pipelined: the second waits, whole.
        for (sent, buffered_after_first) in [
            (GET.to_vec(), 0),
            (GET.to_vec(), 0),
            ([GET, GET].concat(), GET.len()),
        ] {
            client.write_all(&sent).await.unwrap();
            let n = guard.read(&mut got).await.unwrap();
            assert_eq!(&got[..n], GET);
            assert_eq!(guard.buf.len(), buffered_after_first);
            guard
                .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
            if buffered_after_first > 0 {
                let n = guard.read(&mut got).await.unwrap();
                assert_eq!(&got[..n], GET);
            }
            // Waiting for the next head reads nothing and keeps nothing.
            assert!(read_is_pending(&mut guard).await);
            assert_eq!(guard.buf.capacity(), 0);
        }
    }

    #[tokio::test]
    async fn a_hang_up_after_pipelined_requests_still_serves_them() {
        // A slice reads as EOF forever once drained, and never yields for fairness.
        let input = [GET, GET].concat();
        let mut guard = StrictH1::new(tokio::io::join(&input[..], Vec::new()), 1024);
        let mut got = [0u8; 1024];
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], GET);
        assert!(
            read_is_pending(&mut guard).await,
            "EOF must not overtake the buffered head"
        );
        guard
            .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
            .await
            .unwrap();
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], GET);
        // Nothing left to serve: the hang-up reaches hyper as it would without the guard.
        assert_eq!(guard.read(&mut got).await.unwrap(), 0);
    }

    /// A writer that keeps each call it gets, slice by slice.
    #[derive(Default)]
    struct Calls(Vec<Vec<Vec<u8>>>);

    impl AsyncWrite for Calls {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().0.push(vec![buf.to_vec()]);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let call: Vec<Vec<u8>> = bufs.iter().map(|b| b.to_vec()).collect();
            let n = call.iter().map(Vec::len).sum();
            self.get_mut().0.push(call);
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_vectored_write_reaches_the_connection_whole_and_releases_the_next_request() {
        // hyper hands the head and the body's pieces over in one vectored call only when
        // the IO says it takes them; rustls then seals them as one run of records. A guard
        // that wrote the first slice alone put head and body in two.
        let input = [GET, GET].concat();
        let mut guard = StrictH1::new(tokio::io::join(&input[..], Calls::default()), 1024);
        assert!(guard.is_write_vectored());
        let mut got = [0u8; 1024];
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], GET);
        assert!(read_is_pending(&mut guard).await);
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";
        let slices = [io::IoSlice::new(head), io::IoSlice::new(b"ok")];
        let n = guard.write_vectored(&slices).await.unwrap();
        assert_eq!(n, head.len() + 2);
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(
            &got[..n],
            GET,
            "the answer leaving releases the next request"
        );
        let calls = &guard.io.writer().0;
        assert_eq!(calls, &[vec![head.to_vec(), b"ok".to_vec()]]);
    }

    #[tokio::test]
    async fn a_vectored_write_after_a_rejection_fails() {
        let bad = b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n";
        let mut guard = StrictH1::new(tokio::io::join(&bad[..], Calls::default()), 1024);
        let mut got = [0u8; 1024];
        let _ = guard.read(&mut got).await;
        assert!(guard.rejection_id.is_some());
        let slices = [io::IoSlice::new(b"HTTP/1.1 200 OK\r\n\r\n")];
        let err = guard.write_vectored(&slices).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn hyper_answers_good_requests_and_never_sees_the_bad_one() {
        let post = b"POST /two HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi";
        let bad = b"GET /three HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n";
        let (wire, seen) = through_hyper(&[GET, post, bad].concat()).await;
        assert_eq!(seen, [r#"/a Ok(b"")"#, r#"/two Ok(b"hi")"#]);
        assert_eq!(wire.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{wire}");
        assert!(wire.contains("okHTTP/1.1 400 Bad Request\r\n"), "{wire}");
        assert!(wire.ends_with(r#""reason":"obs_fold"}"#), "{wire}");
    }
}
