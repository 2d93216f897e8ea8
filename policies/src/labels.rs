//! Session labels in the catalog: `labels = [...]` on a `[[tool]]` and the `[[host]]` tables
//! of `tools.toml`, which name what a session touches ("private_data", "untrusted_input").
//!
//! A request that policy allows to a labelled tool or host adds those labels to its session
//! for the rest of the session's life (the proxy keeps them); policies read them as
//! `context.session.labels`. Here they are only named and checked: a label is what a policy
//! compares with a string literal, so a typo in the catalog must fail the load, not silently
//! never match.
//!
//! A host is a lowercase name or IP, or `*.<suffix>`: every name under the suffix, never the
//! suffix itself (`*.example.com` labels `a.example.com` and `a.b.example.com`, not
//! `example.com`), as a wildcard certificate would read it. Where an exact entry and
//! wildcards match, the host carries all their labels.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;

/// Most labels one tool or host may carry.
pub const MAX_LABELS: usize = 16;

/// Longest label, in bytes.
pub const MAX_LABEL_LEN: usize = 64;

/// What is wrong with a `labels` list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelProblem {
    #[error(
        "label {0:?}: a label is 1-64 of `a-z`, `0-9` and `_`, starting with a letter \
         (policies compare it as written: `context.session.labels.contains(\"{0}\")`)"
    )]
    Invalid(String),
    #[error("label {0:?} is listed twice")]
    Duplicate(String),
    #[error("{0} labels: at most 16 per entry")]
    TooMany(usize),
}

/// What is wrong with one `[[host]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostProblem {
    #[error(
        "the name must be a lowercase host name or IP address without port, or `*.<suffix>` \
         for every name under a suffix"
    )]
    InvalidName,
    #[error("the host is already listed at line {first_line}")]
    Duplicate { first_line: usize },
    #[error("labels: a host entry needs at least one label")]
    NoLabels,
    #[error("labels: {0}")]
    Label(#[from] LabelProblem),
}

/// A `[[host]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHost {
    pub(crate) name: toml::Spanned<String>,
    pub(crate) labels: Vec<String>,
}

impl crate::load::PolicyEngine {
    /// Whether some policy of the set may read `context.session.labels` or
    /// `context.session.recent`: where fetching them costs a round trip, the proxy fetches
    /// them only then (it records them whatever the set, for the sets to come).
    pub fn reads_session_memory(&self) -> bool {
        self.context_use().reads_memory()
    }
}

/// Check a `labels` list: each name, no repeats, at most [`MAX_LABELS`].
pub fn check_labels(labels: &[String]) -> Result<(), LabelProblem> {
    if labels.len() > MAX_LABELS {
        return Err(LabelProblem::TooMany(labels.len()));
    }
    let mut seen = BTreeSet::new();
    for label in labels {
        if !is_label(label) {
            return Err(LabelProblem::Invalid(label.clone()));
        }
        if !seen.insert(label.as_str()) {
            return Err(LabelProblem::Duplicate(label.clone()));
        }
    }
    Ok(())
}

/// Whether `label` may be a label: `[a-z][a-z0-9_]{0,63}`.
pub fn is_label(label: &str) -> bool {
    label.len() <= MAX_LABEL_LEN
        && label.starts_with(|c: char| c.is_ascii_lowercase())
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The labels of `[[host]]` entries, by exact name and by wildcard suffix.
#[derive(Debug, Clone, Default)]
pub struct HostLabels {
    /// Exact names, and the line each was listed at.
    exact: HashMap<String, (usize, Vec<String>)>,
    /// `*.example.com` as `.example.com`, with its line.
    suffixes: Vec<(String, usize, Vec<String>)>,
}

impl HostLabels {
    /// Add one entry, checked; `line` names it in a later duplicate's error.
    pub(crate) fn add(&mut self, raw: RawHost, line: usize) -> Result<(), HostProblem> {
        let name = raw.name.into_inner();
        if raw.labels.is_empty() {
            return Err(HostProblem::NoLabels);
        }
        check_labels(&raw.labels)?;
        if let Some(suffix) = name.strip_prefix("*.") {
            if !is_host_name(suffix) {
                return Err(HostProblem::InvalidName);
            }
            let suffix = format!(".{suffix}");
            if let Some((_, first_line, _)) = self.suffixes.iter().find(|(s, ..)| *s == suffix) {
                return Err(HostProblem::Duplicate {
                    first_line: *first_line,
                });
            }
            self.suffixes.push((suffix, line, raw.labels));
            return Ok(());
        }
        if !is_host_name(&name) {
            return Err(HostProblem::InvalidName);
        }
        if let Some((first_line, _)) = self.exact.get(&name) {
            return Err(HostProblem::Duplicate {
                first_line: *first_line,
            });
        }
        self.exact.insert(name, (line, raw.labels));
        Ok(())
    }

    /// The labels `host` (canonical: lowercase, no port) carries; empty for most hosts.
    pub fn of<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let exact = self.exact.get(host).into_iter().flat_map(|(_, l)| l);
        let wild = self
            .suffixes
            .iter()
            .filter(move |(suffix, ..)| host.len() > suffix.len() && host.ends_with(suffix))
            .flat_map(|(_, _, l)| l);
        exact.chain(wild).map(String::as_str)
    }

    /// Whether no host carries a label.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffixes.is_empty()
    }
}

