//! The configuration file (`config/nightmail.toml`): what the daemon listens on, where it keeps
//! data, its users and its model addresses.
//!
//! Parsing happens once, here, into checked types: an address is an [`Address`], a user has
//! exactly one kind of [`Password`], and every mistake is reported with the file, line and key,
//! and what to do about it.

mod bridge;
mod edit;
mod raw;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use bridge::{Allow, BridgeConfig, Endpoint};
pub use edit::upsert_user;
pub use nightmail_types::Address;

/// The whole, checked configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Used in the SMTP greeting and in the Message-IDs we write.
    pub hostname: String,
    pub data_dir: PathBuf,
    pub smtp: SmtpConfig,
    pub imap: ImapConfig,
    pub tls: Option<TlsConfig>,
    pub auth: AuthConfig,
    pub users: Vec<User>,
    pub models: Vec<Model>,
    pub worker: WorkerConfig,
    /// The smarthost that mail to outside addresses goes through; `None`: nothing leaves.
    pub relay: Option<RelayConfig>,
    /// Mailboxes at other providers that a model answers from (`[[bridge]]`).
    pub bridges: Vec<BridgeConfig>,
    /// The file this came from, if any (built-in defaults otherwise).
    pub source: Option<PathBuf>,
    /// Things worth a warning at start-up (plain-text passwords, no users).
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct SmtpConfig {
    pub listen: SocketAddr,
    /// Submission with implicit TLS (RFC 8314 §3.3, like port 465), beside `listen`'s STARTTLS.
    pub listen_tls: Option<SocketAddr>,
    /// RFC 1870 SIZE: larger messages are refused while DATA is read.
    pub max_message_bytes: usize,
    /// RFC 5321 §4.5.3.1.8 asks servers to accept at least 100.
    pub max_recipients: usize,
    pub max_connections: usize,
    /// Connections from one client (an IPv4 address or an IPv6 /64) at once.
    pub max_connections_per_ip: usize,
    /// RFC 5321 §4.5.3.1.6 limits a text line to 1000 octets; we refuse lines longer than this.
    pub max_line_bytes: usize,
    /// Header fields (physical lines) allowed before the body.
    pub max_header_lines: usize,
    /// RFC 5321 §4.5.3.2: how long a whole command line may take to arrive (counted from its
    /// first byte, so a client trickling bytes does not reset it), a TLS handshake and a write.
    pub timeout: Duration,
    /// How long a whole message (DATA to the final dot) may take to arrive.
    pub data_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct ImapConfig {
    pub listen: SocketAddr,
    /// IMAP with implicit TLS (RFC 8314 §3.2, like port 993), beside `listen`'s STARTTLS.
    pub listen_tls: Option<SocketAddr>,
    /// Connections served at once; more are greeted with BYE (RFC 3501 §7.1.5).
    pub max_connections: usize,
    /// Connections from one client (an IPv4 address or an IPv6 /64) at once.
    pub max_connections_per_ip: usize,
    /// How long a whole command (with its literals) may take to arrive, counted from its first
    /// byte; also the deadline of a TLS handshake and of a write.
    pub command_timeout: Duration,
    /// Mailboxes one user may have.
    pub max_mailboxes: usize,
    /// The longest mailbox name, in bytes of UTF-8.
    pub max_mailbox_name_bytes: usize,
}

/// Where the TLS certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsConfig {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Generated once (rcgen) and kept in `data_dir/tls/`.
    SelfSigned,
}

/// Failed-login handling, shared by SMTP and IMAP.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Every failed attempt is answered only after this delay.
    pub failure_delay: Duration,
    /// After this many failures for one login name from one client (an IPv4 address or IPv6
    /// /64) within `failure_window`, that login is refused to that client until the window
    /// passes; other users at the same address (a NAT, Docker) are not.
    pub max_failures: u32,
    /// After this many failures from one client for all logins together, the client is refused.
    pub max_client_failures: u32,
    pub failure_window: Duration,
    /// argon2 hashes computed at once (each takes 19 MiB and tens of milliseconds of CPU); more
    /// logins wait their turn.
    pub max_concurrent_hashes: usize,
}

