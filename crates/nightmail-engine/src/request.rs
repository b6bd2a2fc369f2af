//! What a generation is asked (`GenerateRequest`) and what it gives back: one `TokenEvent` per
//! token, then a `Completion`.

use std::time::Duration;

use serde::Serialize;

use crate::constraint::ToolCallGrammar;
use crate::draft::{Drafting, PromptLookup};
use crate::reasoning::SplitReply;
use crate::sampling::Sampling;
use nightmail_formats::chat::ChatMessage;

/// What to continue.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Plain text, tokenized with the tokenizer's own special tokens (e.g. BOS).
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
    /// A conversation, rendered by the model's chat template with the assistant turn opened.
    Chat(Conversation),
}

/// A conversation and the template switches it is rendered with.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// The functions the model may call: the JSON text of their array (`[{"type": "function",
    /// "function": {..}}]`), which the template renders its way.
    pub tools: Option<String>,
    /// Whether the model should think before answering, for templates with such a switch
    /// ([`nightmail_formats::chat::thinking_switches`]); none keeps the template's default.
    pub thinking: Option<bool>,
}

impl From<Vec<ChatMessage>> for Conversation {
    fn from(messages: Vec<ChatMessage>) -> Self {
        Conversation { messages, ..Conversation::default() }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop when the text contains one of these; the text ends before it.
    pub stop: Vec<String>,
    /// Stop at the model's end-of-sequence tokens (on by default).
    pub stop_at_eos: bool,
    /// Attach each step's full logits row to its event.
    pub record_logits: bool,
    /// Guess tokens ahead and verify them in one pass ([`crate::draft`]). The tokens are those
    /// the model gives without drafting (greedy or sampled, for the same seed); only the number
    /// of passes changes.
    pub draft: Drafting,
    /// Prompt lookup's n-gram sizes, for `Drafting::Lookup`, and the most guesses per pass and how
    /// many to make, for any drafter.
    pub lookup: PromptLookup,
    /// Constrain the tool calls the model writes to these tools ([`crate::constraint`]): after
    /// the syntax's call opener, only tokens that keep the call well-formed are drawn. Drafting
    /// is off for such a request (a verify pass would judge guesses by unmasked logits).
    pub tool_calls: Option<ToolCallGrammar>,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            max_new_tokens: 256,
            sampling: Sampling::greedy(),
            stop: Vec::new(),
            stop_at_eos: true,
            record_logits: false,
            draft: Drafting::None,
            lookup: PromptLookup::default(),
            tool_calls: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    StopString,
    MaxTokens,
    ContextFull,
    Cancelled,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct GenerationProgress {
    pub prompt_tokens: usize,
    pub generated: usize,
    pub max_new_tokens: usize,
    pub elapsed: Duration,
}

/// One generated token.
#[derive(Debug, Clone)]
pub struct TokenEvent {
    pub id: u32,
    /// 0 for the first generated token.
    pub index: usize,
    /// New text this token completes (may be empty while a character or a possible stop string
    /// is incomplete).
    pub text: String,
    /// The logits row this token was chosen from, when the request asked for them.
    pub logits: Option<Vec<f32>>,
    pub progress: GenerationProgress,
}

#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub reply: SplitReply,
    pub stop: StopReason,
    pub prefill: Duration,
    pub decode: Duration,
    /// Model passes after the prompt (one per token without drafting, fewer with it).
    pub verify_steps: usize,
    /// Drafted tokens run through verify passes, and those the model agreed with.
    pub drafted: usize,
    pub accepted: usize,
}
