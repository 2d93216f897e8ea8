//! Data-driven policy tests, in the spirit of cedar-testing: a policy directory carries
//! `tests/*.toml` files of `[[case]]` entries, each a request and the decision (and, if
//! given, the exact determining policies) it must get.
//!
//! Why data and not Rust: the people who write policies are security engineers, not the
//! proxy's developers. A test they can write next to the policy, run with
//! `ostiary policy test`, and read in a review keeps a policy change honest about what it
//! allows. The shipped library carries its own cases (`policies/library/tests/`), and a test
//! of this crate runs them, so the library and its tests cannot drift apart.
//!
//! A case is an `http` request, a `connect`, an `mcp` message (a JSON-RPC method other than
//! `tools/call`), a `spawn` of a child session under another agent name, or a `tool` call of
//! a tool in the policy set's catalog. Every case may give `session` (what the session did
//! so far and where it sits in the spawn tree), as every action's context carries it. A tool case gives what the proxy would observe — the arguments, the session so far,
//! an approval — and takes the rest from the catalog exactly as the proxy does: the call's
//! `impact.records` from the tool's extractor and its `impact.cost` from the tool's cost, so a
//! case cannot claim an impact the proxy would never compute ([`tool_call`], which
//! `ostiary policy explain --tool` uses too). Unknown actions and tools, and
//! fields of another action, are errors naming the file and line, never silently skipped cases.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use toml::Spanned;

use crate::catalog::{cost_to_micros, Catalog};
use crate::decide::Decision;
use crate::load::PolicyEngine;
use crate::request::{AccessRequest, Action, Recent, SessionState};

mod case;
pub use case::*;

/// Why a test directory could not be run. Failing cases are not errors: they are reported
/// in [`TestReport`]; errors mean the tests themselves are unreadable.
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("no test directory at {} (policy tests live in <policy dir>/tests/*.toml)", .0.display())]
    MissingDir(PathBuf),
    #[error("reading test directory {}: {source}", dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("test directory {} holds no *.toml file", .0.display())]
    Empty(PathBuf),
    #[error("reading {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not have the shape of a test file.
    #[error("{file}{}: {message}", line_suffix(.line))]
    Parse {
        file: String,
        /// 1-based line, when toml points at one.
        line: Option<usize>,
        message: String,
    },
    /// A case parsed but does not describe a request (a field for the wrong action, a
    /// non-canonical host, a tool the catalog does not have, a duplicate name).
    #[error("{file}:{line}: case {case:?}: {message}")]
    Case {
        file: String,
        /// 1-based line of the case's `[[case]]` entry.
        line: usize,
        case: String,
        message: String,
    },
}

fn line_suffix(line: &Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseResult {
    /// Test file name (not the full path).
    pub file: String,
    /// The case's `name`.
    pub name: String,
    /// What the engine decided.
    pub decision: Decision,
    /// `None` when the case passed; otherwise expected vs got, for a human.
    pub failure: Option<String>,
}

impl CaseResult {
    /// True when the decision matched the expectation.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// Every case of a test directory, in file order then case order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestReport {
    pub cases: Vec<CaseResult>,
}

impl TestReport {
    /// Number of passing cases.
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.passed()).count()
    }

    /// Number of failing cases.
    pub fn failed(&self) -> usize {
        self.cases.len() - self.passed()
    }

    /// The failing cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases.iter().filter(|c| !c.passed())
    }
}

