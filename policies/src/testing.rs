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
//! Only the actions that exist today are accepted (`http`, `connect`); anything else is an
//! error naming the file and line, never a silently skipped case.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::decide::Decision;
use crate::load::PolicyEngine;
use crate::request::{AccessRequest, Action};

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
    /// non-canonical host, a duplicate name).
    #[error("{file}: case {case:?}: {message}")]
    Case {
        file: String,
        case: String,
        message: String,
    },
}

fn line_suffix(line: &Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

/// The decision a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Allow,
    Deny,
    /// Denied, pending a human's approval ([`Decision::Escalate`]).
    Escalate,
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expect::Allow => "allow",
            Expect::Deny => "deny",
            Expect::Escalate => "escalate",
        })
    }
}

/// The action of a case. A string in the file; parsed here so that an unknown action (a
/// tool name before the catalog exists, a typo) fails with a message that says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum CaseAction {
    Http,
    Connect,
}

impl TryFrom<String> for CaseAction {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.as_str() {
            "http" => Ok(CaseAction::Http),
            "connect" => Ok(CaseAction::Connect),
            other => Err(format!(
                "unknown action {other:?}: expected \"http\" or \"connect\" \
                 (tool actions arrive with the tool catalog)"
            )),
        }
    }
}

/// One `[[case]]` of a test file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    #[serde(default = "default_agent")]
    pub agent: String,
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub action: CaseAction,
    pub host: String,
    /// http only; default `GET`.
    pub method: Option<String>,
    /// http only; default `https`.
    pub scheme: Option<String>,
    /// Default 443 (80 for an http case with `scheme = "http"`).
    pub port: Option<u16>,
    /// http only; default `/`.
    pub path: Option<String>,
    /// http only; default empty.
    pub query: Option<String>,
    /// connect only; default the host.
    pub sni: Option<String>,
    pub expect: Expect,
    /// The exact determining policy ids, in any order. Absent: not checked.
    pub policies: Option<Vec<String>>,
}

fn default_agent() -> String {
    "agent".to_owned()
}

fn default_tenant() -> String {
    "default".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    #[serde(default)]
    case: Vec<Case>,
}

impl Case {
    /// The request this case describes. Fields of the other action are refused rather than
    /// ignored: a `method` on a connect case means the author misunderstood the case.
    pub fn request(&self) -> Result<AccessRequest, String> {
        check_host(&self.host)?;
        let action = match self.action {
            CaseAction::Http => {
                if self.sni.is_some() {
                    return Err("`sni` applies to connect cases only".into());
                }
                let scheme = self.scheme.clone().unwrap_or_else(|| "https".to_owned());
                let default_port = if scheme == "http" { 80 } else { 443 };
                Action::Http {
                    method: self.method.clone().unwrap_or_else(|| "GET".to_owned()),
                    port: self.port.unwrap_or(default_port),
                    scheme,
                    path: self.path.clone().unwrap_or_else(|| "/".to_owned()),
                    query: self.query.clone().unwrap_or_default(),
                }
            }
            CaseAction::Connect => {
                let http_only = [
                    ("method", self.method.is_some()),
                    ("scheme", self.scheme.is_some()),
                    ("path", self.path.is_some()),
                    ("query", self.query.is_some()),
                ];
                if let Some((field, _)) = http_only.iter().find(|(_, set)| *set) {
                    return Err(format!("`{field}` applies to http cases only"));
                }
                Action::Connect {
                    port: self.port.unwrap_or(443),
                    sni: self.sni.clone().unwrap_or_else(|| self.host.clone()),
                }
            }
        };
        Ok(AccessRequest {
            agent: self.agent.clone(),
            tenant: self.tenant.clone(),
            host: self.host.clone(),
            action,
        })
    }
}

