//! Reversing a session (`ostiary sessions undo`, `POST /v1/sessions/{id}/undo`): its
//! recorded undos, newest first, each claimed once in the journal, decided by policy as
//! `Action::"tool:<name>.undo"` and sent through the request phases
//! ([`crate::pipeline::reverse`]) with the tool's credential binding, each leaving an
//! audit record of kind `undo`.
//!
//! ```text
//! list (newest first) → for each: claim (exactly once) → rebuild → pipeline::reverse
//!   (classify → decide → inject → forward → reply) → drain the answer → finish
//! → the session ended? its credentials minted for the undos are dropped again
//! ```
//! A failed or refused undo stays in the journal to be tried again by a later undo; a
//! reversed one never runs twice. One entry failing does not stop the others: each is
//! reported with what it met.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::Request;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::Value;

use super::journal::Stored;
use crate::audit::AuditGuard;
use crate::body::{self, ProxyBody};
use crate::classify::{Origin, Tunnel};
use crate::error::ProxyError;
use crate::lifecycle::Teardown;
use crate::pipeline::{self, Reversal};
use crate::plane::DataPlane;
use crate::session::Principal;
use crate::store::undo::{UndoRow, UndoStatus};
use crate::store::{now_ms, Call, StoreError};

/// The most of an undo's answer read (and dropped) before its outcome is recorded.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// What reverses sessions: the data plane's phases, and teardown's credential side for a
/// session that already ended.
#[derive(Debug, Clone)]
pub struct Reverser {
    pub plane: Arc<DataPlane>,
    pub teardown: Teardown,
}

/// What one entry of the journal met.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// The call it reverses (its audit record's `request_id`).
    pub call: String,
    pub tool: String,
    pub recorded_ms: i64,
    /// The undo request, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The upstream's status, when the undo was sent and answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The policies that allowed or refused it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// Why it failed, was refused or is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The undo's own audit record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// What an undo did, by outcome; each list in the order the undos ran (newest call first).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub session: String,
    pub dry_run: bool,
    /// Sent and answered with a 2xx (a dry run: would be sent, policy allows it).
    pub reversed: Vec<Entry>,
    /// Sent, and the upstream answered otherwise or could not be reached.
    pub failed: Vec<Entry>,
    /// Not sent: policy refused the undo (or asked for a human, which an undo does not
    /// wait for), or the catalog no longer declares it.
    pub refused: Vec<Entry>,
    /// Recorded without an undo request: a value it needed was missing or a secret.
    pub unavailable: Vec<Entry>,
    /// Reversed by an earlier undo.
    pub already_reversed: Vec<Entry>,
    /// Being sent by another undo right now.
    pub in_progress: Vec<Entry>,
    /// Calls of tools that declare no undo (filled by the caller, from the audit trail).
    pub no_undo: Vec<Value>,
}

/// Why a session could not be reversed at all.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error("the undo journal is unavailable: {0}")]
    Store(#[from] StoreError),
}

impl Reverser {
    /// Reverse `session`'s calls recorded since `since_ms`; with `dry_run`, decide each
    /// and send nothing.
    pub async fn undo(
        &self,
        session: &str,
        since_ms: i64,
        dry_run: bool,
    ) -> Result<Report, UndoError> {
        let owned = session.to_owned();
        let rows = self
            .plane
            .undo
            .call(move |s| s.list(&owned, since_ms))
            .await?;
        let live = self.plane.sessions.find(session).await;
        // An ended session's credentials are refused for good: this undo mints its own,
        // under a scope it ends when it is done.
        let scope = live
            .is_none()
            .then(|| format!("{session}/undo-{}", crate::ids::request_id()));
        let mut report = Report {
            session: session.to_owned(),
            dry_run,
            ..Report::default()
        };
        let mut sent = false;
        for row in rows {
            let mut entry = Entry {
                call: row.id.clone(),
                tool: row.tool.clone(),
                recorded_ms: row.recorded_ms,
                method: None,
                url: None,
                status: None,
                policies: Vec::new(),
                detail: row.detail.clone(),
                request_id: None,
            };
            let list = match row.status {
                UndoStatus::Unavailable => &mut report.unavailable,
                UndoStatus::Done => &mut report.already_reversed,
                UndoStatus::Running => &mut report.in_progress,
                UndoStatus::Pending | UndoStatus::Failed | UndoStatus::Refused => {
                    let who = (live.clone(), scope.as_deref());
                    let outcome = self.one(&row, who, dry_run, &mut entry).await;
                    sent |= !dry_run && outcome != Outcome::InProgress;
                    match outcome {
                        Outcome::Reversed => &mut report.reversed,
                        Outcome::Failed => &mut report.failed,
                        Outcome::Refused => &mut report.refused,
                        Outcome::InProgress => &mut report.in_progress,
                    }
                }
            };
            list.push(entry);
        }
        // What the undos of an ended session minted is dropped as a teardown drops it.
        if let (true, Some(scope)) = (sent, &scope) {
            self.teardown.end_credentials(scope).await;
        }
        Ok(report)
    }

