//! Strict HTTP/1 request framing, enforced on the raw bytes before hyper sees them.
//!
//! hyper (through httparse) accepts shapes our contract forbids: bare LF line endings,
//! duplicate equal `Content-Length`s, zero-padded chunk sizes, non-UTF-8 header values.
//! A request smuggling shape must be answered `400` and never forwarded (DESIGN.md §5,
//! THREATS.md "HTTP and TLS parsing"), so [`StrictH1`] wraps the accepted stream and tracks
//! request framing itself: it holds each request head until it is complete and valid, streams
//! bodies through while checking their framing, and answers a bad head on the wire itself and
//! reports EOF, so hyper never receives a byte of the bad request.
//!
//! Limits: after a CONNECT or an HTTP/1.1 `Upgrade` head nothing more is inspected, as the
//! guard cannot see whether hyper switched protocols; a caller refusing the switch should
//! answer with `Connection: close`. The next head is inspected only once hyper has started
//! answering the previous one (after a `100 Continue` that may be before the final answer).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Default bound on one request head (request line and header section) or trailer section.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 64 * 1024;
/// hyper's default header count, so a head we pass is never refused by hyper for its count.
const MAX_HEADERS: usize = 100;
/// One TLS record; larger reads would only zero-fill memory the inner stream never fills.
const READ_CHUNK: usize = 16 * 1024;
/// Sixteen hex digits fill a u64; more can only be padding or an overflow attempt.
const MAX_CHUNK_SIZE_DIGITS: u8 = 16;
const MAX_CHUNK_EXT_BYTES: usize = 4 * 1024;
/// hyper reserves the top two u64 values, so larger lengths would fail there without our body.
const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;

/// Declares [`Violation`]: one line per rule, with its machine reason and the sentence
/// shown to the client, so the two can never drift apart.
macro_rules! violations {
    ($($variant:ident => $reason:literal, $message:literal;)*) => {
        /// A framing rule the request broke; kept for the audit record.
        #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
        pub enum Violation {
            $(#[error($message)] $variant,)*
        }

        impl Violation {
            #[cfg(test)]
            const ALL: &'static [Violation] = &[$(Self::$variant),*];

            /// Short machine reason, as sent in the `reason` field of the 400/431 body.
            pub fn reason(&self) -> &'static str {
                match self {
                    $(Self::$variant => $reason,)*
                }
            }
        }
    };
}

violations! {
    BareLf => "bare_lf", "The request has a line feed not preceded by a carriage return.";
    BareCr => "bare_cr", "The request has a carriage return not followed by a line feed.";
    Nul => "nul_byte", "The request head contains a NUL byte.";
    ObsFold => "obs_fold", "The request contains a folded (obs-fold) header line.";
    ClAndTe => "cl_and_te", "The request carries both Content-Length and Transfer-Encoding.";
    DuplicateContentLength => "duplicate_content_length",
        "The request carries more than one Content-Length header.";
    BadContentLength => "bad_content_length",
        "The Content-Length header is not a valid decimal length.";
    TeOnHttp10 => "te_on_http10", "Transfer-Encoding is not allowed on an HTTP/1.0 request.";
    TeNotChunked => "te_not_chunked", "The final transfer coding of the request is not chunked.";
    BadTransferEncoding => "bad_transfer_encoding",
        "The Transfer-Encoding header is empty or applies chunked more than once.";
    DuplicateHost => "duplicate_host", "The request carries more than one Host header.";
    InvalidHeaderName => "invalid_header_name", "A header name is not a valid token.";
    InvalidHeaderValue => "invalid_header_value",
        "A header value contains bytes that are not valid UTF-8 text.";
    MalformedRequestLine => "malformed_request_line", "The request line is malformed.";
    HeadTooLarge => "header_too_large", "The request head is larger than this proxy accepts.";
    TooManyHeaders => "too_many_headers",
        "The request carries more header fields than this proxy accepts.";
    BadChunkSize => "bad_chunk_size", "A chunk size is not a hexadecimal number.";
    ChunkSizeOverflow => "chunk_size_overflow", "A chunk size has more than 16 hex digits.";
    BadChunkExtension => "bad_chunk_extension", "A chunk extension is malformed or too long.";
    BadChunkTerminator => "bad_chunk_terminator", "Chunk data is not followed by CRLF.";
}

