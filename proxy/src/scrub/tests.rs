//! Tests of response scrubbing with real bytes: real encoders make the compressed inputs,
//! bodies are streamed in every chunking that could hide a secret at a frame boundary.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_compression::tokio::bufread::{BrotliEncoder, GzipEncoder, ZlibEncoder, ZstdEncoder};
use base64::Engine;
use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncReadExt;

use super::*;
use crate::body::{BoxError, ProxyBody};

const SECRET: &str = "sk-live-4f9a8b7c6d5e";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A body made of these frames, then these trailers, then possibly an error.
struct Frames {
    frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.get_mut().frames.pop_front())
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }
}

fn frames(chunks: impl IntoIterator<Item = Vec<u8>>) -> Frames {
    Frames {
        frames: chunks
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from(c))))
            .collect(),
    }
}

fn split(body: &[u8], size: usize) -> Vec<Vec<u8>> {
    body.chunks(size).map(<[u8]>::to_vec).collect()
}

/// Everything the body yields: data, trailers, or the error it ended with.
async fn collect(mut body: ProxyBody) -> (Vec<u8>, Option<HeaderMap>, Option<BoxError>) {
    let mut data = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Err(e) => return (data, trailers, Some(e)),
        }
    }
    (data, trailers, None)
}

/// Streamed through [`StreamScrubber`] in these chunks.
fn streamed(scrubber: &Scrubber, chunks: &[&[u8]]) -> Vec<u8> {
    let mut s = StreamScrubber::new(scrubber.clone());
    let mut out = VecDeque::new();
    for c in chunks {
        s.feed(Bytes::copy_from_slice(c), &mut out);
    }
    s.finish(&mut out);
    out.iter().flat_map(|b| b.iter().copied()).collect()
}

fn redacted(parts: &[&str]) -> Vec<u8> {
    parts.join(REDACTED).into_bytes()
}

#[test]
fn secret_in_the_middle_is_replaced() {
    let s = Scrubber::new([SECRET]);
    let body = format!("{{\"echo\":\"Bearer {SECRET}\"}}");
    assert_eq!(
        s.scrub_bytes(body.as_bytes()).as_ref(),
        redacted(&["{\"echo\":\"Bearer ", "\"}"])
    );
    assert_eq!(
        streamed(&s, &[body.as_bytes()]),
        redacted(&["{\"echo\":\"Bearer ", "\"}"])
    );
}

#[test]
fn secret_split_at_every_two_and_three_way_boundary() {
    let s = Scrubber::new([SECRET]);
    let body = format!("head {SECRET} tail");
    let body = body.as_bytes();
    let want = redacted(&["head ", " tail"]);
    for i in 0..=body.len() {
        assert_eq!(
            streamed(&s, &[&body[..i], &body[i..]]),
            want,
            "split at {i}"
        );
        for j in i..=body.len() {
            let got = streamed(&s, &[&body[..i], &body[i..j], &body[j..]]);
            assert_eq!(got, want, "split at {i}, {j}");
        }
    }
    // One byte per frame.
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(streamed(&s, &bytes), want);
}

#[test]
fn secret_at_the_very_end_is_flushed_scrubbed() {
    let s = Scrubber::new([SECRET]);
    let body = format!("tail {SECRET}");
    let (a, b) = body.as_bytes().split_at(10);
    assert_eq!(streamed(&s, &[a, b]), redacted(&["tail ", ""]));
    // An unfinished prefix at the end is no secret: it goes out as it is.
    let partial = format!("tail {}", &SECRET[..8]);
    assert_eq!(streamed(&s, &[partial.as_bytes()]), partial.as_bytes());
}

#[test]
fn several_secrets_and_overlapping_patterns() {
    let s = Scrubber::new(["alpha-secret", "bravo-secret", "abcdef", "defghi", "abcd"]);
    let body = b"x alpha-secret y bravo-secret z abcdefghi abcdX";
    let whole = s.scrub_bytes(body).into_owned();
    // Leftmost-longest: "abcdef" wins over "abcd" and leaves "ghi"; "abcd" alone matches.
    assert_eq!(
        whole,
        redacted(&["x ", " y ", " z ", "ghi ", "X"]),
        "{}",
        String::from_utf8_lossy(&whole)
    );
    for i in 0..=body.len() {
        for j in i..=body.len() {
            assert_eq!(streamed(&s, &[&body[..i], &body[i..j], &body[j..]]), whole);
        }
    }
}

