//! nightmail's own engine on this machine (`backend = "local"`). The model is loaded (memory
//! mapped) on first use and kept. One engine thread per model decodes every job given to it in
//! lockstep, up to `max_batch` at once ([`Model::step`]): each step reads each dense weight once
//! and each layer's experts once for the union of the jobs' routes, so waiting questions share
//! the expensive reads.
//!
//! Scheduling (the fairness policy):
//! - Jobs join the batch between steps, in the order they arrive, while it has fewer than
//!   `max_batch`; the rest wait in that order and join as jobs leave.
//! - Every job in the batch gets one token per step, so a short question that joins beside a
//!   long one finishes in its own number of steps, not after the long one.
//! - A joining job's prompt is run [`Model::prefill_chunk`] tokens per step (as many as the
//!   memory budget lets one pass hold, so a long prompt reads the experts few times), one prompt
//!   at a time, beside the batch's decoding: a long prompt slows the steps it shares, it never
//!   stops them.
//! - Each job checkpoints on its own schedule and stops on its own signal between steps.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::time::{Duration, Instant};

use nightmail_config::LocalBackend;
use nightmail_engine::{
    ChatMessage, Conversation, EngineError, GenerateRequest, LoadOptions, MemoryBudget, Model, Prompt, PromptLookup,
    Sampling, StateCache, StopReason, StreamConfig, TokenEvent, TokenStream, ToolArguments, ToolCall, ToolCallGrammar,
};
use nightmail_store::PromptIn;
use tokio::sync::{mpsc, oneshot, watch};

use super::calls::CallSyntax;
use super::{Backend, BackendAnswer, BackendError, BoxFuture, Event, Measure, Request, ThinkSplitter, ToolSpec};
use crate::conversation::{Role, Turn};

pub struct Local {
    inner: Arc<Inner>,
}

struct Inner {
    config: LocalBackend,
    /// Where finished answers' states are kept for follow-ups (`state_cache_mb` of them).
    state_dir: PathBuf,
    /// The engine thread's queue, once started. Shared with the thread, which empties it when
    /// the model fails to load.
    engine: EngineSlot,
}

/// Where submitters find the engine thread. Jobs are sent only under its lock, so a thread
/// that clears it while holding the lock has every job ever sent to it in its queue.
type EngineSlot = Arc<Mutex<Option<std_mpsc::Sender<Work>>>>;

/// What the engine thread is asked to do.
enum Work {
    /// Boxed: a job is several times a measurement's size, and the channel holds either.
    Generate(Box<Job>),
    /// Count a prompt's tokens with the model's tokenizer and chat template; answered between
    /// steps, without joining the batch.
    Measure { prompt: Prompt, reply: oneshot::Sender<Result<Measure, BackendError>> },
}

