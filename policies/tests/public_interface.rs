//! The policy crate through its public API only: loading, strict validation, decisions,
//! and failing closed.

use ostiary_policies::{
    AccessRequest, Action, Decision, DenyReason, LoadError, PolicyEngine, PolicySource,
    EMBEDDED_LIBRARY,
};

fn engine(text: &str) -> Result<PolicyEngine, LoadError> {
    PolicyEngine::from_sources(&[PolicySource {
        name: "t.cedar".into(),
        text: text.into(),
    }])
}

fn http(host: &str, method: &str, path: &str) -> AccessRequest {
    AccessRequest {
        agent: "demo".into(),
        tenant: "default".into(),
        host: host.into(),
        session: Default::default(),
        action: Action::Http {
            method: method.into(),
            scheme: "https".into(),
            port: 443,
            path: path.into(),
            query: String::new(),
        },
    }
}

#[test]
fn default_deny_and_named_permit() {
    let e = engine(
        r#"@id("gh") permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.github.com");"#,
    )
    .unwrap();
    assert_eq!(
        e.decide(&http("api.github.com", "GET", "/")),
        Decision::Allow {
            policies: vec!["gh".into()]
        }
    );
    assert_eq!(
        e.decide(&http("evil.com", "GET", "/")),
        Decision::Deny {
            policies: vec![],
            reason: DenyReason::NoPermit
        }
    );
}

#[test]
fn forbid_wins_and_is_named() {
    let e = engine(
        r#"
        @id("all") permit (principal, action, resource);
        @id("no-delete") forbid (principal, action == Ostiary::Action::"http", resource)
          when { context.method == "DELETE" };
        "#,
    )
    .unwrap();
    let d = e.decide(&http("x.com", "DELETE", "/"));
    assert_eq!(
        d,
        Decision::Deny {
            policies: vec!["no-delete".into()],
            reason: DenyReason::Forbidden
        }
    );
}

#[test]
fn suffix_rules_anchor_at_a_dot() {
    let e = engine(
        r#"@id("sfx") permit (principal, action == Ostiary::Action::"http", resource)
           when { resource.name like "*.example.com" };"#,
    )
    .unwrap();
    assert!(e.decide(&http("api.example.com", "GET", "/")).is_allow());
    assert!(!e.decide(&http("evilexample.com", "GET", "/")).is_allow());
    assert!(!e
        .decide(&http("example.com.evil.net", "GET", "/"))
        .is_allow());
}

#[test]
fn strict_validation_rejects_unknown_attributes_and_names_the_file() {
    // A forbid reading an attribute that does not exist would error at evaluation time and
    // be skipped by Cedar (failing open); strict validation refuses it at load.
    let err = engine(
        r#"@id("bad") forbid (principal, action == Ostiary::Action::"http", resource)
           when { context.tier == "write" };"#,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LoadError::Validation(_)), "{text}");
    assert!(text.contains("t.cedar") && text.contains("bad"), "{text}");
}

#[test]
fn strict_validation_errors_carry_the_line_in_their_file() {
    // The offending attribute is on line 5 of the second file; offsets are per file, so a
    // line counted over the first file's text (or over both) would be wrong.
    let first = PolicySource {
        name: "a.cedar".into(),
        text: "// first\n@id(\"ok\") permit (principal, action, resource);\n".into(),
    };
    let second = PolicySource {
        name: "b.cedar".into(),
        text: "// second\n\n@id(\"bad\")\nforbid (principal, action == Ostiary::Action::\"http\", resource)\n  when { context.tier == \"write\" };\n".into(),
    };
    let err = PolicyEngine::from_sources(&[first, second]).unwrap_err();
    let LoadError::Validation(errors) = &err else {
        panic!("expected a validation error, got {err}");
    };
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("b.cedar:5: policy bad: ")),
        "{err}"
    );
}