/// A host as the proxy canonicalises it: lowercase DNS labels (letters, digits, `-`, `_`) or
/// an IP address; no port, no trailing dot, no empty label.
fn is_host_name(name: &str) -> bool {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return !name.contains(|c: char| c.is_ascii_uppercase());
    }
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &str, labels: &[&str]) -> RawHost {
        RawHost {
            name: toml::Spanned::new(0..0, name.to_owned()),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        }
    }

    #[test]
    fn labels_are_checked() {
        assert!(check_labels(&["private_data".into(), "a1".into()]).is_ok());
        for bad in ["", "Private", "1abc", "a-b", "a b", "ünï", &"a".repeat(65)] {
            assert_eq!(
                check_labels(&[bad.to_owned()]),
                Err(LabelProblem::Invalid(bad.to_owned())),
                "{bad:?}"
            );
        }
        assert!(is_label(&"a".repeat(64)));
        assert_eq!(
            check_labels(&["x".into(), "x".into()]),
            Err(LabelProblem::Duplicate("x".into()))
        );
        let many: Vec<String> = (0..17).map(|i| format!("l{i}")).collect();
        assert_eq!(check_labels(&many), Err(LabelProblem::TooMany(17)));
        assert!(check_labels(&many[..16]).is_ok());
    }

    #[test]
    fn hosts_match_exactly_or_under_a_wildcard() {
        let mut hosts = HostLabels::default();
        hosts
            .add(raw("news.example.com", &["untrusted_input"]), 1)
            .unwrap();
        hosts.add(raw("*.example.com", &["external"]), 2).unwrap();
        hosts.add(raw("10.0.0.1", &["internal"]), 3).unwrap();
        let of = |h: &'static str| hosts.of(h).collect::<Vec<_>>();
        assert_eq!(of("news.example.com"), ["untrusted_input", "external"]);
        assert_eq!(of("a.b.example.com"), ["external"]);
        assert!(
            of("example.com").is_empty(),
            "a wildcard never labels its suffix"
        );
        assert!(of("badexample.com").is_empty());
        assert_eq!(of("10.0.0.1"), ["internal"]);
        assert!(of("other.test").is_empty());
    }

    #[test]
    fn bad_host_entries_are_refused() {
        let mut hosts = HostLabels::default();
        for name in [
            "",
            "News.example.com",
            "a.example.com:443",
            "a/b",
            "*.",
            "*",
            "a.*.com",
            "**.example.com",
            "a..b",
            "a.b.",
        ] {
            assert_eq!(
                hosts.add(raw(name, &["x"]), 1),
                Err(HostProblem::InvalidName),
                "{name:?}"
            );
        }
        assert_eq!(hosts.add(raw("a.test", &[]), 1), Err(HostProblem::NoLabels));
        assert_eq!(
            hosts.add(raw("a.test", &["Bad"]), 1),
            Err(HostProblem::Label(LabelProblem::Invalid("Bad".into())))
        );
        hosts.add(raw("a.test", &["x"]), 4).unwrap();
        assert_eq!(
            hosts.add(raw("a.test", &["y"]), 9),
            Err(HostProblem::Duplicate { first_line: 4 })
        );
        hosts.add(raw("*.a.test", &["x"]), 5).unwrap();
        assert_eq!(
            hosts.add(raw("*.a.test", &["y"]), 9),
            Err(HostProblem::Duplicate { first_line: 5 })
        );
    }
}
