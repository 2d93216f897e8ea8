//! The `ostiary` binary: parse the command line, set up logging, run the command.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let mut filter =
        EnvFilter::try_from_env("OSTIARY_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // The Vault client's libraries log requests and responses at debug/trace, which may
    // carry tokens and secrets: they are capped whatever OSTIARY_LOG asks for.
    for target in ostiary_broker::vault::QUIET_TARGETS {
        if let Ok(directive) = format!("{target}=warn").parse() {
            filter = filter.add_directive(directive);
        }
    }
    let json = std::env::var("OSTIARY_LOG_FORMAT").is_ok_and(|f| f == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    let cli = ostiary::cli::Cli::parse();
    // The sandbox's stages run before any runtime exists (see `run_stage`).
    if cli.command.is_sandbox_stage() {
        return ostiary::cli::run_stage(cli.command);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ostiary: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        match ostiary::cli::run(cli).await {
            Ok(code) => code,
            Err(e) => {
                let e = anyhow::Error::from(e);
                eprintln!("ostiary: {e:#}");
                ExitCode::from(2)
            }
        }
    })
}
