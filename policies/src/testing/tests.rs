//! Unit tests of the policy test format and runner (kept apart so the format stays readable).
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
    .remove(0)
    .into_inner();
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

    let err = parse_file("syntax.toml", "[[case]\nname = 1", &Catalog::default()).unwrap_err();
    assert!(err.to_string().starts_with("syntax.toml:1: "), "{err}");
}

#[test]
fn unknown_actions_and_misplaced_fields_are_refused() {
    let err = parse_file(
        "t.toml",
        "[[case]]\nname = \"x\"\naction = \"tool:github.create_issue\"\nhost = \"h\"\nexpect = \"deny\"\n",
        &Catalog::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("t.toml:3: ")
            && err.contains("unknown action")
            && err.contains("`action = \"tool\"`"),
        "{err}"
    );

    let err = parse_file(
        "t.toml",
        "[[case]]\nname = \"x\"\naction = \"connect\"\nhost = \"h\"\nmethod = \"GET\"\nexpect = \"deny\"\n",
        &Catalog::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "t.toml:1: case \"x\": `method` applies to http cases only"
    );

    let err = parse_file(
        "t.toml",
        "[[case]]\nname = \"x\"\naction = \"http\"\nhost = \"PyPI.org\"\nexpect = \"deny\"\n",
        &Catalog::default(),
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
        &Catalog::default(),
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

const TOOLS: &str = r#"
[[tool]]
name   = "pay.bulk_refund"
tier   = "high_impact"
match  = { host = "pay.example", method = "POST", path = "/v1/refunds/bulk" }
args_schema = { type = "object", required = ["ids"], properties = { ids = { type = "array", items = { type = "string" } } } }
impact = { records = "/ids" }
cost   = 0.25

[[tool]]
name   = "files.delete"
tier   = "irreversible"
match  = { mcp = "https://files.example/mcp", tool = "delete_file" }
"#;

fn tools() -> Catalog {
    Catalog::parse("tools.toml", TOOLS, None).unwrap()
}

fn tool_engine() -> PolicyEngine {
    PolicyEngine::with_catalog(
        &[PolicySource {
            name: "t.cedar".into(),
            text: r#"
            @id("small") permit (principal, action in Ostiary::Action::"tier:high_impact", resource)
            when { context.impact.records <= 2 && context.session.cost < 1000000 };
            @id("human") @escalate("approval")
            forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
            unless { context.approval.granted };
            @id("approved") permit (principal, action in Ostiary::Action::"tier:irreversible", resource)
            when { context.approval.granted };
            "#
            .into(),
        }],
        tools(),
    )
    .unwrap()
}

fn one_tool_case(text: &str) -> Result<AccessRequest, TestError> {
    parse_file("t.toml", text, &tools()).map(|mut cases| cases.remove(0).1)
}

#[test]
fn a_tool_case_is_the_call_the_proxy_would_decide() {
    let request = one_tool_case(
        r#"[[case]]
        name = "bulk"
        agent = "demo"
        tenant = "acme"
        action = "tool"
        tool = "pay.bulk_refund"
        args = { ids = ["a", "b", "c"], note = { nested = 1.5 } }
        session = { calls = 7, cost = 0.5, depth = 2, parent_agent = "planner" }
        approved_by = "alice@example.com"
        expect = "allow""#,
    )
    .unwrap();
    assert_eq!(request.agent, "demo");
    assert_eq!(request.tenant, "acme");
    assert_eq!(
        request.host, "pay.example",
        "the tool's server, from the catalog"
    );
    assert_eq!(
        request.action,
        Action::Tool {
            name: "pay.bulk_refund".into(),
            args: serde_json::json!({ "ids": ["a", "b", "c"], "note": { "nested": 1.5 } }),
            impact_records: 3,
            cost_micros: 250_000,
            approval: Some("alice@example.com".into()),
            undo: false,
        }
    );
    assert_eq!(
        request.session,
        SessionState {
            calls: 7,
            cost_micros: 500_000,
            depth: 2,
            parent_agent: "planner".into(),
            profile: String::new(),
            ..SessionState::default()
        }
    );
}

#[test]
fn a_tool_case_defaults_to_a_first_unapproved_call_without_arguments() {
    let request = one_tool_case(
        "[[case]]\nname = \"d\"\naction = \"tool\"\ntool = \"files.delete\"\nexpect = \"escalate\"\n",
    )
    .unwrap();
    assert_eq!(request.host, "files.example", "the MCP endpoint's host");
    assert_eq!(
        request.action,
        Action::Tool {
            name: "files.delete".into(),
            args: serde_json::json!({}),
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo: false,
        }
    );
    assert_eq!(request.session, SessionState::default());
    // Nothing at the extractor's pointer: no records are counted.
    let request = one_tool_case(
        "[[case]]\nname = \"d\"\naction = \"tool\"\ntool = \"pay.bulk_refund\"\nargs = { note = \"x\" }\nexpect = \"deny\"\n",
    )
    .unwrap();
    assert!(matches!(
        request.action,
        Action::Tool {
            impact_records: 0,
            cost_micros: 250_000,
            ..
        }
    ));
    // A value there that is not a count is what the proxy refuses: an error of the case,
    // not a call of 0 records.
    let err = one_tool_case(
        "[[case]]\nname = \"d\"\naction = \"tool\"\ntool = \"pay.bulk_refund\"\nargs = { ids = \"x\" }\nexpect = \"deny\"\n",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("impact.records: the argument at /ids is a string"),
        "{err}"
    );
}

#[test]
fn tool_cases_decide_allow_deny_and_escalate() {
    let dir = dir_with(&[(
        "tools.toml",
        r#"
        [[case]]
        name = "small batch"
        action = "tool"
        tool = "pay.bulk_refund"
        args = { ids = ["a", "b"] }
        expect = "allow"
        policies = ["small"]

        [[case]]
        name = "large batch: impact from the extractor"
        action = "tool"
        tool = "pay.bulk_refund"
        args = { ids = ["a", "b", "c"] }
        expect = "deny"
        policies = []

        [[case]]
        name = "small batch, spent session"
        action = "tool"
        tool = "pay.bulk_refund"
        args = { ids = ["a"] }
        session = { cost = 1.0 }
        expect = "deny"

        [[case]]
        name = "delete escalates"
        action = "tool"
        tool = "files.delete"
        expect = "escalate"
        policies = ["human"]

        [[case]]
        name = "delete approved"
        action = "tool"
        tool = "files.delete"
        approved_by = "alice@example.com"
        expect = "allow"
        policies = ["approved"]
        "#,
    )]);
    let report = run_dir(&tool_engine(), dir.path()).unwrap();
    assert_eq!(report.cases.len(), 5);
    assert_eq!(report.failed(), 0, "{report:?}");

    // And a wrong expectation about escalation is a failure, not a pass.
    let dir = dir_with(&[(
        "wrong.toml",
        "[[case]]\nname = \"w\"\naction = \"tool\"\ntool = \"files.delete\"\nexpect = \"deny\"\n",
    )]);
    let report = run_dir(&tool_engine(), dir.path()).unwrap();
    assert_eq!(
        report.cases[0].failure.as_deref(),
        Some("expected deny, got escalate by [human] (approval required)")
    );
}

#[test]
fn a_trigger_case_is_the_trigger_the_proxy_would_decide() {
    let request = one_tool_case(
        r#"[[case]]
        name = "push"
        agent = "ci-bot"
        action = "trigger"
        trigger = "gh-push"
        payload = { ref = "main", size = 3 }
        session = { profile = "default" }
        approved_by = "alice"
        expect = "allow""#,
    )
    .unwrap();
    assert_eq!(request.agent, "ci-bot");
    assert_eq!(
        request.action,
        Action::Trigger {
            name: "gh-push".into(),
            kind: "webhook".into(),
            payload: serde_json::json!({"ref": "main", "size": 3}),
            approval: Some("alice".into()),
        }
    );
    assert_eq!(request.session.profile, "default");
}

#[test]
fn bad_tool_cases_are_errors_with_file_and_line() {
    let case_error = |body: &str| {
        // The faulty case is the second, so the line says which entry is meant.
        let text = format!(
            "[[case]]\nname = \"fine\"\naction = \"tool\"\ntool = \"files.delete\"\nexpect = \"escalate\"\n\n\
             [[case]]\nname = \"bad\"\n{body}expect = \"deny\"\n"
        );
        parse_file("t.toml", &text, &tools())
            .unwrap_err()
            .to_string()
    };
    let cases = [
        ("action = \"tool\"\n", "`tool` is required"),
        (
            "action = \"tool\"\ntool = \"nope\"\n",
            "tool \"nope\" is not in the catalog",
        ),
        (
            "action = \"tool\"\ntool = \"files.delete\"\nhost = \"files.example\"\n",
            "`host` does not apply to tool cases",
        ),
        (
            "action = \"tool\"\ntool = \"files.delete\"\nmethod = \"POST\"\n",
            "`method` does not apply to tool cases",
        ),
        (
            "action = \"http\"\nhost = \"h\"\nargs = {}\n",
            "`args` applies to tool cases only",
        ),
        (
            "action = \"connect\"\nhost = \"h\"\napproved_by = \"a\"\n",
            "`approved_by` applies to tool and trigger cases only",
        ),
        ("action = \"http\"\n", "`host` is required"),
        (
            "action = \"tool\"\ntool = \"files.delete\"\napproved_by = \"\"\n",
            "`approved_by` is empty",
        ),
        (
            "action = \"tool\"\ntool = \"files.delete\"\nsession = { cost = -1.0 }\n",
            "session.cost must be a finite number",
        ),
        (
            "action = \"tool\"\ntool = \"files.delete\"\nsession = { calls = -1 }\n",
            "must not be negative",
        ),
        (
            "action = \"mcp\"\nhost = \"files.example\"\n",
            "`method` (the JSON-RPC method) is required",
        ),
        (
            "action = \"mcp\"\nhost = \"files.example\"\nmethod = \"ping\"\npath = \"/mcp\"\n",
            "`path` does not apply to mcp cases",
        ),
        (
            "action = \"http\"\nhost = \"h\"\nserver = \"https://h/mcp\"\n",
            "`server` applies to mcp cases only",
        ),
        (
            "action = \"spawn\"\n",
            "`child` (the agent name asked for) is required",
        ),
        (
            "action = \"spawn\"\nchild = \"b\"\nhost = \"h\"\n",
            "`host` does not apply to spawn cases",
        ),
        (
            "action = \"http\"\nhost = \"h\"\nchild = \"b\"\n",
            "`child` applies to spawn cases only",
        ),
        (
            "action = \"spawn\"\nchild = \"b\"\nsession = { parent_agent = \"a\" }\n",
            "session.depth is 0",
        ),
        (
            "action = \"trigger\"\n",
            "`trigger` (the trigger's name) is required",
        ),
        (
            "action = \"trigger\"\ntrigger = \"t\"\nkind = \"cron\"\n",
            "`kind` \"cron\": expected",
        ),
        (
            "action = \"trigger\"\ntrigger = \"t\"\nhost = \"h\"\n",
            "`host` does not apply to trigger cases",
        ),
        (
            "action = \"http\"\nhost = \"h\"\npayload = { a = 1 }\n",
            "`payload` applies to trigger cases only",
        ),
        (
            "action = \"tool\"\ntool = \"files.delete\"\ntrigger = \"t\"\n",
            "`trigger` applies to trigger cases only",
        ),
    ];
    for (body, message) in cases {
        let err = case_error(body);
        assert!(
            err.starts_with("t.toml:7: case \"bad\": ") && err.contains(message),
            "{body:?}: {err}"
        );
    }
}

#[test]
fn tool_case_fields_are_checked_by_shape() {
    let parse_error = |body: &str| {
        let text = format!("[[case]]\nname = \"bad\"\naction = \"tool\"\ntool = \"files.delete\"\nexpect = \"deny\"\n{body}");
        parse_file("t.toml", &text, &tools()).unwrap_err()
    };
    // The impact is the catalog's to compute, never the case's to claim.
    let err = parse_error("impact_records = 3\n");
    assert!(
        matches!(err, TestError::Parse { line: Some(6), .. })
            && err.to_string().contains("impact_records"),
        "{err}"
    );
    // Session fields are checked as strictly as the case's own.
    let err = parse_error("session = { calls = 1, cots = 0.5 }\n");
    assert!(
        matches!(err, TestError::Parse { line: Some(6), .. }) && err.to_string().contains("cots"),
        "{err}"
    );
    // Arguments are a table, as MCP arguments and REST bodies are objects.
    let err = parse_error("args = [1, 2]\n");
    assert!(
        matches!(err, TestError::Parse { line: Some(6), .. }),
        "{err}"
    );
}

#[test]
fn mcp_and_spawn_cases_decide_with_their_own_context() {
    let engine = PolicyEngine::with_catalog(
        &[PolicySource {
            name: "t.cedar".into(),
            text: r#"
            @id("mcp-plumbing")
            permit (principal, action == Ostiary::Action::"mcp", resource == Ostiary::Host::"files.example")
            when { ["initialize", "ping"].contains(context.method) && context.server == "https://files.example/mcp" };
            @id("planner-spawns-reviewer")
            permit (principal == Ostiary::Agent::"planner", action == Ostiary::Action::"spawn", resource == Ostiary::Agent::"reviewer")
            when { context.session.depth < 2 };
            @id("children-read-only")
            forbid (principal, action == Ostiary::Action::"http", resource)
            when { context.session.parent_agent != "" && context.method != "GET" };
            @id("http")
            permit (principal, action == Ostiary::Action::"http", resource);
            "#
            .into(),
        }],
        tools(),
    )
    .unwrap();
    let text = r#"
        [[case]]
        name = "ping"
        action = "mcp"
        host = "files.example"
        method = "ping"
        expect = "allow"

        [[case]]
        name = "resources/read needs a permit"
        action = "mcp"
        host = "files.example"
        method = "resources/read"
        expect = "deny"

        [[case]]
        name = "another server"
        action = "mcp"
        host = "files.example"
        method = "ping"
        server = "https://files.example/other"
        expect = "deny"

        [[case]]
        name = "planner spawns a reviewer"
        agent = "planner"
        action = "spawn"
        child = "reviewer"
        expect = "allow"

        [[case]]
        name = "not too deep"
        agent = "planner"
        action = "spawn"
        child = "reviewer"
        session = { depth = 2, parent_agent = "root" }
        expect = "deny"

        [[case]]
        name = "nobody else"
        agent = "reader"
        action = "spawn"
        child = "reviewer"
        expect = "deny"

        [[case]]
        name = "a child may only read"
        action = "http"
        host = "h.example"
        method = "POST"
        session = { depth = 1, parent_agent = "planner" }
        expect = "deny"
        policies = ["children-read-only"]

        [[case]]
        name = "a root may write"
        action = "http"
        host = "h.example"
        method = "POST"
        expect = "allow"
    "#;
    let cases = parse_file("t.toml", text, engine.catalog()).unwrap();
    for (case, request) in &cases {
        let result = run_case(&engine, "t.toml", case, request);
        assert!(result.passed(), "{}: {:?}", case.name, result.failure);
    }
}