impl Work {
    /// Answers the work with `error` (the engine cannot run).
    fn fail(self, error: BackendError) {
        match self {
            Work::Generate(job) => {
                let _ = job.done.send(Err(error));
            }
            Work::Measure { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// One generation handed to the engine thread.
struct Job {
    request: GenerateRequest,
    checkpoint: Option<PathBuf>,
    events: mpsc::UnboundedSender<Event>,
    stop: watch::Receiver<bool>,
    done: oneshot::Sender<Result<BackendAnswer, BackendError>>,
    /// The tools the model may call (OpenAI's JSON array), when it may.
    tools: Option<String>,
}

impl Local {
    pub fn new(config: LocalBackend, state_dir: PathBuf) -> Local {
        Local { inner: Arc::new(Inner { config, state_dir, engine: Arc::new(Mutex::new(None)) }) }
    }
}

/// Engine errors as the worker treats them.
fn backend_error(e: EngineError) -> BackendError {
    match e {
        // A damaged model file stays damaged: fail the job with a notice, not retries.
        EngineError::Format(nightmail_engine::FormatError::ExpertRead { .. }) => BackendError::Permanent(e.to_string()),
        // A prompt longer than the context is as long the next time (the worker fits prompts
        // first; this is the last word).
        EngineError::PromptTooLong { .. } => BackendError::Permanent(e.to_string()),
        e => BackendError::Transient(e.to_string()),
    }
}

impl Inner {
    /// Hands `job` to the engine thread, starting the thread (which loads the model) if there
    /// is none or it has ended.
    fn submit(&self, job: Work) {
        let mut slot = self.engine.lock().expect("engine lock");
        let job = match slot.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(std_mpsc::SendError(job)) => job,
            },
            None => job,
        };
        // The job is queued before the thread starts, so even a thread that fails at once
        // finds it and fails it with its error.
        let (tx, rx) = std_mpsc::channel();
        tx.send(job).expect("the receiver is still here");
        let config = self.config.clone();
        let state_dir = self.state_dir.clone();
        let engine = Arc::clone(&self.engine);
        std::thread::Builder::new()
            .name("nightmail-engine".into())
            .spawn(move || engine_thread(&config, &state_dir, rx, &engine))
            .expect("spawning the engine thread");
        *slot = Some(tx);
    }
}

/// Loads the model, then serves jobs until every sender is gone. A model that cannot be loaded
/// fails every job given to it (permanently: it will not load on a retry either).
fn engine_thread(config: &LocalBackend, state_dir: &Path, jobs: std_mpsc::Receiver<Work>, engine: &EngineSlot) {
    let options = LoadOptions {
        stream: config.expert_cache_mb.map(StreamConfig::with_cache_mb),
        // A key/value cache for every job of a batch, and the union of their experts: of every
        // row of their verify passes when the model drafts (at the default cap of guesses, as
        // every job's request keeps).
        memory: config.memory_mb.map(|mb| MemoryBudget {
            batch: config.max_batch,
            verify_rows: engine_draft(&config.draft).verify_rows(PromptLookup::default().max_draft),
            ..MemoryBudget::mb(mb)
        }),
    };
    let load = |options: &LoadOptions| -> Result<Model, EngineError> {
        let mut model = Model::load_with(&config.path, options)?;
        // The draft model is resident beside it, refused unless it shares the tokenizer.
        // So is the model's own MTP layer, refused for a model without one.
        match &config.draft {
            nightmail_config::Draft::Model(path) => model.attach_draft_model(path)?,
            nightmail_config::Draft::Mtp => model.attach_mtp()?,
            _ => {}
        }
        Ok(model)
    };
    let model = match load(&options) {
        Ok(m) => m,
        Err(e) => {
            // Fail what is queued and end; the next job starts a new thread, which tries the
            // file again (it may have been fixed). Clearing the slot under its lock first means
            // no job can arrive after the queue is emptied and be dropped unanswered.
            let mut slot = engine.lock().expect("engine lock");
            *slot = None;
            for work in jobs.try_iter() {
                work.fail(BackendError::Permanent(e.to_string()));
            }
            return;
        }
    };
    let states = thread_states(&model, config, state_dir);
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut batch: Vec<Running<'_>> = Vec::new();
    let mut gauge = super::gauge::Gauge::default();
    loop {
        // Take what has arrived; with nothing to do, wait for it.
        if batch.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(work) => take(&model, work, &mut waiting),
                Err(_) => return,
            }
        }
        for work in jobs.try_iter() {
            take(&model, work, &mut waiting);
        }
        while batch.len() < config.max_batch.max(1) {
            let Some(job) = waiting.pop_front() else { break };
            if let Some(running) = Running::start(&model, config, job, states.as_ref()) {
                batch.push(running);
            }
        }
        // Stop signals, between steps: save the state for the restart, then leave.
        batch.retain_mut(|r| {
            if !*r.stop.borrow() {
                return true;
            }
            r.stream.cancel();
            r.save_checkpoint();
            r.finish(Err(BackendError::Stopped));
            false
        });
        if batch.is_empty() {
            continue;
        }
        // The step prefills the first prompt still to run, as wide as memory allows for it.
        let prefilling = batch.iter().position(|r| r.stream.stop_reason().is_none() && r.stream.is_prefilling());
        let prefill_chunk = prefilling.map_or(1, |i| model.prefill_chunk(batch[i].stream.prompt_tokens().len()));
        let mut streams: Vec<&mut TokenStream<'_>> = batch.iter_mut().map(|r| &mut r.stream).collect();
        match model.step(&mut streams, prefill_chunk) {
            Ok(events) => {
                for (r, event) in batch.iter_mut().zip(events) {
                    if let Some(event) = event {
                        r.token(&event);
                    }
                }
                // A long prompt is saved between its passes on the answer's clock, so a restart
                // loses at most one interval of it, whatever the passes' width.
                if let Some(r) = prefilling.map(|i| &mut batch[i])
                    && r.stream.is_prefilling()
                    && r.checkpoints.as_ref().is_some_and(CheckpointTimer::elapsed)
                {
                    r.save_checkpoint();
                }
                if let Some(figures) = gauge.sample(&model) {
                    for r in &batch {
                        let _ = r.events.send(Event::Engine(figures));
                    }
                }
                batch.retain_mut(|r| match r.stream.stop_reason() {
                    None => true,
                    Some(_) => {
                        let outcome = r.outcome();
                        r.finish(outcome);
                        r.keep_state(states.as_ref());
                        false
                    }
                });
            }
            Err(e) => {
                // The step failed for every job in it.
                let e = backend_error(e);
                for mut r in batch.drain(..) {
                    r.finish(Err(e.clone()));
                }
            }
        }
    }
}

