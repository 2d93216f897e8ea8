//! Verifying the signatures on webhook deliveries that start runs.
//!
//! A trigger's webhook hands its payload to an agent as the task, so an unauthenticated
//! delivery could inject the agent's instructions: nothing in a delivery is read before its
//! signature is checked here. Each scheme is an HMAC over the exact bytes delivered (never a
//! trimmed or re-serialised body) with the trigger's secret:
//!
//! - **GitHub** — `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 over the body. GitHub signs
//!   no timestamp, so a captured delivery verifies forever; replays are for the caller to
//!   refuse (by `X-GitHub-Delivery`).
//! - **Stripe** — `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 over
//!   `<t>.<body>`. Any `v1` may match (Stripe sends one per active secret while a secret is
//!   rolled); `v0` and unknown schemes are ignored, so a weaker one cannot stand in for `v1`.
//! - **Slack** — `X-Slack-Request-Timestamp: <unix>` and `X-Slack-Signature: v0=<hex>`,
//!   HMAC-SHA256 over `v0:<ts>:<body>`.
//! - **Generic HMAC** — one configured header holding hex or base64 (after an optional fixed
//!   prefix), HMAC-SHA256 or -SHA512 over the body, or over `<ts>.<body>` when a timestamp
//!   header is configured.
//!
//! The order is the same for all: every header is parsed first (absent → `Missing`, anything
//! unexpected → `Malformed`), then the MAC is compared in constant time (`Mismatch`), and only
//! then is the timestamp held against the tolerance (`Stale`). Checking freshness last means a
//! forgery is always reported as a mismatch, and `Stale` only ever describes an authentic
//! delivery that is old — a replay, or a clock out of step — which is what an operator can fix.
//!
//! A signature header must appear exactly once: with two, a gateway in front of us and this
//! proxy could each pick a different one.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Sha256, Sha512};
use subtle::{Choice, ConstantTimeEq};

/// Which scheme a trigger's deliveries are signed with (`signature = { scheme = "...", ... }` in
/// config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`.
    Github,
    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…][,v0=…]`,
    /// HMAC-SHA256(secret, "<t>.<body>"), any v1 may match; the timestamp within `tolerance` of
    /// now (either direction).
    Stripe { tolerance: Duration },
    /// Slack (v0): `X-Slack-Request-Timestamp: <unix>`,
    /// `X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:<ts>:<body>")>`, timestamp within
    /// `tolerance`.
    Slack { tolerance: Duration },
    /// Generic HMAC: see [`HmacSpec`].
    Hmac(HmacSpec),
}

/// A generic HMAC scheme, for senders that sign in neither GitHub's, Stripe's nor Slack's way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HmacSpec {
    /// The header that carries the signature.
    pub header: HeaderName,
    pub algorithm: Algorithm,
    /// How the MAC is written in `header`, after `prefix`.
    pub encoding: Encoding,
    /// Text the sender writes before the encoded MAC (`"sha256="`, say); empty for none. It is
    /// required exactly, case included, so a value in some other format is refused as such
    /// rather than decoded by chance.
    pub prefix: String,
    /// When set, the sender signs `<timestamp>.<body>` and puts the Unix time in this header,
    /// which lets a replayed delivery be refused once it is older than `tolerance`.
    pub timestamp_header: Option<HeaderName>,
    /// How far the timestamp may be from our clock, either way; unused without
    /// `timestamp_header`.
    pub tolerance: Duration,
}

/// The hash under a generic HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

/// How a generic HMAC is written in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hexadecimal digits, either case.
    Hex,
    /// Standard base64 (RFC 4648 §4) with its padding.
    Base64,
}

/// Why a delivery's signature does not verify. The message names the header and what is wrong,
/// never the secret, the expected signature or the body: `why` is one of this module's fixed
/// phrases, so no delivered or derived text can reach a log through it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "the delivery has no {0} header: check that the sender signs its deliveries and that \
         the trigger's signature scheme is the one the sender uses"
    )]
    Missing(HeaderName),
    #[error("the {header} header {why}")]
    Malformed {
        header: HeaderName,
        why: &'static str,
    },
    #[error(
        "the {header} timestamp is {age_secs} s from this proxy's clock (negative: ahead of it), \
         beyond the {tolerance_secs} s tolerated: the delivery is a replay, or the sender's \
         clock or ours is wrong"
    )]
    Stale {
        header: HeaderName,
        /// Our clock minus the delivery's timestamp.
        age_secs: i64,
        tolerance_secs: u64,
    },
    #[error(
        "the {header} signature does not match the delivery: the trigger's secret differs from \
         the sender's, or the body was changed on the way"
    )]
    Mismatch { header: HeaderName },
}

