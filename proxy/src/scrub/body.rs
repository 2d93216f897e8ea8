//! Wrapping an upstream response so that what reaches the agent is scrubbed: headers and
//! reason phrase at once, the body frame by frame, the trailers at the end — decoding the
//! body first when the upstream compressed it despite being asked not to.
//!
//! Stacked codings (`Content-Encoding: gzip, br`) are decoded in reverse order of
//! application, up to [`MAX_ENCODINGS`]; `identity` entries are skipped. HTTP's `deflate`
//! is the zlib format (RFC 9110 §8.4.1.2); a raw-deflate body fails to decode and the
//! stream ends with an error rather than passing it on.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZlibDecoder, ZstdDecoder};
use bytes::Bytes;
use futures_util::Stream;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncBufRead, AsyncRead, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use super::{ScrubError, Scrubber, StreamScrubber, MAX_ENCODINGS, REDACTED};
use crate::body::{self, BoxError, ProxyBody};

/// Size of the decoded pieces: large enough that scanning dominates per-frame costs.
const DECODED_CHUNK: usize = 32 * 1024;

/// Wrap `response` so the agent sees it scrubbed (see the module docs). `Content-Length`
/// is removed whenever the body is scrubbed (a redaction changes its length), and
/// `Content-Encoding` too when the body was decoded.
pub fn scrub_response<B>(
    scrubber: &Scrubber,
    response: Response<B>,
) -> Result<Response<ProxyBody>, ScrubError>
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = response.into_parts();
    if scrubber.is_empty() {
        return Ok(Response::from_parts(parts, body::stream(body)));
    }
    scrubber.scrub_headers(&mut parts.headers);
    if let Some(reason) = parts.extensions.get::<hyper::ext::ReasonPhrase>() {
        if let std::borrow::Cow::Owned(new) = scrubber.scrub_bytes(reason.as_bytes()) {
            let new = hyper::ext::ReasonPhrase::try_from(new)
                .unwrap_or_else(|_| hyper::ext::ReasonPhrase::from_static(REDACTED.as_bytes()));
            parts.extensions.insert(new);
        }
    }
    if body.is_end_stream() {
        // HEAD, 204, 304 or an empty answer: no body to scrub, the headers describe
        // what a GET would return and stay as they are.
        return Ok(Response::from_parts(parts, body::stream(body)));
    }
    let codings = codings(&parts.headers)?;
    parts.headers.remove(CONTENT_LENGTH);
    let source = if codings.is_empty() {
        body::stream(body)
    } else {
        parts.headers.remove(CONTENT_ENCODING);
        decode(body::stream(body), &codings)
    };
    let scrubbed = ScrubBody::new(scrubber.clone(), source);
    Ok(Response::from_parts(parts, scrubbed.boxed()))
}

/// A content coding the proxy decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Gzip,
    Zlib,
    Brotli,
    Zstd,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Zlib => "deflate",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }
}

/// The codings applied to the body, in the order they were applied (header order).
fn codings(headers: &HeaderMap) -> Result<Vec<Coding>, ScrubError> {
    let mut out = Vec::new();
    for value in headers.get_all(CONTENT_ENCODING) {
        let Ok(text) = value.to_str() else {
            return Err(ScrubError::UndecodableEncoding(describe_coding("")));
        };
        for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let coding = match token.to_ascii_lowercase().as_str() {
                "identity" => continue,
                "gzip" | "x-gzip" => Coding::Gzip,
                "deflate" => Coding::Zlib,
                "br" => Coding::Brotli,
                "zstd" => Coding::Zstd,
                // The token is not echoed unless it is a registered coding name: an upstream
                // can put a case-changed secret here, which the (case-sensitive) header
                // scrub let through and lowercasing would rebuild.
                other => return Err(ScrubError::UndecodableEncoding(describe_coding(other))),
            };
            out.push(coding);
        }
    }
    if out.len() > MAX_ENCODINGS {
        return Err(ScrubError::TooManyEncodings(out.len()));
    }
    Ok(out)
}

type Reader = Pin<Box<dyn AsyncRead + Send + Sync>>;
type BufRead = Pin<Box<dyn AsyncBufRead + Send + Sync>>;

fn decoder(coding: Coding, input: BufRead) -> Reader {
    match coding {
        Coding::Gzip => {
            let mut d = GzipDecoder::new(input);
            // Concatenated members are one valid gzip body (RFC 1952 §2.2).
            d.multiple_members(true);
            Box::pin(d)
        }
        Coding::Zlib => Box::pin(ZlibDecoder::new(input)),
        Coding::Brotli => Box::pin(BrotliDecoder::new(input)),
        Coding::Zstd => {
            let mut d = ZstdDecoder::new(input);
            d.multiple_members(true);
            Box::pin(d)
        }
    }
}

/// The body decoded, `codings` undone last-applied first. Trailers of the encoded body
/// follow the decoded data.
fn decode(source: ProxyBody, codings: &[Coding]) -> ProxyBody {
    let shared = Arc::new(Mutex::new(Source {
        body: source,
        trailers: None,
        finished: false,
    }));
    let mut input: BufRead = Box::pin(StreamReader::new(DataFrames(shared.clone())));
    let mut layers = codings.iter().rev();
    let outermost = *layers.next().expect("decode is called with codings");
    let mut reader = decoder(outermost, input);
    for &coding in layers {
        input = Box::pin(BufReader::with_capacity(DECODED_CHUNK, reader));
        reader = decoder(coding, input);
    }
    Decoded {
        reader: ReaderStream::with_capacity(reader, DECODED_CHUNK),
        source: shared,
        name: codings
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", "),
        state: DecodeState::Decoding,
    }
    .boxed()
}

