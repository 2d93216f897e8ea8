//! Secrets wrapped across lines: MIME base64 at 76 columns, PEM at 64, quoted-printable's
//! soft line breaks (`=` at a line's end), and the same inside a JSON string, where the
//! break is written `\n` or `\r\n`. An encoder that wraps puts its breaks wherever the
//! column count falls, so the base64 or hex form of an echoed secret — or, under
//! quoted-printable, its raw value — may be cut anywhere, and no form holds a break.
//!
//! Rather than a break between every two characters of every form (an expression many
//! times larger), the matcher also searches an *unwrapped view* of the buffer: the same
//! bytes without the breaks that could fall inside a wrapped encoding, each byte of the
//! view knowing where it came from. A break is taken out when
//! - it ends a line of at least [`MIN_LINE`] bytes (wrapping encoders write lines of 60 to
//!   76; a line that began before the buffer counts as long), and
//! - it is a line break (`\r\n`, `\n`, or the JSON escapes `\r\n`, `\n`) between two bytes
//!   of the encodings' alphabet ([`wraps`]), or `=` before a line break (quoted-printable's
//!   soft break), followed by anything but another break.
//!
//! A match of the view is mapped back to the bytes it covers. Since every break taken out
//! follows [`MIN_LINE`] bytes of its own line, a match holds at most one break per
//! [`MIN_LINE`] bytes (and one more), which bounds how much longer than its unwrapped
//! spelling it can be ([`window`]) — a bound on lengths alone, as the streaming hold-back
//! needs. The streaming scrubber releases at a newline only where no break could be taken
//! out ([`may_continue`]).

/// The searcher for an escaped newline, built once: building one per buffer would cost
/// every header value scrubbed.
static ESCAPED_NEWLINE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\n"));

/// The shortest line whose break is taken for a wrap.
pub const MIN_LINE: usize = 16;

/// The longest break taken out: `=` and the JSON escape `\r\n`.
const MAX_BREAK: usize = 5;

/// Bytes of the encodings that wrap: base64 (both alphabets, with padding) and hex.
pub fn wraps(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'_' | b'-')
}

/// A bound on a match's length in the buffer, given `window`, a bound on its length
/// without breaks: at most one break of [`MAX_BREAK`] bytes per [`MIN_LINE`] bytes, and
/// one more.
pub fn window(window: usize) -> usize {
    // n <= w + MAX_BREAK * (n / MIN_LINE + 1)  =>  n <= (w + MAX_BREAK) * MIN_LINE / (MIN_LINE - MAX_BREAK)
    (window + MAX_BREAK) * MIN_LINE / (MIN_LINE - MAX_BREAK) + 1
}

/// Whether a newline at `at` (`chunk[at] == b'\n'`) could be a break taken out once more
/// bytes arrive: the line before it is long enough and its last byte, before a `\r`, is one
/// of the alphabet's. `line_before` is how long the line already was where `chunk` begins.
/// A streaming scrubber must not release bytes up to such a newline.
pub fn may_continue(chunk: &[u8], at: usize, line_before: usize) -> bool {
    let end = if at > 0 && chunk[at - 1] == b'\r' {
        at - 1
    } else {
        at
    };
    let line = match memchr::memrchr(b'\n', &chunk[..end]) {
        Some(i) => end - i - 1,
        None => line_before.saturating_add(end),
    };
    if line < MIN_LINE {
        return false;
    }
    // The line's last byte came with an earlier frame: taken as one of the alphabet's.
    end == 0 || wraps(chunk[end - 1])
}

/// `hay` without the breaks that may fall inside a wrapped encoding, and where they were;
/// `None` when no break was taken out.
#[derive(Debug, PartialEq, Eq)]
pub struct Unwrapped {
    pub bytes: Vec<u8>,
    /// Per break taken out: where in `bytes` the bytes after it begin, and how many bytes
    /// were taken out up to and including it (a few per line, not one entry per byte).
    cuts: Vec<(usize, usize)>,
}

impl Unwrapped {
    /// Where byte `j` of the view was in `hay`.
    fn at(&self, j: usize) -> usize {
        match self.cuts.partition_point(|&(p, _)| p <= j) {
            0 => j,
            n => j + self.cuts[n - 1].1,
        }
    }

    /// The range of `hay` a match `start..end` of the view covers.
    pub fn original(&self, start: usize, end: usize) -> (usize, usize) {
        (self.at(start), self.at(end - 1) + 1)
    }

    /// Whether the view's `start..end` spans a break taken out.
    pub fn spans_break(&self, start: usize, end: usize) -> bool {
        self.cuts.partition_point(|&(p, _)| p <= start)
            != self.cuts.partition_point(|&(p, _)| p < end)
    }
}

/// Whether the line ending at `end` holds at least [`MIN_LINE`] bytes: no line break, raw
/// or escaped, among its last [`MIN_LINE`] (a line that began before `hay` counts as long).
fn long_line(hay: &[u8], end: usize) -> bool {
    let window = &hay[end.saturating_sub(MIN_LINE)..end];
    !memchr::memchr2_iter(b'\n', b'\\', window)
        .any(|i| window[i] == b'\n' || matches!(window.get(i + 1), Some(b'n' | b'r')))
}

