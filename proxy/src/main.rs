//! The `ostiary` binary: parse the command line, set up logging, run the command.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let filter = EnvFilter::try_from_env("OSTIARY_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
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
    match ostiary::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            let e = anyhow::Error::from(e);
            eprintln!("ostiary: {e:#}");
            ExitCode::from(2)
        }
    }
}
