//! Scrubbing a body that arrives in pieces, with the same result as scrubbing it whole,
//! and with a hold-back that tells nothing about the secrets.
//!
//! A secret may be split across frames, so bytes at the end of a frame wait for the next
//! one. *How many* must not depend on whether they could be the start of a secret: if it
//! did, an agent sending probes to an echoing upstream would see which answer is held back
//! and learn a secret byte by byte. So the held tail is fixed:
//!
//! - the last [`Scrubber::hold_back`] bytes — one less than a bound on the length of any
//!   spelling of any secret, computed from the secrets' lengths alone;
//! - but nothing after a newline that ends a line no wrapped encoding may go on from (its
//!   last byte is not one of base64's or hex's, or the line is short: see
//!   [`super::wrapped`]): no pattern holds a newline (a multi-line secret is looked for line
//!   by line), and a match holds one only where a wrapped encoding broke its line, so every
//!   match ends before such a newline or starts after it. A text stream (SSE events, JSON
//!   lines) goes out event by event, whatever it says; lines of base64 wait like any bytes.
//!
//! Both depend only on the lengths and the bytes around newlines of what arrived, never on
//! what the secrets are. A scrubber of several shards runs one such stage per shard, each
//! fed what the one before let out. The bytes before the held tail are final: every match of the
//! whole body that is not entirely inside them starts within the tail. When a match starts
//! before the tail and ends inside it, everything up to its end goes out (redacted).
//!
//! A body trickling in tiny frames would rescan the held window with each one; once the
//! window is large ([`AMORTIZE_FROM`]), frames without a newline are only appended until a
//! quarter of the window's length has arrived since the last scan — again a rule on
//! lengths alone.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};

use std::sync::Arc;

use super::{Scrubber, Shard};

/// Up to this size, the rest of a frame is copied after the released carry rather than
/// going out as a frame of its own.
const COALESCE: usize = 16 * 1024;

/// Held bytes from which rescans are spaced out (see the module docs).
pub const AMORTIZE_FROM: usize = 256;

/// The state of one body being scrubbed: one [`Stage`] per shard of the scrubber.
pub struct StreamScrubber {
    stages: Vec<Stage>,
    /// What one stage let out, on its way into the next.
    between: VecDeque<Bytes>,
}

/// One shard's state: the held-back bytes between two frames.
struct Stage {
    shard: Arc<Shard>,
    /// Held-back tail: starts where no match of the body can start earlier.
    carry: Vec<u8>,
    /// `carry.len()` right after the last scan.
    scanned: usize,
    /// The held-back tail joined with the start of the next frame (the seam searched for
    /// matches that start in the tail).
    scratch: Vec<u8>,
    /// How long the body's last line is so far, over every frame fed.
    line: usize,
}

impl std::fmt::Debug for StreamScrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The carry may be part of a secret: its length only.
        f.debug_struct("StreamScrubber")
            .field("stages", &self.stages.len())
            .field("held", &self.held())
            .finish()
    }
}

impl StreamScrubber {
    pub fn new(scrubber: Scrubber) -> Self {
        Self {
            stages: scrubber
                .shards()
                .iter()
                .map(|shard| Stage {
                    shard: shard.clone(),
                    carry: Vec::new(),
                    scanned: 0,
                    scratch: Vec::new(),
                    line: 0,
                })
                .collect(),
            between: VecDeque::new(),
        }
    }

    /// How many bytes are held back, waiting for the next frame.
    pub fn held(&self) -> usize {
        self.stages.iter().map(|s| s.carry.len()).sum()
    }

    /// Scrub the next frame; what may go out now is appended to `out` (an unchanged frame
    /// goes out as a slice of itself, without copying).
    pub fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        match self.stages.as_mut_slice() {
            [] => push(out, chunk),
            [only] => only.feed(chunk, out),
            stages => {
                let mut pieces = std::mem::take(&mut self.between);
                pieces.push_back(chunk);
                for stage in stages {
                    let mut next = VecDeque::with_capacity(pieces.len() + 1);
                    for piece in pieces.drain(..) {
                        stage.feed(piece, &mut next);
                    }
                    pieces = next;
                }
                out.extend(pieces.drain(..));
                self.between = pieces;
            }
        }
    }

    /// The body ended: the held-back bytes are final, scrub and release them, each stage's
    /// through the stages after it.
    pub fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        let mut pieces = VecDeque::new();
        for stage in &mut self.stages {
            let mut next = VecDeque::with_capacity(pieces.len() + 1);
            for piece in pieces.drain(..) {
                stage.feed(piece, &mut next);
            }
            stage.finish(&mut next);
            pieces = next;
        }
        out.extend(pieces);
    }

    /// Forget the held-back bytes (the body failed: they must not go out unscrubbed).
    pub fn discard(&mut self) {
        for stage in &mut self.stages {
            stage.carry.clear();
            stage.scanned = 0;
        }
    }
}

