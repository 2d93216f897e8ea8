//! `ostiary runs list|show|start|cancel|retry`: runs that triggers started (docs/runs.md),
//! through the control API with the admin token. A refusal by the server (an unknown run,
//! cancelling one that ended) is an answer: its message, exit 1; a proxy that cannot be
//! reached exits 2 like every other command. With `--json`, the control API's JSON.

use std::process::ExitCode;

use clap::Subcommand;
use ostiary_sdk::{ControlClient, SdkError};
use serde_json::Value;

use super::CliError;
use crate::output::{paint, print_json, text, when, Output, BAD, BUSY, GOOD, NOTICE, ODD, QUIET};

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first.
    List {
        /// Only runs in this state (queued, awaiting_approval, running, succeeded, failed,
        /// limit_exceeded, killed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Only this trigger's runs.
        #[arg(long)]
        trigger: Option<String>,
        /// Only runs that ended for good with a dead letter (failed, limit_exceeded, killed).
        #[arg(long)]
        dead_letters: bool,
        /// The most runs to list (default 100).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Show one run: its trigger, state, attempts, session, exit, limit, cost, stderr's
    /// end, and its dead letter.
    Show {
        /// The run's id (`run_…`).
        id: String,
    },
    /// Start a run of an `api` trigger.
    Start {
        /// The trigger's name.
        trigger: String,
        /// The payload, a JSON object (default `{}`).
        #[arg(long)]
        payload: Option<String>,
    },
    /// Cancel a run: at once if it has not started, else it is stopped.
    Cancel {
        /// The run's id.
        id: String,
    },
    /// Queue a run that ended (failed, dead-lettered, cancelled) again.
    Retry {
        /// The run's id.
        id: String,
    },
}

