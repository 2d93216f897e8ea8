//! `ostiary approvals list|show|approve|deny|link`: the approval queue from a terminal,
//! through the control API with the admin token (so the server's own rules — listed
//! approvers, never the agent, single decisions — apply to the CLI too).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use ostiary_sdk::ControlClient;
use serde_json::Value;

use super::CliError;

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List approvals (default: pending), with queue counts and failing notifications.
    List {
        /// pending | approved | executing | executed | failed | refused | denied | expired | all
        #[arg(long, default_value = "pending")]
        status: String,
        #[arg(long)]
        json: bool,
    },
    /// Show one approval: the held request, what the proxy observed, its state, the
    /// stored response, and the delivery state of its notifications.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Approve: the request runs once, now.
    Approve(Decide),
    /// Deny: the request never runs; the agent gets `approval_denied`.
    Deny(Decide),
    /// Print a review-page link for an approver (signed, single use, until the deadline).
    Link {
        id: String,
        /// The approver the link is for.
        #[arg(long = "as", env = "OSTIARY_APPROVER")]
        approver: String,
    },
}

#[derive(Debug, Args)]
pub struct Decide {
    pub id: String,
    /// Who decides (one of `approvals.approvers` when that list is set).
    #[arg(long = "as", env = "OSTIARY_APPROVER")]
    pub approver: String,
    #[arg(long)]
    pub reason: Option<String>,
}

pub async fn run(client: ControlClient, cmd: ApprovalsCommand) -> Result<ExitCode, CliError> {
    match cmd {
        ApprovalsCommand::List { status, json } => {
            let status = (status != "all").then_some(status);
            let listed = client.approvals(status.as_deref()).await?;
            if json {
                println!("{listed}");
                return Ok(ExitCode::SUCCESS);
            }
            let rows = listed["approvals"].as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                println!("no approvals");
            }
            for a in &rows {
                println!(
                    "{}  {:<9}  {}  (deadline {})",
                    text(&a["approval_id"]),
                    text(&a["status"]),
                    text(&a["summary"]),
                    when(&a["deadline_ms"]),
                );
            }
            let counts = &listed["counts"];
            println!(
                "queue: {} pending, {} approved, {} executing; {} notifications failing (retrying)",
                counts["pending"],
                counts["approved"],
                counts["executing"],
                counts["failing_notifications"],
            );
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Show { id, json } => {
            let a = client.approval(&id).await?;
            if json {
                println!("{a}");
                return Ok(ExitCode::SUCCESS);
            }
            print_approval(&a);
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Approve(d) => decide(client, d, true).await,
        ApprovalsCommand::Deny(d) => decide(client, d, false).await,
        ApprovalsCommand::Link { id, approver } => {
            println!("{}", client.approval_link(&id, &approver).await?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn decide(client: ControlClient, d: Decide, approve: bool) -> Result<ExitCode, CliError> {
    let decided = client
        .decide(&d.id, approve, &d.approver, d.reason.as_deref())
        .await?;
    println!(
        "{} {}: {}",
        text(&decided["approval_id"]),
        text(&decided["status"]),
        text(&decided["summary"])
    );
    Ok(ExitCode::SUCCESS)
}

fn print_approval(a: &Value) {
    let observed = &a["observed"];
    let request = &a["request"];
    println!("approval     {}", text(&a["approval_id"]));
    println!("status       {}", text(&a["status"]));
    println!(
        "tool         {} (tier {})",
        text(&observed["tool"]),
        text(&observed["tier"])
    );
    println!(
        "destination  {}://{}:{}",
        text(&observed["scheme"]),
        text(&observed["host"]),
        observed["port"]
    );
    println!(
        "request      {} {}",
        text(&request["method"]),
        text(&request["url"])
    );
    println!(
        "agent        {} (tenant {}, session {})",
        text(&a["agent"]),
        text(&a["tenant"]),
        text(&a["session"])
    );
    if !observed["records"].is_null() {
        println!(
            "impact       {} records, cost {}",
            observed["records"], observed["cost"]
        );
    }
    println!("policies     {}", a["policies"]);
    println!("created      {}", when(&a["created_ms"]));
    println!("deadline     {}", when(&a["deadline_ms"]));
    println!("idempotency  {}", text(&a["idempotency_key"]));
    if let Ok(args) = serde_json::to_string_pretty(&observed["args"]) {
        println!("arguments    {}", args.replace('\n', "\n             "));
    }
    if !a["approver"].is_null() {
        println!(
            "decided      by {} via {} at {}",
            text(&a["approver"]),
            text(&a["channel"]),
            when(&a["decided_ms"])
        );
    }
    if !a["reason"].is_null() {
        println!("reason       {}", text(&a["reason"]));
    }
    if let Some(result) = a["result"].as_object() {
        println!(
            "response     HTTP {} ({} attempts{})",
            result["status"],
            a["attempts"],
            if result["truncated"] == Value::Bool(true) {
                ", body truncated"
            } else {
                ""
            }
        );
    }
    for n in a["notifications"].as_array().into_iter().flatten() {
        let state = if n["sent_ms"].is_null() {
            format!(
                "NOT DELIVERED after {} attempts: {}",
                n["attempts"],
                text(&n["last_error"])
            )
        } else {
            format!("delivered at {}", when(&n["sent_ms"]))
        };
        let to = text(&n["recipient"]);
        println!(
            "notified     {} {} round {}: {state}",
            text(&n["channel"]),
            if to.is_empty() { "-".to_owned() } else { to },
            n["round"],
        );
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn when(v: &Value) -> String {
    v.as_i64()
        .map(|ms| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
            humantime::format_rfc3339_seconds(t).to_string()
        })
        .unwrap_or_else(|| "-".to_owned())
}
