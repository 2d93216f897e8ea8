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

/// A trie of all patterns with Aho–Corasick failure links, used only to find the longest
/// suffix of a buffer that is a proper prefix of some pattern: exactly the bytes a
/// streaming scrubber cannot release yet. (The `aho-corasick` crate does not expose state
/// depths, hence this small companion; it runs over at most `max_len - 1` bytes per frame.)
#[derive(Debug)]
pub struct PrefixTrie {
    nodes: Vec<Node>,
}

#[derive(Debug, Default)]
struct Node {
    /// Sorted by byte.
    next: Vec<(u8, u32)>,
    fail: u32,
    depth: u32,
}

impl PrefixTrie {
    pub fn new(patterns: &[Vec<u8>]) -> Self {
        let mut nodes = vec![Node::default()];
        for pattern in patterns {
            let mut at = 0usize;
            for &b in pattern {
                at = match nodes[at].next.binary_search_by_key(&b, |&(k, _)| k) {
                    Ok(i) => nodes[at].next[i].1 as usize,
                    Err(i) => {
                        let id = nodes.len();
                        let depth = nodes[at].depth + 1;
                        nodes[at].next.insert(i, (b, id as u32));
                        nodes.push(Node {
                            depth,
                            ..Node::default()
                        });
                        id
                    }
                };
            }
        }
        // Breadth-first, so a node's failure target is final before its children need it.
        let mut queue = std::collections::VecDeque::new();
        for &(_, child) in &nodes[0].next {
            queue.push_back(child);
        }
        while let Some(id) = queue.pop_front() {
            let edges = nodes[id as usize].next.clone();
            for (b, child) in edges {
                let mut f = nodes[id as usize].fail;
                let target = loop {
                    if let Some(t) = Self::step(&nodes, f, b) {
                        break t;
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = nodes[f as usize].fail;
                };
                nodes[child as usize].fail = target;
                queue.push_back(child);
            }
        }
        Self { nodes }
    }

    fn step(nodes: &[Node], at: u32, b: u8) -> Option<u32> {
        let next = &nodes[at as usize].next;
        next.binary_search_by_key(&b, |&(k, _)| k)
            .ok()
            .map(|i| next[i].1)
    }

    /// The length of the longest suffix of `window` that is a proper prefix of a pattern
    /// (a prefix some pattern continues beyond).
    pub fn held_suffix<'a>(&self, window: impl IntoIterator<Item = &'a u8>) -> usize {
        let mut at = 0u32;
        for &b in window {
            at = loop {
                if let Some(t) = Self::step(&self.nodes, at, b) {
                    break t;
                }
                if at == 0 {
                    break 0;
                }
                at = self.nodes[at as usize].fail;
            };
        }
        // A complete pattern nothing extends is not a prefix to wait on; shorter suffixes
        // in the trie are reached through the failure chain, longest first.
        while at != 0 && self.nodes[at as usize].next.is_empty() {
            at = self.nodes[at as usize].fail;
        }
        self.nodes[at as usize].depth as usize
    }
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

    #[test]
    fn held_suffix_is_the_longest_proper_prefix() {
        let trie = PrefixTrie::new(&[b"abcd".to_vec(), b"bcx".to_vec(), b"zz".to_vec()]);
        assert_eq!(trie.held_suffix(b"xxabc"), 3);
        assert_eq!(trie.held_suffix(b"xxbc"), 2);
        assert_eq!(trie.held_suffix(b"xxz"), 1);
        assert_eq!(trie.held_suffix(b"xxq"), 0);
        assert_eq!(trie.held_suffix(b""), 0);
        // "zz" is complete and nothing extends it, but its last "z" still starts one.
        assert_eq!(trie.held_suffix(b"xzz"), 1);
        // "abcd" complete: the suffix "" (no pattern continues "d", "cd", "bcd").
        assert_eq!(trie.held_suffix(b"abcd"), 0);
    }
}
