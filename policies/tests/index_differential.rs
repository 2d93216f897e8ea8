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
    AccessRequest, Action, Catalog, Decision, DenyReason, PolicyEngine, PolicySource, Recent,
    SessionState, TriggerDef, Triggers,
};
use serde_json::json;

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

/// What a policy's action scope admits, which decides the context it may read.
#[derive(Clone, Copy, PartialEq)]
enum Ctx {
    Http,
    Connect,
    HttpOrConnect,
    Mcp,
    Spawn,
    Tool,
    Trigger,
    Mixed,
}

fn agent(rng: &mut Rng) -> String {
    format!("Ostiary::Agent::\"{}\"", rng.pick(AGENTS))
}
fn tenant(rng: &mut Rng) -> String {
    format!("Ostiary::Tenant::\"{}\"", rng.pick(TENANTS))
}
fn host(rng: &mut Rng) -> String {
    format!("Ostiary::Host::\"{}\"", rng.pick(HOSTS))
}
fn tool(rng: &mut Rng) -> String {
    format!("Ostiary::Tool::\"{}\"", rng.pick(TOOLS).0)
}
fn tool_action(rng: &mut Rng) -> String {
    format!("Ostiary::Action::\"tool:{}\"", rng.pick(TOOLS).0)
}
fn tier_action(rng: &mut Rng) -> String {
    format!("Ostiary::Action::\"tier:{}\"", rng.pick(TIERS))
}

fn principal_scope(rng: &mut Rng) -> String {
    match rng.below(9) {
        0..=2 => "principal".into(),
        3 => format!("principal == {}", agent(rng)),
        4 => format!("principal in {}", tenant(rng)),
        5 => format!("principal in {}", agent(rng)),
        6 => "principal is Ostiary::Agent".into(),
        7 => format!("principal is Ostiary::Agent in {}", tenant(rng)),
        // Never true for an agent principal; the index must still agree.
        _ => format!("principal == {}", tenant(rng)),
    }
}

fn action_scope(rng: &mut Rng) -> (String, Ctx) {
    match rng.below(13) {
        12 => (
            "action == Ostiary::Action::\"trigger\"".into(),
            Ctx::Trigger,
        ),
        10 => ("action == Ostiary::Action::\"mcp\"".into(), Ctx::Mcp),
        11 => ("action == Ostiary::Action::\"spawn\"".into(), Ctx::Spawn),
        0 => ("action".into(), Ctx::Mixed),
        1 => ("action == Ostiary::Action::\"http\"".into(), Ctx::Http),
        2 => (
            "action == Ostiary::Action::\"connect\"".into(),
            Ctx::Connect,
        ),
        3 => (
            "action in [Ostiary::Action::\"http\", Ostiary::Action::\"connect\"]".into(),
            Ctx::HttpOrConnect,
        ),
        4 => (format!("action == {}", tool_action(rng)), Ctx::Tool),
        5 | 6 => (format!("action in {}", tier_action(rng)), Ctx::Tool),
        7 => {
            let n = 1 + rng.below(3);
            let list: Vec<String> = (0..n)
                .map(|_| {
                    if rng.chance(50) {
                        tool_action(rng)
                    } else {
                        tier_action(rng)
                    }
                })
                .collect();
            (format!("action in [{}]", list.join(", ")), Ctx::Tool)
        }
        8 => (
            format!(
                "action in [Ostiary::Action::\"http\", {}, {}]",
                tool_action(rng),
                tier_action(rng)
            ),
            Ctx::Mixed,
        ),
        // Equality with a group never matches a tool action (`==` is not `in`).
        _ => (format!("action == {}", tier_action(rng)), Ctx::Tool),
    }
}

