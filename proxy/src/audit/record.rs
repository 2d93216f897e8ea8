//! An audit record and the guard that guarantees one is written per request.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::sink::AuditSink;
use crate::classify::Tunnel;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::session::Principal;

/// One decision, as stored (as JSON) in the audit chain. Field order is the serialisation
/// order, which the chain's hashes depend on: append fields, never reorder.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AuditRecord {
    /// Milliseconds since the Unix epoch.
    pub ts_ms: i64,
    pub request_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `http`, `connect`, `tunnel`, `tls`, `stream` (a WebSocket or tunnel relay the proxy
    /// cut: teardown, expiry, a byte budget), `session`, `spawn` (a refused or renamed child
    /// session), `policy`, `approval` (a transition of the approval queue), `audit` (the
    /// trail's own: an outage, a re-anchor), `mcp_call` (one `tools/call` of a JSON-RPC
    /// batch, under the request id of the `http` record that carried it) or `mcp_message`
    /// (any other message of such a batch, decided as `Action::"mcp"`) or `undo` (one undo
    /// request `ostiary sessions undo` sent, docs/undo.md).
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Path only: queries may carry values the agent should not have sent; they stay out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `allow`, `deny`, `error`, `cancel`, or `escalate` (held for a human).
    pub decision: String,
    /// The `error` kind of docs/design.md §5 for refusals and failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub policies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The address actually dialed, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    pub duration_us: u64,
    /// The catalogued tool a request was recognised as (`Action::"tool:<name>"`). Its
    /// arguments are kept only in `decided` (bounded, credentials redacted), never here.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tool: Option<String>,
    /// The tool's risk tier (`read`, `write`, `irreversible`, `high_impact`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tier: Option<String>,
    /// The JSON-RPC id (as JSON text) of the call an `mcp_call` record is about.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rpc_id: Option<String>,
    /// Credentials injected into the request (binding names), never their values; for a
    /// refused placeholder exfiltration, the credential whose placeholder it carried.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub credentials: Vec<String>,
    /// Lease ids of those credentials (Vault lease ids, `pki:<mount>:<serial>`).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub leases: Vec<String>,
    /// The approval a held request, a decision or an execution belongs to.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub approval: Option<String>,
    /// Who decided it (never the agent).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub approver: Option<String>,
    /// The tier checks that ran: name, outcome, duration.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub checks: Vec<crate::check::Ran>,
    /// The checks' budget ran out and the tier let the request through unchecked.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub unchecked: bool,
    /// What the action cost the session (the catalog's `cost` of a tool call, in
    /// micro-units), set when it was charged: an allowed or executed tool call.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cost_micros: Option<i64>,
    /// The parent session of a child session's records (agent-to-agent spawning).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parent: Option<String>,
    /// A session's totals, on the record of its end.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub totals: Option<crate::guardrails::meter::Usage>,
    /// What an operator acknowledged with `ostiary audit reanchor` (kind `audit`, decision
    /// `reanchor`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reanchor: Option<Reanchor>,
    /// The JSON-RPC method of an MCP message decided as `Action::"mcp"` (on its
    /// `mcp_message` record in a batch, or on the request's own record for a lone one).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rpc_method: Option<String>,
    /// What became of a sandboxed run (kind `run`): its exit, the limit that ended it, the
    /// isolation and limits that applied, what was cleaned up.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub run: Option<serde_json::Value>,
    /// A signed checkpoint of the chain (kind `audit`, decision `checkpoint`,
    /// [`super::attest`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checkpoint: Option<super::attest::Checkpoint>,
    /// The content-addressed version of the policy set that decided it (`sha256:…`); on a
    /// record no set decided (a session's end, an approval's transition, a reload), the
    /// version in force when it was written; absent where no set was loaded (records the
    /// trail writes about itself, records from before versions).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub policy_version: Option<String>,
    /// The policy decision as it can be made again (`ostiary policy replay`, the shadow
    /// set): the request in Cedar's terms, the outcome, the determining policies
    /// (`ostiary_policies::recorded`; arguments bounded, credentials redacted). On the
    /// records of plain requests, REST tool calls, MCP messages, uninspected tunnels and
    /// triggers.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub decided: Option<ostiary_policies::recorded::Kept>,
    /// A disagreement of the shadow set (kind `shadow`): the action and resource, and what
    /// the enforced and the shadow set decided (`decision`, `policies` each).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub shadow: Option<serde_json::Value>,
    /// The undo journal's side of a call of a tool that declares `undo` (docs/undo.md):
    /// `recorded`, `unavailable: <why>` or `unrecorded: <why>`; on an `undo` record, the
    /// id of the call it reverses (`of <request id>`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub undo: Option<String>,
    /// How long each phase of the request took: for its span ([`crate::telemetry`]), never
    /// stored (the trail's format and hashes stay as they are).
    #[serde(skip)]
    pub phases: PhaseTimes,
    /// The trace the request's span belongs to, when its context was propagated upstream
    /// (`[telemetry] propagate`); never stored.
    #[serde(skip)]
    pub trace: Option<crate::telemetry::TraceContext>,
}

