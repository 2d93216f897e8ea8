//! [`PartNames`]: the names multipart parsers give a body's parts, found as it streams,
//! each asked whether it [names an override](super::names_override).
//!
//! The reader does not parse parts by the boundary: parsers disagree on which `boundary`
//! parameter counts, on line ends, on folded headers and on where a part's head ends, and
//! a reader that picked one parser's answer would miss the others'. It reads wider than any
//! of them instead. Every `Content-Disposition` or `Content-ID` (any case, anywhere: Rack's
//! patterns are not anchored to a line) opens a *head* that runs to the next blank line
//! (`\n\n` or `\n\r\n`), or [`HEAD_LIMIT`] bytes. In a head, every `name` parameter is a
//! candidate, in each spelling a parser may decode: quoted (with `\` escapes or as
//! written), `%XX`-decoded (browsers write `"` as `%22`), RFC 2231's `name*=utf-8''…` and
//! its continuations `name*0`, `name*1`… joined. Rack 2 names a part without a
//! `Content-Disposition` name by its `Content-ID`, so the head's first line is a candidate
//! too. A file whose text carries such a header with such a name is refused as well:
//! that is the price of not guessing which parser the upstream runs.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder};

use super::{names_override, percent_decoded, Reader};

/// How much of a head is read; the rest of an over-long one is not.
const HEAD_LIMIT: usize = 64 * 1024;

/// The headers that name a part.
static MARKERS: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .build(["content-disposition", "content-id"])
        .expect("two literal patterns")
});

/// The longest marker, less one: what must be kept of a chunk's end to find one cut in two.
const CARRY: usize = "content-disposition".len() - 1;

/// `name`, any case: where each parameter candidate starts.
static NAME: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .build(["name"])
        .expect("one literal pattern")
});

/// The part names of a multipart body, read as it streams.
#[derive(Debug, Default)]
pub struct PartNames {
    /// The last bytes read outside a head, for a marker cut between chunks.
    carry: Vec<u8>,
    /// Inside a head: its bytes so far.
    head: Option<Vec<u8>>,
    found: bool,
}

impl Reader for PartNames {
    fn push(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() && !self.found {
            bytes = match self.head.take() {
                Some(head) => self.in_head(head, bytes),
                None => self.outside(bytes),
            };
        }
        self.found
    }

    /// A head cut off by the end is judged as it is.
    fn finish(&mut self) -> bool {
        if let Some(head) = self.head.take() {
            self.found |= head_names_override(&head);
        }
        self.found
    }
}

impl PartNames {
    /// Look for a marker; what follows the first one is a head.
    fn outside<'b>(&mut self, bytes: &'b [u8]) -> &'b [u8] {
        // A marker cut between the previous chunk and this one.
        let edge: Vec<u8> = self
            .carry
            .iter()
            .chain(&bytes[..bytes.len().min(CARRY)])
            .copied()
            .collect();
        let straddling = MARKERS
            .find_iter(&edge)
            .find(|m| m.start() < self.carry.len() && m.end() > self.carry.len());
        let end = match straddling {
            Some(m) => Some(m.end() - self.carry.len()),
            None => MARKERS.find(bytes).map(|m| m.end()),
        };
        match end {
            Some(end) => {
                self.carry.clear();
                self.head = Some(Vec::new());
                &bytes[end..]
            }
            None => {
                let keep = edge.len().min(CARRY);
                self.carry = edge[edge.len() - keep..].to_vec();
                if bytes.len() > CARRY {
                    self.carry = bytes[bytes.len() - CARRY..].to_vec();
                }
                &[]
            }
        }
    }

    /// Add to a head until its blank line or its limit; judge it once it ends.
    fn in_head<'b>(&mut self, mut head: Vec<u8>, bytes: &'b [u8]) -> &'b [u8] {
        let from = head.len().saturating_sub(2);
        let taken = bytes.len().min(HEAD_LIMIT - head.len());
        head.extend_from_slice(&bytes[..taken]);
        let ended = blank_line_end(&head[from..]).map(|end| from + end);
        let rest = match ended {
            Some(end) => {
                let after = head.len() - end;
                head.truncate(end);
                &bytes[taken - after..]
            }
            None if head.len() >= HEAD_LIMIT => &bytes[taken..],
            None => {
                self.head = Some(head);
                return &[];
            }
        };
        self.found |= head_names_override(&head);
        rest
    }
}

