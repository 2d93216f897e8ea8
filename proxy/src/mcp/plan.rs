//! Deciding an MCP [`Exchange`] call by call, in two steps with the checks between them.
//!
//! [`Exchange::decide`] asks Cedar about every message — each `tools/call` as its tool's
//! action, every other message as `Action::"mcp"` — synchronously (no await while the policy
//! set is held). The pipeline then runs the tier's checks of each call policy
//! allowed or escalated ([`Decided::checkable`], [`Decided::checked`]) — a call failing
//! them is refused like a denied one, a call a check escalates is held like one policy
//! escalated — and only then does [`Decided::finish`] work out what is forwarded, which
//! calls are refused and which are held. Outcomes can change between the steps, so the
//! refusal list and its indices are built last.

use bytes::Bytes;
use ostiary_policies::recorded::Kept;
use ostiary_policies::Action;
use serde_json::Value;

use super::{Asker, Endpoint, Exchange, Kind};
use crate::check;
use crate::error::{McpRefusal, ProxyError};
use crate::evaluate::Verdict;
use crate::guardrails::pause::{counts_as_denial, Seen};

/// The outcome of deciding an [`Exchange`].
#[derive(Debug)]
pub struct Plan {
    /// What to forward, already serialized: `None` when nothing is left to forward.
    pub forward: Option<Bytes>,
    /// Whether `forward` is exactly the agent's body (nothing was taken out).
    pub unchanged: bool,
    /// Refused calls with an id (a refused notification gets no answer).
    pub refused: Vec<McpRefusal>,
    /// Ids of forwarded `tools/list` requests, whose answers are filtered.
    pub listed: Vec<Value>,
    /// Whether the agent sent a batch.
    pub batch: bool,
    /// Determining policies of the allowed calls, for the audit record.
    pub policies: Vec<String>,
    /// Catalog names of the calls, for the audit record.
    pub tools: Vec<String>,
    /// Every `tools/call`, in order, with its decision: one `mcp_call` record each.
    pub calls: Vec<DecidedCall>,
    /// Every other message, in order, with its decision (`Action::"mcp"`).
    pub messages: Vec<DecidedMessage>,
    /// The refusal of a notification (the first, if several): it has no id to answer, so
    /// when nothing else is left to forward or answer, it is the request's refusal.
    pub silenced: Option<ProxyError>,
    /// Calls policy or a check escalated, to be held for approval: their refusal (in
    /// `refused`) and decision (in `calls`) say `approval_required` until the pipeline
    /// holds them.
    pub escalated: Vec<Escalated>,
}

/// A `tools/call` that a human's approval would allow.
#[derive(Debug)]
pub struct Escalated {
    /// Index of its refusal in [`Plan::refused`] (`None` for a notification, which no one
    /// could collect: it is refused, not held).
    pub refusal: Option<usize>,
    /// Index of its decision in [`Plan::calls`].
    pub call: usize,
    /// The JSON-RPC message as the agent sent it: what is held and later sent alone.
    pub message: Value,
    pub policies: Vec<String>,
    pub action: Action,
    pub tier: String,
}

/// One decided `tools/call`: what its own audit record needs, never its arguments.
#[derive(Debug)]
pub struct DecidedCall {
    /// The JSON-RPC id as JSON text (`7`, `"a"`), so `7` and `"7"` stay apart; `None` for a
    /// notification.
    pub rpc_id: Option<String>,
    /// The catalog entry's name and tier; `None` for a tool the catalog does not list for
    /// the endpoint (the agent's name for it is in the refusal's reason).
    pub tool: Option<(String, String)>,
    /// The determining policies of an allowed call, or why it was refused.
    pub outcome: Result<Vec<String>, ProxyError>,
    /// The checks that ran on it (none when policy refused it).
    pub checks: Vec<check::Ran>,
    /// Forwarded although a check could not answer in time (`on_budget = "allow"`).
    pub unchecked: bool,
    /// What it cost the session, once charged.
    pub cost_micros: Option<i64>,
    /// What the watchdog compares (tool, arguments' hash, tier, refused or not).
    pub seen: Seen,
    /// What policy allowed or escalated, while the checks may still change it.
    passed: Option<Passed>,
    /// The decision as its audit record keeps it (replay, the shadow set).
    pub kept: Option<Kept>,
}

/// One decided message other than `tools/call`: what its audit record needs.
#[derive(Debug)]
pub struct DecidedMessage {
    /// The JSON-RPC id as JSON text; `None` for a notification.
    pub rpc_id: Option<String>,
    /// The JSON-RPC method (empty for a response to a server request).
    pub method: String,
    /// The determining policies of an allowed message, or why it was refused.
    pub outcome: Result<Vec<String>, ProxyError>,
    /// The id of a `tools/list` request, whose answer is filtered when it is forwarded.
    list: Option<Value>,
    /// The decision as its audit record keeps it (replay, the shadow set).
    pub kept: Option<Kept>,
}

/// A call policy allowed or escalated: what its checks and a hold need.
#[derive(Debug)]
struct Passed {
    /// The message as the agent sent it.
    message: Value,
    action: Action,
    policies: Vec<String>,
    /// Whether it waits for a human (policy escalated it, or a check asked for one).
    escalate: bool,
}

