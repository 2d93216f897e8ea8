//! The chunked request body state machine (RFC 9112 §7.1), one byte of framing at a time.
//!
//! hyper's own decoder is more lenient (zero-padded sizes of any length, bare LF, loose
//! extensions), and a body that hyper and the upstream split into chunks differently is a
//! smuggling vector; so the guard tracks the framing itself, passing chunk data through in
//! bulk and inspecting only size lines, data terminators and (through the head scanner)
//! trailers. Every state is bounded: a size line is at most 16 digits and
//! [`MAX_CHUNK_EXT_BYTES`] of whitespace and extension, so it can be held back whole.

use super::{clamp, Violation};

/// Sixteen hex digits fill a u64; more can only be padding or an overflow attempt.
const MAX_CHUNK_SIZE_DIGITS: u8 = 16;
/// Budget for what may follow the size on its line: whitespace and extensions together.
const MAX_CHUNK_EXT_BYTES: usize = 4 * 1024;

#[derive(Debug, Clone, Copy)]
pub(super) enum Chunk {
    Size {
        digits: u8,
        value: u64,
    },
    /// Whitespace after the size; it counts towards the extension budget, or a line of
    /// endless blanks would be unbounded.
    SizeWs {
        value: u64,
        len: usize,
    },
    Ext {
        value: u64,
        len: usize,
    },
    SizeLf {
        value: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
}

pub(super) const CHUNK_START: Chunk = Chunk::Size {
    digits: 0,
    value: 0,
};

/// How much of one chunk-size line has arrived.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SizeLine {
    /// Every byte given belongs to the line, which has not ended yet.
    Partial,
    /// The line ended after `len` bytes; `size` bytes of data follow (0: the last chunk).
    Done { len: usize, size: u64 },
}

