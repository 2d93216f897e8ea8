//! Session labels and recent counts from the catalog to a decision: `labels` on tools and
//! `[[host]]` entries in `tools.toml` (and every way they can be wrong), and policies over
//! `context.session.labels` / `context.session.recent`, decided directly and through the
//! policy test runner.

use ostiary_policies::labels::{HostProblem, LabelProblem};
use ostiary_policies::{
    AccessRequest, Action, Catalog, CatalogError, Decision, PolicyEngine, PolicySource, Recent,
    SessionState, ToolProblem,
};
use serde_json::json;

const CATALOG: &str = r#"
[[tool]]
name   = "crm.read_customer"
tier   = "read"
match  = { host = "crm.example.com", method = "GET", path = "/customers/{id}" }
labels = ["private_data"]

[[tool]]
name   = "payments.refund"
tier   = "high_impact"
match  = { host = "payments.example.com", method = "POST", path = "/v1/refunds" }

[[tool]]
name   = "paste.create"
tier   = "write"
match  = { host = "paste.example.net", method = "POST", path = "/pastes" }

[[host]]
name   = "news.example.com"
labels = ["untrusted_input"]

[[host]]
name   = "*.forum.example"
labels = ["untrusted_input", "user_content"]
"#;

/// The lethal trifecta, and "more than 3 refunds in an hour escalates".
const POLICIES: &str = r#"
@id("allow-all")
permit (principal, action, resource);

@id("no-exfiltration-after-private-and-untrusted")
forbid (principal, action == Ostiary::Action::"http", resource)
when {
  context.method == "POST" &&
  context.session.labels.contains("private_data") &&
  context.session.labels.contains("untrusted_input")
};

@id("publish-after-private-and-untrusted-needs-a-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:write", resource)
when {
  context.session.labels.containsAll(["private_data", "untrusted_input"])
}
unless { context.approval.granted };

@id("refunds-per-hour")
@escalate("approval")
forbid (principal, action == Ostiary::Action::"tool:payments.refund", resource)
when { context.session.recent.tool_1h >= 3 }
unless { context.approval.granted };
"#;

fn catalog() -> Catalog {
    Catalog::parse("tools.toml", CATALOG, None).unwrap()
}

fn engine() -> PolicyEngine {
    PolicyEngine::with_catalog(
        &[PolicySource {
            name: "p.cedar".into(),
            text: POLICIES.into(),
        }],
        catalog(),
    )
    .unwrap()
}

fn session(labels: &[&str], recent: Recent) -> SessionState {
    SessionState {
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        recent,
        ..SessionState::default()
    }
}

fn post(host: &str, session: SessionState) -> AccessRequest {
    AccessRequest {
        agent: "a".into(),
        tenant: "default".into(),
        host: host.into(),
        session,
        action: Action::Http {
            method: "POST".into(),
            scheme: "https".into(),
            port: 443,
            path: "/upload".into(),
            query: String::new(),
        },
    }
}

#[test]
fn tools_and_hosts_carry_labels() {
    let catalog = catalog();
    let read = catalog.get("crm.read_customer").unwrap();
    assert_eq!(read.labels(), ["private_data"]);
    assert!(catalog.get("payments.refund").unwrap().labels().is_empty());
    assert_eq!(
        catalog.labels_for("crm.example.com", Some(read)),
        ["private_data"]
    );
    assert_eq!(
        catalog.labels_for("news.example.com", None),
        ["untrusted_input"]
    );
    assert_eq!(
        catalog.labels_for("a.b.forum.example", None),
        ["untrusted_input", "user_content"]
    );
    assert!(catalog.labels_for("forum.example", None).is_empty());
    assert!(catalog.labels_for("upload.example.org", None).is_empty());
    // A labelled tool on a labelled host: both, each once.
    assert_eq!(
        catalog.labels_for("x.forum.example", Some(read)),
        ["private_data", "untrusted_input", "user_content"]
    );
}

fn tool_err(text: &str) -> ToolProblem {
    match Catalog::parse("tools.toml", text, None).unwrap_err() {
        CatalogError::Tool { problem, .. } => problem,
        other => panic!("{other}"),
    }
}

