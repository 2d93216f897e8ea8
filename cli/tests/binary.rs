//! The built `ostiary` binary answers as the command line it always was: its name and
//! version, the commands `--help` lists, and the hidden sandbox stages kept out of it.
//!
//! Being an integration test also makes `cargo test --no-run --workspace` build the plain
//! binary (cargo builds a package's binaries only for its integration tests), which is how
//! the end-to-end tests get `<target>/debug/ostiary` (tests/tests/support/cli.rs).

use std::process::{Command, Output};

fn ostiary(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ostiary"))
        .args(args)
        .env_remove("OSTIARY_CONFIG")
        .output()
        .expect("running the ostiary binary")
}

#[test]
fn version_names_the_binary() {
    let out = ostiary(&["--version"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("ostiary {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_the_commands_and_hides_the_stages() {
    let out = ostiary(&["--help"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for command in [
        "serve",
        "session",
        "run",
        "ca",
        "audit",
        "policy",
        "approvals",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "`{command}` missing from:\n{text}"
        );
    }
    assert!(!text.contains("sandbox-"), "{text}");
}

#[test]
fn a_malformed_stage_is_a_usage_error() {
    // The exec stage without the command it would exec: refused by the parser (exit 2),
    // before anything is confined or run.
    let out = ostiary(&["sandbox-exec", "--uid", "1", "--gid", "1", "--nproc", "1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
