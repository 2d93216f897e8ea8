//! Payment card numbers: found by a byte scan, not the automaton (a card number has no
//! literal anchor), and kept apart from ordinary long numbers by four guards at once.
//!
//! - **Shape**: 13–19 digits, either in one run or in groups separated by a single space or
//!   a single dash, the same separator throughout, the first group of 4 digits and the
//!   others of 3–6 (`4111 1111 1111 1111`, `3782-822463-10005`).
//! - **Boundaries**: not preceded or followed by a letter, digit or `_` (ids, hex hashes,
//!   UUID fragments), nor part of a decimal (`0.4111111111111111`, `1700000000.123`).
//! - **Scheme**: the IIN prefix and the length of a real scheme — Visa, Mastercard, Amex,
//!   Discover, JCB, Diners, UnionPay, Mir. Millisecond timestamps (`17…`), most snowflake
//!   ids and counters start with a digit no scheme uses at their length.
//! - **Luhn**: the check digit, which nine random numbers in ten fail.
//!
//! The scan is fast on text because a candidate spans at least 13 bytes of digits and
//! separators: probing every 13th byte finds every such run, and only a probe that lands
//! on one looks at its neighbours.

use super::patterns::{Step, View};

/// The fewest digits of a card number, and so the probe stride.
const MIN_DIGITS: usize = 13;
/// The most digits of a card number.
const MAX_DIGITS: usize = 19;

/// The most bytes a card validator reads from a candidate's start: 19 digits in groups
/// (five separators at most), a look past the last group, and two bytes of boundary.
pub const MAX_WINDOW: usize = 32;

const DIGIT: u8 = 1;
const SEP: u8 = 2;

/// Byte classes: digits and the two separators; everything else ends a run.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut d = b'0';
    while d <= b'9' {
        t[d as usize] = DIGIT;
        d += 1;
    }
    t[b' ' as usize] = SEP;
    t[b'-' as usize] = SEP;
    t
};

/// The first card-number start in `v` before `limit` whose verdict is not "no": `Ok(at)`
/// for a card number, `Err(at)` for a candidate that needs bytes not yet arrived.
pub fn first(v: &View<'_>, limit: usize) -> Option<Result<usize, usize>> {
    let buf = v.bytes();
    let len = buf.len();
    let class = |i: usize| CLASS[usize::from(buf[i])];
    let mut p = MIN_DIGITS - 1;
    while p < len {
        if class(p) == 0 {
            p += MIN_DIGITS;
            continue;
        }
        let mut r0 = p;
        while r0 > 0 && class(r0 - 1) != 0 {
            r0 -= 1;
        }
        let mut r1 = p + 1;
        while r1 < len && class(r1) != 0 {
            r1 += 1;
        }
        if r1 - r0 >= MIN_DIGITS || (r1 == len && !v.eof()) {
            if let Some(hit) = in_run(v, r0, r1, limit) {
                return Some(hit);
            }
        }
        if r0 >= limit {
            return None;
        }
        // Any later run of 13 starts after r1, so it contains r1 + 13 or a later probe.
        p = r1 + MIN_DIGITS;
    }
    if !v.eof() {
        // A run shorter than the stride touching the end was never probed, and may grow.
        let mut t = len;
        while t > 0 && len - t < MIN_DIGITS && class(t - 1) != 0 {
            t -= 1;
        }
        if len - t < MIN_DIGITS {
            return in_run(v, t, len, limit);
        }
    }
    None
}

/// The first decisive group start in the run `r0..r1`.
fn in_run(v: &View<'_>, r0: usize, r1: usize, limit: usize) -> Option<Result<usize, usize>> {
    let buf = v.bytes();
    for (s, &b) in buf.iter().enumerate().take(r1.min(limit)).skip(r0) {
        let starts_group = b.is_ascii_digit() && !v.before(s, 1).is_some_and(digit);
        if !starts_group {
            continue;
        }
        match check(v, s) {
            Ok(true) => return Some(Ok(s)),
            Ok(false) => {}
            Err(_) => return Some(Err(s)),
        }
    }
    None
}

