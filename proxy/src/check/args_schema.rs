//! The `args_schema` check: a tool call's arguments against the full JSON Schema its
//! catalog entry gives (`args_schema`), not only the subset Cedar types (which `evaluate`
//! already enforces): `pattern`, `format`, `minimum`, `enum`, `additionalProperties`, ...
//!
//! Schemas are compiled once and kept, keyed by their text: a reload that leaves a tool's
//! schema as it was reuses the compiled validator, and a changed schema is a new key, so a
//! policy-set version never validates against another version's schema.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ostiary_policies::Tool;
use serde_json::Value;

/// Distinct schemas kept at most; past this the cache starts over (a catalog has tens).
const MAX_COMPILED: usize = 4096;

/// Compiled validators by schema text.
#[derive(Default)]
pub struct Schemas {
    compiled: Mutex<HashMap<String, Arc<Result<jsonschema::Validator, String>>>>,
}

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.compiled.lock().map(|c| c.len()).unwrap_or(0);
        f.debug_struct("Schemas").field("compiled", &n).finish()
    }
}

impl Schemas {
    /// Check `args` against `tool`'s schema. `Err` says where and which keyword failed,
    /// never the value (arguments may carry secrets).
    pub fn check(&self, tool: &Tool, args: &Value) -> Result<(), String> {
        let (Some(schema), Some(text)) = (tool.args_schema(), tool.args_schema_text()) else {
            return Ok(());
        };
        let validator = self.validator(schema, text);
        match validator.as_ref() {
            Ok(validator) => match validator.validate(args) {
                Ok(()) => Ok(()),
                Err(e) => {
                    let at = e.instance_path().to_string();
                    Err(format!(
                        "args{} does not satisfy the schema's `{}`",
                        if at.is_empty() { String::new() } else { at },
                        e.kind().keyword()
                    ))
                }
            },
            // Fail closed: a schema that cannot be compiled admits nothing.
            Err(e) => Err(format!("the tool's args_schema cannot be used: {e}")),
        }
    }

    /// The validator of `schema`, whose JSON text is `text` (made once, when the catalog
    /// was loaded: serialising the schema on every call cost more than validating).
    fn validator(&self, schema: &Value, text: &str) -> Arc<Result<jsonschema::Validator, String>> {
        if let Ok(compiled) = self.compiled.lock() {
            if let Some(v) = compiled.get(text) {
                return v.clone();
            }
        }
        // Compiled outside the lock: a slow schema must not stall other requests.
        let built = Arc::new(jsonschema::validator_for(schema).map_err(|e| e.to_string()));
        if let Ok(mut compiled) = self.compiled.lock() {
            if compiled.len() >= MAX_COMPILED {
                compiled.clear();
            }
            compiled.insert(text.to_owned(), built.clone());
        }
        built
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostiary_policies::Catalog;
    use serde_json::json;

    fn tool(schema: &str) -> Catalog {
        let text = format!(
            "[[tool]]\nname = \"t\"\ntier = \"write\"\nmatch = {{ host = \"h\", method = \"POST\", path = \"/x\" }}\nargs_schema = {schema}\n"
        );
        Catalog::parse("tools.toml", &text, None).unwrap()
    }

    #[test]
    fn the_full_schema_is_checked_and_the_value_never_named() {
        let catalog = tool(
            r#"{ type = "object", properties = { title = { type = "string", pattern = "^[A-Z]" }, n = { type = "integer", maximum = 10 } }, additionalProperties = false }"#,
        );
        let t = catalog.get("t").unwrap();
        let schemas = Schemas::default();
        assert!(schemas.check(t, &json!({"title": "Bug", "n": 3})).is_ok());
        let e = schemas
            .check(t, &json!({"title": "secret-lowercase"}))
            .unwrap_err();
        assert!(e.contains("/title") && e.contains("pattern"), "{e}");
        assert!(!e.contains("secret-lowercase"), "{e}");
        let e = schemas.check(t, &json!({"n": 11})).unwrap_err();
        assert!(e.contains("maximum"), "{e}");
        let e = schemas.check(t, &json!({"extra": 1})).unwrap_err();
        assert!(e.contains("additionalProperties"), "{e}");
        assert_eq!(schemas.compiled.lock().unwrap().len(), 1, "compiled once");
    }

    /// The key is the text the catalog wrote at load: a reload that changes a tool's schema
    /// is checked against the new one, never the validator compiled for the old, and one
    /// that leaves it as it was reuses the compiled validator.
    #[test]
    fn a_reloaded_schema_is_found_by_its_own_text() {
        const STRICT: &str =
            r#"{ type = "object", properties = { n = { type = "integer", maximum = 10 } } }"#;
        let schemas = Schemas::default();
        let strict = tool(STRICT);
        let loose =
            tool(r#"{ type = "object", properties = { n = { type = "integer", maximum = 99 } } }"#);
        let (strict, loose) = (strict.get("t").unwrap(), loose.get("t").unwrap());
        assert!(schemas.check(strict, &json!({"n": 50})).is_err());
        assert!(schemas.check(loose, &json!({"n": 50})).is_ok());
        assert!(schemas.check(strict, &json!({"n": 50})).is_err());
        assert_eq!(schemas.compiled.lock().unwrap().len(), 2);
        // The same entry loaded again: another `Tool`, the same text.
        let reloaded = tool(STRICT);
        let reloaded = reloaded.get("t").unwrap();
        assert_eq!(reloaded.args_schema_text(), strict.args_schema_text());
        assert!(schemas.check(reloaded, &json!({"n": 50})).is_err());
        assert!(schemas.check(reloaded, &json!({"n": 5})).is_ok());
        assert_eq!(schemas.compiled.lock().unwrap().len(), 2, "reused");
    }
}
