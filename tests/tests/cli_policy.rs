//! `ostiary policy validate|explain|test` driven through the real binary: the shipped library
//! validates and passes its cases, broken files are named with their line, a failing case
//! exits 1 and a missing tests directory exits 2, and `explain` decides tool calls from the
//! catalog.
use std::path::Path;

use serde_json::Value;

use crate::support::cli as support;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_validate_accepts_the_library_and_names_broken_files() {
    let dir = tempfile::tempdir().unwrap();
    let write_config = |name: &str, policy_dir: &Path| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "[state]\ndir = \"{}\"\n[policy]\ndir = \"{}\"\n",
                dir.path().join("state").display(),
                policy_dir.display()
            ),
        )
        .unwrap();
        path.display().to_string()
    };

    let library = workspace_root().join("policies/library");
    let config = write_config("library.toml", &library);
    let out = ostiary(&["--config", &config, "policy", "validate"]).await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.starts_with("ok: "), "{out}");
    assert!(out.stdout.contains(&library.display().to_string()), "{out}");
    assert!(
        !dir.path().join("state").exists(),
        "validating creates no state"
    );

    // A syntax error.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("fine.cedar"), POLICY).unwrap();
    std::fs::write(
        broken.join("typo.cedar"),
        "@id(\"typo\")\npermit (principal, action == Ostiary::Action::\"http\", resource)\nwhen { context.path == };\n",
    )
    .unwrap();
    let config = write_config("broken.toml", &broken);
    let out = ostiary(&["--config", &config, "policy", "validate"]).await;
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("typo.cedar:3"),
        "the message names file and line:\n{out}"
    );

    // Well-formed Cedar that fails strict validation against the schema.
    let invalid = dir.path().join("invalid");
    std::fs::create_dir_all(&invalid).unwrap();
    std::fs::write(
        invalid.join("unknown-attr.cedar"),
        "@id(\"bad-attr\")\npermit (principal, action == Ostiary::Action::\"http\", resource)\nwhen { context.no_such_field == \"x\" };\n",
    )
    .unwrap();
    let config = write_config("invalid.toml", &invalid);
    let out = ostiary(&["--config", &config, "policy", "validate"]).await;
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("unknown-attr.cedar"),
        "the message names the file:\n{out}"
    );
    assert!(out.stderr.contains("bad-attr"), "and the policy:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_explain_decides_tool_calls_from_the_catalog() {
    let library = workspace_root().join("policies/library");
    let library_arg = library.display().to_string();
    let out = ostiary(&[
        "policy",
        "explain",
        "--dir",
        &library_arg,
        "--agent",
        "a",
        "--tool",
        "github.delete_repo",
        "--args",
        r#"{"owner":"a","repo":"b"}"#,
        "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON output");
    assert_eq!(json["decision"], "escalate", "{out}");
    assert!(out.stdout.contains("irreversible-needs-human"), "{out}");

    // A tool the catalog does not have is a usage error, not a decision.
    let out = ostiary(&[
        "policy",
        "explain",
        "--dir",
        &library_arg,
        "--agent",
        "a",
        "--tool",
        "no.such_tool",
    ])
    .await;
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("not in the catalog"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_test_exit_codes_say_pass_fail_or_error() {
    let library = workspace_root().join("policies/library");
    let library_arg = library.display().to_string();
    let out = ostiary(&["policy", "test", "--dir", &library_arg]).await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("ok   egress.toml: "), "{out}");
    assert!(
        out.stdout.trim_end().ends_with(" passed, 0 failed"),
        "{out}"
    );

    // The library's policies with one wrong expectation added.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        library.join("egress.cedar"),
        dir.path().join("egress.cedar"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    std::fs::write(
        dir.path().join("tests/wrong.toml"),
        "[[case]]\nname = \"publishing is allowed\"\naction = \"http\"\nhost = \"pypi.org\"\nmethod = \"POST\"\nexpect = \"allow\"\n\n\
         [[case]]\nname = \"reading is allowed\"\naction = \"http\"\nhost = \"pypi.org\"\nexpect = \"allow\"\n",
    )
    .unwrap();
    let dir_arg = dir.path().display().to_string();
    let out = ostiary(&["policy", "test", "--dir", &dir_arg]).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(
        out.stdout
            .contains("FAIL wrong.toml: publishing is allowed\n     expected allow, got deny"),
        "{out}"
    );
    assert!(out.stdout.contains("1 passed, 1 failed"), "{out}");

    // No tests directory: an error, not a pass.
    std::fs::remove_dir_all(dir.path().join("tests")).unwrap();
    let out = ostiary(&["policy", "test", "--dir", &dir_arg]).await;
    assert_eq!(out.status, 2, "{out}");
    assert!(out.stderr.contains("no test directory"), "{out}");

    // And explain names the determining policy and its file.
    let out = ostiary(&[
        "policy",
        "explain",
        "--dir",
        &library_arg,
        "--agent",
        "demo",
        "--host",
        "169.254.169.254",
        "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let explanation: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(explanation["decision"], "deny", "{out}");
    assert_eq!(
        explanation["policies"][0],
        serde_json::json!({"id": "forbid-metadata-service", "file": "egress.cedar"})
    );
}