fn digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// Whether a card number starts at `s` (a digit after a non-digit).
pub fn check(v: &View<'_>, s: usize) -> Step<bool> {
    match v.before(s, 1) {
        Some(b) if b.is_ascii_alphanumeric() || b == b'_' => return Ok(false),
        Some(b'.') if v.before(s, 2).is_some_and(digit) => return Ok(false),
        _ => {}
    }
    let buf = v.bytes();
    let mut digits = [0u8; MAX_DIGITS];
    let first = v.run(s, MAX_DIGITS + 1, digit)?;
    if first >= MIN_DIGITS {
        if first > MAX_DIGITS || !ends(v, s + first)? {
            return Ok(false);
        }
        digits[..first].copy_from_slice(&buf[s..s + first]);
        return Ok(valid(&digits[..first]));
    }
    if first != 4 {
        return Ok(false);
    }
    let sep = match v.at(s + 4)? {
        Some(b @ (b' ' | b'-')) => b,
        _ => return Ok(false),
    };
    digits[..4].copy_from_slice(&buf[s..s + 4]);
    let (mut n, mut i) = (4, s + 4);
    while v.at(i)? == Some(sep) {
        let g = v.run(i + 1, 7, digit)?;
        if !(3..=6).contains(&g) || n + g > MAX_DIGITS {
            return Ok(false);
        }
        digits[n..n + g].copy_from_slice(&buf[i + 1..i + 1 + g]);
        n += g;
        i += 1 + g;
        // The shortest valid prefix of the groups: a CVV or an expiry may follow.
        if n >= MIN_DIGITS && ends(v, i)? && valid(&digits[..n]) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the number may end before `i`: not inside a word or a decimal.
fn ends(v: &View<'_>, i: usize) -> Step<bool> {
    Ok(match v.at(i)? {
        None => true,
        Some(b) if b.is_ascii_alphanumeric() || b == b'_' => false,
        Some(b'.') => !v.at(i + 1)?.is_some_and(digit),
        Some(_) => true,
    })
}

/// IIN of a real scheme at a length it issues, and a valid Luhn check digit.
fn valid(digits: &[u8]) -> bool {
    scheme(digits) && luhn(digits)
}

fn scheme(d: &[u8]) -> bool {
    let n = d.len();
    let prefix = |k: usize| {
        d[..k]
            .iter()
            .fold(0u32, |acc, &c| acc * 10 + u32::from(c - b'0'))
    };
    let (p1, p2, p3, p4) = (prefix(1), prefix(2), prefix(3), prefix(4));
    match p1 {
        // Visa.
        4 => matches!(n, 13 | 16 | 19),
        // Mastercard (2-series and 5-series), Mir.
        2 => (n == 16 && (2221..=2720).contains(&p4)) || ((2200..=2204).contains(&p4) && n >= 16),
        5 => n == 16 && (51..=55).contains(&p2),
        // Amex, JCB, Diners.
        3 => {
            ((p2 == 34 || p2 == 37) && n == 15)
                || ((3528..=3589).contains(&p4) && n >= 16)
                || (((300..=305).contains(&p3) || matches!(p2, 36 | 38 | 39)) && n >= 14)
        }
        // Discover, UnionPay.
        6 => n >= 16 && (p4 == 6011 || (644..=649).contains(&p3) || p2 == 65 || p2 == 62),
        _ => false,
    }
}

fn luhn(d: &[u8]) -> bool {
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &c)| {
            let x = u32::from(c - b'0');
            if i % 2 == 1 {
                let y = x * 2;
                if y > 9 {
                    y - 9
                } else {
                    y
                }
            } else {
                x
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> bool {
        let v = View::new(b"", text.as_bytes(), true);
        matches!(first(&v, usize::MAX), Some(Ok(_)))
    }

    #[test]
    fn test_numbers_of_each_scheme_are_found() {
        for card in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "4111-1111-1111-1111",
            "5555555555554444",
            "2223003122003222",
            "378282246310005",
            "3782 822463 10005",
            "6011111111111117",
            "3530111333300000",
            "30569309025904",
            "6200000000000005",
            "4222222222222",
        ] {
            assert!(found(card), "{card}");
            assert!(found(&format!("{{\"card\":\"{card}\"}}")), "{card}");
            assert!(found(&format!("card {card} exp 12/27")), "{card}");
        }
    }

    #[test]
    fn a_cvv_after_the_groups_still_finds_the_card() {
        assert!(found("4111 1111 1111 1111 123"));
        assert!(found("order 12 4111 1111 1111 1111"));
    }

    #[test]
    fn ordinary_numbers_are_not_cards() {
        for text in [
            "4111111111111112",                     // Luhn fails
            "411111111111119",                      // 15 digits, not a Visa length
            "1700000000000",                        // ms timestamp
            "1700000000000000",                     // µs timestamp
            "1732950000123456789",                  // ns timestamp
            "41111111111111111111",                 // inside a longer run
            "x4111111111111111",                    // inside a word
            "4111111111111111abc",                  // inside a word
            "0.4111111111111111",                   // a decimal
            "4111111111111111.25",                  // a decimal
            "550e8400-e29b-41d4-a716-446655440000", // UUID
            "da39a3ee5e6b4b0d3255bfef95601890afd80709",
            "2024-01-15 12:30:45",
            "1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6",
            "4111  1111  1111  1111", // double spaces
            "4111 1111-1111 1111",    // mixed separators
            "1234567890123",
        ] {
            assert!(!found(text), "{text}");
        }
    }

    #[test]
    fn luhn_matches_the_reference() {
        assert!(luhn(b"79927398713"));
        assert!(!luhn(b"79927398710"));
    }
}
