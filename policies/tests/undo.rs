//! A tool's `undo` through the public API: what the catalog refuses, the undo action the
//! schema declares beside the tool's, and decisions on it (its tier group covers it; a policy
//! may name it alone).

use ostiary_policies::{
    AccessRequest, Action, Catalog, CatalogError, Decision, PolicyEngine, PolicySource,
    SessionState, ToolProblem,
};
use serde_json::json;

const CATALOG: &str = r#"
[[tool]]
name  = "records.create"
tier  = "write"
match = { host = "api.example.com", method = "POST", path = "/records" }
undo  = { method = "DELETE", path = "/records/{response.id}" }

[[tool]]
name  = "issues.create"
tier  = "write"
match = { host = "api.example.com", method = "POST", path = "/repos/{owner}/{repo}/issues" }
args_schema = { type = "object", properties = { title = { type = "string" } } }
undo  = { method = "PATCH", path = "/repos/{args.owner}/{args.repo}/issues/{response.number}", body = { state = "closed" } }

[[tool]]
name  = "records.read"
tier  = "read"
match = { host = "api.example.com", method = "GET", path = "/records/{id}" }
"#;

fn catalog() -> Catalog {
    Catalog::parse("tools.toml", CATALOG, None).unwrap()
}

fn engine(policies: &str) -> PolicyEngine {
    PolicyEngine::with_catalog(
        &[PolicySource {
            name: "p.cedar".into(),
            text: policies.into(),
        }],
        catalog(),
    )
    .unwrap()
}

fn call(name: &str, undo: bool) -> AccessRequest {
    AccessRequest {
        agent: "demo".into(),
        tenant: "default".into(),
        host: "api.example.com".into(),
        session: SessionState::default(),
        action: Action::Tool {
            name: name.into(),
            args: json!({"owner": "acme", "repo": "site", "title": "t"}),
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo,
        },
    }
}

fn problem(text: &str) -> String {
    match Catalog::parse("tools.toml", text, None).unwrap_err() {
        e @ CatalogError::Tool { .. } => e.to_string(),
        other => panic!("not a tool problem: {other}"),
    }
}

#[test]
fn the_catalog_keeps_the_template_and_the_tool_is_reversible() {
    let catalog = catalog();
    let tool = catalog.get("records.create").unwrap();
    let undo = tool.undo().expect("declared");
    assert_eq!(undo.method(), "DELETE");
    assert!(undo.reads_response());
    assert!(tool.reversible());
    assert!(catalog.get("records.read").unwrap().undo().is_none());
}

#[test]
fn the_catalog_refuses_undo_where_nothing_can_be_reversed() {
    let route = r#"match = { host = "a.example", method = "POST", path = "/x/{id}" }"#;
    let undo = r#"undo = { method = "DELETE", path = "/x/{args.id}" }"#;
    let cases = [
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"irreversible\"\n{route}\n{undo}\n"),
            "an irreversible tool has no undo",
        ),
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"write\"\nreversible = false\n{route}\n{undo}\n"),
            "reversible = false",
        ),
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"write\"\nmatch = {{ mcp = \"https://m.example/mcp\", tool = \"x\" }}\n{undo}\n"),
            "MCP tools cannot declare one",
        ),
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"write\"\n{route}\nargs_schema = {{ type = \"object\", properties = {{ a = {{ type = \"string\" }} }} }}\nundo = {{ method = \"DELETE\", path = \"/x/{{args.nope}}\" }}\n"),
            "the tool has no argument \"nope\"",
        ),
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"write\"\n{route}\nundo = {{ method = \"delete\", path = \"/x\" }}\n"),
            "uppercase",
        ),
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"write\"\n{route}\nundo = {{ method = \"DELETE\", path = \"/x/{{env.HOME}}\" }}\n"),
            "a placeholder is",
        ),
        (
            format!("[[tool]]\nname = \"t\"\ntier = \"write\"\n{route}\n{undo}\n\n[[tool]]\nname = \"t.undo\"\ntier = \"read\"\n{route}\n"),
            "the undo action of the tool at line 2",
        ),
    ];
    for (text, want) in cases {
        let e = problem(&text);
        assert!(e.contains(want), "{want:?} not in {e}");
        assert!(e.starts_with("tools.toml:"), "{e}");
    }
    // An unknown key in `undo` is a parse error naming the tool.
    let e = Catalog::parse(
        "tools.toml",
        &format!("[[tool]]\nname = \"t\"\ntier = \"write\"\n{route}\nundo = {{ method = \"DELETE\", path = \"/x\", host = \"evil.example\" }}\n"),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("host") && e.contains("\"t\""), "{e}");
    // A path parameter is an argument: without a schema, and with one that omits it.
    assert!(Catalog::parse(
        "tools.toml",
        &format!("[[tool]]\nname = \"t\"\ntier = \"write\"\n{route}\nargs_schema = {{ type = \"object\" }}\n{undo}\n"),
        None
    )
    .is_ok());
    let _ = ToolProblem::Undo(String::new());
}

