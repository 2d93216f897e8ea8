//! Every way a standard JSON, HTML or URL encoder can write one character, as a regular
//! expression: what lets the scrubber find a secret however an upstream escaped it.
//!
//! An encoder escapes some characters and leaves the others alone (Go's `encoding/json`
//! escapes `<`, `>` and `&`; .NET's `System.Text.Json` also `+` and `'`; Gson `=` and `'`;
//! Python's `html.escape` writes `&#x27;`, PHP's `htmlspecialchars` `&#039;`), so a secret
//! with several special characters can come back with any subset of them escaped, each in
//! its own way. Rather than listing those exponentially many spellings, the pattern of a
//! secret is the concatenation of one alternation per character, [`char_hir`]: the
//! character itself or any of its encodings —
//!
//! - JSON, JavaScript and Python string escapes: `\uXXXX` (a surrogate pair above U+FFFF),
//!   `\UXXXXXXXX`, `\xXX`, `\u{X…}`, and the short forms `\"` `\\` `\/` `\'` `\b` `\f`
//!   `\n` `\r` `\t` `\v` `\0`;
//! - HTML character references: decimal `&#43;` and hexadecimal `&#x2B;` / `&#X2b;` (up to
//!   [`MAX_ZEROS`] leading zeros, as PHP's `&#039;`), and the HTML5 names of the ASCII
//!   characters (`&amp;` `&AMP;` `&lt;` `&quot;` `&apos;` `&plus;` `&sol;` `&equals;` …);
//! - URL encoding: `%XX` of each UTF-8 byte, `%uXXXX` (JavaScript's `escape`), `+` for a
//!   space (forms);
//! - quoted-printable (MIME): `=XX` of each UTF-8 byte (its soft line breaks are taken out
//!   by [`super::wrapped`]);
//!
//! hexadecimal digits in either case, each independently. Encodings nest once: the special
//! characters *of an encoding* may themselves be encoded — a JSON document serialised into
//! a JSON string (`\\u002B`), a percent-encoded value inside JSON from Go (`\u00252B`),
//! HTML-escaped text in JSON (`\u0026lt;`), a double-escaped page (`&amp;lt;`), a URL
//! encoded twice (`%252B`).
//!
//! ASCII letters, digits and `-` `_` `.` ([`plain`]) are matched as themselves only: no
//! standard encoder escapes them (all leave RFC 3986's unreserved characters alone, bar
//! `~`). That keeps the patterns small, and gives every pattern runs of bytes that must
//! appear verbatim, which the matcher uses as anchors.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, ClassBytes, ClassBytesRange, Hir, Repetition};

/// The most leading zeros of a numeric character reference or `\u{…}` escape matched
/// (PHP writes `&#039;`; no encoder writes more than a few).
pub const MAX_ZEROS: u32 = 3;

/// Bytes that no standard encoder escapes: matched as themselves only.
pub fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// One piece of an encoding.
#[derive(Debug, Clone, Copy)]
enum Atom {
    /// This byte (a special one may itself be encoded, one level down).
    Byte(u8),
    /// This hexadecimal digit, in either case.
    Hex(u8),
    /// `x` or `X` (of `&#x…;`).
    X,
    /// Between zero and this many `0`s.
    Zeros(u32),
}

/// The HTML5 named character references of an ASCII character (WHATWG's list; the
/// uppercase four are the legacy names HTML still decodes).
fn names(c: char) -> &'static [&'static str] {
    match c {
        '\t' => &["Tab"],
        '\n' => &["NewLine"],
        '!' => &["excl"],
        '"' => &["quot", "QUOT"],
        '#' => &["num"],
        '$' => &["dollar"],
        '%' => &["percnt"],
        '&' => &["amp", "AMP"],
        '\'' => &["apos"],
        '(' => &["lpar"],
        ')' => &["rpar"],
        '*' => &["ast", "midast"],
        '+' => &["plus"],
        ',' => &["comma"],
        '.' => &["period"],
        '/' => &["sol"],
        ':' => &["colon"],
        ';' => &["semi"],
        '<' => &["lt", "LT"],
        '=' => &["equals"],
        '>' => &["gt", "GT"],
        '?' => &["quest"],
        '@' => &["commat"],
        '[' => &["lsqb", "lbrack"],
        '\\' => &["bsol"],
        ']' => &["rsqb", "rbrack"],
        '^' => &["Hat"],
        '_' => &["lowbar", "UnderBar"],
        '`' => &["grave", "DiacriticalGrave"],
        '{' => &["lcub", "lbrace"],
        '|' => &["verbar", "vert", "VerticalLine"],
        '}' => &["rcub", "rbrace"],
        '\u{a0}' => &["nbsp", "NonBreakingSpace"],
        _ => &[],
    }
}