    /// Decide (and unless `dry_run`, send) one entry, filling `entry` with what it met.
    async fn one(
        &self,
        row: &UndoRow,
        (live, scope): (Option<Arc<Principal>>, Option<&str>),
        dry_run: bool,
        entry: &mut Entry,
    ) -> Outcome {
        let parsed = parse(row);
        let (stored, subject, args) = match parsed {
            Ok(parsed) => parsed,
            Err(why) => {
                entry.detail = Some(why);
                return Outcome::Failed;
            }
        };
        entry.method = Some(stored.method.clone());
        entry.url = Some(url(&stored));
        // A live session decides as it is now; an ended one as it was.
        let principal = live.unwrap_or_else(|| Arc::new(subject));
        let id = row.id.clone();
        match dry_run {
            true => {}
            false => match self.plane.undo.call(move |s| s.claim(&id)).await {
                Ok(true) => {}
                Ok(false) => return Outcome::InProgress,
                Err(e) => {
                    entry.detail = Some(format!("claiming it: {e}"));
                    return Outcome::Failed;
                }
            },
        }
        let (outcome, detail) = self
            .send(row, stored, (principal, scope), (args, dry_run), entry)
            .await;
        if dry_run {
            entry.detail = (outcome != Outcome::Reversed).then_some(detail);
            return outcome;
        }
        let status = match outcome {
            Outcome::Reversed => UndoStatus::Done,
            Outcome::Refused => UndoStatus::Refused,
            Outcome::Failed | Outcome::InProgress => UndoStatus::Failed,
        };
        let id = row.id.clone();
        let kept = detail.clone();
        if let Err(e) = self
            .plane
            .undo
            .call(move |s| s.finish(&id, status, &kept, now_ms()))
            .await
        {
            // Left `running`: never sent again by mistake, shown as in progress.
            tracing::error!(call = %row.id, error = %e, "an undo's outcome could not be recorded");
        }
        entry.detail = (outcome != Outcome::Reversed).then_some(detail);
        outcome
    }