#[test]
fn the_schema_declares_the_undo_action_in_the_tier_group() {
    let schema = ostiary_policies::schema::generate(&catalog(), &Default::default());
    assert!(
        schema.contains("action \"tool:records.create.undo\" in [Action::\"tier:write\"]"),
        "{schema}"
    );
    assert!(schema.contains("action \"tool:issues.create.undo\""));
    assert!(!schema.contains("records.read.undo"));
    // A policy naming the undo of a tool that declares none fails validation.
    let bad = PolicyEngine::with_catalog(
        &[PolicySource {
            name: "p.cedar".into(),
            text: "permit (principal, action == Ostiary::Action::\"tool:records.read.undo\", resource);".into(),
        }],
        catalog(),
    );
    assert!(bad.is_err());
}

#[test]
fn the_tier_covers_the_undo_and_a_policy_may_forbid_it_alone() {
    let e = engine(
        r#"
        @id("write-ok") permit (principal, action in Ostiary::Action::"tier:write", resource);
        @id("no-undo-of-issues") forbid (principal, action == Ostiary::Action::"tool:issues.create.undo", resource)
          when { context.args.owner == "acme" };
        "#,
    );
    assert!(e.decide(&call("records.create", true)).is_allow());
    assert!(e.decide(&call("issues.create", false)).is_allow());
    match e.decide(&call("issues.create", true)) {
        Decision::Deny { policies, .. } => assert_eq!(policies, ["no-undo-of-issues"]),
        other => panic!("{other:?}"),
    }
    // Indexed or not, the same answers.
    for (name, undo) in [("records.create", true), ("issues.create", true)] {
        let req = call(name, undo);
        assert_eq!(e.decide(&req), e.decide_unindexed(&req));
    }
    // The undo of a tool that declares none is never allowed (an evaluation error).
    assert!(!e.decide(&call("records.read", true)).is_allow());
    // The resource is the tool itself; the action id names the undo.
    let req = call("records.create", true);
    assert_eq!(req.action.id(), "tool:records.create.undo");
    assert_eq!(req.resource(), "Ostiary::Tool::\"records.create\"");
}

#[test]
fn a_kept_undo_decision_reads_back_as_an_undo() {
    let e = engine(
        r#"@id("w") permit (principal, action in Ostiary::Action::"tier:write", resource);"#,
    );
    let req = call("records.create", true);
    let decision = e.decide(&req);
    let kept = ostiary_policies::recorded::to_json(&req, &decision, &|_| false);
    let back = ostiary_policies::recorded::from_json(&kept.to_value()).unwrap();
    assert_eq!(back.request.action, req.action);
}

#[test]
fn policy_test_cases_decide_the_undo_of_a_call() {
    let e = engine(
        r#"
        @id("write-ok") permit (principal, action in Ostiary::Action::"tier:write", resource);
        @id("no-undo-of-issues") forbid (principal, action == Ostiary::Action::"tool:issues.create.undo", resource)
          when { context.args.owner == "acme" };
        "#,
    );
    let dir = tempfile::tempdir().unwrap();
    let case = |name: &str, tool: &str, undo: &str, expect: &str| {
        format!(
            "[[case]]\nname = \"{name}\"\naction = \"tool\"\ntool = \"{tool}\"\n{undo}args = {{ owner = \"acme\", repo = \"site\" }}\nexpect = \"{expect}\"\n"
        )
    };
    let text = [
        case("the call", "issues.create", "", "allow"),
        case("its undo", "issues.create", "undo = true\n", "deny"),
        case("another undo", "records.create", "undo = true\n", "allow"),
        case(
            "undo false is the call",
            "issues.create",
            "undo = false\n",
            "allow",
        ),
    ]
    .join("\n");
    std::fs::write(dir.path().join("undo.toml"), text).unwrap();
    let report = ostiary_policies::run_dir(&e, dir.path()).unwrap();
    assert_eq!(report.failed(), 0, "{report:?}");
    assert_eq!(report.passed(), 4);
    // A tool without an undo, and `undo` on a case that is not a tool call, are errors.
    for (text, want) in [
        (case("x", "records.read", "undo = true\n", "deny"), "declares no undo"),
        (
            "[[case]]\nname = \"y\"\naction = \"http\"\nhost = \"api.example.com\"\nundo = true\nexpect = \"deny\"\n".to_owned(),
            "`undo` applies to tool cases only",
        ),
    ] {
        std::fs::write(dir.path().join("undo.toml"), text).unwrap();
        let e = ostiary_policies::run_dir(&e, dir.path()).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
