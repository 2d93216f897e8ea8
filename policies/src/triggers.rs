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
