//! Token-by-token generation: a [`TokenStream`] that yields one [`TokenEvent`] per token and can
//! be dropped or cancelled between any two, and [`Model::generate`] that drives it with a callback.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Model;
use crate::chat::ChatMessage;
use crate::error::{EngineError, Result};
use crate::model::KvCache;
use crate::reasoning::{Reply, split_reasoning};
use crate::sampling::{Sampler, Sampling};

/// What to continue.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Plain text, tokenized with the tokenizer's own special tokens (e.g. BOS).
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
    /// A conversation, rendered by the model's chat template with the assistant turn opened.
    Chat(Vec<ChatMessage>),
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
pub struct Progress {
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
    pub progress: Progress,
}

#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub reply: Reply,
    pub stop: StopReason,
    pub prefill: Duration,
    pub decode: Duration,
}

pub struct TokenStream<'m> {
    model: &'m Model,
    cache: KvCache,
    sampler: Sampler,
    request: GenerateRequest,
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    emitted: usize,
    next_logits: Option<Vec<f32>>,
    stop: Option<StopReason>,
    started: Instant,
    prefill: Duration,
}

impl Model {
    /// Tokenize and prefill the prompt; then pull tokens from the stream.
    pub fn stream(&self, request: GenerateRequest) -> Result<TokenStream<'_>> {
        let started = Instant::now();
        let prompt_tokens = self.prompt_tokens(&request.prompt)?;
        if prompt_tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let context = self.spec().context_length;
        if prompt_tokens.len() >= context {
            return Err(EngineError::PromptTooLong { len: prompt_tokens.len(), max: context });
        }
        let sampler = Sampler::new(request.sampling)?;
        let mut cache = self.new_cache();
        // Nothing to generate (e.g. only tokenizing): skip the prefill.
        let stop = (request.max_new_tokens == 0).then_some(StopReason::MaxTokens);
        let logits = if stop.is_none() { Some(self.logits(&prompt_tokens, &mut cache)?) } else { None };
        Ok(TokenStream {
            model: self,
            cache,
            sampler,
            request,
            prompt_tokens,
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            next_logits: logits,
            stop,
            prefill: started.elapsed(),
            started,
        })
    }

    /// Generate to the end, calling `on_token` after each token; return `Break` from it to stop
    /// (the completion then says `Cancelled`). Blocking: call it from `spawn_blocking`.
    pub fn generate(
        &self,
        request: GenerateRequest,
        mut on_token: impl FnMut(&TokenEvent) -> ControlFlow<()>,
    ) -> Result<Completion> {
        let mut stream = self.stream(request)?;
        while let Some(event) = stream.next_token()? {
            if on_token(&event).is_break() {
                stream.cancel();
                break;
            }
        }
        Ok(stream.into_completion())
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Tokens(t) => Ok(t.clone()),
            Prompt::Text(text) => self.tokenizer().ok_or(EngineError::NoTokenizer)?.encode(text, true),
            Prompt::Chat(messages) => {
                let tok = self.tokenizer().ok_or(EngineError::NoTokenizer)?;
                let template = self.chat_template().ok_or(EngineError::NoChatTemplate)?;
                let text =
                    template.render(messages, true, tok.bos_text().unwrap_or(""), tok.eos_text().unwrap_or(""))?;
                tok.encode(&text, false)
            }
        }
    }
}

impl TokenStream<'_> {
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.prompt_tokens
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Stop before the next token.
    pub fn cancel(&mut self) {
        self.stop.get_or_insert(StopReason::Cancelled);
    }

    /// The next token, or None once stopped.
    pub fn next_token(&mut self) -> Result<Option<TokenEvent>> {
        if self.stop.is_some() {
            return Ok(None);
        }
        let Some(logits) = self.next_logits.take() else { return Ok(None) };
        let id = self.sampler.sample(&logits);
        let index = self.tokens.len();
        self.tokens.push(id);
        let model = self.model;
        let is_eos = self.request.stop_at_eos && model.spec().eos_tokens.contains(&id);
        if let Some(tok) = model.tokenizer() {
            let body = if is_eos { &self.tokens[..index] } else { &self.tokens[..] };
            self.text = tok.decode(body)?;
        }
        if let Some(cut) = self.request.stop.iter().filter_map(|s| self.text.find(s.as_str())).min() {
            self.text.truncate(cut);
            self.stop = Some(StopReason::StopString);
        } else if is_eos {
            self.stop = Some(StopReason::Eos);
        } else if self.tokens.len() >= self.request.max_new_tokens {
            self.stop = Some(StopReason::MaxTokens);
        } else if self.cache.position() + 1 >= model.spec().context_length {
            self.stop = Some(StopReason::ContextFull);
        }
        let text = self.take_text();
        if self.stop.is_none() {
            self.next_logits = Some(model.logits(&[id], &mut self.cache)?);
        }
        Ok(Some(TokenEvent {
            id,
            index,
            text,
            logits: self.request.record_logits.then_some(logits),
            progress: Progress {
                prompt_tokens: self.prompt_tokens.len(),
                generated: self.tokens.len(),
                max_new_tokens: self.request.max_new_tokens,
                elapsed: self.started.elapsed(),
            },
        }))
    }

    /// Text not yet handed out, holding back an unfinished UTF-8 character (decoded as U+FFFD)
    /// and any tail that could begin a stop string, until the stream stops.
    fn take_text(&mut self) -> String {
        let mut end = self.text.len();
        if self.stop.is_none() {
            if self.text.ends_with('\u{FFFD}') {
                end -= '\u{FFFD}'.len_utf8();
            }
            for s in &self.request.stop {
                for k in (1..s.len()).rev() {
                    if s.is_char_boundary(k) && self.text[..end].ends_with(&s[..k]) {
                        end = end.min(self.text.len() - k);
                        break;
                    }
                }
            }
        }
        if end <= self.emitted || !self.text.is_char_boundary(end) || !self.text.is_char_boundary(self.emitted) {
            return String::new();
        }
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }

    pub fn into_completion(self) -> Completion {
        let decode = self.started.elapsed().saturating_sub(self.prefill);
        Completion {
            reply: split_reasoning(&self.text),
            prompt_tokens: self.prompt_tokens,
            tokens: self.tokens,
            text: self.text,
            stop: self.stop.unwrap_or(StopReason::Cancelled),
            prefill: self.prefill,
            decode,
        }
    }
}

impl Iterator for TokenStream<'_> {
    type Item = Result<TokenEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_token().transpose()
    }
}
