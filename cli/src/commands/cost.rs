//! `ostiary audit cost`: what tool calls cost, per tool, agent, tenant or session, read from
//! the audit chain. The chain is the record of what was charged (each allowed or executed
//! tool call carries its `cost_micros`), so the report needs no running proxy and agrees
//! with the audit trail by construction. Sums are kept in integer micro-units: a float sum
//! of many small costs drifts, and a cost report must add up to the cent.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use ostiary::audit::record::AuditRecord;

/// What the report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum By {
    #[default]
    Tool,
    Agent,
    Tenant,
    Session,
}

impl By {
    fn key(self, record: &AuditRecord) -> Option<&str> {
        match self {
            By::Tool => record.tool.as_deref(),
            By::Agent => record.agent.as_deref(),
            By::Tenant => record.tenant.as_deref(),
            By::Session => record.session.as_deref(),
        }
    }
}

/// Shown for a record that lacks the grouping field (a costed call always has a tool and a
/// session, but the report must not drop money because a field is missing).
const NO_KEY: &str = "-";

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CostRow {
    pub key: String,
    /// Charged calls: records carrying a `cost_micros`.
    pub calls: u64,
    /// Their total, in micro-units (1.0 = 1_000_000).
    pub cost_micros: i64,
}

/// The cost of `records` grouped `by`, most expensive first (ties by key, so the output is
/// stable). Records without a `cost_micros` were not charged and are left out. Takes a
/// slice or the references [`of_session_tree`] picks, so nothing is copied.
pub fn cost_report<'a>(records: impl IntoIterator<Item = &'a AuditRecord>, by: By) -> Vec<CostRow> {
    let mut groups: BTreeMap<&str, (u64, i64)> = BTreeMap::new();
    for record in records {
        let Some(cost) = record.cost_micros else {
            continue;
        };
        let group = groups.entry(by.key(record).unwrap_or(NO_KEY)).or_default();
        group.0 += 1;
        // Saturating: an absurd total is still shown rather than panicking or wrapping.
        group.1 = group.1.saturating_add(cost);
    }
    let mut rows: Vec<CostRow> = groups
        .into_iter()
        .map(|(key, (calls, cost_micros))| CostRow {
            key: key.to_owned(),
            calls,
            cost_micros,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.cost_micros
            .cmp(&a.cost_micros)
            .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

/// The records of `session` and of every session spawned from it, at any depth. A child's
/// records name only its direct parent, so the tree is rebuilt from the records themselves.
pub fn of_session_tree<'a>(records: &'a [AuditRecord], session: &str) -> Vec<&'a AuditRecord> {
    let mut parent_of: HashMap<&str, &str> = HashMap::new();
    for r in records {
        if let (Some(child), Some(parent)) = (r.session.as_deref(), r.parent.as_deref()) {
            parent_of.insert(child, parent);
        }
    }
    let mut inside: HashMap<&str, bool> = HashMap::new();
    records
        .iter()
        .filter(|r| {
            r.session
                .as_deref()
                .is_some_and(|s| descends_from(s, session, &parent_of, &mut inside))
        })
        .collect()
}

/// Whether `start` is `root` or one of its descendants, memoised in `known`. Audit records
/// are data, not a proven tree: a cycle in `parent` links ends the walk instead of hanging.
fn descends_from<'a>(
    start: &'a str,
    root: &str,
    parent_of: &HashMap<&'a str, &'a str>,
    known: &mut HashMap<&'a str, bool>,
) -> bool {
    let mut chain = Vec::new();
    let mut seen = HashSet::new();
    let mut current = Some(start);
    let answer = loop {
        let Some(s) = current else { break false };
        if let Some(&answer) = known.get(s) {
            break answer;
        }
        if s == root {
            break true;
        }
        if !seen.insert(s) {
            break false;
        }
        chain.push(s);
        current = parent_of.get(s).copied();
    };
    for s in chain {
        known.insert(s, answer);
    }
    answer
}

