//! `ostiary audit tail`: follow the audit trail as the proxy writes it, with the filters of
//! `audit query` (`--session`, `--decision`, `--since`), until interrupted.
//!
//! It reads the store the way `audit query` does (a read-only connection beside the
//! running writer, or a pool of its own on PostgreSQL) and prints what `query` prints in the
//! same `--format` (a table's rows without its header, as they come; JSON lines by default
//! off a terminal), so what `tail` shows and what `query` later finds are the same text. It polls: the store has
//! no change feed on SQLite, and a poll every `--interval` (250 ms) costs one indexed read
//! (`seq > cursor`). Without `--since` it starts at the chain's end, like `tail -f` on a log
//! that is already long; with `--since` it first prints what matched since then.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ostiary::audit::AuditRecord;
use ostiary::config::Config;
use ostiary_store::audit::{AuditRow, AuditStore};
use ostiary_store::StoreError;

use super::records::RecordFormat;
use super::CliError;
use crate::output::Output;

/// The most rows one poll hands over, so that a `--since` far back, or a burst, is printed
/// in bounded pieces rather than read into memory whole.
const BATCH: usize = 1000;

#[derive(Debug, Args)]
pub struct TailArgs {
    /// Only this session's records.
    #[arg(long)]
    pub session: Option<String>,
    /// allow | deny | error | cancel | escalate
    #[arg(long)]
    pub decision: Option<String>,
    /// First print what matched since then (epoch milliseconds, RFC 3339, or a duration
    /// back from now: 15m); without it, only records written after tail started.
    #[arg(long)]
    pub since: Option<String>,
    /// How often to look for new records.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// `table` (default at a terminal without --json), `json` (the records as stored, one
    /// per line: the default otherwise) or `ocsf`.
    #[arg(long, value_enum)]
    pub format: Option<RecordFormat>,
}

/// Which rows are printed: the same tests `audit query`'s SQL makes, on the same columns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub session: Option<String>,
    pub decision: Option<String>,
    /// Milliseconds since the epoch (inclusive).
    pub since_ms: Option<i64>,
}

impl Filter {
    pub fn matches(&self, row: &AuditRow) -> bool {
        self.session
            .as_ref()
            .is_none_or(|s| row.session.as_ref() == Some(s))
            && self.decision.as_ref().is_none_or(|d| &row.decision == d)
            && self.since_ms.is_none_or(|t| row.ts_ms >= t)
    }
}

/// What one poll found: the records to print (as `audit query` prints them) and the last
/// sequence number looked at, matching or not.
#[derive(Debug)]
struct Found {
    lines: Vec<String>,
    cursor: i64,
    /// Whether the batch was full: then the next poll follows at once.
    more: bool,
}

/// Rows after `cursor`, at most [`BATCH`], filtered, rendered in `format`.
fn poll(
    trail: &dyn AuditStore,
    cursor: i64,
    filter: &Filter,
    format: RecordFormat,
) -> Result<Found, StoreError> {
    let mut found = Found {
        lines: Vec::new(),
        cursor,
        more: false,
    };
    let mut seen = 0;
    let mut bad = None;
    trail.scan(cursor, &mut |row| {
        found.cursor = row.seq;
        seen += 1;
        if filter.matches(&row) {
            match render(&row.record, format) {
                Ok(line) => found.lines.push(line),
                Err(e) => {
                    bad = Some(e);
                    return false;
                }
            }
        }
        seen < BATCH
    })?;
    if let Some(e) = bad {
        return Err(e);
    }
    found.more = seen == BATCH;
    Ok(found)
}

/// A stored record as `audit query` prints it: parsed and written again, so both commands
/// print the same text for the same record.
fn render(json: &str, format: RecordFormat) -> Result<String, StoreError> {
    let record: AuditRecord = serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("audit record does not parse: {e}")))?;
    format
        .line(&record)
        .map_err(|e| StoreError::Corrupt(format!("audit record does not serialise: {e}")))
}

/// Write `lines` and flush: a table through the stream that strips colour off a terminal,
/// JSON straight to stdout.
fn write_lines(lines: &[String], format: RecordFormat) -> std::io::Result<()> {
    fn all(out: &mut impl Write, lines: &[String]) -> std::io::Result<()> {
        lines.iter().try_for_each(|line| writeln!(out, "{line}"))?;
        out.flush()
    }
    if format == RecordFormat::Table {
        all(&mut anstream::stdout().lock(), lines)
    } else {
        all(&mut std::io::stdout().lock(), lines)
    }
}