fn host_err(text: &str) -> (usize, String, HostProblem) {
    match Catalog::parse("tools.toml", text, None).unwrap_err() {
        CatalogError::Host {
            line,
            host,
            problem,
            ..
        } => (line, host, problem),
        other => panic!("{other}"),
    }
}

#[test]
fn bad_labels_fail_the_load() {
    let tool = |labels: &str| {
        format!(
            "[[tool]]\nname = \"t\"\ntier = \"read\"\n\
             match = {{ host = \"a.example\", method = \"GET\", path = \"/\" }}\nlabels = {labels}\n"
        )
    };
    assert!(matches!(
        tool_err(&tool("[\"Private\"]")),
        ToolProblem::Labels(LabelProblem::Invalid(l)) if l == "Private"
    ));
    assert!(matches!(
        tool_err(&tool("[\"\"]")),
        ToolProblem::Labels(LabelProblem::Invalid(_))
    ));
    assert!(matches!(
        tool_err(&tool("[\"a\", \"a\"]")),
        ToolProblem::Labels(LabelProblem::Duplicate(l)) if l == "a"
    ));
    let many = (0..17).map(|i| format!("\"l{i}\"")).collect::<Vec<_>>();
    assert!(matches!(
        tool_err(&tool(&format!("[{}]", many.join(", ")))),
        ToolProblem::Labels(LabelProblem::TooMany(17))
    ));
    // Not a list of strings: a shape error with the line.
    let err = Catalog::parse("tools.toml", &tool("\"private_data\""), None).unwrap_err();
    assert!(matches!(err, CatalogError::Parse { .. }), "{err}");
    let err = Catalog::parse("tools.toml", &tool("[1]"), None).unwrap_err();
    assert!(matches!(err, CatalogError::Parse { .. }), "{err}");
    // The message says what a label is.
    let err = Catalog::parse("tools.toml", &tool("[\"no-dash\"]"), None).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("tools.toml:2: tool \"t\": labels: label \"no-dash\""),
        "{text}"
    );

    let (line, host, problem) =
        host_err("[[host]]\nname = \"News.example.com\"\nlabels = [\"x\"]\n");
    assert_eq!(
        (line, host.as_str(), problem),
        (2, "News.example.com", HostProblem::InvalidName)
    );
    for name in ["a.example:443", "https://a.example", "*", "a.*.example", ""] {
        let (_, _, problem) = host_err(&format!("[[host]]\nname = \"{name}\"\nlabels = [\"x\"]\n"));
        assert_eq!(problem, HostProblem::InvalidName, "{name:?}");
    }
    let (_, _, problem) = host_err("[[host]]\nname = \"a.example\"\nlabels = []\n");
    assert_eq!(problem, HostProblem::NoLabels);
    let (_, _, problem) = host_err("[[host]]\nname = \"a.example\"\nlabels = [\"a b\"]\n");
    assert_eq!(
        problem,
        HostProblem::Label(LabelProblem::Invalid("a b".into()))
    );
    let (line, _, problem) = host_err(
        "[[host]]\nname = \"a.example\"\nlabels = [\"x\"]\n\n[[host]]\nname = \"a.example\"\nlabels = [\"y\"]\n",
    );
    assert_eq!(
        (line, problem),
        (6, HostProblem::Duplicate { first_line: 2 })
    );
    // Missing labels, unknown fields: shape errors.
    for text in [
        "[[host]]\nname = \"a.example\"\n",
        "[[host]]\nname = \"a.example\"\nlabels = [\"x\"]\ncolour = \"red\"\n",
        "[[host]]\nlabels = [\"x\"]\n",
    ] {
        let err = Catalog::parse("tools.toml", text, None).unwrap_err();
        assert!(matches!(err, CatalogError::Parse { .. }), "{err}");
    }
}