fn resource_scope(rng: &mut Rng, ctx: Ctx) -> String {
    let host_like = matches!(
        ctx,
        Ctx::Http | Ctx::Connect | Ctx::HttpOrConnect | Ctx::Mcp
    );
    if ctx == Ctx::Trigger {
        let trigger = format!(
            "Ostiary::Trigger::\"{}\"",
            rng.pick(&["t1", "t2", "t3", "t9"])
        );
        return match rng.below(5) {
            0 | 1 => "resource".into(),
            2 => format!("resource == {trigger}"),
            3 => format!("resource in {trigger}"),
            _ => "resource is Ostiary::Trigger".into(),
        };
    }
    if ctx == Ctx::Spawn {
        return match rng.below(5) {
            0 | 1 => "resource".into(),
            2 => format!("resource == {}", agent(rng)),
            3 => format!("resource in {}", agent(rng)),
            _ => "resource is Ostiary::Agent".into(),
        };
    }
    match rng.below(8) {
        0..=2 => "resource".into(),
        3 | 4 if host_like => format!("resource == {}", host(rng)),
        3 | 4 if ctx == Ctx::Tool => format!("resource == {}", tool(rng)),
        3 | 4 => {
            if rng.chance(50) {
                format!("resource == {}", host(rng))
            } else {
                format!("resource == {}", tool(rng))
            }
        }
        5 if host_like => format!("resource in {}", host(rng)),
        5 => format!("resource in {}", tool(rng)),
        6 if host_like => "resource is Ostiary::Host".into(),
        6 => "resource is Ostiary::Tool".into(),
        // A resource of the other kind: never matches, still must agree.
        _ if ctx == Ctx::Tool => format!("resource == {}", host(rng)),
        _ => format!("resource == {}", tool(rng)),
    }
}

