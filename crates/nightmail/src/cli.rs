//! The command line.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use nightmail_config::{Address, Config};

#[derive(Parser)]
#[command(name = "nightmail", version, about = "Mail a question to a giant language model; the reply arrives by mail.")]
pub struct Cli {
    /// Configuration file. Default: config/nightmail.toml if it exists, else built-in defaults.
    #[arg(long, global = true, env = "NIGHTMAIL_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: SMTP submission, the store and the queue.
    Serve,
    /// Check the configuration file and say what is wrong with it.
    CheckConfig,
    /// Show the queue: each job's id, state, sender, subject, Message-ID and age, and outbound mail with its last error.
    Status {
        /// One JSON object with `jobs` and `outbound` arrays (docs/STATUS.md).
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// A live view: a progress bar per answer being written, its pace and the time left.
        #[arg(long)]
        watch: bool,
    },
    /// Act on outbound mail waiting for the relay (ids from `nightmail status`).
    Outbound {
        #[command(subcommand)]
        command: OutboundCommand,
    },
    /// Print a working configuration for a mail client and one local account (mutt: save it and
    /// run `mutt -F FILE`).
    ClientConfig {
        client: crate::client_config::Client,
        /// The account (default: the first user).
        #[arg(long)]
        user: Option<String>,
    },
    /// Write a consistent copy of the store (mail, jobs, the queue, the self-signed TLS
    /// certificate) into DIR, empty or absent, while the daemon runs (or not).
    Backup { dir: PathBuf },
    /// Restore a backup into the configuration's data_dir, which must be empty or absent; the
    /// backup is verified first, and the restored store checked.
    Restore { dir: PathBuf },
    /// Check that every index in the store points at existing records and bytes.
    Check {
        /// Also rebuild every user's mail index (the search behind `search_mail`) from the store.
        #[arg(long)]
        reindex: bool,
    },
    /// Manage users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Inspect a model file, or generate with it (no daemon needed).
    Model {
        #[command(subcommand)]
        // Boxed: its many options would make every other command as large.
        command: Box<nightmail_tools::cli::ModelCommand>,
    },
}

#[derive(Subcommand)]
enum OutboundCommand {
    /// Try it again now instead of at its next scheduled attempt.
    Retry { id: u64 },
    /// Give up on it without a bounce.
    Drop { id: u64 },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Add a user, or change their address and password. The password is read from standard
    /// input (one line) and stored as an argon2 hash in the configuration file.
    Add {
        name: String,
        #[arg(long)]
        address: String,
    },
}

const DEFAULT_CONFIG: &str = "config/nightmail.toml";

/// The file to use: the flag or NIGHTMAIL_CONFIG, else `config/nightmail.toml` if present.
fn config_path(flag: Option<PathBuf>) -> Option<PathBuf> {
    flag.or_else(|| Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists()))
}

fn load(path: Option<&Path>) -> anyhow::Result<Config> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => Config::defaults(),
    })
}

/// `model` commands write only to their standard output and files, as a Unix filter does, so
/// they end as a filter does when the reader goes away (`nightmail model plan M | head`): killed
/// by SIGPIPE, quietly. Rust's runtime ignores SIGPIPE and `println!` then panics on EPIPE. The
/// daemon keeps it ignored: a client that hangs up must be an error on one socket, not the end
/// of the process (POSIX `write()`: EPIPE, and SIGPIPE unless ignored).
fn die_on_broken_pipe() {
    // SAFETY: resetting a signal's disposition to its default before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let path = config_path(cli.config.clone());
    match cli.command {
        Command::Model { command } => {
            die_on_broken_pipe();
            nightmail_tools::cli::run(*command)?
        }
        Command::Serve => {
            let config = load(path.as_deref())?;
            crate::serve::run(config)?;
        }
        Command::CheckConfig => {
            let config = load(path.as_deref())?;
            for warning in &config.warnings {
                eprintln!("warning: {warning}");
            }
            // The password is read as `serve` will read it, so a missing variable or file shows
            // here and not at the first outgoing message.
            if let Some((_, source)) = config.relay.as_ref().and_then(|r| r.user.as_ref()) {
                source.read().map_err(|e| anyhow::anyhow!("{}: {e}", config.source_name()))?;
            }
            for bridge in &config.bridges {
                bridge
                    .password
                    .read_for("bridge")
                    .map_err(|e| anyhow::anyhow!("{}: bridge {}: {e}", config.source_name(), bridge.address))?;
                println!(
                    "bridge {} for {}: imap {}, smtp {}",
                    bridge.address,
                    bridge.model,
                    bridge.imap.describe(),
                    bridge.smtp.describe()
                );
            }
            let relay = match &config.relay {
                Some(relay) => format!("relay via {}", relay.describe()),
                None => "no relay: mail stays local".to_string(),
            };
            println!(
                "{}: ok ({} users, {} models, smtp on {}, {relay}, data in {})",
                config.source_name(),
                config.users.len(),
                config.models.len(),
                config.smtp.listen,
                config.data_dir.display()
            );
        }
        Command::ClientConfig { client, user } => {
            let config = load(path.as_deref())?;
            print!("{}", crate::client_config::render(&config, client, user.as_deref())?);
        }
        Command::Status { json, watch } => {
            let config = load(path.as_deref())?;
            if watch {
                crate::watch::run(&config)?;
            }
            crate::status::print(&config, json)?;
        }
        Command::Outbound { command } => {
            let config = load(path.as_deref())?;
            let (action, id) = match command {
                OutboundCommand::Retry { id } => (crate::outbound::Action::Retry, id),
                OutboundCommand::Drop { id } => (crate::outbound::Action::Drop, id),
            };
            crate::outbound::run(&config, action, id)?;
        }
        Command::Backup { dir } => crate::backup::backup(&load(path.as_deref())?, &dir)?,
        Command::Restore { dir } => {
            if !crate::backup::restore(&load(path.as_deref())?, &dir)? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Check { reindex } => {
            let config = load(path.as_deref())?;
            let whole = crate::backup::check(&config)?;
            if reindex {
                crate::reindex::reindex(&config)?;
            }
            if !whole {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::User { command: UserCommand::Add { name, address } } => {
            let address = Address::parse(&address).context("--address")?;
            let target = cli.config.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
            let password = read_password()?;
            let hash = nightmail_auth::hash_password(&password);
            let created = nightmail_config::upsert_user(&target, &name, &address, &hash)?;
            println!(
                "{} user {name} <{address}> in {} (restart `nightmail serve` to apply)",
                if created { "added" } else { "updated" },
                target.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_password() -> anyhow::Result<String> {
    eprintln!("password (one line on standard input):");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the password from standard input")?;
    let password = line.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        bail!(
            "no password given: pipe one line to standard input, e.g. `echo 'secret' | nightmail user add me --address me@nightmail.local`"
        );
    }
    Ok(password)
}