/// The phases of a request ([`crate::pipeline`]) a span times, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Authenticate,
    Recognise,
    Decide,
    Inject,
    Forward,
    Reply,
}

impl Phase {
    const COUNT: usize = 6;

    /// Its name in span attributes (`ostiary.phase.<name>_us`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Authenticate => "authenticate",
            Phase::Recognise => "recognise",
            Phase::Decide => "decide",
            Phase::Inject => "inject",
            Phase::Forward => "forward",
            Phase::Reply => "reply",
        }
    }

    const ALL: [Phase; Phase::COUNT] = [
        Phase::Authenticate,
        Phase::Recognise,
        Phase::Decide,
        Phase::Inject,
        Phase::Forward,
        Phase::Reply,
    ];
}

/// Microseconds each phase a request reached took (from its start to the next phase's, the
/// last one's to the record's end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseTimes([Option<u32>; Phase::COUNT]);

impl PhaseTimes {
    /// The phases reached, with their durations, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, u32)> + '_ {
        Phase::ALL
            .into_iter()
            .zip(self.0)
            .filter_map(|(phase, took)| Some((phase, took?)))
    }

    /// From the phases' starts (µs since the request began; `None` where a phase was not
    /// reached) and the record's end.
    fn from_starts(starts: &[Option<u32>; Phase::COUNT], end: u32) -> Self {
        let mut times = [None; Phase::COUNT];
        for (i, start) in starts.iter().enumerate() {
            if let Some(start) = start {
                let next = starts[i + 1..]
                    .iter()
                    .flatten()
                    .next()
                    .copied()
                    .unwrap_or(end);
                times[i] = Some(next.saturating_sub(*start));
            }
        }
        Self(times)
    }
}

/// A chain that no longer matched its checkpoint, acknowledged by an operator: the record
/// that says so is sealed into the chain, so the loss stays on record.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reanchor {
    /// The last record the checkpoint named, when its seal could be trusted.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checkpoint_seq: Option<i64>,
    /// The last record found in the database (0: none).
    pub chain_seq: i64,
    /// What start-up found wrong.
    pub problem: String,
}

impl AuditRecord {
    /// Name determining policies, each once: a request can be decided by the port rule (a
    /// `connect` permit opening an unlisted port) and by its own action.
    pub fn add_policies(&mut self, policies: impl IntoIterator<Item = String>) {
        for policy in policies {
            if !self.policies.contains(&policy) {
                self.policies.push(policy);
            }
        }
    }
}

impl AuditRecord {
    /// Who asked: the session, agent and tenant of `principal`.
    pub fn set_principal(&mut self, principal: &Principal) {
        self.session = Some(principal.session_id.clone());
        self.agent = Some(principal.agent.clone());
        self.tenant = Some(principal.tenant.clone());
    }

    /// The principal and destination of an intercepted or relayed tunnel.
    pub fn set_tunnel(&mut self, tunnel: &Tunnel) {
        self.set_principal(&tunnel.principal);
        self.host = Some(tunnel.host.to_string());
        self.port = Some(tunnel.port);
    }
}

/// Holds the record of one request and writes it exactly once: on `finish`, or on drop if
/// the request was abandoned (recorded as `cancel`).
#[derive(Debug)]
pub struct AuditGuard {
    record: Option<AuditRecord>,
    started: Instant,
    sink: AuditSink,
    /// Requests are counted where they are recorded, so metrics and audit always agree.
    metrics: Arc<Metrics>,
    /// A scratch record ([`AuditGuard::scratch`]) is never written.
    keep: bool,
    /// When each phase began, in µs since `started` ([`AuditGuard::mark`]).
    phase_starts: [Option<u32>; Phase::COUNT],
}

impl AuditGuard {
    /// Start the record of one request.
    pub fn start(sink: &AuditSink, metrics: &Arc<Metrics>, request_id: &str, kind: &str) -> Self {
        Self {
            record: Some(AuditRecord {
                ts_ms: crate::store::now_ms(),
                request_id: request_id.to_owned(),
                kind: kind.to_owned(),
                ..Default::default()
            }),
            started: Instant::now(),
            sink: sink.clone(),
            metrics: metrics.clone(),
            keep: true,
            phase_starts: [None; Phase::COUNT],
        }
    }

