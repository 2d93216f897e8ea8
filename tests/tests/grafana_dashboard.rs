//! The Grafana dashboard in `docs/grafana/ostiary-dashboard.json` reads only what a real
//! proxy exports: a proxy is driven through an allow, a deny, an escalation (a check whose
//! webhook cannot answer), a limit and a watchdog trip, then every `ostiary_*` series each
//! panel target and template variable names must be declared (`# TYPE`) on its `/metrics`,
//! and every label a selector, a `by (...)` or a legend uses must be on that series there.

use crate::support::guardrails as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Rig, POLICIES};

const DASHBOARD: &str = include_str!("../../docs/grafana/ostiary-dashboard.json");

/// Labels Prometheus adds at scrape time, not the proxy.
const TARGET_LABELS: &[&str] = &["instance", "job"];

/// Series names (`ostiary_requests_total`, `ostiary_check_seconds_bucket`, ...) of a
/// `/metrics` text, each with the label names its samples carry.
#[derive(Debug, Default)]
struct Exported {
    /// Series name -> (family, label names seen on its samples).
    series: BTreeMap<String, (String, BTreeSet<String>)>,
}

impl Exported {
    fn parse(text: &str) -> Self {
        let mut exported = Exported::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let names: Vec<String> = match kind {
                "counter" => vec![format!("{family}_total")],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{family}{s}"))
                    .collect(),
                "summary" => ["", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{family}{s}"))
                    .collect(),
                _ => vec![family.to_owned()],
            };
            for name in names {
                exported
                    .series
                    .insert(name, (family.to_owned(), BTreeSet::new()));
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..end];
            let labels = match line[end..].strip_prefix('{') {
                Some(rest) => matcher_labels(rest),
                None => Vec::new(),
            };
            if let Some((_, seen)) = exported.series.get_mut(name) {
                seen.extend(labels);
            }
        }
        exported
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The label names of a matcher list, `rest` starting just after its `{`.
fn matcher_labels(rest: &str) -> Vec<String> {
    let mut labels = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while matches!(chars.peek(), Some(c) if c.is_whitespace() || *c == ',') {
            chars.next();
        }
        match chars.peek() {
            None | Some('}') => return labels,
            _ => {}
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| is_ident(*c))).collect();
        if name.is_empty() {
            // Not a matcher list after all: stop rather than loop.
            return labels;
        }
        labels.push(name);
        // The operator, then the quoted value (with escapes).
        while matches!(chars.peek(), Some(c) if *c != '"' && *c != '}') {
            chars.next();
        }
        if chars.next() != Some('"') {
            return labels;
        }
        let mut escaped = false;
        for c in chars.by_ref() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => break,
                _ => {}
            }
        }
    }
}

/// What one PromQL expression names: each `ostiary_*` series with the labels its own
/// matchers use, and the labels of its `by`/`without`/`on`/`ignoring` clauses.
#[derive(Debug, Default)]
struct Names {
    series: Vec<(String, Vec<String>)>,
    grouping: Vec<String>,
}

fn names_in(expr: &str) -> Names {
    let mut names = Names::default();
    let bytes: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != '$';
        if !starts_word || !is_ident(bytes[i]) || bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let word: String = bytes[start..i].iter().collect();
        let mut j = i;
        while j < bytes.len() && bytes[j].is_whitespace() {
            j += 1;
        }
        let next = bytes.get(j).copied();
        if word.starts_with("ostiary_") {
            let labels = if next == Some('{') {
                let rest: String = bytes[j + 1..].iter().collect();
                matcher_labels(&rest)
            } else {
                Vec::new()
            };
            names.series.push((word, labels));
        } else if matches!(word.as_str(), "by" | "without" | "on" | "ignoring") && next == Some('(')
        {
            let close = bytes[j..].iter().position(|c| *c == ')').map(|p| p + j);
            let inner: String = bytes[j + 1..close.unwrap_or(bytes.len())].iter().collect();
            names.grouping.extend(
                inner
                    .split(',')
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty()),
            );
        }
    }
    names
}

