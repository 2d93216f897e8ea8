//! The Cedar schema (docs/design.md §4): a fixed core plus one action per catalog tool, generated
//! from the catalog. Every policy set is validated strictly against it before it is loaded,
//! so a policy that names a missing attribute (or a tool argument the tool's JSON Schema does
//! not declare) is rejected at load time instead of silently erroring (and being skipped) at
//! evaluation time.
//!
//! # Tool actions
//! Each tool `<name>` is `Action::"tool:<name>"`, a member of its tier's group
//! `Action::"tier:<tier>"`, applying to `Agent` principals and `Tool` resources, with the
//! context
//! - `args`: the record derived from the tool's JSON Schema (see [`crate::args`] for the
//!   mapping and what it leaves out); an empty record for a tool without schema, except that
//!   a REST route's path parameters are always there, as required `String`s;
//! - `impact`: `records` (from the catalog's `impact.records` pointer, 0 when the tool has
//!   none) and `cost`;
//! - `session`: `calls`, `cost` and `depth` so far, `parent_agent` and `profile` (as every
//!   action's context has);
//! - `approval`: `granted`, and the `approver` (empty when not granted).
//!
//! # Triggers
//! `Action::"trigger"` (principal the trigger's agent, resource `Trigger::"<name>"`) has the
//! context `payload` (one record for every trigger, see [`crate::triggers`]), `session` and
//! `approval`, so a trigger's run can be held for a human with `@escalate` like a tool call.
//!
//! # Session
//! Every action's context carries `session` (`Session` below), so a policy can tell a child
//! session from its root (`context.session.depth > 0`, `context.session.parent_agent`) and a
//! sandboxed run from an unsandboxed one (`context.session.profile`), whatever it asks.
//! `labels` is what the session touched (the catalog's labelled tools and hosts,
//! [`crate::labels`]), and `recent` its recent calls of the request's tool and tier, so a
//! policy can remember what the session did before this request.
//!
//! # Money
//! Cedar has no floating-point type, so every cost (`impact.cost`, `session.cost`) is a
//! `Long` in **micro-units** of the catalog's currency: `cost = 0.001` in `tools.toml` is
//! `1000` in policies (`context.session.cost + context.impact.cost <= 5000000` keeps a session
//! under 5.00). Rounded to the nearest micro-unit.

use std::fmt::Write as _;

use crate::catalog::{Catalog, Tier};
use crate::triggers::Triggers;

/// Cedar namespace of every Ostiary entity and action.
pub const NAMESPACE: &str = "Ostiary";