impl Stage {
    /// Scrub the next frame; what may go out now is appended to `out` (zero, one or two
    /// pieces; an unchanged frame goes out as a slice of itself, without copying).
    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        let shard = &*self.shard;
        let matcher = shard.matcher();
        if chunk.is_empty() {
            return;
        }
        let c = self.carry.len();
        let newline = release_at(&chunk, self.line);
        self.line = match memchr::memrchr(b'\n', &chunk) {
            Some(i) => chunk.len() - i - 1,
            None => self.line.saturating_add(chunk.len()),
        };
        if self.scanned >= AMORTIZE_FROM
            && newline.is_none()
            && c + chunk.len() - self.scanned < self.scanned / 4
        {
            self.carry.extend_from_slice(&chunk);
            return;
        }
        let hold_back = shard.hold_back();
        let found = matches(matcher, &self.carry, &chunk, hold_back, &mut self.scratch);
        let hay = Joined {
            carry: &self.carry,
            chunk: &chunk,
        };
        let len = hay.len();
        // The held tail: a fixed window, cut at the last newline.
        let window = len.saturating_sub(hold_back);
        let mut h = match newline {
            Some(i) => window.max(c + i + 1),
            None => window,
        };
        let mut body: Option<BytesMut> = None;
        let mut pos = 0;
        for (start, end) in found {
            if start >= h {
                break;
            }
            let buf = body.get_or_insert_with(|| BytesMut::with_capacity(len));
            hay.extend(buf, pos..start);
            buf.extend_from_slice(shard.marker());
            pos = end;
            h = h.max(end);
        }
        match body {
            Some(mut buf) => {
                hay.extend(&mut buf, pos..h);
                push(out, buf.freeze());
            }
            None if h <= c => push(out, Bytes::copy_from_slice(&self.carry[..h])),
            None if c == 0 => push(out, chunk.slice(..h)),
            None => {
                let rest = chunk.slice(..h - c);
                if rest.len() <= COALESCE {
                    // One frame in, one frame out: an SSE event is not split needlessly.
                    let mut buf = BytesMut::with_capacity(h);
                    hay.extend(&mut buf, 0..h);
                    push(out, buf.freeze());
                } else {
                    push(out, Bytes::copy_from_slice(&self.carry));
                    push(out, rest);
                }
            }
        }
        let mut tail = Vec::with_capacity(len - h);
        hay.extend(&mut tail, h..len);
        self.carry = tail;
        self.scanned = self.carry.len();
    }

    /// The body ended: the held-back bytes are final, scrub and release them.
    fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if self.carry.is_empty() {
            return;
        }
        let rest = std::mem::take(&mut self.carry);
        self.scanned = 0;
        let scrubbed = self.shard.replace(&rest).0.into_owned();
        push(out, Bytes::from(scrubbed));
    }
}

/// The last newline of `chunk` after which no match can go on: one no wrapped encoding may
/// continue after ([`super::wrapped::may_continue`]). Decided from the bytes of the body
/// around it, never from the secrets.
fn release_at(chunk: &[u8], line_before: usize) -> Option<usize> {
    memchr::memrchr_iter(b'\n', chunk)
        .find(|&i| !super::wrapped::may_continue(chunk, i, line_before))
}

/// The matches in the held-back tail joined with `chunk`, in the coordinates of the two
/// joined, without copying the chunk after the tail: a match starting in the tail ends
/// within `hold_back` bytes of the chunk's start (no spelling is longer), so
/// those are found in the tail joined with that much of the chunk; the rest are found
/// in the chunk itself, from where the joined search would have gone on. No pattern
/// looks behind its start, so a search from there finds what the joined one would.
fn matches(
    matcher: &super::matcher::Matcher,
    carry: &[u8],
    chunk: &[u8],
    hold_back: usize,
    scratch: &mut Vec<u8>,
) -> Vec<(usize, usize)> {
    let c = carry.len();
    let mut found = Vec::new();
    let mut from = 0;
    if c > 0 {
        let seam = chunk.len().min(hold_back);
        scratch.clear();
        scratch.extend_from_slice(carry);
        scratch.extend_from_slice(&chunk[..seam]);
        for (start, end) in matcher.find_iter(scratch) {
            if start >= c {
                break;
            }
            found.push((start, end));
            from = end.saturating_sub(c);
        }
    }
    found.extend(
        matcher
            .find_iter(&chunk[from..])
            .map(|(start, end)| (c + from + start, c + from + end)),
    );
    found
}

/// The held-back tail and the next frame, read as one buffer without being copied into one.
struct Joined<'a> {
    carry: &'a [u8],
    chunk: &'a [u8],
}

impl Joined<'_> {
    fn len(&self) -> usize {
        self.carry.len() + self.chunk.len()
    }

    /// Append the bytes at `range` of the two joined.
    fn extend(&self, buf: &mut impl BufMut, range: std::ops::Range<usize>) {
        let c = self.carry.len();
        let (start, end) = (range.start, range.end);
        if start < c {
            buf.put_slice(&self.carry[start..end.min(c)]);
        }
        if end > c {
            buf.put_slice(&self.chunk[start.max(c) - c..end - c]);
        }
    }
}

fn push(out: &mut VecDeque<Bytes>, bytes: Bytes) {
    if !bytes.is_empty() {
        out.push_back(bytes);
    }
}
