//! Tool arguments in Cedar: the type of `context.args` derived from a tool's JSON Schema, and
//! the conversion of one call's JSON arguments into a Cedar value of that type.
//!
//! The mapping follows the Cedar team's cedar-policy-mcp-schema-generator in spirit, kept to
//! the part that has an exact Cedar meaning:
//!
//! | JSON Schema                               | Cedar                                   |
//! |-------------------------------------------|-----------------------------------------|
//! | `string`                                  | `String`                                |
//! | `integer`                                 | `Long`                                  |
//! | `boolean`                                 | `Bool`                                  |
//! | `object` with `properties`                | record; `required` ⇒ required, else `?` |
//! | `array` with mappable `items`             | `Set<item>`                             |
//! | `[T, "null"]`                             | `T`, optional (null = absent)           |
//!
//! Left out of the record (and listed as a comment in the generated schema) — a policy cannot
//! read them, and strict validation rejects one that tries:
//! - `number`: Cedar has no floats, and `decimal` holds four fractional digits, so a value
//!   would be rounded or refused depending on its digits; a policy comparing a rounded amount
//!   is worse than no policy. Declare `integer` (e.g. cents) to make an amount readable.
//! - objects without `properties`, arrays without (mappable) `items`, `anyOf`/`oneOf`/
//!   `allOf`/`$ref`, unions of several types, and anything nested deeper than [`MAX_DEPTH`].
//!
//! The top level must describe an object: arguments are always one (MCP `arguments`, or the
//! REST path parameters, query and body merged).
//!
//! Conversion is strict where the record is typed (a string where a `Long` is declared, a
//! missing required property, an extra property under `additionalProperties: false`) and
//! ignores what the record leaves out. A mismatch is an error the engine turns into a deny.
//! Other JSON Schema keywords (`enum`, `pattern`, `minimum`, ...) are not checked here.

use std::fmt::Write as _;

use cedar_policy::RestrictedExpression;
use serde_json::Value;

use crate::conditions::Known;

/// Deepest nesting of records and sets mapped; deeper schema parts are left out.
pub const MAX_DEPTH: usize = 16;

/// A Cedar type an argument maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CedarType {
    String,
    Long,
    Bool,
    Set(Box<CedarType>),
    Record(RecordType),
}

/// A record type: its attributes, and whether properties outside them are a mismatch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RecordType {
    attrs: Vec<Attr>,
    /// `additionalProperties: false`: an undeclared property is a mismatch.
    closed: bool,
    /// Properties declared in the schema but left out of the record: present in a call, they
    /// are not "additional", so even a closed record accepts them.
    omitted: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Attr {
    name: String,
    ty: CedarType,
    required: bool,
}

/// A schema location left out of `context.args`, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Omitted {
    /// Dotted path from `args`, e.g. `args.options.ratio`.
    pub path: String,
    pub why: &'static str,
}

/// The key two keys are compared under: Unicode simple case folding, approximated by
/// upper-then-lower casing each character (which folds `K`, `ſ` and `ß` as Go's
/// `EqualFold` does, or more: refusing a few more documents is the safe side).
pub fn fold(key: &str) -> String {
    if key.is_ascii() {
        return key.to_ascii_lowercase();
    }
    key.chars()
        .flat_map(char::to_uppercase)
        .flat_map(char::to_lowercase)
        .collect()
}

/// Whether `a` and `b` are equal ignoring case, as [`fold`] compares them.
pub fn same_folded(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        a.eq_ignore_ascii_case(b)
    } else {
        fold(a) == fold(b)
    }
}

/// An argument spelled in another case than the property its schema declares there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misspelled {
    /// Where the key is, dotted from `args` (`args.options`).
    pub at: String,
    /// The key as the call spells it.
    pub given: String,
    /// The property the schema declares.
    pub declared: String,
}

/// The first key of `json` that differs only in letter case from a property `schema`
/// declares at the same place (`Path` where `path` is declared), in objects and in the
/// items of arrays, at any depth the schema describes.
///
/// Policy reads `args.path` and the schema checks `path`; an upstream that decodes case-
/// insensitively (Go's `encoding/json` into a struct, .NET, Jackson in that mode) runs
/// `Path` as `path`. So such a call is refused rather than decided without the value.
pub fn misspelled(schema: &Value, json: &Value) -> Option<Misspelled> {
    misspelled_at(schema, json, &mut String::from("args"), 0)
}

