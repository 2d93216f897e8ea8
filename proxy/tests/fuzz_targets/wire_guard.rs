//! The HTTP/1 wire guard `StrictH1`, at random read boundaries.

use super::*;

// ---------------------------------------------------------------------------------------
// HTTP/1 wire guard (wire_guard/)
// ---------------------------------------------------------------------------------------

/// An in-memory connection: reads hand out `input` in pieces of the given sizes (the
/// framing must not depend on read boundaries), writes are collected.
struct Wire {
    input: Vec<u8>,
    pos: usize,
    splits: Vec<usize>,
    reads: usize,
    written: Vec<u8>,
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let split = match this.splits.as_slice() {
            [] => usize::MAX,
            splits => splits[this.reads % splits.len()],
        };
        this.reads += 1;
        let n = split.min(buf.remaining()).min(this.input.len() - this.pos);
        buf.put_slice(&this.input[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What hyper would have received, the violation's reason, and what the client got back.
#[derive(Debug, PartialEq)]
struct Guarded {
    released: Vec<u8>,
    reason: Option<&'static str>,
    refusal_status: Option<String>,
}

/// Plays `input` through the guard as hyper would read it, answering each released piece
/// with one byte (an answer lets the guard inspect the next head). Synchronous: `Wire`
/// never returns `Pending`, so a `Pending` from the guard means it waits for an answer.
fn guard(input: &[u8], splits: &[usize], max_head: usize) -> Guarded {
    let wire = Wire {
        input: input.to_vec(),
        pos: 0,
        splits: splits.iter().map(|&s| s.max(1)).collect(),
        reads: 0,
        written: Vec::new(),
    };
    let mut guard = StrictH1::new(wire, max_head);
    let mut cx = Context::from_waker(Waker::noop());
    let (mut released, mut chunk) = (Vec::new(), [0u8; 997]);
    let mut pending = 0;
    // Every step consumes input, releases bytes or ends; the bound only guards the test.
    for _ in 0..(input.len() + 16) * 4 {
        let mut rb = ReadBuf::new(&mut chunk);
        match Pin::new(&mut guard).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => break,
            Poll::Ready(Ok(())) => {
                released.extend_from_slice(rb.filled());
                pending = 0;
            }
            Poll::Ready(Err(_)) => break,
            Poll::Pending if pending > 1 => break,
            Poll::Pending => pending += 1,
        }
        let _ = Pin::new(&mut guard).poll_write(&mut cx, b"\0");
    }
    let reason = guard.violation().map(|v| v.reason());
    let refused = guard.rejection_id().is_some();
    let written = &guard.get_ref().written;
    let answer = written.iter().position(|&b| b != 0).map(|i| &written[i..]);
    let refusal_status = answer
        .filter(|_| refused)
        .map(|a| String::from_utf8_lossy(&a[..a.len().min(12)]).into_owned());
    Guarded {
        released,
        reason,
        refusal_status,
    }
}

/// Where the first request head ends (after any blank lines before it, RFC 9112 §2.2), or
/// the whole input if it has not ended.
fn first_head(input: &[u8]) -> &[u8] {
    let mut start = 0;
    while input[start..].starts_with(b"\r\n") {
        start += 2;
    }
    match input[start..].windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => &input[..start + i + 4],
        None => input,
    }
}

/// NUL, a LF not after CR, or a CR not before LF.
fn has_bad_line_ending(head: &[u8]) -> bool {
    head.iter().enumerate().any(|(i, &b)| match b {
        0 => true,
        b'\n' => i == 0 || head[i - 1] != b'\r',
        b'\r' => head.get(i + 1) != Some(&b'\n'),
        _ => false,
    })
}

fn check_guard(input: &[u8], splits: &[usize]) {
    let max = DEFAULT_MAX_HEAD;
    let whole = guard(input, &[], max);
    // The guard only ever holds bytes back; what it releases is the input, unchanged.
    assert!(
        input.starts_with(&whole.released),
        "released bytes differ from the input: {input:?}"
    );
    // The outcome does not depend on how the bytes were split into reads.
    let split = guard(input, splits, max);
    assert_eq!(split, whole, "splits {splits:?} of {input:?}");
    // hyper never gets part of a head: the first head is released whole or not at all…
    let head = first_head(input);
    assert!(
        whole.released.is_empty() || whole.released.starts_with(head),
        "released {:?} of the head {head:?}",
        whole.released
    );
    // …and a head with a bare LF, bare CR or NUL is never released.
    if has_bad_line_ending(head) {
        assert!(whole.released.is_empty(), "released a bad head: {input:?}");
    }
    // A refusal is an HTTP answer with a 4xx status, and only a violation earns one.
    if let Some(status) = &whole.refusal_status {
        assert!(status.starts_with("HTTP/1.1 4"), "{status:?}");
        assert!(whole.reason.is_some());
    }
}

const DEFAULT_MAX_HEAD: usize = ostiary::wire_guard::DEFAULT_MAX_HEAD_BYTES;

/// Pieces of HTTP/1 requests, so random sequences reach framing decisions (CL+TE,
/// duplicate lengths, chunk sizes, obs-fold) instead of failing on the request line.
const H1_PIECES: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\n",
    b"POST /p HTTP/1.1\r\n",
    b"POST / HTTP/1.0\r\n",
    b"CONNECT h:443 HTTP/1.1\r\n",
    b"Host: h\r\n",
    b"Content-Length: 3\r\n",
    b"Content-Length: 0\r\n",
    b"Content-Length: 18446744073709551615\r\n",
    b"Content-Length: +1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Transfer-Encoding: chunked, chunked\r\n",
    b"Expect: 100-continue\r\n",
    b"Upgrade: websocket\r\n",
    b"X: a\r\n b\r\n",
    b"X: \xff\r\n",
    b"\r\n",
    b"\n",
    b"\r",
    b"\0",
    b" ",
    b"abc",
    b"0\r\n\r\n",
    b"3\r\nabc\r\n",
    b"1;ext=v\r\nz\r\n",
    b"00000000000000001\r\n",
    b"fffffffffffffffff\r\n",
    b"3 \t;a\r\n",
    b"Trailer: t\r\n",
];

/// A known piece, or (one in sixteen) raw bytes.
#[derive(Debug, TypeGenerator)]
struct H1Piece {
    known: u8,
    raw: Vec<u8>,
}

#[test]
fn wire_guard_arbitrary_bytes() {
    check!()
        .with_type::<(Vec<u8>, Vec<u8>)>()
        .with_iterations(ITERATIONS)
        .for_each(|(input, splits)| {
            let splits: Vec<usize> = splits.iter().map(|&s| usize::from(s)).collect();
            check_guard(input, &splits);
        });
}

#[test]
fn wire_guard_request_pieces() {
    check!()
        .with_type::<(u8, Vec<H1Piece>, Vec<u8>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(first, pieces, splits)| {
            // Most inputs start with a request line, so that their heads can be valid.
            let mut input = H1_PIECES[usize::from(*first % 4)].to_vec();
            for piece in pieces {
                match piece.known {
                    k if k >= 240 => input.extend_from_slice(&piece.raw),
                    k => input.extend_from_slice(H1_PIECES[usize::from(k) % H1_PIECES.len()]),
                }
            }
            let splits: Vec<usize> = splits.iter().map(|&s| usize::from(s % 8)).collect();
            check_guard(&input, &splits);
        });
}
