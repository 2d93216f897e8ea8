//! The leading conditions of a policy that the index can decide before Cedar does: a chain of
//! simple tests on values a request always presents (its principal, action and resource, the
//! `name` of an agent or host, string, number and boolean attributes of its context), read
//! from the policy's first `when` clause, left to right.
//!
//! # What is read
//! The first condition of a policy, when it is a `when`, flattened along `&&` in evaluation
//! order. Each conjunct, from the left, is kept while it has one of these shapes (either side
//! of `==`/`!=`):
//! - `X == <literal>`, `X != <literal>` — a string, a number, a boolean or an entity;
//! - `X like "<pattern>"`;
//! - `[<literal>, ..].contains(X)`;
//! - `X has <attr>` where X is `context` or a path under it;
//!
//! where `X` is `principal`, `action`, `resource`, `principal.name`, `resource.name`, or a
//! path of attributes under `context`. The chain ends at the first conjunct of another shape:
//! that one might error, and nothing after it may then be used.
//!
//! # Why deciding them is sound
//! Cedar evaluates a policy's scope, then its conditions in order, `&&` left to right and
//! short-circuiting. Walking the chain, a conjunct whose operand the request presents has a
//! known outcome: `==`, `!=` and `contains` never error; `like` errors on a non-string, so it
//! is decided only on a string; `has` is only ever taken as true when the attribute is there.
//! When a conjunct is false and every conjunct before it was true (so none errored), the
//! body is false without error and the policy can neither determine nor change the decision.
//! An operand the request does not present (an absent optional argument, an attribute of
//! another action's context) is unknown, and the policy is kept, as it errors or not
//! unsliced. `context.approval` is never presented: the escalation re-check evaluates the
//! same slice with `approval.granted` flipped, so the slice must not depend on it.

use cedar_policy::{EntityId, EntityTypeName, EntityUid, Policy};
use serde_json::Value as Json;

/// One of the request's scope variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Var {
    Principal,
    Action,
    Resource,
}

/// What a conjunct tests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Operand {
    /// `principal`, `action` or `resource` itself.
    Var(Var),
    /// `principal.name` or `resource.name` (agents and hosts repeat their id there).
    Name(Var),
    /// A path of attributes under `context`, never empty.
    Context(Box<[String]>),
}

/// A literal a conjunct compares with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Literal {
    Str(String),
    Long(i64),
    Bool(bool),
    Entity(EntityUid),
}

/// A value the request presents for an operand, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known<'a> {
    Str(&'a str),
    Long(i64),
    Bool(bool),
    Entity(&'a EntityUid),
    /// Present, but a record or a set: equal to no literal, and `like` on it errors.
    Other,
}

impl Literal {
    fn equals(&self, known: Known<'_>) -> bool {
        match (self, known) {
            (Self::Str(a), Known::Str(b)) => a == b,
            (Self::Long(a), Known::Long(b)) => *a == b,
            (Self::Bool(a), Known::Bool(b)) => *a == b,
            (Self::Entity(a), Known::Entity(b)) => a == b,
            // `==` across types is false in Cedar, never an error.
            _ => false,
        }
    }
}

/// One element of a `like` pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Glob {
    Chars(String),
    Any,
}

/// A conjunct's test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Test {
    Eq(Literal),
    Ne(Literal),
    OneOf(Vec<Literal>),
    Like(Vec<Glob>),
    Has,
}

/// The outcome of a conjunct for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    True,
    False,
    /// The request does not present the operand, or the test would error: stop here.
    Unknown,
}

impl From<bool> for Outcome {
    fn from(b: bool) -> Self {
        if b {
            Self::True
        } else {
            Self::False
        }
    }
}

impl Test {
    pub(crate) fn outcome(&self, known: Option<Known<'_>>) -> Outcome {
        let Some(value) = known else {
            return Outcome::Unknown;
        };
        match self {
            Self::Eq(literal) => literal.equals(value).into(),
            Self::Ne(literal) => (!literal.equals(value)).into(),
            Self::OneOf(literals) => literals.iter().any(|l| l.equals(value)).into(),
            Self::Like(pattern) => match value {
                Known::Str(s) => like(s, pattern).into(),
                _ => Outcome::Unknown,
            },
            Self::Has => Outcome::True,
        }
    }
}