fn misspelled_at(
    schema: &Value,
    json: &Value,
    at: &mut String,
    depth: usize,
) -> Option<Misspelled> {
    // The JSON itself is at most 128 deep (the parser's limit); the bound keeps a
    // self-similar schema from mattering.
    if depth > 128 {
        return None;
    }
    match json {
        Value::Object(members) => {
            let properties = schema.get("properties").and_then(Value::as_object)?;
            for (key, value) in members {
                match properties.get(key) {
                    Some(property) => {
                        let len = at.len();
                        at.push('.');
                        at.push_str(key);
                        let found = misspelled_at(property, value, at, depth + 1);
                        at.truncate(len);
                        if found.is_some() {
                            return found;
                        }
                    }
                    None => {
                        if let Some(declared) = properties.keys().find(|p| same_folded(p, key)) {
                            return Some(Misspelled {
                                at: at.clone(),
                                given: key.clone(),
                                declared: declared.clone(),
                            });
                        }
                    }
                }
            }
            None
        }
        Value::Array(items) => {
            let item = schema.get("items")?;
            items
                .iter()
                .find_map(|value| misspelled_at(item, value, at, depth + 1))
        }
        _ => None,
    }
}

/// Cedar identifiers (and our path parameter names): `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_identifier(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The `args` record of a tool's top-level JSON Schema, and what it left out.
pub(crate) fn from_json_schema(schema: &Value) -> Result<(RecordType, Vec<Omitted>), String> {
    let is_object = match schema.get("type") {
        Some(Value::String(t)) => t == "object",
        None => schema.get("properties").is_some(),
        Some(_) => false,
    };
    if !is_object {
        return Err("the top level must describe an object (type = \"object\")".into());
    }
    let mut omitted = Vec::new();
    let record = record(schema, "args", 0, &mut omitted);
    Ok((record, omitted))
}

fn record(schema: &Value, path: &str, depth: usize, omitted: &mut Vec<Omitted>) -> RecordType {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = RecordType {
        closed: schema.get("additionalProperties") == Some(&Value::Bool(false)),
        ..RecordType::default()
    };
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return out;
    };
    for (name, prop) in properties {
        let prop_path = format!("{path}.{name}");
        match map(prop, &prop_path, depth + 1, omitted) {
            Ok((ty, nullable)) => out.attrs.push(Attr {
                name: name.clone(),
                ty,
                required: !nullable && required.contains(&name.as_str()),
            }),
            Err(why) => {
                out.omitted.push(name.clone());
                omitted.push(Omitted {
                    path: prop_path,
                    why,
                });
            }
        }
    }
    out
}

/// The Cedar type of one schema, and whether it admits `null`.
fn map(
    schema: &Value,
    path: &str,
    depth: usize,
    omitted: &mut Vec<Omitted>,
) -> Result<(CedarType, bool), &'static str> {
    if depth > MAX_DEPTH {
        return Err("nested deeper than the mapping goes");
    }
    let (ty, nullable) = match schema.get("type") {
        Some(Value::String(t)) => (t.as_str(), false),
        Some(Value::Array(types)) => {
            let non_null: Vec<&str> = types
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect();
            match non_null.as_slice() {
                [one] => (*one, non_null.len() < types.len()),
                _ => return Err("a union of several types has no Cedar type"),
            }
        }
        _ => return Err("no single `type` (anyOf/oneOf/$ref are not mapped)"),
    };
    let cedar = match ty {
        "string" => CedarType::String,
        "integer" => CedarType::Long,
        "boolean" => CedarType::Bool,
        "number" => return Err("`number` has no exact Cedar type; declare `integer`"),
        "object" if schema.get("properties").is_some() => {
            CedarType::Record(record(schema, path, depth, omitted))
        }
        "object" => return Err("an object without `properties` has no Cedar record type"),
        "array" => {
            let Some(items) = schema.get("items") else {
                return Err("an array without `items` has no Cedar set type");
            };
            match map(items, &format!("{path}[]"), depth + 1, omitted) {
                // A null item cannot be a set element; `nullable` items are refused by value.
                Ok((item, _)) => CedarType::Set(Box::new(item)),
                Err(_) => return Err("its `items` have no Cedar type"),
            }
        }
        _ => return Err("unknown `type`"),
    };
    Ok((cedar, nullable))
}

