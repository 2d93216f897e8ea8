//! Finding the forms of a set of secrets, in any of their encodings, in a buffer: one
//! leftmost-first regular expression over all of them ([`super::encodings`]), searched only
//! around *anchors*.
//!
//! Each form has a run of [plain](super::encodings::plain) bytes (letters, digits, `-_.`)
//! that every spelling of it contains verbatim — its anchor. One Aho–Corasick automaton
//! finds the anchors (with its SIMD prefilter most of a body is skipped); around each one
//! the regular expression is searched within the reach the form's other characters can
//! have, windows that overlap being merged. Every match contains its form's anchor, so it
//! lies inside a merged window: the matches found are exactly those of a search of the
//! whole buffer. A form without an anchor of at least [`MIN_ANCHOR`] bytes (a secret made
//! of punctuation) makes the matcher search the whole buffer instead.
//!
//! A buffer holding line breaks that may fall inside a wrapped encoding is also searched
//! without them ([`super::wrapped`]); what is found across a break is mapped back over it.

use aho_corasick::{AhoCorasick, Input as AcInput, MatchKind as AcKind};
use regex_automata::meta::{self, Regex};
use regex_automata::Input;
use regex_syntax::hir::Hir;

use super::encodings::{self, plain};
use super::patterns::Form;
use super::wrapped;

/// The shortest run of plain bytes used as an anchor.
pub const MIN_ANCHOR: usize = 3;

/// The compiled forms of some secrets.
pub struct Matcher {
    regex: Regex,
    /// `None`: some form has no anchor, the whole buffer is searched.
    anchors: Option<Anchors>,
    /// The longest match, in bytes.
    max_len: usize,
    /// A bound on any match's length that depends on the secrets' lengths alone.
    window: usize,
    /// The shortest match, in bytes: a shorter buffer (most header names and values) holds
    /// none, and is not searched.
    min_len: usize,
}

struct Anchors {
    /// Leftmost-longest, searched again from one past each match's start: every position
    /// where some anchor starts is visited, with the longest anchor there (and its SIMD
    /// prefilter applies, which overlapping search would forgo).
    automaton: AhoCorasick,
    /// Per anchor: how far a match may start before its start, and end after its start —
    /// over it and every anchor that is a prefix of it (they start at the same byte).
    reach: Vec<(usize, usize)>,
}

impl Matcher {
    /// `None` when there are no forms.
    pub fn new(forms: &[Form]) -> Option<Self> {
        if forms.is_empty() {
            return None;
        }
        // Longer forms first: of two matches starting at one byte, the longer is redacted.
        let mut forms: Vec<&Form> = forms.iter().collect();
        forms.sort_by_key(|f| std::cmp::Reverse(f.text.len()));
        let expansion = encodings::max_expansion();
        let mut hirs = Vec::with_capacity(forms.len());
        let mut anchor_texts: Vec<String> = Vec::new();
        let mut reach: Vec<(usize, usize)> = Vec::new();
        let mut all_anchored = true;
        let (mut max_len, mut window, mut min_len) = (0, 0, usize::MAX);
        for form in &forms {
            let chars: Vec<Hir> = form.text.chars().map(encodings::char_hir).collect();
            let lens: Vec<usize> = chars
                .iter()
                .map(|h| h.properties().maximum_len().unwrap_or(usize::MAX / 4))
                .collect();
            let len: usize = lens.iter().sum();
            max_len = max_len.max(len);
            // Only the length (and whether the form can be escaped at all) counts here:
            // the streaming hold-back is sized from it and must not tell anything else.
            let bound = if form.escapable {
                expansion * form.text.len()
            } else {
                form.text.len()
            };
            debug_assert!(len <= bound, "a spelling longer than the bound");
            window = window.max(bound.max(len));
            match anchor(&form.text) {
                Some((start, end)) => {
                    let (before, after) = reach_of(&form.text, &lens, start, end);
                    let text = form.text[start..end].to_owned();
                    match anchor_texts.iter().position(|t| *t == text) {
                        Some(i) => {
                            reach[i].0 = reach[i].0.max(before);
                            reach[i].1 = reach[i].1.max(after);
                        }
                        None => {
                            anchor_texts.push(text);
                            reach.push((before, after));
                        }
                    }
                }
                None => all_anchored = false,
            }
            let hir = Hir::concat(chars);
            min_len = min_len.min(hir.properties().minimum_len().unwrap_or(0));
            hirs.push(hir);
        }
        let regex = Regex::builder()
            .configure(
                meta::Config::new()
                    .utf8_empty(false)
                    // Secrets with many special characters make large automata; the limit
                    // only guards against pathological input, and secrets are ours.
                    .nfa_size_limit(Some(256 << 20)),
            )
            .build_many_from_hir(&hirs)
            // Only an automaton past the size limit fails: far beyond any set of secrets.
            .expect("the scrubbing expression builds");
        let anchors = all_anchored.then(|| {
            // From each anchor's start: the widest reach of it and of its prefixes.
            let spans: Vec<(usize, usize)> = anchor_texts
                .iter()
                .zip(&reach)
                .map(|(text, (before, after))| (*before, text.len() + after))
                .collect();
            let reach = anchor_texts
                .iter()
                .map(|text| {
                    anchor_texts
                        .iter()
                        .zip(&spans)
                        .filter(|(other, _)| text.starts_with(other.as_str()))
                        .fold((0, 0), |(b, e), (_, (before, end))| {
                            (b.max(*before), e.max(*end))
                        })
                })
                .collect();
            Anchors {
                automaton: AhoCorasick::builder()
                    .match_kind(AcKind::LeftmostLongest)
                    .build(&anchor_texts)
                    .expect("the anchor automaton builds"),
                reach,
            }
        });
        Some(Self {
            regex,
            anchors,
            max_len,
            // A match may hold the breaks of a wrapped encoding.
            window: wrapped::window(window),
            min_len,
        })
    }

