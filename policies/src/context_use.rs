//! Which top-level attributes of the context a policy set can read, so that a decision
//! builds only those.
//!
//! Building Cedar's context is a large part of a decision: each attribute is a restricted
//! expression that Cedar evaluates into a value before the request exists (flat out, the
//! context cost 1.8× the evaluation of the policies themselves). An attribute no policy
//! names cannot change a decision, so it is left out.
//!
//! # Why leaving them out is sound
//! A policy observes the context only through expressions that contain the variable
//! `context`. Reading each policy's (and template's) JSON form, every occurrence of
//! `context` is either the left side of an attribute access (`context.path`,
//! `context["path"]`) or of a `has` test (`context has path`) — then that attribute is
//! read, whether or not it exists — or anything else (`context == {..}`, a context passed
//! whole), and then every attribute is read. An attribute outside the set is therefore
//! never looked up, tested or compared, and its absence changes no policy's value or
//! error. A policy whose JSON cannot be produced counts as reading everything.
//! `tests/index_differential.rs` decides generated sets both ways and finds no difference.

use std::collections::BTreeSet;

use cedar_policy::PolicySet;
use serde_json::Value as Json;

/// The context attributes a policy set reads (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContextUse {
    /// Some policy uses `context` other than through a named attribute.
    all: bool,
    keys: BTreeSet<String>,
    /// Some policy may read `context.session.labels` or `context.session.recent` (or the
    /// session record whole): the proxy fetches them only then.
    memory: bool,
    /// The attributes of `context.session` read by name (`context.session.depth`).
    session: BTreeSet<String>,
    /// Some policy uses `context.session` other than through a named attribute.
    session_whole: bool,
}

impl ContextUse {
    /// What `set`'s policies and templates read.
    pub(crate) fn of(set: &PolicySet) -> Self {
        let mut used = Self::default();
        let policies = set.policies().map(|p| p.to_json().ok());
        let templates = set.templates().map(|t| t.to_json().ok());
        for json in policies.chain(templates) {
            match json {
                Some(json) => used.walk(&json),
                None => used.all = true,
            }
            if used.all {
                break;
            }
        }
        used
    }

    /// Every attribute, as if some policy read the context whole.
    pub(crate) fn everything() -> Self {
        Self {
            all: true,
            keys: BTreeSet::new(),
            memory: true,
            session: BTreeSet::new(),
            session_whole: true,
        }
    }

    /// The attributes of `context.session` a policy may read, or `None` when some policy may
    /// read them all (the context or the session record used whole). Empty when no policy
    /// reads the session.
    pub(crate) fn session_reads(&self) -> Option<&BTreeSet<String>> {
        (!self.all && !self.session_whole).then_some(&self.session)
    }

    /// Whether a policy may read `context.session.labels` or `context.session.recent`.
    pub(crate) fn reads_memory(&self) -> bool {
        self.all || self.memory
    }

    /// Whether a policy may read `context.<key>`.
    pub(crate) fn reads(&self, key: &str) -> bool {
        self.all || self.keys.contains(key)
    }

    fn walk(&mut self, node: &Json) {
        match node {
            Json::Object(fields) => {
                for op in [".", "has"] {
                    if let Some(access) = fields.get(op) {
                        let left = access.get("left");
                        let attr = access.get("attr").and_then(Json::as_str);
                        if let (Some(left), Some(attr)) = (left, attr) {
                            if is_context(left) {
                                self.keys.insert(attr.to_owned());
                                // Reached here, `context.session` is used whole (an access
                                // of one of its attributes is met below, never walked into).
                                self.memory |= attr == "session";
                                self.session_whole |= attr == "session";
                                return;
                            }
                            if is_session(left) {
                                self.keys.insert("session".to_owned());
                                self.memory |= matches!(attr, "labels" | "recent");
                                self.session.insert(attr.to_owned());
                                return;
                            }
                        }
                    }
                }
                if is_context(node) {
                    self.all = true;
                    return;
                }
                fields.values().for_each(|v| self.walk(v));
            }
            Json::Array(items) => items.iter().for_each(|v| self.walk(v)),
            // A string is a literal or a name, never the variable (that is `{"Var": ..}`).
            _ => {}
        }
    }
}