#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    /// Plain text in the config file (a warning is logged).
    Plain(String),
    /// A PHC string, `$argon2id$...`, as `nightmail user add` writes.
    Argon2(String),
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Password::Plain(_) => f.write_str("Plain(..)"),
            Password::Argon2(_) => f.write_str("Argon2(..)"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub address: Address,
    pub password: Password,
}

/// Where a model's answers come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendConfig {
    /// An OpenAI-compatible chat completions server (llama.cpp's server, vLLM, a cloud API).
    OpenAi {
        /// Base URL, e.g. `http://127.0.0.1:8080/v1`; `/chat/completions` is appended.
        url: String,
        /// The `model` field sent to the server.
        model: String,
        /// Name of the environment variable holding the API key, if the server needs one.
        api_key_env: Option<String>,
        /// How long to wait for the server to start answering, and between streamed chunks.
        timeout: Duration,
        /// Retries of a failed request (connection refused, 5xx, 429) within one attempt.
        retries: u32,
    },
    /// nightmail's own engine on this machine.
    Local(LocalBackend),
}

/// `backend = "local"`: the model file and how the engine runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalBackend {
    /// A GGUF file or a Hugging Face model directory.
    pub path: PathBuf,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    /// Stream the model's routed experts from disk through a RAM cache of this many MiB
    /// (dense weights stay resident); `None` loads every expert.
    pub expert_cache_mb: Option<usize>,
    /// One memory budget for the whole model, in MiB: the engine keeps what fits resident
    /// (dense layers first, then the expert cache) and streams the rest from disk. Replaces
    /// `expert_cache_mb`.
    pub memory_mb: Option<usize>,
    /// Save a running answer's state after this many new tokens or this long, whichever comes
    /// first, so a crash or restart resumes it instead of starting over.
    pub checkpoint_every_tokens: u32,
    pub checkpoint_every: Duration,
    /// Jobs of this model decoded together, in lockstep (each step reads the weights once).
    pub max_batch: usize,
    /// How the engine drafts tokens ahead of the model (`draft = "lookup"|"mtp"|"none"`, or
    /// `draft_model = PATH`).
    pub draft: Draft,
    /// MiB of disk (under `data_dir/state_cache/`) for the states of finished answers, which a
    /// follow-up in the thread restores instead of prefilling its prompt again; least recently
    /// used out first. 0 keeps none.
    pub state_cache_mb: u64,
}

/// `draft`: guess tokens ahead and verify them in one model pass. The answer is the same
/// either way; drafts only save passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Draft {
    /// One pass per token.
    None,
    /// Prompt lookup: n-gram matches against the conversation, the forwarded mail and the
    /// attachments (no extra model).
    Lookup,
    /// `draft_model = PATH`: a small model of the same tokenizer (a GGUF file or a model
    /// directory), kept resident beside the model, guesses the tokens.
    Model(PathBuf),
    /// `draft = "mtp"`: the model's own multi-token-prediction layer (DeepSeek-V3's
    /// `num_nextn_predict_layers`), loaded beside it.
    Mtp,
}

impl BackendConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            BackendConfig::OpenAi { .. } => "openai",
            BackendConfig::Local(_) => "local",
        }
    }
}

/// What to do with a model's reasoning (`<think>` text or reasoning deltas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningOutput {
    /// Left out of the reply (counted in the footer).
    Omit,
    /// Attached to the reply as `reasoning.txt`.
    Attach,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub address: Address,
    /// Display name in the reply's `From:`, e.g. "Kimi".
    pub name: Option<String>,
    pub backend: BackendConfig,
    pub system_prompt: Option<String>,
    /// Default maximum length of an answer, in tokens (a mail can lower or raise it).
    pub max_tokens: u32,
    /// Default for reasoning on/off (a mail can change it).
    pub reasoning: bool,
    pub reasoning_output: ReasoningOutput,
    /// Sampling temperature; 0 means greedy.
    pub temperature: f32,
    /// Send an immediate acknowledgement (queue position, estimate) when a question arrives.
    pub ack: bool,
    /// What an answer costs, stated in each reply.
    pub cost: Cost,
    /// How often a running job's message in its asker's `In Progress` mailbox is replaced with
    /// the answer so far (`progress_every_secs`, default 600).
    pub progress_every: Duration,
    /// How often a very long job mails its asker the answer so far
    /// (`progress_mail_every_hours`); `None`: never.
    pub progress_mail_every: Option<Duration>,
    /// The context, in tokens, prompts are fitted to (`context_tokens`): at most this, and at
    /// most what the backend reports; `None`: what the backend reports.
    pub context_tokens: Option<usize>,
}

