//! The `ostiary` command line (docs/design.md §7): its definition (clap) and the commands
//! small enough to live here. Every command takes `--config` (or `OSTIARY_CONFIG`); with
//! none, the built-in defaults apply, so `ostiary serve` works on a fresh machine with no
//! file at all.

use std::path::PathBuf;
use std::process::ExitCode;

pub mod approvals;
pub mod completions;
pub mod cost;
pub mod doctor;
mod evidence;
mod policy;
pub mod run;
pub mod sessions;
mod siem;
pub mod tail;

pub use run::RunArgs;

use clap::{Args, Parser, Subcommand};
use ostiary_sdk::{ControlClient, NewSession, Session};

use ostiary::audit::verify::{self, Query};
use ostiary::config::Config;
use ostiary::state::{self, files};
use ostiary::{Options, Ostiary};

use crate::stages::Stage;

/// How `audit query` prints records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordFormat {
    Json,
    Ocsf,
}

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
    /// Create a session and print shell `export` lines (or JSON with --json).
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
    /// Print the session (id, token, proxy URL, CA) as JSON instead of `export` lines.
    #[arg(long)]
    pub json: bool,
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
pub enum AuditCommand {
    /// Print matching records as JSON lines, oldest first.
    Query {
        /// Only this session's records.
        #[arg(long)]
        session: Option<String>,
        /// allow | deny | error | cancel
        #[arg(long)]
        decision: Option<String>,
        /// Epoch milliseconds, RFC 3339, or a duration back from now (15m).
        #[arg(long)]
        since: Option<String>,
        /// The most records to print (default 10000), the oldest matching ones.
        #[arg(long)]
        limit: Option<u32>,
        /// `json`: the records as stored; `ocsf`: as OCSF 1.3 events (API Activity for tool
        /// calls and MCP messages, HTTP Activity for other requests), for a SIEM.
        #[arg(long, value_enum, default_value_t = RecordFormat::Json)]
        format: RecordFormat,
    },
    /// Recompute the chain; exit 1 if anything was altered, inserted or deleted (the newest
    /// records included: the head checkpoint must match). With --offline, check an export
    /// against the signing public key instead, with no access to the proxy or its state.
    Verify {
        /// An `audit export` file to check (needs --pubkey; reads nothing else).
        #[arg(long, value_name = "FILE", requires = "pubkey")]
        offline: Option<PathBuf>,
        /// The public key that signed the export's checkpoints (PEM, from `audit pubkey`).
        #[arg(long, value_name = "KEY", requires = "offline")]
        pubkey: Option<PathBuf>,
    },
    /// Print the public key (PEM) that signs the chain's checkpoints: what an auditor checks
    /// exports with.
    Pubkey,
    /// Write records with the signed checkpoints covering them (JSON lines,
    /// docs/audit-export.md) to standard output, up to the newest checkpoint.
    Export {
        /// From the signed range holding the first record at or after this time (epoch
        /// milliseconds, RFC 3339, or a duration back from now); default: the whole chain.
        #[arg(long)]
        since: Option<String>,
    },
    /// Acknowledge a chain that no longer matches its checkpoint (which `serve` refuses to
    /// extend): seal a record saying so, with your reason, onto the chain as it stands. Run
    /// `audit verify` first, with the proxy stopped.
    Reanchor {
        /// Why (who looked, what was found); recorded in the chain.
        #[arg(long)]
        reason: String,
    },
    /// Follow the trail: print new records as JSON lines as they are written (filters as
    /// for `query`), until interrupted.
    Tail(tail::TailArgs),
    /// The trail's stream to a SIEM (`[audit.siem]`): its status, or a replay from a record.
    #[command(subcommand)]
    Siem(siem::SiemCommand),
    /// What charged tool calls cost, grouped (default: by tool), most expensive first.
    Cost {
        /// Only this session and the sessions spawned from it, at any depth.
        #[arg(long)]
        session: Option<String>,
        /// What to group by.
        #[arg(long, value_enum, default_value_t = cost::By::Tool)]
        by: cost::By,
        /// JSON lines (one per group, with exact `cost_micros`) instead of a table.
        #[arg(long)]
        json: bool,
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
    #[arg(long, required_unless_present_any = ["tool", "spawn"])]
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
    /// A human approved this call (`context.approval`).
    #[arg(long, requires = "tool")]
    pub approved_by: Option<String>,
    /// Policy directory (default: the config's `policy.dir`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run a parsed command line.
pub async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    // Neither needs a config that loads: a completion script is the same for every
    // deployment, and doctor reports a broken config as its first finding.
    match cli.command {
        Command::Completions { shell } => return completions::run(shell),
        Command::Doctor => return doctor::run(cli.config.as_deref()).await,
        _ => {}
    }
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        // The defaults, with the environment's overrides (`OSTIARY_STATE_STORE`, …).
        None => Config::from_toml("", std::path::Path::new("(built-in defaults)"))?,
    };
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Session(SessionCommand::New(args)) => session_new(&config, args).await,
        Command::Session(SessionCommand::Manage(cmd)) => {
            sessions::run(control_client(&config)?, cmd).await
        }
        Command::Run(args) => Ok(run::run(&config, args).await),
        Command::Ca(CaCommand::Export) => {
            let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
            print!("{}", state::read_ca_cert(dir)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::State(StateCommand::Init { dir }) => {
            for name in state::StateDir::init_keys(&dir)? {
                println!("{}", dir.join(name).display());
            }
            Ok(ExitCode::SUCCESS)
        }
        // Off the runtime's threads: the store's calls block (PostgreSQL's client runs a
        // runtime of its own).
        // On the runtime: it sleeps between polls and ends on Ctrl-C (each poll runs on
        // the blocking pool).
        Command::Audit(AuditCommand::Tail(args)) => tail::run(&config, args).await,
        Command::Audit(cmd) => {
            let config = config.clone();
            tokio::task::spawn_blocking(move || audit(&config, cmd))
                .await
                .map_err(|e| CliError::Store(ostiary_store::StoreError::Task(e.to_string())))?
        }
        Command::Policy(cmd) => policy::run(&config, cmd),
        Command::Approvals(cmd) => {
            // Who decides is asked before the token is read: the one a person can fix at once.
            approvals::check_approver(&cmd)?;
            approvals::run(control_client(&config)?, cmd).await
        }
        Command::Doctor | Command::Completions { .. } => Err(CliError::Usage(
            "handled before the config is loaded".into(),
        )),
        Command::Stage(_) => Err(CliError::Usage(
            "a sandbox stage runs only as a process's first command".into(),
        )),
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
    let ostiary = ostiary.with_unix(unix);
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

async fn session_new(config: &Config, args: SessionArgs) -> Result<ExitCode, CliError> {
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
    if args.json {
        let text =
            serde_json::to_string_pretty(&session).map_err(|e| CliError::Usage(e.to_string()))?;
        println!("{text}");
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

fn audit(config: &Config, cmd: AuditCommand) -> Result<ExitCode, CliError> {
    let backend = ostiary::stores::Backend::of(&config.state).map_err(CliError::Usage)?;
    // Read-only for all but `reanchor`, which writes.
    let read_only = || {
        backend.audit_reader().map_err(|e| match e {
            ostiary_store::StoreError::Unavailable(why) => CliError::Usage(why),
            other => CliError::Store(other),
        })
    };
    match cmd {
        AuditCommand::Reanchor { reason } => reanchor(config, &backend, &reason),
        AuditCommand::Siem(cmd) => siem::run(config, &backend, cmd),
        AuditCommand::Tail(_) => Err(CliError::Usage(
            "audit tail follows on the runtime, not here".into(),
        )),
        AuditCommand::Query {
            session,
            decision,
            since,
            limit,
            format,
        } => {
            let since_ms = match since {
                None => None,
                Some(text) => Some(ostiary::control::parse_since(&text).ok_or_else(|| {
                    CliError::Usage(format!("--since {text:?}: not a time or duration"))
                })?),
            };
            let records = verify::query(
                &*read_only()?,
                &Query {
                    session,
                    decision,
                    since_ms,
                    limit,
                },
            )?;
            for r in records {
                let line = match format {
                    RecordFormat::Json => serde_json::to_string(&r),
                    RecordFormat::Ocsf => serde_json::to_string(&ostiary::audit::ocsf::event(&r)),
                };
                println!("{}", line.unwrap_or_default());
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Cost { session, by, json } => {
            // Everything: a session's descendants are found only through the records of
            // the whole chain, so no SQL filter can narrow this down first.
            let all = verify::query(
                &*read_only()?,
                &Query {
                    limit: Some(u32::MAX),
                    ..Default::default()
                },
            )?;
            let rows = match session {
                None => cost::cost_report(&all, by),
                Some(id) => cost::cost_report(cost::of_session_tree(&all, &id), by),
            };
            if json {
                print!("{}", cost::render_json(&rows));
            } else {
                print!("{}", cost::render_table(&rows, by));
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify {
            offline: Some(file),
            pubkey: Some(key),
        } => evidence::verify_offline(&file, &key),
        AuditCommand::Pubkey => evidence::pubkey(config),
        AuditCommand::Export { since } => {
            let since_ms = since
                .map(|text| {
                    ostiary::control::parse_since(&text).ok_or_else(|| {
                        CliError::Usage(format!("--since {text:?}: not a time or duration"))
                    })
                })
                .transpose()?;
            evidence::export(&*read_only()?, since_ms)
        }
        AuditCommand::Verify { .. } => {
            let key = read_audit_key(config)?;
            let report = verify::verify(
                &*read_only()?,
                &key,
                &config.state.dir.join(files::AUDIT_HEAD),
            )?;
            if report.ok() {
                println!("ok: {} records, chain intact", report.records);
            } else {
                println!("FAILED: {} records checked", report.records);
                for p in &report.problems {
                    println!("  {p}");
                }
            }
            for note in &report.notes {
                println!("  note: {note}");
            }
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// `audit reanchor`: exit 0 once the acknowledgement is sealed onto the chain; 1 when the
/// chain matches its checkpoint (nothing to acknowledge).
fn reanchor(
    config: &Config,
    backend: &ostiary::stores::Backend<'_>,
    reason: &str,
) -> Result<ExitCode, CliError> {
    use ostiary::audit::anchor::{self, ReanchorError};
    let key = read_audit_key(config)?;
    let trail = backend.open()?.audit;
    let head = config.state.dir.join(files::AUDIT_HEAD);
    match anchor::reanchor(&*trail, &key, &head, reason) {
        Ok(done) => {
            println!(
                "re-anchored: record {} acknowledges: {}",
                done.seq, done.problem
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ ReanchorError::Intact { .. }) => {
            println!("{e}");
            Ok(ExitCode::FAILURE)
        }
        Err(ReanchorError::NoReason) => Err(CliError::Usage(ReanchorError::NoReason.to_string())),
        Err(e) => Err(CliError::Usage(format!("re-anchoring failed: {e}"))),
    }
}

/// The audit key: from the shared keys (`state.keys_dir`) when set, else the state directory.
fn read_audit_key(config: &Config) -> Result<Vec<u8>, CliError> {
    let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
    let path = dir.join(files::AUDIT_KEY);
    std::fs::read_to_string(&path)
        .map(|k| k.trim().as_bytes().to_vec())
        .map_err(|source| CliError::Io {
            what: format!("reading {}", path.display()),
            source,
        })
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
}
