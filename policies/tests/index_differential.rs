//! The policy index against the plain authorizer: generated policy sets (permits and forbids,
//! escalating forbids, every kind of scope over a few agents, tenants, hosts, tools and tiers,
//! conditions on the context, some of which error) and generated requests, each decided
//! through the index ([`PolicyEngine::decide`]) and over the full set
//! ([`PolicyEngine::decide_unindexed`]). Any difference in the decision or in the set of
//! determining policies is a bug in the index. The full-set reference also builds the whole
//! context ([`PolicyEngine::building_whole_context`]), while the engine under test builds only
//! the attributes its set reads: a difference there is a bug in that analysis. `decide` also
//! keeps its decisions (memo.rs) and answers a question asked again from them; the few
//! agents, hosts, paths and arguments make many requests repeat what an earlier one put into
//! its decision while differing in what it did not, so a key that leaves out something that
//! counts shows as a difference too.
//!
//! Deterministic: a fixed-seed xorshift drives everything, so a failure reproduces.

use std::collections::BTreeSet;

use cedar_policy::{PolicySet, Schema, ValidationMode, Validator};
use ostiary_policies::{
    Catalog, Decision, DenyReason, PolicyEngine, PolicySource, TriggerDef, Triggers,
};
use serde_json::json;

#[path = "index_differential/policies.rs"]
mod policies;
#[path = "index_differential/requests.rs"]
mod requests;

use policies::policy;
use requests::{request, sibling};

const SETS: usize = 250;
const REQUESTS_PER_SET: usize = 400;

const AGENTS: &[&str] = &["a0", "a1", "a2", "a3"];
const TENANTS: &[&str] = &["t0", "t1", "t2"];
const HOSTS: &[&str] = &["h0.example", "h1.example", "h2.example", "h3.example"];
/// Catalogued tools and their tiers.
const TOOLS: &[(&str, &str)] = &[
    ("r1", "read"),
    ("r2", "read"),
    ("w1", "write"),
    ("x1", "irreversible"),
    ("hi1", "high_impact"),
];
const TIERS: &[&str] = &["read", "write", "irreversible", "high_impact"];
/// Session labels a request may carry and a policy may name.
const LABELS: &[&str] = &["private_data", "untrusted_input", "l2"];

/// Multiplying any Long of magnitude ≥ 2 by this overflows: an evaluation error.
const OVERFLOW: &str = "4611686018427387904";

/// The config's triggers: two with schemas sharing `ref`, one without.
fn triggers() -> Triggers {
    let def = |name: &str, kind: &str, schema: Option<serde_json::Value>| TriggerDef {
        name: name.into(),
        kind: kind.into(),
        schema,
    };
    Triggers::new(&[
        def(
            "t1",
            "webhook",
            Some(json!({"type": "object", "required": ["ref"],
                "properties": {"ref": {"type": "string"}, "size": {"type": "integer"}}})),
        ),
        def("t2", "schedule", None),
        def(
            "t3",
            "api",
            Some(json!({"type": "object",
                "properties": {"ref": {"type": "string"}, "env": {"type": "string"}}})),
        ),
    ])
}

fn catalog() -> Catalog {
    let mut text = String::new();
    for (name, tier) in TOOLS {
        text.push_str(&format!(
            "[[tool]]\nname = \"{name}\"\ntier = \"{tier}\"\n\
             match = {{ mcp = \"https://mcp.example/mcp\", tool = \"{name}\" }}\n\
             args_schema = {{ type = \"object\", required = [\"title\", \"n\"], properties = \
             {{ title = {{ type = \"string\" }}, n = {{ type = \"integer\" }}, \
             label = {{ type = \"string\" }}, flag = {{ type = \"boolean\" }}, \
             opts = {{ type = \"object\", properties = {{ mode = {{ type = \"string\" }} }} }} }} }}\n\n"
        ));
    }
    Catalog::parse("tools.toml", &text, None).expect("test catalog parses")
}

