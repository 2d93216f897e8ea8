//! `ostiary policy validate|schema|test|explain|versions`: the policy set as `serve` would
//! load it (or `--dir`), checked, printed, tested against its cases, or asked why it
//! decides a request the way it does — all without a running proxy; and `versions`, the
//! sets a running proxy had live, from its store through the control API. With `--json`
//! each prints one JSON document: the count, version and directory, the schema text, every
//! case with a summary, the explanation, or the control API's answer as it came.

use std::path::PathBuf;
use std::process::ExitCode;

use ostiary::config::Config;
use ostiary_policies::Action;

use ostiary_sdk::ControlClient;
use serde_json::{json, Value};

use super::{CliError, ExplainArgs, PolicyCommand};
use crate::output::{paint, print_json, print_json_pretty, text, when, Output, BAD, GOOD};

/// Run one `policy` subcommand; exit 1 when a test case fails.
pub fn run(config: &Config, cmd: PolicyCommand, out: Output) -> Result<ExitCode, CliError> {
    match cmd {
        PolicyCommand::Validate => {
            let engine = ostiary::server::load_policies(config)?;
            let dir = &config.policy.dir;
            if out.json {
                print_json(&json!({
                    "ok": true,
                    "policies": engine.len(),
                    "dir": dir,
                    "version": engine.version().as_str(),
                }));
            } else {
                anstream::println!(
                    "{}: {} policies in {} validate against the schema (version {})",
                    paint(GOOD, "ok"),
                    engine.len(),
                    dir.display(),
                    engine.version()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Schema { dir } => {
            let (engine, dir) = policy_engine(config, dir)?;
            if out.json {
                print_json(&json!({ "dir": dir, "schema": engine.schema_text() }));
            } else {
                print!("{}", engine.schema_text());
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Test { dir } => policy_test(config, dir, out),
        PolicyCommand::Explain(args) => policy_explain(config, *args, out),
        PolicyCommand::Shadow(super::ShadowCommand::Report { since }) => {
            super::replay::shadow_report(config, since.as_deref(), out)
        }
        PolicyCommand::Promote => Err(CliError::Usage(
            "`policy promote` asks the running proxy: see `promote`".into(),
        )),
        PolicyCommand::Replay {
            candidate,
            since,
            session,
        } => super::replay::run(config, &candidate, since.as_deref(), session, out),
        PolicyCommand::Versions { .. } => Err(CliError::Usage(
            "`policy versions` asks the running proxy: see `versions`".into(),
        )),
    }
}

/// `policy versions`: the sets the running proxy's store says were live, newest first.
/// `ostiary policy promote`.
pub async fn promote(client: ControlClient, out: Output) -> Result<ExitCode, CliError> {
    let promoted = client.promote_policy().await?;
    if out.json {
        print_json(&promoted);
    } else {
        println!(
            "{}: version {} replaces {} ({} policies)",
            paint(GOOD, "promoted"),
            text(&promoted["version"]),
            text(&promoted["replaced"]),
            promoted["policies"]
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn versions(
    client: ControlClient,
    limit: u32,
    out: Output,
) -> Result<ExitCode, CliError> {
    let listed = client.policy_versions(Some(limit)).await?;
    if out.json {
        print_json(&listed);
        return Ok(ExitCode::SUCCESS);
    }
    let rows = listed["versions"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!("no policy set recorded yet");
    }
    for v in &rows {
        println!("{}", version_line(v));
    }
    Ok(ExitCode::SUCCESS)
}

/// One set: its id, whether it is the one served, its size, and its live period.
fn version_line(v: &Value) -> String {
    let state = if v["current"] == Value::Bool(true) {
        paint(GOOD, "current ")
    } else if v["live"] == Value::Bool(true) {
        "live    ".to_owned()
    } else {
        "replaced".to_owned()
    };
    let mut line = format!(
        "{}  {}  {} policies, {} tools  first live {}",
        text(&v["version"]),
        state,
        v["policies"],
        v["tools"],
        when(&v["first_live_ms"]),
    );
    if v["last_live_ms"] != v["first_live_ms"] {
        line.push_str(&format!(", last live {}", when(&v["last_live_ms"])));
    }
    if !v["replaced_ms"].is_null() {
        line.push_str(&format!(", replaced {}", when(&v["replaced_ms"])));
    }
    line
}

/// The policy set `policy test` and `explain` work on, and its directory: `--dir` if given,
/// else what `serve` would load (the config's dir, or the embedded library in its absence).
fn policy_engine(
    config: &Config,
    dir: Option<PathBuf>,
) -> Result<(ostiary_policies::PolicyEngine, PathBuf), CliError> {
    match dir {
        // The config's triggers type `Action::"trigger"` whichever directory is tested.
        Some(dir) => {
            let triggers = ostiary::runs::authorize::policy_triggers(&config.trigger);
            Ok((
                ostiary_policies::PolicyEngine::load_dir_with(&dir, &triggers)?,
                dir,
            ))
        }
        None => Ok((
            ostiary::server::load_policies(config)?,
            config.policy.dir.clone(),
        )),
    }
}

fn policy_test(config: &Config, dir: Option<PathBuf>, out: Output) -> Result<ExitCode, CliError> {
    let (engine, dir) = policy_engine(config, dir)?;
    let report = ostiary_policies::run_dir(&engine, &dir.join("tests"))?;
    if out.json {
        print_json(&test_report_json(&report));
    } else {
        for case in &report.cases {
            match &case.failure {
                None => anstream::println!("{}   {}: {}", paint(GOOD, "ok"), case.file, case.name),
                Some(difference) => {
                    anstream::println!("{} {}: {}", paint(BAD, "FAIL"), case.file, case.name);
                    println!("     {difference}");
                }
            }
        }
        println!("{} passed, {} failed", report.passed(), report.failed());
    }
    Ok(if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `policy test --json`: every case, what was decided, and the counts.
fn test_report_json(report: &ostiary_policies::TestReport) -> serde_json::Value {
    use ostiary_policies::Decision;
    let cases: Vec<_> = report
        .cases
        .iter()
        .map(|case| {
            let decision = match &case.decision {
                Decision::Allow { .. } => "allow",
                Decision::Escalate { .. } => "escalate",
                Decision::Deny { .. } => "deny",
            };
            json!({
                "file": case.file,
                "name": case.name,
                "passed": case.failure.is_none(),
                "decision": decision,
                "policies": case.decision.policies(),
                "failure": case.failure,
            })
        })
        .collect();
    json!({
        "ok": report.failed() == 0,
        "passed": report.passed(),
        "failed": report.failed(),
        "cases": cases,
    })
}

fn policy_explain(config: &Config, args: ExplainArgs, out: Output) -> Result<ExitCode, CliError> {
    use ostiary_policies::AccessRequest;

    let (engine, _) = policy_engine(config, args.dir.clone())?;
    // As a policy test case's `session`: defaults are a root session's first request.
    let session = ostiary_policies::testing::CaseSession {
        calls: args.session_calls.unwrap_or(0),
        cost: args.session_cost.unwrap_or(0.0),
        depth: args.session_depth.unwrap_or(0),
        parent_agent: args.parent_agent.clone().unwrap_or_default(),
        profile: String::new(),
        labels: args.session_labels.clone(),
        recent: ostiary_policies::testing::CaseRecent::parse(&args.session_recent)
            .map_err(CliError::Usage)?,
    }
    .state()
    .map_err(CliError::Usage)?;
    if args.approved_by.is_some() && args.tool.is_none() && args.trigger.is_none() {
        return Err(CliError::Usage(
            "--approved-by needs --tool or --trigger (only a call or a run is approved)".into(),
        ));
    }
    let (host, action) = match (&args.tool, &args.spawn) {
        _ if args.trigger.is_some() => explained_trigger(config, &args)?,
        (Some(name), _) => explained_tool(&engine, name, &args)?,
        (None, Some(child)) => (
            String::new(),
            Action::Spawn {
                child: child.clone(),
            },
        ),
        (None, None) => explained_host(&args)?,
    };
    let explanation = engine.explain(&AccessRequest {
        agent: args.agent,
        tenant: args.tenant,
        host,
        session,
        action,
    });
    if out.json {
        print_json_pretty(&explanation)?;
    } else {
        print!("{explanation}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--trigger NAME [--payload JSON]`: the run the config's trigger would start.
fn explained_trigger(config: &Config, args: &ExplainArgs) -> Result<(String, Action), CliError> {
    let name = args.trigger.clone().unwrap_or_default();
    let trigger = config
        .trigger
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--trigger {name:?}: the config has no such trigger"
            ))
        })?;
    let payload = match args.payload.as_deref() {
        None => serde_json::Value::Object(Default::default()),
        Some(text) => match serde_json::from_str(text) {
            Ok(value @ serde_json::Value::Object(_)) => value,
            Ok(_) => return Err(CliError::Usage("--payload must be a JSON object".into())),
            Err(e) => {
                return Err(CliError::Usage(format!(
                    "--payload must be a JSON object: {e}"
                )))
            }
        },
    };
    let action = Action::Trigger {
        name,
        kind: trigger.kind.as_str().to_owned(),
        payload,
        approval: args.approved_by.clone(),
    };
    Ok((String::new(), action))
}

/// `--tool NAME [--args JSON] [--undo]`: the call (or its undo) the proxy would build.
fn explained_tool(
    engine: &ostiary_policies::PolicyEngine,
    name: &str,
    args: &ExplainArgs,
) -> Result<(String, Action), CliError> {
    let call_args = match args.args.as_deref() {
        None => serde_json::Map::new(),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| CliError::Usage(format!("--args must be a JSON object: {e}")))?,
    };
    let (host, action) = ostiary_policies::testing::tool_call(
        engine.catalog(),
        name,
        call_args,
        args.approved_by.as_deref(),
    )
    .map_err(|e| CliError::Usage(format!("--tool {name:?}: {e}")))?;
    if args.undo {
        let undo = ostiary_policies::testing::undo_of(engine.catalog(), action)
            .map_err(|e| CliError::Usage(format!("--undo: {e}")))?;
        Ok((host, undo))
    } else {
        Ok((host, action))
    }
}

/// `--host` with `--mcp`, `--connect` or the http fields.
fn explained_host(args: &ExplainArgs) -> Result<(String, Action), CliError> {
    // clap requires --host unless --tool is given.
    let raw = args
        .host
        .clone()
        .ok_or_else(|| CliError::Usage("explain needs --host or --tool".into()))?;
    // Policies only ever see canonical hosts; explaining `PyPI.org.` as written would
    // explain a request the proxy never decides.
    let host = ostiary::egress::address::normalize_host(&raw)
        .map_err(|e| CliError::Usage(format!("--host {raw:?}: {e}")))?
        .to_string();
    let action = if let Some(method) = args.mcp.clone() {
        Action::Mcp {
            method,
            server: args
                .server
                .clone()
                .unwrap_or_else(|| format!("https://{host}/mcp")),
        }
    } else if args.connect {
        Action::Connect {
            port: args.port.unwrap_or(443),
            sni: args.sni.clone().unwrap_or_else(|| host.clone()),
        }
    } else {
        ostiary_policies::testing::http_call(ostiary_policies::testing::HttpParts {
            method: args.method.clone(),
            scheme: args.scheme.clone(),
            port: args.port,
            path: args.path.clone(),
            query: args.query.clone(),
        })
    };
    Ok((host, action))
}