/// A call whose checks are to run: its index for [`Decided::checked`] and what they read.
#[derive(Debug)]
pub struct Checkable<'a> {
    pub index: usize,
    /// The catalog name of the tool.
    pub tool: &'a str,
    pub tier: &'a str,
    pub action: &'a Action,
    /// The call's JSON-RPC message (what DLP and the body limit look at).
    pub message: &'a Value,
}

/// Every call decided by policy; checks pending.
#[derive(Debug)]
pub struct Decided {
    batch: bool,
    /// Each message with the index of its decision in `calls` or `others`.
    messages: Vec<(Value, Slot)>,
    calls: Vec<DecidedCall>,
    others: Vec<DecidedMessage>,
}

#[derive(Debug)]
enum Slot {
    Call(usize),
    Message(usize),
}

impl Exchange {
    /// Ask Cedar about every message on its own.
    pub fn decide(self, endpoint: &Endpoint, asker: Asker<'_>) -> Result<Decided, ProxyError> {
        let mut decided = Decided {
            batch: self.batch,
            messages: Vec::with_capacity(self.messages.len()),
            calls: Vec::new(),
            others: Vec::new(),
        };
        for (value, kind) in self.messages {
            let slot = match kind {
                Kind::Call { id, name, args } => {
                    let catalogued = endpoint.tool(asker.engine.catalog(), &name);
                    let tool = catalogued
                        .map(|tool| (tool.name().to_owned(), tool.tier().as_str().to_owned()));
                    let seen = Seen::new(
                        catalogued.map_or(name.as_str(), |t| t.name()),
                        &args,
                        catalogued.map_or("write", |t| t.tier().as_str()),
                        Some(false),
                        catalogued.is_some(),
                    );
                    let approval = asker.approval.map(str::to_owned);
                    let mut kept = None;
                    let verdict = asker.call_keeping(endpoint, &name, args, approval, &mut kept);
                    let (outcome, passed) = match verdict {
                        Ok(Verdict::Allow { policies, action }) => (
                            Ok(policies.clone()),
                            Some(Passed {
                                message: value.clone(),
                                action,
                                policies,
                                escalate: false,
                            }),
                        ),
                        Ok(Verdict::Escalate { policies, action }) => (
                            Err(approval_required(&policies, &action)),
                            Some(Passed {
                                message: value.clone(),
                                action,
                                policies,
                                escalate: true,
                            }),
                        ),
                        Err(e) => (Err(e), None),
                    };
                    decided.calls.push(DecidedCall {
                        rpc_id: id.as_ref().map(Value::to_string),
                        tool,
                        outcome,
                        checks: Vec::new(),
                        unchecked: false,
                        cost_micros: None,
                        seen,
                        passed,
                        kept,
                    });
                    Slot::Call(decided.calls.len() - 1)
                }
                Kind::Message { method, list } => {
                    let mut kept = None;
                    let outcome = match asker.message_keeping(endpoint, &method, &mut kept) {
                        Ok(Verdict::Allow { policies, .. }) => Ok(policies),
                        // `mcp` is never escalated (only tool calls are); no allow, no pass.
                        Ok(Verdict::Escalate { policies, action }) => {
                            Err(ProxyError::ApprovalRequired {
                                policies,
                                action: action.uid_text(),
                                resource: format!(
                                    "{}::Host::{:?}",
                                    ostiary_policies::schema::NAMESPACE,
                                    asker.target.host.to_string()
                                ),
                            })
                        }
                        Err(e) => Err(e),
                    };
                    decided.others.push(DecidedMessage {
                        rpc_id: value.get("id").map(Value::to_string),
                        method,
                        outcome,
                        list,
                        kept,
                    });
                    Slot::Message(decided.others.len() - 1)
                }
            };
            decided.messages.push((value, slot));
        }
        Ok(decided)
    }
}

fn approval_required(policies: &[String], action: &Action) -> ProxyError {
    ProxyError::ApprovalRequired {
        policies: policies.to_vec(),
        action: action.uid_text(),
        resource: format!(
            "{}::Tool::{:?}",
            ostiary_policies::schema::NAMESPACE,
            action.id().trim_start_matches("tool:")
        ),
    }
}