/// Where the first blank line in `bytes` ends (just past its `\n`).
fn blank_line_end(bytes: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', bytes).find_map(|at| match bytes.get(at + 1..) {
        Some([b'\n', ..]) => Some(at + 2),
        Some([b'\r', b'\n', ..]) => Some(at + 3),
        _ => None,
    })
}

/// Whether a head (what follows a marker) names its part as an override.
fn head_names_override(head: &[u8]) -> bool {
    let first_line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    // `Content-ID: _method`: the value after the colon.
    let content_id = first_line
        .trim_ascii()
        .strip_prefix(b":")
        .unwrap_or(first_line);
    if names_override(content_id) {
        return true;
    }
    let mut continued = Vec::new();
    for at in NAME.find_iter(head) {
        let Some(param) = Param::at(head, at.end()) else {
            continue;
        };
        if param.spellings().iter().any(|name| names_override(name)) {
            return true;
        }
        if param.section {
            continued.extend(param.decoded());
        }
    }
    !continued.is_empty() && names_override(&continued)
}

/// One `name` parameter's value, as written after the `=`.
#[derive(Debug)]
struct Param<'h> {
    /// Inside the quotes if quoted.
    raw: &'h [u8],
    quoted: bool,
    /// `name*…*=` or `name*=`: RFC 2231's `charset'language'%XX…`.
    extended: bool,
    /// `name*0`, `name*1`…: one section of a continued value.
    section: bool,
}