/// Queues a generation; answers a measurement at once.
fn take(model: &Model, work: Work, waiting: &mut VecDeque<Job>) {
    match work {
        Work::Generate(job) => waiting.push_back(*job),
        Work::Measure { prompt, reply } => {
            let measured = model.prompt_tokens(&prompt).map_err(backend_error).map(|tokens| Measure {
                prompt_tokens: tokens.len(),
                exact: true,
                context: Some(model.spec().context_length),
            });
            let _ = reply.send(measured);
        }
    }
}

/// A job in the batch: its stream and everything that follows it to the worker.
struct Running<'m> {
    stream: TokenStream<'m>,
    events: mpsc::UnboundedSender<Event>,
    stop: watch::Receiver<bool>,
    done: Option<oneshot::Sender<Result<BackendAnswer, BackendError>>>,
    think: ThinkSplitter,
    outcome: BackendAnswer,
    checkpoints: Option<CheckpointTimer>,
    /// Whether the worker has been told how the prompt went in (with the first token).
    prompt_told: bool,
    /// How the model writes tool calls, when it was given tools.
    calls: Option<CallSyntax>,
}

impl<'m> Running<'m> {
    /// Opens the job's stream (resuming from its checkpoint if it has one); a job that cannot
    /// start is answered at once.
    fn start(
        model: &'m Model,
        config: &LocalBackend,
        mut job: Job,
        states: Option<&StateCache>,
    ) -> Option<Running<'m>> {
        let calls = job.tools.as_ref().map(|tools| {
            let syntax = CallSyntax::of(model.chat_template());
            if let Prompt::Chat(chat) = &mut job.request.prompt {
                syntax.describe(&mut chat.messages, tools);
            }
            // The engine keeps the calls the model writes well-formed (for the JSON-argument
            // syntaxes); a tool list it cannot make a grammar of leaves decoding free.
            match ToolCallGrammar::from_openai_tools(syntax.syntax, tools) {
                Ok(grammar) => job.request.tool_calls = Some(grammar),
                Err(e) => tracing::warn!(error = %e, "tool calls decoded without a grammar"),
            }
            syntax
        });
        let mut stream = match model.stream_deferred(job.request, job.checkpoint.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                let _ = job.done.send(Err(backend_error(e)));
                return None;
            }
        };
        if let Some(states) = states {
            reuse_state(&mut stream, states);
        }
        let mut r = Running {
            stream,
            events: job.events,
            stop: job.stop,
            done: Some(job.done),
            think: ThinkSplitter::default(),
            outcome: BackendAnswer { model: config.path.display().to_string(), ..BackendAnswer::default() },
            prompt_told: false,
            calls,
            checkpoints: job.checkpoint.map(|_| CheckpointTimer {
                every_tokens: config.checkpoint_every_tokens as usize,
                every: config.checkpoint_every,
                tokens: 0,
                at: Instant::now(),
            }),
        };
        // A resumed answer: hand on what the checkpoint restored as if it had just come.
        let replay = r.stream.take_replay();
        if !replay.is_empty() {
            tracing::info!(tokens = replay.len(), "resuming from a checkpoint");
            if let Some(s) = r.checkpoints.as_mut() {
                s.tokens = replay.len();
            }
            let bytes = r.stream.checkpoint_bytes().unwrap_or(0);
            let prompt_tokens = r.stream.checkpoint_prompt_tokens() as u64;
            let _ = r.events.send(Event::Checkpoint { tokens: replay.len() as u64, prompt_tokens, bytes });
            for token in &replay {
                r.text(&token.text);
            }
        }
        Some(r)
    }

    fn text(&mut self, text: &str) {
        for event in self.think.push(text) {
            self.count(event);
        }
    }

    fn count(&mut self, event: Event) {
        match &event {
            Event::Content(t) => {
                self.outcome.content.push_str(t);
                self.outcome.output_tokens += 1;
            }
            Event::Reasoning(t) => {
                self.outcome.reasoning.push_str(t);
                self.outcome.reasoning_tokens += 1;
            }
            Event::Checkpoint { .. } | Event::Engine(_) | Event::Prompt { .. } | Event::Restarted => {}
        }
        let _ = self.events.send(event);
    }

    /// A new token: its text to the worker, then a checkpoint if one is due. The first also
    /// tells how the prompt went in.
    fn token(&mut self, token: &TokenEvent) {
        if !self.prompt_told {
            self.prompt_told = true;
            let prompt_in = PromptIn {
                prefilled_tokens: self.stream.prefilled_tokens() as u64,
                prefill_ms: u64::try_from(self.stream.prefill_time().as_millis()).unwrap_or(u64::MAX),
            };
            let _ = self.events.send(Event::Prompt { tokens: self.stream.prompt_tokens().len() as u64, prompt_in });
        }
        self.text(&token.text);
        let generated = self.stream.generated();
        if self.checkpoints.as_ref().is_some_and(|s| s.due(generated)) {
            self.save_checkpoint();
        }
    }

    /// Saves a checkpoint now and tells the worker; a failed write is logged and generation goes
    /// on (the next checkpoint may succeed; a crash before it redoes more work, nothing worse).
    fn save_checkpoint(&mut self) {
        let Some(schedule) = self.checkpoints.as_mut() else { return };
        match self.stream.checkpoint() {
            Ok(Some(tokens)) => {
                let bytes = self.stream.checkpoint_bytes().unwrap_or(0);
                let prompt_tokens = self.stream.checkpoint_prompt_tokens() as u64;
                let _ = self.events.send(Event::Checkpoint { tokens: tokens as u64, prompt_tokens, bytes });
                schedule.tokens = tokens;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("checkpoint not saved: {e}"),
        }
        schedule.at = Instant::now();
    }

    /// The finished answer.
    fn outcome(&mut self) -> Result<BackendAnswer, BackendError> {
        for event in self.think.finish() {
            self.count(event);
        }
        let mut outcome = std::mem::take(&mut self.outcome);
        // Token counts follow the tokens, not the text events (a token may complete no text).
        let generated = self.stream.generated() as u64;
        let reasoning = outcome.reasoning_tokens.min(generated);
        outcome.reasoning_tokens = reasoning;
        outcome.output_tokens = generated - reasoning;
        outcome.prompt_tokens = Some(self.stream.prompt_tokens().len() as u64);
        outcome.prefilled_tokens = Some(self.stream.prefilled_tokens() as u64);
        outcome.prefill_ms = Some(u32::try_from(self.stream.prefill_time().as_millis()).unwrap_or(u32::MAX));
        outcome.finish_reason = match self.stream.stop_reason() {
            Some(StopReason::Eos | StopReason::StopString) => "stop",
            Some(StopReason::MaxTokens | StopReason::ContextFull) => "length",
            Some(StopReason::Cancelled) | None => return Err(BackendError::Stopped),
        }
        .to_string();
        if let Some(syntax) = self.calls {
            (outcome.content, outcome.calls) = syntax.read(&outcome.content);
        }
        Ok(outcome)
    }

    fn finish(&mut self, result: Result<BackendAnswer, BackendError>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(result);
        }
    }
}

