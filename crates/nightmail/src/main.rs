//! `nightmail`: the daemon and its command line. Argument parsing and wiring only; the work is
//! done by the library crates.

mod backup;
mod cli;
mod client_config;
mod control;
mod control_server;
mod outbound;
mod reindex;
mod reload;
mod serve;
mod status;
mod watch;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sled=warn".into()),
        )
        .init();
    match cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nightmail: {e:#}");
            ExitCode::FAILURE
        }
    }
}
