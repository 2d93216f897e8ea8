//! How commands print: one JSON document (or JSON lines for records) with the global
//! `--json`, text for a person otherwise, coloured only where a person sees it.
//!
//! Text that may carry colour is written through `anstream` (`anstream::println!`), which
//! drops the escape codes when stdout is not a terminal and honours `NO_COLOR` and
//! `CLICOLOR_FORCE`. JSON is written with `std::println!` and built from plain strings, so no
//! environment can put an escape byte into what a script parses.

use anstyle::{AnsiColor, Style};

use crate::commands::CliError;

/// What the command line asked of the output, handed to every command that prints a result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Output {
    /// `--json`: one JSON document (JSON lines for record streams) instead of text.
    pub json: bool,
}

/// A check that passed, a chain intact, an allowed request.
pub const GOOD: Style = AnsiColor::Green.on_default();
/// A failed check, a broken chain, a denied request.
pub const BAD: Style = AnsiColor::Red.on_default().bold();
/// Something to look at that is not (yet) a failure: a warning, a request held for a human.
pub const NOTICE: Style = AnsiColor::Yellow.on_default();
/// A request that never reached a decision (an error, a cancellation).
pub const ODD: Style = AnsiColor::Magenta.on_default();
/// Work in progress (an approval being executed).
pub const BUSY: Style = AnsiColor::Cyan.on_default();
/// What is over and needs nothing (an expired approval).
pub const QUIET: Style = Style::new().dimmed();

/// `text` wrapped in `style`'s codes. Pad before painting: the codes have no width on
/// screen but do count for `format!`'s padding.
pub fn paint(style: Style, text: &str) -> String {
    format!("{style}{text}{style:#}")
}

/// The colour of a decision as the audit trail names it; other kinds (`checkpoint`,
/// `reanchor`) stay plain.
pub fn decision_style(decision: &str) -> Style {
    match decision {
        "allow" => GOOD,
        "deny" => BAD,
        "escalate" => NOTICE,
        "error" | "cancel" => ODD,
        _ => Style::new(),
    }
}

/// The colour of an approval's status (`approvals list`, `approvals show`).
pub fn approval_style(status: &str) -> Style {
    match status {
        "pending" => NOTICE,
        "approved" | "executed" => GOOD,
        "executing" => BUSY,
        "denied" | "refused" | "failed" => BAD,
        "expired" => QUIET,
        _ => Style::new(),
    }
}

/// A JSON value as a person reads it in a summary: strings bare, null as `-`.
pub fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// Epoch milliseconds as RFC 3339 (to the second); `-` when absent.
pub fn when(v: &serde_json::Value) -> String {
    v.as_i64()
        .map(|ms| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
            humantime::format_rfc3339_seconds(t).to_string()
        })
        .unwrap_or_else(|| "-".to_owned())
}

/// Print `doc` as one line of JSON, never coloured.
pub fn print_json(doc: &serde_json::Value) {
    println!("{doc}");
}

/// Print `value` as pretty JSON: the shape commands that printed it so before keep.
pub fn print_json_pretty(value: &impl serde::Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Usage(format!("the result does not serialise: {e}")))?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn painted_text_is_wrapped_in_codes_and_reset() {
        let red = paint(BAD, "FAIL");
        assert!(red.starts_with('\x1b') && red.contains("FAIL"), "{red:?}");
        assert!(red.ends_with("\x1b[0m"), "{red:?}");
        assert_eq!(paint(Style::new(), "plain"), "plain");
    }

    #[test]
    fn decisions_have_their_colours_and_unknown_ones_none() {
        assert_eq!(decision_style("allow"), GOOD);
        assert_eq!(decision_style("deny"), BAD);
        assert_eq!(decision_style("escalate"), NOTICE);
        assert_eq!(decision_style("error"), ODD);
        assert_eq!(decision_style("cancel"), ODD);
        assert_eq!(decision_style("checkpoint"), Style::new());
        assert_eq!(approval_style("pending"), NOTICE);
        assert_eq!(approval_style("no such status"), Style::new());
    }
}
