//! `[[model]]`: an address a model answers at, its backend and how it runs.

use std::path::PathBuf;
use std::time::Duration;

use nightmail_types::Address;
use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator, address};
use crate::research::{self, Tool};

/// Where a model's answers come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendConfig {
    /// An OpenAI-compatible chat completions server (llama.cpp's server, vLLM, a cloud API).
    OpenAi {
        /// Base URLs, e.g. `http://127.0.0.1:8080/v1` (`/chat/completions` is appended): servers
        /// of the same model, tried in turn when one is down or fails mid-answer.
        urls: Vec<String>,
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
pub struct ModelEntry {
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
    /// The research tools this model may call (`tools`; none by default).
    pub tools: Vec<Tool>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub(crate) address: Spanned<String>,
    backend: Spanned<String>,
    name: Option<String>,
    system_prompt: Option<String>,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
    #[serde(default)]
    reasoning: bool,
    reasoning_output: Option<Spanned<String>>,
    #[serde(default = "default_temperature")]
    temperature: f32,
    #[serde(default)]
    ack: bool,
    watts: Option<Spanned<f64>>,
    price_in_per_mtok: Option<Spanned<f64>>,
    price_out_per_mtok: Option<Spanned<f64>>,
    #[serde(default = "default_progress_every_secs")]
    progress_every_secs: u64,
    progress_mail_every_hours: Option<Spanned<f64>>,
    context_tokens: Option<Spanned<usize>>,
    #[serde(default)]
    tools: Vec<Spanned<String>>,
    // backend = "openai"
    url: Option<Spanned<Urls>>,
    model: Option<String>,
    api_key_env: Option<String>,
    #[serde(default = "default_timeout_secs")]
    timeout_secs: u64,
    #[serde(default = "default_retries")]
    retries: u32,
    // backend = "local"
    path: Option<PathBuf>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<u64>,
    /// Stream routed experts from disk through a cache of this many MiB.
    expert_cache_mb: Option<usize>,
    /// One memory budget for the whole model (dense layers stream too).
    memory_mb: Option<Spanned<usize>>,
    #[serde(default = "default_checkpoint_every_tokens")]
    checkpoint_every_tokens: u32,
    #[serde(default = "default_checkpoint_every_secs")]
    checkpoint_every_secs: u64,
    #[serde(default = "default_max_batch")]
    max_batch: Spanned<usize>,
    /// "lookup" (the default), "none", or "model" (with `draft_model`).
    draft: Option<Spanned<String>>,
    /// A small model of the same tokenizer that drafts (implies draft = "model").
    draft_model: Option<Spanned<PathBuf>>,
    /// MiB of disk for finished answers' states, reused by follow-ups (0: none kept).
    #[serde(default = "default_state_cache_mb")]
    state_cache_mb: u64,
}

/// Room for about twenty 2,000-token threads of SmolLM2 (46 KiB of keys and values a token),
/// or seven of Kimi K2's latent cache (140 KiB a token).
fn default_state_cache_mb() -> u64 {
    2048
}

/// `draft` and `draft_model` together: a draft model drafts (`draft` unset or "model"), else
/// `draft` names the drafter (lookup by default).
fn drafter(
    draft: &Option<Spanned<String>>,
    model: &Option<Spanned<PathBuf>>,
    loc: &Locator<'_>,
) -> Result<Draft, ConfigError> {
    let name = draft.as_ref().map(|d| (d.get_ref().as_str(), d));
    Ok(match (name, model) {
        (None | Some(("lookup", _)), None) => Draft::Lookup,
        (Some(("none", _)), None) => Draft::None,
        (Some(("mtp", _)), None) => Draft::Mtp,
        (None | Some(("model", _)), Some(path)) => Draft::Model(path.get_ref().clone()),
        (Some(("model", span)), None) => {
            return Err(loc.spanned(
                span,
                "model.draft \"model\" needs draft_model = PATH (the small model that guesses)".into(),
            ));
        }
        (Some((other @ ("lookup" | "none" | "mtp"), span)), Some(_)) => {
            return Err(loc.spanned(
                span,
                format!("model.draft `{other}` and model.draft_model are both set: drop draft to draft with the model, or draft_model"),
            ));
        }
        (Some((other, span)), _) => {
            return Err(
                loc.spanned(span, format!("model.draft `{other}`: use \"lookup\", \"model\", \"mtp\" or \"none\""))
            );
        }
    })
}

fn default_checkpoint_every_tokens() -> u32 {
    64
}

fn default_checkpoint_every_secs() -> u64 {
    300
}

fn default_max_batch() -> Spanned<usize> {
    Spanned::new(0..0, 4)
}

fn default_progress_every_secs() -> u64 {
    600
}

fn default_max_tokens() -> u32 {
    1024
}

fn default_temperature() -> f32 {
    0.7
}

fn default_timeout_secs() -> u64 {
    600
}

/// `url = "http://..."`, or a list of servers of the same model.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Urls {
    One(String),
    Several(Vec<String>),
}

fn default_retries() -> u32 {
    2
}