const REPEATED: &str = "appears more than once; a signed delivery carries exactly one";
const EMPTY: &str = "is empty";
const NOT_VISIBLE_ASCII: &str = "holds characters other than visible ASCII";
const GITHUB_PREFIX: &str = "does not start with `sha256=`, as GitHub's signatures do";
const SLACK_PREFIX: &str = "does not start with `v0=`, as Slack's signatures do";
const HMAC_PREFIX: &str = "does not start with the `prefix` configured for this trigger";
const NOT_HEX: &str = "holds a signature that is not hexadecimal";
const NOT_BASE64: &str = "holds a signature that is not padded standard base64";
const LEN_SHA256_HEX: &str =
    "holds a signature of the wrong length: an HMAC-SHA256 is 64 hexadecimal digits";
const LEN_SHA512_HEX: &str =
    "holds a signature of the wrong length: an HMAC-SHA512 is 128 hexadecimal digits";
const LEN_SHA256_BASE64: &str =
    "holds a signature of the wrong length: an HMAC-SHA256 is 44 base64 characters";
const LEN_SHA512_BASE64: &str =
    "holds a signature of the wrong length: an HMAC-SHA512 is 88 base64 characters";
const TS_NOT_DIGITS: &str = "holds a timestamp that is not a Unix time in whole seconds";
const TS_IMPLAUSIBLE: &str = "holds a timestamp after the year 9999";
const STRIPE_ENTRY: &str = "holds an entry that is not `key=value`, as in `t=<unix>,v1=<hex>`";
const STRIPE_TWO_T: &str = "holds more than one `t=` timestamp";
const STRIPE_NO_T: &str = "has no `t=` timestamp";
const STRIPE_NO_V1: &str =
    "has no `v1=` signature; only v1 is accepted (v0 and other schemes are ignored)";

/// 9999-12-31T23:59:59Z. No sender's clock reads later; a value past it is garbage, not a
/// delivery from the far future.
const MAX_TIMESTAMP: i64 = 253_402_300_799;

fn github_header() -> HeaderName {
    HeaderName::from_static("x-hub-signature-256")
}

fn stripe_header() -> HeaderName {
    HeaderName::from_static("stripe-signature")
}

fn slack_signature_header() -> HeaderName {
    HeaderName::from_static("x-slack-signature")
}

fn slack_timestamp_header() -> HeaderName {
    HeaderName::from_static("x-slack-request-timestamp")
}

impl Scheme {
    /// Check `body` as delivered with `headers`, signed with `secret`, at `now` (seconds since
    /// the epoch).
    pub fn verify(
        &self,
        secret: &[u8],
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        match self {
            Scheme::Github => {
                let header = github_header();
                let value = single(headers, &header)?;
                let hex_text = value
                    .strip_prefix("sha256=")
                    .ok_or_else(|| malformed(&header, GITHUB_PREFIX))?;
                let given = decode(&header, hex_text, Algorithm::Sha256, Encoding::Hex)?;
                let expected = mac(Algorithm::Sha256, secret, &[body]);
                matches(&header, &expected, &[given])
            }
            Scheme::Stripe { tolerance } => {
                let header = stripe_header();
                let value = single(headers, &header)?;
                let (t, given) = stripe_entries(&header, value)?;
                let sent = timestamp(&header, t)?;
                let expected = mac(Algorithm::Sha256, secret, &[t.as_bytes(), b".", body]);
                matches(&header, &expected, &given)?;
                fresh(&header, sent, now, *tolerance)
            }
            Scheme::Slack { tolerance } => {
                let header = slack_signature_header();
                let ts_header = slack_timestamp_header();
                let value = single(headers, &header)?;
                let ts = single(headers, &ts_header)?;
                let hex_text = value
                    .strip_prefix("v0=")
                    .ok_or_else(|| malformed(&header, SLACK_PREFIX))?;
                let given = decode(&header, hex_text, Algorithm::Sha256, Encoding::Hex)?;
                let sent = timestamp(&ts_header, ts)?;
                let signed: [&[u8]; 4] = [b"v0:", ts.as_bytes(), b":", body];
                let expected = mac(Algorithm::Sha256, secret, &signed);
                matches(&header, &expected, &[given])?;
                fresh(&ts_header, sent, now, *tolerance)
            }
            Scheme::Hmac(spec) => spec.verify(secret, headers, body, now),
        }
    }