/// Run `f` on the blocking pool: the store's calls block (PostgreSQL's client runs a
/// runtime of its own, which must not start on one of ours).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, CliError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CliError::Store(StoreError::Task(e.to_string())))?
        .map_err(CliError::Store)
}

/// Follow the trail until Ctrl-C (exit 0) or until stdout is closed (`| head`: exit 0).
pub async fn run(config: &Config, args: TailArgs, out: Output) -> Result<ExitCode, CliError> {
    let format = RecordFormat::choose(args.format, out.json)?;
    let since_ms =
        match &args.since {
            None => None,
            Some(text) => Some(ostiary::control::parse_since(text).ok_or_else(|| {
                CliError::Usage(format!("--since {text:?}: not a time or duration"))
            })?),
        };
    if args.interval.is_zero() {
        return Err(CliError::Usage("--interval must be more than 0".into()));
    }
    let filter = Arc::new(Filter {
        session: args.session,
        decision: args.decision,
        since_ms,
    });
    let state = config.state.clone();
    let (trail, start) = tokio::task::spawn_blocking(move || {
        let backend = ostiary::stores::Backend::of(&state).map_err(CliError::Usage)?;
        let trail = backend.audit_reader().map_err(|e| match e {
            StoreError::Unavailable(why) => CliError::Usage(why),
            other => CliError::Store(other),
        })?;
        // With --since, everything is looked at (and filtered on time); without it, only
        // what comes after the record that is last now.
        let start = match since_ms {
            Some(_) => 0,
            None => trail.last()?.map_or(0, |tip| tip.seq),
        };
        Ok::<_, CliError>((trail, start))
    })
    .await
    .map_err(|e| CliError::Store(StoreError::Task(e.to_string())))??;
    // On stderr, so that stdout stays records alone; scripts (and the tests) wait for it to
    // know that nothing written from now on can be missed.
    eprintln!("ostiary: following the audit trail after record {start} (Ctrl-C to stop)");

    let mut cursor = start;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let (reader, wanted) = (trail.clone(), filter.clone());
        let found = blocking(move || poll(&*reader, cursor, &wanted, format)).await?;
        if found.cursor == cursor {
            // Nothing new: the chain may also have been cut below what was already looked
            // at (rows deleted, the database replaced); say so and follow the new end.
            let reader = trail.clone();
            let tip = blocking(move || reader.last()).await?.map_or(0, |t| t.seq);
            if tip < cursor {
                eprintln!(
                    "ostiary: the chain now ends at record {tip}, before record {cursor} \
                     already read: records were removed (`ostiary audit verify` says which)"
                );
                cursor = tip;
            }
        } else {
            cursor = found.cursor;
        }
        match write_lines(&found.lines, format) {
            Ok(()) => {}
            // The reader went away (`| head -1`): done, as `tail -f` is.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(source) => {
                return Err(CliError::Io {
                    what: "writing to stdout".into(),
                    source,
                })
            }
        }
        if found.more {
            continue;
        }
        tokio::select! {
            _ = &mut interrupted => return Ok(ExitCode::SUCCESS),
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, ts_ms: i64, session: Option<&str>, decision: &str) -> AuditRow {
        AuditRow {
            seq,
            ts_ms,
            session: session.map(str::to_owned),
            decision: decision.to_owned(),
            record: "{}".to_owned(),
            prev: String::new(),
            hash: String::new(),
        }
    }

    #[test]
    fn no_filter_matches_everything() {
        let all = Filter::default();
        assert!(all.matches(&row(1, 0, None, "allow")));
        assert!(all.matches(&row(2, 5, Some("ses_a"), "deny")));
    }

    #[test]
    fn filters_are_anded_on_the_columns_query_uses() {
        let f = Filter {
            session: Some("ses_a".into()),
            decision: Some("deny".into()),
            since_ms: Some(100),
        };
        assert!(
            f.matches(&row(1, 100, Some("ses_a"), "deny")),
            "since is inclusive"
        );
        assert!(!f.matches(&row(2, 99, Some("ses_a"), "deny")), "too old");
        assert!(
            !f.matches(&row(3, 200, Some("ses_b"), "deny")),
            "other session"
        );
        assert!(!f.matches(&row(4, 200, None, "deny")), "no session");
        assert!(
            !f.matches(&row(5, 200, Some("ses_a"), "allow")),
            "other decision"
        );
    }
}
