//! [`FormKeys`]: the keys of a form body (`a=1&b=2`), decoded as they stream, each asked
//! whether it [names an override](super::names_override). One reader for whole bodies and
//! streamed ones, so the two cannot disagree.
//!
//! Keys end at `=`, `&` and `;` (older Rack splits a form on `;` too: more keys only means
//! more looked at). `+` is a blank and `%XX` a byte, as every form parser has it; a
//! malformed escape stays as written. Only the first [`KEY_PREFIX`] bytes of a key after its
//! leading blanks are kept: a longer key is an override only if its start is one
//! (`_method` and then blanks, or `[`, or NUL), so no key is held whole.

use super::Reader;

/// How much of a key (after leading blanks) is kept to judge it.
const KEY_PREFIX: usize = 64;

/// A `%` escape in progress.
#[derive(Debug, Clone, Copy)]
enum Escape {
    None,
    /// `%` seen.
    Percent,
    /// `%` and one hex digit seen (the digit as written).
    One(u8),
}

/// The keys of a form, read as it streams.
#[derive(Debug)]
pub struct FormKeys {
    in_key: bool,
    /// The current key, decoded, leading blanks skipped, at most [`KEY_PREFIX`] bytes.
    key: Vec<u8>,
    /// The current key cannot be an override: its first byte after blanks is none that
    /// [`super::names_override`] takes (`_`, `.`, `[`, or a byte of a Unicode blank).
    dead: bool,
    escape: Escape,
    found: bool,
}

impl Default for FormKeys {
    fn default() -> Self {
        Self {
            in_key: true,
            key: Vec::with_capacity(KEY_PREFIX),
            dead: false,
            escape: Escape::None,
            found: false,
        }
    }
}

impl Reader for FormKeys {
    fn push(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() && !self.found {
            if !self.in_key {
                // A value is skipped to the next separator at memchr's speed.
                match memchr::memchr2(b'&', b';', bytes) {
                    Some(at) => {
                        self.in_key = true;
                        bytes = &bytes[at + 1..];
                    }
                    None => return false,
                }
                continue;
            }
            if self.dead || self.key.len() == KEY_PREFIX {
                // A key's verdict is in its start: the rest of it (a binary upload is one
                // long key, or many short ones) is skipped to the next byte that ends it.
                self.escape = Escape::None;
                match memchr::memchr3(b'=', b'&', b';', bytes) {
                    Some(at) => bytes = &bytes[at..],
                    None => return false,
                }
            }
            self.key_byte(bytes[0]);
            bytes = &bytes[1..];
        }
        self.found
    }

    fn finish(&mut self) -> bool {
        if self.in_key {
            self.end_key();
        }
        self.found
    }
}

impl FormKeys {
    /// Whether the whole form `bytes` has a key that names an override.
    pub fn name_override(bytes: &[u8]) -> bool {
        let mut keys = Self::default();
        keys.push(bytes) || keys.finish()
    }

    fn key_byte(&mut self, b: u8) {
        match (self.escape, b) {
            (Escape::Percent, _) if b.is_ascii_hexdigit() => {
                self.escape = Escape::One(b);
                return;
            }
            (Escape::One(hi), _) if b.is_ascii_hexdigit() => {
                self.escape = Escape::None;
                self.emit(
                    super::hex(hi).unwrap_or_default() << 4 | super::hex(b).unwrap_or_default(),
                );
                return;
            }
            (Escape::None, _) => {}
            // Not an escape after all: what was held is the key's own bytes.
            _ => self.flush_escape(),
        }
        match b {
            b'&' | b';' => self.end_key(),
            b'=' => {
                self.end_key();
                self.in_key = false;
            }
            b'+' => self.emit(b' '),
            b'%' => self.escape = Escape::Percent,
            _ => self.emit(b),
        }
    }

    fn flush_escape(&mut self) {
        match std::mem::replace(&mut self.escape, Escape::None) {
            Escape::None => {}
            Escape::Percent => self.emit(b'%'),
            Escape::One(digit) => {
                self.emit(b'%');
                self.emit(digit);
            }
        }
    }

    fn emit(&mut self, b: u8) {
        if self.key.is_empty() {
            if b.is_ascii_whitespace() {
                return;
            }
            if !matches!(b, b'_' | b'.' | b'[' | 0x80..) {
                self.dead = true;
                return;
            }
        }
        if self.key.len() < KEY_PREFIX {
            self.key.push(b);
        }
    }

    fn end_key(&mut self) {
        self.flush_escape();
        self.found |= !self.dead && super::names_override(&self.key);
        self.key.clear();
        self.dead = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(form: &str) -> bool {
        let whole = FormKeys::name_override(form.as_bytes());
        assert_eq!(super::super::tests::read_every_way::<FormKeys>(form), whole);
        whole
    }

    #[test]
    fn every_spelling_of_an_override_key_is_found_wherever_the_stream_is_cut() {
        for form in [
            "_method=DELETE",
            "a=1&_method=DELETE",
            "a=1;_method=DELETE",
            "_method",
            "a=1&_method",
            "%5Fmethod=DELETE",
            "%5fMETHOD=DELETE",
            "_%6Dethod=DELETE",
            "+_method=DELETE",
            "%20%20_method+=x",
            ".method=DELETE",
            "%2Emethod=DELETE",
            "[method=DELETE",
            "_method[]=DELETE",
            "_method%5B%5D=DELETE",
            "_method%00junk=DELETE",
            "a=_method&_method=x",
        ] {
            assert!(found(form), "{form:?}");
        }
    }

    #[test]
    fn values_and_other_keys_are_not_overrides() {
        for form in [
            "",
            "a=_method",
            "payment_method=card",
            "method=DELETE",
            "x_method=DELETE",
            "_methods=1",
            "%5Fmethodx=1",
            "%5=_method",
            "a=1&b=%26_method",
        ] {
            assert!(!found(form), "{form:?}");
        }
    }

    #[test]
    fn a_long_key_is_judged_by_its_start_and_blanks_before_it_cost_nothing() {
        let padded = format!("{}_method=DELETE", "+".repeat(100_000));
        assert!(FormKeys::name_override(padded.as_bytes()));
        let trailing = format!("_method{}=DELETE", "+".repeat(100_000));
        assert!(FormKeys::name_override(trailing.as_bytes()));
        let long = format!("{}=1", "k".repeat(100_000));
        assert!(!FormKeys::name_override(long.as_bytes()));
        let mut keys = FormKeys::default();
        keys.push(long.as_bytes());
        assert!(
            keys.key.capacity() <= KEY_PREFIX,
            "a key is never held whole"
        );
    }
}
