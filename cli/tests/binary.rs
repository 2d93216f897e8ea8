//! The built `ostiary` binary answers as the command line it always was: its name and
//! version, the commands `--help` lists, and the hidden sandbox stages kept out of it; a
//! decision without an approver says how to name one; completions need no config.
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

#[test]
fn deciding_with_neither_as_nor_the_variable_says_how_to_name_yourself() {
    for decision in ["approve", "deny"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ostiary"))
            .args(["approvals", decision, "apr_000000000000000000000000"])
            .env_remove("OSTIARY_CONFIG")
            .env_remove("OSTIARY_APPROVER")
            // A token, so that the approver is what is missing; nothing is sent anywhere.
            .env("OSTIARY_ADMIN_TOKEN", "t".repeat(40))
            .output()
            .expect("running the ostiary binary");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--as NAME") && stderr.contains("OSTIARY_APPROVER"),
            "{stderr}"
        );
        assert!(
            !stderr.contains(&"t".repeat(40)),
            "the token is never printed: {stderr}"
        );
    }
}

#[test]
fn approve_help_names_the_variable_it_defaults_to() {
    let out = ostiary(&["approvals", "approve", "--help"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[env: OSTIARY_APPROVER"), "{text}");
}

#[test]
fn completions_need_no_config_that_loads() {
    let out = Command::new(env!("CARGO_BIN_EXE_ostiary"))
        .args(["completions", "bash"])
        .env("OSTIARY_CONFIG", "/nonexistent/ostiary.toml")
        .output()
        .expect("running the ostiary binary");
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(script.contains("_ostiary()"), "{script}");
    let out = ostiary(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
