//! Finding where a request head (or trailer section) ends, and deciding whether it is valid.
//!
//! The scanner refuses the line-ending tricks httparse tolerates (bare LF, bare CR, NUL,
//! obs-fold) before httparse sees the bytes; validation then refuses the framing shapes a
//! smuggling attempt needs (CL+TE, duplicate lengths, TE on HTTP/1.0 …) and decides how the
//! body that follows is framed, which is all the IO wrapper needs to find the next head.

use super::chunked::CHUNK_START;
use super::{Body, State, Violation};

/// hyper's default header count, so a head we pass is never refused by hyper for its count.
pub(super) const MAX_HEADERS: usize = 100;
/// hyper reserves the top two u64 values, so larger lengths would fail there without our body.
const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;

/// Line scanner for a head or a trailer section, resumable as more bytes arrive.
#[derive(Debug)]
pub(super) struct Scan {
    pos: usize,
    line_start: usize,
    /// A request line is still due; blank lines before it are tolerated (RFC 9112 §2.2).
    start_line_due: bool,
}

impl Scan {
    pub(super) fn new(start_line_due: bool) -> Self {
        Self {
            pos: 0,
            line_start: 0,
            start_line_due,
        }
    }

    /// Returns the section's length once its closing empty line has arrived.
    pub(super) fn scan(&mut self, buf: &[u8], max: usize) -> Result<Option<usize>, Violation> {
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

/// Returns the state that follows a valid head.
pub(super) fn validate_head(head: &[u8]) -> Result<State, Violation> {
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
    // Matched more loosely than hyper does (any `Expect` field, not only the last): a
    // client we wrongly think waits for `100` only loses the first-line lookahead, while
    // one we wrongly hold would wait for a `100` that hyper never gets to send.
    let expects_continue =
        named("expect").any(|v| v.trim_ascii().eq_ignore_ascii_case(b"100-continue"));
    Ok(match body {
        Body::Length(0) => State::Head(Scan::new(true)),
        Body::Chunked(chunk) if !expects_continue => State::FirstChunkLine {
            end: head.len(),
            chunk,
        },
        body => State::Body(body),
    })
}

pub(super) fn validate_trailers(section: &[u8]) -> Result<(), Violation> {
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

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire_guard::testing::{
        assert_rejected, assert_rejected_after, passed, run, run_max, GET,
    };

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

    #[test]
    fn only_chunked_heads_without_expect_continue_wait_for_their_first_chunk_line() {
        let waits = |head: &[u8]| {
            let state = validate_head(head).unwrap();
            matches!(state, State::FirstChunkLine { end, .. } if end == head.len())
        };
        let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n";
        assert!(waits(format!("{chunked}\r\n").as_bytes()));
        assert!(waits(format!("{chunked}Expect: 100\r\n\r\n").as_bytes()));
        for expect in ["100-continue", "100-Continue", "  100-CONTINUE "] {
            assert!(!waits(
                format!("{chunked}Expect: {expect}\r\n\r\n").as_bytes()
            ));
        }
        assert!(!waits(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n"));
        assert!(!waits(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nUpgrade: h2c\r\n\r\n"
        ));
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
}
