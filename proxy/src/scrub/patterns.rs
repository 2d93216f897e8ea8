//! The strings a secret can take on the wire before any character of it is escaped: its
//! raw value, its base64 and base64url forms (whole, and embedded in a larger blob at each
//! of the three byte alignments) and its hex forms. Each is then matched with every
//! character in any of its encodings ([`super::encodings`]), so `%2B`, `\u002B` and
//! `&#43;` in a base64 form are found as well as in the raw value.
//!
//! A secret spanning several lines (a PEM key) is looked for line by line: no pattern
//! holds a newline, which is what lets the streaming scrubber release lines whole
//! ([`super::stream`]); its lines shorter than [`MIN_VARIANT_LEN`] are not looked for. A
//! form an encoder wrapped across lines is found by searching without the breaks
//! ([`super::wrapped`]).

use base64::alphabet::{Alphabet, STANDARD, URL_SAFE};
use base64::engine::general_purpose::{GeneralPurpose, NO_PAD, PAD};
use base64::Engine;

/// Secrets shorter than this get no encoded variants: their base64 fragments would be two
/// or three characters long and match everywhere.
pub const MIN_VARIANT_LEN: usize = 4;

/// One string a secret can take, before its characters are escaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Form {
    pub text: String,
    /// Whether its characters may come back escaped (not for hex: only digits and
    /// letters, which no encoder escapes).
    pub escapable: bool,
}

/// Every form that stands for `secret`, deduplicated, none empty, none holding a newline.
pub fn variants(secret: &str) -> Vec<Form> {
    let mut out: Vec<Form> = Vec::new();
    let mut push = |text: String, escapable: bool| {
        if !text.is_empty() && !text.contains('\n') && !out.iter().any(|f| f.text == text) {
            out.push(Form { text, escapable });
        }
    };
    if secret.is_empty() {
        return out;
    }
    if secret.contains('\n') {
        for line in secret.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.len() >= MIN_VARIANT_LEN {
                push(line.to_owned(), true);
                variants_of(line.as_bytes(), &mut push);
            }
        }
    } else {
        push(secret.to_owned(), true);
    }
    if secret.len() >= MIN_VARIANT_LEN {
        variants_of(secret.as_bytes(), &mut push);
    }
    out
}

/// The base64 and hex forms of `raw`.
fn variants_of(raw: &[u8], push: &mut impl FnMut(String, bool)) {
    for alphabet in [&STANDARD, &URL_SAFE] {
        for form in base64_forms(alphabet, raw) {
            push(form, true);
        }
    }
    push(hex::encode(raw), false);
    push(hex::encode_upper(raw), false);
}

/// The base64 forms of `secret` in one alphabet: the whole encoding padded and unpadded,
/// and for each of the three alignments the characters that depend on the secret's bits
/// alone — what any base64 blob with the secret at that alignment must contain.
fn base64_forms(alphabet: &Alphabet, secret: &[u8]) -> Vec<String> {
    let padded = GeneralPurpose::new(alphabet, PAD);
    let unpadded = GeneralPurpose::new(alphabet, NO_PAD);
    let mut forms = vec![padded.encode(secret), unpadded.encode(secret)];
    for shift in 0..3usize {
        let mut shifted = vec![0u8; shift];
        shifted.extend_from_slice(secret);
        let encoded = unpadded.encode(&shifted);
        // Character i covers bits 6i..6i+6; the secret covers bits 8·shift..8·(shift+len).
        let start = (8 * shift).div_ceil(6);
        let end = (8 * (shift + secret.len())) / 6;
        if end > start {
            forms.push(encoded[start..end].to_owned());
        }
    }
    forms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    fn texts(secret: &str) -> Vec<String> {
        variants(secret).into_iter().map(|f| f.text).collect()
    }

    #[test]
    fn short_secrets_get_only_their_raw_form() {
        assert_eq!(texts(""), Vec::<String>::new());
        assert_eq!(texts("abc"), vec!["abc".to_owned()]);
        assert_eq!(texts("a b"), vec!["a b".to_owned()]);
    }

    #[test]
    fn base64_at_every_alignment_inside_a_larger_blob_contains_a_pattern() {
        let secret = "s3cr3t-t0ken/with+odd?chars";
        let pats = texts(secret);
        for prefix_len in 0..7 {
            for suffix_len in 0..4 {
                let mut blob = b"xxxxxxx"[..prefix_len].to_vec();
                blob.extend_from_slice(secret.as_bytes());
                blob.extend_from_slice(&b"yyy"[..suffix_len]);
                for engine in [
                    base64::engine::general_purpose::STANDARD,
                    base64::engine::general_purpose::URL_SAFE,
                    base64::engine::general_purpose::STANDARD_NO_PAD,
                    base64::engine::general_purpose::URL_SAFE_NO_PAD,
                ] {
                    let enc = engine.encode(&blob).into_bytes();
                    assert!(
                        pats.iter().any(|p| contains(&enc, p.as_bytes())),
                        "prefix {prefix_len} suffix {suffix_len}"
                    );
                }
            }
        }
    }

    #[test]
    fn hex_forms_in_both_cases() {
        let pats = texts("k+y/");
        assert!(pats.contains(&"6b2b792f".to_owned()), "{pats:?}");
        assert!(pats.contains(&"6B2B792F".to_owned()), "{pats:?}");
    }

    #[test]
    fn a_multi_line_secret_is_looked_for_line_by_line() {
        let pem =
            "-----BEGIN KEY-----\r\nMIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAw\nab\n-----END KEY-----\n";
        let pats = texts(pem);
        assert!(pats.iter().all(|p| !p.contains('\n')), "{pats:?}");
        assert!(pats.contains(&"-----BEGIN KEY-----".to_owned()));
        assert!(pats.contains(&"MIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAw".to_owned()));
        // Too short to look for on its own.
        assert!(!pats.contains(&"ab".to_owned()));
        // The whole value's base64 (one line) is still a form.
        let whole = base64::engine::general_purpose::STANDARD.encode(pem);
        assert!(pats.contains(&whole));
    }
}
