//! Tool calls through the public API: the catalog, the generated schema, strict validation
//! of tier policies against it, and decisions with escalation.

use ostiary_policies::{
    AccessRequest, Action, Catalog, CatalogError, Decision, DenyReason, LoadError, PolicyEngine,
    PolicySource, SessionState, Tier, ToolMatch, ToolProblem,
};
use serde_json::{json, Value};

const CATALOG: &str = r#"
[[tool]]
name   = "github.create_issue"
tier   = "write"
match  = { host = "api.github.com", method = "POST", path = "/repos/{owner}/{repo}/issues" }
args_schema = { type = "object", required = ["title"], properties = { title = { type = "string" }, labels = { type = "array", items = { type = "string" } }, count = { type = "integer" }, ratio = { type = "number" } } }
credential  = "github"
cost   = 0.001

[[tool]]
name   = "github.get_issue"
tier   = "read"
match  = { host = "api.github.com", method = "GET", path = "/repos/{owner}/{repo}/issues/{number}" }

[[tool]]
name   = "payments.bulk_refund"
tier   = "high_impact"
match  = { host = "payments.example.com", method = "POST", path = "/v1/refunds/bulk" }
args_schema = { type = "object", properties = { ids = { type = "array", items = { type = "string" } } } }
impact = { records = "/ids" }

[[tool]]
name   = "files.delete"
tier   = "irreversible"
match  = { mcp = "https://files.example.com/mcp", tool = "delete_file" }
args_schema = { type = "object", additionalProperties = false, required = ["path"], properties = { path = { type = "string" } } }
"#;

const TIER_POLICIES: &str = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource)
when { context.session.cost + context.impact.cost <= 5000000 };

@id("irreversible-ok")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };

@id("no-secret-titles")
forbid (principal, action == Ostiary::Action::"tool:github.create_issue", resource)
when { context.args.title like "*secret*" };
"#;

fn catalog() -> Catalog {
    Catalog::parse("tools.toml", CATALOG, None).unwrap()
}

fn engine_with(policies: &str) -> Result<PolicyEngine, LoadError> {
    PolicyEngine::with_catalog(
        &[PolicySource {
            name: "tiers.cedar".into(),
            text: policies.into(),
        }],
        catalog(),
    )
}

fn call(name: &str, args: Value) -> AccessRequest {
    AccessRequest {
        agent: "demo".into(),
        tenant: "default".into(),
        host: "api.github.com".into(),
        session: SessionState::default(),
        action: Action::Tool {
            name: name.into(),
            args,
            impact_records: 0,
            cost_micros: 1000,
            approval: None,
            undo: false,
        },
    }
}

fn approved(mut req: AccessRequest) -> AccessRequest {
    if let Action::Tool { approval, .. } = &mut req.action {
        *approval = Some("alice".into());
    }
    req
}

fn catalog_err(text: &str) -> CatalogError {
    Catalog::parse("tools.toml", text, None).unwrap_err()
}

#[test]
fn a_good_catalog_parses() {
    let c = catalog();
    assert_eq!(c.len(), 4);
    let create = c.get("github.create_issue").unwrap();
    assert_eq!(create.tier(), Tier::Write);
    assert_eq!(create.cost_micros(), 1000);
    assert_eq!(create.credential(), Some("github"));
    assert!(create.reversible());
    assert_eq!(create.server(), "api.github.com");
    let ToolMatch::Rest { method, path, .. } = create.matcher() else {
        panic!("rest");
    };
    assert_eq!(method, "POST");
    assert_eq!(
        path.captures("/repos/o/r/issues"),
        Some(vec![
            ("owner".into(), "o".into()),
            ("repo".into(), "r".into())
        ])
    );
    assert_eq!(path.captures("/repos/o/r/pulls"), None);
    // `number` has no exact Cedar type: left out, and said so.
    assert_eq!(create.omitted_args()[0].path, "args.ratio");

    let delete = c.get("files.delete").unwrap();
    assert!(
        !delete.reversible(),
        "irreversible defaults to not reversible"
    );
    assert_eq!(delete.server(), "files.example.com");

    let refund = c.get("payments.bulk_refund").unwrap();
    assert_eq!(
        refund.impact_records(&json!({"ids": ["a", "b", "c"]})),
        Ok(3)
    );
    assert_eq!(refund.impact_records(&json!({})), Ok(0));
}

