//! The whole file: its sections read by serde, checked one by one and then against each other
//! (an address belongs to one user, model or bridge).

use std::path::{Path, PathBuf};

use nightmail_types::Address;
use serde::Deserialize;
use toml::Spanned;

use crate::auth::{self, AuthConfig};
use crate::bridge::{self, BridgeConfig};
use crate::error::{ConfigError, Locator};
use crate::imap::{self, ImapConfig};
use crate::model::{self, ModelEntry};
use crate::relay::{self, RelayConfig};
use crate::research::{self, ResearchConfig, Tool};
use crate::smtp::{self, SmtpConfig};
use crate::store::{self, StoreConfig};
use crate::tls::{self, TlsConfig};
use crate::transcribe::{self, TranscribeConfig};
use crate::user::{self, Password, User};
use crate::worker::{self, WorkerConfig};

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
    pub store: StoreConfig,
    pub users: Vec<User>,
    pub models: Vec<ModelEntry>,
    pub worker: WorkerConfig,
    /// The smarthost that mail to outside addresses goes through; `None`: nothing leaves.
    pub relay: Option<RelayConfig>,
    /// Mailboxes at other providers that a model answers from (`[[bridge]]`).
    pub bridges: Vec<BridgeConfig>,
    /// Where research tools reach and what a job may spend on them (`[research]`).
    pub research: ResearchConfig,
    /// The Whisper model voice notes are transcribed with (`[transcribe]`); `None`: not transcribed.
    pub transcribe: Option<TranscribeConfig>,
    /// The file this came from, if any (built-in defaults otherwise).
    pub source: Option<PathBuf>,
    /// Things worth a warning at start-up (plain-text passwords, no users).
    pub warnings: Vec<String>,
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
        parse(text, source)
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

    pub fn model(&self, address: &Address) -> Option<&ModelEntry> {
        self.models.iter().find(|m| &m.address == address)
    }

    /// Whether mail for `domain` is this server's own: its hostname, or the domain of a user's or
    /// a model's address (a bridge's address is at another provider, so its domain is not).
    pub fn is_own_domain(&self, domain: &str) -> bool {
        domain.eq_ignore_ascii_case(&self.hostname)
            || self.users.iter().any(|u| u.address.domain().eq_ignore_ascii_case(domain))
            || self.models.iter().any(|m| m.address.domain().eq_ignore_ascii_case(domain))
    }

    /// The bridge whose upstream address is `address`.
    pub fn bridge(&self, address: &Address) -> Option<&BridgeConfig> {
        self.bridges.iter().find(|b| &b.address == address)
    }

    /// Each model's Ask folder, `Ask/<name>` (its `name` key, or the local part of its address),
    /// in configuration order. A `/` in the name would make another level and becomes `-`; a
    /// name two models share goes to the first, and the second's folder is named by address.
    pub fn ask_folders(&self) -> Vec<(String, &ModelEntry)> {
        let mut folders: Vec<(String, &ModelEntry)> = Vec::with_capacity(self.models.len());
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
    pub fn ask_folder(&self, name: &str) -> Option<&ModelEntry> {
        self.ask_folders().into_iter().find(|(folder, _)| folder == name).map(|(_, model)| model)
    }

    /// The name used in messages about the source of this configuration.
    pub fn source_name(&self) -> String {
        self.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| DEFAULTS_NAME.into())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_hostname")]
    hostname: Spanned<String>,
    #[serde(default = "default_data_dir")]
    data_dir: PathBuf,
    #[serde(default)]
    smtp: smtp::RawSmtp,
    #[serde(default)]
    imap: imap::RawImap,
    tls: Option<Spanned<tls::RawTls>>,
    #[serde(default)]
    auth: auth::RawAuth,
    #[serde(default)]
    store: store::RawStore,
    #[serde(default)]
    user: Vec<Spanned<user::RawUser>>,
    #[serde(default)]
    model: Vec<Spanned<model::RawModel>>,
    #[serde(default)]
    worker: worker::RawWorker,
    relay: Option<Spanned<relay::RawRelay>>,
    #[serde(default)]
    bridge: Vec<Spanned<bridge::RawBridge>>,
    #[serde(default)]
    research: research::RawResearch,
    transcribe: Option<transcribe::RawTranscribe>,
}

fn default_hostname() -> Spanned<String> {
    Spanned::new(0..0, "nightmail.local".into())
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("data")
}