impl Decided {
    /// The calls policy allowed or escalated: the ones whose tier's checks run.
    pub fn checkable(&self) -> impl Iterator<Item = Checkable<'_>> {
        self.calls.iter().enumerate().filter_map(|(index, call)| {
            let passed = call.passed.as_ref()?;
            let (tool, tier) = call.tool.as_ref()?;
            Some(Checkable {
                index,
                tool,
                tier,
                action: &passed.action,
                message: &passed.message,
            })
        })
    }

    /// Apply the checks of call `index`: a failure refuses it (`check_failed`), a check
    /// asking for a human holds it, a budget that ran out in a lenient tier marks it
    /// unchecked.
    pub fn checked(&mut self, index: usize, report: check::Report) {
        let Some(call) = self.calls.get_mut(index) else {
            return;
        };
        call.checks = report.ran;
        match report.verdict {
            check::Verdict::Pass => {}
            check::Verdict::Unchecked { .. } => call.unchecked = true,
            check::Verdict::Fail { check, detail } => {
                call.passed = None;
                call.outcome = Err(ProxyError::CheckFailed { check, detail });
            }
            check::Verdict::Escalate { check, .. } => {
                if let Some(passed) = call.passed.as_mut() {
                    passed.escalate = true;
                    passed.policies.push(format!("check:{check}"));
                    call.outcome = Err(approval_required(&passed.policies, &passed.action));
                }
            }
        }
    }

    /// The calls still allowed, with what each costs (the catalog's `cost`).
    pub fn allowed_costs(&self, catalog: &ostiary_policies::Catalog) -> Vec<(usize, i64)> {
        self.calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.outcome.is_ok())
            .filter_map(|(i, c)| {
                let (name, _) = c.tool.as_ref()?;
                Some((i, catalog.get(name).map_or(0, |t| t.cost_micros())))
            })
            .collect()
    }

    /// Call `index` was charged `cost`.
    pub fn charged(&mut self, index: usize, cost: i64) {
        if let Some(call) = self.calls.get_mut(index) {
            call.cost_micros = Some(cost);
        }
    }

    /// Hold call `index` for a human after all (a limit that escalates was reached):
    /// `policy` (`limit:calls`) is listed with the policies that allowed it.
    pub fn escalate(&mut self, index: usize, policy: String) {
        if let Some(call) = self.calls.get_mut(index) {
            if let Some(passed) = call.passed.as_mut() {
                passed.escalate = true;
                passed.policies.push(policy);
                call.outcome = Err(approval_required(&passed.policies, &passed.action));
            }
        }
    }

    /// Refuse call `index` after all (a limit reached).
    pub fn refuse(&mut self, index: usize, error: ProxyError) {
        if let Some(call) = self.calls.get_mut(index) {
            call.passed = None;
            call.outcome = Err(error);
        }
    }

    /// Work out what is forwarded (`body` is the agent's, sent as it is when nothing was
    /// taken out), which calls are refused and which are held.
    pub fn finish(self, body: Bytes) -> Plan {
        let mut plan = Plan {
            forward: None,
            unchanged: true,
            refused: Vec::new(),
            listed: Vec::new(),
            batch: self.batch,
            policies: Vec::new(),
            tools: Vec::new(),
            calls: Vec::new(),
            messages: Vec::new(),
            silenced: None,
            escalated: Vec::new(),
        };
        let mut calls = self.calls;
        let mut others = self.others;
        let mut kept = Vec::with_capacity(self.messages.len());
        for (value, slot) in self.messages {
            let index = match slot {
                Slot::Call(index) => index,
                Slot::Message(index) => {
                    let message = &mut others[index];
                    match &message.outcome {
                        Ok(policies) => {
                            plan.policies.extend(policies.iter().cloned());
                            if let Some(id) = message.list.take() {
                                plan.listed.push(id);
                            }
                            kept.push(value);
                        }
                        Err(error) => {
                            plan.unchanged = false;
                            match value.get("id").cloned() {
                                Some(id) => plan.refused.push(McpRefusal {
                                    id,
                                    error: error.clone(),
                                }),
                                None => {
                                    plan.silenced.get_or_insert_with(|| error.clone());
                                }
                            }
                        }
                    }
                    continue;
                }
            };
            let call = &mut calls[index];
            call.seen.denied = Some(call.outcome.as_ref().err().is_some_and(counts_as_denial));
            if let Some((name, _)) = &call.tool {
                plan.tools.push(name.clone());
            }
            match &call.outcome {
                Ok(policies) => {
                    plan.policies.extend(policies.iter().cloned());
                    kept.push(value);
                }
                Err(error) => {
                    plan.unchanged = false;
                    let id = value.get("id").cloned();
                    if id.is_none() {
                        plan.silenced.get_or_insert_with(|| error.clone());
                    }
                    let refusal = id.map(|id| {
                        plan.refused.push(McpRefusal {
                            id,
                            error: error.clone(),
                        });
                        plan.refused.len() - 1
                    });
                    if let Some(passed) = call.passed.take().filter(|p| p.escalate) {
                        plan.escalated.push(Escalated {
                            refusal,
                            call: index,
                            message: passed.message,
                            policies: passed.policies,
                            action: passed.action,
                            tier: call.tool.as_ref().map(|t| t.1.clone()).unwrap_or_default(),
                        });
                    }
                }
            }
        }
        plan.calls = calls;
        plan.messages = others;
        plan.forward = if plan.unchanged {
            Some(body)
        } else if kept.is_empty() {
            None
        } else if kept.len() == 1 {
            // A single message, not a batch of one: servers that dropped batching (MCP
            // 2025-06-18) still take it, and `reply` wraps the answer back into an array.
            let one = kept.pop().unwrap_or_default();
            Some(Bytes::from(one.to_string()))
        } else {
            Some(Bytes::from(Value::Array(kept).to_string()))
        };
        plan
    }
}