#[test]
fn base64_forms_at_all_alignments_are_caught() {
    let s = Scrubber::new([SECRET]);
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    for engine in engines {
        let alone = engine.encode(SECRET);
        assert_eq!(
            s.scrub_bytes(alone.as_bytes()).as_ref(),
            REDACTED.as_bytes()
        );
        for prefix in ["", "x", "xx", "xxx", "{\"k\":\""] {
            for suffix in ["", "y", "yy", "\"}"] {
                let blob = engine.encode(format!("{prefix}{SECRET}{suffix}"));
                let out = s.scrub_bytes(blob.as_bytes());
                assert!(contains(&out, REDACTED.as_bytes()), "{prefix:?} {suffix:?}");
                // Nothing left that decodes to the secret at any alignment.
                assert_eq!(s.scrub_bytes(&out), out);
                let framed = format!("{{\"data\":\"{blob}\"}}");
                let halves = framed.as_bytes().split_at(framed.len() / 2);
                assert_eq!(
                    streamed(&s, &[halves.0, halves.1]),
                    s.scrub_bytes(framed.as_bytes()).as_ref()
                );
            }
        }
    }
}

#[test]
fn percent_encoded_forms_are_caught() {
    let secret = "p@ss/w0rd+key=1";
    let s = Scrubber::new([secret]);
    for form in ["p%40ss%2Fw0rd%2Bkey%3D1", "p%40ss%2fw0rd%2bkey%3d1"] {
        let url = format!("https://example.test/cb?token={form}&x=1");
        assert_eq!(
            s.scrub_bytes(url.as_bytes()).as_ref(),
            redacted(&["https://example.test/cb?token=", "&x=1"])
        );
    }
}