/// Cedar's `like`: `*` matches any run of characters (even none), everything else itself.
fn like(text: &str, pattern: &[Glob]) -> bool {
    // Greedy matching with backtracking to the last wildcard: linear in practice.
    let Some((first, rest)) = pattern.split_first() else {
        return text.is_empty();
    };
    match first {
        Glob::Chars(chars) => text
            .strip_prefix(chars.as_str())
            .is_some_and(|tail| like(tail, rest)),
        Glob::Any => {
            if rest.is_empty() {
                return true;
            }
            text.char_indices()
                .map(|(i, _)| i)
                .chain(std::iter::once(text.len()))
                .any(|i| like(&text[i..], rest))
        }
    }
}

/// One test of the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conjunct {
    pub operand: Operand,
    pub test: Test,
}

impl Conjunct {
    /// Whether this conjunct, preceding a hashed conjunct on `hashed`, is sure not to error
    /// whenever the request presents `hashed` (see [`Chain::hash`]).
    fn safe_before(&self, hashed: &Operand) -> bool {
        match (&self.operand, &self.test) {
            // Scope variables and their names are always there.
            (Operand::Var(_), Test::Eq(_) | Test::Ne(_) | Test::OneOf(_)) => true,
            // `a.b has c` errors only if `a.b` is not a record; it is one if the request
            // presents a path through it.
            (Operand::Context(path), Test::Has) => match hashed {
                Operand::Context(target) => {
                    let parent = &path[..path.len() - 1];
                    parent.len() < target.len() && target.starts_with(parent)
                }
                _ => path.len() == 1,
            },
            // The same operand: present whenever it is, and these never error on it.
            (operand, Test::Eq(_) | Test::Ne(_) | Test::OneOf(_)) => operand == hashed,
            _ => false,
        }
    }
}

/// The leading chain of one policy (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Chain {
    pub conjuncts: Vec<Conjunct>,
}

impl Chain {
    /// Read the chain of `policy` (empty when its first condition has none).
    pub(crate) fn of(policy: &Policy) -> Self {
        let conjuncts = policy
            .to_json()
            .ok()
            .and_then(|json| {
                let first = json.get("conditions")?.as_array()?.first()?.clone();
                (first.get("kind")?.as_str()? == "when").then_some(first)
            })
            .map(|first| {
                let mut terms = Vec::new();
                if let Some(body) = first.get("body") {
                    flatten(body, &mut terms);
                }
                terms.iter().map_while(|t| conjunct(t)).collect()
            })
            .unwrap_or_default();
        Self { conjuncts }
    }

    /// Whether the policy's body may hold for a request presenting `known`: false only when
    /// a conjunct is false and all before it were true.
    pub(crate) fn admits<'a>(&self, known: impl Fn(&Operand) -> Option<Known<'a>>) -> bool {
        for conjunct in &self.conjuncts {
            match conjunct.test.outcome(known(&conjunct.operand)) {
                Outcome::True => continue,
                Outcome::False => return false,
                Outcome::Unknown => return true,
            }
        }
        true
    }

    /// The conjunct the index may hash the policy under, as its operand and key: the first
    /// `==`, `contains` or lookup-shaped `like` whose predecessors cannot error when the
    /// request presents its operand. Leaving out a policy whose hashed literal differs from
    /// the request's value is then sound: that conjunct is false and none before it errored
    /// (they are all true, or one is false and the body is false anyway).
    pub(crate) fn hash(&self) -> Option<(&Operand, HashKey<'_>)> {
        let (position, key) = self
            .conjuncts
            .iter()
            .enumerate()
            .find_map(|(i, c)| c.test.hash_key().map(|key| (i, key)))?;
        let operand = &self.conjuncts[position].operand;
        self.conjuncts[..position]
            .iter()
            .all(|c| c.safe_before(operand))
            .then_some((operand, key))
    }
}

/// What a hashed conjunct is looked up by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HashKey<'a> {
    /// `==` one literal, or `contains` any of several.
    Literals(&'a [Literal]),
    /// `like` with no wildcard: this string, and `like` errors on anything else.
    LikeExact(&'a str),
    /// `like "<prefix>*"`.
    LikePrefix(&'a str),
}

impl Test {
    fn hash_key(&self) -> Option<HashKey<'_>> {
        match self {
            Self::Eq(literal) => Some(HashKey::Literals(std::slice::from_ref(literal))),
            Self::OneOf(literals) => Some(HashKey::Literals(literals)),
            Self::Like(pattern) => match pattern.as_slice() {
                [] => Some(HashKey::LikeExact("")),
                [Glob::Chars(text)] => Some(HashKey::LikeExact(text)),
                [Glob::Chars(prefix), rest @ ..] if rest.iter().all(|g| *g == Glob::Any) => {
                    Some(HashKey::LikePrefix(prefix))
                }
                _ => None,
            },
            Self::Ne(_) | Self::Has => None,
        }
    }
}

/// The terms of an `&&` tree in evaluation order.
fn flatten<'a>(expr: &'a Json, out: &mut Vec<&'a Json>) {
    match expr.get("&&") {
        Some(and) => {
            if let (Some(left), Some(right)) = (and.get("left"), and.get("right")) {
                flatten(left, out);
                flatten(right, out);
            } else {
                // Malformed: a term no conjunct matches, which ends the chain.
                out.push(expr);
            }
        }
        None => out.push(expr),
    }
}