    /// Send a claimed entry (with `dry_run`, decide it and stop there); its outcome and what
    /// to record of it. A dry run's record is never written.
    async fn send(
        &self,
        row: &UndoRow,
        stored: Stored,
        (principal, scope): (Arc<Principal>, Option<&str>),
        (args, dry_run): (Value, bool),
        entry: &mut Entry,
    ) -> (Outcome, String) {
        let request_id = crate::ids::request_id();
        let (plane, metrics) = (&self.plane.audit, &self.plane.metrics);
        let mut audit = if dry_run {
            AuditGuard::scratch(plane, metrics, &request_id, "undo")
        } else {
            entry.request_id = Some(request_id.clone());
            AuditGuard::start(plane, metrics, &request_id, "undo")
        };
        audit.update(|r| {
            r.set_principal(&principal);
            r.undo = Some(format!("of {}", row.id));
        });
        let held = match rebuild(&stored, &principal) {
            Ok(held) => held,
            Err(e) => {
                let detail = e.to_string();
                audit.refuse(&e, crate::respond::status(&e).as_u16());
                return (Outcome::Failed, detail);
            }
        };
        let reversal = Reversal {
            idempotency_key: format!("ostiary-undo-{}", row.id),
            lease_scope: scope.map(str::to_owned),
            dry_run,
        };
        let sent = pipeline::reverse(
            &self.plane,
            (principal, reversal),
            held,
            (&row.tool, args),
            &mut audit,
            &request_id,
        )
        .await;
        entry.policies = audit
            .record()
            .map(|r| r.policies.clone())
            .unwrap_or_default();
        match sent {
            // Decided, and a dry run stops there.
            Ok(None) => (Outcome::Reversed, "policy allows it".to_owned()),
            Ok(Some(response)) => {
                let status = response.status();
                entry.status = Some(status.as_u16());
                // Read to its end, so the undo is over when it is reported (and a body that
                // fails is a failure, whatever the status said).
                let drained = drain(response.into_body()).await;
                audit.allow(status.as_u16());
                match drained {
                    Err(why) => (Outcome::Failed, why),
                    Ok(()) if status.is_success() => {
                        (Outcome::Reversed, format!("HTTP {}", status.as_u16()))
                    }
                    Ok(()) => (
                        Outcome::Failed,
                        format!("the upstream answered HTTP {}", status.as_u16()),
                    ),
                }
            }
            Err(e) => {
                let detail = e.to_string();
                let outcome = if refusing_policies(&e).is_empty() && !is_refusal(&e) {
                    Outcome::Failed
                } else {
                    entry.policies = refusing_policies(&e);
                    Outcome::Refused
                };
                audit.refuse(&e, crate::respond::status(&e).as_u16());
                (outcome, detail)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Reversed,
    Failed,
    Refused,
    InProgress,
}

fn is_refusal(e: &ProxyError) -> bool {
    matches!(
        e,
        ProxyError::Denied { .. } | ProxyError::ApprovalRequired { .. }
    )
}

fn refusing_policies(e: &ProxyError) -> Vec<String> {
    match e {
        ProxyError::Denied { policies, .. } | ProxyError::ApprovalRequired { policies, .. } => {
            policies.clone()
        }
        _ => Vec::new(),
    }
}

/// The entry's parts as the journal wrote them; text that no longer parses means the row
/// was tampered with, and nothing is sent for it.
fn parse(row: &UndoRow) -> Result<(Stored, Principal, Value), String> {
    let request = row
        .request
        .as_deref()
        .ok_or("the entry has no undo request")?;
    let stored: Stored =
        serde_json::from_str(request).map_err(|e| format!("the stored undo request: {e}"))?;
    let subject: Principal =
        serde_json::from_str(&row.subject).map_err(|e| format!("the stored caller: {e}"))?;
    let args: Value =
        serde_json::from_str(&row.args).map_err(|e| format!("the stored arguments: {e}"))?;
    Ok((stored, subject, args))
}

/// `host:port` of the undo request (an IPv6 address bracketed).
fn authority(stored: &Stored) -> String {
    if stored.host.contains(':') {
        format!("[{}]:{}", stored.host, stored.port)
    } else {
        format!("{}:{}", stored.host, stored.port)
    }
}

fn url(stored: &Stored) -> String {
    format!("{}://{}{}", stored.scheme, authority(stored), stored.path)
}

/// The undo request as the pipeline takes it: inside a tunnel for https, absolute form for
/// http — as the call it reverses came.
fn rebuild(
    stored: &Stored,
    principal: &Arc<Principal>,
) -> Result<(Origin, Request<ProxyBody>), ProxyError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        ProxyError::bad_request(format!("the stored undo request's {what}: {e}"))
    };
    let host = crate::egress::address::normalize_host(&stored.host).map_err(|e| bad("host", &e))?;
    let mut builder = Request::builder().method(stored.method.as_str());
    let body = match &stored.body {
        Some(value) => {
            builder = builder.header(CONTENT_TYPE, "application/json");
            body::full(Bytes::from(value.to_string()))
        }
        None => body::empty(),
    };
    let origin = match stored.scheme.as_str() {
        "https" => {
            builder = builder
                .uri(stored.path.as_str())
                .header(HOST, authority(stored));
            Origin::Tunnel(Arc::new(Tunnel {
                host,
                port: stored.port,
                principal: principal.clone(),
            }))
        }
        "http" => {
            builder = builder.uri(url(stored));
            Origin::Plain
        }
        other => return Err(bad("scheme", &other)),
    };
    let req = builder.body(body).map_err(|e| bad("form", &e))?;
    Ok((origin, req))
}

/// Read an answer to its end, keeping none of it past [`MAX_ANSWER_BYTES`].
async fn drain(mut body: ProxyBody) -> Result<(), String> {
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("the answer's body failed: {e}"))?;
        if let Some(data) = frame.data_ref() {
            read += data.len();
            if read > MAX_ANSWER_BYTES {
                // Enough to know it was answered; the rest is not waited for.
                return Ok(());
            }
        }
    }
    Ok(())
}
