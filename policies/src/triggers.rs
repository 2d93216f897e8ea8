//! Triggers as policies see them (docs/design.md §4): `Action::"trigger"`, with the trigger
//! as resource (`Trigger::"<name>"`, attributes `name` and `kind`) and its validated payload
//! in `context.payload`.
//!
//! # The payload's type
//! Cedar gives an action one context type, and every trigger shares the one action, so
//! `context.payload` is one record for all of them: every attribute some trigger's JSON
//! Schema declares (mapped as tool arguments are, [`crate::args`]), each **optional** — a
//! payload of one trigger need not carry another's attributes, so a policy tests
//! `context.payload has ref` before it reads `context.payload.ref` (strict validation
//! insists). An attribute two triggers declare with different types is left out for all of
//! them (named in the generated schema), as is everything a schema leaves out of a record.
//! A trigger without a schema has an empty payload.
//!
//! Each trigger's payload is converted with its own record (what its schema declares and
//! the merged type kept), so a value is only ever read under the type its own trigger
//! declared: another trigger declaring the same name cannot make a payload that does not
//! mention it fail, and a payload's undeclared fields never reach a policy.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::args::RecordType;

/// One trigger of the config (`[[trigger]]`), as much as policies need of it.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerDef {
    pub name: String,
    /// `webhook`, `schedule` or `api`.
    pub kind: String,
    /// The JSON Schema its payload satisfies (already resolved from a path), if any.
    pub schema: Option<Value>,
}

/// The triggers a policy set is loaded with: the payload type and each trigger's record.
#[derive(Debug, Clone, Default)]
pub struct Triggers {
    payload: RecordType,
    each: HashMap<String, Model>,
    /// Why parts of schemas are not in the payload type: comments of the generated schema.
    notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Model {
    pub payload: RecordType,
}

impl Triggers {
    /// The model of `defs` (sorted by name in what it reports, whatever their order).
    pub fn new(defs: &[TriggerDef]) -> Self {
        let mut notes = Vec::new();
        let mut own: Vec<(&TriggerDef, RecordType)> = Vec::with_capacity(defs.len());
        for def in defs {
            let record = match &def.schema {
                None => RecordType::default(),
                Some(schema) => match crate::args::from_json_schema(schema) {
                    Ok((record, omitted)) => {
                        for o in omitted {
                            let path = o.path.replacen("args", "payload", 1);
                            notes.push(format!(
                                "trigger {}: {} left out: {}",
                                def.name,
                                path.escape_debug(),
                                o.why
                            ));
                        }
                        record
                    }
                    Err(why) => {
                        notes.push(format!("trigger {}: payload left out: {why}", def.name));
                        RecordType::default()
                    }
                },
            };
            own.push((def, record));
        }
        let (payload, clashes) = RecordType::merged(own.iter().map(|(_, r)| r));
        for name in &clashes {
            notes.push(format!(
                "payload.{} left out: triggers declare it with different types",
                name.escape_debug()
            ));
        }
        notes.sort();
        let each = own
            .into_iter()
            .map(|(def, record)| {
                let model = Model {
                    payload: record.without(&clashes),
                };
                (def.name.clone(), model)
            })
            .collect();
        Self {
            payload,
            each,
            notes,
        }
    }

