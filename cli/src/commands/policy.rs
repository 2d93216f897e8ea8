//! `ostiary policy validate|schema|test|explain`: the policy set as `serve` would load it
//! (or `--dir`), checked, printed, tested against its cases, or asked why it decides a
//! request the way it does — all without a running proxy.

use std::path::PathBuf;
use std::process::ExitCode;

use ostiary::config::Config;

use super::{CliError, ExplainArgs, PolicyCommand};

/// Run one `policy` subcommand; exit 1 when a test case fails.
pub fn run(config: &Config, cmd: PolicyCommand) -> Result<ExitCode, CliError> {
    match cmd {
        PolicyCommand::Validate => {
            let engine = ostiary::server::load_policies(config)?;
            println!(
                "ok: {} policies in {} validate against the schema",
                engine.len(),
                config.policy.dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Schema { dir } => {
            let (engine, _) = policy_engine(config, dir)?;
            print!("{}", engine.schema_text());
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Test { dir } => policy_test(config, dir),
        PolicyCommand::Explain(args) => policy_explain(config, *args),
    }
}

/// The policy set `policy test` and `explain` work on, and its directory: `--dir` if given,
/// else what `serve` would load (the config's dir, or the embedded library in its absence).
fn policy_engine(
    config: &Config,
    dir: Option<PathBuf>,
) -> Result<(ostiary_policies::PolicyEngine, PathBuf), CliError> {
    match dir {
        Some(dir) => Ok((ostiary_policies::PolicyEngine::load_dir(&dir)?, dir)),
        None => Ok((
            ostiary::server::load_policies(config)?,
            config.policy.dir.clone(),
        )),
    }
}

fn policy_test(config: &Config, dir: Option<PathBuf>) -> Result<ExitCode, CliError> {
    let (engine, dir) = policy_engine(config, dir)?;
    let report = ostiary_policies::run_dir(&engine, &dir.join("tests"))?;
    for case in &report.cases {
        match &case.failure {
            None => println!("ok   {}: {}", case.file, case.name),
            Some(difference) => {
                println!("FAIL {}: {}", case.file, case.name);
                println!("     {difference}");
            }
        }
    }
    println!("{} passed, {} failed", report.passed(), report.failed());
    Ok(if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn policy_explain(config: &Config, args: ExplainArgs) -> Result<ExitCode, CliError> {
    use ostiary_policies::{AccessRequest, Action};

    let (engine, _) = policy_engine(config, args.dir)?;
    // As a policy test case's `session`: defaults are a root session's first request.
    let session = ostiary_policies::testing::CaseSession {
        calls: args.session_calls.unwrap_or(0),
        cost: args.session_cost.unwrap_or(0.0),
        depth: args.session_depth.unwrap_or(0),
        parent_agent: args.parent_agent.clone().unwrap_or_default(),
        profile: String::new(),
    }
    .state()
    .map_err(CliError::Usage)?;
    let (host, action) = match (args.tool, args.spawn) {
        (Some(name), _) => {
            let call_args = match args.args.as_deref() {
                None => serde_json::Map::new(),
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| CliError::Usage(format!("--args must be a JSON object: {e}")))?,
            };
            ostiary_policies::testing::tool_call(
                engine.catalog(),
                &name,
                call_args,
                args.approved_by.as_deref(),
            )
            .map_err(|e| CliError::Usage(format!("--tool {name:?}: {e}")))?
        }
        (None, Some(child)) => (String::new(), Action::Spawn { child }),
        (None, None) => {
            // clap requires --host unless --tool is given.
            let raw = args
                .host
                .ok_or_else(|| CliError::Usage("explain needs --host or --tool".into()))?;
            // Policies only ever see canonical hosts; explaining `PyPI.org.` as written would
            // explain a request the proxy never decides.
            let host = ostiary::egress::address::normalize_host(&raw)
                .map_err(|e| CliError::Usage(format!("--host {raw:?}: {e}")))?
                .to_string();
            let action = if let Some(method) = args.mcp {
                Action::Mcp {
                    method,
                    server: args.server.unwrap_or_else(|| format!("https://{host}/mcp")),
                }
            } else if args.connect {
                Action::Connect {
                    port: args.port.unwrap_or(443),
                    sni: args.sni.unwrap_or_else(|| host.clone()),
                }
            } else {
                let scheme = args.scheme.unwrap_or_else(|| "https".to_owned());
                let default_port = if scheme == "http" { 80 } else { 443 };
                Action::Http {
                    method: args.method.unwrap_or_else(|| "GET".to_owned()),
                    port: args.port.unwrap_or(default_port),
                    scheme,
                    path: args.path.unwrap_or_else(|| "/".to_owned()),
                    query: args.query.unwrap_or_default(),
                }
            };
            (host, action)
        }
    };
    let explanation = engine.explain(&AccessRequest {
        agent: args.agent,
        tenant: args.tenant,
        host,
        session,
        action,
    });
    if args.json {
        let text = serde_json::to_string_pretty(&explanation)
            .map_err(|e| CliError::Usage(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{explanation}");
    }
    Ok(ExitCode::SUCCESS)
}
