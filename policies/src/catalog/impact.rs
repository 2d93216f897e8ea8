//! `impact.records`: what a tool's pointer finds in a call's arguments, read as a count of
//! records (docs/policies.md, "Tools, tiers and escalation"), or why it cannot be.

use serde_json::Value;

use crate::args;

/// Why a call's `impact.records` could not be read as a count ([`super::Tool::impact_records`]).
/// It names the pointer and what kind of JSON value is there, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("impact.records: the argument at {pointer} is {what}, not a count of records")]
pub struct ImpactError {
    pointer: String,
    what: &'static str,
}

/// The count at `pointer` in `args` ([`super::Tool::impact_records`] says what counts).
pub(super) fn count(pointer: &str, args: &Value) -> Result<i64, ImpactError> {
    let not_a_count = |what: &'static str| ImpactError {
        pointer: pointer.to_owned(),
        what,
    };
    match args.pointer(pointer) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Array(items)) => {
            i64::try_from(items.len()).map_err(|_| not_a_count("an array too long to count"))
        }
        Some(Value::Number(n)) => match args::integer(n) {
            Some(count) if count >= 0 => Ok(count),
            Some(_) => Err(not_a_count("a negative number")),
            None if n.as_f64().is_some_and(|f| f.fract() != 0.0) => {
                Err(not_a_count("a fractional number"))
            }
            None => Err(not_a_count("a number beyond the 64-bit range")),
        },
        Some(Value::String(s)) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse()
            .map_err(|_| not_a_count("a string of digits beyond the 64-bit range")),
        Some(other) => Err(not_a_count(args::kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::catalog::Catalog;

    /// `impact.records` of a call of a tool whose pointer is `/count`, given `args`.
    fn records(args: Value) -> Result<i64, String> {
        let catalog = Catalog::parse(
            "tools.toml",
            r#"
[[tool]]
name = "pay.export"
tier = "high_impact"
match = { host = "pay.example.com", method = "POST", path = "/v1/export" }
impact = { records = "/count" }
"#,
            None,
        )
        .unwrap();
        let tool = catalog.get("pay.export").unwrap();
        tool.impact_records(&args).map_err(|e| e.to_string())
    }

    #[test]
    fn impact_records_counts_what_policy_bounds() {
        for (count, expected, what) in [
            (json!(1000), 1000, "integer"),
            (json!(1000.0), 1000, "integral float"),
            (serde_json::from_str("1e3").unwrap(), 1000, "exponent"),
            (
                serde_json::from_str("1.0e3").unwrap(),
                1000,
                "exponent, fraction",
            ),
            (json!(0), 0, "zero"),
            (json!("5000"), 5000, "digit string (a query value)"),
            (json!("007"), 7, "leading zeros"),
            (json!(["a", "b", "c"]), 3, "array"),
            (json!([]), 0, "empty array"),
            (Value::Null, 0, "null"),
        ] {
            assert_eq!(records(json!({ "count": count })), Ok(expected), "{what}");
        }
        assert_eq!(records(json!({})), Ok(0), "absent");
        assert_eq!(records(json!({"other": 5})), Ok(0), "absent, others given");
    }

    #[test]
    fn impact_records_that_are_not_a_count_are_refused_without_their_value() {
        for (count, kind) in [
            (json!(-5), "a negative number"),
            (serde_json::from_str("-1e3").unwrap(), "a negative number"),
            (json!(1000.5), "a fractional number"),
            (serde_json::from_str("1e-3").unwrap(), "a fractional number"),
            (json!(u64::MAX), "a number beyond the 64-bit range"),
            (json!(1e19), "a number beyond the 64-bit range"),
            (json!(1e300), "a number beyond the 64-bit range"),
            (
                json!("99999999999999999999"),
                "a string of digits beyond the 64-bit range",
            ),
            (json!("5,000"), "a string"),
            (json!("a,b,c"), "a string"),
            (json!("-5"), "a string"),
            (json!(" 5"), "a string"),
            (json!(""), "a string"),
            (json!({"0": "a", "1": "b"}), "an object"),
            (json!(true), "a boolean"),
        ] {
            let err = records(json!({ "count": count.clone() })).unwrap_err();
            assert_eq!(
                err,
                format!("impact.records: the argument at /count is {kind}, not a count of records"),
                "{count}"
            );
        }
        // The message names the pointer and the kind, never the value.
        let err = records(json!({"count": "secret-token-123"})).unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn no_extractor_counts_nothing() {
        let catalog = Catalog::parse(
            "tools.toml",
            r#"
[[tool]]
name = "pay.read"
tier = "read"
match = { host = "pay.example.com", method = "GET", path = "/v1/items" }
"#,
            None,
        )
        .unwrap();
        let tool = catalog.get("pay.read").unwrap();
        assert_eq!(tool.impact_records(&json!({"count": {"x": 1}})), Ok(0));
    }
}
