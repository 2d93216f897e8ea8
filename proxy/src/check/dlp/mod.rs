//! The `dlp` check's scanner: secrets in request bodies going to an upstream (issue 6,
//! docs/design.md §3 `check`), found while the body streams, before the bytes that carry them
//! leave the proxy.
//!
//! - [`patterns`]: the default detectors — private keys, AWS, GCP, GitHub, Slack, Stripe,
//!   JWTs — each a literal anchor plus a validator over a bounded window around it.
//! - [`cards`]: payment card numbers (Luhn, scheme IIN, boundaries), found by a byte scan.
//! - Caller-supplied literal values ("any value of a credential known to the broker"),
//!   matched exactly.
//! - [`stream`]: [`StreamScanner`] and [`DlpBody`], the same scan over a body arriving in
//!   pieces, holding back a fixed window (whatever the bytes are: how long a chunk waits
//!   must not tell an upstream whether it began a credential) and what a validator still
//!   needs to decide.
//!
//! One Aho–Corasick automaton holds every anchor (a few dozen: its SIMD prefilter skips
//! most of a body), a second one the literal values, so a body is read twice at most
//! whatever the number of detectors; cards add a probe of every 13th byte.
//!
//! A [`Finding`] names the kind and the offset, never the matched bytes: the refusal, the
//! audit record and the logs must not become the leak. For the same reason [`Detectors`]'
//! `Debug` shows names and counts, never a literal value.
//!
//! What counts as "the" finding: the one starting first in the body (ties: a broker
//! credential, then the detectors in [`patterns::Rule`] order, then cards). The streaming
//! scanner reports exactly that one for any chunking of the body.

mod body;
mod cards;
mod patterns;
mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, Input, MatchKind};

pub use body::{Blocked, DlpBody};
pub use stream::{StreamScanner, MAX_HELD};

use patterns::{Rule, View, DEFAULT_ANCHORS};

/// Literal values shorter than this are not scanned for: they would match everywhere
/// (`1234`), and refusing bodies on such matches would make the check useless. They are
/// listed by [`Detectors::skipped_literals`] so the caller can say so.
pub const MIN_LITERAL_LEN: usize = 8;

/// The kinds the default set reports (literal values report `credential:<name>`).
pub const KINDS: &[&str] = &[
    "private_key",
    "gcp_service_account",
    "aws_access_key",
    "aws_secret_key",
    "gcp_api_key",
    "github_token",
    "slack_token",
    "slack_webhook",
    "stripe_key",
    "jwt",
    "card_number",
];

/// A secret found in a body: which kind, and where it starts. Never the bytes themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `"aws_access_key"`, `"card_number"`, …, or `"credential:<name>"` for a literal value.
    pub kind: String,
    /// Byte offset of the match's first byte (for an AWS secret key and a service-account
    /// file, of the label or `"service_account"` that makes it one) in the whole body.
    pub offset: u64,
}

/// The detectors of one scan: built once (compiling the automata), shared by every body.
pub struct Detectors {
    /// The default set's anchors; a few dozen, so the automaton's SIMD prefilter applies.
    anchors: Anchors,
    /// The literal values, apart: mixed in with the anchors, a broker's many credentials
    /// would push the pattern count past what the prefilter handles, and every body would
    /// pay for it.
    literals: Option<Anchors>,
    /// Every pattern with its rule, kept to rebuild with more literals.
    patterns: Vec<(Vec<u8>, Rule)>,
    /// The longest pattern, in bytes.
    longest: usize,
    /// No pattern holds a newline, so none can match across one: a stream may release
    /// everything up to its last newline.
    newline_free: bool,
    /// Literal names by [`Rule::Literal`] index.
    literal_names: Vec<String>,
    skipped: Vec<String>,
    cards: bool,
}

