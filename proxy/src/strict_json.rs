//! JSON the proxy decides on and the upstream executes: parsed so that both can only read
//! the same thing.
//!
//! The proxy decides on the JSON it parsed but forwards the agent's bytes, so any document
//! that two decoders read differently is a way past a decision. The differences that matter
//! between the decoders upstreams run:
//! - **duplicate keys** (`{"ids":["a"],"ids":[…]}`): serde_json, Python and JavaScript keep
//!   the last, Go's `encoding/json` into a map keeps the last, many streaming decoders and
//!   Java's Jackson (configurably) the first;
//! - **keys equal ignoring case** (`"method":"ping","Method":"tools/call"`): Go's
//!   `encoding/json` matches struct fields case-insensitively (Unicode simple folding, so
//!   `K` KELVIN SIGN and `ſ` LONG S count), as do .NET's and several others in their lenient
//!   modes; the last match wins;
//! - **NUL in a key**: C-string based decoders end the key there.
//!
//! Such a body is refused whole, at any depth, before policy sees it ([`Ambiguity`] names
//! the keys, shortened, never their values). Everything serde_json already refuses stays
//! refused: trailing data, a byte-order mark, comments, invalid UTF-8, lone surrogates, and
//! nesting deeper than its recursion limit (128).

use std::collections::HashMap;
use std::fmt;

use ostiary_policies::args::same_folded;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Unicode simple case folding as keys are compared here (shared with the policies, which
/// refuse an argument spelled in another case than its schema's property).
pub use ostiary_policies::args::fold;

/// Longest key text an error quotes, escaped (control characters quote as `\u{..}`).
const QUOTED_KEY: usize = 40;

/// Why a JSON document was refused: not JSON at all, or JSON that decoders read differently.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StrictJsonError(serde_json::Error);

impl StrictJsonError {
    /// Whether the document was refused for an ambiguity (rather than for not being JSON).
    pub fn is_ambiguous(&self) -> bool {
        self.0.is_data()
    }
}

/// What makes a document ambiguous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ambiguity {
    /// The same key twice in one object.
    Duplicate(String),
    /// Two keys of one object equal ignoring case.
    CaseFolded(String, String),
    /// A key holding NUL.
    Nul(String),
}

impl fmt::Display for Ambiguity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ambiguity::Duplicate(k) => write!(
                f,
                "ambiguous JSON: the key {} appears twice in one object (decoders disagree on which one counts)",
                quote(k)
            ),
            Ambiguity::CaseFolded(a, b) => write!(
                f,
                "ambiguous JSON: the keys {} and {} differ only in case (case-insensitive decoders read either)",
                quote(a),
                quote(b)
            ),
            Ambiguity::Nul(k) => write!(
                f,
                "ambiguous JSON: the key {} holds NUL (C-string decoders cut it there)",
                quote(k)
            ),
        }
    }
}

/// `key` quoted for an error message, shortened.
pub(crate) fn quote(key: &str) -> String {
    let mut out = String::from("\"");
    for (i, c) in key.chars().enumerate() {
        let escaped: String = c.escape_debug().collect();
        if out.len() + escaped.len() > QUOTED_KEY || i >= QUOTED_KEY {
            out.push_str("\"…");
            return out;
        }
        out.push_str(&escaped);
    }
    out.push('"');
    out
}

/// Parse `bytes` as one JSON value, refusing any [`Ambiguity`].
pub fn parse(bytes: &[u8]) -> Result<Value, StrictJsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut de).map_err(StrictJsonError)?;
    de.end().map_err(StrictJsonError)?;
    Ok(value)
}

/// Objects with fewer keys than this compare a new key with each earlier one.
const LINEAR_KEYS: usize = 16;