#[test]
fn a_missing_catalog_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Catalog::load_dir(dir.path()).unwrap().is_empty());
}

#[test]
fn args_schema_paths_are_relative_to_the_policy_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("del.json"),
        r#"{"type": "object", "properties": {"path": {"type": "string"}}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tools.toml"),
        "[[tool]]\nname = \"files.delete\"\ntier = \"irreversible\"\n\
         match = { mcp = \"https://f.example/mcp\", tool = \"delete\" }\nargs_schema = \"del.json\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("p.cedar"),
        r#"permit (principal, action == Ostiary::Action::"tool:files.delete", resource) when { context.args has path };"#,
    )
    .unwrap();
    let engine = PolicyEngine::load_dir(dir.path()).unwrap();
    assert_eq!(engine.catalog().len(), 1);
    assert!(engine
        .schema_text()
        .contains("action \"tool:files.delete\""));

    std::fs::remove_file(dir.path().join("del.json")).unwrap();
    let err = PolicyEngine::load_dir(dir.path()).unwrap_err();
    assert!(
        matches!(
            &err,
            LoadError::Catalog(CatalogError::Tool {
                problem: ToolProblem::SchemaRead { .. },
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn catalog_errors_name_file_tool_and_line() {
    let header = "[[tool]]\nname = \"t.one\"\ntier = \"read\"\n";
    let rest = "match = { host = \"a.example\", method = \"GET\", path = \"/x\" }\n";

    // Shape errors (serde): file, line, and the tool when its name is readable.
    let err = catalog_err(&format!("{header}{rest}colour = \"red\"\n"));
    let CatalogError::Parse {
        file, line, tool, ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (file.as_str(), *line, tool.as_deref()),
        ("tools.toml", Some(5), Some("t.one"))
    );
    assert!(
        err.to_string().starts_with("tools.toml:5: tool \"t.one\""),
        "{err}"
    );

    let err = catalog_err("[[tool]]\nname = \"t.one\"\ntier = \"risky\"\n");
    assert!(
        matches!(err, CatalogError::Parse { line: Some(3), .. }),
        "{err}"
    );

    let problem = |text: String| match catalog_err(&text) {
        CatalogError::Tool {
            file,
            tool,
            line,
            problem,
        } => {
            assert_eq!(file, "tools.toml");
            (tool, line, problem)
        }
        other => panic!("{other}"),
    };

    let (tool, line, p) = problem(format!("{header}{rest}{header}{rest}"));
    assert_eq!((tool.as_str(), line), ("t.one", 6));
    assert!(
        matches!(p, ToolProblem::DuplicateName { first_line: 2 }),
        "{p}"
    );

    let (tool, _, p) = problem(format!(
        "[[tool]]\nname = \"bad name\"\ntier = \"read\"\n{rest}"
    ));
    assert_eq!(tool, "bad name");
    assert!(matches!(p, ToolProblem::InvalidName), "{p}");

    for path in ["x", "/a/{b", "/a/x{b}", "/a/{b}/{b}", "/a/{1}", "/a?q"] {
        let (_, _, p) = problem(format!(
            "{header}match = {{ host = \"a.example\", method = \"GET\", path = \"{path}\" }}\n"
        ));
        assert!(matches!(p, ToolProblem::PathTemplate { .. }), "{path}: {p}");
    }

    for url in ["ftp://f.example/mcp", "not a url", "mailto:a@b.example"] {
        let (_, _, p) = problem(format!(
            "{header}match = {{ mcp = \"{url}\", tool = \"x\" }}\n"
        ));
        assert!(matches!(p, ToolProblem::Endpoint { .. }), "{url}: {p}");
    }

    let (_, _, p) = problem(format!(
        "{header}match = {{ mcp = \"https://f.example/mcp\", tool = \"x\", host = \"a\" }}\n"
    ));
    assert!(matches!(p, ToolProblem::Match(_)), "{p}");

    for pointer in ["ids", "/a~2"] {
        let (_, _, p) = problem(format!(
            "{header}{rest}impact = {{ records = \"{pointer}\" }}\n"
        ));
        assert!(matches!(p, ToolProblem::Pointer { .. }), "{pointer}: {p}");
    }

    let (_, _, p) = problem(format!("{header}{rest}cost = -1.0\n"));
    assert!(matches!(p, ToolProblem::Cost(_)), "{p}");

    let (_, _, p) = problem(format!(
        "{header}{rest}args_schema = {{ type = \"string\" }}\n"
    ));
    assert!(matches!(p, ToolProblem::Schema(_)), "{p}");

    let (_, _, p) = problem(format!("{header}{rest}args_schema = \"schema.json\"\n"));
    assert!(
        matches!(p, ToolProblem::Schema(_)),
        "no dir to resolve a path in: {p}"
    );
}

#[test]
fn generated_schema_validates_tier_policies() {
    let engine = engine_with(TIER_POLICIES).unwrap();
    let text = engine.schema_text();
    assert!(text.contains(r#"action "tool:github.create_issue" in [Action::"tier:write"]"#));
    assert!(text.contains(r#""title": String"#), "{text}");
    assert!(text.contains(r#""labels"?: Set<String>"#), "{text}");
    assert!(
        text.contains(r#""owner": String"#),
        "path parameters are args: {text}"
    );
    assert!(text.contains("args.ratio left out"), "{text}");
    // The text stands alone: it parses as a schema by itself.
    let (_schema, _warnings) = cedar_policy::Schema::from_cedarschema_str(text).unwrap();
}

#[test]
fn a_policy_reading_an_undeclared_arg_is_rejected() {
    let err = engine_with(
        r#"@id("x") permit (principal, action == Ostiary::Action::"tool:github.create_issue", resource)
           when { context.args.body == "x" };"#,
    )
    .unwrap_err();
    assert!(matches!(err, LoadError::Validation(_)), "{err}");
    // A left-out (number) argument cannot be read either.
    let err = engine_with(
        r#"@id("x") permit (principal, action == Ostiary::Action::"tool:github.create_issue", resource)
           when { context.args.ratio == 1 };"#,
    );
    assert!(err.is_err());
    // A tool without schema has no args beyond its path parameters.
    let err = engine_with(
        r#"@id("x") permit (principal, action == Ostiary::Action::"tool:files.delete", resource)
           when { context.args.mode == "x" };"#,
    );
    assert!(err.is_err());
}

#[test]
fn read_is_allowed_irreversible_escalates_and_approval_allows() {
    let engine = engine_with(TIER_POLICIES).unwrap();
    let get = call(
        "github.get_issue",
        json!({"owner": "o", "repo": "r", "number": "1"}),
    );
    assert_eq!(
        engine.decide(&get),
        Decision::Allow {
            policies: vec!["read-ok".into()]
        }
    );

    let delete = call("files.delete", json!({"path": "/tmp/x"}));
    assert_eq!(
        engine.decide(&delete),
        Decision::Escalate {
            policies: vec!["irreversible-needs-human".into()]
        }
    );
    assert_eq!(
        engine.decide(&approved(delete)),
        Decision::Allow {
            policies: vec!["irreversible-ok".into()]
        }
    );

    let create = call(
        "github.create_issue",
        json!({"owner": "o", "repo": "r", "title": "bug", "labels": ["a"], "ratio": 0.5}),
    );
    assert!(engine.decide(&create).is_allow());
    // Resource attributes are there for policies.
    let e = engine_with(
        r#"@id("rev") permit (principal, action in Ostiary::Action::"tier:write", resource)
           when { resource.reversible && resource.tier == "write" && resource.server == "api.github.com" };"#,
    )
    .unwrap();
    assert!(e.decide(&create).is_allow());
}

#[test]
fn a_forbid_without_the_annotation_denies() {
    let engine = engine_with(TIER_POLICIES).unwrap();
    let secret = call(
        "github.create_issue",
        json!({"owner": "o", "repo": "r", "title": "the secret plan"}),
    );
    assert_eq!(
        engine.decide(&secret),
        Decision::Deny {
            policies: vec!["no-secret-titles".into()],
            reason: DenyReason::Forbidden
        }
    );
}

#[test]
fn a_mix_of_escalating_and_plain_forbids_denies() {
    let engine = engine_with(&format!(
        "{TIER_POLICIES}\n@id(\"no-etc\") forbid (principal, action == Ostiary::Action::\"tool:files.delete\", resource) \
         when {{ context.args.path like \"/etc/*\" }};"
    ))
    .unwrap();
    let d = engine.decide(&call("files.delete", json!({"path": "/etc/passwd"})));
    let Decision::Deny {
        mut policies,
        reason,
    } = d
    else {
        panic!("{d:?}");
    };
    policies.sort();
    assert_eq!(policies, ["irreversible-needs-human", "no-etc"]);
    assert_eq!(reason, DenyReason::Forbidden);
}

#[test]
fn an_escalating_forbid_without_a_permit_behind_it_denies() {
    // Approval would lift the forbid, but nothing permits the call: deny, not escalate.
    let engine = engine_with(
        r#"@id("h") @escalate("approval")
           forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
           unless { context.approval.granted };"#,
    )
    .unwrap();
    let d = engine.decide(&call("files.delete", json!({"path": "/x"})));
    assert_eq!(
        d,
        Decision::Deny {
            policies: vec!["h".into()],
            reason: DenyReason::Forbidden
        }
    );
}

#[test]
fn default_deny_never_escalates() {
    let engine = engine_with(
        r#"@id("r") permit (principal, action in Ostiary::Action::"tier:read", resource);"#,
    )
    .unwrap();
    assert_eq!(
        engine.decide(&call("files.delete", json!({"path": "/x"}))),
        Decision::Deny {
            policies: vec![],
            reason: DenyReason::NoPermit
        }
    );
}

#[test]
fn args_not_matching_the_schema_deny_with_a_reason() {
    let engine = engine_with(TIER_POLICIES).unwrap();
    let cases = [
        (
            json!({"owner": "o", "repo": "r", "title": 7}),
            "args.title: expected a string",
        ),
        (json!({"owner": "o", "repo": "r"}), "args.title: required"),
        (
            json!({"owner": "o", "repo": "r", "title": "t", "labels": [1]}),
            "args.labels[0]",
        ),
        (
            json!({"owner": "o", "repo": "r", "title": "t", "count": 1.5}),
            "args.count",
        ),
        (json!("not an object"), "args: expected an object"),
    ];
    for (args, expected) in cases {
        let d = engine.decide(&call("github.create_issue", args.clone()));
        let Decision::Deny {
            reason: DenyReason::EvaluationError(message),
            policies,
        } = &d
        else {
            panic!("{args}: {d:?}");
        };
        assert!(policies.is_empty());
        assert!(message.contains(expected), "{args}: {message}");
    }
    // additionalProperties = false refuses extras; by default they are ignored.
    let d = engine.decide(&call("files.delete", json!({"path": "/x", "force": true})));
    assert!(
        matches!(&d, Decision::Deny { reason: DenyReason::EvaluationError(m), .. } if m.contains("args.force")),
        "{d:?}"
    );
    let d = engine.decide(&call(
        "github.create_issue",
        json!({"owner": "o", "repo": "r", "title": "t", "extra": {"any": 1}}),
    ));
    assert!(d.is_allow(), "{d:?}");
    // An unknown tool is denied, never an error that allows.
    let d = engine.decide(&call("nope", json!({})));
    assert!(matches!(
        d,
        Decision::Deny {
            reason: DenyReason::EvaluationError(_),
            ..
        }
    ));
}

#[test]
fn tool_actions_do_not_widen_http_scope_analysis() {
    let engine = engine_with(
        r#"@id("gh") permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.github.com");
           @id("tools") permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);"#,
    )
    .unwrap();
    assert!(engine.may_permit_http("api.github.com"));
    assert!(!engine.may_permit_http("evil.example"));
}

#[test]
fn explain_names_escalating_forbids() {
    let engine = engine_with(TIER_POLICIES).unwrap();
    let e = engine.explain(&call("files.delete", json!({"path": "/x"})));
    assert_eq!(e.decision, "escalate");
    let text = e.to_string();
    assert!(
        text.contains("irreversible-needs-human (tiers.cedar)"),
        "{text}"
    );
    assert!(text.contains("approval"), "{text}");
}

/// A catalog whose one tool declares `account`, an object `memo.tag` and an array of
/// `lines[].account`.
fn transfer_tool() -> Catalog {
    Catalog::parse(
        "tools.toml",
        r#"
[[tool]]
name = "pay.transfer"
tier = "write"
match = { host = "pay.example.com", method = "POST", path = "/v1/Transfers/{id}" }
args_schema = { type = "object", properties = { account = { type = "string" }, amount = { type = "number" }, memo = { type = "object", properties = { tag = { type = "string" } } }, lines = { type = "array", items = { type = "object", properties = { account = { type = "string" } } } } } }

[[tool]]
name = "pay.loose"
tier = "write"
match = { host = "pay.example.com", method = "POST", path = "/v1/loose" }
"#,
        None,
    )
    .unwrap()
}

#[test]
fn an_argument_in_another_case_than_its_schema_is_found() {
    let catalog = transfer_tool();
    let tool = catalog.get("pay.transfer").unwrap();
    for (args, at, given, declared) in [
        (json!({"Account": "prod"}), "args", "Account", "account"),
        (json!({"ACCOUNT": "prod"}), "args", "ACCOUNT", "account"),
        // Properties the record leaves out (a `number`) are checked by the schema, so
        // they count too.
        (json!({"Amount": 1e9}), "args", "Amount", "amount"),
        (json!({"memo": {"TAG": "x"}}), "args.memo", "TAG", "tag"),
        (
            json!({"lines": [{"account": "a"}, {"aCCOUNT": "b"}]}),
            "args.lines",
            "aCCOUNT",
            "account",
        ),
        // Unicode simple folding: LONG S is `s`.
        (json!({"line\u{17f}": []}), "args", "line\u{17f}", "lines"),
    ] {
        let found = tool.misspelled_arg(&args).expect("found");
        assert_eq!(
            (
                found.at.as_str(),
                found.given.as_str(),
                found.declared.as_str()
            ),
            (at, given, declared),
            "{args}"
        );
    }
    for args in [
        json!({"account": "prod", "memo": {"tag": "x"}}),
        json!({"other": 1, "memo": "not an object"}),
        json!({"lines": [{"other": 1}], "acc\u{f6}unt": 1}),
        json!({}),
    ] {
        assert_eq!(tool.misspelled_arg(&args), None, "{args}");
    }
    // Without a schema no policy or check reads the arguments.
    let loose = catalog.get("pay.loose").unwrap();
    assert_eq!(loose.misspelled_arg(&json!({"Account": 1})), None);
}

#[test]
fn a_route_matched_ignoring_case_is_what_case_insensitive_servers_take() {
    let catalog = transfer_tool();
    let ostiary_policies::ToolMatch::Rest { path, .. } =
        catalog.get("pay.transfer").unwrap().matcher()
    else {
        panic!("a REST tool")
    };
    assert!(path.captures("/v1/Transfers/7").is_some());
    assert!(path.captures("/v1/transfers/7").is_none());
    for spelled in ["/v1/transfers/7", "/V1/TRANSFERS/7/", "/v1/Transfers/ABC"] {
        assert!(path.matches_ignoring_case(spelled), "{spelled}");
    }
    for other in [
        "/v1/transfer/7",
        "/v1/transfers",
        "/v1/transfers/7/x",
        "v1/transfers/7",
    ] {
        assert!(!path.matches_ignoring_case(other), "{other}");
    }
}