/// One automaton and what its matches stand for.
struct Anchors {
    /// Leftmost-longest, searched from one past each match's start: every position where
    /// some pattern starts is visited, with the longest pattern there.
    automaton: AhoCorasick,
    /// Per pattern: the rules of it and of every pattern that is a prefix of it (they
    /// start at the same place), with their lengths.
    rules: Vec<Vec<(Rule, usize)>>,
}

impl Anchors {
    fn new(patterns: &[(&[u8], Rule)]) -> Option<Self> {
        let mut index: HashMap<&[u8], usize> = HashMap::new();
        let mut distinct: Vec<&[u8]> = Vec::new();
        let mut own: Vec<Vec<Rule>> = Vec::new();
        for &(bytes, rule) in patterns {
            let id = *index.entry(bytes).or_insert_with(|| {
                distinct.push(bytes);
                own.push(Vec::new());
                distinct.len() - 1
            });
            own[id].push(rule);
        }
        if distinct.is_empty() {
            return None;
        }
        let rules = distinct
            .iter()
            .map(|p| {
                let mut all: Vec<(Rule, usize)> = distinct
                    .iter()
                    .zip(&own)
                    .filter(|(q, _)| p.starts_with(q))
                    .flat_map(|(q, rules)| rules.iter().map(|&r| (r, q.len())))
                    .collect();
                all.sort();
                all
            })
            .collect();
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&distinct)
            // Only a pattern set too large for the automaton's ids fails, far beyond any
            // broker's credentials.
            .expect("the DLP automaton builds");
        Some(Self { automaton, rules })
    }
}

impl std::fmt::Debug for Detectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a literal's value is a live credential.
        f.debug_struct("Detectors")
            .field("patterns", &self.patterns.len())
            .field("literals", &self.literal_names)
            .field("skipped_literals", &self.skipped)
            .field("cards", &self.cards)
            .finish()
    }
}

/// What a scan of a buffer decided.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// A secret starts at this index of the buffer.
    Found { at: usize, kind: Hit },
    /// No secret starts before `safe`; the bytes from `safe` on could still start one.
    Clean { safe: usize },
}

/// What was found: an anchored rule or a card number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Hit {
    Rule(Rule),
    Card,
}

impl Detectors {
    /// The default detector set (see [`KINDS`]), with no literal values.
    pub fn default_set() -> Self {
        let patterns = DEFAULT_ANCHORS
            .iter()
            .map(|&(anchor, rule)| (anchor.as_bytes().to_vec(), rule))
            .collect();
        Self::build(patterns, Vec::new(), Vec::new(), true)
    }

    /// `base` plus literal values, each `(name, value)` reported as `credential:<name>`
    /// when its value occurs byte for byte. Values shorter than [`MIN_LITERAL_LEN`] are
    /// skipped (see [`Detectors::skipped_literals`]).
    pub fn with_literals(base: &Detectors, literals: Vec<(String, Vec<u8>)>) -> Self {
        let mut patterns = base.patterns.clone();
        let mut names = base.literal_names.clone();
        let mut skipped = base.skipped.clone();
        for (name, value) in literals {
            if value.len() < MIN_LITERAL_LEN {
                skipped.push(name);
                continue;
            }
            let index = u32::try_from(names.len()).expect("fewer than 2^32 literals");
            names.push(name);
            patterns.push((value, Rule::Literal(index)));
        }
        Self::build(patterns, names, skipped, base.cards)
    }

    fn build(
        patterns: Vec<(Vec<u8>, Rule)>,
        literal_names: Vec<String>,
        skipped: Vec<String>,
        cards: bool,
    ) -> Self {
        let split = |literal: bool| -> Vec<(&[u8], Rule)> {
            patterns
                .iter()
                .filter(|(_, r)| matches!(r, Rule::Literal(_)) == literal)
                .map(|(p, r)| (p.as_slice(), *r))
                .collect()
        };
        let anchors = Anchors::new(&split(false)).expect("the default set has anchors");
        let literals = Anchors::new(&split(true));
        let longest = patterns.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let newline_free = patterns.iter().all(|(p, _)| !p.contains(&b'\n'));
        Self {
            anchors,
            literals,
            longest,
            newline_free,
            literal_names,
            skipped,
            cards,
            patterns,
        }
    }

