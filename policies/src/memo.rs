//! Decisions kept per policy engine, for requests that ask the same question again.
//!
//! Flat out, the decision was 9% of the proxy's CPU for a set of three policies, most of it
//! Cedar building and evaluating its request (docs/benchmarks.md). Agents ask the same
//! question over and over: the same agent, the same host, the same tool. A decision is a pure
//! function of the engine (its policies, catalog and triggers, fixed for its life: a reload
//! builds a new engine, and with it an empty memo) and of what the request puts into
//! Cedar's request. So it is kept, keyed by exactly that.
//!
//! # What the key holds, and why that is sound
//! - The agent, the tenant and the host: the principal and its entities, the resource.
//! - The action, with what identifies it and its resource: the tool and whether it is an
//!   undo, the trigger and its kind, the child of a spawn.
//! - Whatever decides without Cedar's context being read: a tool's arguments and a trigger's
//!   payload (converted with the tool's type, and a mismatch is a deny, read or not), and the
//!   approval (`decide` re-checks a deny with it granted, to tell an escalation).
//! - Each context attribute a policy of the set can read (`context_use.rs`), and nothing
//!   else: an attribute no policy names changes no decision, which is what the engine already
//!   relies on to leave it out of Cedar's context.
//!
//! Each field goes in with its length, so no two different requests share a key.
//!
//! A set that reads the session's call count, cost or recent calls (or the context or the
//! session record whole) changes its answer with every call: nothing is kept for it, since
//! no key would come back.
//!
//! Bounded like the entity cache: past [`CAPACITY`] keys the memo starts again empty, and a
//! key longer than [`LONGEST_KEY`] (large arguments) is not kept at all.
//! `tests/index_differential.rs` decides generated sets through the memo and without it.

use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

use crate::decide::Decision;
use crate::request::{AccessRequest, Action};

/// Distinct questions kept before the memo starts over.
pub(crate) const CAPACITY: usize = 4_096;

/// The longest key kept: a tool call's arguments are in its key, and an agent sending large
/// ones must not fill memory through the memo (at most `CAPACITY` × this, 16 MiB). A longer
/// question is decided afresh every time.
pub(crate) const LONGEST_KEY: usize = 4 * 1024;

/// Attributes of `context.session` that change with every call.
const VOLATILE: [&str; 3] = ["calls", "cost", "recent"];

/// The decisions of one engine, by request (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// `None`: the set reads something that changes with every call; nothing is kept.
    session: Option<BTreeSet<String>>,
    kept: RwLock<HashMap<String, Decision>>,
}

impl Memo {
    /// A memo for a set that reads `session` of `context.session` (`None`: all of it).
    pub(crate) fn new(session: Option<&BTreeSet<String>>) -> Self {
        let session = session
            .filter(|read| !read.iter().any(|attr| VOLATILE.contains(&attr.as_str())))
            .cloned();
        Self {
            session,
            kept: RwLock::default(),
        }
    }

    /// A memo that keeps nothing.
    pub(crate) fn off() -> Self {
        Self::default()
    }

    /// The decision of `req`: kept, or made by `decide` and kept. `reads` says which context
    /// attributes some policy can read.
    pub(crate) fn decide(
        &self,
        req: &AccessRequest,
        reads: impl Fn(&str) -> bool,
        decide: impl FnOnce() -> Decision,
    ) -> Decision {
        let Some(session) = &self.session else {
            return decide();
        };
        let key = key(req, &reads, session);
        if key.len() > LONGEST_KEY {
            return decide();
        }
        if let Some(kept) = self.kept.read().ok().and_then(|m| m.get(&key).cloned()) {
            return kept;
        }
        let decision = decide();
        // A poisoned lock only costs the keeping, never the decision.
        if let Ok(mut kept) = self.kept.write() {
            if kept.len() >= CAPACITY {
                kept.clear();
            }
            kept.insert(key, decision.clone());
        }
        decision
    }

    /// How many decisions are kept (tests).
    pub(crate) fn len(&self) -> usize {
        self.kept.read().map_or(0, |m| m.len())
    }
}