#[test]
fn short_and_empty_secrets() {
    let s = Scrubber::new(["", "abc"]);
    assert!(!s.is_empty());
    assert_eq!(s.pattern_count(), 1);
    assert_eq!(s.scrub_bytes(b"xabcx").as_ref(), redacted(&["x", "x"]));
    // No base64 variants for a 3-byte secret ("YWJj" stays).
    assert_eq!(s.scrub_bytes(b"YWJj").as_ref(), b"YWJj");
    let none = Scrubber::new(["", ""]);
    assert!(none.is_empty());
    assert_eq!(none.max_pattern_len(), 0);
    assert!(matches!(
        none.scrub_bytes(b"abc"),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn debug_shows_no_secret() {
    let s = Scrubber::new([SECRET]);
    let shown = format!("{s:?}");
    assert_eq!(
        shown,
        format!("Scrubber {{ patterns: {}, shards: 1 }}", s.pattern_count())
    );
    let mut stream = StreamScrubber::new(s.clone());
    let mut out = VecDeque::new();
    stream.feed(Bytes::from(format!("x{}", &SECRET[..10])), &mut out);
    assert_eq!(stream.held(), 11);
    assert!(!format!("{stream:?}").contains(&SECRET[..10]));
    let body = ScrubBody::new(s, crate::body::empty());
    assert!(!format!("{body:?}").contains(SECRET));
}

#[test]
fn marker_never_contains_a_pattern() {
    let plain = Scrubber::new([SECRET]);
    assert_eq!(
        plain.scrub_bytes(REDACTED.as_bytes()).as_ref(),
        REDACTED.as_bytes()
    );
    let s = Scrubber::new(["ostiary"]);
    assert_eq!(s.scrub_bytes(b"a ostiary b").as_ref(), b"a [redacted] b");
    let s = Scrubber::new(["ostiary", "[redacted]"]);
    assert_eq!(s.scrub_bytes(b"a ostiary b").as_ref(), b"a  b");
}

#[test]
fn no_match_comes_back_identical_without_copying() {
    let s = Scrubber::new([SECRET]);
    let body = Bytes::from(vec![b'q'; 100_000]);
    let mut stream = StreamScrubber::new(s.clone());
    let mut out = VecDeque::new();
    stream.feed(body.clone(), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].as_ptr(), body.as_ptr());
    assert_eq!(out[0], body.slice(..body.len() - s.hold_back()));
    stream.finish(&mut out);
    assert_eq!(out.iter().map(Bytes::len).sum::<usize>(), body.len());
    assert!(matches!(
        s.scrub_bytes(&body),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn headers_are_scrubbed() {
    let s = Scrubber::new([SECRET]);
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    let mut headers = HeaderMap::new();
    headers.insert(
        LOCATION,
        format!("https://x.test/?t={SECRET}").parse().unwrap(),
    );
    headers.append(SET_COOKIE, format!("sid={b64}; Path=/").parse().unwrap());
    headers.append(SET_COOKIE, "theme=dark".parse().unwrap());
    headers.insert("x-echo", format!("{SECRET},{SECRET}").parse().unwrap());
    assert_eq!(s.scrub_headers(&mut headers), 4);
    assert_eq!(headers[LOCATION], format!("https://x.test/?t={REDACTED}"));
    assert!(headers[LOCATION].is_sensitive());
    let cookies: Vec<_> = headers.get_all(SET_COOKIE).iter().collect();
    assert_eq!(cookies[0], &format!("sid={REDACTED}; Path=/"));
    assert_eq!(cookies[1], "theme=dark");
    assert!(!cookies[1].is_sensitive());
    assert_eq!(headers["x-echo"], format!("{REDACTED},{REDACTED}"));
}

#[test]
fn request_identity_asks_for_no_compression() {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::ACCEPT_ENCODING, "gzip, br".parse().unwrap());
    request_identity(&mut headers);
    assert_eq!(headers[http::header::ACCEPT_ENCODING], "identity");
}

fn response(body: Frames, headers: &[(&str, &str)]) -> Response<Frames> {
    let mut r = Response::new(body);
    for (k, v) in headers {
        r.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    r
}

#[tokio::test]
async fn response_headers_body_reason_and_trailers_are_scrubbed() {
    let s = Scrubber::new([SECRET]);
    let body = format!("before {SECRET} after");
    let mut trailers = HeaderMap::new();
    trailers.insert("x-debug", format!("saw {SECRET}").parse().unwrap());
    let mut source = frames(split(body.as_bytes(), 9));
    source.frames.push_back(Ok(Frame::trailers(trailers)));
    let mut r = response(
        source,
        &[
            ("content-length", "27"),
            ("location", &format!("/a?k={SECRET}")),
        ],
    );
    r.extensions_mut()
        .insert(hyper::ext::ReasonPhrase::try_from(format!("OK {SECRET}")).unwrap());
    let r = scrub_response(&s, r).unwrap();
    assert!(r.headers().get(CONTENT_LENGTH).is_none());
    assert_eq!(r.headers()[LOCATION], format!("/a?k={REDACTED}"));
    let reason = r.extensions().get::<hyper::ext::ReasonPhrase>().unwrap();
    assert_eq!(reason.as_bytes(), format!("OK {REDACTED}").as_bytes());
    let (data, trailers, err) = collect(r.into_body()).await;
    assert!(err.is_none());
    assert_eq!(data, redacted(&["before ", " after"]));
    assert_eq!(trailers.unwrap()["x-debug"], format!("saw {REDACTED}"));
}

#[tokio::test]
async fn empty_scrubber_and_empty_bodies_pass_untouched() {
    let none = Scrubber::new([""]);
    let r = response(frames([b"hello".to_vec()]), &[("content-length", "5")]);
    let r = scrub_response(&none, r).unwrap();
    assert_eq!(r.headers()[CONTENT_LENGTH], "5");
    assert_eq!(collect(r.into_body()).await.0, b"hello");
    // A HEAD-like answer: no body, the headers describe the representation.
    let s = Scrubber::new([SECRET]);
    let r = response(
        frames([]),
        &[("content-encoding", "compress"), ("content-length", "9")],
    );
    let r = scrub_response(&s, r).unwrap();
    assert_eq!(r.headers()[CONTENT_ENCODING], "compress");
    assert_eq!(r.headers()[CONTENT_LENGTH], "9");
}

async fn encode(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" | "x-gzip" => GzipEncoder::new(data).read_to_end(&mut out).await,
        "deflate" => ZlibEncoder::new(data).read_to_end(&mut out).await,
        "br" => BrotliEncoder::new(data).read_to_end(&mut out).await,
        "zstd" => ZstdEncoder::new(data).read_to_end(&mut out).await,
        other => panic!("no encoder for {other}"),
    }
    .unwrap();
    out
}

fn big_body_with_secrets() -> (Vec<u8>, Vec<u8>) {
    let mut body = Vec::new();
    let mut want = Vec::new();
    for i in 0..2000 {
        let line = format!("line {i}: some text that repeats a little {}\n", i * 7919);
        body.extend_from_slice(line.as_bytes());
        want.extend_from_slice(line.as_bytes());
        if i % 500 == 250 {
            body.extend_from_slice(SECRET.as_bytes());
            want.extend_from_slice(REDACTED.as_bytes());
        }
    }
    (body, want)
}

#[tokio::test]
async fn compressed_responses_are_decoded_and_scrubbed() {
    let s = Scrubber::new([SECRET]);
    let (body, want) = big_body_with_secrets();
    for coding in ["gzip", "x-gzip", "deflate", "br", "zstd", "GZIP"] {
        let encoded = encode(&coding.to_ascii_lowercase(), &body).await;
        assert!(!contains(&encoded, SECRET.as_bytes()));
        let len = encoded.len().to_string();
        let r = response(
            frames(split(&encoded, 1000)),
            &[
                ("content-encoding", coding),
                ("content-length", &len),
                ("vary", "accept-encoding"),
            ],
        );
        let r = scrub_response(&s, r).unwrap();
        assert!(r.headers().get(CONTENT_ENCODING).is_none(), "{coding}");
        assert!(r.headers().get(CONTENT_LENGTH).is_none(), "{coding}");
        let (data, _, err) = collect(r.into_body()).await;
        assert!(err.is_none(), "{coding}: {err:?}");
        assert_eq!(data, want, "{coding}");
    }
}

#[tokio::test]
async fn stacked_encodings_are_undone_in_reverse_order() {
    let s = Scrubber::new([SECRET]);
    let (body, want) = big_body_with_secrets();
    let gz = encode("gzip", &body).await;
    let both = encode("br", &gz).await;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-t", format!("t={SECRET}").parse().unwrap());
    let mut source = frames(split(&both, 333));
    source.frames.push_back(Ok(Frame::trailers(trailers)));
    let r = response(
        source,
        &[
            ("content-encoding", "gzip"),
            ("content-encoding", "identity, br"),
        ],
    );
    let r = scrub_response(&s, r).unwrap();
    assert!(r.headers().get(CONTENT_ENCODING).is_none());
    let (data, trailers, err) = collect(r.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(data, want);
    assert_eq!(trailers.unwrap()["x-t"], format!("t={REDACTED}"));
}

#[test]
fn unknown_or_too_many_encodings_are_refused() {
    let s = Scrubber::new([SECRET]);
    for coding in ["compress", "foo", "gzip, foo"] {
        let r = response(frames([b"data".to_vec()]), &[("content-encoding", coding)]);
        match scrub_response(&s, r) {
            // Registered names are echoed; anything else could be an upstream's echo.
            Err(ScrubError::UndecodableEncoding(name)) => assert!(
                name == "an unregistered content coding" || coding.ends_with(&name),
                "{coding:?} -> {name:?}"
            ),
            other => panic!("{coding}: {:?}", other.map(|_| ())),
        }
    }
    let r = response(
        frames([b"data".to_vec()]),
        &[("content-encoding", "gzip,gzip,gzip,gzip,gzip")],
    );
    assert!(matches!(
        scrub_response(&s, r),
        Err(ScrubError::TooManyEncodings(5))
    ));
}

#[tokio::test]
async fn corrupt_or_truncated_compressed_bodies_end_in_an_error() {
    let s = Scrubber::new([SECRET]);
    let plain = format!("{SECRET} and some more text to compress {SECRET}").repeat(50);
    let gz = encode("gzip", plain.as_bytes()).await;
    let mut bad_header = gz.clone();
    bad_header[0] ^= 0xff;
    let truncated = gz[..gz.len() / 2].to_vec();
    let mut bad_crc = gz.clone();
    let n = bad_crc.len();
    bad_crc[n - 6] ^= 0x55;
    let cases = [
        ("not gzip", b"this is plain text, not gzip".to_vec()),
        ("bad header", bad_header),
        ("truncated", truncated),
        ("bad crc", bad_crc),
    ];
    for (what, bytes) in cases {
        let r = response(frames(split(&bytes, 17)), &[("content-encoding", "gzip")]);
        let r = scrub_response(&s, r).unwrap();
        let (data, _, err) = collect(r.into_body()).await;
        let err = err.unwrap_or_else(|| panic!("{what}: no error"));
        assert!(err.to_string().contains("gzip"), "{what}: {err}");
        assert!(!contains(&data, SECRET.as_bytes()), "{what}");
        // Whatever went out is decoder output, never the compressed bytes.
        assert!(!contains(&data, &bytes[..bytes.len().min(10)]), "{what}");
    }
}

#[tokio::test]
async fn an_upstream_error_ends_the_stream_without_flushing_held_bytes() {
    let s = Scrubber::new([SECRET]);
    let mut source = frames([format!("ok\n{}", &SECRET[..12]).into_bytes()]);
    source.frames.push_back(Err("connection reset".into()));
    let r = scrub_response(&s, response(source, &[])).unwrap();
    let (data, _, err) = collect(r.into_body()).await;
    assert_eq!(err.unwrap().to_string(), "connection reset");
    assert_eq!(data, b"ok\n");
}

#[tokio::test]
async fn four_mib_body_with_secrets_on_chunk_boundaries() {
    let s = Scrubber::new([SECRET, "second-secret-value"]);
    let mut body = vec![b'.'; 4 * 1024 * 1024];
    let mut want_marks = 0;
    // Across a 64 KiB boundary, across a 7-byte boundary, and at the very end.
    for at in [
        65536 - 7,
        7 * 1000 + 3,
        3 * 65536 - 1,
        body.len() - SECRET.len(),
    ] {
        body[at..at + SECRET.len()].copy_from_slice(SECRET.as_bytes());
        want_marks += 1;
    }
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("second-secret-value");
    body[2 * 65536 - 5..2 * 65536 - 5 + b64.len()].copy_from_slice(b64.as_bytes());
    want_marks += 1;
    let want = s.scrub_bytes(&body).into_owned();
    assert_eq!(
        want.windows(REDACTED.len())
            .filter(|w| *w == REDACTED.as_bytes())
            .count(),
        want_marks
    );
    for size in [7, 64 * 1024] {
        let r = scrub_response(&s, response(frames(split(&body, size)), &[])).unwrap();
        let (data, _, err) = collect(r.into_body()).await;
        assert!(err.is_none());
        assert!(data == want, "chunks of {size}");
    }
}

/// A body fed by hand, to see what goes out before the stream ends.
struct Channel(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test]
async fn sse_events_go_out_when_they_arrive() {
    let s = Scrubber::new([SECRET]);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut r = Response::new(Channel(rx));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    let mut body = scrub_response(&s, r).unwrap().into_body();
    // Everything the body yields without waiting for more input.
    let next = |body: &mut ProxyBody| {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut got: Option<Vec<u8>> = None;
        loop {
            match Pin::new(&mut *body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => got
                    .get_or_insert_with(Vec::new)
                    .extend_from_slice(&f.into_data().unwrap()),
                Poll::Pending => return got,
                other => panic!("unexpected {:?}", other.map(|o| o.map(|r| r.is_ok()))),
            }
        }
    };
    tx.send(Bytes::from_static(b"data: {\"n\":1}\n\n")).unwrap();
    assert_eq!(next(&mut body).unwrap(), &b"data: {\"n\":1}\n\n"[..]);
    assert!(
        next(&mut body).is_none(),
        "nothing more until the next event"
    );
    // An event cut short waits whole, whether or not its tail could begin the secret...
    tx.send(Bytes::from(format!("data: {}", &SECRET[..5])))
        .unwrap();
    assert!(next(&mut body).is_none());
    tx.send(Bytes::from(format!("{}\n\n", &SECRET[5..])))
        .unwrap();
    assert_eq!(
        next(&mut body).unwrap(),
        format!("data: {REDACTED}\n\n").as_bytes()
    );
    tx.send(Bytes::from_static(b"data: zzzzz")).unwrap();
    assert!(next(&mut body).is_none());
    // ...and goes out with the newline that ends it.
    tx.send(Bytes::from(format!("x\ndata: {}", &SECRET[..5])))
        .unwrap();
    assert_eq!(next(&mut body).unwrap(), &b"data: zzzzzx\n"[..]);
    tx.send(Bytes::from_static(b"x\n\n")).unwrap();
    assert_eq!(
        next(&mut body).unwrap(),
        format!("data: {}x\n\n", &SECRET[..5]).as_bytes()
    );
}

#[test]
fn streaming_equals_whole_body_scrubbing_on_random_input() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x05714);
    for round in 0..400 {
        // A small alphabet so partial matches and overlaps are frequent.
        let alphabet: &[u8] = if round % 2 == 0 {
            b"abcd"
        } else {
            b"abcdefgh=+/-_%25"
        };
        let secrets: Vec<String> = (0..rng.random_range(1..4))
            .map(|_| {
                (0..rng.random_range(1..9))
                    .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
                    .collect()
            })
            .collect();
        let s = Scrubber::new(secrets.iter().map(String::as_str));
        let mut body: Vec<u8> = (0..rng.random_range(0..400))
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        // Plant whole secrets and their encodings, sometimes.
        for secret in &secrets {
            if rng.random_bool(0.5) {
                let at = rng.random_range(0..=body.len());
                let form = if rng.random_bool(0.5) {
                    secret.clone()
                } else {
                    base64::engine::general_purpose::STANDARD.encode(format!("x{secret}"))
                };
                body.splice(at..at, form.into_bytes());
            }
        }
        let want = s.scrub_bytes(&body).into_owned();
        for _ in 0..8 {
            let chunks = random_chunks(&mut rng, &body, 0, 20);
            assert_eq!(
                streamed(&s, &chunks),
                want,
                "round {round}, secrets {secrets:?}, body {:?}, chunks {chunks:?}",
                String::from_utf8_lossy(&body)
            );
        }
    }
}

/// Secrets that overlap themselves, in long runs of their own bytes, cut at every place and
/// in frames far longer than the held-back tail: the matches that start in the tail and end
/// in the next frame, and the ones right after them, are those of the whole body.
#[test]
fn runs_of_self_overlapping_secrets_stream_as_they_scrub_whole() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5EA3);
    for (secret, unit) in [
        ("aaaa", "a"),
        ("abab", "ab"),
        ("abaab", "aab"),
        ("xyxyx", "xy"),
    ] {
        let s = Scrubber::new([secret]);
        for repeats in [7, 40, 300] {
            let body = format!("q{}r{}", unit.repeat(repeats), unit.repeat(repeats / 3));
            let want = s.scrub_bytes(body.as_bytes()).into_owned();
            let body = body.as_bytes();
            for cut in 0..=body.len() {
                let (a, b) = body.split_at(cut);
                assert_eq!(
                    streamed(&s, &[a, b]),
                    want,
                    "{secret} in {repeats}, cut at {cut}"
                );
            }
            for _ in 0..50 {
                let chunks = random_chunks(&mut rng, body, 1, 3 * s.hold_back() + 2);
                assert_eq!(
                    streamed(&s, &chunks),
                    want,
                    "{secret} in {repeats}, {chunks:?}"
                );
            }
        }
    }
}

/// `body` cut into frames of `min..=max` bytes each (an empty frame, when `min` is 0).
fn random_chunks<'a>(
    rng: &mut rand::rngs::StdRng,
    body: &'a [u8],
    min: usize,
    max: usize,
) -> Vec<&'a [u8]> {
    let mut chunks = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let n = rng.random_range(min..=rest.len().min(max));
        let (a, b) = rest.split_at(n);
        chunks.push(a);
        rest = b;
    }
    chunks
}