impl Violation {
    /// Status this violation earns when it is found in a request head.
    pub fn status(&self) -> u16 {
        match self {
            Self::HeadTooLarge | Self::TooManyHeaders => 431,
            _ => 400,
        }
    }
}

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

#[derive(Debug)]
enum Body {
    Length(u64),
    Chunked(Chunk),
}

#[derive(Debug, Clone, Copy)]
enum Chunk {
    Size { digits: u8, value: u64 },
    SizeWs { value: u64 },
    Ext { value: u64, len: usize },
    SizeLf { value: u64 },
    Data(u64),
    DataCr,
    DataLf,
}

const CHUNK_START: Chunk = Chunk::Size {
    digits: 0,
    value: 0,
};

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

    /// The framing violation that ended this connection, if any.
    /// Report every violation to `observer`.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

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

    /// Checks buffered bytes; returns how many may now go to the reader (`None`: need more).
    fn inspect(&mut self) -> Result<Option<usize>, Violation> {
        let max = self.max_head_bytes;
        let (used, next) = match &mut self.state {
            State::Head(scan) => match scan.scan(&self.buf, max)? {
                Some(len) => {
                    let next = validate_head(&self.buf[..len])?;
                    self.awaiting_response = true;
                    (len, Some(next))
                }
                None => return Ok(None),
            },
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
        Ok((used > 0).then_some(used))
    }

    /// A bad head is answered on the wire and the reader sees EOF; a bad body was already
    /// partly forwarded, so the reader gets the error back to abort it.
    fn on_violation(&mut self, v: Violation) -> Option<io::Error> {
        let in_head = matches!(self.state, State::Head(_));
        self.violation = Some(v.clone());
        self.buf = Vec::new();
        (self.ready, self.sent) = (0, 0);
        if !in_head {
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
        let response = rejection(&v, &id);
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
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let len = self.buf.len();
        self.buf.resize(len + READ_CHUNK, 0);
        let mut rb = ReadBuf::new(&mut self.buf[len..]);
        let res = Pin::new(&mut self.io).poll_read(cx, &mut rb);
        let n = rb.filled().len();
        self.buf.truncate(len + n);
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
        let this = self.get_mut();
        if this.rejection_id.is_some() {
            // Our rejection must be the last bytes on the wire, not interleaved with hyper's.
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let res = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            this.awaiting_response = false;
            if let Some(waker) = this.read_waker.take() {
                waker.wake();
            }
        }
        res
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
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

/// Line scanner for a head or a trailer section, resumable as more bytes arrive.
#[derive(Debug)]
struct Scan {
    pos: usize,
    line_start: usize,
    /// A request line is still due; blank lines before it are tolerated (RFC 9112 §2.2).
    start_line_due: bool,
}

impl Scan {
    fn new(start_line_due: bool) -> Self {
        Self {
            pos: 0,
            line_start: 0,
            start_line_due,
        }
    }

    /// Returns the section's length once its closing empty line has arrived.
    fn scan(&mut self, buf: &[u8], max: usize) -> Result<Option<usize>, Violation> {
        while self.pos < buf.len() {
            if self.pos >= max {
                return Err(Violation::HeadTooLarge);
            }
            let i = self.pos;
            match buf[i] {
                0 => return Err(Violation::Nul),
                b'\n' => return Err(Violation::BareLf),
                b'\r' => {
                    let Some(&next) = buf.get(i + 1) else {
                        return Ok(None);
                    };
                    if next != b'\n' {
                        return Err(Violation::BareCr);
                    }
                    let end = i + 2;
                    if end > max {
                        return Err(Violation::HeadTooLarge);
                    }
                    let first = buf[self.line_start..i].first();
                    (self.pos, self.line_start) = (end, end);
                    match first {
                        None if self.start_line_due => {}
                        None => return Ok(Some(end)),
                        Some(_) if self.start_line_due => self.start_line_due = false,
                        Some(b' ' | b'\t') => return Err(Violation::ObsFold),
                        Some(_) => {}
                    }
                }
                _ => self.pos += 1,
            }
        }
        Ok(None)
    }
}

impl Chunk {
    /// Consumes chunk framing and data; `true` once the last chunk's line has ended.
    /// A bad byte after good ones is reported on the next call, so the good bytes are
    /// released first whatever the read boundaries were.
    fn step(&mut self, input: &[u8]) -> Result<(usize, bool), Violation> {
        let mut i = 0;
        while i < input.len() {
            if let Chunk::Data(left) = self {
                let take = clamp(*left, input.len() - i);
                *left -= take as u64;
                i += take;
                if *left == 0 {
                    *self = Chunk::DataCr;
                }
                continue;
            }
            match self.next(input[i]) {
                Ok(Some(next)) => *self = next,
                Ok(None) => return Ok((i + 1, true)),
                Err(v) if i == 0 => return Err(v),
                Err(_) => return Ok((i, false)),
            }
            i += 1;
        }
        Ok((i, false))
    }

    /// `None` when `b` ends the last chunk's line.
    fn next(self, b: u8) -> Result<Option<Chunk>, Violation> {
        use Chunk::*;
        let next = match self {
            Size { digits, value } => match (hex(b), b) {
                (Some(_), _) if digits >= MAX_CHUNK_SIZE_DIGITS => {
                    return Err(Violation::ChunkSizeOverflow)
                }
                (Some(d), _) => Size {
                    digits: digits + 1,
                    value: value << 4 | d,
                },
                (None, _) if digits == 0 => return Err(Violation::BadChunkSize),
                (None, b' ' | b'\t') => SizeWs { value },
                (None, b';') => Ext { value, len: 0 },
                (None, b'\r') => SizeLf { value },
                (None, _) => return Err(Violation::BadChunkSize),
            },
            SizeWs { value } => match b {
                b' ' | b'\t' => SizeWs { value },
                b';' => Ext { value, len: 0 },
                b'\r' => SizeLf { value },
                _ => return Err(Violation::BadChunkSize),
            },
            Ext { value, len } => match b {
                b'\r' => SizeLf { value },
                _ if len >= MAX_CHUNK_EXT_BYTES || (b < 0x20 && b != b'\t') || b == 0x7f => {
                    return Err(Violation::BadChunkExtension)
                }
                _ => Ext {
                    value,
                    len: len + 1,
                },
            },
            SizeLf { value } => match (b, value) {
                (b'\n', 0) => return Ok(None),
                (b'\n', _) => Data(value),
                _ => return Err(Violation::BadChunkSize),
            },
            DataCr if b == b'\r' => DataLf,
            DataLf if b == b'\n' => CHUNK_START,
            DataCr | DataLf | Data(_) => return Err(Violation::BadChunkTerminator),
        };
        Ok(Some(next))
    }
}

/// Returns the state that follows a valid head.
fn validate_head(head: &[u8]) -> Result<State, Violation> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head).map_err(from_httparse)? {
        // Our scanner and httparse must agree on where the head ends, or we fail closed.
        httparse::Status::Complete(n) if n == head.len() => {}
        _ => return Err(Violation::MalformedRequestLine),
    }
    check_fields(req.headers)?;
    let named = |name: &'static str| {
        req.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let lengths: Vec<&[u8]> = named("content-length").collect();
    let codings: Vec<&[u8]> = named("transfer-encoding").collect();
    let http10 = req.version == Some(0);
    if !lengths.is_empty() && !codings.is_empty() {
        return Err(Violation::ClAndTe);
    }
    if lengths.len() > 1 {
        return Err(Violation::DuplicateContentLength);
    }
    if named("host").count() > 1 {
        return Err(Violation::DuplicateHost);
    }
    if !codings.is_empty() && http10 {
        return Err(Violation::TeOnHttp10);
    }
    let body = match lengths.first() {
        Some(value) => Body::Length(parse_content_length(value)?),
        None if !codings.is_empty() => {
            check_transfer_encoding(&codings)?;
            Body::Chunked(CHUNK_START)
        }
        None => Body::Length(0),
    };
    // Mirrors hyper: CONNECT may always switch protocols, `Upgrade` only on HTTP/1.1.
    if req.method == Some("CONNECT") || (named("upgrade").next().is_some() && !http10) {
        return Ok(State::Raw);
    }
    Ok(match body {
        Body::Length(0) => State::Head(Scan::new(true)),
        body => State::Body(body),
    })
}

fn validate_trailers(section: &[u8]) -> Result<(), Violation> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(section, &mut headers).map_err(from_httparse)? {
        httparse::Status::Complete((n, fields)) if n == section.len() => check_fields(fields),
        _ => Err(Violation::InvalidHeaderName),
    }
}