/// One term as a [`Conjunct`], if it has a shape the module doc lists.
fn conjunct(term: &Json) -> Option<Conjunct> {
    let binary = |op: &str| {
        let e = term.get(op)?;
        Some((e.get("left")?, e.get("right")?))
    };
    let compare = |(left, right): (&Json, &Json)| {
        operand(left)
            .zip(literal(right))
            .or_else(|| operand(right).zip(literal(left)))
    };
    if let Some((operand, literal)) = binary("==").and_then(compare) {
        return Some(Conjunct {
            operand,
            test: Test::Eq(literal),
        });
    }
    if let Some((operand, literal)) = binary("!=").and_then(compare) {
        return Some(Conjunct {
            operand,
            test: Test::Ne(literal),
        });
    }
    if let Some((set, element)) = binary("contains") {
        let literals = set
            .get("Set")?
            .as_array()?
            .iter()
            .map(literal)
            .collect::<Option<Vec<_>>>()?;
        return Some(Conjunct {
            operand: operand(element)?,
            test: Test::OneOf(literals),
        });
    }
    if let Some(like) = term.get("like") {
        let pattern = like
            .get("pattern")?
            .as_array()?
            .iter()
            .map(glob)
            .collect::<Option<Vec<_>>>()?;
        return Some(Conjunct {
            operand: operand(like.get("left")?)?,
            test: Test::Like(merge(pattern)),
        });
    }
    if let Some(has) = term.get("has") {
        let attr = has.get("attr")?.as_str()?;
        let mut path = match operand(has.get("left")?) {
            Some(Operand::Context(path)) => path.into_vec(),
            None if is_context(has.get("left")?) => Vec::new(),
            _ => return None,
        };
        path.push(attr.to_owned());
        return Some(Conjunct {
            operand: Operand::Context(path.into()),
            test: Test::Has,
        });
    }
    None
}

fn is_context(expr: &Json) -> bool {
    expr.get("Var").and_then(Json::as_str) == Some("context")
}

fn var(expr: &Json) -> Option<Var> {
    match expr.get("Var")?.as_str()? {
        "principal" => Some(Var::Principal),
        "action" => Some(Var::Action),
        "resource" => Some(Var::Resource),
        _ => None,
    }
}

/// `principal`, `resource.name`, `context.a.b`, ... as an [`Operand`].
fn operand(expr: &Json) -> Option<Operand> {
    if let Some(v) = var(expr) {
        return Some(Operand::Var(v));
    }
    let mut path = Vec::new();
    let mut e = expr;
    while let Some(dot) = e.get(".") {
        path.push(dot.get("attr")?.as_str()?.to_owned());
        e = dot.get("left")?;
    }
    path.reverse();
    if path.is_empty() {
        return None;
    }
    if is_context(e) {
        return Some(Operand::Context(path.into()));
    }
    match (var(e)?, path.as_slice()) {
        (v @ (Var::Principal | Var::Resource), [name]) if name == "name" => Some(Operand::Name(v)),
        _ => None,
    }
}

fn literal(expr: &Json) -> Option<Literal> {
    match expr.get("Value")? {
        Json::String(s) => Some(Literal::Str(s.clone())),
        Json::Bool(b) => Some(Literal::Bool(*b)),
        Json::Number(n) => n.as_i64().map(Literal::Long),
        Json::Object(o) => {
            let entity = o.get("__entity")?;
            let ty: EntityTypeName = entity.get("type")?.as_str()?.parse().ok()?;
            let id = entity.get("id")?.as_str()?;
            Some(Literal::Entity(EntityUid::from_type_name_and_id(
                ty,
                EntityId::new(id),
            )))
        }
        _ => None,
    }
}

fn glob(element: &Json) -> Option<Glob> {
    if element.as_str() == Some("Wildcard") {
        return Some(Glob::Any);
    }
    Some(Glob::Chars(element.get("Literal")?.as_str()?.to_owned()))
}