    /// `phase` begins now (its span attribute times it until the next phase begins).
    pub fn mark(&mut self, phase: Phase) {
        let at = u32::try_from(self.started.elapsed().as_micros()).unwrap_or(u32::MAX);
        self.phase_starts[phase as usize] = Some(at);
    }

    /// A record that is filled in like any other but never written: for work that keeps
    /// its own record (an approved execution's is its approval's transition, which takes
    /// what it needs from this one with [`AuditGuard::take`]).
    pub fn scratch(sink: &AuditSink, metrics: &Arc<Metrics>, request_id: &str, kind: &str) -> Self {
        let mut guard = Self::start(sink, metrics, request_id, kind);
        guard.keep = false;
        guard
    }

    /// The record so far, taken out: nothing is written for it any more.
    pub fn take(mut self) -> Option<AuditRecord> {
        self.record.take()
    }

    /// Fill in fields as the phases learn them.
    pub fn update(&mut self, f: impl FnOnce(&mut AuditRecord)) {
        if let Some(record) = self.record.as_mut() {
            f(record);
        }
    }

    /// The request was forwarded (or answered) successfully.
    pub fn allow(mut self, status: u16) {
        self.write(|r| {
            r.decision = "allow".into();
            r.status = Some(status);
        });
    }

    /// The request was refused or failed.
    pub fn refuse(mut self, err: &ProxyError, status: u16) {
        self.write(|r| {
            r.decision = err.audit_decision().into();
            r.error = Some(err.kind().into());
            r.reason = Some(err.to_string());
            // Added to any policies that opened the port, rather than lost behind them.
            r.add_policies(err.policies().iter().cloned());
            r.status = Some(status);
        });
    }

    /// Close the record of one decision inside a larger exchange (a call of a JSON-RPC
    /// batch): no status, because the HTTP status belongs to the exchange's own record.
    pub fn decided(mut self, outcome: Result<&[String], &ProxyError>) {
        self.write(|r| match outcome {
            Ok(policies) => {
                r.decision = "allow".into();
                r.add_policies(policies.iter().cloned());
            }
            Err(err) => {
                r.decision = err.audit_decision().into();
                r.error = Some(err.kind().into());
                r.reason = Some(err.to_string());
                r.add_policies(err.policies().iter().cloned());
            }
        });
    }

    /// The record so far (`None` once written).
    pub fn record(&self) -> Option<&AuditRecord> {
        self.record.as_ref()
    }

    /// Close the record of an event that is not an HTTP exchange (a policy reload): a
    /// decision and, for failures, the `error` kind; no status.
    pub fn event(mut self, decision: &str, error: Option<&str>) {
        self.write(|r| {
            r.decision = decision.to_owned();
            r.error = error.map(str::to_owned);
        });
    }

    fn write(&mut self, f: impl FnOnce(&mut AuditRecord)) {
        if !self.keep {
            self.record = None;
            return;
        }
        if let Some(mut record) = self.record.take() {
            f(&mut record);
            record.duration_us = self.started.elapsed().as_micros() as u64;
            record.phases = PhaseTimes::from_starts(
                &self.phase_starts,
                u32::try_from(record.duration_us).unwrap_or(u32::MAX),
            );
            self.metrics.count(&record.kind, &record.decision);
            self.sink.send(record);
        }
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        self.write(|r| {
            r.decision = "cancel".into();
            if r.reason.is_none() {
                r.reason = Some("the request was abandoned before it completed".into());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_lasts_until_the_next_one_reached_begins_and_the_last_until_the_end() {
        let mut starts = [None; Phase::COUNT];
        starts[Phase::Authenticate as usize] = Some(0);
        starts[Phase::Decide as usize] = Some(30);
        starts[Phase::Forward as usize] = Some(45);
        let times = PhaseTimes::from_starts(&starts, 100);
        let named: Vec<(&str, u32)> = times.iter().map(|(p, t)| (p.name(), t)).collect();
        assert_eq!(
            named,
            [("authenticate", 30), ("decide", 15), ("forward", 55)]
        );
        assert_eq!(
            PhaseTimes::from_starts(&[None; Phase::COUNT], 9)
                .iter()
                .count(),
            0
        );
    }

    #[test]
    fn phases_and_trace_are_never_stored() {
        let record = AuditRecord {
            request_id: "r".into(),
            phases: PhaseTimes::from_starts(&[Some(1); Phase::COUNT], 9),
            ..Default::default()
        };
        let text = serde_json::to_string(&record).unwrap();
        assert!(!text.contains("phase") && !text.contains("trace"), "{text}");
    }
}
