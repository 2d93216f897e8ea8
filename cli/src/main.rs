//! The `ostiary` binary: parse the command line, set up logging, run the command. The proxy
//! itself is the `ostiary` library (`proxy/`); this crate is its command line, a client of
//! the control API (through `ostiary-sdk`) for most commands and the proxy's host for `serve`.
//!
//! # Layout
//! - [`commands`] — the command line (clap) and what each command does: `serve`, `session
//!   new`, `ca export`, `audit`, `policy`; with one module per larger command:
//!   - [`commands::audit`] — `audit query|verify|pubkey|export|reanchor|siem|cost`.
//!   - [`commands::records`] — how `audit query` and `tail` print records: the table, the
//!     JSON lines, and which of them by default.
//!   - [`commands::sessions`] — `session(s) show|resume|terminate|dead-letters`.
//!   - [`mod@commands::run`] — `run`, with or without `--sandbox`.
//!   - [`commands::approvals`] — `approvals list|show|approve|deny|link`.
//!   - [`commands::cost`] — `audit cost`: charged tool calls summed from the audit chain.
//!   - [`commands::tail`] — `audit tail`: follow the audit trail with `query`'s filters.
//!   - [`commands::doctor`] — `doctor`: check a deployment, say what to fix.
//!   - [`commands::completions`] — `completions`: shell completion scripts.
//! - [`output`] — the global `--json`, and colour only where a person sees it.
//! - `help` (tests only) — every subcommand and flag has `--help` text, and none reads like
//!   a note for the code.
//! - [`stages`] — the sandbox's hidden stages (`sandbox-enter`, `sandbox-init`,
//!   `sandbox-exec`): their command line, parsed into the library's stage arguments.
#![forbid(unsafe_code)]

mod commands;
#[cfg(test)]
mod help;
mod output;
mod stages;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// Per-request allocations dominate the proxy's malloc traffic (buffers, headers, Cedar
/// values); mimalloc's thread-local heaps serve them without glibc's arena locks, and return
/// what a connection's handshake used instead of keeping it in a fragmented arena.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `ostiary audit query | head`: Rust ignores SIGPIPE, so a reader that went away makes
/// `println!` panic. The shell's convention instead (exit 128 + SIGPIPE, nothing printed);
/// every other panic is reported as before. Restoring SIGPIPE's default would need `unsafe`.
fn quiet_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
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
    // The sandbox's stages run before any runtime exists (see `stages::run`).
    let cli = match commands::Cli::parse() {
        commands::Cli {
            command: commands::Command::Stage(stage),
            ..
        } => return stages::run(stage),
        cli => cli,
    };
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
        match commands::run(cli).await {
            Ok(code) => code,
            Err(e) => {
                let e = anyhow::Error::from(e);
                eprintln!("ostiary: {e:#}");
                ExitCode::from(2)
            }
        }
    })
}
