//! `ostiary audit siem status|replay`: where the trail's stream to a SIEM stands, and the
//! operator's replay (or skip) of it (`[audit.siem]`, docs/audit.md). Both read and write the
//! stream's cursor in the store directly, so they work whether or not the proxy runs; a
//! running proxy picks a replay up on its next round.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;

use ostiary::config::Config;
use ostiary::stores::Backend;
use ostiary_store::cursors::Cursor;

use super::CliError;
use crate::output::{print_json, Output};

#[derive(Debug, Subcommand)]
pub enum SiemCommand {
    /// How far the stream has delivered, how far behind the trail it is, who sends it and
    /// why the last delivery failed, if it did.
    Status,
    /// Send record SEQ and everything after it next: again (a receiver that lost data) or,
    /// for a SEQ past what was delivered, skipping the records between.
    Replay {
        /// The first record to send (1: the whole trail).
        #[arg(long, value_name = "SEQ")]
        from: i64,
    },
}

pub fn run(
    config: &Config,
    backend: &Backend<'_>,
    cmd: SiemCommand,
    out: Output,
) -> Result<ExitCode, CliError> {
    let name = config
        .audit
        .siem
        .as_ref()
        .map(|s| s.cursor.clone())
        .ok_or_else(|| {
            CliError::Usage("no [audit.siem] in the config: the trail is not streamed".into())
        })?;
    let stores = backend.open()?;
    match cmd {
        SiemCommand::Replay { from } => {
            if from < 1 {
                return Err(CliError::Usage(format!(
                    "--from {from}: records are numbered from 1"
                )));
            }
            let head = stores.audit.last()?.map_or(0, |t| t.seq);
            if from > head + 1 {
                return Err(CliError::Usage(format!(
                    "--from {from}: the trail ends at record {head}"
                )));
            }
            ostiary::audit::stream::replay(&*stores.cursors, &name, from)?;
            if out.json {
                print_json(&json!({ "cursor": name, "from": from }));
            } else {
                println!("the stream {name} sends record {from} and what follows next");
            }
            Ok(ExitCode::SUCCESS)
        }
        SiemCommand::Status => {
            let head = stores.audit.last()?.map_or(0, |t| t.seq);
            let cursor = stores.cursors.get(&name)?;
            if out.json {
                print_json(&status_json(&name, cursor.as_ref(), head));
            } else {
                print!("{}", status_text(&name, cursor.as_ref(), head, now_ms()));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn now_ms() -> i64 {
    ostiary::store::now_ms()
}

fn status_json(name: &str, cursor: Option<&Cursor>, head: i64) -> serde_json::Value {
    let seq = cursor.map_or(0, |c| c.seq);
    json!({
        "cursor": name,
        "delivered_through": seq,
        "head": head,
        "behind": (head - seq).max(0),
        "delivered": cursor.map_or(0, |c| c.delivered),
        "holder": cursor.map(|c| c.holder.as_str()).filter(|h| !h.is_empty()),
        "lease_until_ms": cursor.map(|c| c.lease_until_ms).filter(|&t| t > 0),
        "updated_ms": cursor.map(|c| c.updated_ms),
        "last_error": cursor.and_then(|c| c.last_error.as_deref()),
        "failed_ms": cursor.and_then(|c| c.failed_ms),
    })
}

fn status_text(name: &str, cursor: Option<&Cursor>, head: i64, now: i64) -> String {
    let Some(c) = cursor else {
        return format!(
            "stream {name}: nothing delivered yet ({head} records in the trail; the proxy starts \
             streaming when it runs with [audit.siem])\n"
        );
    };
    let mut out = format!(
        "stream       {name}\ndelivered    through record {} of {head} ({} behind)\n",
        c.seq,
        (head - c.seq).max(0)
    );
    let holder = if c.holder.is_empty() || c.lease_until_ms < now {
        "nobody (the next proxy to start takes it)".to_owned()
    } else {
        format!("{} (lease until {})", c.holder, when(c.lease_until_ms))
    };
    out.push_str(&format!("sent by      {holder}\n"));
    out.push_str(&format!("moved        {}\n", when(c.updated_ms)));
    if let Some(error) = &c.last_error {
        out.push_str(&format!(
            "last error   {error} (at {}; retrying)\n",
            c.failed_ms.map_or_else(|| "-".into(), when)
        ));
    }
    out
}

fn when(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(holder: &str, error: Option<&str>) -> Cursor {
        Cursor {
            name: "siem".into(),
            seq: 40,
            holder: holder.into(),
            lease_until_ms: 2_000,
            updated_ms: 1_000,
            delivered: 40,
            last_error: error.map(str::to_owned),
            failed_ms: error.map(|_| 1_500),
        }
    }

    #[test]
    fn status_says_how_far_behind_who_sends_and_why_it_failed() {
        let text = status_text(
            "siem",
            Some(&cursor("r-1", Some("the receiver answered 503"))),
            55,
            1_800,
        );
        assert!(
            text.contains("through record 40 of 55 (15 behind)"),
            "{text}"
        );
        assert!(
            text.contains("r-1 (lease until 1970-01-01T00:00:02Z)"),
            "{text}"
        );
        assert!(
            text.contains("last error   the receiver answered 503"),
            "{text}"
        );
        let lapsed = status_text("siem", Some(&cursor("r-1", None)), 40, 9_000);
        assert!(lapsed.contains("nobody"), "{lapsed}");
        assert!(!lapsed.contains("last error"), "{lapsed}");
        assert!(status_text("siem", None, 3, 0).contains("nothing delivered yet (3 records"));
        let j = status_json("siem", Some(&cursor("", None)), 55);
        assert_eq!(j["behind"], 15);
        assert_eq!(j["holder"], serde_json::Value::Null);
        assert_eq!(status_json("siem", None, 7)["behind"], 7);
    }
}