    /// The longest match, in bytes.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// A bound on the length of any match that depends only on the secrets' lengths: the
    /// streaming scrubber holds back one byte less than this.
    pub fn window(&self) -> usize {
        self.window
    }

    pub fn is_match(&self, hay: &[u8]) -> bool {
        self.find_iter(hay).next().is_some()
    }

    /// The leftmost-first matches of `hay`, without overlaps, in order: `(start, end)`.
    /// Where `hay` holds breaks a wrapped encoding may have ([`wrapped::unwrap`]), also
    /// the matches across them, overlapping ones merged into one.
    pub fn find_iter<'h>(&'h self, hay: &'h [u8]) -> Matches<'h> {
        if hay.len() < self.min_len {
            return Matches::found(self, hay, Vec::new());
        }
        match wrapped::unwrap(hay) {
            Some(view) => Matches::found(self, hay, self.with_wrapped(hay, &view)),
            None => self.searched(hay),
        }
    }

    /// The matches of `hay` proper, searched lazily around its anchors.
    fn searched<'h>(&'h self, hay: &'h [u8]) -> Matches<'h> {
        let spans = match &self.anchors {
            None => vec![(0, hay.len())],
            Some(anchors) => anchors.windows(hay),
        };
        Matches {
            matcher: self,
            hay,
            spans,
            span: 0,
            pos: 0,
            found: None,
        }
    }