impl RecordType {
    /// Declare `name` as a required `String` unless the schema already types it.
    pub(crate) fn ensure_string(&mut self, name: &str) {
        if !self.attrs.iter().any(|a| a.name == name) {
            self.omitted.retain(|o| o != name);
            self.attrs.push(Attr {
                name: name.to_owned(),
                ty: CedarType::String,
                required: true,
            });
        }
    }

    /// The record in Cedar schema syntax, attributes quoted (any JSON key is a valid quoted
    /// Cedar attribute name), indented by `indent` levels.
    pub(crate) fn write(&self, out: &mut String, indent: usize) {
        if self.attrs.is_empty() {
            out.push_str("{}");
            return;
        }
        out.push_str("{\n");
        for attr in &self.attrs {
            let pad = "  ".repeat(indent + 1);
            let opt = if attr.required { "" } else { "?" };
            // Debug formatting of a str is a Rust string literal, whose escapes (`\"`, `\\`,
            // `\n`, `\u{..}`) are Cedar's too.
            let _ = write!(out, "{pad}{:?}{opt}: ", attr.name);
            attr.ty.write(out, indent + 1);
            out.push_str(",\n");
        }
        out.push_str(&"  ".repeat(indent));
        out.push('}');
    }

    /// Convert one call's arguments to a Cedar record of this type.
    pub(crate) fn value(&self, json: &Value, path: &str) -> Result<RestrictedExpression, String> {
        let Value::Object(map) = json else {
            return Err(format!("{path}: expected an object, got {}", kind(json)));
        };
        if self.closed {
            if let Some(extra) = map
                .keys()
                .find(|k| !self.attrs.iter().any(|a| &a.name == *k) && !self.omitted.contains(k))
            {
                return Err(format!(
                    "{path}.{extra}: not allowed (additionalProperties is false)"
                ));
            }
        }
        let mut fields = Vec::with_capacity(self.attrs.len());
        for attr in &self.attrs {
            let attr_path = format!("{path}.{}", attr.name);
            match map.get(&attr.name) {
                None | Some(Value::Null) if !attr.required => {}
                None => return Err(format!("{attr_path}: required, but missing")),
                Some(value) => fields.push((attr.name.clone(), attr.ty.value(value, &attr_path)?)),
            }
        }
        RestrictedExpression::new_record(fields).map_err(|e| format!("{path}: {e}"))
    }
}

impl RecordType {
    /// The names of the attributes the record declares.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.attrs.iter().map(|a| a.name.as_str())
    }

    /// One record several records' values can all be given as: every attribute any of them
    /// declares, optional (a value of one record need not have another's), except those
    /// declared with different types, which are left out and named in the second part.
    pub(crate) fn merged<'a>(
        records: impl IntoIterator<Item = &'a RecordType>,
    ) -> (Self, Vec<String>) {
        let mut out = RecordType::default();
        let mut clashes: Vec<String> = Vec::new();
        for record in records {
            for attr in &record.attrs {
                if clashes.contains(&attr.name) {
                    continue;
                }
                match out.attrs.iter().position(|a| a.name == attr.name) {
                    None => out.attrs.push(Attr {
                        required: false,
                        ..attr.clone()
                    }),
                    Some(i) if out.attrs[i].ty == attr.ty => {}
                    Some(i) => {
                        out.attrs.remove(i);
                        clashes.push(attr.name.clone());
                    }
                }
            }
        }
        out.attrs.sort_by(|a, b| a.name.cmp(&b.name));
        clashes.sort();
        (out, clashes)
    }

    /// This record without the attributes `left_out` names; a value holding one of them is
    /// still accepted where the record is closed (the schema declared it).
    pub(crate) fn without(&self, left_out: &[String]) -> Self {
        let mut out = self.clone();
        let (dropped, kept) = out
            .attrs
            .into_iter()
            .partition(|a| left_out.contains(&a.name));
        out.attrs = kept;
        out.omitted
            .extend(dropped.into_iter().map(|a: Attr| a.name));
        out
    }
}