/// Micro-units as a decimal with six places, by integer arithmetic (exact, unlike a float).
pub fn format_micros(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let abs = micros.unsigned_abs();
    format!("{sign}{}.{:06}", abs / 1_000_000, abs % 1_000_000)
}

/// The report as a table with a total line.
pub fn render_table(rows: &[CostRow], by: By) -> String {
    let header = match by {
        By::Tool => "TOOL",
        By::Agent => "AGENT",
        By::Tenant => "TENANT",
        By::Session => "SESSION",
    };
    let calls: u64 = rows.iter().map(|r| r.calls).sum();
    let total = rows
        .iter()
        .fold(0i64, |sum, r| sum.saturating_add(r.cost_micros));
    let width = rows
        .iter()
        .map(|r| r.key.chars().count())
        .chain([header.len(), "TOTAL".len()])
        .max()
        .unwrap_or(0);
    let mut out = format!("{header:<width$}  {:>8}  {:>16}\n", "CALLS", "COST");
    for r in rows {
        out.push_str(&format!(
            "{:<width$}  {:>8}  {:>16}\n",
            r.key,
            r.calls,
            format_micros(r.cost_micros)
        ));
    }
    out.push_str(&format!(
        "{:<width$}  {calls:>8}  {:>16}\n",
        "TOTAL",
        format_micros(total)
    ));
    out
}