/// `{{label}}` placeholders of a legend.
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}"))
        .map(|(l, _)| l.trim().to_owned())
        .collect()
}

/// Every panel, rows' nested panels included.
fn all_panels(panels: &[Value]) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in panels {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(all_panels(nested));
        }
    }
    out
}

/// What in `dashboard` does not match `exported`, one line each (empty: all good).
fn problems(dashboard: &Value, exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    let check_label = |what: &str, series: &str, label: &str, problems: &mut Vec<String>| {
        if TARGET_LABELS.contains(&label) {
            return;
        }
        match exported.series.get(series) {
            Some((_, labels)) if labels.contains(label) => {}
            Some((family, labels)) if labels.is_empty() => problems.push(format!(
                "{what}: label {label} on {series}: no sample of {family} in /metrics carries labels to check it against"
            )),
            Some((_, labels)) => problems.push(format!(
                "{what}: {series} has no label {label} (it has {labels:?})"
            )),
            None => {}
        }
    };
    let check_expr = |what: &str, expr: &str, legend: &str, problems: &mut Vec<String>| {
        let names = names_in(expr);
        if names.series.is_empty() {
            problems.push(format!("{what}: `{expr}` names no ostiary_ series"));
        }
        for (series, labels) in &names.series {
            if !exported.series.contains_key(series) {
                problems.push(format!(
                    "{what}: {series} is not exported (no `# TYPE` in /metrics declares it)"
                ));
                continue;
            }
            for label in labels {
                check_label(what, series, label, problems);
            }
        }
        // A grouping label or a legend placeholder must be on every series aggregated.
        for label in names.grouping.iter().chain(&legend_labels(legend)) {
            if label == "le" && names.series.iter().any(|(s, _)| s.ends_with("_bucket")) {
                continue;
            }
            for (series, _) in &names.series {
                check_label(what, series, label, problems);
            }
        }
    };

    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    if panels.is_empty() {
        problems.push("the dashboard has no panels".into());
    }
    let mut ids = BTreeSet::new();
    for panel in all_panels(&panels) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        if !ids.insert(panel["id"].as_i64().unwrap_or(-1)) {
            problems.push(format!("{title}: panel id missing or repeated"));
        }
        if panel["gridPos"]["w"].as_i64().is_none() {
            problems.push(format!("{title}: no gridPos"));
        }
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("{title}: no targets"));
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("{title}: datasource is not the templated one"));
        }
        for target in &targets {
            let what = format!("{title} / {}", target["refId"].as_str().unwrap_or("?"));
            match target["expr"].as_str() {
                Some(expr) => check_expr(
                    &what,
                    expr,
                    target["legendFormat"].as_str().unwrap_or(""),
                    &mut problems,
                ),
                None => problems.push(format!("{what}: no expr")),
            }
            if target["datasource"]["uid"] != "${datasource}" {
                problems.push(format!("{what}: datasource is not the templated one"));
            }
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .unwrap_or("");
        // label_values(series, label): the label is one Prometheus adds, or the series'.
        let what = format!("variable {}", variable["name"]);
        check_expr(&what, query, "", &mut problems);
        if let Some(args) = query
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
        {
            if let Some((series, label)) = args.rsplit_once(',') {
                let series = series.split('{').next().unwrap_or("").trim();
                check_label(&what, series, label.trim(), &mut problems);
            }
        }
    }
    let inputs = dashboard["__inputs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !inputs
        .iter()
        .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus")
    {
        problems.push("no DS_PROMETHEUS input in __inputs".into());
    }
    problems
}