impl<'h> Param<'h> {
    /// The parameter whose name ends at `i`, if an `=` follows.
    fn at(head: &'h [u8], mut i: usize) -> Option<Self> {
        let (mut extended, mut section) = (false, false);
        if head.get(i) == Some(&b'*') {
            i += 1;
            let digits = head[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == 0 {
                extended = true;
            } else {
                section = true;
                i += digits;
                if head.get(i) == Some(&b'*') {
                    extended = true;
                    i += 1;
                }
            }
        }
        i += blanks(&head[i..]);
        if head.get(i) != Some(&b'=') {
            return None;
        }
        i += 1;
        i += blanks(&head[i..]);
        let value = &head[i..];
        if let Some(inner) = value.strip_prefix(b"\"") {
            // To the first quote not escaped; an unclosed one runs to the head's end.
            let mut end = 0;
            while end < inner.len() && inner[end] != b'"' {
                end += if inner[end] == b'\\' { 2 } else { 1 };
            }
            return Some(Self {
                raw: &inner[..end.min(inner.len())],
                quoted: true,
                extended,
                section,
            });
        }
        let end = value
            .iter()
            .position(|&b| b.is_ascii_whitespace() || b == b';' || b == b',')
            .unwrap_or(value.len());
        Some(Self {
            raw: &value[..end],
            quoted: false,
            extended,
            section,
        })
    }

    /// `\x` as `x` in a quoted value.
    fn unescaped(&self) -> Vec<u8> {
        if !self.quoted {
            return self.raw.to_vec();
        }
        let mut out = Vec::with_capacity(self.raw.len());
        let mut bytes = self.raw.iter();
        while let Some(&b) = bytes.next() {
            out.push(if b == b'\\' {
                bytes.next().copied().unwrap_or(b)
            } else {
                b
            });
        }
        out
    }

    /// The value as an RFC 2231 reader takes it: past `charset'language'` if extended,
    /// `%XX`-decoded.
    fn decoded(&self) -> Vec<u8> {
        let value = self.unescaped();
        let value = if self.extended {
            let mut quotes = value.splitn(3, |&b| b == b'\'');
            match (quotes.next(), quotes.next(), quotes.next()) {
                (Some(_), Some(_), Some(text)) => text.to_vec(),
                _ => value,
            }
        } else {
            value
        };
        percent_decoded(&value)
    }

    /// Every spelling some parser reads the value as.
    fn spellings(&self) -> [Vec<u8>; 4] {
        let unescaped = self.unescaped();
        let decoded = percent_decoded(&unescaped);
        [self.raw.to_vec(), unescaped, decoded, self.decoded()]
    }
}

/// The blanks (folded line ends included) at the start of `bytes`.
fn blanks(bytes: &[u8]) -> usize {
    bytes.iter().take_while(|b| b.is_ascii_whitespace()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(body: &str) -> bool {
        super::super::tests::read_every_way::<PartNames>(body)
    }

    fn part(head: &str) -> String {
        format!("--XyZ\r\n{head}\r\n\r\nDELETE\r\n--XyZ--\r\n")
    }

    #[test]
    fn every_spelling_of_a_part_named_as_an_override_is_found_wherever_the_stream_is_cut() {
        for head in [
            "Content-Disposition: form-data; name=\"_method\"",
            "content-disposition: form-data; name=_method",
            "CONTENT-DISPOSITION: form-data; NAME=\"_METHOD\"",
            "Content-Disposition: form-data; name = \"_method\"",
            "Content-Disposition: form-data;\r\n name=\"_method\"",
            "Content-Disposition: form-data; name=\"%5Fmethod\"",
            "Content-Disposition: form-data; name=\"_meth\\od\"",
            "Content-Disposition: form-data; name*=utf-8''%5Fmethod",
            "Content-Disposition: form-data; name*=UTF-8'en'_method",
            "Content-Disposition: form-data; name*0=\"_me\"; name*1=\"thod\"",
            "Content-Disposition: form-data; name*0*=utf-8''%5Fme; name*1*=thod",
            "Content-Disposition: form-data; name=\".method\"",
            "Content-Disposition: form-data; name=\"[method\"",
            "Content-Disposition: form-data; name=\"_method[]\"",
            "Content-Disposition: form-data; name=\" _method\"",
            "Content-Type: text/plain\r\nContent-Disposition: form-data; name=\"_method\"",
            "Content-Disposition: form-data; name=\"a\"\r\nContent-Disposition: form-data; name=\"_method\"",
            "Content-Disposition: form-data; name=\"a\"\nX: y\r\nContent-ID: x\r\nZ: name=_method",
            "Content-ID: _method",
            "Content-ID:_method",
            "X-Content-Disposition: name=_method",
        ] {
            assert!(found(&part(head)), "{head:?}");
        }
        // LF-only line ends, and a part with no blank line before the body's end.
        assert!(found(
            "--b\nContent-Disposition: form-data; name=_method\n\nDELETE\n--b--\n"
        ));
        assert!(found(
            "--b\r\nContent-Disposition: form-data; name=\"_method"
        ));
    }

    #[test]
    fn other_names_files_and_values_are_not_overrides() {
        for body in [
            part("Content-Disposition: form-data; name=\"method\""),
            part("Content-Disposition: form-data; name=\"payment_method\""),
            part("Content-Disposition: form-data; name=\"_methods\""),
            part("Content-Disposition: form-data; name=\"file\"; filename=\"method.txt\""),
            part("Content-ID: <_method>"),
            // `_method` as a part's value, not its name.
            part("Content-Disposition: form-data; name=\"note\""),
            "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nname=_method\r\n--b--".into(),
            "name=\"_method\" in a body with no part head".into(),
        ] {
            assert!(!found(&body), "{body:?}");
        }
    }

    #[test]
    fn a_head_is_read_to_its_limit_and_no_further() {
        let pad = "x".repeat(HEAD_LIMIT);
        let late = format!("Content-Disposition: form-data; {pad}; name=\"_method\"\r\n\r\n");
        let mut names = PartNames::default();
        assert!(!(names.push(late.as_bytes()) | names.finish()));
        assert!(names.carry.len() <= CARRY);
        // A later marker opens a head of its own.
        let again = format!("{late}Content-Disposition: form-data; name=_method\r\n\r\n");
        let mut names = PartNames::default();
        assert!(names.push(again.as_bytes()) | names.finish());
    }
}