fn parse(text: &str, source: Option<&Path>) -> Result<Config, ConfigError> {
    let path = source.map(|p| p.display().to_string()).unwrap_or_else(|| DEFAULTS_NAME.to_string());
    let loc = Locator { text, path };
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        loc.at(
            offset,
            format!("{} (see config/nightmail.toml in the nightmail repository for every key)", e.message().trim()),
        )
    })?;
    let mut warnings = Vec::new();

    let hostname = raw.hostname.get_ref().trim().to_string();
    if hostname.is_empty() || hostname.contains(|c: char| c.is_whitespace() || c == '@') {
        return Err(
            loc.spanned(&raw.hostname, format!("hostname `{hostname}` must be a domain name like nightmail.local"))
        );
    }

    let smtp = smtp::check(&raw.smtp, &loc)?;
    let tls = raw.tls.map(|t| tls::check(&t, &loc)).transpose()?;
    // RFC 8314 §3: an implicit-TLS listener needs a certificate to speak TLS with.
    for (key, listen) in [("smtp.listen_tls", &raw.smtp.listen_tls), ("imap.listen_tls", &raw.imap.listen_tls)] {
        if let (Some(listen), None) = (listen, &tls) {
            return Err(
                loc.spanned(listen, format!("{key} needs a [tls] section (cert and key, or self_signed = true)"))
            );
        }
    }
    let auth = auth::check(&raw.auth);

    let relay = raw.relay.as_ref().map(|r| relay::check(r, &loc)).transpose()?;
    if let Some(relay) = &relay
        && relay.tls_insecure
    {
        warnings.push(format!(
            "relay.tls_insecure = true in {}: the certificate of {} is not verified, so anyone on the path can read and change outgoing mail",
            loc.path, relay.host
        ));
    }

    let mut users: Vec<User> = Vec::new();
    for spanned in &raw.user {
        let user = user::check(spanned, &loc)?;
        if matches!(user.password, Password::Plain(_)) {
            warnings.push(format!(
                "user `{}` has a plain-text password in {}: run `nightmail user add {} --address {}` to store an argon2 hash instead",
                user.name, loc.path, user.name, user.address
            ));
        }
        if users.iter().any(|u| u.name.eq_ignore_ascii_case(&user.name)) {
            return Err(loc.spanned(&spanned.get_ref().name, format!("user name `{}` appears twice", user.name)));
        }
        if users.iter().any(|u| u.address == user.address) {
            return Err(
                loc.spanned(&spanned.get_ref().address, format!("address {} belongs to two users", user.address))
            );
        }
        users.push(user);
    }

    let mut models: Vec<ModelEntry> = Vec::new();
    for spanned in &raw.model {
        let model = model::check(spanned, &loc)?;
        if users.iter().any(|u| u.address == model.address) || models.iter().any(|o| o.address == model.address) {
            return Err(loc.spanned(
                &spanned.get_ref().address,
                format!("address {} is used twice (by a user or another model)", model.address),
            ));
        }
        models.push(model);
    }
    let mut bridges: Vec<BridgeConfig> = Vec::new();
    for spanned in &raw.bridge {
        let bridge = bridge::check(spanned, &loc, &models)?;
        if bridge.tls_insecure {
            warnings.push(format!(
                "bridge {}: tls_insecure = true in {}: the certificates of {} and {} are not verified",
                bridge.address, loc.path, bridge.imap.host, bridge.smtp.host
            ));
        }
        let taken = |a: &Address| {
            users.iter().any(|u| &u.address == a)
                || models.iter().any(|m| &m.address == a)
                || bridges.iter().any(|b| &b.address == a)
        };
        if taken(&bridge.address) {
            return Err(loc.spanned(
                &spanned.get_ref().address,
                format!("bridge.address {} is used twice (by a user, a model or another bridge)", bridge.address),
            ));
        }
        bridges.push(bridge);
    }
    let research = research::check(&raw.research, &loc)?;
    for (spanned, model) in raw.model.iter().zip(&models) {
        if model.tools.contains(&Tool::WebSearch) && research.search.is_none() {
            return Err(loc.spanned(
                spanned,
                format!(
                    "model {} has the tool web_search but [research] names no search service: set search = \"searxng\" and search_url",
                    model.address
                ),
            ));
        }
    }
    if users.is_empty() {
        warnings.push(format!(
            "{} has no [[user]]: nobody can log in; add one with `nightmail user add NAME --address A`",
            loc.path
        ));
    }

    Ok(Config {
        hostname,
        data_dir: raw.data_dir,
        smtp,
        imap: imap::check(&raw.imap, &loc)?,
        tls,
        auth,
        store: store::check(&raw.store, &loc)?,
        users,
        models,
        worker: worker::check(&raw.worker),
        relay,
        bridges,
        research,
        transcribe: raw.transcribe.as_ref().map(|t| transcribe::check(t, &loc)).transpose()?,
        source: source.map(Path::to_path_buf),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::{ApiPrice, BackendConfig, Cost, Draft};
    use crate::upstream::RelayTls;

    fn err(text: &str) -> String {
        parse(text, Some(Path::new("nm.toml"))).unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_loopback() {
        let c = Config::defaults();
        assert!(c.smtp.listen.ip().is_loopback() && c.imap.listen.ip().is_loopback());
        assert_eq!(c.smtp.max_message_bytes, 26214400);
        assert_eq!(c.hostname, "nightmail.local");
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let text = include_str!("../../../config/nightmail.toml");
        let c = parse(text, None).unwrap();
        assert!(!c.users.is_empty() && !c.models.is_empty());
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn each_model_gets_one_ask_folder() {
        let model = |address: &str, name: &str| {
            format!("[[model]]\naddress = \"{address}\"\n{name}backend = \"openai\"\nurl = \"http://x\"\n")
        };
        let text = [
            model("kimi@n.local", "name = \"Kimi\"\n"),
            model("qwen@n.local", ""),
            model("k2@n.local", "name = \"kimi\"\n"),
            model("gpt@n.local", "name = \"GPT/OSS\"\n"),
        ]
        .concat();
        let c = parse(&text, None).unwrap();
        let folders: Vec<(String, &str)> = c.ask_folders().into_iter().map(|(f, m)| (f, m.address.as_str())).collect();
        assert_eq!(
            folders,
            [
                ("Ask/Kimi".to_string(), "kimi@n.local"),
                ("Ask/qwen".to_string(), "qwen@n.local"),
                ("Ask/k2@n.local".to_string(), "k2@n.local"),
                ("Ask/GPT-OSS".to_string(), "gpt@n.local"),
            ]
        );
        assert_eq!(c.ask_folder("Ask/qwen").map(|m| m.address.as_str()), Some("qwen@n.local"));
        assert!(c.ask_folder("Ask").is_none() && c.ask_folder("INBOX").is_none());
    }

    #[test]
    fn an_unknown_key_names_its_line() {
        let e = err("hostname = \"a.b\"\n[smtp]\nlisten = \"127.0.0.1:1\"\nmax_mesage_bytes = 5\n");
        assert!(e.starts_with("nm.toml:4:"), "{e}");
        assert!(e.contains("max_mesage_bytes"), "{e}");
    }

    #[test]
    fn a_bad_address_names_its_line_and_key() {
        let e = err("[[user]]\nname = \"me\"\naddress = \"not an address\"\npassword = \"x\"\n");
        assert!(e.starts_with("nm.toml:3:"), "{e}");
        assert!(e.contains("user.address"), "{e}");
        let e = err("[[model]]\naddress = \"kimi\"\nbackend = \"openai\"\nurl = \"http://x\"\n");
        assert!(e.starts_with("nm.toml:2:") && e.contains("model.address"), "{e}");
    }

    #[test]
    fn semantic_mistakes_are_named() {
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"gpt\"\n").contains("use \"openai\" or \"local\""));
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\n").contains("needs `url`"));
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"local\"\n").contains("needs `path`"));
        assert!(err("[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"ftp://x\"\n").contains("nm.toml:4:"));
        let listed = |urls: &str| format!("[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = {urls}\n");
        assert!(err(&listed("[]")).contains("lists no server"));
        assert!(err(&listed(r#"["http://a/v1", "ftp://b"]"#)).contains("`ftp://b` must start with http"));
        assert!(err(&listed(r#"["http://a/v1", "http://a/v1/"]"#)).contains("lists `http://a/v1` twice"));
        assert!(err("[[user]]\nname = \"me\"\naddress = \"me@x\"\n").contains("exactly one of"));
        assert!(err("[[user]]\nname = \"me\"\naddress = \"me@x\"\npassword_hash = \"md5\"\n").contains("argon2"));
        let twice = "[[user]]\nname = \"a\"\naddress = \"me@x\"\npassword = \"p\"\n[[model]]\naddress = \"ME@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        assert!(err(twice).contains("used twice"));
        assert!(err("[smtp]\nlisten = \"nowhere\"\n").contains("nm.toml:2:"));
        assert!(err("[tls]\nself_signed = true\ncert = \"c.pem\"\n").contains("[tls]"));
    }

    /// Servers of one model, tried in turn: one URL or a list, in the order given.
    #[test]
    fn a_model_may_list_several_servers() {
        let model = |urls: &str| format!("[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = {urls}\n");
        let urls = |text: &str| match &parse(&model(text), None).unwrap().models[0].backend {
            BackendConfig::OpenAi { urls, .. } => urls.clone(),
            BackendConfig::Local(_) => panic!("an openai model"),
        };
        assert_eq!(urls(r#""http://a/v1/""#), ["http://a/v1"]);
        assert_eq!(urls(r#"["http://b:8080/v1", "https://a/v1"]"#), ["http://b:8080/v1", "https://a/v1"]);
    }

    #[test]
    fn cost_keys_are_checked() {
        let model = "[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\n";
        let c =
            parse(&format!("{model}watts = 45.5\nprice_in_per_mtok = 3\nprice_out_per_mtok = 15.0\n"), None).unwrap();
        let price = ApiPrice { input_per_mtok: 3.0, output_per_mtok: 15.0 };
        assert_eq!(c.models[0].cost, Cost { watts: Some(45.5), api_price: Some(price) });
        assert_eq!(parse(model, None).unwrap().models[0].cost, Cost::default());
        let e = err(&format!("{model}watts = -1\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("model.watts must be a number of at least 0"), "{e}");
        let e = err(&format!("{model}price_out_per_mtok = 15\n"));
        assert!(e.contains("give both price_in_per_mtok and price_out_per_mtok"), "{e}");
    }

    #[test]
    fn progress_and_context_keys_are_checked() {
        let model = "[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\n";
        let m = &parse(model, None).unwrap().models[0];
        assert_eq!((m.progress_every, m.progress_mail_every, m.context_tokens), (Duration::from_secs(600), None, None));
        let c = parse(
            &format!("{model}progress_every_secs = 2\nprogress_mail_every_hours = 0.5\ncontext_tokens = 4096\n"),
            None,
        )
        .unwrap();
        let m = &c.models[0];
        assert_eq!(m.progress_every, Duration::from_secs(2));
        assert_eq!(m.progress_mail_every, Some(Duration::from_secs(1800)));
        assert_eq!(m.context_tokens, Some(4096));
        let e = err(&format!("{model}progress_mail_every_hours = 0\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("progress_mail_every_hours must be a number above 0"), "{e}");
        let e = err(&format!("{model}context_tokens = 3\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("context_tokens must be at least 16"), "{e}");
    }

    #[test]
    fn an_implicit_tls_listener_needs_a_certificate() {
        let c = parse("[smtp]\nlisten_tls = \"127.0.0.1:4650\"\n[imap]\nlisten_tls = \"127.0.0.1:9930\"\n[tls]\nself_signed = true\n", None).unwrap();
        assert_eq!(c.smtp.listen_tls, Some("127.0.0.1:4650".parse().unwrap()));
        assert_eq!(c.imap.listen_tls, Some("127.0.0.1:9930".parse().unwrap()));
        assert_eq!(parse("", None).unwrap().smtp.listen_tls, None);
        let e = err("[imap]\nlisten_tls = \"127.0.0.1:9930\"\n");
        assert!(e.starts_with("nm.toml:2:") && e.contains("imap.listen_tls needs a [tls] section"), "{e}");
    }

    #[test]
    fn relay_keys_are_checked() {
        let ok =
            parse("[relay]\nhost = \"smtp.example.com\"\nuser = \"me\"\npassword_env = \"NM_PW\"\n", None).unwrap();
        let relay = ok.relay.unwrap();
        assert_eq!((relay.port, relay.tls, relay.max_recipients_per_reply), (587, RelayTls::StartTls, 20));
        assert_eq!(relay.give_up_after, Duration::from_secs(72 * 3600));
        assert!(!format!("{relay:?}").contains("secret"));
        assert_eq!(parse("[relay]\nhost = \"h\"\ntls = \"implicit\"\n", None).unwrap().relay.unwrap().port, 465);
        assert_eq!(
            parse("[relay]\nhost = \"127.0.0.1\"\ntls = \"none\"\nport = 2500\n", None).unwrap().relay.unwrap().port,
            2500
        );
        assert!(parse("[relay]\nhost = \"localhost\"\ntls = \"none\"\n", None).is_ok());

        let e = err("[relay]\nhost = \"smtp.example.com\"\ntls = \"none\"\n");
        assert!(e.starts_with("nm.toml:3:") && e.contains("relay.tls") && e.contains("loopback"), "{e}");
        let e = err("[relay]\nhost = \"h\"\ntls = \"ssl\"\n");
        assert!(e.contains("relay.tls `ssl`"), "{e}");
        let e = err("[relay]\nhost = \"h\"\nuser = \"me\"\n");
        assert!(e.starts_with("nm.toml:3:") && e.contains("password_env"), "{e}");
        let e = err("[relay]\nhost = \"h\"\npassword_env = \"X\"\n");
        assert!(e.contains("relay.user"), "{e}");
        let e = err("[relay]\nhost = \"h\"\nuser = \"me\"\npassword_env = \"X\"\npassword_file = \"f\"\n");
        assert!(e.contains("not both"), "{e}");
        let e = err("[relay]\nhost = \"h\"\npasword = \"x\"\n");
        assert!(e.contains("pasword"), "{e}");
        let insecure = parse("[relay]\nhost = \"h\"\ntls_insecure = true\n", None).unwrap();
        assert!(insecure.warnings.iter().any(|w| w.contains("tls_insecure")));
    }

    #[test]
    fn a_memory_budget_is_read_and_its_mistakes_are_named() {
        let local = "[[model]]\naddress = \"k@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        let c = parse(&format!("{local}memory_mb = 512\n"), None).unwrap();
        let BackendConfig::Local(b) = &c.models[0].backend else { panic!("a local model") };
        assert_eq!((b.memory_mb, b.expert_cache_mb), (Some(512), None));
        let e = err(&format!("{local}memory_mb = 0\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("at least 1"), "{e}");
        let e = err(&format!("{local}expert_cache_mb = 64\nmemory_mb = 512\n"));
        assert!(e.starts_with("nm.toml:6:") && e.contains("keep memory_mb"), "{e}");
    }

    #[test]
    fn a_drafter_is_read_lookup_by_default_and_an_unknown_one_is_named() {
        let local = "[[model]]\naddress = \"k@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        let draft = |text: &str| match &parse(text, None).unwrap().models[0].backend {
            BackendConfig::Local(b) => b.draft.clone(),
            BackendConfig::OpenAi { .. } => panic!("a local model"),
        };
        assert_eq!(draft(local), Draft::Lookup);
        assert_eq!(draft(&format!("{local}draft = \"none\"\n")), Draft::None);
        assert_eq!(draft(&format!("{local}draft = \"lookup\"\n")), Draft::Lookup);
        assert_eq!(draft(&format!("{local}draft = \"mtp\"\n")), Draft::Mtp);
        let e = err(&format!("{local}draft = \"medusa\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("use \"lookup\", \"model\", \"mtp\" or \"none\""), "{e}");
        let e = err(&format!("{local}draft = \"mtp\"\ndraft_model = \"small.gguf\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("both set"), "{e}");
        // A draft model drafts whether or not draft = "model" says so; it needs its path, and
        // another drafter beside it is refused, at the line that names it.
        let small = Draft::Model(PathBuf::from("small.gguf"));
        assert_eq!(draft(&format!("{local}draft_model = \"small.gguf\"\n")), small);
        assert_eq!(draft(&format!("{local}draft = \"model\"\ndraft_model = \"small.gguf\"\n")), small);
        let e = err(&format!("{local}draft = \"model\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("needs draft_model = PATH"), "{e}");
        let e = err(&format!("{local}draft = \"none\"\ndraft_model = \"small.gguf\"\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("both set"), "{e}");
    }

    #[test]
    fn the_state_cache_budget_is_read_with_a_default_and_0_turns_it_off() {
        let local = "[[model]]\naddress = \"k@x\"\nbackend = \"local\"\npath = \"m.gguf\"\n";
        let mb = |text: &str| match &parse(text, None).unwrap().models[0].backend {
            BackendConfig::Local(b) => b.state_cache_mb,
            BackendConfig::OpenAi { .. } => panic!("a local model"),
        };
        assert_eq!(mb(local), 2048);
        assert_eq!(mb(&format!("{local}state_cache_mb = 64\n")), 64);
        assert_eq!(mb(&format!("{local}state_cache_mb = 0\n")), 0);
        let e = err(&format!("{local}state_cache_mb = -1\n"));
        assert!(e.starts_with("nm.toml:5:") && e.contains("expected u64"), "{e}");
    }

    #[test]
    fn users_are_found_by_name_or_address() {
        let c = parse("[[user]]\nname = \"me\"\naddress = \"Me@X.org\"\npassword = \"p\"\n", None).unwrap();
        assert_eq!(c.user("ME").unwrap().name, "me");
        assert_eq!(c.user("me@x.org").unwrap().name, "me");
        assert!(c.user("you").is_none());
        assert_eq!(c.warnings.len(), 1, "plain-text password warns");
    }
}
