//! Replay against live evaluation: generated requests of every action are decided by a live
//! set, kept as the audit trail keeps them (`recorded::to_json`, through JSON text), read back
//! and decided again. Against the set that made them, every replayed decision is the recorded
//! one; against a candidate set, every replayed decision is what the candidate decides for
//! the original request — so `ostiary policy replay` predicts exactly what a shadow set
//! decided live. Any difference fails the test with the first example.

use std::collections::BTreeSet;

use ostiary_policies::recorded::{self, Recorded};
use ostiary_policies::{
    AccessRequest, Action, Catalog, Decision, PolicyEngine, PolicySource, Recent, SessionState,
    TriggerDef, Triggers,
};
use serde_json::json;

const REQUESTS: usize = 12_000;

const CATALOG: &str = r#"
[[tool]]
name = "files.read"
tier = "read"
match = { host = "files.example", method = "GET", path = "/files/{path}" }

[[tool]]
name = "pay.refund"
tier = "high_impact"
match = { host = "pay.example", method = "POST", path = "/refunds" }
args_schema = { type = "object", required = ["amount"], properties = { amount = { type = "integer" }, note = { type = "string" } } }
"#;

const LIVE: &str = r#"
@id("reads") permit (principal, action in Ostiary::Action::"tier:read", resource);
@id("refunds") permit (principal, action == Ostiary::Action::"tool:pay.refund", resource)
when { context.args.amount < 500 };
@id("big-refunds") @escalate("approval")
forbid (principal, action == Ostiary::Action::"tool:pay.refund", resource)
when { context.args.amount > 100 } unless { context.approval.granted };
@id("web") permit (principal, action == Ostiary::Action::"http", resource)
when { context.method == "GET" && context.session.calls < 8 };
@id("admin-paths") forbid (principal, action == Ostiary::Action::"http", resource)
when { context.path like "/admin*" };
@id("mcp") permit (principal, action == Ostiary::Action::"mcp", resource);
@id("spawn") permit (principal == Ostiary::Agent::"a0", action == Ostiary::Action::"spawn", resource);
@id("triggers") permit (principal, action == Ostiary::Action::"trigger", resource)
when { context.payload has env && context.payload.env != "frozen" };
@id("tls") permit (principal, action == Ostiary::Action::"connect", resource)
when { context.port == 443 };
"#;

/// The live set changed the way a shadow set would: stricter on writes and web, looser on
/// spawns.
const CANDIDATE: &str = r#"
@id("reads") permit (principal, action in Ostiary::Action::"tier:read", resource);
@id("refunds") permit (principal, action == Ostiary::Action::"tool:pay.refund", resource)
when { context.args.amount < 300 };
@id("notes") forbid (principal, action == Ostiary::Action::"tool:pay.refund", resource)
when { context.args has note && context.args.note == "urgent" };
@id("web") permit (principal, action == Ostiary::Action::"http", resource)
when { context.method == "GET" && context.session.depth == 0 };
@id("mcp") permit (principal, action == Ostiary::Action::"mcp", resource)
unless { context.method == "resources/read" };
@id("spawn") permit (principal, action == Ostiary::Action::"spawn", resource);
@id("triggers") permit (principal, action == Ostiary::Action::"trigger", resource)
when { resource.kind == "webhook" };
"#;

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
    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

fn engine(text: &str) -> PolicyEngine {
    let catalog = Catalog::parse("tools.toml", CATALOG, None).unwrap();
    let triggers = Triggers::new(&[TriggerDef {
        name: "deploy".into(),
        kind: "api".into(),
        schema: Some(json!({"type": "object", "properties": {"env": {"type": "string"}}})),
    }]);
    PolicyEngine::with_triggers(
        &[PolicySource {
            name: "p.cedar".into(),
            text: text.into(),
        }],
        catalog,
        &triggers,
    )
    .unwrap()
}