impl RecordType {
    /// The Cedar value at `path` inside `json` converted to this type, where it is a scalar
    /// the record declares (a record or set: [`Known::Other`]); `None` where the attribute
    /// is absent, null or not declared. A value of the wrong type makes the whole conversion
    /// an error, so what it is here does not matter.
    pub(crate) fn known<'a>(&self, json: &'a Value, path: &[String]) -> Option<Known<'a>> {
        let (first, rest) = path.split_first()?;
        let attr = self.attrs.iter().find(|a| a.name == *first)?;
        attr.ty.known(json.as_object()?.get(first)?, rest)
    }
}

impl CedarType {
    fn known<'a>(&self, json: &'a Value, rest: &[String]) -> Option<Known<'a>> {
        match (self, json) {
            (CedarType::Record(record), Value::Object(_)) if !rest.is_empty() => {
                record.known(json, rest)
            }
            _ if !rest.is_empty() => None,
            (CedarType::String, Value::String(s)) => Some(Known::Str(s)),
            (CedarType::Long, Value::Number(n)) => integer(n).map(Known::Long),
            (CedarType::Bool, Value::Bool(b)) => Some(Known::Bool(*b)),
            (CedarType::Set(_), Value::Array(_)) | (CedarType::Record(_), Value::Object(_)) => {
                Some(Known::Other)
            }
            _ => None,
        }
    }

    fn write(&self, out: &mut String, indent: usize) {
        match self {
            CedarType::String => out.push_str("String"),
            CedarType::Long => out.push_str("Long"),
            CedarType::Bool => out.push_str("Bool"),
            CedarType::Set(item) => {
                out.push_str("Set<");
                item.write(out, indent);
                out.push('>');
            }
            CedarType::Record(record) => record.write(out, indent),
        }
    }

    fn value(&self, json: &Value, path: &str) -> Result<RestrictedExpression, String> {
        let mismatch = |expected: &str| format!("{path}: expected {expected}, got {}", kind(json));
        match (self, json) {
            (CedarType::String, Value::String(s)) => {
                Ok(RestrictedExpression::new_string(s.clone()))
            }
            (CedarType::Long, Value::Number(n)) => integer(n)
                .map(RestrictedExpression::new_long)
                .ok_or_else(|| {
                    format!("{path}: expected an integer in the 64-bit range, got another number")
                }),
            (CedarType::Bool, Value::Bool(b)) => Ok(RestrictedExpression::new_bool(*b)),
            (CedarType::Set(item), Value::Array(items)) => {
                let values = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| item.value(v, &format!("{path}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(RestrictedExpression::new_set(values))
            }
            (CedarType::Record(record), Value::Object(_)) => record.value(json, path),
            (CedarType::String, _) => Err(mismatch("a string")),
            (CedarType::Long, _) => Err(mismatch("an integer")),
            (CedarType::Bool, _) => Err(mismatch("a boolean")),
            (CedarType::Set(_), _) => Err(mismatch("an array")),
            (CedarType::Record(_), _) => Err(mismatch("an object")),
        }
    }
}

/// The integer a JSON number denotes, if it is one in the 64-bit range: `1000`, and also
/// `1000.0` and `1e3` — JSON Schema's `integer` admits them, and Cedar's `Long` holds them as
/// 1000. The one rule for every place that reads a JSON number as an integer (`args`, the
/// catalog's `impact.records`), so that the argument checked and the count policy reads agree.
pub(crate) fn integer(n: &serde_json::Number) -> Option<i64> {
    n.as_i64().or_else(|| integral(n.as_f64()?))
}

/// JSON Schema's `integer` admits `3.0`; Cedar's `Long` holds it as 3.
fn integral(f: f64) -> Option<i64> {
    // The range check makes the cast exact (`as` saturates, so it is never undefined).
    (f.fract() == 0.0 && f.abs() < 9.0e18).then_some(f as i64)
}

/// What a JSON value is, for messages that must not quote it.
pub(crate) fn kind(json: &Value) -> &'static str {
    match json {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
