//! `strict_json::parse`: an ambiguous body is never accepted, and an unambiguous one is
//! read exactly as serde_json reads it.
//!
//! The reference ambiguity check below is written independently of the parser: it keeps
//! every member of every object (serde_json's `Value` would drop duplicates), then sorts
//! each object's folded keys and looks for neighbours that are equal.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use super::*;

/// JSON with every object member kept, in order.
enum Tree {
    Leaf,
    List(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

impl<'de> serde::Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tree;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Tree::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
                let mut members = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Tree>()? {
                    members.push((k, v));
                }
                Ok(Tree::Object(members))
            }
        }
        d.deserialize_any(V)
    }
}

fn folded(key: &str) -> String {
    key.chars()
        .flat_map(char::to_uppercase)
        .flat_map(char::to_lowercase)
        .collect()
}

impl Tree {
    fn ambiguous(&self) -> bool {
        match self {
            Tree::Leaf => false,
            Tree::List(items) => items.iter().any(Tree::ambiguous),
            Tree::Object(members) => {
                let mut keys: Vec<String> = members.iter().map(|(k, _)| folded(k)).collect();
                keys.sort_unstable();
                keys.windows(2).any(|w| w[0] == w[1])
                    || members
                        .iter()
                        .any(|(k, v)| k.contains('\0') || v.ambiguous())
            }
        }
    }
}

/// Whether `bytes` is JSON (as serde_json reads it) that decoders could read differently.
pub(crate) fn ambiguous_reference(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Tree>(bytes).is_ok_and(|tree| tree.ambiguous())
}

fn check_strict(bytes: &[u8]) {
    let strict = ostiary::strict_json::parse(bytes);
    let lax: Result<Value, _> = serde_json::from_slice(bytes);
    match (strict, lax) {
        (Ok(value), Ok(lax)) => {
            assert!(
                !ambiguous_reference(bytes),
                "accepted an ambiguous body: {bytes:?}"
            );
            assert_eq!(value, lax, "read differently than serde_json: {bytes:?}");
        }
        (Ok(_), Err(e)) => panic!("accepted what serde_json refuses ({e}): {bytes:?}"),
        (Err(e), Ok(_)) => {
            assert!(
                e.is_ambiguous(),
                "refused valid JSON as not JSON ({e}): {bytes:?}"
            );
            assert!(
                ambiguous_reference(bytes),
                "refused an unambiguous body ({e}): {bytes:?}"
            );
            assert!(e.to_string().len() < 320, "an unbounded reason: {e}");
        }
        // Both refuse (the strict parser may meet an ambiguity before the syntax error).
        (Err(_), Err(_)) => {}
    }
}

#[test]
fn strict_json_arbitrary_bytes() {
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| check_strict(bytes));
}

/// A key that often collides with another: a few base names, in varied case, escaped or
/// not, sometimes with a NUL or a non-ASCII letter that folds onto ASCII.
#[derive(Debug, TypeGenerator)]
struct Key {
    base: u8,
    case: u8,
    spelling: u8,
}

impl Key {
    fn text(&self) -> String {
        let base = ["ids", "method", "name", "kind", "s", "arguments"][self.base as usize % 6];
        let cased: String = base
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if self.case >> (i % 8) & 1 == 1 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        // JSON text of the key (inside the quotes).
        match self.spelling % 6 {
            0 | 1 => cased,
            // The first character as a \u escape.
            2 => {
                let mut chars = cased.chars();
                let first = chars.next().unwrap_or('x');
                format!("\\u{:04x}{}", first as u32, chars.as_str())
            }
            3 => format!("{cased}\\u0000"),
            // KELVIN SIGN for k, LONG S for s: Unicode folding maps them onto ASCII.
            4 => cased.replace('k', "\u{212a}").replace('s', "\u{17f}"),
            _ => format!("{cased}_"),
        }
    }
}

#[derive(Debug, TypeGenerator)]
enum Member {
    Leaf(Key, i8),
    Nested(Key, Vec<(Key, i8)>),
    List(Key, Vec<Vec<(Key, i8)>>),
}

fn object(members: &[(Key, i8)]) -> String {
    let inner: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("\"{}\":{v}", k.text()))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn document(members: &[Member]) -> String {
    let inner: Vec<String> = members
        .iter()
        .map(|m| match m {
            Member::Leaf(k, v) => format!("\"{}\":{v}", k.text()),
            Member::Nested(k, inner) => format!("\"{}\":{}", k.text(), object(inner)),
            Member::List(k, items) => {
                let items: Vec<String> = items.iter().map(|o| object(o)).collect();
                format!("\"{}\":[{}]", k.text(), items.join(","))
            }
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

#[test]
fn strict_json_colliding_keys() {
    check!()
        .with_type::<Vec<Member>>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|members| check_strict(document(members).as_bytes()));
}

#[test]
fn strict_json_regressions() {
    for text in [
        r#"{"ids":["a"],"IDS":[1,2,3]}"#,
        r#"{"a":{"b":1,"B":2}}"#,
        "{\"\u{212a}ind\":1,\"kind\":2}",
        r#"{"a\u0000":1}"#,
        r#"{"a":1}"#,
        r#"[{"a":1},{"a":1}]"#,
    ] {
        check_strict(text.as_bytes());
    }
}
