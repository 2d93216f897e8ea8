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
//!   way a JSON, HTML, URL or quoted-printable encoder writes it — any subset of the
//!   characters, each in any of its encodings, nested once (JSON in JSON, a URL in JSON,
//!   HTML in JSON …).
//! - Wrapped across lines ([`wrapped`]): MIME base64, PEM, hex dumps and quoted-printable
//!   break their lines wherever the column count falls; each buffer is also searched
//!   without those breaks.
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
//! A [`Scrubber`] is built once per set of secrets and kept (construction compiles the
//! automata); scrubbing a response that holds no secret costs one scan and no copy.
//!
//! One scrubber may join several built apart ([`Scrubber::join`]), each a *shard* applied
//! after the one before: compiling one automaton over many secrets costs far more than
//! over each few (the expression grows with every spelling of every form), so a set that
//! grows one credential at a time (every secret the process injected,
//! [`crate::inject::known`]) compiles only what was added.

mod body;
mod encodings;
mod matcher;
mod patterns;
mod stream;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_encodings;
pub mod websocket;
mod wrapped;

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
    /// Applied in order, each to what the one before let through; none when there is
    /// nothing to scrub.
    shards: Vec<Arc<Shard>>,
    patterns: usize,
}

/// The secrets of one [`Scrubber::new`].
pub(crate) struct Shard {
    matcher: Matcher,
    /// Every form lowercased, in all its spellings: header names arrive lowercased (hyper,
    /// HTTP/2), so a secret reflected into one is no longer spelled as it was sent.
    in_names: Option<Matcher>,
    marker: Bytes,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("patterns", &self.inner.patterns)
            .field("shards", &self.inner.shards.len())
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
        let Some(matcher) = Matcher::new(&all) else {
            return Scrubber::join(&[]);
        };
        let lowered: Vec<patterns::Form> = all
            .iter()
            .map(|f| patterns::Form {
                text: f.text.to_ascii_lowercase(),
                escapable: f.escapable,
            })
            .collect();
        let in_names = Matcher::new(&lowered);
        let marker = if matcher.is_match(REDACTED.as_bytes()) {
            if matcher.is_match(REDACTED_FALLBACK.as_bytes()) {
                Bytes::new()
            } else {
                Bytes::from_static(REDACTED_FALLBACK.as_bytes())
            }
        } else {
            Bytes::from_static(REDACTED.as_bytes())
        };
        Scrubber {
            inner: Arc::new(Inner {
                shards: vec![Arc::new(Shard {
                    matcher,
                    in_names,
                    marker,
                })],
                patterns: all.len(),
            }),
        }
    }

    /// One scrubber redacting what each of `parts` does, applied in turn; nothing is
    /// compiled again.
    pub fn join(parts: &[Scrubber]) -> Scrubber {
        Scrubber {
            inner: Arc::new(Inner {
                shards: parts
                    .iter()
                    .flat_map(|p| p.inner.shards.iter().cloned())
                    .collect(),
                patterns: parts.iter().map(|p| p.inner.patterns).sum(),
            }),
        }
    }

    /// The shards, in the order they apply ([`StreamScrubber`] keeps one state per shard).
    pub(crate) fn shards(&self) -> &[Arc<Shard>] {
        &self.inner.shards
    }

    /// Whether both are the same scrubber (not rebuilt in between).
    pub(crate) fn same_as(&self, other: &Scrubber) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// No secret to look for: responses pass untouched.
    pub fn is_empty(&self) -> bool {
        self.inner.shards.is_empty()
    }

    /// The length of the longest spelling of any secret (0 when empty).
    pub fn max_pattern_len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.matcher.max_len())
            .max()
            .unwrap_or(0)
    }

    /// How many bytes a streamed body holds back at most between two frames, per shard
    /// (0 when empty): one less than a bound on any spelling's length that depends on the
    /// secrets' lengths alone.
    pub fn hold_back(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.hold_back())
            .max()
            .unwrap_or(0)
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

    /// The replaced bytes and the number of replacements, shard after shard.
    fn replace<'b>(&self, input: &'b [u8]) -> (Cow<'b, [u8]>, usize) {
        let mut out = Cow::Borrowed(input);
        let mut count = 0;
        for shard in &self.inner.shards {
            let (replaced, n) = shard.replace(&out);
            if let Cow::Owned(bytes) = replaced {
                out = Cow::Owned(bytes);
                count += n;
            }
        }
        (out, count)
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
                self.inner.shards.iter().any(|s| {
                    s.in_names
                        .as_ref()
                        .is_some_and(|m| m.is_match(name.as_str().as_bytes()))
                })
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

impl Shard {
    pub(crate) fn matcher(&self) -> &Matcher {
        &self.matcher
    }

    pub(crate) fn marker(&self) -> &Bytes {
        &self.marker
    }

    /// One less than a bound on the length of any spelling of this shard's secrets.
    pub(crate) fn hold_back(&self) -> usize {
        self.matcher.window().saturating_sub(1)
    }

    /// The replaced bytes and the number of replacements; borrowed when none.
    pub(crate) fn replace<'b>(&self, input: &'b [u8]) -> (Cow<'b, [u8]>, usize) {
        let mut matches = self.matcher.find_iter(input).peekable();
        if matches.peek().is_none() {
            return (Cow::Borrowed(input), 0);
        }
        let mut out = Vec::with_capacity(input.len());
        let (mut pos, mut count) = (0, 0);
        for (start, end) in matches {
            out.extend_from_slice(&input[pos..start]);
            out.extend_from_slice(&self.marker);
            pos = end;
            count += 1;
        }
        out.extend_from_slice(&input[pos..]);
        (Cow::Owned(out), count)
    }
}

/// Ask the upstream for an identity-encoded answer, so the response to a request that
/// carries an injected credential can be scrubbed without decoding.
pub fn request_identity(headers: &mut HeaderMap) {
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
}