/// What `req` puts into its decision (see the module doc), each field with its length.
/// Written straight into the key: it is built for every decision, hit or miss.
fn key(req: &AccessRequest, reads: &dyn Fn(&str) -> bool, session: &BTreeSet<String>) -> String {
    let mut key = Key(String::with_capacity(128));
    key.put(&req.agent);
    key.put(&req.tenant);
    key.put(&req.host);
    match &req.action {
        Action::Http {
            method,
            scheme,
            port,
            path,
            query,
        } => {
            key.put("http");
            key.read(reads("method"), method);
            key.read(reads("scheme"), scheme);
            key.number(reads("port").then_some(i64::from(*port)));
            key.read(reads("path"), path);
            key.read(reads("query"), query);
        }
        Action::Connect { port, sni } => {
            key.put("connect");
            key.number(reads("port").then_some(i64::from(*port)));
            key.read(reads("sni"), sni);
        }
        Action::Mcp { method, server } => {
            key.put("mcp");
            key.read(reads("method"), method);
            key.read(reads("server"), server);
        }
        Action::Spawn { child } => {
            key.put("spawn");
            key.put(child);
        }
        Action::Trigger {
            name,
            kind,
            payload,
            approval,
        } => {
            key.put("trigger");
            key.put(name);
            key.put(kind);
            key.put(&payload.to_string());
            key.approval(approval);
        }
        Action::Tool {
            name,
            args,
            impact_records,
            cost_micros,
            approval,
            undo,
        } => {
            key.put(if *undo { "undo" } else { "tool" });
            key.put(name);
            key.put(&args.to_string());
            key.approval(approval);
            let impact = reads("impact");
            key.number(impact.then_some(*impact_records));
            key.number(impact.then_some(*cost_micros));
        }
    }
    if reads("session") {
        let s = &req.session;
        for attr in session {
            key.put(attr);
            match attr.as_str() {
                "depth" => key.number(Some(s.depth)),
                "parent_agent" => key.put(&s.parent_agent),
                "profile" => key.put(&s.profile),
                "labels" => {
                    key.number(Some(s.labels.len() as i64));
                    s.labels.iter().for_each(|label| key.put(label));
                }
                // Not an attribute of the session (strict validation refuses a policy that
                // names one), so no value can differ; named in the key all the same.
                _ => {}
            }
        }
    }
    key.0
}

/// A key being written: strings with their length before them, numbers ended by a `;`.
struct Key(String);

impl Key {
    // Numbers through `itoa`: the key is built for every decision, and `write!` costs
    // several times the copy it formats.
    fn put(&mut self, field: &str) {
        self.0.push_str(itoa::Buffer::new().format(field.len()));
        self.0.push(':');
        self.0.push_str(field);
    }

    /// A field some policy reads, or a place holder the same for every request.
    fn read(&mut self, read: bool, field: &str) {
        self.put(if read { field } else { "" });
    }

    fn number(&mut self, number: Option<i64>) {
        match number {
            Some(n) => {
                self.0.push_str(itoa::Buffer::new().format(n));
                self.0.push(';');
            }
            None => self.0.push(';'),
        }
    }