#[test]
fn a_session_with_private_data_and_untrusted_input_may_not_post_without_a_human() {
    let engine = engine();
    let fresh = engine.decide(&post("upload.example.org", session(&[], Recent::default())));
    assert!(fresh.is_allow(), "{fresh:?}");
    let one = engine.decide(&post(
        "upload.example.org",
        session(&["private_data"], Recent::default()),
    ));
    assert!(one.is_allow(), "{one:?}");
    let tainted = session(&["private_data", "untrusted_input"], Recent::default());
    let decision = engine.decide(&post("upload.example.org", tainted.clone()));
    assert!(
        matches!(&decision, Decision::Deny { policies, .. }
            if policies == &["no-exfiltration-after-private-and-untrusted"]),
        "{decision:?}"
    );
    // A GET is still fine: the policy forbids writes.
    let mut get = post("upload.example.org", tainted);
    if let Action::Http { method, .. } = &mut get.action {
        *method = "GET".into();
    }
    assert!(engine.decide(&get).is_allow());
}

#[test]
fn more_than_three_refunds_in_an_hour_escalates() {
    let engine = engine();
    let refund = |tool_1h: i64| AccessRequest {
        agent: "a".into(),
        tenant: "default".into(),
        host: "payments.example.com".into(),
        session: session(
            &[],
            Recent {
                tool_10m: 0,
                tool_1h,
                tier_10m: 0,
                tier_1h: tool_1h,
            },
        ),
        action: Action::Tool {
            name: "payments.refund".into(),
            args: json!({}),
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo: false,
        },
    };
    assert!(engine.decide(&refund(2)).is_allow());
    let decision = engine.decide(&refund(3));
    assert!(
        matches!(&decision, Decision::Escalate { policies } if policies == &["refunds-per-hour"]),
        "{decision:?}"
    );
}

#[test]
fn policy_tests_state_labels_and_recent_counts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), CATALOG).unwrap();
    std::fs::write(dir.path().join("p.cedar"), POLICIES).unwrap();
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    std::fs::write(
        dir.path().join("tests/session.toml"),
        r#"
[[case]]
name = "a fresh session may post"
action = "http"
host = "upload.example.org"
method = "POST"
expect = "allow"

[[case]]
name = "a tainted session may not post"
action = "http"
host = "upload.example.org"
method = "POST"
session = { labels = ["private_data", "untrusted_input"] }
expect = "deny"
policies = ["no-exfiltration-after-private-and-untrusted"]

[[case]]
name = "a tainted session's paste waits for a human"
action = "tool"
tool = "paste.create"
session = { labels = ["private_data", "untrusted_input"] }
expect = "escalate"

[[case]]
name = "a fresh session's paste does not"
action = "tool"
tool = "paste.create"
session = { labels = ["untrusted_input"] }
expect = "allow"

[[case]]
name = "the fourth refund of the hour is held"
action = "tool"
tool = "payments.refund"
session = { recent = { tool_1h = 3, tier_1h = 3 } }
expect = "escalate"

[[case]]
name = "the third is not"
action = "tool"
tool = "payments.refund"
session = { recent = { tool_10m = 2, tool_1h = 2, tier_10m = 2, tier_1h = 5 } }
expect = "allow"
"#,
    )
    .unwrap();
    let engine = PolicyEngine::load_dir(dir.path()).unwrap();
    let report = ostiary_policies::run_dir(&engine, &dir.path().join("tests")).unwrap();
    assert_eq!((report.passed(), report.failed()), (6, 0), "{report:?}");

    // A case whose session could not be a session's is an error of the case, not a pass.
    for bad in [
        "session = { labels = [\"Not A Label\"] }",
        "session = { recent = { tool_1h = -1 } }",
        "session = { recent = { tool_10m = 2, tool_1h = 1, tier_10m = 2, tier_1h = 2 } }",
        "session = { recent = { tool_2h = 1 } }",
    ] {
        std::fs::write(
            dir.path().join("tests/session.toml"),
            format!(
                "[[case]]\nname = \"bad\"\naction = \"http\"\nhost = \"h.example\"\n{bad}\nexpect = \"allow\"\n"
            ),
        )
        .unwrap();
        let outcome = ostiary_policies::run_dir(&engine, &dir.path().join("tests"));
        let refused = match &outcome {
            Err(_) => true,
            Ok(report) => report.failed() == 1,
        };
        assert!(refused, "{bad}: {outcome:?}");
    }
}