/// The break at candidate `i` (a raw `\n`, or the `\` of an escaped one): where the bytes
/// taken out would start and end, if it is one a wrapped encoding may hold. Rejects the
/// common case — a newline after a byte outside the alphabet — after one look.
#[inline]
fn wrap_break(hay: &[u8], i: usize) -> Option<(usize, usize)> {
    let (start, end) = if hay[i] == b'\n' {
        let start = if i > 0 && hay[i - 1] == b'\r' {
            i - 1
        } else {
            i
        };
        (start, i + 1)
    } else if i >= 2 && &hay[i - 2..i] == b"\\r" {
        // The `\n` of an escaped `\r\n`.
        (i - 2, i + 2)
    } else {
        (i, i + 2)
    };
    let before = *hay.get(start.checked_sub(1)?)?;
    if !wraps(before) {
        return None;
    }
    let after = *hay.get(end)?;
    // Quoted-printable's soft break takes its `=` with it; it is never followed by another
    // break (a line of its own).
    let next_breaks = after == b'\n'
        || after == b'\r'
        || (after == b'\\' && matches!(hay.get(end + 1), Some(b'n' | b'r')));
    let from = if before == b'=' && !next_breaks {
        start - 1
    } else if wraps(after) {
        start
    } else {
        return None;
    };
    long_line(hay, from).then_some((from, end))
}

/// The unwrapped view of `hay` (see the module docs); `None` when nothing is taken out.
pub fn unwrap(hay: &[u8]) -> Option<Unwrapped> {
    // Most buffers (header values, one-line JSON) hold no break at all: one pass says so.
    memchr::memchr2(b'\n', b'\\', hay)?;
    let mut view: Option<Unwrapped> = None;
    // Bytes of `hay` before this are in the view (or taken out); how many were taken out.
    let (mut copied, mut removed) = (0, 0);
    // Raw newlines and escaped ones (`\n`, also ending an escaped `\r\n`), in order.
    let mut raw = memchr::memchr_iter(b'\n', hay).peekable();
    let mut escaped = ESCAPED_NEWLINE.find_iter(hay).peekable();
    loop {
        let i = match (raw.peek(), escaped.peek()) {
            (Some(&r), Some(&e)) if e < r => escaped.next(),
            (Some(_), _) => raw.next(),
            (None, Some(_)) => escaped.next(),
            (None, None) => None,
        };
        let Some(i) = i else { break };
        if i < copied {
            continue;
        }
        let Some((from, to)) = wrap_break(hay, i) else {
            continue;
        };
        if from < copied {
            continue;
        }
        let v = view.get_or_insert_with(|| Unwrapped {
            bytes: Vec::with_capacity(hay.len()),
            cuts: Vec::new(),
        });
        v.bytes.extend_from_slice(&hay[copied..from]);
        removed += to - from;
        v.cuts.push((v.bytes.len(), removed));
        copied = to;
    }
    let mut v = view?;
    v.bytes.extend_from_slice(&hay[copied..]);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &Unwrapped) -> String {
        String::from_utf8(v.bytes.clone()).unwrap()
    }

    #[test]
    fn breaks_inside_wrapped_encodings_are_taken_out() {
        let line = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"; // 32 base64 bytes
        for brk in ["\n", "\r\n", "\\n", "\\r\\n"] {
            let hay = format!("{line}{brk}{line}{brk}abc");
            let v = unwrap(hay.as_bytes()).unwrap_or_else(|| panic!("{brk:?}"));
            assert_eq!(text(&v), format!("{line}{line}abc"), "{brk:?}");
            // A match across the first break maps back over it.
            let (s, e) = v.original(30, 34);
            assert_eq!(&hay[s..e], &format!("dY{brk}QU"), "{brk:?}");
            assert!(v.spans_break(30, 34) && !v.spans_break(0, 30));
        }
        // Quoted-printable: `=` and the break go.
        let hay = "ghp_abcdefghijklmnop=\r\nqrstu rest";
        assert_eq!(
            text(&unwrap(hay.as_bytes()).unwrap()),
            "ghp_abcdefghijklmnopqrstu rest"
        );
    }

    #[test]
    fn prose_short_lines_and_other_breaks_stay() {
        // Short lines (the first line of a buffer counts as long: it may have begun
        // before); a break after punctuation; before punctuation; a blank line.
        for hay in [
            "\nshort\nlines\nonly",
            "{\"a\": 1,\n \"b\": 2}",
            "a long enough line of text.\nNext",
            "a long enough line of text\n\nNext",
            "a long enough line of text\n",
        ] {
            assert_eq!(unwrap(hay.as_bytes()), None, "{hay:?}");
        }
        // A long line of prose ending in a letter is taken for a wrap: harmless, the view
        // only adds matches that hold a secret's form.
        assert!(unwrap(b"a long enough line of text\nnext").is_some());
    }

    #[test]
    fn a_stream_does_not_release_at_a_newline_a_wrap_may_continue_after() {
        let hay = b"data: {\"x\":1}\n\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY\nshort\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY=\r\n";
        let newlines: Vec<usize> = memchr::memchr_iter(b'\n', hay).collect();
        let may: Vec<bool> = newlines.iter().map(|&i| may_continue(hay, i, 0)).collect();
        assert_eq!(may, [false, false, true, false, true]);
        // A line that began in an earlier frame counts with its length then.
        assert!(may_continue(b"QUJD\n", 4, 12));
        assert!(!may_continue(b"QUJD\n", 4, 11));
        assert!(!may_continue(b"QUJD.\n", 5, 100));
        // Its last byte, in an earlier frame, is taken as the alphabet's.
        assert!(may_continue(b"\n", 0, 16));
        assert!(may_continue(b"\r\n", 1, 16));
        assert!(!may_continue(b"\n", 0, 15));
    }

    #[test]
    fn the_window_bounds_a_match_with_a_break_every_min_line_bytes() {
        for w in [4usize, 20, 100, 2015] {
            // The densest breaks a match can hold: one at its start, then one per line.
            let breaks = |n: usize| n / MIN_LINE + 1;
            let mut n = w;
            while n < w + MAX_BREAK * breaks(n) {
                n += 1;
            }
            assert!(window(w) >= n, "{w}: {} < {n}", window(w));
        }
    }
}
