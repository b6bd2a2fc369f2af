//! Token-by-token generation: a [`TokenStream`] that yields one [`TokenEvent`] per token and can
//! be dropped or cancelled between any two, and [`Model::generate`] that drives it with a callback.

use crate::error::EngineError;
use nightmail_formats::FormatError;
use nightmail_formats::chat::RenderOptions;
use nightmail_model::ModelError;
use nightmail_tensor::TensorError;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::constraint::{Constraint, TokenPieces, ToolCallGrammar};
use crate::draft::verify::{Drawn, Feed, Verifier};
use crate::draft::{DrafterState, Drafting};
use crate::error::Result;
use crate::journal::{Delta, Identity, Journal, Saved, WeightsFile};
use crate::model::Model;
use crate::reasoning::split_reasoning;
use crate::request::{Completion, Conversation, GenerateRequest, GenerationProgress, Prompt, StopReason, TokenEvent};
use crate::sampling::Sampler;
use crate::state_cache::{Reuse, StateCache};
use nightmail_model::SequenceState;

pub struct TokenStream<'m> {
    model: &'m Model,
    cache: SequenceState,
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
    /// The checkpoint file, for a resumable stream.
    journal: Option<Journal>,
    /// Events of the tokens restored from a checkpoint, not yet taken.
    replay: Vec<TokenEvent>,
    /// Prompt tokens already in the cache.
    prompt_fed: usize,
    /// The drafts: guesses run and waiting for their verdict, and the rates that size them.
    verify: Verifier,
    /// Prompt positions restored rather than run: from a checkpoint, or a saved thread state.
    restored_prompt: usize,
    /// The tool-call grammar decoding keeps to, where the request gave one.
    constraint: Option<Constraint>,
}

