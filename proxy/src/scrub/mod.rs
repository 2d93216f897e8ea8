//! Response scrubbing: an injected secret that comes back in an upstream's answer is
//! redacted before the agent sees it (docs/design.md §9).
//!
//! An upstream may echo what it was sent — a debug endpoint reflecting headers, an error
//! quoting the request, a redirect carrying a token. The agent must never learn a secret
//! the proxy injected on its behalf, so every response to a request that carried one goes
//! through a [`Scrubber`]: header values, the reason phrase, the body and the trailers.
//!
//! - The forms of a secret ([`patterns`]): its raw value, its base64 and base64url forms
//!   (whole, and embedded in a larger blob at each of the three alignments), its hex forms.
//! - Every spelling of each form ([`encodings`]): each character as itself or escaped the
//!   way a JSON, HTML or URL encoder writes it — any subset of the characters, each in any
//!   of its encodings, nested once (JSON in JSON, a URL in JSON, HTML in JSON …).
//! - One matcher over all of them ([`matcher`]): a leftmost-first regular expression,
//!   searched around anchors that an Aho–Corasick automaton finds.
//! - Bodies stream ([`stream`]): a fixed window is held back between frames (never the
//!   whole body), whatever the bytes are, so that how long a frame waits tells nothing
//!   about the secrets.
//! - Compressed bodies ([`body`]): requests carrying a credential ask for identity
//!   ([`request_identity`]); an upstream that compresses anyway is decoded (gzip, deflate,
//!   br, zstd, stacked in any order) and scrubbed, and the agent gets it identity-encoded.
//!   Any other encoding is refused ([`ScrubError::UndecodableEncoding`]); a body that fails
//!   to decode midway ends with an error. Nothing undecoded ever passes.
//!
//! Whatever the proxy decodes and writes out again after scrubbing (an MCP answer it
//! filters, an approved call's answer it stores as one message) is scrubbed once more as
//! written ([`Scrubber::scrub_text`]): a re-serialiser writes characters in its own way.
//!
//! A [`Scrubber`] is built once per credential and cached (construction compiles the
//! automata); scrubbing a response that holds no secret costs one scan and no copy.

mod body;
mod encodings;
mod matcher;
mod patterns;
mod stream;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_encodings;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_ENCODING};
use http::HeaderMap;

pub use body::{scrub_response, ScrubBody};
pub use stream::StreamScrubber;

use matcher::Matcher;

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
    matcher: Option<Matcher>,
    /// Every form lowercased, in all its spellings: header names arrive lowercased (hyper,
    /// HTTP/2), so a secret reflected into one is no longer spelled as it was sent.
    in_names: Option<Matcher>,
    patterns: usize,
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
    /// those of at least 4 bytes their base64/base64url forms at every alignment and their
    /// hex forms; each form in every spelling a JSON, HTML or URL encoder gives it. (A
    /// basic-auth pair's `base64("user:pass")` is not derived here: pass `"user:pass"` as
    /// a secret too.)
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Scrubber {
        let mut all: Vec<patterns::Form> = Vec::new();
        for secret in secrets {
            for form in patterns::variants(secret) {
                if !all.iter().any(|f| f.text == form.text) {
                    all.push(form);
                }
            }
        }
        let matcher = Matcher::new(&all);
        let lowered: Vec<patterns::Form> = all
            .iter()
            .map(|f| patterns::Form {
                text: f.text.to_ascii_lowercase(),
                escapable: f.escapable,
            })
            .collect();
        let in_names = Matcher::new(&lowered);
        let marker = match &matcher {
            Some(m) if m.is_match(REDACTED.as_bytes()) => {
                if m.is_match(REDACTED_FALLBACK.as_bytes()) {
                    Bytes::new()
                } else {
                    Bytes::from_static(REDACTED_FALLBACK.as_bytes())
                }
            }
            _ => Bytes::from_static(REDACTED.as_bytes()),
        };
        Scrubber {
            inner: Arc::new(Inner {
                matcher,
                in_names,
                patterns: all.len(),
                marker,
            }),
        }
    }

    /// No secret to look for: responses pass untouched.
    pub fn is_empty(&self) -> bool {
        self.inner.matcher.is_none()
    }

    /// The length of the longest spelling of any secret (0 when empty).
    pub fn max_pattern_len(&self) -> usize {
        self.inner.matcher.as_ref().map_or(0, Matcher::max_len)
    }

    /// How many bytes a streamed body holds back at most between two frames (0 when
    /// empty): one less than a bound on any spelling's length that depends on the secrets'
    /// lengths alone.
    pub fn hold_back(&self) -> usize {
        self.inner
            .matcher
            .as_ref()
            .map_or(0, |m| m.window().saturating_sub(1))
    }

    /// How many forms the secrets expanded to (each matched in all its spellings).
    pub fn pattern_count(&self) -> usize {
        self.inner.patterns
    }

    /// `input` with every pattern replaced; borrowed when nothing matched.
    pub fn scrub_bytes<'b>(&self, input: &'b [u8]) -> Cow<'b, [u8]> {
        self.replace(input).0
    }

    /// Text the proxy wrote itself from decoded upstream data (a re-serialised JSON
    /// document), scrubbed: the serialiser may have turned escapes back into characters.
    pub fn scrub_text(&self, text: String) -> String {
        match self.replace(text.as_bytes()).0 {
            Cow::Borrowed(_) => text,
            // The marker is ASCII and replaces whole matches of UTF-8 patterns, so the
            // result is UTF-8; lossily all the same rather than trusting that here.
            Cow::Owned(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// The replaced bytes and the number of replacements.
    fn replace<'b>(&self, input: &'b [u8]) -> (Cow<'b, [u8]>, usize) {
        let Some(matcher) = self.inner.matcher.as_ref() else {
            return (Cow::Borrowed(input), 0);
        };
        let mut matches = matcher.find_iter(input).peekable();
        if matches.peek().is_none() {
            return (Cow::Borrowed(input), 0);
        }
        let mut out = Vec::with_capacity(input.len());
        let (mut pos, mut count) = (0, 0);
        for (start, end) in matches {
            out.extend_from_slice(&input[pos..start]);
            out.extend_from_slice(&self.inner.marker);
            pos = end;
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
            .filter(|name| {
                // Names are lowercase (`HeaderName`), so the lowered forms cover every
                // spelling the case-sensitive matcher would find in them, and more.
                self.inner
                    .in_names
                    .as_ref()
                    .is_some_and(|m| m.is_match(name.as_str().as_bytes()))
            })
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
