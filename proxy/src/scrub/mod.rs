//! Response scrubbing: an injected secret that comes back in an upstream's answer is
//! redacted before the agent sees it (DESIGN §9).
//!
//! An upstream may echo what it was sent — a debug endpoint reflecting headers, an error
//! quoting the request, a redirect carrying a token. The agent must never learn a secret
//! the proxy injected on its behalf, so every response to a request that carried one goes
//! through a [`Scrubber`]: header values, the reason phrase, the body and the trailers.
//!
//! - The patterns of a secret ([`patterns`]): its raw bytes, its base64 and base64url forms
//!   (whole, and embedded in a larger blob at each of the three alignments), and its
//!   percent-encoded forms. One leftmost-longest Aho–Corasick automaton holds all of them.
//! - Bodies stream ([`stream`]): only the tail that could still be the start of a secret is
//!   held back between frames, never the whole body.
//! - Compressed bodies ([`body`]): requests carrying a credential ask for identity
//!   ([`request_identity`]); an upstream that compresses anyway is decoded (gzip, deflate,
//!   br, zstd, stacked in any order) and scrubbed, and the agent gets it identity-encoded.
//!   Any other encoding is refused ([`ScrubError::UndecodableEncoding`]); a body that fails
//!   to decode midway ends with an error. Nothing undecoded ever passes.
//!
//! A [`Scrubber`] is built once per credential and cached (construction compiles the
//! automaton); scrubbing a response that holds no secret costs one scan and no copy.

mod body;
mod patterns;
mod stream;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_ENCODING};
use http::HeaderMap;

pub use body::{scrub_response, ScrubBody};
pub use stream::StreamScrubber;

use crate::prefix_trie::PrefixTrie;

/// What a secret is replaced with. It contains no pattern of any realistic secret; when a
/// secret does occur in it (a secret such as `"ostiary"`), [`Scrubber`] falls back to
/// [`REDACTED_FALLBACK`], and then to removing the secret outright.
pub const REDACTED: &str = "[REDACTED by ostiary]";
/// The marker used when a secret occurs in [`REDACTED`].
pub const REDACTED_FALLBACK: &str = "[redacted]";

/// The most content codings stacked on one response that are decoded.
pub const MAX_ENCODINGS: usize = 4;

/// Why a response cannot be passed on scrubbed.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    /// The body is compressed in a way the proxy cannot decode, so it cannot be scrubbed.
    #[error("the upstream answered with content encoding {0:?}, which cannot be scrubbed")]
    UndecodableEncoding(String),
    /// More content codings stacked than [`MAX_ENCODINGS`].
    #[error("the upstream answered with {0} stacked content encodings (at most {MAX_ENCODINGS})")]
    TooManyEncodings(usize),
    /// The body failed to decode midway (raised inside the body stream).
    #[error("decoding the upstream's {encoding} body: {source}")]
    Decode {
        encoding: String,
        #[source]
        source: std::io::Error,
    },
}

/// Redacts a fixed set of secrets. Cheap to clone; `Debug` shows the pattern count only.
#[derive(Clone)]
pub struct Scrubber {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` when there is nothing to scrub.
    ac: Option<AhoCorasick>,
    trie: PrefixTrie,
    patterns: usize,
    max_len: usize,
    marker: Bytes,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("patterns", &self.inner.patterns)
            .finish()
    }
}

impl Scrubber {
    /// A scrubber for `secrets`: each one's raw value (always, when non-empty), and for
    /// those of at least 4 bytes their base64/base64url forms at every alignment; the
    /// percent-encoded forms whenever they differ. (A basic-auth pair's
    /// `base64("user:pass")` is not derived here: pass `"user:pass"` as a secret too.)
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Scrubber {
        let mut seen = HashSet::new();
        let mut all: Vec<Vec<u8>> = Vec::new();
        for secret in secrets {
            for p in patterns::variants(secret.as_bytes()) {
                if seen.insert(p.clone()) {
                    all.push(p);
                }
            }
        }
        let max_len = all.iter().map(Vec::len).max().unwrap_or(0);
        let ac = (!all.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&all)
                // Only a pattern set too large for the automaton's ids fails, far beyond
                // any real credential's few dozen patterns.
                .expect("the scrubbing automaton builds")
        });
        let marker = match &ac {
            Some(ac) if ac.is_match(REDACTED) => {
                if ac.is_match(REDACTED_FALLBACK) {
                    Bytes::new()
                } else {
                    Bytes::from_static(REDACTED_FALLBACK.as_bytes())
                }
            }
            _ => Bytes::from_static(REDACTED.as_bytes()),
        };
        Scrubber {
            inner: Arc::new(Inner {
                ac,
                trie: PrefixTrie::new(all.iter().map(Vec::as_slice)),
                patterns: all.len(),
                max_len,
                marker,
            }),
        }
    }

    /// No secret to look for: responses pass untouched.
    pub fn is_empty(&self) -> bool {
        self.inner.ac.is_none()
    }

    /// The length of the longest pattern (0 when empty).
    pub fn max_pattern_len(&self) -> usize {
        self.inner.max_len
    }

    /// How many patterns the secrets expanded to.
    pub fn pattern_count(&self) -> usize {
        self.inner.patterns
    }

    /// `input` with every pattern replaced; borrowed when nothing matched.
    pub fn scrub_bytes<'b>(&self, input: &'b [u8]) -> Cow<'b, [u8]> {
        self.replace(input).0
    }

    /// The replaced bytes and the number of replacements.
    fn replace<'b>(&self, input: &'b [u8]) -> (Cow<'b, [u8]>, usize) {
        let Some(ac) = self.inner.ac.as_ref() else {
            return (Cow::Borrowed(input), 0);
        };
        let mut matches = ac.find_iter(input).peekable();
        if matches.peek().is_none() {
            return (Cow::Borrowed(input), 0);
        }
        let mut out = Vec::with_capacity(input.len());
        let (mut pos, mut count) = (0, 0);
        for m in matches {
            out.extend_from_slice(&input[pos..m.start()]);
            out.extend_from_slice(&self.inner.marker);
            pos = m.end();
            count += 1;
        }
        out.extend_from_slice(&input[pos..]);
        (Cow::Owned(out), count)
    }

    /// Scrub every header value in place (`Location`, `Set-Cookie`, … alike) and drop headers
    /// whose name carries a secret; the number of redactions. A redacted value is marked sensitive so HPACK never indexes it.
    pub fn scrub_headers(&self, headers: &mut HeaderMap) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut total = 0;
        // A secret reflected into a header *name* (`x-n-<secret>: 1`): the header goes, as
        // a name cannot be redacted in place.
        let named: Vec<http::HeaderName> = headers
            .keys()
            .filter(|name| matches!(self.replace(name.as_str().as_bytes()).0, Cow::Owned(_)))
            .cloned()
            .collect();
        for name in named {
            headers.remove(&name);
            total += 1;
        }
        for value in headers.values_mut() {
            let (scrubbed, count) = self.replace(value.as_bytes());
            if let Cow::Owned(bytes) = scrubbed {
                total += count;
                // Cannot fail (the marker is visible ASCII), but never keep the original.
                let mut new = HeaderValue::from_maybe_shared(Bytes::from(bytes))
                    .unwrap_or_else(|_| HeaderValue::from_static(REDACTED));
                new.set_sensitive(true);
                *value = new;
            }
        }
        total
    }
}

/// Ask the upstream for an identity-encoded answer, so the response to a request that
/// carries an injected credential can be scrubbed without decoding.
pub fn request_identity(headers: &mut HeaderMap) {
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
}