pub(crate) fn check(spanned: &Spanned<RawModel>, loc: &Locator<'_>) -> Result<ModelEntry, ConfigError> {
    let m = spanned.get_ref();
    let address = address(&m.address, loc, "model.address")?;
    let backend = match m.backend.get_ref().as_str() {
        "openai" => {
            let Some(url) = &m.url else {
                return Err(loc.spanned(
                    spanned,
                    format!("model {address}: backend \"openai\" needs `url` (e.g. \"http://127.0.0.1:8080/v1\")"),
                ));
            };
            let listed = match url.get_ref() {
                Urls::One(one) => std::slice::from_ref(one),
                Urls::Several(several) => several.as_slice(),
            };
            if listed.is_empty() {
                return Err(loc.spanned(url, format!("model {address}: `url` lists no server")));
            }
            let mut urls = Vec::with_capacity(listed.len());
            for text in listed {
                let text = text.trim_end_matches('/').to_string();
                if !(text.starts_with("http://") || text.starts_with("https://")) {
                    return Err(loc.spanned(url, format!("model.url `{text}` must start with http:// or https://")));
                }
                if urls.contains(&text) {
                    return Err(loc.spanned(url, format!("model.url lists `{text}` twice")));
                }
                urls.push(text);
            }
            BackendConfig::OpenAi {
                urls,
                model: m.model.clone().unwrap_or_else(|| "default".into()),
                api_key_env: m.api_key_env.clone(),
                timeout: Duration::from_secs(m.timeout_secs.max(1)),
                retries: m.retries,
            }
        }
        "local" => {
            let Some(path) = &m.path else {
                return Err(loc.spanned(
                    spanned,
                    format!("model {address}: backend \"local\" needs `path` (a GGUF file or a model directory)"),
                ));
            };
            if *m.max_batch.get_ref() == 0 {
                return Err(loc.spanned(&m.max_batch, "model.max_batch must be at least 1".to_string()));
            }
            if let Some(mb) = &m.memory_mb {
                if *mb.get_ref() == 0 {
                    return Err(loc.spanned(mb, "model.memory_mb must be at least 1 (MiB)".to_string()));
                }
                if m.expert_cache_mb.is_some() {
                    return Err(loc.spanned(
                        mb,
                        "model.memory_mb and model.expert_cache_mb are both set: keep memory_mb, which sizes \
                         the expert cache itself"
                            .to_string(),
                    ));
                }
            }
            BackendConfig::Local(LocalBackend {
                path: path.clone(),
                top_p: m.top_p,
                top_k: m.top_k,
                seed: m.seed,
                expert_cache_mb: m.expert_cache_mb,
                memory_mb: m.memory_mb.as_ref().map(|mb| *mb.get_ref()),
                checkpoint_every_tokens: m.checkpoint_every_tokens.max(1),
                checkpoint_every: Duration::from_secs(m.checkpoint_every_secs.max(1)),
                max_batch: *m.max_batch.get_ref(),
                state_cache_mb: m.state_cache_mb,
                draft: drafter(&m.draft, &m.draft_model, loc)?,
            })
        }
        other => {
            return Err(
                loc.spanned(&m.backend, format!("model.backend `{other}` is not known: use \"openai\" or \"local\""))
            );
        }
    };
    let reasoning_output = match m.reasoning_output.as_ref().map(|r| r.get_ref().as_str()) {
        None | Some("omit") => ReasoningOutput::Omit,
        Some("attach") => ReasoningOutput::Attach,
        Some(other) => {
            let span = m.reasoning_output.as_ref().expect("matched Some");
            return Err(loc.spanned(span, format!("model.reasoning_output `{other}`: use \"omit\" or \"attach\"")));
        }
    };
    if !(0.0..=2.0).contains(&m.temperature) {
        return Err(loc.spanned(spanned, format!("model {address}: temperature must be between 0 and 2")));
    }
    let cost = check_cost(spanned, loc, &address)?;
    let progress_mail_every = match &m.progress_mail_every_hours {
        Some(h) if !(h.get_ref().is_finite() && *h.get_ref() > 0.0) => {
            return Err(loc.spanned(
                h,
                "model.progress_mail_every_hours must be a number above 0 (leave it out for no progress mail)".into(),
            ));
        }
        Some(h) => Some(Duration::from_secs_f64(h.get_ref() * 3600.0)),
        None => None,
    };
    let context_tokens = match &m.context_tokens {
        Some(c) if *c.get_ref() < 16 => {
            return Err(
                loc.spanned(c, "model.context_tokens must be at least 16 (leave it out to use the model's own)".into())
            );
        }
        c => c.as_ref().map(|c| *c.get_ref()),
    };
    Ok(ModelEntry {
        address,
        name: m.name.clone(),
        backend,
        system_prompt: m.system_prompt.clone(),
        max_tokens: m.max_tokens.max(1),
        reasoning: m.reasoning,
        reasoning_output,
        temperature: m.temperature,
        ack: m.ack,
        cost,
        progress_every: Duration::from_secs(m.progress_every_secs.max(1)),
        progress_mail_every,
        context_tokens,
        tools: research::tools(&m.tools, loc)?,
    })
}

/// `watts` and the API price: positive numbers, the price's two halves together.
fn check_cost(spanned: &Spanned<RawModel>, loc: &Locator<'_>, address: &Address) -> Result<Cost, ConfigError> {
    let m = spanned.get_ref();
    let positive = |value: &Option<Spanned<f64>>, key: &str| -> Result<Option<f64>, ConfigError> {
        match value {
            Some(v) if !(v.get_ref().is_finite() && *v.get_ref() >= 0.0) => {
                Err(loc.spanned(v, format!("model.{key} must be a number of at least 0")))
            }
            Some(v) => Ok(Some(*v.get_ref())),
            None => Ok(None),
        }
    };
    let watts = positive(&m.watts, "watts")?;
    let api_price = match (
        positive(&m.price_in_per_mtok, "price_in_per_mtok")?,
        positive(&m.price_out_per_mtok, "price_out_per_mtok")?,
    ) {
        (Some(input_per_mtok), Some(output_per_mtok)) => Some(ApiPrice { input_per_mtok, output_per_mtok }),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(loc.spanned(
                spanned,
                format!("model {address}: give both price_in_per_mtok and price_out_per_mtok (US dollars per million tokens), or neither"),
            ));
        }
    };
    Ok(Cost { watts, api_price })
}
