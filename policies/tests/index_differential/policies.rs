//! Generated policies: scopes over the few agents, tenants, hosts, tools and tiers, and
//! conditions that type-check for every action a scope admits (some of which error).

use super::*;

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
pub(super) fn policy(rng: &mut Rng, n: usize, conditioned: bool) -> String {
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