/// xorshift64*: tiny, deterministic, good enough to spread choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Whether one policy validates strictly on its own (the generator aims at valid policies;
/// the few combinations Cedar's type checker refuses are dropped and counted).
fn validates(validator: &Validator, text: &str) -> bool {
    let set: PolicySet = text.parse().expect("generated policy parses");
    validator
        .validate(&set, ValidationMode::Strict)
        .validation_passed()
}

/// A decision as the comparison sees it: the outcome, the reason of a deny, and the
/// determining policies as a set.
fn normal(decision: &Decision) -> (String, BTreeSet<String>) {
    let kind = match decision {
        Decision::Allow { .. } => "allow".to_owned(),
        Decision::Escalate { .. } => "escalate".to_owned(),
        Decision::Deny { reason, .. } => format!("deny: {reason:?}"),
    };
    (kind, decision.policies().iter().cloned().collect())
}

#[test]
fn indexed_decisions_equal_full_set_decisions() {
    differential(0x9E37_79B9_7F4A_7C15, SETS, false);
}

/// The same over sets whose policies are sliced on their conditions: broad scopes and a
/// leading chain each (tool names, argument values, paths, methods, names).
#[test]
fn indexed_decisions_equal_full_set_decisions_when_conditions_slice() {
    differential(0xD1B5_4A32_D192_ED03, SETS / 2, true);
}

/// Sets of one to four policies, which leave most context attributes unread: the pruned
/// context is what they are decided over.
#[test]
fn a_small_set_decides_over_the_context_it_reads_as_over_the_whole_context() {
    let memo = differential_sized(0x8CB9_2BA7_2F3D_8DD7, SETS, false, 4);
    // Small sets mostly read no session counter, so they keep their decisions: the kept
    // ones must answer often enough for a bad key to show.
    assert!(
        memo.answered_kept * 20 > memo.memoized && memo.memoized * 2 > memo.requests,
        "memo barely exercised: {memo:?}"
    );
}

fn differential(seed: u64, sets: usize, conditioned: bool) {
    let memo = differential_sized(seed, sets, conditioned, 60);
    assert!(memo.answered_kept > 0, "memo never answered: {memo:?}");
}

/// How much of a run the memo answered.
#[derive(Debug)]
struct MemoUse {
    requests: usize,
    /// Requests of sets whose decisions are kept (memo.rs).
    memoized: usize,
    /// Of those, the ones answered by a decision kept for an earlier request.
    answered_kept: usize,
}

