//! `ostiary session(s) show|resume|terminate|dead-letters`: inspect and steer live sessions
//! from a terminal, through the control API with the admin token (as `ostiary approvals`
//! does), so the server's own rules — what may be resumed, what teardown revokes — apply to
//! the CLI too. A refusal by the server (unknown session, resuming one that is not paused)
//! is an answer, not a failure of the tool: it prints the server's message and exits 1,
//! while a proxy that cannot be reached exits 2 like every other command. With `--json`,
//! `show` and `dead-letters` print the control API's JSON, `resume` and `terminate` what was
//! done (`{"session_id": …, "resumed": true}`), and a refusal its message as `error` too.

use std::process::ExitCode;

use clap::Subcommand;
use ostiary_sdk::{ControlClient, SdkError};
use serde_json::{json, Value};

use super::CliError;
use crate::output::{print_json, Output};

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// Show one session: who it is, its parent, state (live, paused, ended), usage against
    /// its limits, and why it is paused.
    Show {
        /// The session's id (`OSTIARY_SESSION_ID` in its environment).
        id: String,
    },
    /// Resume a paused session; exit 1 if it is not paused.
    Resume {
        /// The session's id.
        id: String,
    },
    /// End a session now: leases revoked, cached credentials dropped, its token refused.
    Terminate {
        /// The session's id.
        id: String,
    },
    /// Reverse what a session did: send the undo recorded for each call of a tool that
    /// declares one (docs/undo.md), newest first, each decided by policy as
    /// `tool:<name>.undo`; report what was reversed, failed, refused and had no undo. Exit 1
    /// when any undo failed or was refused.
    Undo {
        /// The session's id (live or ended).
        id: String,
        /// Only calls made since then: epoch milliseconds, RFC 3339, or a duration back
        /// from now (`15m`).
        #[arg(long)]
        since: Option<String>,
        /// Decide each undo and print what would be sent; send nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List dead letters: what a paused session was doing when it stopped.
    DeadLetters {
        /// Only this session's dead letters.
        #[arg(long)]
        session: Option<String>,
    },
}