/// One clause of a condition that type-checks for every action the scope admits.
fn clause(rng: &mut Rng, ctx: Ctx) -> String {
    let generic = |rng: &mut Rng| match rng.below(10) {
        0 => format!("principal in {}", tenant(rng)),
        1 => format!("principal == {}", agent(rng)),
        5 => format!("principal.name == \"{}\"", rng.pick(AGENTS)),
        6 => format!(
            "context.session.profile != \"{}\"",
            rng.pick(&["", "strict"])
        ),
        7 => match rng.below(3) {
            // `context` other than through an attribute: every attribute is read.
            0 => "context has session && context.session has calls".into(),
            1 => "{\"c\": context}.c has session".into(),
            _ => format!("[{}, {}].contains(principal)", agent(rng), agent(rng)),
        },
        // Every action's context carries the session.
        2 => "context.session.depth > 0".into(),
        3 => format!("context.session.parent_agent == \"{}\"", rng.pick(AGENTS)),
        // What the session touched and did recently: a set the index cannot decide on
        // (the chain stops there), and Longs under a nested record (it can).
        8 => match rng.below(3) {
            0 => format!("context.session.labels.contains(\"{}\")", rng.pick(LABELS)),
            1 => format!(
                "context.session.labels.containsAll([\"{}\", \"{}\"])",
                rng.pick(LABELS),
                rng.pick(LABELS)
            ),
            _ => "context.session.labels.isEmpty()".into(),
        },
        9 => match rng.below(3) {
            0 => format!("context.session.recent.tool_1h > {}", rng.below(4)),
            1 => format!("context.session.recent.tier_10m == {}", rng.below(3)),
            _ => "context.session.recent.tool_10m >= context.session.recent.tier_1h".into(),
        },
        _ => "true".into(),
    };
    if rng.chance(20) {
        return generic(rng);
    }
    match ctx {
        Ctx::Http => match rng.below(8) {
            0 => format!(
                "context.method == \"{}\"",
                rng.pick(&["GET", "POST", "DELETE"])
            ),
            // Literal paths, either side: the index slices on them when they lead.
            6 => format!(
                "context.path == \"{}\"",
                rng.pick(&["/", "/admin/x", "/boom", "/items", "/nowhere"])
            ),
            7 => format!("\"{}\" == context.path", rng.pick(&["/items", "/admin/x"])),
            // Prefixes the index slices on, and patterns it must not.
            1 => format!(
                "context.path like \"{}\"",
                rng.pick(&["/admin*", "/i*", "/*", "*s", "/a*x", "/items"])
            ),
            2 => match rng.below(3) {
                0 => "context.port == 443".into(),
                1 => format!("{} == context.port", rng.pick(&["80", "8443"])),
                _ => format!(
                    "[\"{}\", \"{}\"].contains(context.method)",
                    rng.pick(&["GET", "POST", "DELETE"]),
                    rng.pick(&["GET", "POST", "DELETE"])
                ),
            },
            3 => match rng.below(3) {
                0 => "context.query == \"\"".into(),
                1 => format!("context.method != \"{}\"", rng.pick(&["GET", "POST"])),
                _ => format!("resource == {}", host(rng)),
            },
            4 => format!("(context.path != \"/boom\" || context.port * {OVERFLOW} > 0)"),
            _ => match rng.below(3) {
                0 => "resource.name like \"h1*\"".into(),
                1 => format!("resource.name == \"{}\"", rng.pick(HOSTS)),
                _ => format!(
                    "context.path like \"{}\"",
                    rng.pick(&["*x", "/a*m*", "/items", "*", "/*s"])
                ),
            },
        },
        Ctx::Connect => match rng.below(3) {
            0 => "context.port == 443".into(),
            1 => "context.sni like \"*.example\"".into(),
            _ => format!("(context.sni != \"boom\" || context.port * {OVERFLOW} > 0)"),
        },
        Ctx::HttpOrConnect => "context.port != 8443".into(),
        Ctx::Mcp => match rng.below(3) {
            0 => format!(
                "context.method == \"{}\"",
                rng.pick(&["initialize", "ping", "resources/read"])
            ),
            1 => "context.method like \"notifications/*\"".into(),
            _ => "context.server like \"https://h1*\"".into(),
        },
        Ctx::Spawn => match rng.below(4) {
            0 => format!("resource == {}", agent(rng)),
            3 => format!("resource.name == \"{}\"", rng.pick(AGENTS)),
            1 => "context.session.calls < 3".into(),
            _ => format!("(context.session.depth != 2 || context.session.calls * {OVERFLOW} > 0)"),
        },
        Ctx::Tool if rng.chance(45) => match rng.below(11) {
            10 => "context.args has label && context.args.label != \"l2\"".into(),
            0 => format!("resource == {}", tool(rng)),
            1 => format!(
                "context.args has label && context.args.label == \"{}\"",
                rng.pick(&["l1", "l2"])
            ),
            2 => format!(
                "context.args has label && [\"{}\", \"l3\"].contains(context.args.label)",
                rng.pick(&["l1", "l2"])
            ),
            3 => format!("context.args.n == {}", rng.below(6)),
            4 => format!(
                "context.args.title like \"{}\"",
                rng.pick(&["x*", "b*", "y", "*m"])
            ),
            5 => format!(
                "[\"{}\", \"{}\"].contains(context.args.title)",
                rng.pick(&["x", "y", "boom"]),
                rng.pick(&["x", "y"])
            ),
            // Never read by the index (the escalation re-check flips it).
            6 => format!("context.approval.granted == {}", rng.chance(50)),
            7 => "context.args has opts && context.args.opts has mode && \
                  context.args.opts.mode == \"m1\""
                .into(),
            8 => format!(
                "context.args has flag && context.args.flag == {}",
                rng.chance(50)
            ),
            _ => format!(
                "context.approval.approver == \"{}\"",
                rng.pick(&["", "alice"])
            ),
        },
        Ctx::Tool => match rng.below(8) {
            0 => format!("context.args.title == \"{}\"", rng.pick(&["x", "y"])),
            1 => "context.args.n > 5".into(),
            2 => "context.impact.records > 10".into(),
            3 => "context.session.calls >= 3".into(),
            4 => "context.approval.granted".into(),
            5 => format!("(context.args.title != \"boom\" || context.args.n * {OVERFLOW} > 0)"),
            6 => format!("resource.tier == \"{}\"", rng.pick(TIERS)),
            _ => "resource.reversible".into(),
        },
        Ctx::Trigger => match rng.below(7) {
            0 => format!(
                "resource == Ostiary::Trigger::\"{}\"",
                rng.pick(&["t1", "t2", "t3"])
            ),
            1 => format!(
                "resource.kind == \"{}\"",
                rng.pick(&["webhook", "schedule", "api"])
            ),
            2 => format!(
                "context.payload has ref && context.payload.ref == \"{}\"",
                rng.pick(&["main", "dev"])
            ),
            3 => "context.payload has size && context.payload.size > 2".into(),
            4 => "resource.name like \"t*\"".into(),
            // Read without `has`: strict validation refuses it, so it is dropped.
            5 => "context.payload.env == \"prod\"".into(),
            _ => "context.session.depth == 1".into(),
        },
        Ctx::Mixed => match rng.below(3) {
            0 => "context has method && context.method == \"GET\"".into(),
            // An attribute only tested for: absent from the context, the test says so.
            1 => format!(
                "context has {}",
                rng.pick(&["path", "sni", "server", "impact", "approval", "args"])
            ),
            _ => generic(rng),
        },
    }
}