/// The fixed core of the schema, the body of `namespace Ostiary { ... }`.
pub const CORE: &str = r#"
  // A tenant groups agents; policies say `principal in Ostiary::Tenant::"acme"`.
  entity Tenant;

  // An agent is the principal of every request; its parent is its tenant. It is also the
  // resource of `spawn` (the agent name a child session asks for). `name` repeats the id,
  // as Host's does, so that prefix and suffix rules can be written on either.
  entity Agent in [Tenant] {
    name: String,
  };

  // A destination host: lowercase DNS name or canonical IP text, never with a port.
  // `name` repeats the id so that suffix rules can be written:
  // `resource.name like "*.example.com"` (anchor suffixes at a dot).
  entity Host {
    name: String,
  };

  // A catalogued tool (tools.toml); its id is the tool name. `server` is the host serving it.
  entity Tool {
    tier: String,
    reversible: Bool,
    server: String,
  };

  // A trigger of the config ([[trigger]]): the resource of `trigger`. `name` repeats the
  // id; `kind` is "webhook", "schedule" or "api".
  entity Trigger {
    name: String,
    kind: String,
  };

  // What the session asking has done so far, and where it sits in the spawn tree: the
  // `session` of every action's context. Costs are Long micro-units (0.001 = 1000).
  // `parent_agent` is empty for a root session; `profile` is the sandbox profile, empty
  // when the session runs without one. `labels`: those of every labelled tool and host
  // (tools.toml) the session or its ancestors were allowed; `recent`: the calls of this
  // request's tool and of its tier allowed to the session in the last 10 minutes and hour,
  // this request not counted (all 0 when the action is not a tool call).
  type Session = {
    calls: Long,
    cost: Long,
    depth: Long,
    parent_agent: String,
    profile: String,
    labels: Set<String>,
    recent: Recent,
  };

  type Recent = {
    tool_10m: Long,
    tool_1h: Long,
    tier_10m: Long,
    tier_1h: Long,
  };

  // An inspected HTTP request (plain http:// or inside an intercepted TLS tunnel).
  type HttpContext = {
    method: String,
    scheme: String,
    port: Long,
    path: String,
    query: String,
    session: Session,
  };

  // An uninspected tunnel (hosts listed in `egress.tunnel`), and CONNECT to a port outside
  // `egress.ports`, which only a policy naming the port may open.
  type ConnectContext = {
    port: Long,
    sni: String,
    session: Session,
  };

  // A JSON-RPC message other than `tools/call` to a catalogued MCP endpoint: `method` is the
  // JSON-RPC method (empty for a response the client sends back to a server request),
  // `server` the endpoint's URL as tools.toml writes it.
  type McpContext = {
    method: String,
    server: String,
    session: Session,
  };

  // A session asking for a child under another agent name (the resource).
  type SpawnContext = {
    session: Session,
  };

  // Parts of every tool call's context. Costs are Long micro-units (0.001 = 1000).
  type Impact = {
    records: Long,
    cost: Long,
  };
  type Approval = {
    granted: Bool,
    approver: String,
  };

  action "http" appliesTo {
    principal: [Agent],
    resource: [Host],
    context: HttpContext,
  };

  action "connect" appliesTo {
    principal: [Agent],
    resource: [Host],
    context: ConnectContext,
  };

  action "mcp" appliesTo {
    principal: [Agent],
    resource: [Host],
    context: McpContext,
  };

  // Principal: the parent session's agent; resource: the agent name the child asks for.
  // A child with its parent's name needs no permit; any other name needs one.
  action "spawn" appliesTo {
    principal: [Agent],
    resource: [Agent],
    context: SpawnContext,
  };

  // Tier groups: `action in Ostiary::Action::"tier:irreversible"` covers every such tool.
  action "tier:read";
  action "tier:write";
  action "tier:irreversible";
  action "tier:high_impact";
"#;

/// The schema for a catalog, in Cedar's human-readable syntax (`ostiary policy schema`).
pub fn generate(catalog: &Catalog, triggers: &Triggers) -> String {
    let mut out = format!("namespace {NAMESPACE} {{{CORE}");
    triggers.write_action(&mut out);
    debug_assert!(Tier::ALL.iter().all(|t| CORE.contains(t.as_str())));
    for tool in catalog.tools() {
        let _ = writeln!(
            out,
            "\n  // {} (tools.toml line {}), tier {}",
            tool.name(),
            tool.line(),
            tool.tier().as_str()
        );
        for omitted in tool.omitted_args() {
            // The path holds property names as the catalog wrote them: escaped, so that no
            // character of a name (a newline, say) can end the comment and become schema.
            let _ = writeln!(
                out,
                "  // {} left out: {}",
                omitted.path.escape_debug(),
                omitted.why
            );
        }
        // Tool names are restricted to [A-Za-z0-9_.-] by the catalog: safe inside quotes.
        // A tool that declares `undo` has a second action, its undo's, with the same context.
        let undo = tool.undo().map(|_| format!("{}.undo", tool.name()));
        for action in std::iter::once(tool.name()).chain(undo.as_deref()) {
            let _ = write!(
                out,
                "  action \"tool:{action}\" in [Action::\"tier:{}\"] appliesTo {{\n    \
                 principal: [Agent],\n    resource: [Tool],\n    context: {{\n      args: ",
                tool.tier().as_str()
            );
            tool.args.write(&mut out, 3);
            out.push_str(
                ",\n      impact: Impact,\n      session: Session,\n      approval: Approval,\n    \
                 },\n  };\n",
            );
        }
    }
    out.push_str("}\n");
    out
}
