//! How `audit query` and `audit tail` print records: a table for a person at a terminal,
//! JSON lines (the records as stored) or OCSF events for anything else.
//!
//! The default follows where stdout goes, so a pipe, a script or a test reading `audit
//! query` keeps getting the JSON lines it always got, while a person typing it gets a table.
//! The table's columns have fixed widths, so `tail` can print each row as it comes and
//! still line up with the rows before it.

use std::io::IsTerminal;

use ostiary::audit::AuditRecord;

use super::CliError;
use crate::output::{decision_style, paint};

/// How records are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordFormat {
    /// One row per record, for reading at a terminal.
    Table,
    /// One JSON line per record, as stored.
    Json,
    /// One OCSF 1.3 event per record (API Activity for tool calls and MCP messages, HTTP
    /// Activity for other requests), for a SIEM.
    Ocsf,
}

impl RecordFormat {
    /// The format `--format` and `--json` ask for, with stdout's kind deciding when
    /// neither does.
    pub fn choose(asked: Option<Self>, json: bool) -> Result<Self, CliError> {
        Self::choose_for(asked, json, std::io::stdout().is_terminal())
    }

    /// [`RecordFormat::choose`] with the terminal question answered, for tests.
    fn choose_for(asked: Option<Self>, json: bool, terminal: bool) -> Result<Self, CliError> {
        match (asked, json) {
            (Some(Self::Table), true) => Err(CliError::Usage(
                "--json and --format table ask for two different outputs: give one".into(),
            )),
            (Some(format), _) => Ok(format),
            (None, false) if terminal => Ok(Self::Table),
            (None, _) => Ok(Self::Json),
        }
    }

    /// One record in this format, without its newline. A table row carries colour codes,
    /// for a stream that strips them where they do not belong.
    pub fn line(self, record: &AuditRecord) -> Result<String, serde_json::Error> {
        match self {
            Self::Table => Ok(row(record)),
            Self::Json => serde_json::to_string(record),
            Self::Ocsf => serde_json::to_string(&ostiary::audit::ocsf::event(record)),
        }
    }
}

/// Column widths: the longest value each column usually holds (`escalate`, `mcp_message`,
/// a timestamp to the second); longer values are cut with `…` so rows stay aligned.
const TIME: usize = 20;
const DECISION: usize = 8;
const KIND: usize = 11;
const AGENT: usize = 16;
const WHAT: usize = 44;
const STATUS: usize = 6;

/// The table's header line (no newline).
pub fn header() -> String {
    format!(
        "{:<TIME$}  {:<DECISION$}  {:<KIND$}  {:<AGENT$}  {:<WHAT$}  {:<STATUS$}  POLICIES",
        "TIME", "DECISION", "KIND", "AGENT", "WHAT", "STATUS"
    )
}

/// One record as a table row (no newline), its decision coloured.
pub fn row(r: &AuditRecord) -> String {
    let time = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.ts_ms.max(0) as u64),
    )
    .to_string();
    let decision = paint(decision_style(&r.decision), &cell(&r.decision, DECISION));
    let status = r.status.map_or_else(|| "-".to_owned(), |s| s.to_string());
    let policies = if r.policies.is_empty() {
        "-".to_owned()
    } else {
        clean(&r.policies.join(","))
    };
    format!(
        "{}  {decision}  {}  {}  {}  {}  {policies}",
        cell(&time, TIME),
        cell(&r.kind, KIND),
        cell(r.agent.as_deref().unwrap_or("-"), AGENT),
        cell(&what(r), WHAT),
        cell(&status, STATUS),
    )
}

/// What the record is about: the tool, else the JSON-RPC method, else the request line
/// (method, host, path: whichever the record has).
fn what(r: &AuditRecord) -> String {
    if let Some(tool) = &r.tool {
        return tool.clone();
    }
    if let Some(method) = &r.rpc_method {
        return method.clone();
    }
    // A trigger's delivery or a run: which trigger, which run.
    if let Some(run) = &r.run {
        let named: Vec<&str> = ["trigger", "run_id"]
            .iter()
            .filter_map(|k| run.get(*k).and_then(|v| v.as_str()))
            .collect();
        if !named.is_empty() {
            return named.join(" ");
        }
    }
    let parts: Vec<&str> = [&r.method, &r.host, &r.path]
        .into_iter()
        .filter_map(|p| p.as_deref())
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(" ")
    }
}