    /// No trigger at all.
    pub fn is_empty(&self) -> bool {
        self.each.is_empty()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Model> {
        self.each.get(name)
    }

    /// The `trigger` action of the schema, with the payload type.
    pub(crate) fn write_action(&self, out: &mut String) {
        out.push_str(
            "\n  // Triggers ([[trigger]] of the config): a trigger about to start a run.\n",
        );
        out.push_str(
            "  // Every payload attribute is optional: test `context.payload has <name>` first.\n",
        );
        for note in &self.notes {
            let _ = writeln!(out, "  // {note}");
        }
        out.push_str(
            "  action \"trigger\" appliesTo {\n    principal: [Agent],\n    resource: [Trigger],\n    \
             context: {\n      payload: ",
        );
        self.payload.write(out, 3);
        out.push_str(",\n      session: Session,\n      approval: Approval,\n    },\n  };\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(name: &str, schema: Option<Value>) -> TriggerDef {
        TriggerDef {
            name: name.into(),
            kind: "webhook".into(),
            schema,
        }
    }

    #[test]
    fn attributes_are_merged_optional_and_clashes_left_out() {
        let triggers = Triggers::new(&[
            def(
                "gh",
                Some(json!({"type": "object", "required": ["ref", "n"],
                    "properties": {"ref": {"type": "string"}, "n": {"type": "integer"},
                                   "f": {"type": "number"}}})),
            ),
            def(
                "stripe",
                Some(json!({"type": "object",
                    "properties": {"n": {"type": "string"}, "amount": {"type": "integer"}}})),
            ),
            def("bare", None),
            def("odd", Some(json!({"type": "array"}))),
        ]);
        let mut text = String::new();
        triggers.write_action(&mut text);
        assert!(text.contains("\"ref\"?: String"), "{text}");
        assert!(text.contains("\"amount\"?: Long"), "{text}");
        assert!(!text.contains("\"n\""), "a clash is left out: {text}");
        assert!(text.contains("payload.n left out"), "{text}");
        assert!(text.contains("trigger gh: payload.f left out"), "{text}");
        assert!(text.contains("trigger odd: payload left out"), "{text}");
        // gh keeps `ref` required for its own payloads, but not the clashing `n`.
        let gh = &triggers.get("gh").unwrap().payload;
        assert_eq!(gh.names().collect::<Vec<_>>(), ["ref"]);
        assert!(gh.value(&json!({"ref": "x", "n": 1}), "payload").is_ok());
        assert!(gh.value(&json!({"n": 1}), "payload").is_err());
        assert!(triggers
            .get("bare")
            .unwrap()
            .payload
            .names()
            .next()
            .is_none());
    }
}

/// Triggers decided by the engine: contexts as the schema types them, kinds, payloads,
/// escalation.
#[cfg(test)]
mod decisions {
    use cedar_policy::{Context, EntityUid, Request};

    use crate::decide::{Decision, DenyReason};
    use crate::load::{PolicyEngine, PolicySource};
    use crate::request::{AccessRequest, Action, SessionState};

    fn request(action: Action) -> AccessRequest {
        AccessRequest {
            agent: "a".into(),
            tenant: "t".into(),
            host: "h".into(),
            session: SessionState {
                depth: 1,
                parent_agent: "root".into(),
                ..SessionState::default()
            },
            action,
        }
    }

    fn trigger_engine(policies: &str) -> PolicyEngine {
        let triggers = crate::triggers::Triggers::new(&[
            crate::triggers::TriggerDef {
                name: "gh-push".into(),
                kind: "webhook".into(),
                schema: Some(serde_json::json!({
                    "type": "object", "required": ["ref"],
                    "properties": {"ref": {"type": "string"}, "size": {"type": "integer"}}
                })),
            },
            crate::triggers::TriggerDef {
                name: "nightly".into(),
                kind: "schedule".into(),
                schema: None,
            },
        ]);
        PolicyEngine::with_triggers(
            &[PolicySource {
                name: "t.cedar".into(),
                text: policies.into(),
            }],
            crate::catalog::Catalog::default(),
            &triggers,
        )
        .unwrap()
    }

    fn trigger(name: &str, kind: &str, payload: serde_json::Value) -> AccessRequest {
        request(Action::Trigger {
            name: name.into(),
            kind: kind.into(),
            payload,
            approval: None,
        })
    }

    /// A trigger's context, with its payload converted by the engine, is what the schema
    /// declares; the payload's undeclared fields are not in it.
    #[test]
    fn built_trigger_contexts_match_the_schema() {
        let engine = trigger_engine("permit (principal, action, resource);");
        let names = engine.names();
        let model = names.triggers.get("gh-push").unwrap();
        let req = trigger(
            "gh-push",
            "webhook",
            serde_json::json!({"ref": "main", "x": [1]}),
        );
        let Action::Trigger { payload, .. } = &req.action else {
            unreachable!()
        };
        let mut pairs = req.context_pairs().unwrap();
        pairs.push((
            "payload".into(),
            model.payload.value(payload, "payload").unwrap(),
        ));
        let context = Context::from_pairs(pairs).unwrap();
        let principal: EntityUid = "Ostiary::Agent::\"a\"".parse().unwrap();
        let resource: EntityUid = req.resource().parse().unwrap();
        Request::new(
            principal,
            names.trigger.clone(),
            resource,
            context,
            Some(engine.schema()),
        )
        .unwrap();
        assert!(engine.decide(&req).is_allow());
    }

    #[test]
    fn triggers_are_decided_on_their_kind_and_payload_and_escalate() {
        let engine = trigger_engine(
            r#"
            @id("pushes")
            permit (principal == Ostiary::Agent::"a", action == Ostiary::Action::"trigger", resource)
            when { resource.kind == "webhook" && context.payload has ref };
            @id("main-needs-human")
            @escalate("approval")
            forbid (principal, action == Ostiary::Action::"trigger", resource == Ostiary::Trigger::"gh-push")
            when { context.payload has ref && context.payload.ref == "main" }
            unless { context.approval.granted };
            @id("schedules")
            permit (principal, action, resource is Ostiary::Trigger)
            when { resource.kind == "schedule" && context.session.depth == 1 };
            "#,
        );
        let branch = trigger("gh-push", "webhook", serde_json::json!({"ref": "dev"}));
        assert_eq!(engine.decide(&branch).policies(), ["pushes"]);
        assert!(engine.decide(&branch).is_allow());
        let main = trigger("gh-push", "webhook", serde_json::json!({"ref": "main"}));
        assert!(
            matches!(engine.decide(&main), Decision::Escalate { ref policies } if policies == &["main-needs-human"]),
            "{:?}",
            engine.decide(&main)
        );
        let mut approved = main.clone();
        *approved.action.approval_mut().unwrap() = Some("alice".into());
        assert!(engine.decide(&approved).is_allow());
        // The payload's type is the trigger's: a wrong one is a deny, not a silent skip.
        let wrong = trigger("gh-push", "webhook", serde_json::json!({"ref": 7}));
        assert!(matches!(
            engine.decide(&wrong),
            Decision::Deny {
                reason: DenyReason::EvaluationError(_),
                ..
            }
        ));
        // A schedule has no payload attributes; its decision reads the session.
        let tick = trigger("nightly", "schedule", serde_json::json!({"ref": "main"}));
        assert_eq!(engine.decide(&tick).policies(), ["schedules"]);
        // Indexed and unindexed agree on each.
        for req in [branch, main, approved, wrong, tick] {
            assert_eq!(engine.decide(&req), engine.decide_unindexed(&req));
        }
    }

    #[test]
    fn a_policy_reading_an_undeclared_payload_attribute_does_not_load() {
        let triggers = crate::triggers::Triggers::new(&[]);
        let err = PolicyEngine::with_triggers(
            &[PolicySource {
                name: "t.cedar".into(),
                text: r#"permit (principal, action == Ostiary::Action::"trigger", resource)
                         when { context.payload.ref == "main" };"#
                    .into(),
            }],
            crate::catalog::Catalog::default(),
            &triggers,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("t.cedar") || format!("{err:?}").contains("ref"),
            "{err:?}"
        );
    }
}
