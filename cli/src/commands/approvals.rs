//! `ostiary approvals list|show|approve|deny|link`: the approval queue from a terminal,
//! through the control API with the admin token (so the server's own rules — listed
//! approvers, never the agent, single decisions — apply to the CLI too). With `--json`,
//! each prints the control API's answer as it came (`link`: `{"link": …}`).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use ostiary_sdk::ControlClient;
use serde_json::{json, Value};

use super::CliError;
use crate::output::{approval_style, paint, print_json, text, when, Output};

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List approvals (default: pending), with queue counts and failing notifications.
    List {
        /// pending | approved | executing | executed | failed | refused | denied | expired | all
        #[arg(long, default_value = "pending")]
        status: String,
    },
    /// Show one approval: the held request, what the proxy observed, its state, the
    /// stored response, and the delivery state of its notifications.
    Show {
        /// The approval's id (`approval_id` in the agent's `202 approval_pending`).
        id: String,
    },
    /// Approve: the request runs once, now.
    Approve(Decide),
    /// Deny: the request never runs; the agent gets `approval_denied`.
    Deny(Decide),
    /// Print a review-page link for an approver (signed, single use, until the deadline).
    Link {
        /// The approval's id.
        id: String,
        /// The approver the link is for (default: $OSTIARY_APPROVER).
        #[arg(long = "as", env = APPROVER_ENV, value_name = "APPROVER")]
        approver: Option<String>,
    },
}

/// Who the operator is, when `--as` is not given: set once in a shell profile, so that
/// `approvals approve ID` needs nothing else.
pub const APPROVER_ENV: &str = "OSTIARY_APPROVER";

#[derive(Debug, Args)]
pub struct Decide {
    /// The approval's id.
    pub id: String,
    /// Who decides (one of `approvals.approvers` when that list is set; default:
    /// $OSTIARY_APPROVER).
    // Optional to clap so that its absence gets our message, which names the variable.
    #[arg(long = "as", env = APPROVER_ENV, value_name = "APPROVER")]
    pub approver: Option<String>,
    /// Why: recorded with the decision.
    #[arg(long)]
    pub reason: Option<String>,
}

/// For a decision or a link, that an approver is named (before anything is read or sent).
pub fn check_approver(cmd: &ApprovalsCommand) -> Result<(), CliError> {
    match cmd {
        ApprovalsCommand::Approve(d) | ApprovalsCommand::Deny(d) => {
            approver(d.approver.clone()).map(drop)
        }
        ApprovalsCommand::Link { approver: who, .. } => approver(who.clone()).map(drop),
        ApprovalsCommand::List { .. } | ApprovalsCommand::Show { .. } => Ok(()),
    }
}

/// `--as`, else `OSTIARY_APPROVER` (clap read both), else a usage error saying how to
/// give one.
fn approver(given: Option<String>) -> Result<String, CliError> {
    given.filter(|a| !a.trim().is_empty()).ok_or_else(|| {
        CliError::Usage(format!(
            "who is deciding? Give --as NAME (one of approvals.approvers), or set \
             {APPROVER_ENV}=NAME once in your shell"
        ))
    })
}

pub async fn run(
    client: ControlClient,
    cmd: ApprovalsCommand,
    out: Output,
) -> Result<ExitCode, CliError> {
    match cmd {
        ApprovalsCommand::List { status } => {
            let status = (status != "all").then_some(status);
            let listed = client.approvals(status.as_deref()).await?;
            if out.json {
                print_json(&listed);
            } else {
                print_list(&listed);
            }
        }
        ApprovalsCommand::Show { id } => {
            let a = client.approval(&id).await?;
            if out.json {
                print_json(&a);
            } else {
                print_approval(&a);
            }
        }
        ApprovalsCommand::Approve(d) => decide(client, d, true, out).await?,
        ApprovalsCommand::Deny(d) => decide(client, d, false, out).await?,
        ApprovalsCommand::Link { id, approver: who } => {
            let who = approver(who)?;
            let link = client.approval_link(&id, &who).await?;
            if out.json {
                print_json(&json!({ "approval_id": id, "approver": who, "link": link }));
            } else {
                println!("{link}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_list(listed: &Value) {
    let rows = listed["approvals"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!("no approvals");
    }
    for a in &rows {
        let status = text(&a["status"]);
        anstream::println!(
            "{}  {}  {}  (deadline {})",
            text(&a["approval_id"]),
            paint(approval_style(&status), &format!("{status:<9}")),
            text(&a["summary"]),
            when(&a["deadline_ms"]),
        );
    }
    let counts = &listed["counts"];
    println!(
        "queue: {} pending, {} approved, {} executing; {} notifications failing (retrying)",
        counts["pending"], counts["approved"], counts["executing"], counts["failing_notifications"],
    );
}

async fn decide(
    client: ControlClient,
    d: Decide,
    approve: bool,
    out: Output,
) -> Result<(), CliError> {
    let who = approver(d.approver)?;
    let decided = client
        .decide(&d.id, approve, &who, d.reason.as_deref())
        .await?;
    if out.json {
        print_json(&decided);
        return Ok(());
    }
    let status = text(&decided["status"]);
    anstream::println!(
        "{} {}: {}",
        text(&decided["approval_id"]),
        paint(approval_style(&status), &status),
        text(&decided["summary"])
    );
    Ok(())
}

fn print_approval(a: &Value) {
    let observed = &a["observed"];
    let request = &a["request"];
    println!("approval     {}", text(&a["approval_id"]));
    let status = text(&a["status"]);
    anstream::println!("status       {}", paint(approval_style(&status), &status));
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
    println!("held under   {}", text(&a["held_policy_version"]));
    if !a["executed_policy_version"].is_null() {
        println!("executed     under {}", text(&a["executed_policy_version"]));
    }
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
