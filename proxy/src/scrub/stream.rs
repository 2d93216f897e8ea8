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
//! - but nothing after a newline: no pattern holds one (a multi-line secret is looked for
//!   line by line), so every match ends before the last newline or starts after it. A
//!   text stream (SSE events, JSON lines) goes out event by event, whatever it says.
//!
//! Both depend only on the lengths and the positions of newlines of what arrived, never on
//! what the secrets are. The bytes before the held tail are final: every match of the
//! whole body that is not entirely inside them starts within the tail. When a match starts
//! before the tail and ends inside it, everything up to its end goes out (redacted).
//!
//! A body trickling in tiny frames would rescan the held window with each one; once the
//! window is large ([`AMORTIZE_FROM`]), frames without a newline are only appended until a
//! quarter of the window's length has arrived since the last scan — again a rule on
//! lengths alone.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::Scrubber;

/// Up to this size, the rest of a frame is copied after the released carry rather than
/// going out as a frame of its own.
const COALESCE: usize = 16 * 1024;

/// Held bytes from which rescans are spaced out (see the module docs).
pub const AMORTIZE_FROM: usize = 256;

/// The state of one body being scrubbed: the held-back bytes between two frames.
pub struct StreamScrubber {
    scrubber: Scrubber,
    /// Held-back tail: starts where no match of the body can start earlier.
    carry: Vec<u8>,
    /// `carry.len()` right after the last scan.
    scanned: usize,
    /// The held-back tail joined with the next frame.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for StreamScrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The carry may be part of a secret: its length only.
        f.debug_struct("StreamScrubber")
            .field("scrubber", &self.scrubber)
            .field("held", &self.carry.len())
            .finish()
    }
}

impl StreamScrubber {
    pub fn new(scrubber: Scrubber) -> Self {
        Self {
            scrubber,
            carry: Vec::new(),
            scanned: 0,
            scratch: Vec::new(),
        }
    }

    /// How many bytes are held back, waiting for the next frame.
    pub fn held(&self) -> usize {
        self.carry.len()
    }

    /// Scrub the next frame; what may go out now is appended to `out` (zero, one or two
    /// pieces; an unchanged frame goes out as a slice of itself, without copying).
    pub fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        let inner = &*self.scrubber.inner;
        let Some(matcher) = inner.matcher.as_ref() else {
            push(out, chunk);
            return;
        };
        if chunk.is_empty() {
            return;
        }
        let c = self.carry.len();
        let newline = memchr::memrchr(b'\n', &chunk);
        if self.scanned >= AMORTIZE_FROM
            && newline.is_none()
            && c + chunk.len() - self.scanned < self.scanned / 4
        {
            self.carry.extend_from_slice(&chunk);
            return;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let hay: &[u8] = if c == 0 {
            &chunk
        } else {
            scratch.clear();
            scratch.extend_from_slice(&self.carry);
            scratch.extend_from_slice(&chunk);
            &scratch
        };
        let len = hay.len();
        // The held tail: a fixed window, cut at the last newline.
        let window = len.saturating_sub(self.scrubber.hold_back());
        let mut h = match newline {
            Some(i) => window.max(c + i + 1),
            None => window,
        };
        let mut body: Option<BytesMut> = None;
        let mut pos = 0;
        for (start, end) in matcher.find_iter(hay) {
            if start >= h {
                break;
            }
            let buf = body.get_or_insert_with(|| BytesMut::with_capacity(len));
            buf.extend_from_slice(&hay[pos..start]);
            buf.extend_from_slice(&inner.marker);
            pos = end;
            h = h.max(end);
        }
        match body {
            Some(mut buf) => {
                buf.extend_from_slice(&hay[pos..h]);
                push(out, buf.freeze());
            }
            None if h <= c => push(out, Bytes::copy_from_slice(&self.carry[..h])),
            None if c == 0 => push(out, chunk.slice(..h)),
            None => {
                let rest = chunk.slice(..h - c);
                if rest.len() <= COALESCE {
                    // One frame in, one frame out: an SSE event is not split needlessly.
                    push(out, Bytes::copy_from_slice(&hay[..h]));
                } else {
                    push(out, Bytes::copy_from_slice(&self.carry));
                    push(out, rest);
                }
            }
        }
        let tail = hay[h..].to_vec();
        self.carry = tail;
        self.scanned = self.carry.len();
        self.scratch = scratch;
    }

    /// The body ended: the held-back bytes are final, scrub and release them.
    pub fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if self.carry.is_empty() {
            return;
        }
        let rest = std::mem::take(&mut self.carry);
        self.scanned = 0;
        let scrubbed = self.scrubber.scrub_bytes(&rest).into_owned();
        push(out, Bytes::from(scrubbed));
    }

    /// Forget the held-back bytes (the body failed: they must not go out unscrubbed).
    pub fn discard(&mut self) {
        self.carry.clear();
        self.scanned = 0;
    }
}

fn push(out: &mut VecDeque<Bytes>, bytes: Bytes) {
    if !bytes.is_empty() {
        out.push_back(bytes);
    }
}