/// The letter after a backslash that stands for `c` in JSON, JavaScript or Python.
fn short_escape(c: char) -> Option<u8> {
    Some(match c {
        '"' => b'"',
        '\\' => b'\\',
        '/' => b'/',
        '\'' => b'\'',
        '\u{8}' => b'b',
        '\u{c}' => b'f',
        '\n' => b'n',
        '\r' => b'r',
        '\t' => b't',
        '\u{b}' => b'v',
        '\0' => b'0',
        _ => return None,
    })
}

fn bytes(s: &[u8]) -> impl Iterator<Item = Atom> + '_ {
    s.iter().map(|&b| Atom::Byte(b))
}

/// `value` as exactly `width` hexadecimal digits.
fn hex(value: u32, width: u32) -> impl Iterator<Item = Atom> {
    (0..width)
        .rev()
        .map(move |i| Atom::Hex(((value >> (4 * i)) & 15) as u8))
}

/// `value` as hexadecimal digits without leading zeros.
fn hex_min(value: u32) -> impl Iterator<Item = Atom> {
    let width = (32 - value.leading_zeros()).div_ceil(4).max(1);
    hex(value, width)
}

/// The encodings of `c`, not counting `c` itself.
fn encodings(c: char) -> Vec<Vec<Atom>> {
    let cp = u32::from(c);
    let mut out: Vec<Vec<Atom>> = Vec::new();
    // JSON, JavaScript, Python.
    if let Some(letter) = short_escape(c) {
        out.push(vec![Atom::Byte(b'\\'), Atom::Byte(letter)]);
    }
    if cp <= 0xFFFF {
        out.push(bytes(b"\\u").chain(hex(cp, 4)).collect());
    } else {
        let v = cp - 0x1_0000;
        let (high, low) = (0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        out.push(
            bytes(b"\\u")
                .chain(hex(high, 4))
                .chain(bytes(b"\\u"))
                .chain(hex(low, 4))
                .collect(),
        );
    }
    out.push(bytes(b"\\U").chain(hex(cp, 8)).collect());
    if cp < 0x100 {
        out.push(bytes(b"\\x").chain(hex(cp, 2)).collect());
    }
    out.push(
        bytes(b"\\u{")
            .chain([Atom::Zeros(MAX_ZEROS)])
            .chain(hex_min(cp))
            .chain(bytes(b"}"))
            .collect(),
    );
    // HTML.
    let decimal = cp.to_string();
    out.push(
        bytes(b"&#")
            .chain([Atom::Zeros(MAX_ZEROS)])
            .chain(bytes(decimal.as_bytes()))
            .chain(bytes(b";"))
            .collect(),
    );
    out.push(
        bytes(b"&#")
            .chain([Atom::X, Atom::Zeros(MAX_ZEROS)])
            .chain(hex_min(cp))
            .chain(bytes(b";"))
            .collect(),
    );
    for name in names(c) {
        out.push(
            bytes(b"&")
                .chain(bytes(name.as_bytes()))
                .chain(bytes(b";"))
                .collect(),
        );
    }
    // URL.
    let mut utf8 = [0u8; 4];
    out.push(
        c.encode_utf8(&mut utf8)
            .bytes()
            .flat_map(|b| bytes(b"%").chain(hex(u32::from(b), 2)))
            .collect(),
    );
    if cp <= 0xFFFF {
        out.push(bytes(b"%u").chain(hex(cp, 4)).collect());
    }
    if c == ' ' {
        out.push(vec![Atom::Byte(b'+')]);
    }
    // Quoted-printable.
    out.push(
        c.encode_utf8(&mut utf8)
            .bytes()
            .flat_map(|b| bytes(b"=").chain(hex(u32::from(b), 2)))
            .collect(),
    );
    out
}

fn class(bytes: &[u8]) -> Hir {
    Hir::class(Class::Bytes(ClassBytes::new(
        bytes.iter().map(|&b| ClassBytesRange::new(b, b)),
    )))
}

/// An atom; with `nest`, a special byte stands for itself or any of its own encodings.
fn atom_hir(atom: Atom, nest: bool) -> Hir {
    match atom {
        Atom::Byte(b) if nest && !plain(b) => {
            let mut alts: Vec<Hir> = encodings(char::from(b))
                .into_iter()
                .map(|e| encoding_hir(&e, false))
                .collect();
            alts.push(Hir::literal([b]));
            Hir::alternation(alts)
        }
        Atom::Byte(b) => Hir::literal([b]),
        Atom::Hex(d) if d < 10 => Hir::literal([b'0' + d]),
        Atom::Hex(d) => class(&[b'a' + d - 10, b'A' + d - 10]),
        Atom::X => class(b"xX"),
        Atom::Zeros(max) => Hir::repetition(Repetition {
            min: 0,
            max: Some(max),
            greedy: true,
            sub: Box::new(Hir::literal(*b"0")),
        }),
    }
}

fn encoding_hir(atoms: &[Atom], nest: bool) -> Hir {
    Hir::concat(atoms.iter().map(|&a| atom_hir(a, nest)).collect())
}

/// `c` as itself or any of its encodings (nested once). Longer spellings come first, so
/// that of two matches starting at the same byte the fuller one is redacted.
pub fn char_hir(c: char) -> Hir {
    let mut utf8 = [0u8; 4];
    let raw = Hir::literal(c.encode_utf8(&mut utf8).as_bytes());
    if c.is_ascii() && plain(c as u8) {
        return raw;
    }
    let mut alts: Vec<Hir> = encodings(c).iter().map(|e| encoding_hir(e, true)).collect();
    alts.push(raw);
    Hir::alternation(alts)
}

/// The longest spelling of one byte of a secret, over every ASCII character (non-ASCII
/// characters spell shorter per byte): how far a secret of `n` bytes can stretch.
pub fn max_expansion() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        (0u8..128)
            .map(|b| {
                char_hir(char::from(b))
                    .properties()
                    .maximum_len()
                    .unwrap_or(1)
            })
            .max()
            .unwrap_or(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex_automata::meta::Regex;

    fn regex(c: char) -> Regex {
        Regex::builder()
            .syntax(regex_automata::util::syntax::Config::new().utf8(false))
            .build_from_hir(&Hir::concat(vec![
                Hir::look(regex_syntax::hir::Look::Start),
                char_hir(c),
                Hir::look(regex_syntax::hir::Look::End),
            ]))
            .unwrap()
    }

    #[test]
    fn every_common_spelling_of_a_character_matches() {
        let cases: &[(char, &[&str])] = &[
            (
                '+',
                &[
                    "+",
                    "\\u002B",
                    "\\u002b",
                    "\\x2b",
                    "\\u{2b}",
                    "\\U0000002B",
                    "&#43;",
                    "&#043;",
                    "&#x2B;",
                    "&#X2b;",
                    "&#x002b;",
                    "&plus;",
                    "%2B",
                    "%2b",
                    "=2B",
                    "%u002B", // nested once
                    "\\\\u002B",
                    "\\u005cu002b",
                    "%5Cu002B",
                    "\\u00252B",
                    "%252b",
                    "&amp;#43;",
                    "&#38;#x2b;",
                    "%26%2343%3B",
                    "\\u0026plus;",
                    "&amp;plus&semi;",
                ],
            ),
            (
                ' ',
                &["+", "%20", "&#32;", "\\u0020", "%2B", "\\u002B", "&#x20;"],
            ),
            ('/', &["\\/", "\\\\\\/", "&sol;", "%2F", "\\u002f", "&#47;"]),
            (
                '&',
                &[
                    "&amp;",
                    "&AMP;",
                    "\\u0026",
                    "&amp;amp;",
                    "%26",
                    "\\u0026amp;",
                ],
            ),
            (
                '\'',
                &["&#39;", "&#039;", "&#x27;", "&apos;", "\\'", "\\u0027"],
            ),
            (
                '<',
                &[
                    "&lt;",
                    "&LT;",
                    "\\u003c",
                    "\\u003C",
                    "&amp;lt;",
                    "\\u0026lt;",
                ],
            ),
            ('"', &["\\\"", "&quot;", "\\\\\\\"", "&amp;quot;", "%22"]),
            ('\\', &["\\\\", "\\u005C", "&bsol;", "%5C", "\\\\\\\\"]),
            (
                'é',
                &["\\u00e9", "\\u00E9", "&#233;", "&#xe9;", "%C3%A9", "\\xe9"],
            ),
            (
                '😀',
                &[
                    "\\ud83d\\ude00",
                    "\\uD83D\\uDE00",
                    "&#128512;",
                    "%F0%9F%98%80",
                ],
            ),
        ];
        for (c, spellings) in cases {
            let re = regex(*c);
            for s in *spellings {
                assert!(re.is_match(s.as_bytes()), "{c:?} as {s:?}");
            }
        }
    }

    #[test]
    fn other_characters_and_broken_escapes_do_not_match() {
        let re = regex('+');
        for s in [
            "-",
            "%2C",
            "\\u002C",
            "&#44;",
            "&#x2C;",
            "&plus",
            "\\u02B",
            "&#00000043;",
            "%2",
            "&pluss;",
        ] {
            assert!(!re.is_match(s.as_bytes()), "{s:?}");
        }
        // Plain characters match only as themselves.
        let re = regex('a');
        for s in ["\\u0061", "%61", "&#97;"] {
            assert!(!re.is_match(s.as_bytes()), "{s:?}");
        }
        assert!(re.is_match(b"a"));
    }

    #[test]
    fn expansion_is_bounded() {
        let k = max_expansion();
        assert!((20..=64).contains(&k), "{k}");
        for c in ['é', '😀', '\u{a0}', '中'] {
            let len = char_hir(c).properties().maximum_len().unwrap();
            assert!(len <= k * c.len_utf8(), "{c:?}: {len}");
        }
    }
}
