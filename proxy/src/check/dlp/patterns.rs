//! The default detector set: the literal anchors the automaton looks for, and for each the
//! validator that decides whether the bytes at an anchor really are a secret.
//!
//! An anchor alone (`AKIA`, `eyJ`, `sk_live_`) occurs in ordinary traffic — inside base64
//! blobs, in documentation, in code that *checks* for keys. Each validator therefore looks
//! at a bounded window around the anchor: the exact length and alphabet of the token, a
//! boundary on both sides (not inside a longer word), and where the format allows it a
//! structural check (a JWT header that decodes to JSON with `"alg"`, a PEM header followed
//! by key material, an AWS secret only after its label).
//!
//! Every validator reads at most [`MAX_WINDOW`] bytes from its anchor and one or two bytes
//! before it. That bound is what lets the streaming scanner hold back a bounded tail and
//! still decide exactly as a scan of the whole body would: a validator that runs out of
//! bytes answers [`More`], and with the window complete it always decides.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// The longest JWT header (base64url characters) considered; real headers are < 200.
pub const JWT_MAX_HEADER: usize = 1024;
/// The longest JWT payload considered. A token whose header and payload together exceed
/// the window is not recognised: that cap is what keeps the streaming hold-back bounded.
pub const JWT_MAX_PAYLOAD: usize = 7 * 1024;
/// Characters of signature that make a JWT (an HMAC-SHA256 one has 43).
const JWT_MIN_SIGNATURE: usize = 16;
/// How far after `"service_account"` the `"private_key"` member is looked for.
const GCP_SA_REACH: usize = 2048;
/// How far after a PEM header its base64 body must start (room for `Proc-Type` and
/// `DEK-Info` lines of legacy encrypted keys, and JSON-escaped newlines).
const PEM_BODY_REACH: usize = 256;
/// Base64 characters in a row that make a PEM body (a 256-bit EC key alone has 100+).
const PEM_BODY_MIN: usize = 40;

/// The most bytes any validator reads from the start of its anchor (a JWT at its caps, the
/// largest): the streaming scanner never holds back more for an anchored detector.
pub const MAX_WINDOW: usize = JWT_MAX_HEADER + 1 + JWT_MAX_PAYLOAD + 1 + JWT_MIN_SIGNATURE + 1;

/// A validator ran out of bytes before it could decide: the body has not ended yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct More;

/// A decision, or the need for more bytes.
pub type Step<T> = Result<T, More>;

/// The bytes a validator may read: `buf`, plus up to a few bytes of `ctx` before it (the
/// last bytes already released, for the left boundary), and whether `buf` is the end.
#[derive(Clone, Copy)]
pub struct View<'a> {
    ctx: &'a [u8],
    buf: &'a [u8],
    eof: bool,
}