/// Run every `*.toml` file of `tests_dir` (sorted by name, not recursive) against `engine`.
///
/// All files are parsed before any case runs, so a broken file is reported as an error
/// rather than as a partial report that looks like a pass.
pub fn run_dir(engine: &PolicyEngine, tests_dir: &Path) -> Result<TestReport, TestError> {
    if !tests_dir.is_dir() {
        return Err(TestError::MissingDir(tests_dir.to_owned()));
    }
    let paths = crate::load::files_with_extension(tests_dir, "toml").map_err(|source| {
        TestError::ReadDir {
            dir: tests_dir.to_owned(),
            source,
        }
    })?;
    if paths.is_empty() {
        return Err(TestError::Empty(tests_dir.to_owned()));
    }

    let mut files = Vec::with_capacity(paths.len());
    for path in &paths {
        let text = std::fs::read_to_string(path).map_err(|source| TestError::ReadFile {
            path: path.clone(),
            source,
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let cases = parse_file(&name, &text, engine.catalog())?;
        files.push((name, cases));
    }

    let mut report = TestReport::default();
    for (file, cases) in files {
        for (case, request) in cases {
            report.cases.push(run_case(engine, &file, &case, &request));
        }
    }
    Ok(report)
}

/// Parse one test file into its cases and their requests; tool cases take their tool from
/// `catalog`. `file` names the file in errors.
pub fn parse_file(
    file: &str,
    text: &str,
    catalog: &Catalog,
) -> Result<Vec<(Case, AccessRequest)>, TestError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let parsed: TestFile = toml::from_str(text).map_err(|e| TestError::Parse {
        file: file.to_owned(),
        line: e.span().map(|span| line_of(span.start)),
        message: e.message().trim_end().to_owned(),
    })?;
    if parsed.case.is_empty() {
        return Err(TestError::Parse {
            file: file.to_owned(),
            line: None,
            message: "no [[case]] entries".into(),
        });
    }
    let mut names = HashSet::new();
    let mut cases = Vec::with_capacity(parsed.case.len());
    for spanned in parsed.case {
        let line = line_of(spanned.span().start);
        let case = spanned.into_inner();
        let case_error = |message: String| TestError::Case {
            file: file.to_owned(),
            line,
            case: case.name.clone(),
            message,
        };
        // Names identify cases in the report; a duplicate would make a failure ambiguous.
        if !names.insert(case.name.clone()) {
            return Err(case_error("the name is used twice in this file".into()));
        }
        let request = case.request(catalog).map_err(case_error)?;
        cases.push((case, request));
    }
    Ok(cases)
}

/// Decide one case and compare with its expectation.
pub fn run_case(
    engine: &PolicyEngine,
    file: &str,
    case: &Case,
    request: &AccessRequest,
) -> CaseResult {
    let decision = engine.decide(request);
    CaseResult {
        file: file.to_owned(),
        name: case.name.clone(),
        failure: difference(case, &decision),
        decision,
    }
}

/// Expected vs got, or `None` if they agree.
fn difference(case: &Case, decision: &Decision) -> Option<String> {
    let got = match decision {
        Decision::Allow { .. } => Expect::Allow,
        Decision::Escalate { .. } => Expect::Escalate,
        Decision::Deny { .. } => Expect::Deny,
    };
    let decision_ok = got == case.expect;
    let policies_ok = case.policies.as_ref().is_none_or(|expected| {
        let expected: HashSet<&str> = expected.iter().map(String::as_str).collect();
        let got: HashSet<&str> = decision.policies().iter().map(String::as_str).collect();
        expected == got
    });
    if decision_ok && policies_ok {
        return None;
    }
    let expected = match &case.policies {
        Some(ids) => format!("{} by {}", case.expect, id_list(ids)),
        None => case.expect.to_string(),
    };
    Some(format!("expected {expected}, got {}", describe(decision)))
}

/// A decision for a human: outcome, determining policies, and the deny reason.
pub fn describe(decision: &Decision) -> String {
    match decision {
        Decision::Allow { policies } => format!("allow by {}", id_list(policies)),
        Decision::Escalate { policies } => {
            format!("escalate by {} (approval required)", id_list(policies))
        }
        Decision::Deny { policies, reason } if policies.is_empty() => format!("deny ({reason})"),
        Decision::Deny { policies, reason } => {
            format!("deny by {} ({reason})", id_list(policies))
        }
    }
}

/// `[a, b]` with ids sorted, so that differences read the same whatever Cedar's order.
fn id_list(ids: &[String]) -> String {
    let mut ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    format!("[{}]", ids.join(", "))
}

#[cfg(test)]
mod tests;