async fn metrics_text(rig: &Rig) -> String {
    rig.http
        .get(rig.control_url("/metrics"))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_reads_metrics_and_labels_the_proxy_exports() {
    // A webhook nobody answers: the irreversible tier's budget runs out and it escalates.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let webhook = format!("http://{}/check", dead.local_addr().unwrap());
    drop(dead);
    let policies = format!(
        "{POLICIES}\n@id(\"irreversible\")\npermit (principal, action in [Ostiary::Action::\"tier:irreversible\"], resource);\n"
    );
    let rig = Rig::start_with(
        &format!(
            r#"
[tiers.read]
repeat_max = 3
[tiers.write]
repeat_max = 0
[checks.webhook]
url = "{webhook}"
[approvals]
approvers = ["alice@example.com"]
"#
        ),
        &policies,
    )
    .await;

    // allow, then a limit: two writes pass, the third is over max_calls.
    let a = rig
        .agent(json!({"agent": "writer", "max_calls": 2}), None)
        .await
        .unwrap();
    for i in 0..2 {
        let (s, b, _) = rig.write(&a, &format!("w{i}")).await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, _) = rig.write(&a, "w2").await;
    assert_eq!((s, b["limit"].clone()), (429, json!("calls")), "{b}");

    // deny: policy forbids t.guarded from the session's third call on.
    let d = rig.agent(json!({"agent": "guarded"}), None).await.unwrap();
    for i in 0..2 {
        let (s, b, _) = rig
            .call(&d, "GET", &format!("/idem/guarded/g{i}"), &[], None)
            .await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, _) = rig.call(&d, "GET", "/idem/guarded/g2", &[], None).await;
    assert_eq!(s, 403, "{b}");

    // a watchdog trip: the third identical read pauses the session.
    let l = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    for _ in 0..3 {
        let (s, b, _) = rig.call(&l, "GET", "/idem/read/same", &[], None).await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, _) = rig.call(&l, "GET", "/echo", &[], None).await;
    assert_eq!(s, 423, "{b}");

    // escalate: the webhook cannot answer, the tier's budget runs out, a human decides.
    let e = rig.agent(json!({"agent": "irrev"}), None).await.unwrap();
    let (s, b, _) = rig.call(&e, "DELETE", "/idem/irrev/x", &[], None).await;
    assert_eq!(s, 202, "{b}");

    // Counted as the records close: wait for the last of them.
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = metrics_text(&rig).await;
        let all_there = [
            r#"decision="allow""#,
            r#"decision="deny""#,
            r#"decision="escalate""#,
            "ostiary_limits_exceeded_total{",
            "ostiary_watchdog_trips_total{",
            "ostiary_check_budget_exceeded_total{",
            "ostiary_approval_transitions_total{",
        ]
        .iter()
        .all(|s| text.contains(s));
        if all_there || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let exported = Exported::parse(&text);
    assert!(
        exported.series.contains_key("ostiary_requests_total"),
        "{text}"
    );

    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(dashboard["schemaVersion"], 39);
    let found = problems(&dashboard, &exported);
    assert!(
        found.is_empty(),
        "{}\n\n/metrics:\n{text}",
        found.join("\n")
    );

    // The check itself catches a metric, a matcher label and a grouping label that do not
    // exist, so a dashboard that drifted from the proxy fails here.
    for (from, to) in [
        ("ostiary_approvals_pending", "ostiary_approvals_waiting"),
        ("ostiary_requests_total", "ostiary_requests"),
        (
            "ostiary_decision_seconds_bucket",
            "ostiary_decision_seconds_bukket",
        ),
        ("by (limit)", "by (limits)"),
        ("decision=~", "outcome=~"),
        ("{{kind}}", "{{tool}}"),
    ] {
        assert!(DASHBOARD.contains(from), "{from}");
        let broken: Value = serde_json::from_str(&DASHBOARD.replace(from, to)).unwrap();
        assert!(
            !problems(&broken, &exported).is_empty(),
            "replacing {from} with {to} went unnoticed"
        );
    }
}