fn check_fields(fields: &[httparse::Header<'_>]) -> Result<(), Violation> {
    for field in fields {
        if field.name.is_empty() || !field.name.bytes().all(is_tchar) {
            return Err(Violation::InvalidHeaderName);
        }
        if std::str::from_utf8(field.value).is_err() {
            return Err(Violation::InvalidHeaderValue);
        }
    }
    Ok(())
}

fn parse_content_length(value: &[u8]) -> Result<u64, Violation> {
    // Only SP/HTAB can surround a value here: CR, LF and other controls were refused before.
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(Violation::BadContentLength);
    }
    let parse = |acc: u64, d: &u8| acc.checked_mul(10)?.checked_add(u64::from(d - b'0'));
    digits
        .iter()
        .try_fold(0u64, parse)
        .filter(|&n| n <= MAX_CONTENT_LENGTH)
        .ok_or(Violation::BadContentLength)
}

fn check_transfer_encoding(values: &[&[u8]]) -> Result<(), Violation> {
    let codings: Vec<&[u8]> = values
        .iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
        .collect();
    let is_chunked = |c: &&[u8]| c.eq_ignore_ascii_case(b"chunked");
    match codings.split_last() {
        None => Err(Violation::BadTransferEncoding),
        Some((last, _)) if !is_chunked(last) => Err(Violation::TeNotChunked),
        Some((_, rest)) if rest.iter().any(is_chunked) => Err(Violation::BadTransferEncoding),
        Some(_) => Ok(()),
    }
}