#[test]
fn a_secret_in_a_header_name_goes_whatever_its_case() {
    // Header names arrive lowercased, so a mixed-case secret reflected into one is no longer
    // spelled as it was sent; the header is dropped all the same.
    let secret = "ghp_CANARY_5f3a9e1c7b2d";
    let s = Scrubber::new([secret]);
    let mut headers = HeaderMap::new();
    headers.insert(
        http::HeaderName::from_bytes(format!("x-n-{secret}").as_bytes()).unwrap(),
        "1".parse().unwrap(),
    );
    headers.insert("x-ok", "1".parse().unwrap());
    assert_eq!(s.scrub_headers(&mut headers), 1);
    assert_eq!(headers.len(), 1, "{headers:?}");
    assert!(headers.contains_key("x-ok"));
}

/// A scrubber joined from shards built apart streams as it scrubs whole, and redacts every
/// shard's secrets, wherever they are in the body and however the frames fall; with one
/// secret per shard it redacts what one scrubber over them all does when they do not
/// overlap.
#[test]
fn a_joined_scrubber_streams_as_it_scrubs_whole_and_misses_no_shard() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5A4D);
    let secrets = [
        "k3y-one+AAAA",
        "tok/two=BBBB",
        "3rd_secret_CCCC",
        "4th&<DDDD>",
    ];
    let shards: Vec<Scrubber> = secrets.iter().map(|s| Scrubber::new([*s])).collect();
    let joined = Scrubber::join(&shards);
    let whole = Scrubber::new(secrets);
    assert_eq!(joined.shards().len(), 4);
    assert_eq!(joined.pattern_count(), whole.pattern_count());
    for round in 0..200 {
        let mut body: Vec<u8> = (0..rng.random_range(0..300))
            .map(|_| b"abc xyz\n"[rng.random_range(0..8)])
            .collect();
        for secret in secrets {
            if rng.random_bool(0.6) {
                let at = rng.random_range(0..=body.len());
                let form = match rng.random_range(0..3) {
                    0 => secret.to_owned(),
                    1 => base64::engine::general_purpose::STANDARD.encode(format!("x{secret}")),
                    _ => serde_json::to_string(secret).unwrap(),
                };
                body.splice(at..at, form.into_bytes());
            }
        }
        let want = joined.scrub_bytes(&body).into_owned();
        assert_eq!(want, whole.scrub_bytes(&body).into_owned(), "round {round}");
        for secret in secrets {
            assert!(
                !want.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "round {round}: {secret}"
            );
        }
        for _ in 0..6 {
            let chunks = random_chunks(&mut rng, &body, 0, 40);
            assert_eq!(
                streamed(&joined, &chunks),
                want,
                "round {round}, {chunks:?}"
            );
        }
    }
    // A header name carrying any shard's secret goes; values are redacted by every shard.
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::HeaderName::from_bytes(b"x-3rd_secret_cccc").unwrap(),
        http::HeaderValue::from_static("1"),
    );
    headers.insert(
        "x-echo",
        http::HeaderValue::from_static("k3y-one+AAAA tok/two=BBBB"),
    );
    assert_eq!(joined.scrub_headers(&mut headers), 3);
    assert_eq!(headers.len(), 1);
    assert_eq!(headers["x-echo"], format!("{REDACTED} {REDACTED}"));
    assert!(Scrubber::join(&[]).is_empty());
}