/// Policies only ever see canonical hosts (the proxy canonicalises before deciding), so a
/// case with `PyPI.org` would test a request that cannot happen. Refuse the forms that are
/// plainly not canonical instead of guessing the proxy's full canonicalisation here.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("`host` is empty".into());
    }
    if host
        .chars()
        .any(|c| c.is_ascii_uppercase() || c.is_whitespace())
        || host.ends_with('.')
        || host.starts_with('[')
    {
        return Err(format!(
            "host {host:?} is not canonical: write it lowercase, without a trailing dot, \
             brackets or port, as policies see it"
        ));
    }
    Ok(())
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
    let read_dir = std::fs::read_dir(tests_dir).map_err(|source| TestError::ReadDir {
        dir: tests_dir.to_owned(),
        source,
    })?;
    let mut paths = Vec::new();
    for entry in read_dir {
        let entry = entry.map_err(|source| TestError::ReadDir {
            dir: tests_dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            paths.push(path);
        }
    }
    if paths.is_empty() {
        return Err(TestError::Empty(tests_dir.to_owned()));
    }
    paths.sort();

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
        let cases = parse_file(&name, &text)?;
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

/// Parse one test file into its cases and their requests. `file` names it in errors.
pub fn parse_file(file: &str, text: &str) -> Result<Vec<(Case, AccessRequest)>, TestError> {
    let parsed: TestFile = toml::from_str(text).map_err(|e| TestError::Parse {
        file: file.to_owned(),
        line: e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1),
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
    for case in parsed.case {
        let case_error = |message: String| TestError::Case {
            file: file.to_owned(),
            case: case.name.clone(),
            message,
        };
        // Names identify cases in the report; a duplicate would make a failure ambiguous.
        if !names.insert(case.name.clone()) {
            return Err(case_error("the name is used twice in this file".into()));
        }
        let request = case.request().map_err(case_error)?;
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
mod tests {
    use super::*;
    use crate::load::PolicySource;

    fn engine() -> PolicyEngine {
        PolicyEngine::from_sources(&[PolicySource {
            name: "t.cedar".into(),
            text: r#"
            @id("read") permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"a.example")
            when { context.method == "GET" };
            @id("no-admin") forbid (principal, action, resource) when { principal == Ostiary::Agent::"admin" };
            "#
            .into(),
        }])
        .unwrap()
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn passing_cases_pass() {
        let dir = dir_with(&[(
            "a.toml",
            r#"
            [[case]]
            name = "read"
            action = "http"
            host = "a.example"
            expect = "allow"
            policies = ["read"]

            [[case]]
            name = "write"
            action = "http"
            host = "a.example"
            method = "POST"
            expect = "deny"
            policies = []

            [[case]]
            name = "admin"
            agent = "admin"
            action = "http"
            host = "a.example"
            expect = "deny"
            policies = ["no-admin"]
            "#,
        )]);
        let report = run_dir(&engine(), dir.path()).unwrap();
        assert_eq!(report.cases.len(), 3);
        assert_eq!(report.failed(), 0, "{report:?}");
    }

    #[test]
    fn failing_cases_say_expected_and_got() {
        let dir = dir_with(&[(
            "b.toml",
            r#"
            [[case]]
            name = "wrong decision"
            action = "http"
            host = "a.example"
            method = "DELETE"
            expect = "allow"

            [[case]]
            name = "wrong policies"
            agent = "admin"
            action = "http"
            host = "a.example"
            expect = "deny"
            policies = ["read"]

            [[case]]
            name = "right"
            action = "connect"
            host = "a.example"
            expect = "deny"
            "#,
        )]);
        let report = run_dir(&engine(), dir.path()).unwrap();
        assert_eq!((report.passed(), report.failed()), (1, 2));
        let failures: Vec<_> = report.failures().collect();
        assert_eq!(failures[0].file, "b.toml");
        assert_eq!(failures[0].name, "wrong decision");
        assert_eq!(
            failures[0].failure.as_deref(),
            Some("expected allow, got deny (no policy permits this request)")
        );
        assert_eq!(failures[1].name, "wrong policies");
        assert_eq!(
            failures[1].failure.as_deref(),
            Some("expected deny by [read], got deny by [no-admin] (a policy forbids this request)")
        );
    }

    #[test]
    fn policy_ids_compare_as_sets() {
        let case: Case = toml::from_str::<TestFile>(
            r#"[[case]]
            name = "x"
            action = "http"
            host = "h"
            expect = "allow"
            policies = ["b", "a"]"#,
        )
        .unwrap()
        .case
        .remove(0);
        let got = Decision::Allow {
            policies: vec!["a".into(), "b".into()],
        };
        assert_eq!(difference(&case, &got), None);
    }

    #[test]
    fn bad_files_are_errors_with_file_and_line() {
        let dir = dir_with(&[
            ("good.toml", "[[case]]\nname = \"x\"\naction = \"http\"\nhost = \"a.example\"\nexpect = \"deny\"\n"),
            ("typo.toml", "[[case]]\nname = \"x\"\naction = \"http\"\nhost = \"a.example\"\nexpect = \"deny\"\nmehtod = \"GET\"\n"),
        ]);
        let err = run_dir(&engine(), dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, TestError::Parse { line: Some(6), .. }),
            "{text}"
        );
        assert!(text.starts_with("typo.toml:6: "), "{text}");
        assert!(text.contains("mehtod"), "{text}");

        let err = parse_file("syntax.toml", "[[case]\nname = 1").unwrap_err();
        assert!(err.to_string().starts_with("syntax.toml:1: "), "{err}");
    }

    #[test]
    fn unknown_actions_and_misplaced_fields_are_refused() {
        let err = parse_file(
            "t.toml",
            "[[case]]\nname = \"x\"\naction = \"tool:github.create_issue\"\nhost = \"h\"\nexpect = \"deny\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("t.toml:3: ")
                && err.contains("unknown action")
                && err.contains("catalog"),
            "{err}"
        );

        let err = parse_file(
            "t.toml",
            "[[case]]\nname = \"x\"\naction = \"connect\"\nhost = \"h\"\nmethod = \"GET\"\nexpect = \"deny\"\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "t.toml: case \"x\": `method` applies to http cases only"
        );

        let err = parse_file(
            "t.toml",
            "[[case]]\nname = \"x\"\naction = \"http\"\nhost = \"PyPI.org\"\nexpect = \"deny\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("not canonical"), "{err}");
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = run_dir(&engine(), &dir.path().join("tests")).unwrap_err();
        assert!(matches!(err, TestError::MissingDir(_)), "{err}");
        let err = run_dir(&engine(), dir.path()).unwrap_err();
        assert!(matches!(err, TestError::Empty(_)), "{err}");
    }

    #[test]
    fn defaults_fill_the_request() {
        let cases = parse_file(
            "t.toml",
            "[[case]]\nname = \"h\"\naction = \"http\"\nhost = \"h\"\nexpect = \"deny\"\n\
             [[case]]\nname = \"p\"\naction = \"http\"\nscheme = \"http\"\nhost = \"h\"\nexpect = \"deny\"\n\
             [[case]]\nname = \"c\"\naction = \"connect\"\nhost = \"h\"\nport = 22\nexpect = \"deny\"\n",
        )
        .unwrap();
        assert_eq!(cases[0].1.agent, "agent");
        assert_eq!(cases[0].1.tenant, "default");
        assert_eq!(
            cases[0].1.action,
            Action::Http {
                method: "GET".into(),
                scheme: "https".into(),
                port: 443,
                path: "/".into(),
                query: String::new(),
            }
        );
        assert!(matches!(cases[1].1.action, Action::Http { port: 80, .. }));
        assert_eq!(
            cases[2].1.action,
            Action::Connect {
                port: 22,
                sni: "h".into()
            }
        );
    }
}