fn from_httparse(e: httparse::Error) -> Violation {
    match e {
        httparse::Error::HeaderName => Violation::InvalidHeaderName,
        httparse::Error::HeaderValue => Violation::InvalidHeaderValue,
        httparse::Error::TooManyHeaders => Violation::TooManyHeaders,
        _ => Violation::MalformedRequestLine,
    }
}

/// The messages are fixed sentences without `"` or `\` (a test holds them to it), so the
/// body needs no JSON escaping.
fn rejection(v: &Violation, id: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"error":"bad_request","message":"{v}","request_id":"{id}","reason":"{}"}}"#,
        v.reason()
    );
    let status = match v.status() {
        431 => "431 Request Header Fields Too Large",
        _ => "400 Bad Request",
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n\
         Ostiary-Request-Id: {id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn clamp(left: u64, avail: usize) -> usize {
    usize::try_from(left).map_or(avail, |l| l.min(avail))
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the reader (hyper) received, what went back to the client (the random request
    /// id replaced by `ID`), the read error kind and the violation's reason.
    type Outcome = (Vec<u8>, String, Option<io::ErrorKind>, Option<&'static str>);

    fn passed(input: &[u8]) -> Outcome {
        (input.to_vec(), String::new(), None, None)
    }

    /// Plays `input` as the client through a pipe of `pipe` bytes, so reads and writes are
    /// split at that size and meet back-pressure (Pending) on both sides.
    async fn run_once(input: &[u8], max: usize, pipe: usize) -> Outcome {
        let (client, server) = tokio::io::duplex(pipe);
        let (mut from_guard, mut to_guard) = tokio::io::split(client);
        let input = input.to_vec();
        let sender = tokio::spawn(async move {
            // Fails once the guard hangs up after a rejection; the unsent rest is moot then.
            let _ = to_guard.write_all(&input).await;
            let _ = to_guard.shutdown().await;
        });
        let receiver = tokio::spawn(async move {
            let mut wire = Vec::new();
            from_guard.read_to_end(&mut wire).await.map(|_| wire)
        });
        let mut guard = StrictH1::new(server, max);
        let (mut released, mut chunk) = (Vec::new(), [0u8; 997]);
        let error = loop {
            match guard.read(&mut chunk).await {
                Ok(0) => break None,
                Ok(n) => released.extend_from_slice(&chunk[..n]),
                Err(e) => break Some(e.kind()),
            }
            // Stands in for hyper's answers, which let the next head be inspected.
            guard.write_all(b".").await.unwrap();
        };
        let reason = guard.violation().map(Violation::reason);
        let id = guard.rejection_id().map(str::to_owned);
        drop(guard);
        sender.await.unwrap();
        let wire = String::from_utf8(receiver.await.unwrap().unwrap()).unwrap();
        let mut wire = wire.trim_start_matches('.').to_owned();
        if let Some(id) = id {
            assert!(id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
            wire = wire.replace(&id, "ID");
        }
        (released, wire, error, reason)
    }

    /// Runs under several read/write splittings, which must all agree.
    async fn run_max(input: &[u8], max: usize) -> Outcome {
        let whole = run_once(input, max, 1 << 20).await;
        for pipe in [1, 3, 7, 4096] {
            assert_eq!(run_once(input, max, pipe).await, whole, "pipe of {pipe}");
        }
        whole
    }

    async fn run(input: &[u8]) -> Outcome {
        run_max(input, DEFAULT_MAX_HEAD_BYTES).await
    }

    /// `bad`, sent after `good`, is answered with `status` and none of it is released.
    async fn assert_rejected_after(good: &[u8], bad: &[u8], status: &str, reason: &str) {
        let (released, wire, error, got) = run(&[good, bad].concat()).await;
        assert_eq!(
            (&released[..], error, got),
            (good, None, Some(reason)),
            "{bad:?}"
        );
        assert!(
            wire.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{wire}"
        );
        assert!(
            wire.ends_with(&format!(r#""request_id":"ID","reason":"{reason}"}}"#)),
            "{wire}"
        );
    }

    async fn assert_rejected(bad: &[u8], reason: &str) {
        assert_rejected_after(b"", bad, "400 Bad Request", reason).await;
    }

    const GET: &[u8] = b"GET /a HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
    const CHUNKED: &[u8] = b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";

    #[tokio::test]
    async fn good_requests_pass_unchanged() {
        let inputs: &[&[u8]] = &[
            GET,
            b"\r\nGET / HTTP/1.0\r\n\r\n",
            b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello",
            b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length:  0 \r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-Name: Zo\xc3\xab\r\n\r\n",
        ];
        for input in inputs {
            assert_eq!(run(input).await, passed(input));
        }
    }

    #[tokio::test]
    async fn good_chunked_with_extensions_and_trailers_passes() {
        let body: &[u8] = b"5;name=\"v\"\r\nhello\r\n0000000000000006 \r\n world\r\n\
                            A\r\n0123456789\r\n0\r\nX-Checksum: abc\r\nX-Other: d\r\n\r\n";
        let input = [CHUNKED, body].concat();
        assert_eq!(run(&input).await, passed(&input));
        let empty = [CHUNKED, b"0\r\n\r\n"].concat();
        assert_eq!(run(&empty).await, passed(&empty));
    }

    #[tokio::test]
    async fn pipelined_keep_alive_requests_pass() {
        let post = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
        let input = [GET, post, CHUNKED, b"3\r\nxyz\r\n0\r\n\r\n", GET].concat();
        assert_eq!(run(&input).await, passed(&input));
    }

    #[tokio::test]
    async fn body_larger_than_head_limit_streams_through() {
        let body = vec![b'\n'; 10_000];
        let head = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len());
        let input = [head.as_bytes(), &body, GET].concat();
        assert_eq!(run_max(&input, 128).await, passed(&input));
    }

    #[tokio::test]
    async fn connect_and_upgrade_switch_to_raw() {
        let raw: &[u8] = b"\x16\x03\x01\0\x05\n\n\rGET / HTTP/1.1\nTransfer-Encoding: x\r\n\r\n";
        let connect: &[u8] = b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n";
        let upgrade: &[u8] = b"GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n";
        for head in [connect, upgrade] {
            let input = [head, raw].concat();
            assert_eq!(run(&input).await, passed(&input));
        }
    }

    #[tokio::test]
    async fn upgrade_on_http10_is_not_a_switch() {
        // hyper never upgrades HTTP/1.0, so the next request is still ours to check.
        let head = b"GET / HTTP/1.0\r\nUpgrade: websocket\r\nConnection: keep-alive\r\n\r\n";
        let bad = b"GET / HTTP/1.1\nHost: h\r\n\r\n";
        assert_rejected_after(head, bad, "400 Bad Request", "bare_lf").await;
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

    #[tokio::test]
    async fn rejection_is_exact_and_ends_the_stream() {
        let body = concat!(
            r#"{"error":"bad_request","message":"The request has a line feed not preceded "#,
            r#"by a carriage return.","request_id":"ID","reason":"bare_lf"}"#
        );
        let wire = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n\
             Ostiary-Request-Id: ID\r\nContent-Length: {}\r\n\r\n{body}",
            body.len() - "ID".len() + 16
        );
        let out = run(b"GET / HTTP/1.1\nHost: h\r\n\r\n").await;
        assert_eq!(out, (vec![], wire, None, Some("bare_lf")));
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
    async fn bad_request_lines_are_rejected_unreleased() {
        #[rustfmt::skip]
        let cases: &[(&[u8], &str)] = &[
            (b"GET / HTTP/1.1\nHost: h\r\n\r\n", "bare_lf"),
            (b"\nGET / HTTP/1.1\r\n\r\n", "bare_lf"),
            (b"GET /\0 HTTP/1.1\r\n\r\n", "nul_byte"),
            (b"GET / HTTP/1.1\r\r\n\r\n", "bare_cr"),
            (b"GET  / HTTP/1.1\r\n\r\n", "malformed_request_line"),
            (b"GET / HTTP/2.0\r\n\r\n", "malformed_request_line"),
            (b"garbage\r\n\r\n", "malformed_request_line"),
            (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "te_on_http10"),
        ];
        for (bad, reason) in cases {
            assert_rejected(bad, reason).await;
        }
    }

    #[tokio::test]
    async fn bad_header_sections_are_rejected_unreleased() {
        #[rustfmt::skip]
        let cases: &[(&[u8], &str)] = &[
            (b"Host: h\n\r\n", "bare_lf"),
            (b"Host: h\r\n\n", "bare_lf"),
            (b"Host: h\r\nX: a\r\n b\r\n\r\n", "obs_fold"),
            (b"\tX: b\r\n\r\n", "obs_fold"),
            (b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "cl_and_te"),
            (b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "cl_and_te"),
            (b"Content-Length: 3\r\nContent-Length: 3\r\n\r\n", "duplicate_content_length"),
            (b"Content-Length: 3, 3\r\n\r\n", "bad_content_length"),
            (b"Content-Length: +3\r\n\r\n", "bad_content_length"),
            (b"Content-Length: 0x10\r\n\r\n", "bad_content_length"),
            (b"Content-Length:\r\n\r\n", "bad_content_length"),
            (b"Content-Length: 18446744073709551616\r\n\r\n", "bad_content_length"),
            (b"Content-Length: 18446744073709551615\r\n\r\n", "bad_content_length"),
            (b"Transfer-Encoding: gzip\r\n\r\n", "te_not_chunked"),
            (b"Transfer-Encoding: chunked, gzip\r\n\r\n", "te_not_chunked"),
            (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: br\r\n\r\n", "te_not_chunked"),
            (b"Transfer-Encoding: chunked, chunked\r\n\r\n", "bad_transfer_encoding"),
            (b"Transfer-Encoding: ,\r\n\r\n", "bad_transfer_encoding"),
            (b"Host: a\r\nHost: b\r\n\r\n", "duplicate_host"),
            (b"X: a\0b\r\n\r\n", "nul_byte"),
            (b"X: a\rb\r\n\r\n", "bare_cr"),
            (b"Bad[Name]: x\r\n\r\n", "invalid_header_name"),
            (b"Host : h\r\n\r\n", "invalid_header_name"),
            (b"NoColon\r\n\r\n", "invalid_header_name"),
            (b"X: a\x7fb\r\n\r\n", "invalid_header_value"),
            (b"X: \xff\xfe\r\n\r\n", "invalid_header_value"),
            (b"X: ok\xc3\r\n\r\n", "invalid_header_value"),
        ];
        for (fields, reason) in cases {
            assert_rejected(&[b"POST / HTTP/1.1\r\n", *fields].concat(), reason).await;
        }
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
    }

    #[tokio::test]
    async fn oversized_heads_get_431() {
        let head = |len: usize| format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(len - 23));
        assert_eq!(head(100).len(), 100);
        assert_eq!(
            run_max(head(100).as_bytes(), 100).await,
            passed(head(100).as_bytes())
        );
        let (released, wire, _, reason) = run_max(head(101).as_bytes(), 100).await;
        assert_eq!((released, reason), (vec![], Some("header_too_large")));
        let too_large = "431 Request Header Fields Too Large";
        assert!(wire.starts_with(&format!("HTTP/1.1 {too_large}\r\n")));
        // Never terminated: refused once the limit is passed, without waiting for the end.
        let endless = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(200));
        assert_eq!(
            run_max(endless.as_bytes(), 100).await.3,
            Some("header_too_large")
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("H{i}: v\r\n")).collect();
        let input = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_rejected_after(b"", input.as_bytes(), too_large, "too_many_headers").await;
    }

    #[tokio::test]
    async fn partial_head_at_eof_is_never_released() {
        assert_eq!(run(b"GET / HTTP/1.1\r\nHost: h\r\n").await, passed(b""));
    }

    #[tokio::test]
    async fn chunked_body_violations_fail_the_read() {
        // (body, the part of it released before the failure, reason)
        #[rustfmt::skip]
        let cases: &[(&[u8], &[u8], &str)] = &[
            (b"zz\r\nhi\r\n0\r\n\r\n", b"", "bad_chunk_size"),
            (b"\r\n", b"", "bad_chunk_size"),
            (b"00000000000000001\r\na\r\n", b"0000000000000000", "chunk_size_overflow"),
            (b"5\nhello\r\n", b"5", "bad_chunk_size"),
            (b"5\r\nhelloX0\r\n\r\n", b"5\r\nhello", "bad_chunk_terminator"),
            (b"5;a\x01\r\nhello\r\n", b"5;a", "bad_chunk_extension"),
            (b"1\r\na\r\n0\r\nX: y\n\r\n", b"1\r\na\r\n0\r\n", "bare_lf"),
            (b"0\r\nX: y\r\n z\r\n\r\n", b"0\r\n", "obs_fold"),
            (b"0\r\nX[: y\r\n\r\n", b"0\r\n", "invalid_header_name"),
            (b"0\r\nX: \xff\r\n\r\n", b"0\r\n", "invalid_header_value"),
        ];
        for &(body, good, reason) in cases {
            let (released, wire, error, got) = run(&[CHUNKED, body].concat()).await;
            assert_eq!(released, [CHUNKED, good].concat(), "{reason}");
            assert_eq!(
                (wire, error, got),
                (
                    String::new(),
                    Some(io::ErrorKind::InvalidData),
                    Some(reason)
                )
            );
        }
    }

    /// One poll of `poll_read`: whether it returned Pending.
    async fn read_is_pending<IO: AsyncRead + AsyncWrite + Unpin>(guard: &mut StrictH1<IO>) -> bool {
        let mut buf = [0u8; 64];
        let mut rb = ReadBuf::new(&mut buf);
        std::future::poll_fn(|cx| {
            Poll::Ready(Pin::new(&mut *guard).poll_read(cx, &mut rb).is_pending())
        })
        .await
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

    /// Serves `input` with hyper over the guard; returns what the client got back and
    /// what the service saw: one `path body-or-error` line per request.
    async fn through_hyper(input: &[u8]) -> (String, Vec<String>) {
        use http_body_util::BodyExt;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let log = log.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    log.lock().unwrap().push(format!("{path} {body:?}"));
                    let ok = http_body_util::Full::new(bytes::Bytes::from_static(b"ok"));
                    Ok::<_, hyper::Error>(hyper::Response::new(ok))
                }
            });
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let io = hyper_util::rt::TokioIo::new(StrictH1::new(server, DEFAULT_MAX_HEAD_BYTES));
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
        let conn = tokio::spawn(conn);
        client.write_all(input).await.unwrap();
        let mut wire = String::new();
        client.read_to_string(&mut wire).await.unwrap();
        conn.await.unwrap().unwrap();
        let seen = seen.lock().unwrap().clone();
        (wire, seen)
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

    #[tokio::test]
    async fn hyper_sees_a_bad_chunk_as_a_body_error() {
        let (_, seen) = through_hyper(&[CHUNKED, b"5\r\nhello\r\nG\r\n"].concat()).await;
        assert_eq!(seen.len(), 1);
        assert!(
            seen[0].starts_with("/c Err(") && seen[0].contains("BadChunkSize"),
            "{seen:?}"
        );
    }

    #[test]
    fn messages_need_no_json_escaping() {
        for v in Violation::ALL {
            let message = v.to_string();
            assert!(!message.contains(['"', '\\']) && !message.chars().any(char::is_control));
        }
        assert_eq!(Violation::ALL.len(), 20);
    }
}
