//! `ostiary audit query|verify|pubkey|export|reanchor|tail|siem|cost`: the audit chain read
//! (and, for `reanchor`, acknowledged) straight from the store, with or without a running
//! proxy. `tail` follows on the runtime ([`super::tail`]); everything else here blocks on
//! the store and runs on the blocking pool.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use ostiary::audit::verify::{self, Query};
use ostiary::config::Config;
use ostiary::state::files;

use super::records::RecordFormat;
use super::{cost, evidence, siem, tail, CliError};
use crate::output::{paint, print_json, Output, BAD, GOOD};

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Print matching records, oldest first: a table at a terminal, JSON lines otherwise.
    Query(QueryArgs),
    /// Recompute the chain; exit 1 if anything was altered, inserted or deleted (the newest
    /// records included: the head checkpoint must match). With --offline, check an export
    /// against the signing public key instead, with no access to the proxy or its state.
    Verify {
        /// An `audit export` file to check (needs --pubkey; reads nothing else).
        #[arg(long, value_name = "FILE", requires = "pubkey")]
        offline: Option<PathBuf>,
        /// The public key that signed the export's checkpoints (PEM, from `audit pubkey`).
        #[arg(long, value_name = "KEY", requires = "offline")]
        pubkey: Option<PathBuf>,
    },
    /// Print the public key (PEM) that signs the chain's checkpoints: what an auditor checks
    /// exports with.
    Pubkey,
    /// Write records with the signed checkpoints covering them (JSON lines,
    /// docs/audit-export.md) to standard output, up to the newest checkpoint.
    Export {
        /// From the signed range holding the first record at or after this time (epoch
        /// milliseconds, RFC 3339, or a duration back from now); default: the whole chain.
        #[arg(long)]
        since: Option<String>,
    },
    /// Acknowledge a chain that no longer matches its checkpoint (which `serve` refuses to
    /// extend): seal a record saying so, with your reason, onto the chain as it stands. Run
    /// `audit verify` first, with the proxy stopped.
    Reanchor {
        /// Why (who looked, what was found); recorded in the chain.
        #[arg(long)]
        reason: String,
    },
    /// Follow the trail: print new records as they are written (filters and formats as for
    /// `query`), until interrupted.
    Tail(tail::TailArgs),
    /// The trail's stream to a SIEM (`[audit.siem]`): its status, or a replay from a record.
    #[command(subcommand)]
    Siem(siem::SiemCommand),
    /// What charged tool calls cost, grouped (default: by tool), most expensive first: a
    /// table, or JSON lines (one per group, with exact `cost_micros`) with --json.
    Cost {
        /// Only this session and the sessions spawned from it, at any depth.
        #[arg(long)]
        session: Option<String>,
        /// What to group by.
        #[arg(long, value_enum, default_value_t = cost::By::Tool)]
        by: cost::By,
    },
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Only this session's records.
    #[arg(long)]
    pub session: Option<String>,
    /// allow | deny | error | cancel | escalate
    #[arg(long)]
    pub decision: Option<String>,
    /// Epoch milliseconds, RFC 3339, or a duration back from now (15m).
    #[arg(long)]
    pub since: Option<String>,
    /// The most records to print (default 10000), the oldest matching ones.
    #[arg(long)]
    pub limit: Option<u32>,
    /// `table` (default at a terminal without --json), `json` (the records as stored, one
    /// per line: the default otherwise) or `ocsf`.
    #[arg(long, value_enum)]
    pub format: Option<RecordFormat>,
}

/// `--since` as epoch milliseconds.
pub fn since_ms(since: Option<&str>) -> Result<Option<i64>, CliError> {
    since
        .map(|text| {
            ostiary::control::parse_since(text)
                .ok_or_else(|| CliError::Usage(format!("--since {text:?}: not a time or duration")))
        })
        .transpose()
}