/// Policy text for one generated policy, with id `p<n>`. `conditioned`: scopes that name
/// no principal or resource, and a first `when` that is a chain of conjuncts, so that the
/// index slices on conditions (its conditions dimension is the smallest).
fn policy(rng: &mut Rng, n: usize, conditioned: bool) -> String {
    let (action, ctx) = action_scope(rng);
    let (principal, resource) = if conditioned {
        ("principal".to_owned(), "resource".to_owned())
    } else {
        (principal_scope(rng), resource_scope(rng, ctx))
    };
    let forbid = rng.chance(35);
    let escalate = forbid && matches!(ctx, Ctx::Tool | Ctx::Trigger) && rng.chance(60);
    let mut text = format!("@id(\"p{n}\")\n");
    if escalate {
        text.push_str("@escalate(\"approval\")\n");
    }
    text.push_str(if forbid { "forbid" } else { "permit" });
    text.push_str(&format!(" ({principal}, {action}, {resource})"));
    if conditioned {
        let chain: Vec<String> = (0..1 + rng.below(3)).map(|_| clause(rng, ctx)).collect();
        text.push_str(&format!(" when {{ {} }}", chain.join(" && ")));
    }
    if escalate && rng.chance(70) {
        text.push_str(" unless { context.approval.granted }");
        if rng.chance(50) {
            text.push_str(&format!(" when {{ {} }}", clause(rng, ctx)));
        }
    } else {
        for _ in 0..rng.below(3) {
            let keyword = if rng.chance(75) { "when" } else { "unless" };
            let body = if rng.chance(25) {
                format!("{} || {}", clause(rng, ctx), clause(rng, ctx))
            } else if rng.chance(40) {
                // Longer chains: the index walks them conjunct by conjunct.
                format!(
                    "{} && {} && {}",
                    clause(rng, ctx),
                    clause(rng, ctx),
                    clause(rng, ctx)
                )
            } else {
                format!("{} && {}", clause(rng, ctx), clause(rng, ctx))
            };
            text.push_str(&format!(" {keyword} {{ {body} }}"));
        }
    }
    text.push_str(";\n");
    if escalate && rng.chance(40) {
        // A permit that only the escalation re-check (`approval.granted` flipped) can
        // satisfy, led by the approval: a slice that depended on it would lose escalations.
        text.push_str(&format!(
            "@id(\"p{n}g\")\npermit ({principal}, {action}, {resource}) when {{ \
             context.approval.granted == true && {} }};\n",
            clause(rng, ctx)
        ));
    }
    text
}

/// Whether one policy validates strictly on its own (the generator aims at valid policies;
/// the few combinations Cedar's type checker refuses are dropped and counted).
fn validates(validator: &Validator, text: &str) -> bool {
    let set: PolicySet = text.parse().expect("generated policy parses");
    validator
        .validate(&set, ValidationMode::Strict)
        .validation_passed()
}

