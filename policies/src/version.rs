//! A policy set's version: a content-addressed id, so that every decision can name the set
//! that made it (docs/design.md §4) and the same files give the same id on every replica,
//! after every restart, and in `ostiary policy validate` before the set is deployed.
//!
//! # Definition
//! The id is `sha256:` followed by the first 16 hex digits (64 bits) of the SHA-256 of
//! this canonical serialisation of the set's sources:
//!
//! ```text
//! "ostiary policy set 1\n"
//! entry("policy", name, text)       for every *.cedar file, sorted by name (bytewise)
//! entry("catalog", name, text)      the catalog file (tools.toml), when there is one
//! entry("args_schema", path, text)  every argument schema file the catalog names, by the
//!                                   path as written there, sorted, each path once
//! entry("schema", "schema", text)   the Cedar schema generated from all of the above
//!
//! entry(role, name, text) = role SP len(name) SP len(text) LF name LF text LF
//! ```
//! where `len` is a byte length in decimal. The lengths frame every field, so no choice of
//! names and texts makes two different sets serialise alike; sorting makes the id
//! independent of the order a directory lists its files in. Texts are hashed as read, byte
//! for byte: a changed comment or a reformatted schema file is a new version. The generated
//! schema is included because the same files can make a different schema (another Ostiary
//! release, or the triggers of the config typing `Action::"trigger"`), and policies are
//! validated and evaluated against that schema.
//!
//! Sixteen hex digits keep the id readable in logs and tables; 64 bits make an accidental
//! collision among the versions one deployment ever sees negligible. The id names a set; it
//! is not a signature: whoever can write the policy directory can make any set.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::catalog::Catalog;
use crate::load::PolicySource;

/// What every version id starts with: the hash that made it.
pub const PREFIX: &str = "sha256:";

/// How many hex digits of the digest the id keeps.
pub const HEX_DIGITS: usize = 16;

/// The first line of the serialisation: a different one (a changed definition) can never
/// produce an id equal to one of this definition's.
const DOMAIN: &str = "ostiary policy set 1\n";

/// A policy set's content-addressed id, e.g. `sha256:3f2a9c0d1e4b5a69`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyVersion(String);