/// The figures a reply's cost line is computed from (`[[model]]` keys `watts`,
/// `price_in_per_mtok`, `price_out_per_mtok`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// The machine's draw while answering, used when RAPL's energy counters cannot be read.
    pub watts: Option<f64>,
    /// What the same tokens would cost at a hosted API.
    pub api_price: Option<ApiPrice>,
}

/// A hosted API's price, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiPrice {
    pub input_per_mtok: f64,
    /// Output tokens; reasoning tokens are billed as output, as hosted APIs bill them.
    pub output_per_mtok: f64,
}

/// The worker that answers jobs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Jobs answered at once; 0 accepts and queues mail without answering it.
    pub concurrency: usize,
    /// How long a job's lease lasts without a heartbeat; a crashed worker's job is retaken after it.
    pub lease: Duration,
    /// Replies to one sender per hour at most: a loop that slips past the header rules stops here.
    pub max_replies_per_sender_per_hour: u32,
    /// Backoff for failed attempts: doubles from `retry_base`, at most `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Attempts before a job fails with a notice to the sender.
    pub max_attempts: u32,
    /// How long a finished job (and the question bytes only it holds) is kept; `None` (0 days in
    /// the file): for ever. The users' mail is never touched.
    pub retention: Option<Duration>,
}

/// How the connection to the smarthost is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayTls {
    /// Plain connection upgraded with STARTTLS (RFC 3207), the submission port 587.
    StartTls,
    /// TLS from the first byte (RFC 8314 §3.3), port 465.
    Implicit,
    /// No TLS: accepted only for a loopback host (a local Postfix, a test smarthost).
    None,
}

impl RelayTls {
    pub fn name(self) -> &'static str {
        match self {
            RelayTls::StartTls => "starttls",
            RelayTls::Implicit => "implicit",
            RelayTls::None => "none",
        }
    }
}

/// Where the smarthost password comes from. The password itself is never in the configuration,
/// so it is never in its `Debug`, the log or `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordSource {
    /// The name of an environment variable.
    Env(String),
    /// A file holding the password (one line; a final newline is ignored).
    File(PathBuf),
}

/// A password read from its [`PasswordSource`]. Its `Debug` says only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: String) -> Secret {
        Secret(text)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl PasswordSource {
    /// Reads the `[relay]` password. The error names the variable or file and the key to fix,
    /// never the value.
    pub fn read(&self) -> Result<Secret, String> {
        self.read_for("relay")
    }

    /// Reads the password of the section `section` (`relay`, `bridge`), naming its keys in errors.
    pub fn read_for(&self, section: &str) -> Result<Secret, String> {
        let text = match self {
            PasswordSource::Env(name) => std::env::var(name).map_err(|_| {
                format!("{section}.password_env: the environment variable {name} is not set (or not UTF-8)")
            })?,
            PasswordSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("{section}.password_file: cannot read {}: {e}", path.display()))?,
        };
        let text = text.trim_end_matches(['\r', '\n']).to_string();
        if text.is_empty() {
            return Err(match self {
                PasswordSource::Env(name) => format!("{section}.password_env: {name} is empty"),
                PasswordSource::File(path) => format!("{section}.password_file: {} is empty", path.display()),
            });
        }
        Ok(Secret(text))
    }
}

