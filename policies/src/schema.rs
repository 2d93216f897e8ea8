//! The fixed core of the Cedar schema (DESIGN §4). Every policy set is validated strictly
//! against it before it is loaded, so a policy that names a missing attribute is rejected at
//! load time instead of silently erroring (and being skipped) at evaluation time.

/// Cedar namespace of every Ostiary entity and action.
pub const NAMESPACE: &str = "Ostiary";

/// The core schema in Cedar's human-readable syntax.
pub const CORE_SCHEMA: &str = r#"
namespace Ostiary {
  // A tenant groups agents; policies say `principal in Ostiary::Tenant::"acme"`.
  entity Tenant;

  // An agent is the principal of every request; its parent is its tenant.
  entity Agent in [Tenant];

  // A destination host: lowercase DNS name or canonical IP text, never with a port.
  // `name` repeats the id so that suffix rules can be written:
  // `resource.name like "*.example.com"` (anchor suffixes at a dot).
  entity Host {
    name: String,
  };

  // An inspected HTTP request (plain http:// or inside an intercepted TLS tunnel).
  type HttpContext = {
    method: String,
    scheme: String,
    port: Long,
    path: String,
    query: String,
  };

  // An uninspected tunnel (hosts listed in `egress.tunnel`), and CONNECT to a port outside
  // `egress.ports`, which only a policy naming the port may open.
  type ConnectContext = {
    port: Long,
    sni: String,
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
}
"#;
