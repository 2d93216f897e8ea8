//! Scanning a body that arrives in pieces, with the same finding as scanning it whole, and
//! without ever releasing a byte of that finding.
//!
//! Each chunk is scanned together with the bytes held back from the previous ones; what
//! precedes the earliest *pending* candidate (one whose validator needs bytes not yet
//! arrived) or the fixed tail is released, the rest held. A finding is reported only when
//! no pending candidate starts at or before it, which is exactly the leftmost finding of
//! the whole body.
//!
//! The fixed tail is the last `longest pattern − 1` bytes, cut at the last newline when no
//! pattern holds one — held whether or not those bytes could begin an anchor or a literal
//! value. Holding back only a tail that could begin one of the session's own credentials
//! would be an oracle: an upstream (or an agent watching an echoing upstream) would see
//! which chunk is delayed and learn the credential byte by byte. What a validator of the
//! default set keeps pending depends on its public pattern only (`AKIA`, `eyJ` …), never on
//! a credential.
//!
//! The hold-back is bounded: validators read at most [`patterns::MAX_WINDOW`] bytes from a
//! candidate's start (8 KiB of a JWT's header and payload is the largest — a longer one is
//! not recognised, as in a whole-buffer scan), card numbers 32, and the fixed tail is
//! shorter than the longest anchor or literal value. Hence [`MAX_HELD`] (plus the length
//! of the longest literal value, when that is larger).
//!
//! Cost: a chunk arriving while nothing is held is scanned in place and released as a
//! slice of itself. When a long candidate is pending and chunks are tiny (a body trickled
//! a few bytes per frame), rescanning the held bytes on every chunk would be quadratic;
//! instead the held bytes are rescanned only once a quarter of their length has arrived.

use std::sync::Arc;

use bytes::Bytes;

use super::cards;
use super::patterns::{self, View};
use super::{Detectors, Finding, Outcome};

/// The most bytes held back with the default set: a JWT candidate at its caps, plus the
/// bytes that may arrive before a spaced-out rescan.
pub const MAX_HELD: usize = WINDOW + WINDOW / 4 + 1;

/// The most bytes any validator reads from a candidate's start.
const WINDOW: usize = if patterns::MAX_WINDOW > cards::MAX_WINDOW {
    patterns::MAX_WINDOW
} else {
    cards::MAX_WINDOW
};

/// Bytes of released data kept as left context (boundaries look one or two bytes back).
const CONTEXT: usize = 8;

/// Held bytes past which rescans are spaced out (see the module docs).
const AMORTIZE_FROM: usize = 1024;

/// The scanning state of one body.
pub struct StreamScanner {
    detectors: Arc<Detectors>,
    /// Bytes received and not released: they may start a secret.
    held: Vec<u8>,
    /// The last bytes released, for the left boundary of a candidate at the start of `held`.
    context: Vec<u8>,
    /// Offset in the body of `held[0]`.
    base: u64,
    /// `held.len()` right after the last scan.
    held_at_scan: usize,
    /// Set once found: the body is refused from then on.
    found: Option<Finding>,
}

impl std::fmt::Debug for StreamScanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The held bytes may be the start of a secret: their count only.
        f.debug_struct("StreamScanner")
            .field("held", &self.held.len())
            .field("offset", &self.base)
            .field("found", &self.found)
            .finish()
    }
}

impl StreamScanner {
    pub fn new(detectors: Arc<Detectors>) -> Self {
        Self {
            detectors,
            held: Vec::new(),
            context: Vec::with_capacity(CONTEXT),
            base: 0,
            held_at_scan: 0,
            found: None,
        }
    }

    /// How many bytes are held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The next chunk: the bytes safe to forward now, or the finding (and then for good).
    pub fn push(&mut self, chunk: Bytes) -> Result<Bytes, Finding> {
        if let Some(found) = &self.found {
            return Err(found.clone());
        }
        if chunk.is_empty() {
            return Ok(Bytes::new());
        }
        if self.held.is_empty() {
            let outcome = self
                .detectors
                .scan_view(&View::new(&self.context, &chunk, false));
            let safe = self.settle(outcome)?;
            remember(&mut self.context, &chunk[..safe]);
            self.held.extend_from_slice(&chunk[safe..]);
            self.base += safe as u64;
            self.held_at_scan = self.held.len();
            return Ok(chunk.slice(..safe));
        }
        self.held.extend_from_slice(&chunk);
        if self.held_at_scan >= AMORTIZE_FROM
            && self.held.len() - self.held_at_scan < self.held_at_scan / 4
        {
            return Ok(Bytes::new());
        }
        let outcome = self
            .detectors
            .scan_view(&View::new(&self.context, &self.held, false));
        let safe = self.settle(outcome)?;
        Ok(self.release(safe))
    }

    /// The body ended: the held bytes are scanned as final and released, or refused.
    pub fn finish(&mut self) -> Result<Bytes, Finding> {
        if let Some(found) = &self.found {
            return Err(found.clone());
        }
        let outcome = self
            .detectors
            .scan_view(&View::new(&self.context, &self.held, true));
        let safe = self.settle(outcome)?;
        Ok(self.release(safe))
    }

    /// Forget the held bytes (the body failed: they are not forwarded, and not kept).
    pub fn discard(&mut self) {
        self.held.clear();
    }

    /// The number of bytes that may go, or the finding (remembered).
    fn settle(&mut self, outcome: Outcome) -> Result<usize, Finding> {
        match outcome {
            Outcome::Clean { safe } => Ok(safe),
            Outcome::Found { at, kind } => {
                let found = self.detectors.finding(kind, self.base + at as u64);
                self.held.clear();
                self.found = Some(found.clone());
                Err(found)
            }
        }
    }

    fn release(&mut self, safe: usize) -> Bytes {
        let out = Bytes::copy_from_slice(&self.held[..safe]);
        remember(&mut self.context, &out);
        self.held.drain(..safe);
        self.base += safe as u64;
        self.held_at_scan = self.held.len();
        out
    }
}

/// Keep the last [`CONTEXT`] bytes of what was released.
fn remember(context: &mut Vec<u8>, released: &[u8]) {
    if released.len() >= CONTEXT {
        context.clear();
        context.extend_from_slice(&released[released.len() - CONTEXT..]);
    } else {
        context.extend_from_slice(released);
        let excess = context.len().saturating_sub(CONTEXT);
        context.drain(..excess);
    }
}
