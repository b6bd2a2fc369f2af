//! `[research]`: where a model's research tools reach and what one job may spend on them. Each
//! `[[model]]` enables its tools by name (`tools = ["web_search", "fetch", "search_mail"]`); none
//! by default.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};

/// A tool a model may call while it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tool {
    /// The configured search service: titles, URLs and snippets.
    WebSearch,
    /// An HTTP(S) page's readable text.
    Fetch,
    /// Full-text search over the asking user's own mailboxes.
    SearchMail,
}

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::WebSearch, Tool::Fetch, Tool::SearchMail];

    /// The name the model calls it by, and the configuration writes.
    pub fn name(self) -> &'static str {
        match self {
            Tool::WebSearch => "web_search",
            Tool::Fetch => "fetch",
            Tool::SearchMail => "search_mail",
        }
    }

    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The service `web_search` asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchService {
    /// SearXNG's JSON API at this base URL (`/search?format=json`).
    Searxng { url: String },
    /// A command given the query as its last argument, printing a JSON array of
    /// `{"title", "url", "snippet"}`.
    Command { argv: Vec<String> },
}

/// `[research]`, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ResearchConfig {
    pub search: Option<SearchService>,
    /// `host:port` pairs on private or loopback addresses that fetch and search may reach.
    pub allow_private: Vec<String>,
    /// Hosts fetch may reach (`example.org`, `*.example.org`); empty: any public host.
    pub allow_hosts: Vec<String>,
    /// Hosts fetch never reaches; wins over `allow_hosts`.
    pub deny_hosts: Vec<String>,
    pub respect_robots: bool,
    /// Tool calls one job may make.
    pub max_calls: u32,
    /// Bytes one job may download in all.
    pub max_bytes: u64,
    /// Bytes of one page, at most (the rest is cut).
    pub page_bytes: u64,
    /// Wall time one job may spend in tool calls, in all.
    pub max_time: Duration,
    /// One fetch or search, at most.
    pub call_timeout: Duration,
    /// Characters of one result the model is given.
    pub result_chars: usize,
}

impl Default for ResearchConfig {
    fn default() -> Self {
        ResearchConfig {
            search: None,
            allow_private: Vec::new(),
            allow_hosts: Vec::new(),
            deny_hosts: Vec::new(),
            respect_robots: true,
            max_calls: 16,
            max_bytes: 32 << 20,
            page_bytes: 2 << 20,
            max_time: Duration::from_secs(3600),
            call_timeout: Duration::from_secs(30),
            result_chars: 8000,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawResearch {
    search: Option<Spanned<String>>,
    search_url: Option<Spanned<String>>,
    search_command: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    allow_private: Vec<Spanned<String>>,
    #[serde(default)]
    allow_hosts: Vec<String>,
    #[serde(default)]
    deny_hosts: Vec<String>,
    respect_robots: Option<bool>,
    max_calls_per_job: Option<u32>,
    max_mb_per_job: Option<u64>,
    page_kb: Option<u64>,
    max_minutes_per_job: Option<u64>,
    call_timeout_secs: Option<u64>,
    result_chars: Option<usize>,
}

pub(crate) fn check(raw: &RawResearch, loc: &Locator<'_>) -> Result<ResearchConfig, ConfigError> {
    let search = match raw.search.as_ref().map(|s| (s.get_ref().as_str(), s)) {
        None => None,
        Some(("searxng", span)) => {
            let Some(url) = &raw.search_url else {
                return Err(loc.spanned(
                    span,
                    "research.search \"searxng\" needs search_url (e.g. \"http://127.0.0.1:8888\")".into(),
                ));
            };
            let text = url.get_ref().trim_end_matches('/').to_string();
            if !(text.starts_with("http://") || text.starts_with("https://")) {
                return Err(
                    loc.spanned(url, format!("research.search_url `{text}` must start with http:// or https://"))
                );
            }
            Some(SearchService::Searxng { url: text })
        }
        Some(("command", span)) => match &raw.search_command {
            Some(argv) if !argv.get_ref().is_empty() => Some(SearchService::Command { argv: argv.get_ref().clone() }),
            _ => {
                return Err(loc.spanned(
                    span,
                    "research.search \"command\" needs search_command = [\"program\", \"arg\", ...] (the query is added last)"
                        .into(),
                ));
            }
        },
        Some((other, span)) => {
            return Err(loc.spanned(span, format!("research.search `{other}`: use \"searxng\" or \"command\"")));
        }
    };
    let mut allow_private = Vec::new();
    for entry in &raw.allow_private {
        let text = entry.get_ref().trim().to_ascii_lowercase();
        let port =
            text.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then(|| port.parse::<u16>().ok())?);
        if port.is_none() {
            return Err(loc.spanned(
                entry,
                format!("research.allow_private `{text}` must be host:port, e.g. \"127.0.0.1:8888\""),
            ));
        }
        allow_private.push(text);
    }
    let d = ResearchConfig::default();
    Ok(ResearchConfig {
        search,
        allow_private,
        allow_hosts: raw.allow_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
        deny_hosts: raw.deny_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
        respect_robots: raw.respect_robots.unwrap_or(d.respect_robots),
        max_calls: raw.max_calls_per_job.unwrap_or(d.max_calls),
        max_bytes: raw.max_mb_per_job.map_or(d.max_bytes, |mb| mb.max(1) << 20),
        page_bytes: raw.page_kb.map_or(d.page_bytes, |kb| kb.max(1) << 10),
        max_time: raw.max_minutes_per_job.map_or(d.max_time, |m| Duration::from_secs(m.max(1) * 60)),
        call_timeout: raw.call_timeout_secs.map_or(d.call_timeout, |s| Duration::from_secs(s.max(1))),
        result_chars: raw.result_chars.unwrap_or(d.result_chars).max(200),
    })
}

/// A model's `tools`, each known and named once.
pub(crate) fn tools(raw: &[Spanned<String>], loc: &Locator<'_>) -> Result<Vec<Tool>, ConfigError> {
    let mut tools = Vec::new();
    for name in raw {
        let Some(tool) = Tool::from_name(name.get_ref()) else {
            let known: Vec<&str> = Tool::ALL.iter().map(|t| t.name()).collect();
            return Err(loc.spanned(
                name,
                format!("model.tools: `{}` is not a tool; use some of {}", name.get_ref(), known.join(", ")),
            ));
        };
        if !tools.contains(&tool) {
            tools.push(tool);
        }
    }
    Ok(tools)
}