/// The encoded body, shared between the decoders reading it and [`Decoded`], which reads
/// what is left once they are done (a decoder stops at the end of its format, before the
/// trailers).
struct Source {
    body: ProxyBody,
    trailers: Option<HeaderMap>,
    finished: bool,
}

fn lock(source: &Mutex<Source>) -> std::sync::MutexGuard<'_, Source> {
    source.lock().unwrap_or_else(|p| p.into_inner())
}

impl Source {
    /// The next data of the body; `None` at its end, trailers put aside.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => None,
                Poll::Ready(Some(Err(e))) => {
                    self.finished = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(frame))) => Some(frame),
            };
            match frame.map(Frame::into_data) {
                None => self.finished = true,
                Some(Ok(data)) if data.is_empty() => {}
                Some(Ok(data)) => return Poll::Ready(Some(Ok(data))),
                Some(Err(frame)) => {
                    self.finished = true;
                    self.trailers = frame.into_trailers().ok();
                }
            }
        }
    }
}

/// The data of the encoded body as a byte stream for the decoders.
struct DataFrames(Arc<Mutex<Source>>);

impl Stream for DataFrames {
    type Item = std::io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        lock(&self.0)
            .poll_data(cx)
            .map(|d| d.map(|r| r.map_err(std::io::Error::other)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecodeState {
    Decoding,
    /// The decoders are done: read the rest of the encoded body for its trailers.
    Draining,
    Done,
}

/// The decoded body, as frames.
struct Decoded {
    reader: ReaderStream<Reader>,
    source: Arc<Mutex<Source>>,
    /// The codings, as the header named them (for errors).
    name: String,
    state: DecodeState,
}

impl Decoded {
    fn fail(&mut self, source: std::io::Error) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.state = DecodeState::Done;
        let error = ScrubError::Decode {
            encoding: self.name.clone(),
            source,
        };
        Poll::Ready(Some(Err(error.into())))
    }
}

impl Body for Decoded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            match this.state {
                DecodeState::Done => return Poll::Ready(None),
                DecodeState::Decoding => match Pin::new(&mut this.reader).poll_next(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(data))) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Poll::Ready(Some(Err(e))) => return this.fail(e),
                    Poll::Ready(None) => this.state = DecodeState::Draining,
                },
                DecodeState::Draining => {
                    let mut source = lock(&this.source);
                    match source.poll_data(cx) {
                        Poll::Pending => return Poll::Pending,
                        // Bytes after the end of the encoded stream: not part of the
                        // representation, and never passed on undecoded.
                        Poll::Ready(Some(Ok(_))) => continue,
                        Poll::Ready(Some(Err(e))) => {
                            drop(source);
                            return this.fail(std::io::Error::other(e));
                        }
                        Poll::Ready(None) => {
                            let trailers = source.trailers.take();
                            drop(source);
                            this.state = DecodeState::Done;
                            return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                        }
                    }
                }
            }
        }
    }
}

/// A body whose data and trailers are scrubbed as they stream through.
pub struct ScrubBody {
    source: ProxyBody,
    stream: StreamScrubber,
    scrubber: Scrubber,
    /// Scrubbed data ready to go out, in order.
    pending: VecDeque<Bytes>,
    /// Scrubbed trailers, after the pending data.
    trailers: Option<HeaderMap>,
    /// The source is finished (ended, or failed).
    ended: bool,
}

impl std::fmt::Debug for ScrubBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrubBody")
            .field("stream", &self.stream)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl ScrubBody {
    /// Scrub `source` (already identity-encoded) with `scrubber`.
    pub fn new(scrubber: Scrubber, source: ProxyBody) -> Self {
        Self {
            source,
            stream: StreamScrubber::new(scrubber.clone()),
            scrubber,
            pending: VecDeque::new(),
            trailers: None,
            ended: false,
        }
    }
}

impl Body for ScrubBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(data) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if let Some(trailers) = this.trailers.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.source).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.ended = true;
                    this.stream.finish(&mut this.pending);
                }
                Poll::Ready(Some(Err(e))) => {
                    // The held-back bytes may be half a secret: dropped, never flushed.
                    this.ended = true;
                    this.stream.discard();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.stream.feed(data, &mut this.pending),
                    Err(frame) => {
                        // Trailers end the body: what is held back is final.
                        this.ended = true;
                        this.stream.finish(&mut this.pending);
                        if let Ok(mut trailers) = frame.into_trailers() {
                            this.scrubber.scrub_headers(&mut trailers);
                            this.trailers = Some(trailers);
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty() && self.trailers.is_none()
    }
}

/// A content coding named in an error: registered names as they are, anything else not.
fn describe_coding(token: &str) -> String {
    const KNOWN: [&str; 6] = [
        "compress",
        "x-compress",
        "exi",
        "pack200-gzip",
        "aes128gcm",
        "dcb",
    ];
    if KNOWN.contains(&token) {
        token.to_owned()
    } else {
        "an unregistered content coding".to_owned()
    }
}