/// `text` cleaned, cut to `width` characters (the last one `…` when cut) and padded to it.
fn cell(text: &str, width: usize) -> String {
    let text = clean(text);
    if text.chars().count() <= width {
        return format!("{text:<width$}");
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Control characters shown as `?`: agent names, hosts and paths come from agents, and an
/// escape sequence in one must not reach the operator's terminal as a command to it.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AuditRecord {
        AuditRecord {
            ts_ms: 1_767_225_600_123,
            kind: "http".into(),
            decision: "deny".into(),
            agent: Some("demo".into()),
            method: Some("GET".into()),
            host: Some("api.example.test".into()),
            path: Some("/echo".into()),
            status: Some(403),
            policies: vec!["no-writes".into(), "forbid-admin".into()],
            ..Default::default()
        }
    }

    /// The codes `anstream` would strip on a pipe, stripped here to see the layout.
    fn plain(text: &str) -> String {
        let mut out = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn a_row_has_every_column_at_its_width() {
        let shown = plain(&row(&record()));
        assert_eq!(
            shown,
            "2026-01-01T00:00:00Z  deny      http         demo              \
             GET api.example.test /echo                    403     no-writes,forbid-admin"
        );
        let header = header();
        assert!(
            header.starts_with("TIME                  DECISION  KIND "),
            "{header}"
        );
        assert_eq!(
            header.find("POLICIES"),
            shown.find("no-writes"),
            "the header lines up with the rows:\n{header}\n{shown}"
        );
    }

    #[test]
    fn the_decision_is_coloured_and_the_rest_is_not() {
        let shown = row(&record());
        assert!(
            shown.contains("\x1b[1m\x1b[31mdeny    \x1b[0m"),
            "{shown:?}"
        );
        assert_eq!(shown.matches('\x1b').count(), 3, "{shown:?}");
        let mut checkpoint = record();
        checkpoint.decision = "checkpoint".into();
        assert!(
            !row(&checkpoint).contains('\x1b'),
            "unknown decisions stay plain"
        );
    }

    #[test]
    fn what_is_the_tool_or_the_rpc_method_or_the_request_line() {
        let mut r = record();
        r.tool = Some("github.create_issue".into());
        assert_eq!(what(&r), "github.create_issue");
        r.tool = None;
        r.rpc_method = Some("resources/read".into());
        assert_eq!(what(&r), "resources/read");
        r.rpc_method = None;
        r.method = None;
        r.path = None;
        assert_eq!(what(&r), "api.example.test");
        assert_eq!(what(&AuditRecord::default()), "-");
    }

    #[test]
    fn long_values_are_cut_and_control_characters_never_reach_the_terminal() {
        assert_eq!(cell("abcdef", 4), "abc…");
        assert_eq!(cell("ab", 4), "ab  ");
        assert_eq!(cell("a\x1b[2Jb", 8), "a?[2Jb  ");
        let mut r = record();
        r.agent = Some("x".repeat(40));
        r.status = None;
        r.policies.clear();
        let shown = plain(&row(&r));
        assert!(
            shown.contains(&format!("{}…", "x".repeat(AGENT - 1))),
            "{shown}"
        );
        assert!(shown.ends_with("-       -"), "{shown}");
        // In characters: the `…` is three bytes but one column.
        let column = |text: &str| text[..text.find("GET").unwrap()].chars().count();
        assert_eq!(column(&shown), column(&plain(&row(&record()))));
    }

    #[test]
    fn the_format_follows_the_flags_then_the_terminal() {
        use RecordFormat::*;
        let choose = RecordFormat::choose_for;
        assert_eq!(choose(None, false, true).unwrap(), Table);
        assert_eq!(
            choose(None, false, false).unwrap(),
            Json,
            "pipes get JSON lines"
        );
        assert_eq!(
            choose(None, true, true).unwrap(),
            Json,
            "--json wins at a terminal"
        );
        assert_eq!(choose(Some(Table), false, false).unwrap(), Table);
        assert_eq!(choose(Some(Ocsf), true, true).unwrap(), Ocsf);
        assert_eq!(choose(Some(Json), false, true).unwrap(), Json);
        assert!(matches!(
            choose(Some(Table), true, true),
            Err(CliError::Usage(why)) if why.contains("--json")
        ));
    }

    #[test]
    fn json_and_ocsf_lines_carry_no_colour() {
        for format in [RecordFormat::Json, RecordFormat::Ocsf] {
            let line = format.line(&record()).unwrap();
            assert!(!line.contains('\x1b'), "{line}");
            serde_json::from_str::<serde_json::Value>(&line).unwrap();
        }
    }
}