impl<'a> View<'a> {
    pub fn new(ctx: &'a [u8], buf: &'a [u8], eof: bool) -> Self {
        Self { ctx, buf, eof }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    pub fn eof(&self) -> bool {
        self.eof
    }

    /// The byte at `i`: `None` past the end of the body, [`More`] past the end of what has
    /// arrived so far.
    #[inline]
    pub fn at(&self, i: usize) -> Step<Option<u8>> {
        match self.buf.get(i) {
            Some(&b) => Ok(Some(b)),
            None if self.eof => Ok(None),
            None => Err(More),
        }
    }

    /// The byte `k` positions before `i` (reaching into the context); `None` before the
    /// start of the body.
    #[inline]
    pub fn before(&self, i: usize, k: usize) -> Option<u8> {
        if i >= k {
            self.buf.get(i - k).copied()
        } else {
            let back = k - i;
            self.ctx.len().checked_sub(back).map(|j| self.ctx[j])
        }
    }

    /// How many bytes of `class` follow from `i`, counting at most `max`.
    #[inline]
    pub fn run(&self, i: usize, max: usize, class: impl Fn(u8) -> bool) -> Step<usize> {
        let mut n = 0;
        while n < max {
            match self.at(i + n)? {
                Some(b) if class(b) => n += 1,
                _ => break,
            }
        }
        Ok(n)
    }

    /// Whether `lit` is at `i` (a mismatch decides at once, whatever follows).
    pub fn expect(&self, i: usize, lit: &[u8]) -> Step<bool> {
        for (k, &c) in lit.iter().enumerate() {
            if self.at(i + k)? != Some(c) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The first occurrence of `needle` starting in `from..end`.
    fn find(&self, from: usize, end: usize, needle: &[u8]) -> Step<Option<usize>> {
        let hi = (end + needle.len()).min(self.buf.len());
        if from < hi {
            if let Some(p) = self.buf[from..hi]
                .windows(needle.len())
                .position(|w| w == needle)
            {
                if from + p < end {
                    return Ok(Some(from + p));
                }
            }
        }
        if self.eof || self.buf.len() >= end + needle.len() {
            Ok(None)
        } else {
            Err(More)
        }
    }
}

/// What an anchor stands for. The order is the tie-break when two detectors match at the
/// same offset: a broker credential names the most, so it comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// The caller's literal value with this index: the automaton matched it whole.
    Literal(u32),
    PrivateKey,
    GcpServiceAccount,
    AwsAccessKey,
    AwsSecretKey,
    GcpApiKey,
    GithubToken,
    GithubPat,
    SlackToken,
    SlackWebhook,
    SlackWorkflow,
    StripeKey,
    Jwt,
}

/// The anchors of the default set. Case-sensitive: every format here fixes its case, and a
/// case-sensitive automaton keeps the SIMD prefilter (labels are listed in the spellings
/// configuration files and SDKs use).
pub const DEFAULT_ANCHORS: &[(&str, Rule)] = &[
    ("-----BEGIN ", Rule::PrivateKey),
    ("service_account", Rule::GcpServiceAccount),
    ("AKIA", Rule::AwsAccessKey),
    ("ASIA", Rule::AwsAccessKey),
    ("secret_access_key", Rule::AwsSecretKey),
    ("SECRET_ACCESS_KEY", Rule::AwsSecretKey),
    ("secret-access-key", Rule::AwsSecretKey),
    ("SecretAccessKey", Rule::AwsSecretKey),
    ("secretAccessKey", Rule::AwsSecretKey),
    ("aws_secret_key", Rule::AwsSecretKey),
    ("AWS_SECRET_KEY", Rule::AwsSecretKey),
    ("AIza", Rule::GcpApiKey),
    ("ghp_", Rule::GithubToken),
    ("gho_", Rule::GithubToken),
    ("ghu_", Rule::GithubToken),
    ("ghs_", Rule::GithubToken),
    ("ghr_", Rule::GithubToken),
    ("github_pat_", Rule::GithubPat),
    ("xoxb-", Rule::SlackToken),
    ("xoxp-", Rule::SlackToken),
    ("xoxa-", Rule::SlackToken),
    ("xoxr-", Rule::SlackToken),
    ("xoxs-", Rule::SlackToken),
    ("xoxe-", Rule::SlackToken),
    ("xapp-", Rule::SlackToken),
    ("hooks.slack.com/services/", Rule::SlackWebhook),
    ("hooks.slack.com/workflows/", Rule::SlackWorkflow),
    ("hooks.slack.com/triggers/", Rule::SlackWorkflow),
    ("sk_live_", Rule::StripeKey),
    ("rk_live_", Rule::StripeKey),
    ("eyJ", Rule::Jwt),
];

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}
fn upper_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}
fn word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}
fn b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}
fn b64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'+' || b == b'/'
}

impl Rule {
    /// The finding's `kind` (literals are named by the caller).
    pub fn kind(self) -> &'static str {
        match self {
            Rule::Literal(_) => "credential",
            Rule::PrivateKey => "private_key",
            Rule::GcpServiceAccount => "gcp_service_account",
            Rule::AwsAccessKey => "aws_access_key",
            Rule::AwsSecretKey => "aws_secret_key",
            Rule::GcpApiKey => "gcp_api_key",
            Rule::GithubToken | Rule::GithubPat => "github_token",
            Rule::SlackToken => "slack_token",
            Rule::SlackWebhook | Rule::SlackWorkflow => "slack_webhook",
            Rule::StripeKey => "stripe_key",
            Rule::Jwt => "jwt",
        }
    }

    /// Whether the anchor of `len` bytes at `s` starts a secret of this rule.
    pub fn check(self, v: &View<'_>, s: usize, len: usize) -> Step<bool> {
        let after = s + len;
        match self {
            Rule::Literal(_) => Ok(true),
            Rule::PrivateKey => private_key(v, after),
            Rule::GcpServiceAccount => gcp_service_account(v, s, after),
            Rule::AwsAccessKey => exact(v, s, after, 16, upper_digit, alnum),
            Rule::AwsSecretKey => aws_secret(v, after),
            Rule::GcpApiKey => exact(v, s, after, 35, b64url, b64url),
            Rule::GithubToken => exact(v, s, after, 36, alnum, word),
            Rule::GithubPat => exact(v, s, after, 82, word, word),
            Rule::SlackToken => slack_token(v, s, after),
            Rule::SlackWebhook => slack_webhook(v, after),
            Rule::SlackWorkflow => Ok(v.run(after, 20, |b| alnum(b) || b == b'/')? == 20),
            // Live keys are 24 to 99 characters: 24 decide, whatever follows.
            Rule::StripeKey => Ok(!left_word(v, s) && v.run(after, 24, alnum)? == 24),
            Rule::Jwt => jwt(v, s),
        }
    }
}

/// The anchor continues a word (the middle of a base64 blob or an identifier), so it does
/// not start a token.
fn left_word(v: &View<'_>, s: usize) -> bool {
    v.before(s, 1).is_some_and(alnum)
}

/// Exactly `n` bytes of `class` after the anchor, not followed by a `boundary` byte.
fn exact(
    v: &View<'_>,
    s: usize,
    after: usize,
    n: usize,
    class: fn(u8) -> bool,
    boundary: fn(u8) -> bool,
) -> Step<bool> {
    if left_word(v, s) || v.run(after, n, class)? < n {
        return Ok(false);
    }
    Ok(!v.at(after + n)?.is_some_and(boundary))
}