/// The engine's saved thread states, when `state_cache_mb` keeps any; one that cannot be set
/// up is logged and the engine runs without.
fn thread_states(model: &Model, config: &LocalBackend, dir: &Path) -> Option<StateCache> {
    if config.state_cache_mb == 0 {
        return None;
    }
    match StateCache::open(model, dir, config.state_cache_mb.saturating_mul(1 << 20)) {
        Ok(states) => Some(states),
        Err(e) => {
            tracing::warn!("thread states are not kept: {e}");
            None
        }
    }
}

/// Starts a job's prompt from its thread's saved state, if one fits: a follow-up prefills only
/// its new turn. Saved states that could not be used are logged; the prompt is then prefilled.
fn reuse_state(stream: &mut TokenStream<'_>, states: &StateCache) {
    let reuse = stream.reuse(states);
    for e in &reuse.ignored {
        tracing::warn!("a saved thread state was ignored and removed (the prompt is prefilled): {e}");
    }
    if reuse.restored > 0 {
        tracing::info!(
            restored = reuse.restored,
            prompt = stream.prompt_tokens().len(),
            "the prompt starts from a saved thread state"
        );
    }
}

impl Running<'_> {
    /// Keeps the finished answer's state for a follow-up in its thread; a failed write is
    /// logged (the follow-up then prefills its prompt).
    fn keep_state(&mut self, states: Option<&StateCache>) {
        let Some(states) = states else { return };
        match self.stream.keep(states) {
            Ok(Some(bytes)) => tracing::debug!(bytes, "thread state kept"),
            Ok(None) => {}
            Err(e) => tracing::warn!("thread state not kept: {e}"),
        }
    }
}

