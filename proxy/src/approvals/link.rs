//! Signed review-page links (`GET /approve/<token>`): the token binds one approval to one
//! approver until an expiry, and carries a fresh nonce that the store consumes on the first
//! decision, so a link is single-use even though it travels through mailboxes and Slack.
//!
//! Why it looks the way it does:
//! - The token is one base64url (no padding) blob, so it fits in a path segment untouched by
//!   mail clients and URL normalizers (no `/`, `+`, `=`, `.`).
//! - Its fields are length-prefixed binary, never a delimited string: no id or approver text
//!   can be crafted to shift a field boundary and make one signed token read as another.
//! - The MAC input starts with a purpose and version label, so a MAC made here can never
//!   be taken for another HMAC use of the same key (and a future format cannot be confused
//!   with this one).
//! - Length is capped before any work, and the MAC is checked (in constant time) before a
//!   single payload byte is interpreted: a forger gets nothing but "bad signature".
//! - Errors say why, never echo the token: it is a bearer credential until used.
//!
//! Layout of the decoded bytes:
//! ```text
//! version u8 = 1 | nonce [16] | expires_ms i64 BE | id_len u16 BE | id | approver_len u16 BE | approver | mac [32]
//! mac = HMAC-SHA256(key, "ostiary approval-link v1\0" || everything before mac)
//! ```

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Domain separation for the MAC: changes with the layout.
const PURPOSE: &[u8] = b"ostiary approval-link v1\0";
const VERSION: u8 = 1;
const NONCE_LEN: usize = 16;
const MAC_LEN: usize = 32;
/// version + nonce + expiry + two length prefixes.
const FIXED_LEN: usize = 1 + NONCE_LEN + 8 + 2 + 2;

/// Longest token (characters) looked at; longer ones are refused before decoding.
/// Approval ids and approver names are short, so real tokens stay far below this.
pub const MAX_TOKEN_LEN: usize = 2048;

/// The longest id or approver (bytes) that still yields a token under [`MAX_TOKEN_LEN`].
pub const MAX_FIELD_LEN: usize = 512;

/// Issues and verifies review-page tokens with the state directory's link key.
#[derive(Clone)]
pub struct LinkSigner {
    /// Keyed once; cloned per token so the key schedule is not redone.
    mac: HmacSha256,
}

impl fmt::Debug for LinkSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LinkSigner(***)")
    }
}

/// What a verified token says. The caller still checks that the approval exists and is
/// pending, that `approver` is listed, and consumes `nonce` in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkClaims {
    pub approval_id: String,
    pub approver: String,
    pub expires_ms: i64,
    /// 32 lowercase hex characters (128 random bits), unique per issued link.
    pub nonce: String,
}