/// `-----BEGIN <label> PRIVATE KEY-----` followed by key material: a header alone (in code
/// that looks for one, in documentation) is not a key.
fn private_key(v: &View<'_>, after: usize) -> Step<bool> {
    let label = v.run(after, 48, |b| upper_digit(b) || b == b' ')?;
    if !v.expect(after + label, b"-----")? {
        return Ok(false);
    }
    let text = v.bytes()[after..after + label].trim_ascii_end();
    if !(text.ends_with(b"PRIVATE KEY") || text.ends_with(b"PRIVATE KEY BLOCK")) {
        return Ok(false);
    }
    let start = after + label + 5;
    let mut run = 0;
    let mut i = start;
    loop {
        match v.at(i)? {
            None => return Ok(false),
            Some(b) if b64(b) => {
                run += 1;
                if run >= PEM_BODY_MIN {
                    return Ok(true);
                }
            }
            Some(_) => {
                run = 0;
                if i >= start + PEM_BODY_REACH {
                    return Ok(false);
                }
            }
        }
        i += 1;
    }
}

/// A 40-character secret right after an AWS secret-key label and its punctuation
/// (`= `, `": "`, `\": \"`, `: `): random base64 elsewhere is not flagged.
fn aws_secret(v: &View<'_>, after: usize) -> Step<bool> {
    let gap = v.run(after, 8, |b| {
        matches!(
            b,
            b' ' | b'\t' | b'"' | b'\'' | b'=' | b':' | b'\\' | b'>' | b'`'
        )
    })?;
    if gap == 0 {
        return Ok(false);
    }
    let at = after + gap;
    if v.run(at, 40, b64)? < 40 {
        return Ok(false);
    }
    Ok(!v.at(at + 40)?.is_some_and(|b| b64(b) || b == b'='))
}

/// `"service_account"` as a JSON string, with a `"private_key": "-----BEGIN` member after
/// it (plain or JSON-in-JSON escaped): a service-account key file, not a mention of one.
fn gcp_service_account(v: &View<'_>, s: usize, after: usize) -> Step<bool> {
    if v.before(s, 1) != Some(b'"') {
        return Ok(false);
    }
    let end = after + GCP_SA_REACH;
    let mut from = after;
    while let Some(p) = v.find(from, end, b"private_key")? {
        let mut i = p + b"private_key".len();
        if v.at(i)? == Some(b'\\') {
            i += 1;
        }
        if v.at(i)? == Some(b'"') {
            let gap = v.run(i + 1, 8, |b| {
                matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b':' | b'\\' | b'"')
            })?;
            if v.expect(i + 1 + gap, b"-----BEGIN")? {
                return Ok(true);
            }
        }
        from = p + 1;
    }
    Ok(false)
}

/// `xoxb-` and friends: at least 20 more characters, starting with the team's digits and
/// holding a dash (`xoxb-your-token` in documentation is not one).
fn slack_token(v: &View<'_>, s: usize, after: usize) -> Step<bool> {
    if left_word(v, s) || v.run(after, 20, |b| alnum(b) || b == b'-')? < 20 {
        return Ok(false);
    }
    let rest = &v.bytes()[after..after + 20];
    Ok(rest[0].is_ascii_digit() && rest.contains(&b'-'))
}

/// `hooks.slack.com/services/T…/B…/<secret>`.
fn slack_webhook(v: &View<'_>, after: usize) -> Step<bool> {
    let mut i = after;
    for lead in [b'T', b'B'] {
        if v.at(i)? != Some(lead) {
            return Ok(false);
        }
        let n = v.run(i + 1, 16, upper_digit)?;
        if n < 6 || v.at(i + 1 + n)? != Some(b'/') {
            return Ok(false);
        }
        i += n + 2;
    }
    Ok(v.run(i, 20, alnum)? == 20)
}

/// `eyJ…` header `.` payload `.` signature, the header decoding to a JSON object with an
/// `"alg"` member (base64-encoded JSON documents also start with `eyJ`).
fn jwt(v: &View<'_>, s: usize) -> Step<bool> {
    if v.before(s, 1).is_some_and(b64url) {
        return Ok(false);
    }
    let header = v.run(s, JWT_MAX_HEADER + 1, b64url)?;
    if header > JWT_MAX_HEADER || v.at(s + header)? != Some(b'.') {
        return Ok(false);
    }
    let decoded = match URL_SAFE_NO_PAD.decode(&v.bytes()[s..s + header]) {
        Ok(d) => d,
        Err(_) => return Ok(false),
    };
    let has_alg = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&decoded)
        .is_ok_and(|h| h.contains_key("alg"));
    if !has_alg {
        return Ok(false);
    }
    let p = s + header + 1;
    let payload = v.run(p, JWT_MAX_PAYLOAD + 1, b64url)?;
    if payload == 0 || payload > JWT_MAX_PAYLOAD || v.at(p + payload)? != Some(b'.') {
        return Ok(false);
    }
    Ok(v.run(p + payload + 1, JWT_MIN_SIGNATURE, b64url)? == JWT_MIN_SIGNATURE)
}
