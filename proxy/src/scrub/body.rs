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
use std::task::{Context, Poll, Waker};

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZlibDecoder, ZstdDecoder};
use bytes::Bytes;
use futures_util::Stream;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::io::{AsyncBufRead, AsyncRead, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use super::{ScrubError, Scrubber, StreamScrubber, MAX_ENCODINGS, REDACTED};
use crate::body::filter::{ChunkFilter, Filtered};
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
    let input = Arc::new(Mutex::new(Input::default()));
    let mut reader: BufRead = Box::pin(StreamReader::new(Fed(input.clone())));
    let mut layers = codings.iter().rev();
    let outermost = *layers.next().expect("decode is called with codings");
    let mut decoded = decoder(outermost, reader);
    for &coding in layers {
        reader = Box::pin(BufReader::with_capacity(DECODED_CHUNK, decoded));
        decoded = decoder(coding, reader);
    }
    let decode = Decode {
        input,
        output: ReaderStream::with_capacity(decoded, DECODED_CHUNK),
        name: codings
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", "),
        waiting: true,
        done: false,
    };
    Filtered::wrap(source, decode).boxed()
}

/// The encoded bytes fed to the decoders and not yet read by them.
#[derive(Default)]
struct Input {
    chunks: VecDeque<Bytes>,
    /// The body has ended: no more will come.
    ended: bool,
}

fn lock(input: &Mutex<Input>) -> std::sync::MutexGuard<'_, Input> {
    input.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`Input`] as a byte stream for the decoders: pending when it is empty and more may
/// come. It registers no waker: [`Decode`] polls the decoders again itself once it has fed
/// them.
struct Fed(Arc<Mutex<Input>>);

impl Stream for Fed {
    type Item = std::io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut input = lock(&self.0);
        match input.chunks.pop_front() {
            Some(chunk) => Poll::Ready(Some(Ok(chunk))),
            None if input.ended => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

/// Decodes a body as it streams. Each chunk is handed to the decoders, and what they make
/// of it passes on a piece at a time as the reader takes it: a few KiB of input can inflate
/// to gigabytes, and are never decoded further ahead than one piece.
struct Decode {
    input: Arc<Mutex<Input>>,
    output: ReaderStream<Reader>,
    /// The codings, as the header named them (for errors).
    name: String,
    /// The decoders wait for more input.
    waiting: bool,
    /// The decoders reached the end of the encoded stream, or failed.
    done: bool,
}

impl Decode {
    fn error(&self, source: std::io::Error) -> ScrubError {
        ScrubError::Decode {
            encoding: self.name.clone(),
            source,
        }
    }
}

impl ChunkFilter for Decode {
    type Error = ScrubError;

    fn feed(&mut self, chunk: Bytes, _: &mut VecDeque<Bytes>) -> Result<(), ScrubError> {
        if self.done {
            // Bytes after the end of the encoded stream: not part of the representation,
            // and never passed on undecoded.
            return Ok(());
        }
        lock(&self.input).chunks.push_back(chunk);
        self.waiting = false;
        Ok(())
    }

    fn finish(&mut self, _: &mut VecDeque<Bytes>) -> Result<(), ScrubError> {
        lock(&self.input).ended = true;
        self.waiting = false;
        Ok(())
    }

    fn resume(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), ScrubError> {
        // The decoders' only input is [`Input`], in memory: they wait only for it to be
        // fed, and are polled again when it is, so no waker is needed.
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self.output).poll_next(&mut cx) {
            Poll::Pending => self.waiting = true,
            Poll::Ready(Some(Ok(data))) => out.push_back(data),
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                return Err(self.error(e));
            }
            Poll::Ready(None) => self.done = true,
        }
        Ok(())
    }

    fn has_more(&self) -> bool {
        !self.waiting && !self.done
    }

    fn failed(&mut self, error: BoxError) -> BoxError {
        self.error(std::io::Error::other(error)).into()
    }
}

/// A body whose data and trailers are scrubbed as they stream through.
pub type ScrubBody = Filtered<ProxyBody, Scrub>;

/// The scrub of a [`ScrubBody`].
#[derive(Debug)]
pub struct Scrub {
    stream: StreamScrubber,
    scrubber: Scrubber,
}

impl ScrubBody {
    /// Scrub `source` (already identity-encoded) with `scrubber`.
    pub fn new(scrubber: Scrubber, source: ProxyBody) -> Self {
        let scrub = Scrub {
            stream: StreamScrubber::new(scrubber.clone()),
            scrubber,
        };
        Filtered::wrap(source, scrub)
    }
}

impl ChunkFilter for Scrub {
    type Error = std::convert::Infallible;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), Self::Error> {
        self.stream.feed(chunk, out);
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), Self::Error> {
        // Trailers end the body too: what is held back is final.
        self.stream.finish(out);
        Ok(())
    }

    fn trailers(&mut self, mut trailers: HeaderMap) -> Result<Option<HeaderMap>, Self::Error> {
        self.scrubber.scrub_headers(&mut trailers);
        Ok(Some(trailers))
    }

    fn failed(&mut self, error: BoxError) -> BoxError {
        // The held-back bytes may be half a secret: dropped, never flushed.
        self.stream.discard();
        error
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

#[cfg(test)]
mod tests {
    use async_compression::tokio::bufread::GzipEncoder;
    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn a_small_body_that_inflates_is_decoded_only_as_it_is_read() {
        let plain = vec![b'a'; 16 * 1024 * 1024];
        let mut gz = Vec::new();
        GzipEncoder::new(&plain[..])
            .read_to_end(&mut gz)
            .await
            .unwrap();
        assert!(gz.len() < 64 * 1024, "{}", gz.len());
        let mut decoded = decode(body::full(gz), &[Coding::Gzip]);
        let first = decoded.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(first.len() <= DECODED_CHUNK);
        // Nothing more was decoded ahead of the reader.
        assert_eq!(decoded.size_hint().lower(), 0);
        assert_eq!(decoded.size_hint().upper(), None);
        let rest = decoded.collect().await.unwrap().to_bytes();
        assert_eq!(first.len() + rest.len(), plain.len());
    }
}
