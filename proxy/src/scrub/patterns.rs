//! The byte strings a secret can take on the wire, and the prefix automaton that tells the
//! streaming scrubber how much of a chunk's tail it must hold back.
//!
//! An upstream that echoes a credential rarely echoes it verbatim only: it may appear
//! base64-encoded (basic auth, JWT-ish blobs, a JSON document embedded in base64), inside a
//! larger base64 blob at any of the three byte alignments, or percent-encoded in a
//! redirect URL. Every form listed here is replaced.

use base64::alphabet::{Alphabet, STANDARD, URL_SAFE};
use base64::engine::general_purpose::{GeneralPurpose, NO_PAD, PAD};
use base64::Engine;

/// Secrets shorter than this get no encoded variants: their base64 fragments would be two
/// or three characters long and match everywhere.
pub const MIN_VARIANT_LEN: usize = 4;

/// Every pattern that stands for `secret`, deduplicated, none empty.
pub fn variants(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut push = |p: Vec<u8>| {
        if !p.is_empty() && !out.contains(&p) {
            out.push(p);
        }
    };
    if secret.is_empty() {
        return out;
    }
    push(secret.to_vec());
    for p in percent_variants(secret) {
        push(p);
    }
    // JSON encoders that escape `/` (PHP's default) echo `a\/b` for `a/b`.
    if secret.contains(&b'/') {
        let escaped: Vec<u8> = secret
            .iter()
            .flat_map(|b| {
                if *b == b'/' {
                    vec![b'\\', b'/']
                } else {
                    vec![*b]
                }
            })
            .collect();
        push(escaped);
    }
    if secret.len() < MIN_VARIANT_LEN {
        return out;
    }
    for alphabet in [&STANDARD, &URL_SAFE] {
        for form in base64_forms(alphabet, secret) {
            // `+`, `/` and `=` of the standard alphabet turn into `%2B`… in a query string.
            if std::ptr::eq(alphabet, &STANDARD) {
                for p in percent_variants(&form) {
                    push(p);
                }
            }
            push(form);
        }
    }
    out
}

/// The base64 forms of `secret` in one alphabet: the whole encoding padded and unpadded,
/// and for each of the three alignments the characters that depend on the secret's bits
/// alone — what any base64 blob with the secret at that alignment must contain.
fn base64_forms(alphabet: &Alphabet, secret: &[u8]) -> Vec<Vec<u8>> {
    let padded = GeneralPurpose::new(alphabet, PAD);
    let unpadded = GeneralPurpose::new(alphabet, NO_PAD);
    let mut forms = vec![
        padded.encode(secret).into_bytes(),
        unpadded.encode(secret).into_bytes(),
    ];
    for shift in 0..3usize {
        let mut shifted = vec![0u8; shift];
        shifted.extend_from_slice(secret);
        let encoded = unpadded.encode(&shifted).into_bytes();
        // Character i covers bits 6i..6i+6; the secret covers bits 8·shift..8·(shift+len).
        let start = (8 * shift).div_ceil(6);
        let end = (8 * (shift + secret.len())) / 6;
        if end > start {
            forms.push(encoded[start..end].to_vec());
        }
    }
    forms
}

/// Percent-encodings of `raw` that differ from it: RFC 3986 unreserved kept (upper and
/// lower case hex), `encodeURIComponent` style, and form encoding (space as `+`).
fn percent_variants(raw: &[u8]) -> Vec<Vec<u8>> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    let component = |b: u8| unreserved(b) || matches!(b, b'!' | b'\'' | b'(' | b')' | b'*');
    let form = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'*' | b'-' | b'.' | b'_');
    let mut out = Vec::new();
    for (keep, upper, plus) in [
        (&unreserved as &dyn Fn(u8) -> bool, true, false),
        (&unreserved, false, false),
        (&component, true, false),
        (&form, true, true),
    ] {
        let encoded = percent_encode(raw, keep, upper, plus);
        if encoded != raw && !out.contains(&encoded) {
            out.push(encoded);
        }
    }
    out
}

fn percent_encode(raw: &[u8], keep: &dyn Fn(u8) -> bool, upper: bool, plus: bool) -> Vec<u8> {
    let digits: &[u8; 16] = if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut out = Vec::with_capacity(raw.len() * 3);
    for &b in raw {
        if keep(b) {
            out.push(b);
        } else if plus && b == b' ' {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[
                b'%',
                digits[usize::from(b >> 4)],
                digits[usize::from(b & 15)],
            ]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn short_secrets_get_only_raw_and_percent_forms() {
        assert_eq!(variants(b""), Vec::<Vec<u8>>::new());
        assert_eq!(variants(b"abc"), vec![b"abc".to_vec()]);
        assert_eq!(
            variants(b"a b"),
            vec![b"a b".to_vec(), b"a%20b".to_vec(), b"a+b".to_vec()]
        );
    }

    #[test]
    fn base64_at_every_alignment_inside_a_larger_blob_contains_a_pattern() {
        let secret = b"s3cr3t-t0ken/with+odd?chars";
        let pats = variants(secret);
        for prefix_len in 0..7 {
            for suffix_len in 0..4 {
                let mut blob = b"xxxxxxx"[..prefix_len].to_vec();
                blob.extend_from_slice(secret);
                blob.extend_from_slice(&b"yyy"[..suffix_len]);
                for engine in [
                    base64::engine::general_purpose::STANDARD,
                    base64::engine::general_purpose::URL_SAFE,
                    base64::engine::general_purpose::STANDARD_NO_PAD,
                    base64::engine::general_purpose::URL_SAFE_NO_PAD,
                ] {
                    let enc = engine.encode(&blob).into_bytes();
                    assert!(
                        pats.iter().any(|p| contains(&enc, p)),
                        "prefix {prefix_len} suffix {suffix_len}"
                    );
                }
            }
        }
    }

    #[test]
    fn percent_forms_cover_common_encoders() {
        let pats = variants(b"p@ss w/rd!");
        for form in [
            &b"p%40ss%20w%2Frd%21"[..],
            b"p%40ss%20w%2frd%21",
            b"p%40ss%20w%2Frd!",
            b"p%40ss+w%2Frd%21",
        ] {
            assert!(
                pats.iter().any(|p| p == form),
                "{}",
                String::from_utf8_lossy(form)
            );
        }
    }
}