    /// Granted or not, and by whom.
    fn approval(&mut self, approval: &Option<String>) {
        match approval {
            None => self.0.push('-'),
            Some(approver) => {
                self.0.push('+');
                self.put(approver);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SessionState;
    use serde_json::json;

    fn http(path: &str) -> AccessRequest {
        AccessRequest {
            agent: "a".into(),
            tenant: "t".into(),
            host: "h.example".into(),
            session: SessionState::default(),
            action: Action::Http {
                method: "GET".into(),
                scheme: "https".into(),
                port: 443,
                path: path.into(),
                query: String::new(),
            },
        }
    }

    fn tool(args: serde_json::Value, approval: Option<&str>) -> AccessRequest {
        AccessRequest {
            action: Action::Tool {
                name: "t".into(),
                args,
                impact_records: 1,
                cost_micros: 0,
                approval: approval.map(str::to_owned),
                undo: false,
            },
            ..http("/")
        }
    }

    fn session(attrs: &[&str]) -> BTreeSet<String> {
        attrs.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn only_what_a_policy_reads_tells_two_requests_apart() {
        let none = |_: &str| false;
        let path = |attr: &str| attr == "path";
        let empty = session(&[]);
        assert_eq!(
            key(&http("/a"), &none, &empty),
            key(&http("/b"), &none, &empty)
        );
        assert_ne!(
            key(&http("/a"), &path, &empty),
            key(&http("/b"), &path, &empty)
        );
        let mut other = http("/a");
        other.host = "i.example".into();
        assert_ne!(key(&http("/a"), &none, &empty), key(&other, &none, &empty));
        // Arguments and the approval always count: they decide without the context.
        assert_ne!(
            key(&tool(json!({"x": 1}), None), &none, &empty),
            key(&tool(json!({"x": "1"}), None), &none, &empty)
        );
        assert_ne!(
            key(&tool(json!({}), None), &none, &empty),
            key(&tool(json!({}), Some("")), &none, &empty)
        );
        // The session's attributes, only those read.
        let reads_session = |attr: &str| attr == "session";
        let mut deeper = http("/a");
        deeper.session.depth = 1;
        deeper.session.calls = 7;
        assert_eq!(
            key(&http("/a"), &reads_session, &session(&["parent_agent"])),
            key(&deeper, &reads_session, &session(&["parent_agent"]))
        );
        assert_ne!(
            key(&http("/a"), &reads_session, &session(&["depth"])),
            key(&deeper, &reads_session, &session(&["depth"]))
        );
    }

    #[test]
    fn the_key_spells_each_field_with_its_length_and_each_number_with_a_semicolon() {
        let all = |_: &str| true;
        let mut req = tool(json!({"q": "ab"}), Some("ann"));
        req.session.depth = 12;
        req.session.labels = session(&["pii"]);
        assert_eq!(
            key(&req, &all, &session(&["depth", "labels"])),
            "1:a1:t9:h.example4:tool1:t10:{\"q\":\"ab\"}+3:ann1;0;5:depth12;6:labels1;3:pii"
        );
        assert_eq!(
            key(&http("/p"), &all, &session(&[])),
            "1:a1:t9:h.example4:http3:GET5:https443;2:/p0:"
        );
    }

    #[test]
    fn fields_cannot_run_into_each_other() {
        let none = |_: &str| false;
        let empty = session(&[]);
        let mut a = http("/");
        a.agent = "ab".into();
        a.tenant = "c".into();
        let mut b = http("/");
        b.agent = "a".into();
        b.tenant = "bc".into();
        assert_ne!(key(&a, &none, &empty), key(&b, &none, &empty));
    }

    /// Ask `memo` about `req` `times` times (every context attribute read, or none): how
    /// many decisions had to be made.
    fn decisions_made(memo: &Memo, req: &AccessRequest, reads: bool, times: usize) -> usize {
        let mut made = 0;
        for _ in 0..times {
            memo.decide(
                req,
                |_| reads,
                || {
                    made += 1;
                    Decision::Allow {
                        policies: vec!["p".into()],
                    }
                },
            );
        }
        made
    }

    #[test]
    fn keeps_a_decision_once_and_stays_bounded() {
        let memo = Memo::new(Some(&session(&["depth"])));
        assert_eq!(
            decisions_made(&memo, &http("/"), false, 3),
            1,
            "asked again, the kept decision answers"
        );
        for i in 0..CAPACITY + 10 {
            let mut req = http("/");
            req.host = format!("h{i}");
            decisions_made(&memo, &req, false, 1);
        }
        assert!(memo.len() <= CAPACITY, "bounded: {}", memo.len());
    }

    #[test]
    fn a_question_too_long_to_keep_is_decided_every_time() {
        let memo = Memo::new(Some(&session(&[])));
        let large = tool(json!({ "text": "x".repeat(LONGEST_KEY) }), None);
        assert_eq!(
            (decisions_made(&memo, &large, false, 2), memo.len()),
            (2, 0)
        );
        decisions_made(&memo, &tool(json!({ "text": "x" }), None), false, 1);
        assert_eq!(memo.len(), 1, "a short one is kept");
    }

    #[test]
    fn sets_reading_what_changes_every_call_keep_nothing() {
        for read in [
            None,
            Some(session(&["calls"])),
            Some(session(&["depth", "recent"])),
        ] {
            let memo = Memo::new(read.as_ref());
            let made = decisions_made(&memo, &http("/"), true, 2);
            assert_eq!((made, memo.len()), (2, 0), "{read:?}");
        }
    }
}