pub async fn run(
    client: ControlClient,
    cmd: RunsCommand,
    out: Output,
) -> Result<ExitCode, CliError> {
    let answer = match cmd {
        RunsCommand::List {
            status,
            trigger,
            dead_letters,
            limit,
        } => client
            .runs(status.as_deref(), trigger.as_deref(), dead_letters, limit)
            .await
            .map(|listed| (listed, Shown::List)),
        RunsCommand::Show { id } => client.run(&id).await.map(|run| (run, Shown::One)),
        RunsCommand::Start { trigger, payload } => {
            let payload = match payload {
                Some(text) => serde_json::from_str(&text)
                    .map_err(|e| CliError::Usage(format!("--payload: not JSON: {e}")))?,
                None => serde_json::json!({}),
            };
            client
                .start_run(&trigger, payload)
                .await
                .map(|started| (started, Shown::Started))
        }
        RunsCommand::Cancel { id } => client.cancel_run(&id).await.map(|run| (run, Shown::One)),
        RunsCommand::Retry { id } => client.retry_run(&id).await.map(|run| (run, Shown::One)),
    };
    match answer {
        Ok((doc, _)) if out.json => {
            print_json(&doc);
            Ok(ExitCode::SUCCESS)
        }
        Ok((doc, Shown::List)) => {
            anstream::print!("{}", render_list(&doc));
            Ok(ExitCode::SUCCESS)
        }
        Ok((doc, Shown::One)) => {
            anstream::print!("{}", render_run(&doc));
            Ok(ExitCode::SUCCESS)
        }
        Ok((doc, Shown::Started)) => {
            let said = match (doc["duplicate"] == true, doc["status"].as_str()) {
                (true, _) => "already started as",
                (false, Some("awaiting_approval")) => "held for approval:",
                (false, _) => "queued:",
            };
            println!("{said} {}", text(&doc["run_id"]));
            Ok(ExitCode::SUCCESS)
        }
        Err(SdkError::Api {
            status, message, ..
        }) if (400..500).contains(&status) => {
            if out.json {
                print_json(&serde_json::json!({"error": message, "status": status}));
            }
            eprintln!("ostiary: {message}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

enum Shown {
    List,
    One,
    Started,
}

/// A run state's colour (stripped where stdout is not a terminal).
fn status_style(status: &str) -> anstyle::Style {
    match status {
        "succeeded" => GOOD,
        "failed" | "limit_exceeded" | "killed" => BAD,
        "queued" | "awaiting_approval" => NOTICE,
        "running" => BUSY,
        "cancelled" => QUIET,
        _ => ODD,
    }
}

/// A run state in its colour, padded to the list's column (before painting: the codes
/// have no width on screen).
fn status(v: &Value) -> String {
    let s = text(v);
    paint(status_style(&s), &format!("{s:<17}"))
}

fn render_list(doc: &Value) -> String {
    let runs = doc["runs"].as_array().cloned().unwrap_or_default();
    if runs.is_empty() {
        return "no runs\n".to_owned();
    }
    let mut out = format!(
        "{:<26}  {:<17}  {:<20}  {:>7}  {:<20}  {}\n",
        "RUN", "STATUS", "TRIGGER", "ATTEMPT", "CREATED", "WHY"
    );
    for r in &runs {
        let why = match (&r["limit"], &r["error"]) {
            (Value::String(limit), _) => format!("limit: {limit}"),
            (_, Value::String(error)) => error.clone(),
            _ => String::new(),
        };
        out.push_str(&format!(
            "{:<26}  {}  {:<20}  {:>7}  {:<20}  {}\n",
            text(&r["run_id"]),
            status(&r["status"]),
            text(&r["trigger"]),
            text(&r["attempt"]),
            when(&r["created_ms"]),
            why.replace(|c: char| c.is_control(), "?"),
        ));
    }
    out
}

fn render_run(r: &Value) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<13}{value}\n"));
    line("run", text(&r["run_id"]));
    line(
        "trigger",
        format!("{} ({})", text(&r["trigger"]), text(&r["kind"])),
    );
    line(
        "status",
        paint(status_style(&text(&r["status"])), &text(&r["status"])),
    );
    line("attempt", text(&r["attempt"]));
    line("created", when(&r["created_ms"]));
    line("started", when(&r["started_ms"]));
    line("ended", when(&r["ended_ms"]));
    line("session", text(&r["session"]));
    line("exit", text(&r["exit_code"]));
    if !r["limit"].is_null() {
        line("limit", text(&r["limit"]));
    }
    if !r["error"].is_null() {
        line("why", text(&r["error"]));
    }
    line("cost", text(&r["cost"]));
    line("payload", format!("sha256 {}", text(&r["payload_sha256"])));
    if r["cancel_requested"] == true {
        line("cancel", "asked; the run is being stopped".to_owned());
    }
    if let Value::String(tail) = &r["stderr_tail"] {
        let shown: String = tail.replace(|c: char| c.is_control() && c != '\n', "?");
        out.push_str("stderr (end):\n");
        for l in shown.lines() {
            out.push_str(&format!("  {l}\n"));
        }
    }
    if !r["dead_letter"].is_null() {
        out.push_str("dead letter: kept (see --json for the records, usage and limits)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_shows_each_run_and_why_it_ended() {
        let doc = json!({"runs": [
            {"run_id": "run_1", "status": "limit_exceeded", "trigger": "nightly", "attempt": 1, "created_ms": 0, "limit": "wall_clock", "error": "x"},
            {"run_id": "run_2", "status": "failed", "trigger": "gh", "attempt": 3, "created_ms": 0, "limit": null, "error": "the command exited with 2\u{1b}[31m"},
        ]});
        let text = render_list(&doc);
        assert!(text.starts_with("RUN"), "{text}");
        assert!(text.contains("limit: wall_clock"), "{text}");
        assert!(text.contains("the command exited with 2?[31m"), "{text}");
        assert_eq!(render_list(&json!({"runs": []})), "no runs\n");
    }

    #[test]
    fn one_run_shows_its_end_and_dead_letter() {
        let shown = render_run(&json!({
            "run_id": "run_1", "trigger": "gh", "kind": "webhook", "status": "failed", "attempt": 2,
            "created_ms": 0, "started_ms": 1000, "ended_ms": null, "session": "ses_1", "exit_code": 3,
            "limit": null, "error": "the command exited with 3", "cost": 0.25, "payload_sha256": "ab",
            "stderr_tail": "boom\nline two", "dead_letter": {"records": []}, "cancel_requested": false,
        }));
        assert!(
            shown.contains("why          the command exited with 3"),
            "{shown}"
        );
        assert!(shown.contains("  line two"), "{shown}");
        assert!(shown.contains("dead letter: kept"), "{shown}");
    }
}