/// Why a token was refused. None of them carries the token itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Not a token this proxy could have issued (length, encoding, layout).
    #[error("malformed approval link: {0}")]
    Malformed(&'static str),
    /// Not base64url at all (the decoder says where; it never echoes the input).
    #[error("malformed approval link: {0}")]
    Encoding(#[from] base64::DecodeError),
    /// A text field that is not UTF-8 (only a forged layout could carry one).
    #[error("malformed approval link: {0}")]
    Utf8(#[from] std::string::FromUtf8Error),
    /// Well-formed but not signed with this proxy's key, or altered.
    #[error("approval link signature does not verify")]
    BadSignature(#[from] hmac::digest::MacError),
    /// Genuine, but past its expiry.
    #[error("approval link expired at {expires_ms} ms since the epoch")]
    Expired { expires_ms: i64 },
}

impl LinkSigner {
    /// `key` is the secret from the state directory (32 random bytes); HMAC accepts any
    /// length, but a short key makes links forgeable, hence the debug check.
    pub fn new(key: &[u8]) -> Self {
        debug_assert!(key.len() >= 16, "link key shorter than 128 bits");
        let mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
        Self { mac }
    }

    /// A token for `approver` to decide `approval_id` until `expires_ms` (ms since epoch).
    ///
    /// Ids and approver names come from the store and the config and are short; one longer
    /// than [`MAX_FIELD_LEN`] bytes would give a token that [`verify`](Self::verify) refuses
    /// as oversized, which the debug check catches in tests.
    pub fn issue(&self, approval_id: &str, approver: &str, expires_ms: i64) -> String {
        debug_assert!(approval_id.len() <= MAX_FIELD_LEN && approver.len() <= MAX_FIELD_LEN);
        let nonce: [u8; NONCE_LEN] = rand::random();
        let mut bytes =
            Vec::with_capacity(FIXED_LEN + approval_id.len() + approver.len() + MAC_LEN);
        bytes.push(VERSION);
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&expires_ms.to_be_bytes());
        push_field(&mut bytes, approval_id);
        push_field(&mut bytes, approver);
        let tag = self.tag(&bytes).finalize().into_bytes();
        bytes.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Checks a token at `now_ms`: length, encoding, MAC, then layout, then expiry.
    pub fn verify(&self, token: &str, now_ms: i64) -> Result<LinkClaims, LinkError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(LinkError::Malformed("longer than any issued link"));
        }
        let bytes = URL_SAFE_NO_PAD.decode(token)?;
        if bytes.len() < FIXED_LEN + MAC_LEN {
            return Err(LinkError::Malformed("too short"));
        }
        let (signed, mac) = bytes.split_at(bytes.len() - MAC_LEN);
        self.tag(signed).verify_slice(mac)?;
        // Authentic from here on: only this proxy's key could have produced these bytes.
        let claims = parse(signed)?;
        if now_ms >= claims.expires_ms {
            return Err(LinkError::Expired {
                expires_ms: claims.expires_ms,
            });
        }
        Ok(claims)
    }

    fn tag(&self, signed: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(PURPOSE);
        mac.update(signed);
        mac
    }
}

fn push_field(bytes: &mut Vec<u8>, text: &str) {
    // Saturating: an absurd field makes a token that fails to parse, never a shifted one.
    let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes.extend_from_slice(text.as_bytes());
}

/// Reads the signed part; every check is on bytes the MAC already vouched for.
fn parse(signed: &[u8]) -> Result<LinkClaims, LinkError> {
    let mut r = Reader(signed);
    if r.take(1)?[0] != VERSION {
        return Err(LinkError::Malformed("unknown version"));
    }
    let nonce = hex::encode(r.take(NONCE_LEN)?);
    let expires_ms = i64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
    let approval_id = r.field()?;
    let approver = r.field()?;
    if !r.0.is_empty() {
        return Err(LinkError::Malformed("trailing bytes"));
    }
    if approval_id.is_empty() || approver.is_empty() {
        return Err(LinkError::Malformed("empty approval id or approver"));
    }
    Ok(LinkClaims {
        approval_id,
        approver,
        expires_ms,
        nonce,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], LinkError> {
        if self.0.len() < n {
            return Err(LinkError::Malformed("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn field(&mut self) -> Result<String, LinkError> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes"));
        let raw = self.take(usize::from(len))?;
        Ok(String::from_utf8(raw.to_vec())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::digest::MacError;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: i64 = 1_800_000_000_000;
    const LATER: i64 = NOW + 3_600_000;

    fn signer() -> LinkSigner {
        LinkSigner::new(KEY)
    }

    fn raw(token: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(token).unwrap()
    }

    /// Signs arbitrary bytes the way `issue` does, to build tokens a real key holder
    /// could have made (for checks that run after the MAC).
    fn sign_raw(signed: &[u8]) -> String {
        let mut bytes = signed.to_vec();
        bytes.extend_from_slice(&signer().tag(signed).finalize().into_bytes());
        URL_SAFE_NO_PAD.encode(bytes)
    }

    #[test]
    fn roundtrip() {
        let s = signer();
        let token = s.issue("apr_123", "alice@example.com", LATER);
        let claims = s.verify(&token, NOW).unwrap();
        assert_eq!(claims.approval_id, "apr_123");
        assert_eq!(claims.approver, "alice@example.com");
        assert_eq!(claims.expires_ms, LATER);
        assert_eq!(claims.nonce.len(), 32);
        assert!(claims.nonce.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn token_is_one_path_segment_and_nonces_differ() {
        let s = signer();
        let a = s.issue("apr_1", "bob", LATER);
        let b = s.issue("apr_1", "bob", LATER);
        for t in [&a, &b] {
            assert!(t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        }
        assert_ne!(a, b);
        assert_ne!(
            s.verify(&a, NOW).unwrap().nonce,
            s.verify(&b, NOW).unwrap().nonce
        );
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let s = signer();
        let token = s.issue("apr_123", "alice", LATER);
        let bytes = raw(&token);
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut t = bytes.clone();
                t[i] ^= bit;
                let err = s.verify(&URL_SAFE_NO_PAD.encode(&t), NOW).unwrap_err();
                assert_eq!(
                    err,
                    LinkError::BadSignature(MacError),
                    "byte {i} bit {bit:#x}"
                );
            }
        }
    }

    #[test]
    fn every_changed_character_is_refused() {
        let s = signer();
        let token = s.issue("apr_123", "alice", LATER);
        for i in 0..token.len() {
            let mut t = token.clone().into_bytes();
            t[i] = if t[i] == b'A' { b'B' } else { b'A' };
            let t = String::from_utf8(t).unwrap();
            assert!(s.verify(&t, NOW).is_err(), "character {i}");
        }
    }

    #[test]
    fn other_key_is_refused() {
        let token = signer().issue("apr_123", "alice", LATER);
        let other = LinkSigner::new(b"another key, also 32 bytes long!");
        assert_eq!(
            other.verify(&token, NOW),
            Err(LinkError::BadSignature(MacError))
        );
    }

    #[test]
    fn expired_is_refused_after_the_signature_checks() {
        let s = signer();
        let token = s.issue("apr_123", "alice", NOW);
        assert_eq!(
            s.verify(&token, NOW),
            Err(LinkError::Expired { expires_ms: NOW })
        );
        assert!(s.verify(&token, NOW - 1).is_ok());
        // A forged token with a far expiry is a bad signature, not "expired".
        let mut bytes = raw(&token);
        bytes[1 + NONCE_LEN] ^= 0x40;
        assert_eq!(
            s.verify(&URL_SAFE_NO_PAD.encode(&bytes), NOW),
            Err(LinkError::BadSignature(MacError))
        );
    }

    #[test]
    fn truncated_is_refused() {
        let s = signer();
        let token = s.issue("apr_123", "alice", LATER);
        for len in 0..token.len() {
            assert!(s.verify(&token[..len], NOW).is_err(), "length {len}");
        }
        let bytes = raw(&token);
        for len in 0..bytes.len() {
            assert!(matches!(
                s.verify(&URL_SAFE_NO_PAD.encode(&bytes[..len]), NOW),
                Err(LinkError::Malformed(_) | LinkError::BadSignature(MacError))
            ));
        }
    }

    #[test]
    fn garbage_is_malformed() {
        let s = signer();
        for t in [
            "",
            "not a token",
            "abc/def",
            "abc+def",
            "abc=",
            "a.b.c",
            "%41%41",
            "\u{0}\u{1}",
            "ÿÿÿÿ",
        ] {
            assert!(
                matches!(
                    s.verify(t, NOW),
                    Err(LinkError::Malformed(_) | LinkError::Encoding(_))
                ),
                "{t:?}"
            );
        }
        // Decodes, long enough, but not signed.
        let noise = URL_SAFE_NO_PAD.encode([7u8; 120]);
        assert_eq!(
            s.verify(&noise, NOW),
            Err(LinkError::BadSignature(MacError))
        );
    }

    #[test]
    fn oversized_is_refused_before_decoding() {
        let s = signer();
        let long = "A".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(
            s.verify(&long, NOW),
            Err(LinkError::Malformed("longer than any issued link"))
        );
        // The largest fields allowed still make a verifiable token.
        let id = "i".repeat(MAX_FIELD_LEN);
        let who = "w".repeat(MAX_FIELD_LEN);
        let token = s.issue(&id, &who, LATER);
        assert!(token.len() <= MAX_TOKEN_LEN);
        assert_eq!(s.verify(&token, NOW).unwrap().approver, who);
    }

    #[test]
    fn parts_swapped_between_two_tokens_are_refused() {
        let s = signer();
        let a = raw(&s.issue("apr_A", "alice", LATER));
        let b = raw(&s.issue("apr_B", "mallory", LATER));
        // Same lengths, so the fields sit at the same offsets in both tokens.
        let header = 1 + NONCE_LEN + 8;
        let id_end = header + 2 + "apr_A".len();
        let mac_at = a.len() - MAC_LEN;
        assert_eq!(a.len(), b.len() + "alice".len() - "mallory".len());
        let mut mixes = Vec::new();
        // A's approval with B's approver, under either MAC.
        let mut a_id_b_who = a[..id_end].to_vec();
        a_id_b_who.extend_from_slice(&b[id_end..b.len() - MAC_LEN]);
        mixes.push([a_id_b_who.as_slice(), &a[mac_at..]].concat());
        mixes.push([a_id_b_who.as_slice(), &b[b.len() - MAC_LEN..]].concat());
        // B's approval with A's approver, under either MAC.
        let mut b_id_a_who = b[..id_end].to_vec();
        b_id_a_who.extend_from_slice(&a[id_end..mac_at]);
        mixes.push([b_id_a_who.as_slice(), &a[mac_at..]].concat());
        mixes.push([b_id_a_who.as_slice(), &b[b.len() - MAC_LEN..]].concat());
        // A's nonce in B's token.
        let mut b_with_a_nonce = b.clone();
        b_with_a_nonce[1..1 + NONCE_LEN].copy_from_slice(&a[1..1 + NONCE_LEN]);
        mixes.push(b_with_a_nonce);
        for (n, mix) in mixes.iter().enumerate() {
            assert_eq!(
                s.verify(&URL_SAFE_NO_PAD.encode(mix), NOW),
                Err(LinkError::BadSignature(MacError)),
                "mix {n}"
            );
        }
    }

    #[test]
    fn signed_but_ill_formed_payloads_are_malformed() {
        let s = signer();
        let mut good = vec![VERSION];
        good.extend_from_slice(&[0u8; NONCE_LEN]);
        good.extend_from_slice(&LATER.to_be_bytes());
        push_field(&mut good, "apr");
        push_field(&mut good, "alice");
        assert!(s.verify(&sign_raw(&good), NOW).is_ok());

        let mut wrong_version = good.clone();
        wrong_version[0] = 2;
        let mut trailing = good.clone();
        trailing.push(0);
        let mut short_field = good.clone();
        short_field.pop();
        let mut not_utf8 = good.clone();
        let last = not_utf8.len() - 1;
        not_utf8[last] = 0xff;
        let mut empty = good[..FIXED_LEN - 4].to_vec();
        push_field(&mut empty, "");
        push_field(&mut empty, "alice");
        for bytes in [wrong_version, trailing, short_field, not_utf8, empty] {
            assert!(matches!(
                s.verify(&sign_raw(&bytes), NOW),
                Err(LinkError::Malformed(_) | LinkError::Utf8(_))
            ));
        }
    }

    #[test]
    fn the_purpose_label_is_part_of_the_mac() {
        // A bare HMAC of the same bytes (another use of the key) is not a valid link.
        let s = signer();
        let token = s.issue("apr_123", "alice", LATER);
        let bytes = raw(&token);
        let (signed, _) = bytes.split_at(bytes.len() - MAC_LEN);
        let mut bare = HmacSha256::new_from_slice(KEY).unwrap();
        bare.update(signed);
        let forged = [signed, &bare.finalize().into_bytes()].concat();
        assert_eq!(
            s.verify(&URL_SAFE_NO_PAD.encode(forged), NOW),
            Err(LinkError::BadSignature(MacError))
        );
    }

    #[test]
    fn errors_never_echo_the_token() {
        let s = signer();
        let token = s.issue("apr_secret_id", "alice", NOW);
        for err in [
            s.verify(&token, NOW).unwrap_err(),
            s.verify(&format!("{token}x"), NOW).unwrap_err(),
            s.verify(&format!("{token}A"), NOW).unwrap_err(),
        ] {
            let text = err.to_string();
            assert!(
                !text.contains(&token[..20]) && !text.contains("apr_secret_id"),
                "{text}"
            );
        }
        assert_eq!(format!("{s:?}"), "LinkSigner(***)");
    }
}
