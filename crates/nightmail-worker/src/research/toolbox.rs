//! Runs one call the model wrote: its arguments read, the tool run within the job's limits, and
//! the result written as numbered sources the answer can cite. A call that cannot be run is
//! answered with why, in words the model can act on; nothing here sends mail or writes anywhere.

use std::time::Instant;

use nightmail_config::{ResearchConfig, SearchService, Tool};
use nightmail_research::{FetchPolicy, Page, SearchHit};
use serde_json::{Value, json};

use super::journal::CallOutcome;
use super::sources::{Source, Sources};
use crate::backend::{CallRequest, ToolSpec};

/// Search results given to the model per call.
const SEARCH_RESULTS: usize = 8;

/// The schema the model sees for `tool`.
pub fn spec(tool: Tool) -> ToolSpec {
    let one = |key: &str, what: &str| json!({"type": "object", "properties": {key: {"type": "string", "description": what}}, "required": [key]});
    match tool {
        Tool::WebSearch => ToolSpec {
            name: "web_search",
            description: "Search the web. Returns numbered results: title, URL and a snippet.",
            parameters: one("query", "What to search for"),
        },
        Tool::Fetch => ToolSpec {
            name: "fetch",
            description: "Read a web page or PDF (http or https). Returns its readable text.",
            parameters: one("url", "The page's URL"),
        },
        Tool::SearchMail => ToolSpec {
            name: "search_mail",
            description: "Search the asking user's own mail. Returns numbered messages: date, sender, subject, an excerpt.",
            parameters: one("query", "Words to search for"),
        },
    }
}

/// The tools of one job: what the model may call, and where they reach.
pub struct Toolbox {
    pub tools: Vec<Tool>,
    config: ResearchConfig,
    pub(super) mail: Option<super::MailSearch>,
}

/// What a call would do, for the `In Progress` step and the journal.
pub enum Action {
    Search(String),
    Fetch(String),
    SearchMail(String),
}

impl Action {
    /// `searching: ...`, `reading: host/path`.
    pub fn step(&self) -> String {
        match self {
            Action::Search(q) => format!("searching: {}", clip(q, 80)),
            Action::SearchMail(q) => format!("searching mail: {}", clip(q, 80)),
            Action::Fetch(url) => {
                let shown = url::Url::parse(url)
                    .map(|u| format!("{}{}", u.host_str().unwrap_or(""), u.path()))
                    .unwrap_or_else(|_| url.clone());
                format!("reading: {}", clip(&shown, 100))
            }
        }
    }
}

fn clip(text: &str, chars: usize) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= chars { one } else { format!("{}...", one.chars().take(chars).collect::<String>()) }
}

impl Toolbox {
    pub fn new(tools: Vec<Tool>, config: ResearchConfig, mail: Option<super::MailSearch>) -> Toolbox {
        Toolbox { tools, config, mail }
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| spec(*t)).collect()
    }

    pub fn config(&self) -> &ResearchConfig {
        &self.config
    }

    /// What `call` asks for, or why it cannot be run (told to the model as its result).
    pub fn read(&self, call: &CallRequest) -> Result<Action, String> {
        if let Some(why) = &call.malformed {
            return Err(format!("error: {why}"));
        }
        let Some(tool) = Tool::from_name(call.name.trim()) else {
            return Err(format!("error: there is no tool `{}`; the tools are {}", call.name, self.names()));
        };
        if !self.tools.contains(&tool) {
            return Err(format!("error: the tool `{}` is not enabled here; the tools are {}", call.name, self.names()));
        }
        let arguments: Value = serde_json::from_str(&call.arguments).map_err(|e| {
            format!("error: the arguments of {} are not JSON ({e}); write them as a JSON object", call.name)
        })?;
        let key = if tool == Tool::Fetch { "url" } else { "query" };
        let Some(value) = arguments.get(key).and_then(Value::as_str).map(str::trim).filter(|v| !v.is_empty()) else {
            return Err(format!("error: {} needs a \"{key}\" string argument, e.g. {{\"{key}\": \"...\"}}", call.name));
        };
        Ok(match tool {
            Tool::WebSearch => Action::Search(value.to_string()),
            Tool::Fetch => Action::Fetch(value.to_string()),
            Tool::SearchMail => Action::SearchMail(value.to_string()),
        })
    }

    fn names(&self) -> String {
        self.tools.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    }

    fn policy(&self, bytes_left: u64) -> FetchPolicy {
        FetchPolicy {
            allow_private: self.config.allow_private.clone(),
            allow_hosts: self.config.allow_hosts.clone(),
            deny_hosts: self.config.deny_hosts.clone(),
            max_bytes: self.config.page_bytes.min(bytes_left.max(1)),
            timeout: self.config.call_timeout,
            respect_robots: self.config.respect_robots,
            ..FetchPolicy::default()
        }
    }

    /// Runs `action`, numbering what it found in `sources`.
    pub async fn run(&self, action: &Action, sources: &mut Sources, bytes_left: u64) -> CallOutcome {
        let started = Instant::now();
        let policy = self.policy(bytes_left);
        let mut outcome = match action {
            Action::Search(query) => match self.config.search.as_ref() {
                None => CallOutcome::failed("error: no search service is configured".into()),
                Some(service) => {
                    let service = match service {
                        SearchService::Searxng { url } => {
                            nightmail_research::SearchService::Searxng { base_url: url.clone() }
                        }
                        SearchService::Command { argv } => {
                            nightmail_research::SearchService::Command { argv: argv.clone() }
                        }
                    };
                    match nightmail_research::web_search(&service, query, SEARCH_RESULTS, &policy).await {
                        Ok(hits) => self.hits(query, &hits, sources),
                        Err(e) => CallOutcome::failed(format!("error: the search failed: {e}")),
                    }
                }
            },
            Action::Fetch(url) => match nightmail_research::fetch(url, &policy).await {
                Ok(page) => self.page(&page, sources),
                Err(e) => CallOutcome::failed(format!("error: {url} could not be read: {e}")),
            },
            Action::SearchMail(query) => match &self.mail {
                Some(mail) => {
                    let found = mail.search(query, sources).await;
                    CallOutcome { text: self.cut(found.text), ..found }
                }
                None => CallOutcome::failed("error: search_mail is not available for this question".into()),
            },
        };
        outcome.millis = started.elapsed().as_millis() as u64;
        outcome
    }

    fn hits(&self, query: &str, hits: &[SearchHit], sources: &mut Sources) -> CallOutcome {
        if hits.is_empty() {
            return CallOutcome::ran(format!("No results for \"{query}\"."));
        }
        let mut text = String::new();
        let mut cited = Vec::new();
        for hit in hits {
            let source = Source::Web { url: hit.url.clone(), title: hit.title.clone() };
            let n = sources.number(&source);
            cited.push(source);
            text.push_str(&format!("[{n}] {} ({})\n{}\n\n", hit.title.trim(), hit.url, hit.snippet.trim()));
        }
        CallOutcome { sources: cited, ..CallOutcome::ran(self.cut(text)) }
    }

    fn page(&self, page: &Page, sources: &mut Sources) -> CallOutcome {
        let title = page.title.clone().unwrap_or_default();
        let source = Source::Web { url: page.url.clone(), title: title.clone() };
        let n = sources.number(&source);
        let text = format!("[{n}] {} ({})\n\n{}", title.trim(), page.url, page.text.trim());
        CallOutcome { sources: vec![source], bytes: page.bytes, ..CallOutcome::ran(self.cut(text)) }
    }

    /// A result cut to `result_chars`, saying so.
    pub(super) fn cut(&self, text: String) -> String {
        let limit = self.config.result_chars;
        if text.chars().count() <= limit {
            return text;
        }
        let mut cut: String = text.chars().take(limit).collect();
        cut.push_str("\n[... cut: the rest is longer than this tool's result limit]");
        cut
    }
}

