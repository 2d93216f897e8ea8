//! The checks of an MCP exchange's `tools/call`s: each call policy allowed or escalated
//! pays its own tool's tier, all calls of a batch at once, each under its own budget; the
//! outcome goes back into the decided exchange ([`crate::mcp::plan::Decided::checked`]).
//! Also the session's DLP detectors, shared with REST calls and plain requests.

use std::sync::Arc;

use ostiary_policies::{Action, PolicyEngine};

use ostiary_broker::Broker;

use crate::classify::Target;
use crate::mcp::plan::Decided;
use crate::metrics::Metrics;
use crate::session::Principal;

use super::Checks;

/// Run the checks of every checkable call of `decided`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    checks: &Checks,
    broker: &Broker,
    metrics: &Arc<Metrics>,
    engine: &PolicyEngine,
    principal: &Principal,
    target: &Target,
    host: &str,
    decided: &mut Decided,
) {
    let secrets = match decided
        .checkable()
        .any(|call| checks.wants(call.tier, "dlp"))
    {
        true => session_detectors(checks, broker, principal).await,
        false => None,
    };
    let reports = futures_util::future::join_all(decided.checkable().map(|call| {
        let detectors = secrets.as_deref();
        let tool = engine.catalog().get(call.tool);
        async move {
            let message = serde_json::to_vec(call.message).unwrap_or_default();
            let (args, records) = match call.action {
                Action::Tool {
                    args,
                    impact_records,
                    ..
                } => (Some(args), *impact_records),
                _ => (None, 0),
            };
            let subject = super::Subject {
                tier: call.tier,
                agent: &principal.agent,
                tenant: &principal.tenant,
                session: &principal.session_id,
                host,
                method: target.method.as_str(),
                path: &target.path,
                tool,
                args,
                records,
                body: Some(&message),
                declared_len: None,
                detectors,
            };
            (call.index, checks.run(subject, metrics).await)
        }
    }))
    .await;
    for (index, report) in reports {
        decided.checked(index, report);
    }
}

/// The DLP detectors with the values the broker holds for the session added ("any value
/// of a credential known to the broker"); `None` when it holds none.
pub async fn session_detectors(
    checks: &Checks,
    broker: &Broker,
    principal: &Principal,
) -> Option<Arc<super::dlp::Detectors>> {
    let secrets = broker.secrets_of(&principal.session_id).await;
    checks.detectors_with(secrets)
}