fn request(rng: &mut Rng) -> AccessRequest {
    let approval = |rng: &mut Rng| (rng.below(5) == 0).then(|| "alice".to_owned());
    let action = match rng.below(7) {
        0 => Action::Http {
            method: rng.pick(&["GET", "POST"]).into(),
            scheme: "https".into(),
            port: 443,
            path: rng.pick(&["/", "/admin/x", "/docs"]).into(),
            query: rng.pick(&["", "q=1"]).into(),
        },
        1 => Action::Connect {
            port: [443, 22][rng.below(2)],
            sni: "h.example".into(),
        },
        2 => Action::Mcp {
            method: rng.pick(&["initialize", "resources/read", "ping"]).into(),
            server: "https://m.example/mcp".into(),
        },
        3 => Action::Spawn {
            child: rng.pick(&["a1", "a2"]).into(),
        },
        4 => Action::Trigger {
            name: "deploy".into(),
            kind: rng.pick(&["api", "webhook"]).into(),
            payload: match rng.below(4) {
                0 => json!({}),
                1 => json!({"env": "frozen"}),
                2 => json!({"env": 3}),
                _ => json!({"env": "qa", "extra": [1, 2]}),
            },
            approval: approval(rng),
        },
        5 => Action::Tool {
            name: "files.read".into(),
            args: json!({"path": rng.pick(&["a", "b"])}),
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo: false,
        },
        _ => {
            let mut args = json!({"amount": rng.below(800)});
            match rng.below(6) {
                0 => args["note"] = json!("urgent"),
                // A credential among the arguments: redacted, so the record is partial.
                1 => args["note"] = json!("AKIAIOSFODNN7EXAMPLE"),
                2 => args["amount"] = json!("lots"),
                3 => args["note"] = json!("x".repeat(5000)),
                _ => {}
            }
            Action::Tool {
                name: "pay.refund".into(),
                args,
                impact_records: 1,
                cost_micros: 10,
                approval: approval(rng),
                undo: false,
            }
        }
    };
    let labels: BTreeSet<String> = (0..rng.below(3))
        .map(|_| rng.pick(&["private_data", "untrusted_input"]).to_owned())
        .collect();
    AccessRequest {
        agent: rng.pick(&["a0", "a1"]).into(),
        tenant: "t".into(),
        host: rng
            .pick(&["files.example", "pay.example", "h.example"])
            .into(),
        session: SessionState {
            calls: rng.below(12) as i64,
            cost_micros: rng.below(1000) as i64,
            depth: rng.below(3) as i64,
            parent_agent: rng.pick(&["", "a0"]).into(),
            profile: rng.pick(&["", "default"]).into(),
            labels,
            recent: Recent {
                tool_10m: rng.below(5) as i64,
                tool_1h: rng.below(9) as i64,
                tier_10m: rng.below(5) as i64,
                tier_1h: rng.below(9) as i64,
            },
        },
        action,
    }
}

fn looks_secret(s: &str) -> bool {
    s.starts_with("AKIA")
}

/// A decision kept and read back, as `ostiary policy replay` reads it.
fn kept(req: &AccessRequest, decision: &Decision) -> Recorded {
    let text = recorded::to_json(req, decision, &looks_secret).to_string();
    recorded::from_json(&serde_json::from_str(&text).unwrap()).unwrap()
}

#[test]
fn replay_agrees_with_live_evaluation() {
    let live = engine(LIVE);
    let candidate = engine(CANDIDATE);
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let (mut partial, mut changed, mut outcomes) = (0, 0, [0usize; 3]);
    for i in 0..REQUESTS {
        let req = request(&mut rng);
        let decided = live.decide(&req);
        outcomes[match decided {
            Decision::Allow { .. } => 0,
            Decision::Escalate { .. } => 1,
            Decision::Deny { .. } => 2,
        }] += 1;
        let back = kept(&req, &decided);
        if back.partial {
            partial += 1;
            continue;
        }
        assert_eq!(back.request, req, "request {i} read back differently");
        // Against the set that made it: the recorded decision, exactly.
        let again = live.decide(&back.request);
        assert_eq!(
            recorded::compare(&back, &again),
            None,
            "request {i}: {req:?}\nrecorded {decided:?}\nreplayed {again:?}"
        );
        // Against a candidate: what the candidate decides for the original request.
        let shadow = candidate.decide(&req);
        let predicted = candidate.decide(&back.request);
        assert_eq!(predicted, shadow, "request {i}: {req:?}");
        changed += usize::from(recorded::compare(&back, &predicted).is_some());
    }
    eprintln!(
        "replay: {REQUESTS} requests, {partial} partial (not replayed), {changed} changed by \
         the candidate; allow {} escalate {} deny {}",
        outcomes[0], outcomes[1], outcomes[2]
    );
    assert!(REQUESTS - partial >= 10_000, "{partial} partial");
    assert!(
        changed > 500,
        "the candidate must disagree often: {changed}"
    );
    assert!(outcomes.iter().all(|n| *n > 500), "{outcomes:?}");
}

#[test]
fn credentials_and_large_arguments_are_not_kept() {
    let live = engine(LIVE);
    let mut req = request(&mut Rng(1));
    req.action = Action::Tool {
        name: "pay.refund".into(),
        args: json!({"amount": 5, "note": "AKIAIOSFODNN7EXAMPLE"}),
        impact_records: 1,
        cost_micros: 0,
        approval: None,
        undo: false,
    };
    let decision = live.decide(&req);
    let text = recorded::to_json(&req, &decision, &looks_secret).to_string();
    assert!(!text.contains("AKIA"), "{text}");
    assert!(kept(&req, &decision).partial);
    if let Action::Tool { args, .. } = &mut req.action {
        *args = json!({"amount": 5, "note": "y".repeat(recorded::MAX_ARGS_BYTES)});
    }
    let text = recorded::to_json(&req, &decision, &looks_secret).to_string();
    assert!(!text.contains("yyyy"), "{text}");
    assert!(kept(&req, &decision).partial);
    assert!(recorded::from_json(&json!({"action": {"type": "teleport"}})).is_err());
}