    /// The matches of `hay` and those of its unwrapped `view` that span a break, in order,
    /// overlapping ones merged.
    fn with_wrapped(&self, hay: &[u8], view: &wrapped::Unwrapped) -> Vec<(usize, usize)> {
        let across = self
            .searched(&view.bytes)
            .filter(|&(start, end)| view.spans_break(start, end))
            .map(|(start, end)| view.original(start, end));
        let mut all: Vec<(usize, usize)> = self.searched(hay).chain(across).collect();
        all.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(all.len());
        for (start, end) in all {
            match merged.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }
}

impl Anchors {
    /// Merged windows around every anchor, in order.
    fn windows(&self, hay: &[u8]) -> Vec<(usize, usize)> {
        let mut windows: Vec<(usize, usize)> = Vec::new();
        let mut pos = 0;
        while pos < hay.len() {
            let Some(m) = self.automaton.find(AcInput::new(hay).span(pos..hay.len())) else {
                break;
            };
            let (before, end) = self.reach[m.pattern().as_usize()];
            windows.push((
                m.start().saturating_sub(before),
                m.start().saturating_add(end).min(hay.len()),
            ));
            pos = m.start() + 1;
        }
        // Ordered by start already; a window may still end before an earlier one.
        windows.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(windows.len());
        for (start, end) in windows {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }
}

/// The byte range of the longest run of plain bytes of `text`, if long enough.
fn anchor(text: &str) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut best: Option<(usize, usize)> = None;
    let mut start = 0;
    for i in 0..=bytes.len() {
        if i < bytes.len() && plain(bytes[i]) {
            continue;
        }
        if i - start >= MIN_ANCHOR && best.is_none_or(|(s, e)| i - start > e - s) {
            best = Some((start, i));
        }
        start = i + 1;
    }
    best
}

/// How many bytes the characters before `start` and after `end` (byte offsets of `text`)
/// can take at most, from each character's longest spelling `lens`.
fn reach_of(text: &str, lens: &[usize], start: usize, end: usize) -> (usize, usize) {
    let (mut before, mut after) = (0usize, 0usize);
    for ((at, _), len) in text.char_indices().zip(lens) {
        if at < start {
            before = before.saturating_add(*len);
        } else if at >= end {
            after = after.saturating_add(*len);
        }
    }
    (before, after)
}

/// The iterator of [`Matcher::find_iter`].
pub struct Matches<'h> {
    matcher: &'h Matcher,
    hay: &'h [u8],
    spans: Vec<(usize, usize)>,
    span: usize,
    pos: usize,
    /// All the matches, found ahead (a buffer searched with its unwrapped view too).
    found: Option<std::vec::IntoIter<(usize, usize)>>,
}

impl<'h> Matches<'h> {
    /// Matches found ahead of time.
    fn found(matcher: &'h Matcher, hay: &'h [u8], found: Vec<(usize, usize)>) -> Self {
        Matches {
            matcher,
            hay,
            spans: Vec::new(),
            span: 0,
            pos: 0,
            found: Some(found.into_iter()),
        }
    }
}