impl PolicyVersion {
    /// The version of the set made of `policies`, `catalog` (its file and the argument
    /// schema files it read) and the schema generated from them.
    pub fn of(policies: &[PolicySource], catalog: &Catalog, schema_text: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN.as_bytes());
        let mut sorted: Vec<&PolicySource> = policies.iter().collect();
        // By text too, so that even two sources of one name (in-memory sets) hash in one order.
        sorted.sort_by(|a, b| (&a.name, &a.text).cmp(&(&b.name, &b.text)));
        for source in sorted {
            entry(&mut hasher, "policy", &source.name, &source.text);
        }
        if let Some((name, text)) = catalog.source() {
            entry(&mut hasher, "catalog", name, text);
        }
        // One text per path: a file several tools name was read once per tool, and all of
        // them within one load, so any one of them is the file.
        let schemas: BTreeMap<&str, &str> = catalog.schema_files().collect();
        for (path, text) in schemas {
            entry(&mut hasher, "args_schema", path, text);
        }
        entry(&mut hasher, "schema", "schema", schema_text);
        let digest = hex::encode(hasher.finalize());
        Self(format!("{PREFIX}{}", &digest[..HEX_DIGITS]))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for PolicyVersion {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn entry(hasher: &mut Sha256, role: &str, name: &str, text: &str) {
    hasher.update(format!("{role} {} {}\n", name.len(), text.len()).as_bytes());
    hasher.update(name.as_bytes());
    hasher.update(b"\n");
    hasher.update(text.as_bytes());
    hasher.update(b"\n");
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::PolicyEngine;

    const ALLOW: &str = r#"
@id("records-host")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.com")
when { context.method == "GET" };
"#;
    const READS: &str = r#"
@id("reads")
permit (principal, action in Ostiary::Action::"tier:read", resource);
"#;
    const TOOLS: &str = r#"
[[tool]]
name = "records.get"
tier = "read"
match = { host = "api.example.com", method = "GET", path = "/records/{id}" }
args_schema = "records.json"
"#;
    const SCHEMA: &str = r#"{"type": "object", "properties": {"id": {"type": "string"}}}"#;

    /// A policy directory with `a.cedar`, `b.cedar`, the catalog and its schema file.
    fn write_set(dir: &Path) {
        std::fs::write(dir.join("a.cedar"), ALLOW).unwrap();
        std::fs::write(dir.join("b.cedar"), READS).unwrap();
        std::fs::write(dir.join("tools.toml"), TOOLS).unwrap();
        std::fs::write(dir.join("records.json"), SCHEMA).unwrap();
    }

    fn version_of(dir: &Path) -> PolicyVersion {
        PolicyEngine::load_dir(dir).unwrap().version().clone()
    }

    #[test]
    fn the_id_is_sha256_and_sixteen_hex_digits() {
        let dir = tempfile::tempdir().unwrap();
        write_set(dir.path());
        let id = version_of(dir.path());
        let hex = id.as_str().strip_prefix("sha256:").unwrap();
        assert_eq!(hex.len(), 16, "{id}");
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(id.to_string(), id.as_str());
    }

    #[test]
    fn the_same_files_give_the_same_id_wherever_they_are() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        write_set(one.path());
        write_set(two.path());
        // A file no load reads is not part of the set.
        std::fs::write(two.path().join("README.md"), "notes").unwrap();
        assert_eq!(version_of(one.path()), version_of(one.path()));
        assert_eq!(version_of(one.path()), version_of(two.path()));
    }

    #[test]
    fn any_changed_byte_of_a_policy_the_catalog_or_a_schema_file_is_a_new_id() {
        let dir = tempfile::tempdir().unwrap();
        write_set(dir.path());
        let original = version_of(dir.path());
        let mut seen = vec![original.clone()];
        let edits: [(&str, String); 5] = [
            ("a.cedar", format!("{ALLOW} ")),
            // A comment changes no decision, but it is another set of files.
            ("b.cedar", format!("// reviewed\n{READS}")),
            ("tools.toml", TOOLS.replace("records.get", "records.fetch")),
            ("tools.toml", format!("{TOOLS}\n")),
            // The same JSON value, other bytes.
            ("records.json", SCHEMA.replace(": ", ":")),
        ];
        for (file, text) in edits {
            let before = std::fs::read_to_string(dir.path().join(file)).unwrap();
            std::fs::write(dir.path().join(file), &text).unwrap();
            let changed = version_of(dir.path());
            assert!(
                !seen.contains(&changed),
                "editing {file} kept an id already seen: {changed}"
            );
            seen.push(changed);
            std::fs::write(dir.path().join(file), before).unwrap();
            assert_eq!(version_of(dir.path()), original, "{file} restored");
        }
        // A file renamed (same text) is another set too.
        std::fs::rename(dir.path().join("b.cedar"), dir.path().join("c.cedar")).unwrap();
        assert_ne!(version_of(dir.path()), original);
    }

    #[test]
    fn the_order_sources_are_given_in_does_not_matter() {
        let a = PolicySource {
            name: "a.cedar".into(),
            text: ALLOW.into(),
        };
        let b = PolicySource {
            name: "b.cedar".into(),
            text: READS.into(),
        };
        let catalog = || Catalog::parse("tools.toml", "", None).unwrap();
        let forward = PolicyEngine::with_catalog(&[a.clone(), b.clone()], catalog()).unwrap();
        let backward = PolicyEngine::with_catalog(&[b, a], catalog()).unwrap();
        assert_eq!(forward.version(), backward.version());
    }

    #[test]
    fn fields_are_framed_so_text_cannot_move_between_files() {
        let set = |files: &[(&str, &str)]| {
            let sources: Vec<PolicySource> = files
                .iter()
                .map(|(name, text)| PolicySource {
                    name: (*name).into(),
                    text: (*text).into(),
                })
                .collect();
            PolicyVersion::of(&sources, &Catalog::default(), "schema")
        };
        // The same concatenation of names and texts, split differently.
        assert_ne!(
            set(&[("a", "xy"), ("b", "z")]),
            set(&[("a", "x"), ("b", "yz")])
        );
        assert_ne!(set(&[("ab", "x")]), set(&[("a", "bx")]));
        // No catalog file and an empty one are different sources.
        let empty = Catalog::parse("tools.toml", "", None).unwrap();
        assert_ne!(
            PolicyVersion::of(&[], &Catalog::default(), "s"),
            PolicyVersion::of(&[], &empty, "s")
        );
        // The schema counts.
        assert_ne!(
            PolicyVersion::of(&[], &Catalog::default(), "s"),
            PolicyVersion::of(&[], &Catalog::default(), "t")
        );
    }

    #[test]
    fn the_embedded_library_is_the_library_on_disk() {
        let embedded = PolicyEngine::embedded().unwrap();
        let on_disk =
            PolicyEngine::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("library")).unwrap();
        assert!(embedded.version().as_str().starts_with(PREFIX));
        assert_eq!(embedded.version(), on_disk.version());
    }
}
