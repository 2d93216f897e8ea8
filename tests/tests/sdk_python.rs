//! The Python SDK (`sdk/python`, docs/sdk-python.md) under the one test command: its pytest
//! suite against the real `ostiary serve`, and `mypy --strict` over the package.
//!
//! Nothing new is built here: the suite's fixtures (sdk/python/tests/conftest.py) start the
//! `ostiary` binary this crate's other CLI tests use — handed over as `OSTIARY_BIN` — with a
//! config and state directory of their own on free loopback ports, in front of a loopback
//! HTTPS upstream and a real MCP server, and drive it with the SDK and the real CLI
//! (`ostiary approvals approve`). `sdk/python` comes first on `PYTHONPATH`, so the tree's
//! sources are what is tested; scripts/test.sh also installs the package into the venv,
//! which `test_packaging.py` checks. The interpreter is `$OSTIARY_TEST_PYTHON` (the venv
//! with pytest, mypy and the clients, see scripts/test.sh). A skipped Python test fails
//! this one: tests never skip silently.

use crate::support::cli;
use cli::{ostiary_bin, workspace_root};

use std::time::Duration;

use ostiary_e2e::clients::{self, CmdOutput};

/// The whole pytest suite takes well under a minute on the CI machine; this bounds a hang.
const SUITE_TIMEOUT: Duration = Duration::from_secs(240);

/// Fewer passing tests than this means pytest collected less than the suite has.
const MIN_PASSED: usize = 73;

/// `sdk/python`, where the package, its tests and its pyproject.toml live.
fn sdk_dir() -> String {
    workspace_root().join("sdk/python").display().to_string()
}

/// Runs `python -m <args>` with the tree's package first on the path.
async fn python_module(args: &[&str], env: &[(&str, &str)]) -> CmdOutput {
    let mut all = vec!["-m"];
    all.extend_from_slice(args);
    let sdk = sdk_dir();
    let mut env = env.to_vec();
    env.extend([
        ("PYTHONPATH", sdk.as_str()),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
    ]);
    clients::run(clients::python_bin(), &all, &env, SUITE_TIMEOUT).await
}

/// The count before `word` in pytest's closing line ("71 passed, 2 failed in 14.2s").
fn count(summary: &str, word: &str) -> usize {
    let words: Vec<&str> = summary
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[1] == word)
        .filter_map(|w| w[0].parse::<usize>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_suite_passes_against_the_real_proxy() {
    let bin = ostiary_bin().display().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let basetemp = tmp.path().join("pytest").display().to_string();
    let sdk = sdk_dir();
    let (tests, config) = (format!("{sdk}/tests"), format!("{sdk}/pyproject.toml"));
    let out = python_module(
        &[
            "pytest",
            &tests,
            "-c",
            &config,
            "--rootdir",
            &sdk,
            "-q",
            "-rfEsx",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            &basetemp,
        ],
        &[("OSTIARY_BIN", &bin)],
    )
    .await;
    assert!(out.success(), "the Python SDK's tests failed:\n{out}");
    let summary = out
        .stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_else(|| panic!("no pytest summary line:\n{out}"));
    let passed = count(summary, "passed");
    assert!(
        passed >= MIN_PASSED,
        "only {passed} Python tests passed (expected at least {MIN_PASSED}):\n{out}"
    );
    for word in [
        "skipped",
        "xfailed",
        "xpassed",
        "deselected",
        "failed",
        "error",
        "errors",
    ] {
        assert_eq!(count(summary, word), 0, "{word} in {summary:?}:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_type_checks_strictly() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("mypy").display().to_string();
    let package = format!("{}/ostiary", sdk_dir());
    let out = python_module(&["mypy", "--strict", "--cache-dir", &cache, &package], &[]).await;
    assert!(
        out.success(),
        "mypy --strict sdk/python/ostiary failed:\n{out}"
    );
    assert!(
        out.stdout.contains("Success: no issues found"),
        "mypy said something else:\n{out}"
    );
}

#[test]
fn pytest_summaries_are_counted() {
    let line = "71 passed, 2 failed, 1 skipped in 14.20s";
    assert_eq!(count(line, "passed"), 71);
    assert_eq!(count(line, "failed"), 2);
    assert_eq!(count(line, "skipped"), 1);
    assert_eq!(count("3 passed in 1.0s", "errors"), 0);
}