    /// Sign `body` as a sender of this scheme would at `now`: the headers to send (for tests,
    /// and for `ostiary` documentation examples).
    ///
    /// # Panics
    /// If an [`HmacSpec::prefix`] holds characters a header value cannot (config validation
    /// refuses such a prefix: no delivery could carry it either).
    pub fn sign(&self, secret: &[u8], body: &[u8], now: i64) -> Vec<(HeaderName, HeaderValue)> {
        let ts = now.to_string();
        match self {
            Scheme::Github => {
                let sig = hex::encode(mac(Algorithm::Sha256, secret, &[body]));
                vec![(github_header(), header_value(format!("sha256={sig}")))]
            }
            Scheme::Stripe { .. } => {
                let signed: [&[u8]; 3] = [ts.as_bytes(), b".", body];
                let sig = hex::encode(mac(Algorithm::Sha256, secret, &signed));
                vec![(stripe_header(), header_value(format!("t={ts},v1={sig}")))]
            }
            Scheme::Slack { .. } => {
                let signed: [&[u8]; 4] = [b"v0:", ts.as_bytes(), b":", body];
                let sig = hex::encode(mac(Algorithm::Sha256, secret, &signed));
                vec![
                    (slack_timestamp_header(), header_value(ts)),
                    (slack_signature_header(), header_value(format!("v0={sig}"))),
                ]
            }
            Scheme::Hmac(spec) => spec.sign(secret, body, &ts),
        }
    }
}

impl HmacSpec {
    fn verify(
        &self,
        secret: &[u8],
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let value = single(headers, &self.header)?;
        let encoded = value
            .strip_prefix(self.prefix.as_str())
            .ok_or_else(|| malformed(&self.header, HMAC_PREFIX))?;
        let given = decode(&self.header, encoded, self.algorithm, self.encoding)?;
        match &self.timestamp_header {
            None => {
                let expected = mac(self.algorithm, secret, &[body]);
                matches(&self.header, &expected, &[given])
            }
            Some(ts_header) => {
                let ts = single(headers, ts_header)?;
                let sent = timestamp(ts_header, ts)?;
                let expected = mac(self.algorithm, secret, &[ts.as_bytes(), b".", body]);
                matches(&self.header, &expected, &[given])?;
                fresh(ts_header, sent, now, self.tolerance)
            }
        }
    }

    fn sign(&self, secret: &[u8], body: &[u8], ts: &str) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(2);
        let raw = match &self.timestamp_header {
            None => mac(self.algorithm, secret, &[body]),
            Some(ts_header) => {
                out.push((ts_header.clone(), header_value(ts.to_owned())));
                mac(self.algorithm, secret, &[ts.as_bytes(), b".", body])
            }
        };
        let encoded = match self.encoding {
            Encoding::Hex => hex::encode(raw),
            Encoding::Base64 => BASE64.encode(raw),
        };
        out.push((
            self.header.clone(),
            header_value(format!("{}{encoded}", self.prefix)),
        ));
        out
    }
}

fn malformed(header: &HeaderName, why: &'static str) -> SignatureError {
    SignatureError::Malformed {
        header: header.clone(),
        why,
    }
}

/// The one value of `name`, as text that is visible ASCII throughout.
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<&'h str, SignatureError> {
    let mut values = headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or_else(|| SignatureError::Missing(name.clone()))?;
    if values.next().is_some() {
        return Err(malformed(name, REPEATED));
    }
    if value.is_empty() {
        return Err(malformed(name, EMPTY));
    }
    // Narrower than `to_str`, which lets spaces, tabs through: no scheme writes them, and a
    // value with them is one a gateway might fold or split differently.
    value
        .to_str()
        .ok()
        .filter(|text| text.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| malformed(name, NOT_VISIBLE_ASCII))
}