fn is_context(node: &Json) -> bool {
    node.get("Var").and_then(Json::as_str) == Some("context")
}

/// `context.session`.
fn is_session(node: &Json) -> bool {
    node.get(".").is_some_and(|access| {
        access.get("left").is_some_and(is_context)
            && access.get("attr").and_then(Json::as_str) == Some("session")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(text: &str) -> ContextUse {
        ContextUse::of(&text.parse().expect("test policies parse"))
    }

    #[test]
    fn labels_and_recent_counts_are_read_only_where_named() {
        for (text, memory) in [
            (
                r#"permit (principal, action, resource) when { context.session.labels.contains("x") };"#,
                true,
            ),
            (
                r#"permit (principal, action, resource) when { context.session has labels };"#,
                true,
            ),
            (
                "permit (principal, action, resource) when { context.session.recent.tool_1h > 3 };",
                true,
            ),
            (
                "permit (principal, action, resource) when { context.session == context.session };",
                true,
            ),
            (
                "permit (principal, action, resource) when { context == context };",
                true,
            ),
            (
                "permit (principal, action, resource) when { context.session.depth > 0 };",
                false,
            ),
            (
                "permit (principal, action, resource) when { context.labels == 1 };",
                false,
            ),
        ] {
            let used = of(text);
            assert_eq!(used.reads_memory(), memory, "{text}");
        }
    }

    fn session(used: &ContextUse) -> Vec<&str> {
        let read = used.session_reads().expect("read by name");
        read.iter().map(String::as_str).collect()
    }

    fn keys(used: &ContextUse) -> Vec<&str> {
        used.keys.iter().map(String::as_str).collect()
    }

    #[test]
    fn named_attributes_are_read_and_nothing_else() {
        let used = of(r#"
            permit (principal, action, resource) when { context.path like "/a*" };
            forbid (principal, action, resource) when { context has method && context["port"] == 1 };
            permit (principal, action, resource) unless { context.session.calls > 3 };
        "#);
        assert!(!used.all);
        assert_eq!(keys(&used), ["method", "path", "port", "session"]);
        assert!(used.reads("session") && !used.reads("query") && !used.reads("args"));
        assert!(
            !used.reads_memory(),
            "calls is not what the session touched"
        );
        assert_eq!(session(&used), ["calls"]);
    }

    #[test]
    fn session_attributes_are_read_by_name_or_all_at_once() {
        let used = of(r#"
            permit (principal, action, resource) when { context.session.depth == 0 };
            forbid (principal, action, resource) when { context.session has parent_agent };
            permit (principal, action, resource) when { context.session.recent.tool_1h > 3 };
        "#);
        assert_eq!(session(&used), ["depth", "parent_agent", "recent"]);
        for text in [
            "permit (principal, action, resource) when { context.session == context.session };",
            "permit (principal, action, resource) when { context == context };",
            r#"permit (principal, action, resource) when { [context.session].contains({"depth": 0}) };"#,
        ] {
            assert_eq!(of(text).session_reads(), None, "{text}");
        }
        assert!(of("permit (principal, action, resource);")
            .session_reads()
            .is_some_and(BTreeSet::is_empty));
    }

    #[test]
    fn a_set_that_never_names_context_reads_nothing() {
        let used = of(r#"
            permit (principal, action == Ostiary::Action::"http", resource);
            permit (principal, action, resource) when { principal.name == "context" };
            permit (principal, action, resource) when { resource has path };
        "#);
        assert_eq!(used, ContextUse::default());
        assert!(!used.reads("path"));
    }

    #[test]
    fn context_used_whole_reads_everything() {
        for text in [
            r#"permit (principal, action, resource) when { context == {} };"#,
            r#"permit (principal, action, resource) when { [context].contains({"a": 1}) };"#,
            r#"permit (principal, action, resource) when { {"c": context}.c has path };"#,
        ] {
            let used = of(text);
            assert!(used.all, "{text}");
            assert!(used.reads("anything"), "{text}");
        }
    }

    #[test]
    fn templates_count() {
        let used = of(r#"
            permit (principal == ?principal, action, resource) when { context.query == "" };
        "#);
        assert_eq!(keys(&used), ["query"]);
    }
}
