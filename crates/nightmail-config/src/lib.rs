//! The configuration file (`config/nightmail.toml`): listeners, data directory, users, models, the
//! relay and bridges.
//!
//! Parsing happens once, here, into checked types: an address is an [`Address`], a user has
//! exactly one kind of [`Password`], and every mistake is reported with the file, line and key,
//! and what to do about it. One module per section; `config.rs` reads the whole file.
mod auth;
mod bridge;
mod config;
mod edit;
mod error;
mod imap;
mod model;
mod relay;
mod research;
mod smtp;
mod store;
mod tls;
mod transcribe;
mod upstream;
mod user;
mod worker;

pub use auth::AuthConfig;
pub use bridge::{Allow, BridgeConfig, Endpoint};
pub use config::{ASK_FOLDER, Config, DEFAULTS_NAME};
pub use edit::upsert_user;
pub use error::ConfigError;
pub use imap::ImapConfig;
pub use model::{ApiPrice, BackendConfig, Cost, Draft, LocalBackend, ModelEntry, ReasoningOutput};
pub use nightmail_types::Address;
pub use relay::RelayConfig;
pub use research::{ResearchConfig, SearchService, Tool};
pub use smtp::SmtpConfig;
pub use store::StoreConfig;
pub use tls::TlsConfig;
pub use transcribe::TranscribeConfig;
pub use upstream::{PasswordSource, RelayTls, Secret};
pub use user::{Password, User};
pub use worker::WorkerConfig;