/// Stripe's `t` (raw, as it is signed) and its `v1` signatures, decoded.
fn stripe_entries<'v>(
    header: &HeaderName,
    value: &'v str,
) -> Result<(&'v str, Vec<Vec<u8>>), SignatureError> {
    let mut t = None;
    let mut v1 = Vec::new();
    for entry in value.split(',') {
        let (key, val) = entry
            .split_once('=')
            .ok_or_else(|| malformed(header, STRIPE_ENTRY))?;
        match key {
            "t" if t.is_some() => return Err(malformed(header, STRIPE_TWO_T)),
            "t" => t = Some(val),
            "v1" => v1.push(decode(header, val, Algorithm::Sha256, Encoding::Hex)?),
            // v0 is Stripe's test-mode scheme, and any later one is not known to be sound.
            _ => {}
        }
    }
    let t = t.ok_or_else(|| malformed(header, STRIPE_NO_T))?;
    if v1.is_empty() {
        return Err(malformed(header, STRIPE_NO_V1));
    }
    Ok((t, v1))
}

/// The presented MAC's bytes, refused if they cannot be one of `algorithm`'s.
fn decode(
    header: &HeaderName,
    text: &str,
    algorithm: Algorithm,
    encoding: Encoding,
) -> Result<Vec<u8>, SignatureError> {
    let (bytes, wrong_length) = match (encoding, algorithm) {
        (Encoding::Hex, _) => {
            let bytes = hex::decode(text).map_err(|_not_hex| malformed(header, NOT_HEX))?;
            let why = match algorithm {
                Algorithm::Sha256 => LEN_SHA256_HEX,
                Algorithm::Sha512 => LEN_SHA512_HEX,
            };
            (bytes, why)
        }
        (Encoding::Base64, _) => {
            let bytes = BASE64
                .decode(text)
                .map_err(|_not_base64| malformed(header, NOT_BASE64))?;
            let why = match algorithm {
                Algorithm::Sha256 => LEN_SHA256_BASE64,
                Algorithm::Sha512 => LEN_SHA512_BASE64,
            };
            (bytes, why)
        }
    };
    if bytes.len() != algorithm.output_len() {
        return Err(malformed(header, wrong_length));
    }
    Ok(bytes)
}

/// A Unix time in whole seconds, written as digits only: `i64::from_str` would also take `+`,
/// and a signed value with two spellings is one more thing to reason about.
fn timestamp(header: &HeaderName, text: &str) -> Result<i64, SignatureError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(header, TS_NOT_DIGITS));
    }
    let secs: i64 = text
        .parse()
        .map_err(|_overflow: std::num::ParseIntError| malformed(header, TS_IMPLAUSIBLE))?;
    if secs > MAX_TIMESTAMP {
        return Err(malformed(header, TS_IMPLAUSIBLE));
    }
    Ok(secs)
}

fn fresh(
    header: &HeaderName,
    sent: i64,
    now: i64,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let age_secs = now.saturating_sub(sent);
    let tolerance_secs = tolerance.as_secs();
    if age_secs.unsigned_abs() > tolerance_secs {
        return Err(SignatureError::Stale {
            header: header.clone(),
            age_secs,
            tolerance_secs,
        });
    }
    Ok(())
}

/// Whether any presented MAC is `expected`. Each comparison is constant-time, so timing does not
/// reveal how much of a forgery was right, and all are made, so it does not reveal which matched.
fn matches(header: &HeaderName, expected: &[u8], given: &[Vec<u8>]) -> Result<(), SignatureError> {
    let any = given
        .iter()
        .fold(Choice::from(0), |any, one| any | expected.ct_eq(one));
    if bool::from(any) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch {
            header: header.clone(),
        })
    }
}

impl Algorithm {
    fn output_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }
}

/// HMAC of the concatenated `parts`, fed in pieces so the body is never copied.
fn mac(algorithm: Algorithm, secret: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match algorithm {
        Algorithm::Sha256 => mac_with::<Hmac<Sha256>>(secret, parts),
        Algorithm::Sha512 => mac_with::<Hmac<Sha512>>(secret, parts),
    }
}

fn mac_with<M: Mac + KeyInit>(secret: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <M as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn header_value(text: String) -> HeaderValue {
    HeaderValue::try_from(text)
        .unwrap_or_else(|_| panic!("an HMAC `prefix` holds characters no header value can"))
}

#[cfg(test)]
#[path = "signature_tests.rs"]
mod tests;