    /// Names of literal values not scanned for because they are too short.
    pub fn skipped_literals(&self) -> &[String] {
        &self.skipped
    }

    /// How many bytes a stream keeps back at most, besides what a validator of the
    /// default set still needs (`longest pattern − 1`, whatever the bytes are).
    pub fn hold_back(&self) -> usize {
        self.longest.saturating_sub(1)
    }

    /// Names of the literal values scanned for.
    pub fn literal_names(&self) -> &[String] {
        &self.literal_names
    }

    /// The first secret in a whole buffer, if any.
    pub fn scan(&self, bytes: &[u8]) -> Option<Finding> {
        match self.scan_view(&View::new(&[], bytes, true)) {
            Outcome::Found { at, kind } => Some(self.finding(kind, at as u64)),
            Outcome::Clean { .. } => None,
        }
    }

    fn finding(&self, hit: Hit, offset: u64) -> Finding {
        let kind = match hit {
            Hit::Rule(Rule::Literal(i)) => format!("credential:{}", self.literal_names[i as usize]),
            Hit::Rule(rule) => rule.kind().to_owned(),
            Hit::Card => "card_number".to_owned(),
        };
        Finding { kind, offset }
    }

    /// The core of both scans. With `v.eof()` false, a candidate that needs bytes not yet
    /// arrived is *pending*: a finding is reported only when no pending candidate starts
    /// at or before it, so the result never depends on where the body was cut.
    fn scan_view(&self, v: &View<'_>) -> Outcome {
        let buf = v.bytes();
        let len = buf.len();
        let mut best: Option<(usize, Hit)> = None;
        let mut pending: Option<usize> = None;
        let limit = |best: &Option<(usize, Hit)>, pending: Option<usize>| {
            best.map_or(usize::MAX, |(at, _)| at)
                .min(pending.unwrap_or(usize::MAX))
        };
        for anchors in std::iter::once(&self.anchors).chain(&self.literals) {
            let mut pos = 0;
            while pos < len {
                let lim = limit(&best, pending);
                let Some(m) = anchors.automaton.find(Input::new(buf).span(pos..len)) else {
                    break;
                };
                let s = m.start();
                if s > lim {
                    break;
                }
                for &(rule, n) in &anchors.rules[m.pattern().as_usize()] {
                    match rule.check(v, s, n) {
                        Ok(true) => {
                            let hit = (s, Hit::Rule(rule));
                            if best.is_none_or(|b| hit < b) {
                                best = Some(hit);
                            }
                        }
                        Ok(false) => {}
                        Err(_) => pending = Some(pending.map_or(s, |p| p.min(s))),
                    }
                }
                pos = s + 1;
            }
        }
        if !v.eof() && self.longest > 1 {
            // A fixed tail, whether or not it could begin a pattern (see [`stream`]): the
            // last `longest - 1` bytes, but nothing after a newline when no pattern holds
            // one. Lengths and newlines only, never the literals' bytes.
            let fixed = len.saturating_sub(self.longest - 1);
            let from = match memchr::memrchr(b'\n', buf) {
                Some(i) if self.newline_free => fixed.max(i + 1),
                _ => fixed,
            };
            if from < len {
                pending = Some(pending.map_or(from, |p| p.min(from)));
            }
        }
        if self.cards {
            // A card at the same start as another finding loses the tie: only earlier ones.
            match cards::first(v, limit(&best, pending)) {
                Some(Ok(at)) => best = Some((at, Hit::Card)),
                Some(Err(at)) => pending = Some(at),
                None => {}
            }
        }
        match (best, pending) {
            (Some((at, kind)), p) if p.is_none_or(|p| p > at) => Outcome::Found { at, kind },
            (_, p) => Outcome::Clean {
                safe: p.unwrap_or(len),
            },
        }
    }
}
