//! The `ostiary` command line (docs/design.md §7): its definition (clap) and the commands
//! small enough to live here. Every command takes `--config` (or `OSTIARY_CONFIG`); with
//! none, the built-in defaults apply, so `ostiary serve` works on a fresh machine with no
//! file at all. Every command that prints a result takes the global `--json`
//! ([`crate::output`]); those that print none refuse it.

use std::path::PathBuf;
use std::process::ExitCode;

pub mod approvals;
pub mod audit;
pub mod completions;
pub mod cost;
pub mod doctor;
mod evidence;
mod policy;
pub mod records;
mod replay;
pub mod run;
pub mod runs;
pub mod sessions;
mod siem;
pub mod tail;

pub use run::RunArgs;

use clap::{Args, Parser, Subcommand};
use ostiary_sdk::{ControlClient, NewSession, Session};

use ostiary::config::Config;
use ostiary::state::{self, files};
use ostiary::{Options, Ostiary};

use crate::output::{print_json, print_json_pretty, Output};
use crate::stages::Stage;

pub use audit::AuditCommand;

/// Why a command failed; printed as one line by `main`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ostiary::config::ConfigError),
    #[error(transparent)]
    Serve(#[from] ostiary::server::ServeError),
    #[error(transparent)]
    State(#[from] ostiary::state::StateError),
    #[error(transparent)]
    Store(#[from] ostiary_store::StoreError),
    #[error(transparent)]
    Sdk(#[from] ostiary_sdk::SdkError),
    #[error(transparent)]
    Policy(#[from] ostiary_policies::LoadError),
    #[error(transparent)]
    PolicyTest(#[from] ostiary_policies::TestError),
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Parser)]
#[command(
    name = "ostiary",
    version,
    about = "The authorization proxy between AI agents and their tools"
)]
pub struct Cli {
    /// Config file (TOML). Without one, the built-in defaults apply.
    #[arg(long, global = true, env = "OSTIARY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the result as JSON (one document; one line per record for record streams)
    /// instead of text for a person. Never coloured.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy and the control API.
    Serve,
    /// Sessions: create, show, resume, terminate, dead letters.
    #[command(subcommand, visible_alias = "sessions")]
    Session(SessionCommand),
    /// Run a command inside a new session; the session ends when the command does. Only
    /// --sandbox is a boundary.
    #[command(after_help = run::AFTER_HELP)]
    Run(RunArgs),
    /// The interception CA.
    #[command(subcommand)]
    Ca(CaCommand),
    /// The state directory and the keys replicas share.
    #[command(subcommand)]
    State(StateCommand),
    /// The audit chain.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// The approval queue: list, show, approve, deny, link.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// Runs that triggers started: list, show, start, cancel, retry.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Check a deployment (config, CA and its trust, policies, store, proxy, Vault,
    /// approvers' channels) and say what to fix; exit 1 if anything is wrong.
    Doctor,
    /// Print a shell completion script: `source <(ostiary completions bash)`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    // The sandbox's hidden stages, which `main` runs before any runtime or config
    // (`crate::stages`).
    #[command(flatten)]
    Stage(Stage),
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a session and print shell `export` lines (with --json: the session, with its
    /// id, token, proxy URL and CA).
    New(SessionArgs),
    #[command(flatten)]
    Manage(sessions::SessionsCommand),
}

#[derive(Debug, Args)]
pub struct SessionArgs {
    /// The agent's name: the Cedar principal its requests are decided as.
    #[arg(long)]
    pub agent: String,
    /// The tenant the agent acts for (default: `default`).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Lifetime, e.g. 30m (default: sessions.default_ttl).
    #[arg(long)]
    pub ttl: Option<String>,
    /// The most requests the session may make; past it they are refused with 429.
    #[arg(long)]
    pub max_calls: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Print the CA certificate (PEM) that agents must trust.
    Export,
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Make the keys several replicas share (CA, session signing key, audit key,
    /// approval-link key) in a directory, for a secret every replica mounts as
    /// `state.keys_dir`. Keys already there are kept.
    Init {
        /// Where to write them.
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Parse and strictly validate the policy directory.
    Validate,
    /// Print the Cedar schema generated from the tool catalog (a `.cedarschema`, for editors
    /// and `cedar validate`).
    Schema {
        /// Policy directory (default: the config's `policy.dir`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run the test cases in `<policy dir>/tests/*.toml`. Exit 0 if all pass, 1 if any
    /// fails, 2 if the tests cannot be run.
    Test {
        /// Policy directory (default: the config's `policy.dir`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Decide one request; print the decision, the policies that determined it and what
    /// would change it.
    // Boxed: the tool flags make these arguments far larger than every other command's.
    Explain(Box<ExplainArgs>),
    /// Decide again, against a candidate policy directory, the decisions the audit trail
    /// kept, and print what would change (nothing is sent). With --json: one object with
    /// `decided`, `changed` and `examples`.
    Replay {
        /// The candidate policy directory (its `tools.toml` and `*.cedar`).
        #[arg(long)]
        candidate: PathBuf,
        /// Only records since: epoch milliseconds, RFC 3339, or a duration back (15m).
        #[arg(long)]
        since: Option<String>,
        /// Only this session's records.
        #[arg(long)]
        session: Option<String>,
    },
    /// Make the shadow set (`[policy] shadow_dir`) the enforced one: its files copied over
    /// the policy directory and the set swapped in at once (asks the running proxy).
    Promote,
    /// What the shadow set disagreed with (asks the audit trail).
    #[command(subcommand)]
    Shadow(ShadowCommand),
    /// List the policy sets that were live, newest first: each set's version id, when it
    /// first went live and when it was last replaced (asks the running proxy).
    Versions {
        /// At most this many sets.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum ShadowCommand {
    /// The shadow set's disagreements with the enforced one, counted by policy, tool and
    /// agent, with the latest examples.
    Report {
        /// Only records since: epoch milliseconds, RFC 3339, or a duration back (15m).
        #[arg(long)]
        since: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The agent (Cedar principal) making the request.
    #[arg(long)]
    pub agent: String,
    /// The agent's tenant.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Destination host; canonicalised as the proxy does before policies see it.
    #[arg(long, required_unless_present_any = ["tool", "spawn", "trigger"])]
    pub host: Option<String>,
    /// HTTP method (default GET).
    #[arg(long)]
    pub method: Option<String>,
    /// Request path (default /).
    #[arg(long)]
    pub path: Option<String>,
    /// Query string without `?` (default empty).
    #[arg(long)]
    pub query: Option<String>,
    /// Default 443, or 80 with `--scheme http`.
    #[arg(long)]
    pub port: Option<u16>,
    /// http or https (default https).
    #[arg(long)]
    pub scheme: Option<String>,
    /// Decide an uninspected tunnel (`Action::"connect"`) instead of an HTTP request.
    #[arg(long, conflicts_with_all = ["method", "path", "query", "scheme"])]
    pub connect: bool,
    /// TLS server name of the tunnel (default: the host).
    #[arg(long, requires = "connect")]
    pub sni: Option<String>,
    /// Decide a JSON-RPC message with this method (`resources/read`) to the MCP endpoint
    /// `--server` on `--host` (`Action::"mcp"`) instead of an HTTP request.
    #[arg(long, conflicts_with_all = ["method", "path", "query", "port", "scheme", "connect", "sni"])]
    pub mcp: Option<String>,
    /// The MCP endpoint's URL (default `https://<host>/mcp`).
    #[arg(long, requires = "mcp")]
    pub server: Option<String>,
    /// Decide whether `--agent` may spawn a child session under this agent name
    /// (`Action::"spawn"`).
    #[arg(
        long,
        conflicts_with_all = ["host", "method", "path", "query", "port", "scheme", "connect", "sni", "mcp", "tool"]
    )]
    pub spawn: Option<String>,
    /// Decide a call of this catalog tool (`github.create_issue`) instead of an HTTP request;
    /// the host serving it and its impact come from the catalog, as in a policy test case.
    #[arg(
        long,
        conflicts_with_all = ["host", "method", "path", "query", "port", "scheme", "connect", "sni"]
    )]
    pub tool: Option<String>,
    /// The tool call's arguments, a JSON object (default `{}`).
    #[arg(long, requires = "tool")]
    pub args: Option<String>,
    /// Decide the call's undo (`Action::"tool:<name>.undo"`, docs/undo.md) rather than the
    /// call: what `ostiary sessions undo` would be asked.
    #[arg(long, requires = "tool")]
    pub undo: bool,
    /// Decide whether the config's trigger of this name may start a run
    /// (`Action::"trigger"`, principal `--agent`); its kind comes from the config.
    #[arg(
        long,
        conflicts_with_all = ["host", "method", "path", "query", "port", "scheme", "connect", "sni", "mcp", "tool", "spawn"]
    )]
    pub trigger: Option<String>,
    /// The trigger's payload, a JSON object (default `{}`).
    #[arg(long, requires = "trigger")]
    pub payload: Option<String>,
    /// Calls the session made before this one (default 0).
    #[arg(long)]
    pub session_calls: Option<i64>,
    /// Cost the session spent before this request, in the catalog's units (default 0).
    #[arg(long)]
    pub session_cost: Option<f64>,
    /// Spawn depth of the session (default 0: a root session).
    #[arg(long)]
    pub session_depth: Option<i64>,
    /// The agent of the session's parent (default none: a root session).
    #[arg(long)]
    pub parent_agent: Option<String>,
    /// A label the session carries (`context.session.labels`); repeat for several.
    #[arg(long = "session-label", value_name = "LABEL")]
    pub session_labels: Vec<String>,
    /// The session's recent calls (`context.session.recent`), e.g. `tool_1h=3`; repeat for
    /// several of `tool_10m`, `tool_1h`, `tier_10m`, `tier_1h` (default 0).
    #[arg(long = "session-recent", value_name = "WINDOW=N")]
    pub session_recent: Vec<String>,
    /// A human approved this call or run (`context.approval`): with --tool or --trigger.
    #[arg(long)]
    pub approved_by: Option<String>,
    /// Policy directory (default: the config's `policy.dir`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Run a parsed command line.
pub async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let out = Output { json: cli.json };
    if out.json {
        if let Some(name) = prints_no_result(&cli.command) {
            return Err(CliError::Usage(format!(
                "--json does not apply to `ostiary {name}`: it prints no result"
            )));
        }
    }
    // Neither needs a config that loads: a completion script is the same for every
    // deployment, and doctor reports a broken config as its first finding.
    match cli.command {
        Command::Completions { shell } => return completions::run(shell),
        Command::Doctor => return doctor::run(cli.config.as_deref(), out).await,
        _ => {}
    }
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        // The defaults, with the environment's overrides (`OSTIARY_STATE_STORE`, …).
        None => Config::from_toml("", std::path::Path::new("(built-in defaults)"))?,
    };
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Session(SessionCommand::New(args)) => session_new(&config, args, out).await,
        Command::Session(SessionCommand::Manage(cmd)) => {
            sessions::run(control_client(&config)?, cmd, out).await
        }
        Command::Run(args) => Ok(run::run(&config, args).await),
        Command::Ca(CaCommand::Export) => {
            let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
            let pem = state::read_ca_cert(dir)?;
            if out.json {
                print_json(&serde_json::json!({ "pem": pem }));
            } else {
                print!("{pem}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::State(StateCommand::Init { dir }) => {
            let paths: Vec<String> = state::StateDir::init_keys(&dir)?
                .into_iter()
                .map(|name| dir.join(name).display().to_string())
                .collect();
            if out.json {
                print_json(&serde_json::json!({ "dir": dir, "paths": paths }));
            } else {
                paths.iter().for_each(|path| println!("{path}"));
            }
            Ok(ExitCode::SUCCESS)
        }
        // On the runtime: it sleeps between polls and ends on Ctrl-C (each poll runs on
        // the blocking pool).
        Command::Audit(AuditCommand::Tail(args)) => tail::run(&config, args, out).await,
        // Off the runtime's threads: the store's calls block (PostgreSQL's client runs a
        // runtime of its own).
        Command::Audit(cmd) => {
            let config = config.clone();
            tokio::task::spawn_blocking(move || audit::run(&config, cmd, out))
                .await
                .map_err(|e| CliError::Store(ostiary_store::StoreError::Task(e.to_string())))?
        }
        // The history is the running proxy's (its store), asked through the control API.
        Command::Policy(PolicyCommand::Versions { limit }) => {
            policy::versions(control_client(&config)?, limit, out).await
        }
        // Replay reads the trail: a blocking store, off the runtime like `audit`'s.
        Command::Policy(PolicyCommand::Promote) => {
            policy::promote(control_client(&config)?, out).await
        }
        Command::Policy(cmd @ (PolicyCommand::Replay { .. } | PolicyCommand::Shadow(_))) => {
            let config = config.clone();
            tokio::task::spawn_blocking(move || policy::run(&config, cmd, out))
                .await
                .map_err(|e| CliError::Store(ostiary_store::StoreError::Task(e.to_string())))?
        }
        Command::Policy(cmd) => policy::run(&config, cmd, out),
        Command::Runs(cmd) => runs::run(control_client(&config)?, cmd, out).await,
        Command::Approvals(cmd) => {
            // Who decides is asked before the token is read: the one a person can fix at once.
            approvals::check_approver(&cmd)?;
            approvals::run(control_client(&config)?, cmd, out).await
        }
        Command::Doctor | Command::Completions { .. } => Err(CliError::Usage(
            "handled before the config is loaded".into(),
        )),
        Command::Stage(_) => Err(CliError::Usage(
            "a sandbox stage runs only as a process's first command".into(),
        )),
    }
}

/// The commands whose output is not a result a script could take as JSON: a server's log,
/// a child's own output, a shell script. `--json` on them is a mistake to say, not ignore.
fn prints_no_result(command: &Command) -> Option<&'static str> {
    match command {
        Command::Serve => Some("serve"),
        Command::Run(_) => Some("run"),
        Command::Completions { .. } => Some("completions"),
        Command::Stage(_) => Some("sandbox stage"),
        _ => None,
    }
}

async fn serve(config: Config) -> Result<ExitCode, CliError> {
    // What the proxy writes (the database, its journal, the audit head) is its own alone,
    // whatever the operator's umask: the state directory is 0700 and its files 0600.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let proxy_addr = config.listen.proxy;
    let control_addr = config.listen.control;
    let ostiary = Ostiary::build(config, Options::default()).await?;
    let bind = |addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| CliError::Io {
                what: format!("binding {addr}"),
                source,
            })
    };
    let proxy = bind(proxy_addr).await?;
    let control = bind(control_addr).await?;
    let unix_path = ostiary.control_plane().config.proxy_unix_path();
    let unix = ostiary::server::bind_unix(&unix_path)
        .await
        .map_err(|source| CliError::Io {
            what: format!("binding {}", unix_path.display()),
            source,
        })?;
    let mut ostiary = ostiary.with_unix(unix);
    // Webhook deliveries apart from the control API, when asked.
    if let Some(addr) = ostiary.control_plane().config.listen.triggers {
        ostiary = ostiary.with_triggers(bind(addr).await?);
    }
    eprintln!(
        "ostiary: proxy on http://{}, control API on http://{}",
        proxy.local_addr().map_err(|source| CliError::Io {
            what: "proxy listener".into(),
            source
        })?,
        control.local_addr().map_err(|source| CliError::Io {
            what: "control listener".into(),
            source
        })?,
    );
    // Registered before the listeners answer, so a hangup never takes the default action
    // (terminating the proxy).
    let reloader = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => Some(tokio::spawn(reload_on_hangup(
            hangups,
            ostiary.control_plane().reloader.clone(),
        ))),
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP cannot be handled; policy reload by signal is off");
            None
        }
    };
    let served = ostiary.serve(proxy, control, shutdown_signal()).await;
    if let Some(reloader) = reloader {
        reloader.abort();
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `SIGHUP` reloads the policy set: the same reload as `POST /v1/policy/reload`, which logs,
/// counts and audits its outcome.
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    reloader: ostiary::policy_store::Reloader,
) {
    use ostiary::policy_store::{reload, Trigger};
    while hangups.recv().await.is_some() {
        let _ = reload(reloader.clone(), Trigger::Signal).await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
    tracing::info!("shutting down");
}

fn control_client(config: &Config) -> Result<ControlClient, CliError> {
    // The same token, checked the same way, as `serve` takes.
    let token = match state::admin_token_from_env()? {
        Some(t) => t.expose().to_owned(),
        None => state::read_admin_token(&config.state.dir)?
            .expose()
            .to_owned(),
    };
    let mut addr = config.listen.control;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    Ok(ControlClient::new(format!("http://{addr}"), token))
}

/// The CA bundle path given to children: the state directory's copy, absolute.
fn ca_path(config: &Config, session: &Session) -> Result<PathBuf, CliError> {
    let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
    let path = dir.join(files::CA_CERT);
    if !path.exists() {
        std::fs::write(&path, &session.ca_pem).map_err(|source| CliError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
    }
    std::path::absolute(&path).map_err(|source| CliError::Io {
        what: format!("resolving {}", path.display()),
        source,
    })
}

async fn session_new(
    config: &Config,
    args: SessionArgs,
    out: Output,
) -> Result<ExitCode, CliError> {
    let client = control_client(config)?;
    let session = client
        .create_session(&NewSession {
            agent: args.agent,
            tenant: args.tenant,
            ttl: args.ttl,
            max_calls: args.max_calls,
            ..Default::default()
        })
        .await?;
    if out.json {
        print_json_pretty(&session)?;
        return Ok(ExitCode::SUCCESS);
    }
    let ca = ca_path(config, &session)?;
    println!(
        "# Ostiary session {} for agent {}",
        session.session_id, session.agent
    );
    for (name, value) in session.env(&ca) {
        println!("export {name}={}", shell_quote(&value));
    }
    Ok(ExitCode::SUCCESS)
}

fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code.clamp(0, 255) as u8),
        // The shell convention: 128 + signal number.
        (None, Some(signal)) => ExitCode::from((128 + signal).clamp(0, 255) as u8),
        (None, None) => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// clap checks argument definitions only when a command is parsed (and then panics);
    /// this runs the same checks for every subcommand at test time.
    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_double_dash() {
        let cli =
            Cli::try_parse_from(["ostiary", "run", "--agent", "a", "--", "sh", "-c", "exit 7"])
                .expect("parses");
        let Command::Run(args) = cli.command else {
            panic!("not run: {cli:?}");
        };
        assert_eq!(args.command, ["sh", "-c", "exit 7"]);
        assert!(Cli::try_parse_from(["ostiary", "run", "--agent", "a"]).is_err());
    }

    #[test]
    fn json_is_one_global_flag_before_or_after_the_subcommand() {
        for args in [
            &["ostiary", "--json", "session", "new", "--agent", "a"][..],
            &["ostiary", "session", "new", "--agent", "a", "--json"],
            &["ostiary", "audit", "--json", "verify"],
            &[
                "ostiary", "policy", "explain", "--agent", "a", "--host", "h", "--json",
            ],
        ] {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(cli.json, "{args:?}");
        }
        let cli = Cli::try_parse_from(["ostiary", "doctor"]).expect("parses");
        assert!(!cli.json);
        // After `--` it belongs to the command being run, not to ostiary.
        let cli = Cli::try_parse_from(["ostiary", "run", "--agent", "a", "--", "jq", "--json"])
            .expect("parses");
        assert!(!cli.json);
        assert!(Cli::try_parse_from(["ostiary", "--json=yes", "doctor"]).is_err());
    }

    #[test]
    fn commands_that_print_no_result_refuse_json() {
        let refused =
            |args: &[&str]| prints_no_result(&Cli::try_parse_from(args).expect("parses").command);
        assert_eq!(refused(&["ostiary", "--json", "serve"]), Some("serve"));
        assert_eq!(
            refused(&["ostiary", "run", "--agent", "a", "--json", "--", "true"]),
            Some("run")
        );
        assert_eq!(
            refused(&["ostiary", "completions", "bash", "--json"]),
            Some("completions")
        );
        assert_eq!(refused(&["ostiary", "doctor", "--json"]), None);
        assert_eq!(refused(&["ostiary", "audit", "export", "--json"]), None);
    }

    #[test]
    fn record_formats_are_named_and_nothing_else_is() {
        use records::RecordFormat;
        let format = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Audit(AuditCommand::Query(q))) => Ok(q.format),
            Ok(Command::Audit(AuditCommand::Tail(t))) => Ok(t.format),
            Ok(other) => panic!("{args:?}: {other:?}"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(format(&["ostiary", "audit", "query"]), Ok(None));
        assert_eq!(
            format(&["ostiary", "audit", "query", "--format", "table"]),
            Ok(Some(RecordFormat::Table))
        );
        assert_eq!(
            format(&["ostiary", "audit", "tail", "--format", "ocsf"]),
            Ok(Some(RecordFormat::Ocsf))
        );
        assert_eq!(
            format(&["ostiary", "audit", "query", "--format", "nonsense"]),
            Err(clap::error::ErrorKind::InvalidValue)
        );
    }
}
