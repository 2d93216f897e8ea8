//! `ostiary policy replay --candidate DIR`: the decisions the audit trail kept, decided again
//! against a candidate policy set, and what would change — counts and examples, or one JSON
//! object with `--json`. Nothing is sent anywhere: it reads the trail and evaluates.
//!
//! Only records that kept their decision (`decided`, written since policy versions) can be
//! replayed; a decision whose arguments were too large or held a credential was kept without
//! them (`partial`) and is counted apart rather than decided on a guess.

use std::path::Path;
use std::process::ExitCode;

use ostiary::audit::verify::{self, Query};
use ostiary::config::Config;
use ostiary_policies::recorded::{self, Change};
use ostiary_policies::PolicyEngine;
use serde_json::{json, Value};

use super::CliError;
use crate::output::{print_json, Output};

/// Examples shown at most.
const EXAMPLES: usize = 20;

/// What replaying a trail against a candidate found.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Decisions decided again.
    pub decided: usize,
    /// Of those, decided differently (outcome or determining policies).
    pub changed: usize,
    /// Kept without their arguments: not decided again.
    pub partial: usize,
    /// Records whose kept decision does not read (a newer or damaged record).
    pub unreadable: usize,
    /// The first changes: the record's request id and what changed.
    pub examples: Vec<(String, Change)>,
}

/// Decide again, against `candidate`, every kept decision of `records`.
pub fn replay(records: &[ostiary::audit::AuditRecord], candidate: &PolicyEngine) -> Replayed {
    let mut out = Replayed::default();
    for record in records {
        let Some(kept) = &record.decided else {
            continue;
        };
        let kept = match recorded::from_json(&kept.to_value()) {
            Ok(kept) => kept,
            Err(_) => {
                out.unreadable += 1;
                continue;
            }
        };
        if kept.partial {
            out.partial += 1;
            continue;
        }
        out.decided += 1;
        if let Some(change) = recorded::compare(&kept, &candidate.decide(&kept.request)) {
            out.changed += 1;
            if out.examples.len() < EXAMPLES {
                out.examples.push((record.request_id.clone(), change));
            }
        }
    }
    out
}

/// The audit trail, read-only.
fn trail(
    config: &Config,
) -> Result<std::sync::Arc<dyn ostiary::store::audit::AuditStore>, CliError> {
    let backend = ostiary::stores::Backend::of(&config.state).map_err(CliError::Usage)?;
    backend.audit_reader().map_err(|e| match e {
        ostiary_store::StoreError::Unavailable(why) => CliError::Usage(why),
        other => CliError::Store(other),
    })
}

/// `ostiary policy replay`.
pub fn run(
    config: &Config,
    candidate: &Path,
    since: Option<&str>,
    session: Option<String>,
    out: Output,
) -> Result<ExitCode, CliError> {
    let triggers = ostiary::runs::authorize::policy_triggers(&config.trigger);
    let engine = PolicyEngine::load_dir_with(candidate, &triggers)?;
    let records = verify::query(
        &*trail(config)?,
        &Query {
            session,
            since_ms: super::audit::since_ms(since)?,
            limit: Some(u32::MAX),
            ..Default::default()
        },
    )?;
    let replayed = replay(&records, &engine);
    if out.json {
        print_json(&to_json(&replayed));
    } else {
        println!(
            "{} decisions replayed against {}: {} would change ({} kept without their \
             arguments, not replayed)",
            replayed.decided,
            candidate.display(),
            replayed.changed,
            replayed.partial
        );
        for (request_id, change) in &replayed.examples {
            println!(
                "  {request_id}: {} [{}] -> {} [{}]",
                change.old_outcome,
                change.old_policies.join(", "),
                change.new_outcome,
                change.new_policies.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--json`: one object.
pub fn to_json(replayed: &Replayed) -> Value {
    let examples: Vec<Value> = replayed
        .examples
        .iter()
        .map(|(request_id, c)| {
            json!({
                "request_id": request_id,
                "old": { "decision": c.old_outcome, "policies": c.old_policies },
                "new": { "decision": c.new_outcome, "policies": c.new_policies },
            })
        })
        .collect();
    json!({
        "decided": replayed.decided,
        "changed": replayed.changed,
        "partial": replayed.partial,
        "unreadable": replayed.unreadable,
        "examples": examples,
    })
}

/// `ostiary policy shadow report`: the trail's `shadow` records, counted by determining
/// policy (of either set), tool and agent, with the latest examples.
pub fn shadow_report(
    config: &Config,
    since: Option<&str>,
    out: Output,
) -> Result<ExitCode, CliError> {
    let records = verify::query(
        &*trail(config)?,
        &Query {
            since_ms: super::audit::since_ms(since)?,
            limit: Some(u32::MAX),
            ..Default::default()
        },
    )?;
    let report = shadow_summary(&records);
    if out.json {
        print_json(&report);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} disagreements of the shadow set",
        report["disagreements"]
    );
    for (title, key) in [
        ("by policy", "by_policy"),
        ("by tool", "by_tool"),
        ("by agent", "by_agent"),
    ] {
        let Some(rows) = report[key].as_object() else {
            continue;
        };
        if rows.is_empty() {
            continue;
        }
        println!("{title}:");
        for (name, n) in rows {
            println!("  {n:>6}  {name}");
        }
    }
    for example in report["examples"].as_array().into_iter().flatten() {
        println!(
            "  {}  {}",
            example["request_id"].as_str().unwrap_or_default(),
            example["reason"].as_str().unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The counts and examples of the `shadow` records among `records`.
pub fn shadow_summary(records: &[ostiary::audit::AuditRecord]) -> Value {
    use std::collections::BTreeMap;
    let mut by_policy: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_tool: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_agent: BTreeMap<String, u64> = BTreeMap::new();
    let mut examples = Vec::new();
    let mut n = 0u64;
    for record in records.iter().filter(|r| r.kind == "shadow") {
        n += 1;
        let sides = record.shadow.as_ref();
        let mut policies: Vec<String> = ["live", "shadow"]
            .iter()
            .filter_map(|side| sides?.get(side)?.get("policies")?.as_array().cloned())
            .flatten()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect();
        policies.sort();
        policies.dedup();
        if policies.is_empty() {
            policies.push("(no policy: default deny)".into());
        }
        for p in policies {
            *by_policy.entry(p).or_default() += 1;
        }
        let action = sides
            .and_then(|s| s.get("action"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        *by_tool
            .entry(record.tool.clone().unwrap_or_else(|| action.to_owned()))
            .or_default() += 1;
        *by_agent
            .entry(record.agent.clone().unwrap_or_default())
            .or_default() += 1;
        examples.push(json!({
            "request_id": record.request_id,
            "agent": record.agent,
            "tool": record.tool,
            "reason": record.reason,
            "live": sides.and_then(|s| s.get("live")),
            "shadow": sides.and_then(|s| s.get("shadow")),
        }));
    }
    let skip = examples.len().saturating_sub(EXAMPLES);
    json!({
        "disagreements": n,
        "by_policy": by_policy,
        "by_tool": by_tool,
        "by_agent": by_agent,
        "examples": examples.split_off(skip),
    })
}
