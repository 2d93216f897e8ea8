//! Runs held for a human before they start (`approval = true` on a trigger, or a policy's
//! `@escalate` on `Action::"trigger"`), through the
//! same approval queue and channels as held requests (the CLI, the review page, email,
//! Slack): the approval shows what would start — the trigger, the agent, the command, the
//! sandbox profile, the payload — and approving it releases the run into the queue, once;
//! denying it, or letting it expire, cancels the run. Nothing runs, and no session exists,
//! until a human said yes.

use serde_json::{json, Value};

use crate::approvals::model::{self, Ask};
use crate::config::triggers::Trigger;
use crate::session::Principal;
use crate::store::approvals::{Approval, HeldRequest, Observed, Status};
use crate::store::runs::RunRow;

/// The held "request" of a run's approval: `ostiary:run/<id>/start`, sent nowhere.
pub const RUN_URL: &str = "ostiary:run/";

/// The largest payload an approval shows whole; a larger one is shown by its digest.
const SHOWN_PAYLOAD: usize = 4096;

/// The approval that holds `run` of `trigger`, asked for by `policies` (the escalating
/// policies, or `trigger:<name>:approval` for the trigger's own `approval = true`).
pub fn approval_for(
    config: &crate::config::Approvals,
    trigger: &Trigger,
    run: &RunRow,
    policies: Vec<String>,
    policy_generation: u64,
    now_ms: i64,
) -> Approval {
    // No session exists yet: the approval stands for the run, in the run's name.
    let principal = Principal {
        session_id: format!("run:{}", run.id),
        agent: trigger.agent.clone(),
        tenant: trigger.tenant.clone().unwrap_or_else(|| "default".into()),
        depth: 0,
        parent: None,
        parent_agent: None,
        profile: Some(trigger.profile.clone()),
        expires_at: i64::MAX,
    };
    let payload = if run.payload.len() <= SHOWN_PAYLOAD {
        serde_json::from_str(&run.payload).unwrap_or(Value::Null)
    } else {
        json!(format!(
            "{} bytes, sha256 {} (too long to show)",
            run.payload.len(),
            run.payload_sha256
        ))
    };
    let args = json!({
        "run": run.id,
        "trigger": trigger.name,
        "kind": trigger.kind.as_str(),
        "agent": trigger.agent,
        "command": trigger.argv(),
        "profile": trigger.profile,
        "payload": payload,
        "payload_sha256": run.payload_sha256,
        "approve": "start the run",
        "deny": "cancel the run",
    });
    model::pending(
        config,
        Ask {
            principal: &principal,
            request_id: crate::ids::request_id(),
            policies,
            policy_generation,
            request: HeldRequest {
                method: "POST".into(),
                url: format!("{RUN_URL}{}/start", run.id),
                headers: Vec::new(),
                body: Vec::new(),
                body_digest: model::digest(b""),
            },
            observed: Observed {
                host: "ostiary".into(),
                port: 0,
                scheme: "ostiary".into(),
                action: "Ostiary::Action::\"trigger\"".into(),
                resource: format!("Ostiary::Trigger::{:?}", trigger.name),
                tool: Some("ostiary.start_run".into()),
                tier: Some("high_impact".into()),
                args: Some(args),
                ..Default::default()
            },
        },
        now_ms,
    )
}

/// The run an approval holds, if it is a run's.
pub fn run_target(approval: &Approval) -> Option<&str> {
    approval
        .request
        .url
        .strip_prefix(RUN_URL)?
        .strip_suffix("/start")
}

/// Why a run whose approval ended this way is cancelled; `None` while it may still start.
pub fn refusal(approval: &Approval) -> Option<String> {
    let by = approval.approver.as_deref().unwrap_or("an approver");
    match approval.status {
        Status::Denied => Some(format!("{by} denied starting the run")),
        Status::Expired => Some("nobody approved the run before its deadline".into()),
        Status::Refused | Status::Failed => Some(format!(
            "the approved run could not be released: {}",
            approval.reason.as_deref().unwrap_or("no reason given")
        )),
        Status::Pending | Status::Approved | Status::Executing | Status::Executed => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::runs::NewRun;

    #[test]
    fn a_run_approval_names_its_run_and_shows_what_would_start() {
        let trigger: Trigger = toml::from_str(
            r#"name = "deploy"
               kind = "api"
               command = ["./deploy.sh"]
               args = ["--prod"]
               agent = "deployer"
               profile = "none"
               approval = true"#,
        )
        .unwrap();
        let new = NewRun {
            id: "run_1".into(),
            trigger: "deploy".into(),
            kind: "api".into(),
            spec: "{}".into(),
            payload: r#"{"ref":"v2"}"#.into(),
            payload_sha256: "ab".into(),
        };
        let run = RunRow {
            status: crate::store::runs::RunStatus::AwaitingApproval,
            ..RunRow::queued(new, 0)
        };
        let approval = approval_for(
            &Default::default(),
            &trigger,
            &run,
            vec!["deploys-need-a-human".into()],
            3,
            1000,
        );
        assert_eq!(approval.policies, ["deploys-need-a-human"]);
        assert_eq!(run_target(&approval), Some("run_1"));
        let args = approval.observed.args.as_ref().unwrap();
        assert_eq!(args["command"], json!(["./deploy.sh", "--prod"]));
        assert_eq!(args["payload"]["ref"], "v2");
        assert_eq!(approval.agent, "deployer");
        assert_eq!(approval.session, "run:run_1");
        let mut decided = approval.clone();
        assert_eq!(refusal(&decided), None);
        decided.status = Status::Denied;
        decided.approver = Some("alice".into());
        assert_eq!(
            refusal(&decided).as_deref(),
            Some("alice denied starting the run")
        );
        decided.status = Status::Expired;
        assert!(refusal(&decided).unwrap().contains("deadline"));
    }
}