/// Deserializes any value, checking every object's keys.
#[derive(Clone, Copy)]
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        // Folded key → the key as written, for objects too large to compare key by key.
        let mut folded: Option<HashMap<String, String>> = None;
        while let Some(key) = access.next_key::<String>()? {
            if key.contains('\0') {
                return Err(de::Error::custom(Ambiguity::Nul(key)));
            }
            if map.contains_key(&key) {
                return Err(de::Error::custom(Ambiguity::Duplicate(key)));
            }
            // Most objects are small: comparing with each earlier key costs less than
            // folding and hashing every key.
            let other = if map.len() < LINEAR_KEYS {
                map.keys().find(|k| same_folded(k, &key)).cloned()
            } else {
                let folded = folded
                    .get_or_insert_with(|| map.keys().map(|k| (fold(k), k.clone())).collect());
                folded.insert(fold(&key), key.clone())
            };
            if let Some(other) = other {
                return Err(de::Error::custom(Ambiguity::CaseFolded(other, key)));
            }
            let value = access.next_value_seed(Strict)?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        let err = parse(text.as_bytes()).unwrap_err();
        assert!(err.is_ambiguous(), "{text}: {err}");
        err.to_string()
    }

    #[test]
    fn plain_json_parses_as_serde_json_does() {
        for text in [
            r#"{"a":1,"b":[1,2,{"c":null}],"d":"x","e":1.5,"f":-3,"g":true}"#,
            "[]",
            "{}",
            "\"s\"",
            "18446744073709551615",
            r#"{"a":{"a":{"a":1}}}"#,
            r#"{"A":1,"b":{"A":2}}"#,
        ] {
            let strict = parse(text.as_bytes()).unwrap();
            let lax: Value = serde_json::from_str(text).unwrap();
            assert_eq!(strict, lax, "{text}");
        }
    }

    #[test]
    fn duplicate_and_case_folded_keys_are_refused_at_any_depth() {
        assert!(refused(r#"{"ids":["a"],"ids":[]}"#).contains("appears twice"));
        assert!(refused(r#"{"ids":["a"],"IDS":[]}"#).contains("differ only in case"));
        assert!(refused(r#"{"method":"ping","Method":"tools/call"}"#).contains("\"Method\""));
        // Escapes are decoded before comparing.
        refused(r#"{"method":1,"\u006dethod":2}"#);
        refused(r#"{"method":1,"\u004dETHOD":2}"#);
        // Nested in arrays and objects.
        refused(r#"[{"a":1},{"params":{"name":"x","NAME":"y"}}]"#);
        refused(r#"{"p":{"q":[{"k":1,"k":2}]}}"#);
        // Unicode folding: KELVIN SIGN, LONG S, and non-ASCII letters.
        refused("{\"kind\":1,\"\u{212a}ind\":2}");
        refused("{\"name\":1,\"\u{17f}\":2,\"s\":3}");
        refused("{\"été\":1,\"ÉTÉ\":2}");
        refused(r#"{"a\u0000":1}"#);
    }

    #[test]
    fn not_json_is_refused_but_not_as_ambiguous() {
        for text in [
            "{",
            "{\"a\":1} x",
            "\u{feff}{}",
            "{\"a\":1,}",
            "// c\n{}",
            r#"{"a":"\ud800"}"#,
            "NaN",
        ] {
            let err = parse(text.as_bytes()).unwrap_err();
            assert!(!err.is_ambiguous(), "{text:?}: {err}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse(deep.as_bytes()).is_err());
        assert!(parse(b"{\"a\":\"\xff\"}").is_err());
    }

    #[test]
    fn large_objects_are_checked_as_small_ones() {
        let mut keys: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
        let ok = format!("{{{}}}", keys.join(","));
        assert!(parse(ok.as_bytes()).is_ok());
        for late in [r#""K3":0"#, r#""k39":0"#, r#""\u212a7":0"#] {
            keys.push(late.to_owned());
            refused(&format!("{{{}}}", keys.join(",")));
            keys.pop();
        }
    }

    #[test]
    fn errors_quote_keys_shortened() {
        let long = "k".repeat(500);
        let text = format!(r#"{{"{long}":1,"{long}":2}}"#);
        let message = refused(&text);
        assert!(message.len() < 200, "{message}");
        let nuls = "\\u0000".repeat(300);
        let message = refused(&format!(r#"{{"{nuls}":1}}"#));
        assert!(message.len() < 200, "{message}");
        assert_eq!(quote("ab"), "\"ab\"");
        assert!(quote(&"é".repeat(100)).ends_with('…'));
    }
}
