//! Where answers come from. A [`Backend`] streams a reply to a conversation: answer text and
//! reasoning arrive as separate [`Event`]s so the worker can save progress as it goes, and a stop
//! signal ends generation between tokens.

mod calls;
mod gauge;
pub mod local;
pub mod openai;
mod think;
mod unstreamed;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

pub use think::ThinkSplitter;
use tokio::sync::{mpsc, watch};

use crate::conversation::Turn;

/// What to generate.
#[derive(Clone, Debug)]
pub struct Request {
    pub turns: Vec<Turn>,
    pub max_tokens: u32,
    /// 0 means greedy.
    pub temperature: f32,
    /// Whether the model should think before answering, where it can be told.
    pub reasoning: Option<bool>,
    /// Another model of the same server, if the mail asked for one.
    pub model: Option<String>,
    /// Where a backend that can checkpoint (the local engine) keeps this job's state, and
    /// resumes from.
    pub checkpoint: Option<PathBuf>,
    /// Functions the model may call (none: it answers from what it has).
    pub tools: Vec<ToolSpec>,
}

/// A function the model may call, as OpenAI's `tools` entries and chat templates describe one.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    /// The arguments' JSON Schema.
    pub parameters: serde_json::Value,
}

impl ToolSpec {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "function",
            "function": { "name": self.name, "description": self.description, "parameters": self.parameters },
        })
    }
}

/// A call the model wrote: its id, the function's name and the arguments' JSON text as written.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallRequest {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// Why the call could not be read, when it could not: answered with this, never run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
}

impl CallRequest {
    /// A call as a server sent it: one that names no function is malformed.
    pub fn named(id: String, name: String, arguments: String) -> CallRequest {
        let malformed = name.is_empty().then(|| "the call names no function".to_string());
        CallRequest { id, name, arguments, malformed }
    }
}

/// A piece of the reply as it streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Content(String),
    Reasoning(String),
    /// The generation's state up to `tokens` generated tokens is saved (`bytes` on disk), and
    /// `prompt_tokens` of its prompt (all once a token is saved; fewer between prefill passes).
    Checkpoint {
        tokens: u64,
        prompt_tokens: u64,
        bytes: u64,
    },
    /// How the engine that writes the answer is doing (the local engine, every second or so).
    Engine(nightmail_store::EngineFigures),
    /// The answer so far is dropped: it starts over (on another server of the model).
    Restarted,
    /// The prompt, `tokens` long, is in: the local engine says so with its first token.
    Prompt {
        tokens: u64,
        prompt_in: nightmail_store::PromptIn,
    },
}

/// A finished generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendAnswer {
    pub content: String,
    pub reasoning: String,
    /// `None` when the server did not report usage (llama-cpp-python's stream does not).
    pub prompt_tokens: Option<u64>,
    /// Of the prompt tokens, those the model ran; the rest were restored (a thread's saved
    /// state, or the job's checkpoint). `None` when the backend does not say (a server's).
    pub prefilled_tokens: Option<u64>,
    /// Milliseconds from the start to the end of the prompt's prefill (or of its restore).
    /// `None` when the backend does not say (a server's).
    pub prefill_ms: Option<u32>,
    /// Answer tokens, reasoning not included.
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    /// `stop`, `length`, ...
    pub finish_reason: String,
    /// The model that answered, as the backend names it.
    pub model: String,
    /// The tools the model called, in the order it wrote them: the answer is not done until
    /// their results are given back.
    pub calls: Vec<CallRequest>,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackendError {
    /// Worth trying again later (the server is down, overloaded, timed out).
    #[error("{0}")]
    Transient(String),
    /// Trying again will not help (the request was refused as invalid).
    #[error("{0}")]
    Permanent(String),
    /// The prompt was longer than the model's context, which the server named: fitted to
    /// `context` tokens, the question can be sent again at once. `prompt_tokens`: the server's
    /// count of the refused prompt, when it gave one.
    #[error("{message}")]
    ContextExceeded { context: usize, prompt_tokens: Option<usize>, message: String },
    /// The stop signal was raised.
    #[error("stopped")]
    Stopped,
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A prompt measured against the model's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measure {
    /// The prompt's tokens: counted by the model's own tokenizer when `exact`, else estimated.
    pub prompt_tokens: usize,
    pub exact: bool,
    /// The model's context in tokens, when the backend knows it.
    pub context: Option<usize>,
}

/// Tokens a prompt takes at most, estimated without the model's tokenizer: a token per 3
/// characters (English runs about 4 per token with BPE vocabularies, so this errs long, and a
/// prompt fitted with it fits), and a few for each turn's role markers.
pub fn estimate_tokens(turns: &[Turn]) -> usize {
    turns.iter().map(|t| t.content.chars().count().div_ceil(3) + 4).sum()
}

pub trait Backend: Send + Sync {
    /// How the reply's footer names this backend, e.g. `openai smollm2 at http://127.0.0.1:8080/v1`.
    fn describe(&self) -> String;

    /// Measures `request`'s prompt against the model's context. The default estimates the
    /// tokens and knows no context.
    fn measure<'a>(&'a self, request: &'a Request) -> BoxFuture<'a, Result<Measure, BackendError>> {
        Box::pin(
            async move { Ok(Measure { prompt_tokens: estimate_tokens(&request.turns), exact: false, context: None }) },
        )
    }

    /// Generates a reply, sending each piece to `events` as it comes, until done or until `stop`
    /// turns true. A restarted job calls this again from the start: a backend that can resume
    /// from a checkpoint (the local engine) does so on its own.
    fn generate<'a>(
        &'a self,
        request: &'a Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> BoxFuture<'a, Result<BackendAnswer, BackendError>>;
}