#[test]
fn parse_errors_carry_file_and_line() {
    let err = engine("// comment\n\npermit (principal, action, resource) when { ; };").unwrap_err();
    match err {
        LoadError::Parse { file, line, .. } => {
            assert_eq!(file, "t.cedar");
            assert_eq!(line, 3);
        }
        other => panic!("expected a parse error, got {other}"),
    }
}

#[test]
fn duplicate_ids_are_refused() {
    let err = engine(
        r#"@id("a") permit (principal, action, resource);
           @id("a") permit (principal, action, resource);"#,
    )
    .unwrap_err();
    assert!(matches!(err, LoadError::DuplicateId { .. }), "{err}");
}

#[test]
fn invalid_entity_ids_fail_closed() {
    let e = engine(r#"@id("all") permit (principal, action, resource);"#).unwrap();
    let mut req = http("x.com", "GET", "/");
    req.agent = "\"quote".into();
    // Entity ids are strings in Cedar, so odd names are still valid ids: the request is
    // evaluated, not an error. A port out of range for Long cannot happen (u16).
    assert!(e.decide(&req).is_allow());
}

#[test]
fn the_embedded_library_loads_and_allows_registries_read_only() {
    let e = PolicyEngine::embedded().unwrap();
    assert!(e
        .decide(&http("pypi.org", "GET", "/simple/requests/"))
        .is_allow());
    assert!(!e.decide(&http("pypi.org", "POST", "/legacy/")).is_allow());
    assert!(!e.decide(&http("169.254.169.254", "GET", "/")).is_allow());
    let on_disk =
        PolicyEngine::load_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("library"))
            .unwrap();
    assert_eq!(on_disk.len(), e.len());
    assert_eq!(on_disk.schema_text(), e.schema_text(), "the same catalog");
    assert_eq!(
        EMBEDDED_LIBRARY.len(),
        std::fs::read_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("library"))
            .unwrap()
            .filter(|f| f
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "cedar"))
            .count(),
        "every *.cedar file of the library is embedded"
    );
}

#[test]
fn scopes_tell_which_hosts_could_ever_be_permitted() {
    let scoped = engine(
        r#"@id("a") permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"a.example");
           @id("c") permit (principal, action == Ostiary::Action::"connect", resource);
           @id("f") forbid (principal, action, resource);"#,
    )
    .unwrap();
    assert!(scoped.may_permit_http("a.example"));
    assert!(
        !scoped.may_permit_http("b.example"),
        "connect permits and forbids do not count"
    );

    let unscoped = engine(
        r#"@id("any") permit (principal, action, resource) when { resource.name like "*.example" };"#,
    )
    .unwrap();
    assert!(
        unscoped.may_permit_http("b.example"),
        "an unscoped permit may match any host"
    );

    let library =
        PolicyEngine::load_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("library"))
            .unwrap();
    assert!(library.may_permit_http("pypi.org"));
    assert!(
        !library.may_permit_http("example.net"),
        "the library scopes every permit"
    );
}

/// The shipped library's own test cases (`library/tests/*.toml`) all pass, so a change to a
/// library policy without a matching change to its cases fails CI.
#[test]
fn the_library_passes_its_own_tests() {
    let library = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("library");
    let engine = PolicyEngine::load_dir(&library).unwrap();
    let report = ostiary_policies::run_dir(&engine, &library.join("tests")).unwrap();
    let failures: Vec<String> = report
        .failures()
        .map(|c| {
            format!(
                "{} / {}: {}",
                c.file,
                c.name,
                c.failure.as_deref().unwrap_or("")
            )
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(report.passed() >= 20, "{report:?}");

    // Every policy of the library determines at least one case.
    let covered: std::collections::HashSet<&str> = report
        .cases
        .iter()
        .flat_map(|c| c.decision.policies())
        .map(String::as_str)
        .collect();
    for policy in engine.policy_set().policies() {
        let id = policy.id().to_string();
        assert!(covered.contains(id.as_str()), "no test case for {id}");
    }
}