pub async fn run(
    client: ControlClient,
    cmd: SessionsCommand,
    out: Output,
) -> Result<ExitCode, CliError> {
    let (subject, done) = match &cmd {
        SessionsCommand::Show { id } => (format!("session {id}"), None),
        SessionsCommand::Resume { id } => (format!("session {id}"), Some((id.clone(), "resumed"))),
        SessionsCommand::Terminate { id } => {
            (format!("session {id}"), Some((id.clone(), "terminated")))
        }
        SessionsCommand::Undo { id, .. } => (format!("session {id}"), None),
        SessionsCommand::DeadLetters { session } => match session {
            Some(id) => (format!("session {id}"), None),
            None => ("dead letters".to_owned(), None),
        },
    };
    let outcome = match cmd {
        SessionsCommand::Show { id } => client.session(&id).await.map(|s| {
            if out.json {
                print_json(&s);
            } else {
                print!("{}", render_session(&s));
            }
        }),
        SessionsCommand::Resume { id } => client.resume_session(&id).await,
        SessionsCommand::Terminate { id } => client.terminate_session(&id).await,
        SessionsCommand::Undo { id, since, dry_run } => {
            match client.undo_session(&id, since.as_deref(), dry_run).await {
                Ok(report) => {
                    if out.json {
                        print_json(&report);
                    } else {
                        print!("{}", render_undo(&report));
                    }
                    let unfinished = ["failed", "refused"]
                        .iter()
                        .any(|k| report[k].as_array().is_some_and(|a| !a.is_empty()));
                    return Ok(if unfinished {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    });
                }
                Err(e) => Err(e),
            }
        }
        SessionsCommand::DeadLetters { session } => {
            client.dead_letters(session.as_deref()).await.map(|listed| {
                if out.json {
                    print_json(&listed);
                } else {
                    print!("{}", render_dead_letters(&listed));
                }
            })
        }
    };
    let refused = match outcome {
        Ok(()) => None,
        Err(e) => Some(refusal(e, &subject)?),
    };
    print_outcome(done, refused.as_deref(), out);
    match refused {
        None => Ok(ExitCode::SUCCESS),
        Some(message) => {
            eprintln!("ostiary: {message}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// What a script reads on stdout with `--json`: for `resume` and `terminate`, the action and
/// whether it was done; for a refusal, its message. A person reads one line on success
/// (the refusal goes to stderr).
fn print_outcome(done: Option<(String, &str)>, refused: Option<&str>, out: Output) {
    match (done, out.json) {
        (Some((id, verb)), true) => {
            let mut doc = json!({ "session_id": id });
            doc[verb] = json!(refused.is_none());
            if let Some(message) = refused {
                doc["error"] = json!(message);
            }
            print_json(&doc);
        }
        (Some((id, verb)), false) if refused.is_none() => println!("session {id} {verb}"),
        (None, true) => {
            if let Some(message) = refused {
                print_json(&json!({ "error": message }));
            }
        }
        _ => {}
    }
}

/// What to print when the server refused the action on `subject`: an unknown session, or
/// the server's own message (a conflict: resuming a session that is not paused). Any other
/// error is the tool's own failure and goes back to `main`.
fn refusal(e: SdkError, subject: &str) -> Result<String, CliError> {
    match e {
        SdkError::Api {
            status: 404,
            message,
            ..
        } => Ok(if message.is_empty() || message == "not_found" {
            // A bare `not_found` says less than naming what was not found.
            format!("{subject}: not found")
        } else {
            message
        }),
        SdkError::Api {
            status: 409,
            message,
            ..
        } => Ok(if message.is_empty() || message == "conflict" {
            format!("{subject}: refused (conflict)")
        } else {
            message
        }),
        other => Err(other.into()),
    }
}

fn render_session(s: &Value) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<12} {value}\n"));
    line("session", text(&s["session_id"]));
    line(
        "agent",
        format!("{} (tenant {})", text(&s["agent"]), text(&s["tenant"])),
    );
    line(
        "parent",
        format!("{} (depth {})", text(&s["parent"]), text(&s["depth"])),
    );
    line("state", text(&s["state"]));
    line("expires", when_secs(&s["expires_at"]));
    if let Some(paused) = s["paused"].as_object() {
        line(
            "paused",
            format!(
                "{}: {} (at {}, dead letter {})",
                text(&paused["kind"]),
                text(&paused["reason"]),
                when_any(&paused["at"]),
                text(&paused["dead_letter"]),
            ),
        );
    }
    let usage = &s["usage"];
    let limits = &s["limits"];
    line("calls", of_limit(&usage["calls"], &limits["max_calls"]));
    line("cost", of_limit(&usage["cost"], &limits["max_cost"]));
    line(
        "bytes",
        format!(
            "{} sent, {} received",
            text(&usage["bytes_sent"]),
            text(&usage["bytes_received"])
        ),
    );
    if let Some(children) = s["children"].as_array().filter(|c| !c.is_empty()) {
        let ids: Vec<String> = children.iter().map(text).collect();
        line("children", ids.join(", "));
    }
    if !s["in_flight"].is_null() {
        line("in flight", text(&s["in_flight"]));
    }
    if let Some(labels) = s["labels"].as_array().filter(|l| !l.is_empty()) {
        let labels: Vec<String> = labels.iter().map(text).collect();
        line("labels", labels.join(", "));
    }
    if let Some(recent) = s["recent"].as_object().filter(|r| !r.is_empty()) {
        let windows: Vec<String> = recent
            .iter()
            .map(|(window, n)| format!("{window} {}/10m {}/1h", text(&n["10m"]), text(&n["1h"])))
            .collect();
        line("recent", windows.join(", "));
    }
    // Limits beyond calls and cost are shown as the server names them, so a new budget
    // shows up here without a CLI change.
    if let Some(limits) = limits.as_object() {
        for (name, value) in limits {
            if name != "max_calls" && name != "max_cost" && !value.is_null() {
                line(name, text(value));
            }
        }
    }
    out
}

/// An undo report for a person: one line per call, grouped by what became of it.
fn render_undo(report: &Value) -> String {
    let dry = report["dry_run"].as_bool().unwrap_or(false);
    let mut out = String::new();
    let groups = [
        ("reversed", if dry { "would reverse" } else { "reversed" }),
        ("failed", "failed"),
        ("refused", "refused"),
        ("unavailable", "no undo recorded"),
        ("already_reversed", "already reversed"),
        ("in_progress", "in progress elsewhere"),
    ];
    for (key, label) in groups {
        for e in report[key].as_array().into_iter().flatten() {
            let mut line = format!(
                "{label:<22} {} {} ({})",
                text(&e["tool"]),
                text(&e["call"]),
                when_any(&e["recorded_ms"])
            );
            if let (Some(m), Some(u)) = (e["method"].as_str(), e["url"].as_str()) {
                line.push_str(&format!(": {m} {u}"));
            }
            if let Some(status) = e["status"].as_u64() {
                line.push_str(&format!(" -> {status}"));
            }
            if let Some(detail) = e["detail"].as_str().filter(|_| key != "reversed") {
                line.push_str(&format!(" [{detail}]"));
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    for call in report["no_undo"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<22} {} {} ({})\n",
            "no undo declared",
            text(&call["tool"]),
            text(&call["call"]),
            when_any(&call["at_ms"])
        ));
    }
    if out.is_empty() {
        out.push_str("nothing to undo\n");
    }
    out
}

fn render_dead_letters(listed: &Value) -> String {
    let rows = listed["dead_letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if rows.is_empty() {
        return "no dead letters\n".to_owned();
    }
    rows.iter()
        .map(|d| {
            // The store names the time `at_ms`; the documented contract `at`: take either.
            let at = if d["at"].is_null() {
                &d["at_ms"]
            } else {
                &d["at"]
            };
            let resolved = match d["resolved"].as_str() {
                Some(how) => format!(", {how} at {}", when_any(&d["resolved_ms"])),
                None => String::new(),
            };
            format!(
                "{}  session {}  {}: {}  (at {}{resolved})\n",
                text(&d["id"]),
                text(&d["session"]),
                text(&d["kind"]),
                text(&d["reason"]),
                when_any(at),
            )
        })
        .collect()
}

fn of_limit(used: &Value, limit: &Value) -> String {
    if limit.is_null() {
        format!("{} (no limit)", text(used))
    } else {
        format!("{} of {}", text(used), text(limit))
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// `expires_at` is seconds since the epoch, as `POST /v1/sessions` answers it.
fn when_secs(v: &Value) -> String {
    match v.as_i64() {
        Some(secs) => rfc3339(std::time::Duration::from_secs(secs.max(0) as u64)),
        None => text(v),
    }
}

/// A timestamp the server may give as RFC 3339 text or epoch milliseconds.
fn when_any(v: &Value) -> String {
    match v.as_i64() {
        Some(ms) => rfc3339(std::time::Duration::from_millis(ms.max(0) as u64)),
        None => text(v),
    }
}

fn rfc3339(since_epoch: std::time::Duration) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + since_epoch).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_paused_session_shows_why_and_its_usage_against_limits() {
        let shown = render_session(&json!({
            "session_id": "s-1", "agent": "bot", "tenant": "acme", "parent": "s-0",
            "depth": 1, "expires_at": 0, "state": "paused",
            "paused": {"reason": "budget exhausted", "kind": "budget", "at": 1000,
                       "dead_letter": "dl-1"},
            "usage": {"calls": 3, "cost": 0.25, "bytes_sent": 10, "bytes_received": 20},
            "limits": {"max_calls": 5, "max_cost": null, "max_bytes": 100},
            "children": ["s-2", "s-3"], "in_flight": 1
        }));
        for expected in [
            "session      s-1",
            "agent        bot (tenant acme)",
            "parent       s-0 (depth 1)",
            "state        paused",
            "expires      1970-01-01T00:00:00Z",
            "paused       budget: budget exhausted (at 1970-01-01T00:00:01Z, dead letter dl-1)",
            "calls        3 of 5",
            "cost         0.25 (no limit)",
            "bytes        10 sent, 20 received",
            "max_bytes    100",
            "children     s-2, s-3",
            "in flight    1",
        ] {
            assert!(shown.contains(expected), "{expected:?} in:\n{shown}");
        }
    }

    #[test]
    fn labels_and_recent_calls_are_shown_when_there_are_any() {
        let mut session = json!({
            "session_id": "s-1", "agent": "bot", "tenant": "acme", "parent": null,
            "depth": 0, "expires_at": 60, "state": "live", "paused": null,
            "usage": {"calls": 4, "cost": 0.0, "bytes_sent": 0, "bytes_received": 0},
            "limits": {"max_calls": null, "max_cost": null},
            "labels": ["private_data", "untrusted_input"],
            "recent": {"tier:write": {"10m": 4, "1h": 4}, "tool:pay.refund": {"10m": 1, "1h": 3}}
        });
        let shown = render_session(&session);
        for expected in [
            "labels       private_data, untrusted_input",
            "recent       tier:write 4/10m 4/1h, tool:pay.refund 1/10m 3/1h",
        ] {
            assert!(shown.contains(expected), "{expected:?} in:\n{shown}");
        }
        session["labels"] = json!([]);
        session["recent"] = json!({});
        let shown = render_session(&session);
        assert!(
            !shown.contains("labels ") && !shown.contains("recent "),
            "{shown}"
        );
    }

    #[test]
    fn a_live_root_session_has_no_paused_line() {
        let shown = render_session(&json!({
            "session_id": "s-1", "agent": "bot", "tenant": "acme", "parent": null,
            "depth": 0, "expires_at": 60, "state": "live", "paused": null,
            "usage": {"calls": 0, "cost": 0.0, "bytes_sent": 0, "bytes_received": 0},
            "limits": {"max_calls": null, "max_cost": null}
        }));
        assert!(shown.contains("parent       - (depth 0)"), "{shown}");
        assert!(!shown.contains("paused "), "{shown}");
    }

    #[test]
    fn dead_letters_are_one_line_each() {
        assert_eq!(
            render_dead_letters(&json!({"dead_letters": []})),
            "no dead letters\n"
        );
        let listed = render_dead_letters(&json!({"dead_letters": [
            {"id": "dl-1", "session": "s-1", "kind": "budget", "reason": "max_calls",
             "at": "2026-01-01T00:00:00Z", "snapshot": {}},
            {"id": 2, "session": "s-2", "kind": "loop", "reason": "same call 5 times",
             "at_ms": 1000, "snapshot": {}, "resolved": "resumed", "resolved_ms": 2000}
        ]}));
        assert_eq!(
            listed,
            "dl-1  session s-1  budget: max_calls  (at 2026-01-01T00:00:00Z)\n\
             2  session s-2  loop: same call 5 times  \
             (at 1970-01-01T00:00:01Z, resumed at 1970-01-01T00:00:02Z)\n"
        );
    }

    #[test]
    fn session_and_sessions_both_parse() {
        use clap::Parser;

        use crate::commands::{Cli, Command, SessionCommand};

        let manage = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Session(SessionCommand::Manage(cmd))) => cmd,
            other => panic!("{args:?}: {other:?}"),
        };
        assert!(matches!(
            manage(&["ostiary", "sessions", "resume", "s-1"]),
            SessionsCommand::Resume { id } if id == "s-1"
        ));
        assert!(matches!(
            manage(&["ostiary", "session", "show", "s-1", "--json"]),
            SessionsCommand::Show { id } if id == "s-1"
        ));
        assert!(matches!(
            manage(&["ostiary", "sessions", "dead-letters", "--session", "s-2"]),
            SessionsCommand::DeadLetters { session: Some(s) } if s == "s-2"
        ));
        let json = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.json).unwrap();
        assert!(json(&["ostiary", "session", "show", "s-1", "--json"]));
        assert!(json(&["ostiary", "--json", "sessions", "dead-letters"]));
        assert!(!json(&["ostiary", "sessions", "dead-letters"]));
        assert!(matches!(
            Cli::try_parse_from(["ostiary", "sessions", "new", "--agent", "a"]).map(|c| c.command),
            Ok(Command::Session(SessionCommand::New(_)))
        ));
    }

    #[test]
    fn refusals_are_answers_and_other_errors_fail_the_command() {
        let conflict = SdkError::Api {
            status: 409,
            message: "session s-1 is not paused".into(),
            refusal: None,
        };
        assert_eq!(
            refusal(conflict, "session s-1").unwrap(),
            "session s-1 is not paused"
        );
        let bare = SdkError::Api {
            status: 404,
            message: "not_found".into(),
            refusal: None,
        };
        assert_eq!(
            refusal(bare, "session s-9").unwrap(),
            "session s-9: not found"
        );
        let explained = SdkError::Api {
            status: 404,
            message: "session s-9 is not active".into(),
            refusal: None,
        };
        assert_eq!(
            refusal(explained, "session s-9").unwrap(),
            "session s-9 is not active"
        );
        let unauthorized = SdkError::Api {
            status: 401,
            message: "bad token".into(),
            refusal: None,
        };
        assert!(refusal(unauthorized, "session s-1").is_err());
    }
}