#[cfg(test)]
mod tests {
    use nightmail_engine::{ToolCallGrammar, ToolSyntax};

    /// The local backend asks the engine to constrain calls to these tools: each syntax takes
    /// them as a grammar (the XML-ish ones as free decoding).
    #[test]
    fn the_research_tools_make_a_call_grammar_in_every_syntax() {
        use nightmail_config::Tool;
        let tools: Vec<_> = [Tool::WebSearch, Tool::Fetch, Tool::SearchMail].map(|t| super::spec(t).to_json()).into();
        let text = serde_json::Value::from(tools).to_string();
        for syntax in ToolSyntax::ALL {
            let grammar = ToolCallGrammar::from_openai_tools(syntax, &text).unwrap();
            assert_eq!(grammar.tools.len(), 3, "{syntax:?}");
        }
    }

    /// A mail search longer than the result limit is cut like a web result, and says so.
    #[tokio::test]
    async fn a_long_mail_search_result_is_cut_and_says_so() {
        use nightmail_store::{Incoming, Recipient, Store, Summary};
        use nightmail_types::Address;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let ann = Address::parse("ann@nightmail.local").unwrap();
        let index = nightmail_mailindex::MailIndex::open(&dir.path().join("mail_index"))
            .unwrap()
            .with_users([(ann.clone(), "ann".to_string())]);
        for day in 0..6 {
            let id = format!("<lighthouse{day}@test>");
            let raw = format!(
                "From: Keeper <keeper@example.org>\r\nTo: {ann}\r\nSubject: lighthouse log {day}\r\nMessage-ID: {id}\r\n\r\nThe lighthouse lamp was lit at dusk on day {day}; the sea was calm.\r\n"
            );
            let incoming = Incoming {
                key: store.new_message_key().unwrap(),
                raw: raw.into_bytes(),
                sender: Some(Address::parse("keeper@example.org").unwrap()),
                recipients: vec![Recipient::User { user: "ann".into(), address: ann.clone() }],
                summary: Summary {
                    from: "keeper@example.org".into(),
                    subject: format!("lighthouse log {day}"),
                    message_id: id.clone(),
                },
                dedupe_id: id,
            };
            store.deliver(&incoming).await.unwrap();
        }
        let config = nightmail_config::ResearchConfig { result_chars: 120, ..Default::default() };
        let mail = super::super::MailSearch::new(index, store, ann);
        let toolbox = super::Toolbox::new(vec![nightmail_config::Tool::SearchMail], config, Some(mail));
        let mut sources = super::Sources::default();
        let outcome = toolbox.run(&super::Action::SearchMail("lighthouse".into()), &mut sources, u64::MAX).await;
        assert!(outcome.ran && !outcome.sources.is_empty(), "{outcome:?}");
        let (kept, note) = outcome.text.split_once("\n[... cut:").expect("the cut is said");
        assert_eq!(kept.chars().count(), 120, "{}", outcome.text);
        assert!(note.contains("result limit"), "{}", outcome.text);
    }
}