fn request(rng: &mut Rng) -> AccessRequest {
    let action = match rng.below(13) {
        12 => {
            let (name, kind) = *rng.pick(&[
                ("t1", "webhook"),
                ("t2", "schedule"),
                ("t3", "api"),
                ("t9", "webhook"),
            ]);
            let mut payload = json!({});
            if rng.chance(80) {
                payload["ref"] = json!(rng.pick(&["main", "dev"]));
            }
            if rng.chance(40) {
                payload["size"] = json!(rng.below(5));
            }
            if rng.chance(30) {
                payload["env"] = json!("prod");
            }
            if rng.chance(5) {
                // Not the trigger's schema: an error, indexed or not.
                payload["ref"] = json!(3);
            }
            Action::Trigger {
                name: name.into(),
                kind: kind.into(),
                payload,
                approval: rng.chance(15).then(|| "alice".to_owned()),
            }
        }
        10 => Action::Mcp {
            method: rng
                .pick(&["initialize", "ping", "resources/read", "notifications/x"])
                .to_string(),
            server: format!("https://{}/mcp", rng.pick(HOSTS)),
        },
        11 => Action::Spawn {
            child: rng.pick(AGENTS).to_string(),
        },
        0..=3 => Action::Http {
            method: rng.pick(&["GET", "POST", "DELETE"]).to_string(),
            scheme: "https".into(),
            port: *rng.pick(&[443, 8443, 80]),
            path: rng.pick(&["/", "/admin/x", "/boom", "/items"]).to_string(),
            query: rng.pick(&["", "q=1"]).to_string(),
        },
        4 => Action::Connect {
            port: *rng.pick(&[443, 22]),
            sni: rng.pick(&["h0.example", "boom", "other.org"]).to_string(),
        },
        _ => {
            let name = if rng.chance(3) {
                "ghost".to_owned()
            } else {
                rng.pick(TOOLS).0.to_owned()
            };
            let args = if rng.chance(3) {
                // Not the tool's schema: an evaluation error, indexed or not.
                json!({ "title": 5 })
            } else {
                let mut args = json!({
                    "title": rng.pick(&["x", "y", "boom", "xm"]),
                    "n": rng.below(12) as i64 - 2,
                });
                // Optional arguments, present or not (absent ones error where read).
                if rng.chance(50) {
                    args["label"] = json!(rng.pick(&["l1", "l2", "l3"]));
                }
                if rng.chance(30) {
                    args["flag"] = json!(rng.chance(50));
                }
                if rng.chance(40) {
                    args["opts"] = if rng.chance(70) {
                        json!({ "mode": rng.pick(&["m1", "m2"]) })
                    } else {
                        json!({})
                    };
                }
                if rng.chance(10) {
                    // An integral float where a Long is declared: still the Long.
                    args["n"] = json!(3.0);
                }
                args
            };
            Action::Tool {
                name,
                args,
                impact_records: rng.below(20) as i64,
                cost_micros: rng.below(5000) as i64,
                approval: rng.chance(15).then(|| "alice".to_owned()),
                undo: false,
            }
        }
    };
    AccessRequest {
        agent: rng.pick(AGENTS).to_string(),
        tenant: rng.pick(TENANTS).to_string(),
        host: if rng.chance(10) {
            "unknown.example".into()
        } else {
            rng.pick(HOSTS).to_string()
        },
        session: SessionState {
            calls: rng.below(6) as i64,
            cost_micros: 0,
            depth: rng.below(3) as i64,
            parent_agent: if rng.chance(50) {
                String::new()
            } else {
                rng.pick(AGENTS).to_string()
            },
            profile: String::new(),
            labels: LABELS
                .iter()
                .filter(|_| rng.chance(40))
                .map(|l| (*l).to_owned())
                .collect(),
            recent: {
                let (tool_10m, tier_10m) = (rng.below(3) as i64, rng.below(2) as i64);
                let (tool_1h, tier_1h) = (
                    tool_10m + rng.below(3) as i64,
                    tier_10m + rng.below(3) as i64,
                );
                Recent {
                    tool_10m,
                    tool_1h,
                    tier_10m: tier_10m + tool_10m,
                    tier_1h: tier_1h + tool_1h,
                }
            },
        },
        action,
    }
}

/// `req` with one thing changed, most often something its set's decision may not depend on:
/// decided right after `req`, it is answered by `req`'s kept decision exactly when the memo
/// judges the change irrelevant, so a key that leaves out what counts shows as a mismatch.
fn sibling(rng: &mut Rng, req: &AccessRequest) -> AccessRequest {
    let mut other = req.clone();
    let s = &mut other.session;
    match rng.below(8) {
        0 => s.calls += 1,
        1 => s.depth += 1,
        2 => {
            s.parent_agent = rng.pick(AGENTS).to_string();
        }
        3 => {
            let label = rng.pick(LABELS).to_string();
            if !s.labels.remove(&label) {
                s.labels.insert(label);
            }
        }
        4 => {
            s.recent.tool_10m += 1;
            s.recent.tool_1h += 1;
            s.recent.tier_10m += 1;
            s.recent.tier_1h += 1;
        }
        _ => match &mut other.action {
            Action::Http {
                method,
                path,
                query,
                port,
                ..
            } => match rng.below(4) {
                0 => *method = rng.pick(&["GET", "POST", "DELETE"]).to_string(),
                1 => *path = rng.pick(&["/", "/admin/x", "/boom", "/items"]).to_string(),
                2 => *query = rng.pick(&["", "q=1"]).to_string(),
                _ => *port = *rng.pick(&[443, 8443, 80]),
            },
            Action::Connect { sni, .. } => {
                *sni = rng.pick(&["h0.example", "boom", "other.org"]).to_string()
            }
            Action::Mcp { method, .. } => {
                *method = rng
                    .pick(&["initialize", "ping", "resources/read"])
                    .to_string()
            }
            Action::Tool {
                args,
                approval,
                impact_records,
                ..
            } => match rng.below(3) {
                0 => *approval = approval.is_none().then(|| "alice".to_owned()),
                1 => *impact_records += 50,
                _ => args["title"] = json!(rng.pick(&["x", "y", "boom", "xm"])),
            },
            Action::Trigger {
                payload, approval, ..
            } => match rng.below(2) {
                0 => *approval = approval.is_none().then(|| "alice".to_owned()),
                _ => payload["ref"] = json!(rng.pick(&["main", "dev"])),
            },
            Action::Spawn { child } => *child = rng.pick(AGENTS).to_string(),
        },
    }
    other
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