/// The report as JSON lines, one per row; `cost` is for reading, `cost_micros` is exact.
pub fn render_json(rows: &[CostRow]) -> String {
    rows.iter()
        .map(|r| {
            let line = serde_json::json!({
                "key": r.key,
                "calls": r.calls,
                "cost_micros": r.cost_micros,
                "cost": r.cost_micros as f64 / 1_000_000.0,
            });
            format!("{line}\n")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charged(
        session: &str,
        parent: Option<&str>,
        tool: &str,
        micros: Option<i64>,
    ) -> AuditRecord {
        AuditRecord {
            session: Some(session.to_owned()),
            parent: parent.map(str::to_owned),
            agent: Some(format!("agent-of-{session}")),
            tenant: Some(
                if session.starts_with('b') {
                    "beta"
                } else {
                    "acme"
                }
                .to_owned(),
            ),
            tool: Some(tool.to_owned()),
            kind: "http".to_owned(),
            decision: "allow".to_owned(),
            cost_micros: micros,
            ..Default::default()
        }
    }

    fn row(key: &str, calls: u64, cost_micros: i64) -> CostRow {
        CostRow {
            key: key.to_owned(),
            calls,
            cost_micros,
        }
    }

    fn sample() -> Vec<AuditRecord> {
        vec![
            charged("a1", None, "gh.create_issue", Some(1_000)),
            charged("a1", None, "pay.refund", Some(250_000)),
            charged("a1", None, "gh.create_issue", Some(1_000)),
            // A refused call carries no cost: not charged, not counted.
            charged("a1", None, "pay.refund", None),
            charged("b1", None, "gh.create_issue", Some(1_000)),
        ]
    }

    #[test]
    fn by_tool_sorts_by_cost_then_key_and_ignores_uncharged_records() {
        assert_eq!(
            cost_report(&sample(), By::Tool),
            [
                row("pay.refund", 1, 250_000),
                row("gh.create_issue", 3, 3_000)
            ]
        );
    }

    #[test]
    fn ties_in_cost_are_ordered_by_key() {
        let records = [
            charged("s", None, "zeta", Some(5)),
            charged("s", None, "alpha", Some(5)),
        ];
        assert_eq!(
            cost_report(&records, By::Tool),
            [row("alpha", 1, 5), row("zeta", 1, 5)]
        );
    }

    #[test]
    fn by_agent_tenant_and_session() {
        let records = sample();
        assert_eq!(
            cost_report(&records, By::Agent),
            [row("agent-of-a1", 3, 252_000), row("agent-of-b1", 1, 1_000)]
        );
        assert_eq!(
            cost_report(&records, By::Tenant),
            [row("acme", 3, 252_000), row("beta", 1, 1_000)]
        );
        assert_eq!(
            cost_report(&records, By::Session),
            [row("a1", 3, 252_000), row("b1", 1, 1_000)]
        );
    }

    #[test]
    fn a_missing_key_is_grouped_not_dropped() {
        let mut record = charged("s", None, "t", Some(7));
        record.tool = None;
        assert_eq!(cost_report(&[record], By::Tool), [row(NO_KEY, 1, 7)]);
    }

    #[test]
    fn a_session_includes_its_descendants_at_any_depth() {
        let records = vec![
            charged("root", None, "t", Some(1)),
            charged("child", Some("root"), "t", Some(10)),
            charged("grandchild", Some("child"), "t", Some(100)),
            charged("other", None, "t", Some(1_000)),
            charged("other-child", Some("other"), "t", Some(10_000)),
        ];
        let sessions = |root: &str| cost_report(of_session_tree(&records, root), By::Session);
        assert_eq!(
            sessions("root"),
            [
                row("grandchild", 1, 100),
                row("child", 1, 10),
                row("root", 1, 1)
            ]
        );
        assert_eq!(
            sessions("child"),
            [row("grandchild", 1, 100), row("child", 1, 10)]
        );
        assert_eq!(sessions("nobody"), []);
    }

    #[test]
    fn a_child_is_found_through_a_parent_with_no_records_of_its_own() {
        // The middle session made no call, but its child's records name it as parent and
        // its own record (a session event) names the root.
        let mut middle = charged("middle", Some("root"), "t", None);
        middle.kind = "session".to_owned();
        let records = vec![middle, charged("leaf", Some("middle"), "t", Some(3))];
        let tree = of_session_tree(&records, "root");
        assert_eq!(tree.len(), 2);
        assert_eq!(cost_report(tree, By::Tool), [row("t", 1, 3)]);
    }

    #[test]
    fn a_cycle_in_parent_links_terminates() {
        let records = vec![
            charged("x", Some("y"), "t", Some(1)),
            charged("y", Some("x"), "t", Some(1)),
        ];
        assert!(of_session_tree(&records, "root").is_empty());
        assert_eq!(of_session_tree(&records, "x").len(), 2);
    }

    #[test]
    fn totals_are_exact_in_micros() {
        // 0.1 summed ten thousand times as floats is not 1000; in micros it is.
        let records: Vec<AuditRecord> = (0..10_000)
            .map(|_| charged("s", None, "t", Some(100_000)))
            .collect();
        let rows = cost_report(&records, By::Tool);
        assert_eq!(rows, [row("t", 10_000, 1_000_000_000)]);
        assert!(render_table(&rows, By::Tool).contains("1000.000000"));
    }

    #[test]
    fn micros_format_with_six_decimals() {
        assert_eq!(format_micros(0), "0.000000");
        assert_eq!(format_micros(1), "0.000001");
        assert_eq!(format_micros(1_250_000), "1.250000");
        assert_eq!(format_micros(-1_500), "-0.001500");
        assert_eq!(format_micros(i64::MIN), "-9223372036854.775808");
    }

    #[test]
    fn the_table_has_a_header_rows_and_a_total() {
        let rows = [
            row("pay.refund", 1, 250_000),
            row("gh.create_issue", 3, 3_000),
        ];
        let table = render_table(&rows, By::Tool);
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec!["TOOL", "CALLS", "COST"],
                vec!["pay.refund", "1", "0.250000"],
                vec!["gh.create_issue", "3", "0.003000"],
                vec!["TOTAL", "4", "0.253000"],
            ]
        );
    }

    #[test]
    fn json_lines_carry_exact_micros() {
        let text = render_json(&[row("t", 2, 1_500_000)]);
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(
            line,
            serde_json::json!({"key": "t", "calls": 2, "cost_micros": 1_500_000, "cost": 1.5})
        );
    }
}