impl Model {
    /// Tokenize and prefill the prompt; then pull tokens from the stream.
    pub fn stream(&self, request: GenerateRequest) -> Result<TokenStream<'_>> {
        self.open(request, None, true)
    }

    /// A stream whose prompt is not run yet: [`Model::step`] runs it a chunk at a time, with
    /// other streams' steps, or [`TokenStream::next_token`] all at once. With `checkpoint`, as
    /// [`Model::stream_resumable`] (a stream resumed from a checkpoint has nothing to prefill).
    pub fn stream_deferred(&self, request: GenerateRequest, checkpoint: Option<&Path>) -> Result<TokenStream<'_>> {
        self.open(request, checkpoint, false)
    }

    /// One step of several streams of this model together: each stream that decodes draws its
    /// next token and runs it; the first stream still prefilling runs its next `prefill_chunk`
    /// prompt tokens. The weights are read once for all of them (see
    /// [`nightmail_model::Transformer::forward_groups`]), and each stream gets what it would get
    /// alone. Returns each stream's new token event (`None` for a prefill step or a stopped
    /// stream).
    pub fn step(&self, streams: &mut [&mut TokenStream<'_>], prefill_chunk: usize) -> Result<Vec<Option<TokenEvent>>> {
        if streams.iter().any(|s| !std::ptr::eq(s.model, self)) {
            return Err(
                TensorError::Compute(candle_core::Error::Msg("a step mixes streams of two models".into())).into()
            );
        }
        let mut events: Vec<Option<TokenEvent>> = vec![None; streams.len()];
        let mut feeds: Vec<Option<Vec<u32>>> = vec![None; streams.len()];
        let mut prefilling = false;
        for (i, s) in streams.iter_mut().enumerate() {
            if s.stop.is_some() {
                continue;
            }
            if s.is_prefilling() {
                if !prefilling {
                    prefilling = true;
                    let end = (s.prompt_fed + prefill_chunk.max(1)).min(s.prompt_tokens.len());
                    feeds[i] = Some(s.prompt_tokens[s.prompt_fed..end].to_vec());
                }
            } else if let Some((event, feed)) = s.pick()? {
                events[i] = Some(event);
                feeds[i] = match feed {
                    Some(id) => s.plan_feed(id)?,
                    None => None,
                };
            }
        }
        // Where each fed stream's positions start, and whether its MTP layer wants their hidden states.
        let (starts, want): (Vec<usize>, Vec<bool>) = streams
            .iter()
            .zip(&feeds)
            .filter(|(_, f)| f.is_some())
            .map(|(s, _)| (s.cache.position(), s.verify.wants_hidden()))
            .unzip();
        let mut groups: Vec<(&mut SequenceState, &[u32])> =
            streams.iter_mut().zip(&feeds).filter_map(|(s, f)| f.as_deref().map(|t| (&mut s.cache, t))).collect();
        if groups.is_empty() {
            return Ok(events);
        }
        let rows: usize = groups.iter().map(|(_, t)| t.len()).sum();
        let span = groups.iter().map(|(c, t)| c.position() + t.len()).max().unwrap_or(0);
        self.size_expert_cache(rows, span);
        let t0 = Instant::now();
        let (logits, hidden) = rayon::scope(|_| self.net.forward_verify_groups_hidden(&mut groups, &want))?;
        if !prefilling {
            self.passes.record(rows, t0.elapsed().as_secs_f64());
        }
        let fed = streams.iter_mut().zip(&feeds).filter_map(|(s, f)| f.as_ref().map(|t| (s, t)));
        for (((s, fed), rows), (hidden, start)) in fed.zip(logits).zip(hidden.into_iter().zip(starts)) {
            s.verify.target_ran(s.model, start, hidden.as_ref())?;
            let rows = rows.to_vec2::<f32>()?;
            if s.is_prefilling() {
                s.prompt_fed += fed.len();
                if s.is_prefilling() {
                    continue;
                }
                s.prefill = s.started.elapsed();
                s.next_logits = rows.into_iter().next();
            } else {
                s.next_logits = s.verify.take_rows(fed, rows);
            }
        }
        // The prompt is in: the room its passes borrowed goes back to the expert cache.
        if prefilling && !streams.iter().any(|s| s.stop.is_none() && s.is_prefilling()) {
            self.size_expert_cache(1, 0);
        }
        Ok(events)
    }

    /// As [`Model::stream`], saving checkpoints to `path` when [`TokenStream::checkpoint`] is
    /// called. If `path` holds a checkpoint of this same generation (model, prompt, sampling and
    /// stops), the stream resumes from it instead of starting over: the tokens it restored are in
    /// [`TokenStream::take_replay`], and what follows is what an uninterrupted run would give.
    pub fn stream_resumable(&self, request: GenerateRequest, path: &Path) -> Result<TokenStream<'_>> {
        self.open(request, Some(path), true)
    }

    /// Tokenizes and checks the prompt, opens the checkpoint file at `checkpoint` if any (with
    /// the state it holds for this generation), and starts the stream, prefilling now if `prefill`.
    fn open(&self, request: GenerateRequest, checkpoint: Option<&Path>, prefill: bool) -> Result<TokenStream<'_>> {
        let started = Instant::now();
        let prompt_tokens = self.checked_prompt(&request.prompt)?;
        let (journal, saved) = match checkpoint {
            Some(path) => {
                let identity = Identity {
                    model: self.path().display().to_string(),
                    network: self.network_shape(),
                    weights: WeightsFile::of(self.path())?,
                    prompt: prompt_tokens.clone(),
                    sampling: request.sampling,
                    stop: request.stop.clone(),
                    stop_at_eos: request.stop_at_eos,
                    template: None,
                    tool_calls: request.tool_calls.as_ref().map(ToolCallGrammar::identity),
                };
                let (journal, saved) = Journal::open(path, &identity, self.spec().layers)?;
                (Some(journal), saved)
            }
            None => (None, None),
        };
        self.start(request, prompt_tokens, started, journal, saved, prefill)
    }

    /// The prompt's tokens, checked against the context.
    fn checked_prompt(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let prompt_tokens = self.prompt_tokens(prompt)?;
        if prompt_tokens.is_empty() {
            return Err(ModelError::EmptyPrompt.into());
        }
        let context = self.spec().context_length;
        if prompt_tokens.len() >= context {
            return Err(EngineError::PromptTooLong { len: prompt_tokens.len(), max: context });
        }
        Ok(prompt_tokens)
    }

    /// What a checkpoint's key/value rows must fit: layers, widths and vocabulary.
    pub(crate) fn network_shape(&self) -> Vec<usize> {
        let s = self.spec();
        let a = &s.attention;
        let mut shape = vec![s.layers, s.hidden_size, s.vocab_size, a.heads, a.kv_heads, a.head_dim];
        // A latent cache holds the latent and the rotary key: their widths are its layout.
        if let Some(m) = &a.mla {
            shape.extend([m.kv_lora_rank, m.qk_rope_head_dim]);
        }
        // A sparse layer's indexer key rides beside the rotary key; a shared layer keeps none.
        if let Some(d) = &s.sparse_attention {
            shape.push(d.head_dim);
            shape.extend(d.full.iter().map(|&f| usize::from(f)));
        }
        // KDA layers hold a state of their own shape, at their own places.
        if let Some(k) = &s.kda {
            shape.extend([k.heads, k.head_dim, k.conv_kernel, k.layers.len()]);
            shape.extend(&k.layers);
        }
        // So do Gated DeltaNet layers.
        if let Some(d) = &s.delta_net {
            shape.extend([d.k_heads, d.v_heads, d.k_head_dim, d.v_head_dim, d.conv_kernel, d.layers.len()]);
            shape.extend(&d.layers);
        }
        // DeepSeek-V4's window states: their widths, and each layer's kind (0 for sliding, its
        // compression rate otherwise).
        if let Some(v) = &s.deepseek_v4 {
            shape.extend([v.hc_mult, v.sliding_window, v.rope_dim, v.index_heads, v.index_head_dim, v.index_topk]);
            shape.extend(v.kinds.iter().map(|k| match *k {
                nightmail_model::spec::V4AttentionKind::Sliding => 0,
                nightmail_model::spec::V4AttentionKind::HeavilyCompressed { rate }
                | nightmail_model::spec::V4AttentionKind::CompressedSparse { rate } => rate,
            }));
        }
        shape
    }

    /// A stream that begins with the prompt's prefill, or, given a checkpoint's `saved` state,
    /// where that state left off.
    fn start(
        &self,
        mut request: GenerateRequest,
        prompt_tokens: Vec<u32>,
        started: Instant,
        journal: Option<Journal>,
        saved: Option<Saved>,
        prefill: bool,
    ) -> Result<TokenStream<'_>> {
        // A verify pass is rolled back by position; DeepSeek-V4's compressors cannot un-close a
        // window (nightmail-model/src/parts/sliding_mqa.rs), so it runs one pass per token.
        if request.draft != Drafting::None && self.spec().deepseek_v4.is_some() {
            return Err(FormatError::Unsupported {
                what: "drafting with a DeepSeek-V4 model".into(),
                hint: "run it without drafts (draft = none)".into(),
            }
            .into());
        }
        let mut sampler = Sampler::new(request.sampling)?;
        let mut constraint = match &request.tool_calls {
            Some(grammar) => self.constraint(grammar)?,
            None => None,
        };
        if let Some(c) = constraint.as_mut() {
            c.prime(&prompt_tokens);
        }
        // Drafts are verified against unmasked logits: a constrained stream runs without them.
        if request.tool_calls.is_some() {
            request.draft = Drafting::None;
        }
        let drafter = match request.draft {
            Drafting::Model => Some(DrafterState::new(self.draft_model().ok_or(EngineError::NoDraftModel)?)),
            Drafting::Mtp => Some(DrafterState::mtp(self)?),
            _ => None,
        };
        let mut cache = self.new_cache();
        // Nothing to generate (e.g. only tokenizing): skip the prefill.
        let nothing = (request.max_new_tokens == 0).then_some(StopReason::MaxTokens);
        // A checkpoint without logits saved the prompt's first passes: the rest still runs.
        let prompt_part = saved.as_ref().is_some_and(|s| s.logits.is_empty());
        let restored_prompt = match &saved {
            Some(s) if prompt_part => s.position,
            Some(_) => prompt_tokens.len(),
            None => 0,
        };
        // The prompt runs once the stream exists (an MTP drafter takes its hidden states).
        let prefill = prefill && nothing.is_none() && (saved.is_none() || prompt_part);
        let (logits, stop, restored, prompt_fed) = match saved {
            Some(saved) => {
                sampler.set_position(saved.sampler_position);
                cache.restore(&saved.kv, saved.position)?;
                let logits = (!prompt_part).then_some(saved.logits);
                (logits, None, saved.tokens, restored_prompt)
            }
            None => (None, nothing, Vec::new(), 0),
        };
        let mut stream = TokenStream {
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
            prefill: Duration::ZERO,
            started,
            journal,
            replay: Vec::new(),
            prompt_fed,
            verify: Verifier::new(drafter),
            restored_prompt,
            constraint,
        };
        if prefill {
            stream.prefill_rest()?;
        }
        // Replay restored tokens' text exactly as it was handed out the first time.
        for (index, id) in restored.into_iter().enumerate() {
            // The grammar's state is rebuilt from the restored tokens, as they were drawn.
            if let Some(c) = stream.constraint.as_mut() {
                c.advance(id)?;
            }
            stream.tokens.push(id);
            if let Some(tok) = self.tokenizer() {
                stream.text = tok.decode(&stream.tokens)?;
            }
            let text = stream.take_text();
            let progress = stream.progress();
            stream.replay.push(TokenEvent { id, index, text, logits: None, progress });
        }
        stream.prefill = started.elapsed();
        Ok(stream)
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

    /// The runtime constraint for `grammar`; `None` for a syntax decoded freely.
    fn constraint(&self, grammar: &ToolCallGrammar) -> Result<Option<Constraint>> {
        let tok = self.tokenizer().ok_or(EngineError::NoTokenizer)?;
        let pieces = match self.pieces.get() {
            Some(p) => p.clone(),
            None => {
                let built = std::sync::Arc::new(TokenPieces::new(tok, self.spec().vocab_size)?);
                self.pieces.get_or_init(|| built).clone()
            }
        };
        Constraint::new(grammar, pieces, &self.spec().eos_tokens)
    }

    /// The prompt's tokens as the model will read them (a chat rendered by its template).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Tokens(t) => Ok(t.clone()),
            Prompt::Text(text) => Ok(self.tokenizer().ok_or(EngineError::NoTokenizer)?.encode(text, true)?),
            Prompt::Chat(chat) => self.chat_tokens(chat),
        }
    }

    /// A conversation rendered by the model's template, the assistant's turn opened.
    fn chat_tokens(&self, chat: &Conversation) -> Result<Vec<u32>> {
        let tok = self.tokenizer().ok_or(EngineError::NoTokenizer)?;
        let template = self.chat_template().ok_or(EngineError::NoChatTemplate)?;
        let options = RenderOptions {
            add_generation_prompt: true,
            bos_token: tok.bos_text().unwrap_or("").into(),
            eos_token: tok.eos_text().unwrap_or("").into(),
            tools: chat.tools.clone(),
            kwargs: chat.thinking.map(nightmail_formats::chat::thinking_switches).unwrap_or_default(),
        };
        let text = template.render_with(&chat.messages, &options)?;
        Ok(tok.encode(&text, false)?)
    }
}