/// `[relay]`: the smarthost (the user's provider's submission server, or a local MTA) through
/// which mail to outside addresses leaves, with the limits that keep nightmail from becoming an
/// amplifier.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    pub host: String,
    pub port: u16,
    pub tls: RelayTls,
    /// The login at the smarthost and where its password is; `None`: no AUTH.
    pub user: Option<(String, PasswordSource)>,
    /// Accept a certificate that does not verify. Only when set explicitly, and logged.
    pub tls_insecure: bool,
    /// Extra trusted root certificates (PEM), for a smarthost with a private CA.
    pub ca_file: Option<PathBuf>,
    /// How long a message may wait for a recipient before it bounces.
    pub give_up_after: Duration,
    /// Outside recipients of one model reply; the rest are named in the reply, not sent to.
    pub max_recipients_per_reply: usize,
    /// Outside recipients one user may relay to in 24 hours.
    pub max_relay_recipients_per_user_per_day: usize,
    /// How long to wait for the smarthost to connect and to answer each command.
    pub timeout: Duration,
}

impl RelayConfig {
    /// `host:port (tls)`, for messages.
    pub fn describe(&self) -> String {
        format!("{}:{} ({})", self.host, self.port, self.tls.name())
    }
}

/// A configuration mistake, with where it is and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid { path: String, line: usize, column: usize, message: String },
    #[error("{path}: {message}")]
    Semantic { path: String, message: String },
}

/// The parent of the Ask folders: a message filed into `Ask/<model>` asks that model about it.
pub const ASK_FOLDER: &str = "Ask";

/// Where a config with no file says it came from.
pub const DEFAULTS_NAME: &str = "<built-in defaults>";

impl Config {
    /// Built-in defaults: loopback listeners, `data/`, no users or models.
    pub fn defaults() -> Config {
        Config::parse("", None).expect("the empty configuration is valid")
    }

    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.to_path_buf(), message: e.to_string() })?;
        Config::parse(&text, Some(path))
    }

    /// Parses and checks `text`, naming `source` in errors.
    pub fn parse(text: &str, source: Option<&Path>) -> Result<Config, ConfigError> {
        raw::parse(text, source)
    }

    /// The user whose name or address is `login` (case-insensitive), as mail clients may send
    /// either.
    pub fn user(&self, login: &str) -> Option<&User> {
        let login = login.trim();
        self.users.iter().find(|u| u.name.eq_ignore_ascii_case(login) || u.address.as_str().eq_ignore_ascii_case(login))
    }

    pub fn user_by_address(&self, address: &Address) -> Option<&User> {
        self.users.iter().find(|u| &u.address == address)
    }

    pub fn model(&self, address: &Address) -> Option<&Model> {
        self.models.iter().find(|m| &m.address == address)
    }

    /// The bridge whose upstream address is `address`.
    pub fn bridge(&self, address: &Address) -> Option<&BridgeConfig> {
        self.bridges.iter().find(|b| &b.address == address)
    }

    /// Each model's Ask folder, `Ask/<name>` (its `name` key, or the local part of its address),
    /// in configuration order. A `/` in the name would make another level and becomes `-`; a
    /// name two models share goes to the first, and the second's folder is named by address.
    pub fn ask_folders(&self) -> Vec<(String, &Model)> {
        let mut folders: Vec<(String, &Model)> = Vec::with_capacity(self.models.len());
        for model in &self.models {
            let name = model.name.clone().unwrap_or_else(|| model.address.local_part().to_string());
            let mut folder = format!("{ASK_FOLDER}/{}", name.trim().replace('/', "-"));
            if folders.iter().any(|(taken, _)| taken.eq_ignore_ascii_case(&folder)) {
                folder = format!("{ASK_FOLDER}/{}", model.address.as_str().replace('/', "-"));
            }
            folders.push((folder, model));
        }
        folders
    }

    /// The model whose Ask folder is the mailbox `name`, if it is one.
    pub fn ask_folder(&self, name: &str) -> Option<&Model> {
        self.ask_folders().into_iter().find(|(folder, _)| folder == name).map(|(_, model)| model)
    }

    /// The name used in messages about the source of this configuration.
    pub fn source_name(&self) -> String {
        self.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| DEFAULTS_NAME.into())
    }
}