/// When to save the next checkpoint: after `every_tokens` new tokens or `every`, whichever first.
struct CheckpointTimer {
    every_tokens: usize,
    every: Duration,
    tokens: usize,
    at: Instant,
}

impl CheckpointTimer {
    fn due(&self, generated: usize) -> bool {
        generated >= self.tokens + self.every_tokens || self.elapsed()
    }

    fn elapsed(&self) -> bool {
        self.at.elapsed() >= self.every
    }
}

/// The engine's drafter for the configured one.
fn engine_draft(draft: &nightmail_config::Draft) -> nightmail_engine::Drafting {
    match draft {
        nightmail_config::Draft::Lookup => nightmail_engine::Drafting::Lookup,
        nightmail_config::Draft::None => nightmail_engine::Drafting::None,
        nightmail_config::Draft::Model(_) => nightmail_engine::Drafting::Model,
        nightmail_config::Draft::Mtp => nightmail_engine::Drafting::Mtp,
    }
}

/// The request's turns as the engine's chat prompt, with the tools the model may call (calls and
/// results in the message shape chat templates read) and the mail's thinking switch.
fn chat(request: &Request) -> Prompt {
    let tools = (!request.tools.is_empty()).then(|| {
        let tools: Vec<serde_json::Value> = request.tools.iter().map(ToolSpec::to_json).collect();
        serde_json::Value::from(tools).to_string()
    });
    Prompt::Chat(Conversation {
        messages: request.turns.iter().map(message).collect(),
        tools,
        thinking: request.reasoning,
    })
}