/// Adjacent characters joined, adjacent wildcards collapsed (the EST lists one element per
/// character).
fn merge(pattern: Vec<Glob>) -> Vec<Glob> {
    let mut out: Vec<Glob> = Vec::with_capacity(pattern.len());
    for element in pattern {
        match (out.last_mut(), element) {
            (Some(Glob::Chars(text)), Glob::Chars(more)) => text.push_str(&more),
            (Some(Glob::Any), Glob::Any) => {}
            (_, element) => out.push(element),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(text: &str) -> Chain {
        Chain::of(&text.parse::<Policy>().expect("policy parses"))
    }

    fn ctx(path: &[&str]) -> Operand {
        Operand::Context(path.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn chains_are_read_left_to_right_and_stop_at_the_first_unknown_shape() {
        let c = chain(
            r#"permit (principal, action, resource) when {
                context has args && context.args has repo && context.args.repo == "r1"
                && ["GET", "HEAD"].contains(context.method) && 443 == context.port
                && context.path like "/a*" && context.x > 3 && context.y == "never read"
            };"#,
        );
        let operands: Vec<_> = c.conjuncts.iter().map(|c| c.operand.clone()).collect();
        assert_eq!(
            operands,
            vec![
                ctx(&["args"]),
                ctx(&["args", "repo"]),
                ctx(&["args", "repo"]),
                ctx(&["method"]),
                ctx(&["port"]),
                ctx(&["path"]),
            ]
        );
        // Hashed on the repo: the two `has` before it cannot error when the repo is there.
        assert_eq!(c.hash().map(|h| h.0), Some(&ctx(&["args", "repo"])));
        assert_eq!(
            c.conjuncts[5].test,
            Test::Like(vec![Glob::Chars("/a".into()), Glob::Any])
        );
    }

    #[test]
    fn a_has_on_another_record_prevents_hashing_later() {
        // `context.other has x` might error where `context.args.repo` is present.
        let c = chain(
            r#"permit (principal, action, resource) when {
                context.other has x && context.args.repo == "r1" };"#,
        );
        assert_eq!(c.conjuncts.len(), 2);
        assert_eq!(c.hash(), None);
    }

    #[test]
    fn entity_and_name_operands() {
        let c = chain(
            r#"permit (principal, action, resource) when {
                resource == Ostiary::Tool::"t1" && principal.name == "a" && resource.name != "h" };"#,
        );
        assert_eq!(c.conjuncts[0].operand, Operand::Var(Var::Resource));
        assert_eq!(c.conjuncts[1].operand, Operand::Name(Var::Principal));
        assert_eq!(c.conjuncts[2].operand, Operand::Name(Var::Resource));
        let uid: EntityUid = r#"Ostiary::Tool::"t1""#.parse().unwrap();
        assert_eq!(c.conjuncts[0].test, Test::Eq(Literal::Entity(uid)));
    }

    #[test]
    fn unless_and_disjunctions_give_no_chain() {
        assert!(
            chain(r#"permit (principal, action, resource) unless { context.path == "/a" };"#)
                .conjuncts
                .is_empty()
        );
        assert!(chain(
            r#"permit (principal, action, resource) when { context.path == "/a" || context.path == "/b" };"#
        )
        .conjuncts
        .is_empty());
    }

    #[test]
    fn like_follows_cedar() {
        let p = |s: &str| match chain(&format!(
            "permit (principal, action, resource) when {{ context.path like \"{s}\" }};"
        ))
        .conjuncts
        .remove(0)
        .test
        {
            Test::Like(pattern) => pattern,
            other => panic!("{other:?}"),
        };
        for (pattern, text, expected) in [
            ("/a*", "/a", true),
            ("/a*", "/ab/c", true),
            ("/a*", "/b", false),
            ("*x", "abx", true),
            ("*x", "xa", false),
            ("/a*b", "/ab", true),
            ("/a*b", "/a/c/b", true),
            ("/a*b", "/a/c/bc", false),
            ("a**b*c", "abc", true),
            ("a*b*c", "acb", false),
            ("", "", true),
            ("", "a", false),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("é*", "éa", true),
        ] {
            assert_eq!(like(text, &p(pattern)), expected, "{pattern} on {text}");
        }
        let key = |s: &str| Test::Like(p(s)).hash_key().map(|k| format!("{k:?}"));
        assert_eq!(key("/a*").as_deref(), Some("LikePrefix(\"/a\")"));
        assert_eq!(key("/a**").as_deref(), Some("LikePrefix(\"/a\")"));
        assert_eq!(key("/a").as_deref(), Some("LikeExact(\"/a\")"));
        assert_eq!(key("*a"), None);
        assert_eq!(key("/a*b"), None);
    }
}