impl Chunk {
    /// Consumes chunk framing and data; `true` once the last chunk's line has ended.
    /// A bad byte after good ones is reported on the next call, so the good bytes are
    /// released first whatever the read boundaries were.
    pub(super) fn step(&mut self, input: &[u8]) -> Result<(usize, bool), Violation> {
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

    /// Checks one size line without letting any of it go, resuming where the last call
    /// stopped (start from [`CHUNK_START`]). Unlike [`Chunk::step`], a bad byte is reported
    /// at once: nothing of the line has been released, so there is nothing to flush first.
    pub(super) fn size_line(&mut self, input: &[u8]) -> Result<SizeLine, Violation> {
        for (i, &b) in input.iter().enumerate() {
            let done = |size| Ok(SizeLine::Done { len: i + 1, size });
            match self.next(b)? {
                None => return done(0),
                Some(Chunk::Data(size)) => return done(size),
                Some(next) => *self = next,
            }
        }
        Ok(SizeLine::Partial)
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
                (None, b' ' | b'\t') => SizeWs { value, len: 1 },
                (None, b';') => Ext { value, len: 0 },
                (None, b'\r') => SizeLf { value },
                (None, _) => return Err(Violation::BadChunkSize),
            },
            SizeWs { value, len } => match b {
                b' ' | b'\t' if len >= MAX_CHUNK_EXT_BYTES => {
                    return Err(Violation::BadChunkExtension)
                }
                b' ' | b'\t' => SizeWs {
                    value,
                    len: len + 1,
                },
                b';' => Ext { value, len },
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

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire_guard::testing::{
        assert_rejected, passed, read_is_pending, run, through_hyper, CHUNKED,
    };
    use crate::wire_guard::{StrictH1, DEFAULT_MAX_HEAD_BYTES};
    use std::io;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// 16 digits, one `;`, the whitespace-and-extension budget, CRLF.
    const MAX_SIZE_LINE_BYTES: usize = MAX_CHUNK_SIZE_DIGITS as usize + 1 + MAX_CHUNK_EXT_BYTES + 2;

    #[tokio::test]
    async fn good_chunked_with_extensions_and_trailers_passes() {
        let body: &[u8] = b"5;name=\"v\"\r\nhello\r\n0000000000000006 \r\n world\r\n\
                            A\r\n0123456789\r\n0\r\nX-Checksum: abc\r\nX-Other: d\r\n\r\n";
        let input = [CHUNKED, body].concat();
        assert_eq!(run(&input).await, passed(&input));
        let empty = [CHUNKED, b"0\r\n\r\n"].concat();
        assert_eq!(run(&empty).await, passed(&empty));
        let blank_first = [CHUNKED, b"3 \t ; a=b\r\nabc\r\n0 \r\n\r\n"].concat();
        assert_eq!(run(&blank_first).await, passed(&blank_first));
    }

    #[test]
    fn a_size_line_is_bounded_whatever_follows_the_digits() {
        let feed = |line: &[u8]| {
            let mut chunk = CHUNK_START;
            // Byte by byte, as the slowest client would send it.
            let mut outcome = Ok(SizeLine::Partial);
            for (i, b) in line.iter().enumerate() {
                outcome = chunk.size_line(std::slice::from_ref(b)).map(|l| match l {
                    SizeLine::Done { len, size } => SizeLine::Done { len: i + len, size },
                    partial => partial,
                });
                if outcome != Ok(SizeLine::Partial) {
                    break;
                }
            }
            outcome
        };
        let ext = MAX_CHUNK_EXT_BYTES;
        for blanks in [0, 1, ext / 2, ext] {
            let line = format!(
                "{}{};{}\r\n",
                "F".repeat(16),
                " ".repeat(blanks),
                "x".repeat(ext - blanks)
            );
            assert_eq!(line.len(), MAX_SIZE_LINE_BYTES);
            let size = u64::MAX;
            assert_eq!(
                feed(line.as_bytes()),
                Ok(SizeLine::Done {
                    len: line.len(),
                    size
                })
            );
        }
        let endless: [(&str, Violation); 4] = [
            (
                &"0".repeat(MAX_SIZE_LINE_BYTES),
                Violation::ChunkSizeOverflow,
            ),
            (
                &format!("1{}", " ".repeat(MAX_SIZE_LINE_BYTES)),
                Violation::BadChunkExtension,
            ),
            (
                &format!("1;{}", "x".repeat(MAX_SIZE_LINE_BYTES)),
                Violation::BadChunkExtension,
            ),
            (
                &format!("1 {} ;{}", " ".repeat(ext / 2), "x".repeat(ext)),
                Violation::BadChunkExtension,
            ),
        ];
        for (line, violation) in endless {
            assert_eq!(feed(line.as_bytes()), Err(violation), "{}", &line[..20]);
        }
    }

    #[tokio::test]
    async fn a_bad_first_chunk_line_is_a_head_violation() {
        #[rustfmt::skip]
        let cases: &[(&[u8], &str)] = &[
            (b"zz\r\nhi\r\n0\r\n\r\n", "bad_chunk_size"),
            (b"\r\n", "bad_chunk_size"),
            (b"00000000000000001\r\na\r\n", "chunk_size_overflow"),
            (b"FFFFFFFFFFFFFFFFF1\r\nhello\r\n0\r\n\r\n", "chunk_size_overflow"),
            (b"5\nhello\r\n", "bad_chunk_size"),
            (b"5 x\r\nhello\r\n", "bad_chunk_size"),
            (b"5;a\x01\r\nhello\r\n", "bad_chunk_extension"),
            (b"0\r\r\n\r\n", "bad_chunk_size"),
        ];
        for (body, reason) in cases {
            assert_rejected(&[CHUNKED, body].concat(), reason).await;
        }
    }

    #[tokio::test]
    async fn a_later_bad_chunk_aborts_the_released_body() {
        // (body, the part of it released before the failure, reason)
        #[rustfmt::skip]
        let cases: &[(&[u8], &[u8], &str)] = &[
            (b"5\r\nhello\r\nzz\r\n", b"5\r\nhello\r\n", "bad_chunk_size"),
            (b"1\r\na\r\n00000000000000001\r\n", b"1\r\na\r\n0000000000000000",
                "chunk_size_overflow"),
            (b"5\r\nhelloX0\r\n\r\n", b"5\r\nhello", "bad_chunk_terminator"),
            (b"1\r\na\r\n5;a\x01\r\n", b"1\r\na\r\n5;a", "bad_chunk_extension"),
            (b"1\r\na\r\n0\r\nX: y\n\r\n", b"1\r\na\r\n0\r\n", "bare_lf"),
            (b"0\r\nX: y\r\n z\r\n\r\n", b"0\r\n", "obs_fold"),
            (b"0\r\nX[: y\r\n\r\n", b"0\r\n", "invalid_header_name"),
            (b"0\r\nX: \xff\r\n\r\n", b"0\r\n", "invalid_header_value"),
        ];
        for &(body, good, reason) in cases {
            let (released, wire, error, got) = run(&[CHUNKED, body].concat()).await;
            assert_eq!(released, [CHUNKED, good].concat(), "{reason}");
            let expected = (
                String::new(),
                Some(io::ErrorKind::InvalidData),
                Some(reason),
            );
            assert_eq!((wire, error, got), expected);
        }
    }

    #[tokio::test]
    async fn the_head_waits_for_its_first_chunk_line_and_goes_with_it() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut guard = StrictH1::new(server, DEFAULT_MAX_HEAD_BYTES);
        for part in [CHUNKED, b"1", b"0;name=va", b"lue\r"] {
            client.write_all(part).await.unwrap();
            assert!(
                read_is_pending(&mut guard).await,
                "released before {part:?}"
            );
        }
        client.write_all(b"\n0123456789abcdef").await.unwrap();
        let mut got = vec![0u8; 1024];
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], [CHUNKED, b"10;name=value\r\n"].concat());
        // The rest of the body streams as before.
        let n = guard.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"0123456789abcdef");
    }

    #[tokio::test]
    async fn expect_continue_releases_the_head_without_its_first_chunk_line() {
        let head = b"POST /c HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\
                     Transfer-Encoding: chunked\r\n\r\n";
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut guard = StrictH1::new(server, DEFAULT_MAX_HEAD_BYTES);
        client.write_all(head).await.unwrap();
        let mut got = vec![0u8; 1024];
        // The client waits for `100 Continue`, which hyper sends only once it has the head.
        let read = tokio::time::timeout(Duration::from_secs(5), guard.read(&mut got));
        let n = read
            .await
            .expect("the head must not wait for the body")
            .unwrap();
        assert_eq!(&got[..n], head);
        guard
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .unwrap();
        // The body was not checked with the head, so a bad first line now aborts it.
        client.write_all(b"FFFFFFFFFFFFFFFFF1\r\n").await.unwrap();
        let mut released = Vec::new();
        let err = loop {
            match guard.read(&mut got).await {
                Ok(n) => released.extend_from_slice(&got[..n]),
                Err(e) => break e,
            }
        };
        assert_eq!(released, b"FFFFFFFFFFFFFFFF");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(guard.violation(), Some(&Violation::ChunkSizeOverflow));
        assert_eq!(guard.rejection_id(), None);
    }

    #[tokio::test]
    async fn hyper_never_sees_a_head_whose_first_chunk_line_is_bad() {
        let bad = [CHUNKED, b"FFFFFFFFFFFFFFFFF1\r\nhello\r\n0\r\n\r\n"].concat();
        let (wire, seen) = through_hyper(&bad).await;
        assert!(seen.is_empty(), "{seen:?}");
        assert!(wire.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{wire}");
        assert!(
            wire.ends_with(r#""reason":"chunk_size_overflow"}"#),
            "{wire}"
        );
    }

    #[tokio::test]
    async fn hyper_sees_a_later_bad_chunk_as_a_body_error() {
        let (_, seen) = through_hyper(&[CHUNKED, b"5\r\nhello\r\nG\r\n"].concat()).await;
        assert_eq!(seen.len(), 1);
        assert!(
            seen[0].starts_with("/c Err(") && seen[0].contains("BadChunkSize"),
            "{seen:?}"
        );
    }
}