fn message(turn: &Turn) -> ChatMessage {
    match turn.role {
        Role::Tool => {
            let call = turn.calls.first();
            ChatMessage::tool_result(
                call.map(|c| c.id.as_str()).unwrap_or_default(),
                call.map(|c| c.name.as_str()).unwrap_or_default(),
                turn.content.clone(),
            )
        }
        role => turn.calls.iter().fold(ChatMessage::new(role.as_str(), turn.content.clone()), |m, call| {
            // Arguments that are a JSON object go to the template as the object (transformers'
            // form); anything else as the text the model wrote.
            let object = serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok_and(|v| v.is_object());
            let arguments = if object {
                ToolArguments::Object(call.arguments.clone())
            } else {
                ToolArguments::Text(call.arguments.clone())
            };
            m.with_tool_call(ToolCall::function(call.id.clone(), call.name.clone(), arguments))
        }),
    }
}

impl Backend for Local {
    fn describe(&self) -> String {
        format!(
            "local {}",
            self.inner.config.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        )
    }

    fn measure<'a>(&'a self, request: &'a Request) -> BoxFuture<'a, Result<Measure, BackendError>> {
        Box::pin(async move {
            let (reply, measured) = oneshot::channel();
            self.inner.submit(Work::Measure { prompt: chat(request), reply });
            measured.await.unwrap_or_else(|_| Err(BackendError::Transient("the engine thread failed".into())))
        })
    }

    fn generate<'a>(
        &'a self,
        request: &'a Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> BoxFuture<'a, Result<BackendAnswer, BackendError>> {
        Box::pin(async move {
            let mut generate = GenerateRequest::new(chat(request));
            generate.max_new_tokens = request.max_tokens as usize;
            let c = &self.inner.config;
            generate.sampling = Sampling {
                temperature: request.temperature,
                top_k: c.top_k,
                top_p: c.top_p,
                seed: c.seed.unwrap_or(0),
            };
            generate.draft = engine_draft(&c.draft);
            let (done, result) = oneshot::channel();
            let tools = match &generate.prompt {
                Prompt::Chat(chat) => chat.tools.clone(),
                _ => None,
            };
            let job = Job { request: generate, checkpoint: request.checkpoint.clone(), events, stop, done, tools };
            self.inner.submit(Work::Generate(Box::new(job)));
            // Generation takes as long as it takes (hours, for a model streamed from SSD).
            result.await.unwrap_or_else(|_| Err(BackendError::Transient("the engine thread failed".into())))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Role, Turn};

    fn request(reasoning: Option<bool>) -> Request {
        Request {
            turns: vec![Turn::new(Role::System, "sys"), Turn::new(Role::User, "2+2?")],
            max_tokens: 64,
            temperature: 0.0,
            reasoning,
            model: None,
            checkpoint: None,
            tools: Vec::new(),
        }
    }

    /// A mail's `reasoning: off` reaches the template as the engine renders it, as it reaches an
    /// OpenAI server's `chat_template_kwargs`.
    #[test]
    fn the_thinking_switch_goes_with_the_conversation() {
        for reasoning in [None, Some(true), Some(false)] {
            let Prompt::Chat(chat) = chat(&request(reasoning)) else { panic!("a chat prompt") };
            assert_eq!(chat.thinking, reasoning);
            assert_eq!(chat.messages.len(), 2);
            assert_eq!(chat.tools, None);
        }
    }
}
