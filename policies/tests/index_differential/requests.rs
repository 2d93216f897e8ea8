//! Generated requests over the same names, and a request's sibling (one thing changed) for
//! the memo.

use ostiary_policies::{AccessRequest, Action, Recent, SessionState};

use super::*;

pub(super) fn request(rng: &mut Rng) -> AccessRequest {
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
pub(super) fn sibling(rng: &mut Rng, req: &AccessRequest) -> AccessRequest {
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