impl TokenStream<'_> {
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.prompt_tokens
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Generated tokens so far (restored ones included).
    pub fn generated(&self) -> usize {
        self.tokens.len()
    }

    /// The events of the tokens a resumed stream restored from its checkpoint (empty otherwise,
    /// and after the first call): hand them on as if they had just been generated.
    pub fn take_replay(&mut self) -> Vec<TokenEvent> {
        std::mem::take(&mut self.replay)
    }

    /// Saves what was generated since the last checkpoint (tokens, the sampler's position, the
    /// new key/value rows and the pending logits) and makes it durable; between two prefill
    /// passes, the prompt's rows so far (a resume runs only the rest). Returns the tokens the
    /// checkpoint file now covers; `None` for a stream opened without one, or once it has stopped
    /// on its own (nothing is left to resume).
    pub fn checkpoint(&mut self) -> Result<Option<usize>> {
        let prefilling = self.is_prefilling();
        if self.journal.is_none() || (self.next_logits.is_none() && !prefilling) {
            return Ok(None);
        }
        if matches!(self.stop, Some(s) if s != StopReason::Cancelled) {
            return Ok(None);
        }
        // Drafts still waiting for their verdict are not part of the generation yet: a
        // checkpoint holds only accepted tokens (the next token is drawn from `logits` again).
        self.verify.forget_drafts(&mut self.cache)?;
        let logits: &[f32] = if prefilling { &[] } else { self.next_logits.as_deref().unwrap_or_default() };
        let Some(journal) = self.journal.as_mut() else { return Ok(None) };
        let (tokens, from) = journal.saved();
        let to = self.cache.position();
        if from == to {
            return Ok(Some(tokens));
        }
        let delta = |from: usize| -> Result<Delta<'_>> {
            let kv = (0..self.cache.layers())
                .map(|l| self.cache.snapshot(l, from, to))
                .collect::<Result<Vec<_>, nightmail_model::ModelError>>()?;
            Ok(Delta { tokens: &self.tokens, sampler_position: self.sampler.position(), kv, end_position: to, logits })
        };
        journal.append(&delta(from)?)?;
        // Recurrent layers (KDA) save their whole state in each record: once the replaced ones
        // outweigh the rest, the file is rewritten as one record of everything.
        if journal.wants_compaction() {
            journal.compact(&delta(0)?)?;
        }
        Ok(Some(self.tokens.len()))
    }

    /// Bytes of the checkpoint file, if the stream has one.
    pub fn checkpoint_bytes(&self) -> Option<u64> {
        self.journal.as_ref().map(Journal::bytes)
    }

    /// Prompt tokens the checkpoint file covers (all of them once it holds a generated token).
    pub fn checkpoint_prompt_tokens(&self) -> usize {
        self.journal.as_ref().map_or(0, |j| j.saved().1.min(self.prompt_tokens.len()))
    }

    fn progress(&self) -> GenerationProgress {
        GenerationProgress {
            prompt_tokens: self.prompt_tokens.len(),
            generated: self.tokens.len(),
            max_new_tokens: self.request.max_new_tokens,
            elapsed: self.started.elapsed(),
        }
    }

    /// Stop before the next token.
    pub fn cancel(&mut self) {
        self.stop.get_or_insert(StopReason::Cancelled);
    }

    /// The next token, or None once stopped.
    pub fn next_token(&mut self) -> Result<Option<TokenEvent>> {
        if self.stop.is_none() && self.is_prefilling() {
            self.prefill_rest()?;
        }
        let Some((event, feed)) = self.pick()? else { return Ok(None) };
        if let Some(fed) = feed.map(|id| self.plan_feed(id)).transpose()?.flatten() {
            let t0 = Instant::now();
            let rows = self.run_pass(&fed)?;
            self.model.passes.record(fed.len(), t0.elapsed().as_secs_f64());
            self.next_logits = self.verify.take_rows(&fed, rows);
        }
        Ok(Some(event))
    }

    /// Runs the rest of the prompt at once.
    fn prefill_rest(&mut self) -> Result<()> {
        let rest = self.prompt_tokens[self.prompt_fed..].to_vec();
        self.next_logits = self.run_pass(&rest)?.pop();
        self.prompt_fed = self.prompt_tokens.len();
        self.prefill = self.started.elapsed();
        Ok(())
    }

    /// Runs `tokens` after what the cache holds: the logits of each of them in a verify pass,
    /// else of the last. An MTP drafter gets their hidden states.
    fn run_pass(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let model = self.model;
        let start = self.cache.position();
        let want = [self.verify.wants_hidden()];
        let mut group = [(&mut self.cache, tokens)];
        let (rows, hidden) = rayon::scope(|_| model.net.forward_verify_groups_hidden(&mut group, &want))?;
        self.verify.target_ran(model, start, hidden[0].as_ref())?;
        Ok(rows[0].to_vec2::<f32>()?)
    }

    /// What to run after `id` was drawn ([`Verifier::plan_feed`]); `None` when the last verify
    /// pass ran it as a guess, whose logits are then the next ones.
    fn plan_feed(&mut self, id: u32) -> Result<Option<Vec<u32>>> {
        let stream = Drawn {
            model: self.model,
            draft: self.request.draft,
            lookup: &self.request.lookup,
            max_new_tokens: self.request.max_new_tokens,
            prompt: &self.prompt_tokens,
            generated: &self.tokens,
        };
        match self.verify.plan_feed(stream, &mut self.cache, id)? {
            Feed::Run(fed) => Ok(Some(fed)),
            Feed::Accepted(logits) => {
                self.next_logits = Some(logits);
                Ok(None)
            }
        }
    }

    /// Whether part of the prompt is still to be run (a stream made by [`Model::stream_deferred`]).
    pub fn is_prefilling(&self) -> bool {
        self.prompt_fed < self.prompt_tokens.len()
    }

    /// Draws the next token from the pending logits: its event, and the token to run next if
    /// the stream goes on.
    fn pick(&mut self) -> Result<Option<(TokenEvent, Option<u32>)>> {
        if self.stop.is_some() {
            return Ok(None);
        }
        let Some(mut logits) = self.next_logits.take() else { return Ok(None) };
        let id = match self.constraint.as_mut() {
            Some(c) => c.pick(&mut logits, &mut self.sampler)?,
            None => self.sampler.sample(&logits),
        };
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
        } else if self.cache.position() - self.verify.waiting() + 1 >= model.spec().context_length {
            self.stop = Some(StopReason::ContextFull);
        }
        let text = self.take_text();
        let event = TokenEvent {
            id,
            index,
            text,
            logits: self.request.record_logits.then_some(logits),
            progress: self.progress(),
        };
        Ok(Some((event, self.stop.is_none().then_some(id))))
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
            verify_steps: self.verify.verify_steps,
            drafted: self.verify.drafted,
            accepted: self.verify.accepted,
        }
    }
}

