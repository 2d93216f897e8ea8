//! Scrubbing a body that arrives in pieces, with the same result as scrubbing it whole.
//!
//! A secret may be split across frames, so the tail of each frame that could still grow
//! into a match is held back — only the longest suffix that is a proper prefix of some
//! pattern, not a fixed `max_len - 1` bytes, so a stream (SSE above all) is delayed only
//! when its last bytes really could be the start of a secret.
//!
//! Why the output equals [`Scrubber::scrub_bytes`] of the whole body (leftmost-longest):
//! with `h` the start of the held suffix, every match the whole body has that is not
//! entirely inside the bytes seen so far starts at or after `h`. So a match found in the
//! buffer that starts before `h` is the one the whole body has there (nothing can start
//! earlier, nothing starting at the same place can be longer), and bytes before `h` with no
//! match starting in them are final.

use std::collections::VecDeque;

use aho_corasick::Input;
use bytes::{Bytes, BytesMut};

use super::Scrubber;

/// Up to this size, the rest of a frame is copied after the released carry rather than
/// going out as a frame of its own.
const COALESCE: usize = 16 * 1024;

/// The state of one body being scrubbed: the held-back bytes between two frames.
pub struct StreamScrubber {
    scrubber: Scrubber,
    /// Held-back tail: always a proper prefix of some pattern, so shorter than the longest.
    carry: Vec<u8>,
    /// The held-back tail joined with the head of the next frame.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for StreamScrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The carry is part of a secret: its length only.
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
        let Some(ac) = inner.ac.as_ref() else {
            push(out, chunk);
            return;
        };
        let c = self.carry.len();
        let l = c + chunk.len();
        let max = inner.max_len;
        // The start (in carry+chunk coordinates) of the bytes to hold back, looking only at
        // positions from `from` on.
        let hold = |carry: &[u8], from: usize| -> usize {
            let w = from.max(l.saturating_sub(max - 1));
            let window = carry[w.min(c)..]
                .iter()
                .chain(&chunk[w.saturating_sub(c)..]);
            l - inner.trie.held_suffix(window)
        };
        let mut h = hold(&self.carry, 0);
        let mut pos = 0;
        let mut head = BytesMut::new();
        if c > 0 {
            // Every match starting in the carry ends within `max` bytes of the chunk.
            self.scratch.clear();
            self.scratch.extend_from_slice(&self.carry);
            self.scratch
                .extend_from_slice(&chunk[..chunk.len().min(max)]);
            loop {
                let limit = h.min(c);
                if pos >= limit {
                    break;
                }
                let found = ac.find(Input::new(&self.scratch).span(pos..self.scratch.len()));
                match found {
                    Some(m) if m.start() < limit => {
                        head.extend_from_slice(&self.scratch[pos..m.start()]);
                        head.extend_from_slice(&inner.marker);
                        pos = m.end();
                        if pos > h {
                            h = hold(&self.carry, pos);
                        }
                    }
                    _ => {
                        head.extend_from_slice(&self.scratch[pos..limit]);
                        pos = limit;
                        break;
                    }
                }
            }
            if h < c {
                // The whole chunk is still a possible secret prefix (a short frame).
                push(out, head.freeze());
                let mut carry = self.carry.split_off(h);
                carry.extend_from_slice(&chunk);
                self.carry = carry;
                return;
            }
        }
        // From here on `pos` and `h` are past the carry: work on the chunk itself.
        let (mut pos, mut h) = (pos - c, h - c);
        let mut body: Option<BytesMut> = None;
        for m in ac.find_iter(Input::new(&chunk[..]).span(pos..chunk.len())) {
            if m.start() >= h {
                break;
            }
            let buf = body.get_or_insert_with(|| BytesMut::with_capacity(chunk.len()));
            buf.extend_from_slice(&chunk[pos..m.start()]);
            buf.extend_from_slice(&inner.marker);
            pos = m.end();
            if pos > h {
                h = hold(&self.carry, pos + c) - c;
            }
        }
        let rest = match body {
            None => chunk.slice(pos..h),
            Some(mut buf) => {
                buf.extend_from_slice(&chunk[pos..h]);
                buf.freeze()
            }
        };
        if !head.is_empty() && rest.len() <= COALESCE {
            // One frame in, one frame out: an SSE event is not split needlessly.
            head.extend_from_slice(&rest);
            push(out, head.freeze());
        } else {
            push(out, head.freeze());
            push(out, rest);
        }
        self.carry.clear();
        self.carry.extend_from_slice(&chunk[h..]);
    }

    /// The body ended: the held-back bytes are final, scrub and release them.
    pub fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if self.carry.is_empty() {
            return;
        }
        let rest = std::mem::take(&mut self.carry);
        let scrubbed = self.scrubber.scrub_bytes(&rest).into_owned();
        push(out, Bytes::from(scrubbed));
    }

    /// Forget the held-back bytes (the body failed: they must not go out unscrubbed).
    pub fn discard(&mut self) {
        self.carry.clear();
    }
}

fn push(out: &mut VecDeque<Bytes>, bytes: Bytes) {
    if !bytes.is_empty() {
        out.push_back(bytes);
    }
}