fn differential_sized(seed: u64, sets: usize, conditioned: bool, max_size: usize) -> MemoUse {
    let started = std::time::Instant::now();
    let catalog = catalog();
    let triggers = triggers();
    let schema: Schema = PolicyEngine::with_triggers(&[], catalog.clone(), &triggers)
        .expect("empty set loads")
        .schema()
        .clone();
    let validator = Validator::new(schema);

    let mut rng = Rng(seed);
    let (mut requests, mut mismatches, mut dropped, mut generated) = (0usize, 0usize, 0, 0);
    let mut outcomes = [0usize; 5]; // allow, escalate, forbidden, no permit, error
                                    // Requests of sets whose decisions are kept (memo.rs), and of those, the ones answered
                                    // by a decision kept for an earlier request.
    let (mut memoized, mut answered_kept) = (0usize, 0usize);
    let mut first_mismatch = None;
    for set in 0..sets {
        let size = 1 + rng.below(max_size);
        let mut text = String::new();
        for n in 0..size {
            let policy = policy(&mut rng, n, conditioned);
            generated += 1;
            if validates(&validator, &policy) {
                text.push_str(&policy);
            } else {
                dropped += 1;
            }
        }
        if text.is_empty() {
            text.push_str("@id(\"all\") permit (principal, action, resource);\n");
        }
        let sources = [PolicySource {
            name: format!("set{set}.cedar"),
            text: text.clone(),
        }];
        let engine = PolicyEngine::with_triggers(&sources, catalog.clone(), &triggers)
            .unwrap_or_else(|e| panic!("set {set} does not load: {e}\n{text}"));
        // The reference builds every context attribute; the engine only those its set reads.
        let whole = PolicyEngine::with_triggers(&sources, catalog.clone(), &triggers)
            .expect("loaded once already")
            .building_whole_context();

        for _ in 0..REQUESTS_PER_SET {
            let req = request(&mut rng);
            let indexed = engine.decide(&req);
            let full = whole.decide_unindexed(&req);
            let pruned = engine.decide_unindexed(&req);
            requests += 1;
            if normal(&pruned) != normal(&full) {
                mismatches += 1;
                first_mismatch.get_or_insert_with(|| {
                    format!(
                        "set {set}\n{text}\nrequest {req:?}\nwith the context its set \
                         reads {pruned:?}\nwith the whole context {full:?}"
                    )
                });
            }
            outcomes[match &full {
                Decision::Allow { .. } => 0,
                Decision::Escalate { .. } => 1,
                Decision::Deny {
                    reason: DenyReason::Forbidden,
                    ..
                } => 2,
                Decision::Deny {
                    reason: DenyReason::NoPermit,
                    ..
                } => 3,
                Decision::Deny { .. } => 4,
            }] += 1;
            // Every other request, one dimension's lookup on its own, in turn.
            let walked = (requests % 2 == 0).then(|| {
                let dimension = requests / 2 % 4;
                (dimension, engine.decide_walking(&req, dimension))
            });
            if let Some((dimension, walked)) = &walked {
                if normal(walked) != normal(&full) {
                    mismatches += 1;
                    first_mismatch.get_or_insert_with(|| {
                        format!(
                            "set {set}\n{text}\nrequest {req:?}\nwalking dimension \
                             {dimension}: {walked:?}\nfull {full:?}"
                        )
                    });
                }
            }
            // Every other request, a sibling decided right after it (see `sibling`).
            if requests % 2 == 1 {
                let other = sibling(&mut rng, &req);
                let kept = engine.decide(&other);
                let afresh = whole.decide_unindexed(&other);
                if normal(&kept) != normal(&afresh) {
                    mismatches += 1;
                    first_mismatch.get_or_insert_with(|| {
                        format!(
                            "set {set}\n{text}\nrequest {req:?}\nthen {other:?}\n\
                             decided {kept:?}\nafresh {afresh:?}"
                        )
                    });
                }
            }
            if normal(&indexed) != normal(&full) {
                mismatches += 1;
                first_mismatch.get_or_insert_with(|| {
                    format!(
                        "set {set}\n{text}\nrequest {req:?}\nindexed (or kept) {indexed:?}\n\
                         full {full:?}"
                    )
                });
            }
        }
        let kept = engine.kept_decisions();
        if kept > 0 {
            // Each request, and every other one's sibling.
            let decided = REQUESTS_PER_SET + REQUESTS_PER_SET / 2;
            memoized += decided;
            answered_kept += decided - kept;
        }
    }
    println!(
        "index differential: {requests} requests over {sets} sets (conditioned: {conditioned}) ({generated} generated \
         policies, {dropped} dropped by validation), {mismatches} mismatches; outcomes \
         allow {} escalate {} forbidden {} no-permit {} error {}; {memoized} requests of sets \
         keeping decisions, {answered_kept} answered by a kept one; {:.1?}",
        outcomes[0],
        outcomes[1],
        outcomes[2],
        outcomes[3],
        outcomes[4],
        started.elapsed()
    );
    assert!(requests >= sets * REQUESTS_PER_SET);
    // Every outcome is exercised, or the comparison proves little.
    assert!(outcomes.iter().all(|&n| n > 0), "outcomes {outcomes:?}");
    assert!(
        dropped * 10 < generated,
        "generator mostly invalid: {dropped}/{generated}"
    );
    assert_eq!(
        mismatches,
        0,
        "first mismatch: {}",
        first_mismatch.unwrap_or_default()
    );
    MemoUse {
        requests,
        memoized,
        answered_kept,
    }
}