/// Run one `audit` subcommand other than `tail`, on a blocking thread.
pub fn run(config: &Config, cmd: AuditCommand, out: Output) -> Result<ExitCode, CliError> {
    let backend = ostiary::stores::Backend::of(&config.state).map_err(CliError::Usage)?;
    // Read-only for all but `reanchor`, which writes.
    let read_only = || {
        backend.audit_reader().map_err(|e| match e {
            ostiary_store::StoreError::Unavailable(why) => CliError::Usage(why),
            other => CliError::Store(other),
        })
    };
    match cmd {
        AuditCommand::Reanchor { reason } => reanchor(config, &backend, &reason, out),
        AuditCommand::Siem(cmd) => siem::run(config, &backend, cmd, out),
        AuditCommand::Tail(_) => Err(CliError::Usage(
            "audit tail follows on the runtime, not here".into(),
        )),
        AuditCommand::Query(args) => {
            // Chosen before the store is read: a contradictory command line fails at once.
            let format = RecordFormat::choose(args.format, out.json)?;
            let records = verify::query(
                &*read_only()?,
                &Query {
                    session: args.session,
                    decision: args.decision,
                    since_ms: since_ms(args.since.as_deref())?,
                    limit: args.limit,
                },
            )?;
            print_records(&records, format)
        }
        AuditCommand::Cost { session, by } => {
            // Everything: a session's descendants are found only through the records of
            // the whole chain, so no SQL filter can narrow this down first.
            let all = verify::query(
                &*read_only()?,
                &Query {
                    limit: Some(u32::MAX),
                    ..Default::default()
                },
            )?;
            let rows = match session {
                None => cost::cost_report(&all, by),
                Some(id) => cost::cost_report(cost::of_session_tree(&all, &id), by),
            };
            if out.json {
                print!("{}", cost::render_json(&rows));
            } else {
                print!("{}", cost::render_table(&rows, by));
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify {
            offline: Some(file),
            pubkey: Some(key),
        } => evidence::verify_offline(&file, &key, out),
        AuditCommand::Pubkey => evidence::pubkey(config, out),
        AuditCommand::Export { since } => {
            // Already JSON lines: --json changes nothing.
            evidence::export(&*read_only()?, since_ms(since.as_deref())?)
        }
        AuditCommand::Verify { .. } => {
            let key = read_audit_key(config)?;
            let report = verify::verify(
                &*read_only()?,
                &key,
                &config.state.dir.join(files::AUDIT_HEAD),
            )?;
            print_verify(&report, out);
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// `audit query`'s records: a header and a row each for a table (through the stream that
/// strips colour off a terminal), else one JSON line each.
fn print_records(
    records: &[ostiary::audit::AuditRecord],
    format: RecordFormat,
) -> Result<ExitCode, CliError> {
    let serialise = |e: serde_json::Error| CliError::Usage(format!("a record: {e}"));
    if format == RecordFormat::Table {
        if records.is_empty() {
            anstream::println!("no matching records");
            return Ok(ExitCode::SUCCESS);
        }
        anstream::println!("{}", super::records::header());
        for r in records {
            anstream::println!("{}", format.line(r).map_err(serialise)?);
        }
    } else {
        for r in records {
            println!("{}", format.line(r).map_err(serialise)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_verify(report: &verify::VerifyReport, out: Output) {
    if out.json {
        print_json(&json!({
            "ok": report.ok(),
            "records": report.records,
            "problems": report.problems,
            "notes": report.notes,
        }));
        return;
    }
    if report.ok() {
        anstream::println!(
            "{}: {} records, chain intact",
            paint(GOOD, "ok"),
            report.records
        );
    } else {
        anstream::println!(
            "{}: {} records checked",
            paint(BAD, "FAILED"),
            report.records
        );
        for p in &report.problems {
            println!("  {p}");
        }
    }
    for note in &report.notes {
        println!("  note: {note}");
    }
}

/// `audit reanchor`: exit 0 once the acknowledgement is sealed onto the chain; 1 when the
/// chain matches its checkpoint (nothing to acknowledge).
fn reanchor(
    config: &Config,
    backend: &ostiary::stores::Backend<'_>,
    reason: &str,
    out: Output,
) -> Result<ExitCode, CliError> {
    use ostiary::audit::anchor::{self, ReanchorError};
    let key = read_audit_key(config)?;
    let trail = backend.open()?.audit;
    let head = config.state.dir.join(files::AUDIT_HEAD);
    match anchor::reanchor(&*trail, &key, &head, reason) {
        Ok(done) => {
            if out.json {
                print_json(&json!({
                    "reanchored": true,
                    "seq": done.seq,
                    "chain_seq": done.chain_seq,
                    "checkpoint_seq": done.checkpoint_seq,
                    "problem": done.problem,
                }));
            } else {
                println!(
                    "re-anchored: record {} acknowledges: {}",
                    done.seq, done.problem
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ ReanchorError::Intact { .. }) => {
            if out.json {
                print_json(&json!({"reanchored": false, "reason": e.to_string()}));
            } else {
                println!("{e}");
            }
            Ok(ExitCode::FAILURE)
        }
        Err(ReanchorError::NoReason) => Err(CliError::Usage(ReanchorError::NoReason.to_string())),
        Err(e) => Err(CliError::Usage(format!("re-anchoring failed: {e}"))),
    }
}

/// The audit key: from the shared keys (`state.keys_dir`) when set, else the state directory.
fn read_audit_key(config: &Config) -> Result<Vec<u8>, CliError> {
    let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
    let path = dir.join(files::AUDIT_KEY);
    std::fs::read_to_string(&path)
        .map(|k| k.trim().as_bytes().to_vec())
        .map_err(|source| CliError::Io {
            what: format!("reading {}", path.display()),
            source,
        })
}