impl Iterator for TokenStream<'_> {
    type Item = Result<TokenEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_token().transpose()
    }
}

/// Thread state reuse ([`crate::state_cache`]).
impl TokenStream<'_> {
    /// Starts the prompt from the longest state `states` saved of it: the prompt's prefill then
    /// runs only the tokens after it. Only before any of the prompt has run (a stream of
    /// [`Model::stream_deferred`] not yet stepped); a stream resumed from its checkpoint has
    /// nothing to reuse.
    pub fn reuse(&mut self, states: &StateCache) -> Reuse {
        let mut reuse = Reuse::default();
        if self.prompt_fed > 0 || self.stop.is_some() || self.cache.position() > 0 {
            return reuse;
        }
        let Some(found) = states.find(&self.prompt_tokens, &mut reuse.ignored) else { return reuse };
        if let Err(e) = self.cache.restore(&found.kv, found.position) {
            // A part may be in: start over from an empty state.
            self.cache = self.model.new_cache();
            reuse.ignored.push(EngineError::from(e));
            return reuse;
        }
        self.prompt_fed = found.position;
        self.restored_prompt = found.position;
        reuse.restored = found.position;
        reuse
    }

    /// Saves the state of everything this finished stream ran (its prompt and the answer's
    /// tokens but the last drawn, which no pass ran) to `states`, keyed by its prompt. Returns
    /// the bytes written; `None` for a stream that did not finish on its own, or a state
    /// larger than the cache's budget.
    pub fn keep(&mut self, states: &StateCache) -> Result<Option<u64>> {
        if !matches!(self.stop, Some(s) if s != StopReason::Cancelled) || self.is_prefilling() {
            return Ok(None);
        }
        self.verify.forget_drafts(&mut self.cache)?;
        let mut run = self.prompt_tokens.clone();
        run.extend(&self.tokens);
        if self.cache.position() > run.len() {
            return Ok(None);
        }
        run.truncate(self.cache.position());
        states.save(&run, self.prompt_tokens.len(), &self.cache)
    }

    /// Time from the stream's start to the end of its prompt's prefill (or of its restore); zero
    /// while the prompt is still running.
    pub fn prefill_time(&self) -> Duration {
        self.prefill
    }

    /// Prompt tokens this stream ran through the model; the rest were restored.
    pub fn prefilled_tokens(&self) -> usize {
        self.prompt_tokens.len() - self.restored_prompt
    }
}