impl Iterator for Matches<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if let Some(found) = &mut self.found {
            return found.next();
        }
        while let Some(&(start, end)) = self.spans.get(self.span) {
            let from = self.pos.max(start);
            if from < end {
                let input = Input::new(self.hay).span(from..end);
                if let Some(m) = self.matcher.regex.search(&input) {
                    self.pos = m.end();
                    return Some((m.start(), m.end()));
                }
            }
            self.span += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(text: &str) -> Form {
        Form {
            text: text.to_owned(),
            escapable: true,
        }
    }

    #[test]
    fn anchors_are_the_longest_plain_run() {
        assert_eq!(anchor("ab+cdef/g"), Some((3, 7)));
        assert_eq!(anchor("+/=<&' x"), None);
        assert_eq!(anchor("ab+cd"), None);
        assert_eq!(anchor("abc"), Some((0, 3)));
    }

    #[test]
    fn windowed_search_equals_a_search_of_the_whole_buffer() {
        let forms = [form("k3y+v4l/ue=<x>"), form("zz9&'q u"), form("k3y+v4l")];
        let anchored = Matcher::new(&forms).unwrap();
        assert!(anchored.anchors.is_some());
        let mut whole = Matcher::new(&forms).unwrap();
        whole.anchors = None;
        let hay = "k3y+v4l k3y\\u002Bv4l\\/ue=&lt;x&gt; zz9&amp;&#39;q+u zz9&q u k3y%2bv4l%2Fue%3D%3Cx%3E"
            .repeat(3);
        let a: Vec<_> = anchored.find_iter(hay.as_bytes()).collect();
        let b: Vec<_> = whole.find_iter(hay.as_bytes()).collect();
        assert_eq!(a, b);
        assert_eq!(a.len(), 12, "{a:?}");
    }

    #[test]
    fn a_wrapped_buffer_s_anchored_search_equals_a_search_of_its_whole_view() {
        // A token whose anchor is long (it straddles several cuts of short lines), one whose
        // anchor is short, and one that is a prefix of another's; and the short one alone,
        // whose matches span breaks far from their anchor. A narrower search of the view
        // (only around its cuts and the buffer's own anchors: tried on 2026-12-08, see
        // docs/benchmarks.md) must find exactly this.
        let long = [
            form("ghp_R2d2C3poBb8Lk4Zq9Xw7Vn5Mt1Hs6Jf0Ya3e"),
            form("k3y+v4l/ue=<x>"),
            form("ghp_R2d2C3po"),
        ];
        let short = [form("k3y+v4l/ue=<x>")];
        let mut compared = 0;
        for forms in [&long[..], &short[..]] {
            compared += differential(forms);
        }
        assert!(compared > 1000, "the hays hold matches: {compared}");
    }

    /// How many wrapped hays holding a match the anchored search of `forms` found exactly
    /// as a search of the whole view does.
    fn differential(forms: &[Form]) -> usize {
        let anchored = Matcher::new(forms).unwrap();
        assert!(anchored.anchors.is_some());
        let mut whole = Matcher::new(forms).unwrap();
        whole.anchors = None;
        let spellings = [
            "ghp_R2d2C3poBb8Lk4Zq9Xw7Vn5Mt1Hs6Jf0Ya3e",
            "k3y%2Bv4l%2Fue%3D%3Cx%3E",
            "k3y+v4l/ue=<x>",
            "ghp_R2d2C3po",
        ];
        let mut compared = 0;
        for spelling in spellings {
            for line in [16, 17, 23, 40, 76] {
                for offset in 0..line {
                    for brk in ["\n", "\r\n", "\\n", "\\r\\n", "=\n"] {
                        // Base64-ish filler, so the breaks around the spelling are wraps.
                        let text = format!("{}{spelling}{}", "Q".repeat(offset), "Zz".repeat(40));
                        let hay = text
                            .as_bytes()
                            .chunks(line)
                            .map(|c| std::str::from_utf8(c).unwrap())
                            .collect::<Vec<_>>()
                            .join(brk);
                        let a: Vec<_> = anchored.find_iter(hay.as_bytes()).collect();
                        let b: Vec<_> = whole.find_iter(hay.as_bytes()).collect();
                        assert_eq!(a, b, "{hay:?}");
                        compared += usize::from(!b.is_empty());
                    }
                }
            }
        }
        compared
    }

    #[test]
    fn anchors_that_are_prefixes_of_others_or_overlap_them_are_all_seen() {
        // "abc" is a prefix of "abcdef"; "defxyz" overlaps it.
        let forms = [form("abcdef+1"), form("=abc/zz"), form("defxyz'q")];
        let anchored = Matcher::new(&forms).unwrap();
        let mut whole = Matcher::new(&forms).unwrap();
        whole.anchors = None;
        let hay = "abcdefxyz&#39;q &#61;abc\\/zz abcdef%2B1 =abc/zz abcdefxyz'q abcdef+1";
        let a: Vec<_> = anchored.find_iter(hay.as_bytes()).collect();
        assert_eq!(a, whole.find_iter(hay.as_bytes()).collect::<Vec<_>>());
        assert_eq!(a.len(), 6, "{a:?}");
    }

    #[test]
    fn a_buffer_shorter_than_every_spelling_is_not_searched_and_nothing_is_missed() {
        // The shortest spelling of "k3y+v" is itself (5 bytes); of "q1w2e3r4" too (8).
        let forms = [form("k3y+v"), form("q1w2e3r4")];
        let m = Matcher::new(&forms).unwrap();
        assert_eq!(m.min_len, 5);
        let mut whole = Matcher::new(&forms).unwrap();
        whole.anchors = None;
        whole.min_len = 0;
        let hay = b"k3y+v k3y%2Bv q1w2e3r4 k3y\\u002bv xq1w2e3r";
        // Every slice, the short ones included: the same matches as a search of it all.
        for start in 0..hay.len() {
            for end in start..=hay.len() {
                let slice = &hay[start..end];
                let a: Vec<_> = m.find_iter(slice).collect();
                assert_eq!(a, whole.find_iter(slice).collect::<Vec<_>>(), "{slice:?}");
            }
        }
        assert!(m.is_match(b"k3y+v"));
        assert!(!m.is_match(b"k3y+"));
    }

    #[test]
    fn forms_without_anchor_search_everything() {
        let m = Matcher::new(&[form("+/=<&'")]).unwrap();
        assert!(m.anchors.is_none());
        assert_eq!(
            m.find_iter(b"x %2B\\/&#61;&lt;&amp;&apos; y")
                .collect::<Vec<_>>(),
            vec![(2, 27)]
        );
    }
}
