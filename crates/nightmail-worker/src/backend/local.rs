//! nightmail's own engine on this machine (`backend = "local"`). The model is loaded (memory
//! mapped) on first use and kept; generation runs on a blocking thread and streams each token.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nightmail_config::LocalBackend;
use nightmail_engine::{
    ChatMessage, EngineError, GenerateRequest, LoadOptions, Model, Prompt, Sampling, StopReason, StreamConfig,
    TokenStream,
};
use tokio::sync::{mpsc, watch};

use super::{Backend, BackendError, BoxFuture, Event, Outcome, Request, ThinkSplitter};

pub struct Local {
    inner: Arc<Inner>,
}

struct Inner {
    config: LocalBackend,
    model: Mutex<Option<Arc<Model>>>,
}

impl Local {
    pub fn new(config: LocalBackend) -> Local {
        Local { inner: Arc::new(Inner { config, model: Mutex::new(None) }) }
    }
}

/// Engine errors as the worker treats them.
fn backend_error(e: EngineError) -> BackendError {
    match e {
        // A damaged model file stays damaged: fail the job with a notice, not retries.
        EngineError::ExpertRead { .. } => BackendError::Permanent(e.to_string()),
        e => BackendError::Transient(e.to_string()),
    }
}

/// When to save the next checkpoint: after `every_tokens` new tokens or `every`, whichever first.
struct Schedule {
    every_tokens: usize,
    every: Duration,
    tokens: usize,
    at: Instant,
}

impl Schedule {
    fn due(&self, generated: usize) -> bool {
        generated >= self.tokens + self.every_tokens || self.at.elapsed() >= self.every
    }

    /// Saves a checkpoint now and tells the worker; a failed write is logged and generation goes
    /// on (the next checkpoint may succeed; a crash before it redoes more work, nothing worse).
    fn save(&mut self, stream: &mut TokenStream<'_>, events: &mpsc::UnboundedSender<Event>) {
        match stream.checkpoint() {
            Ok(Some(tokens)) => {
                let bytes = stream.checkpoint_bytes().unwrap_or(0);
                let _ = events.send(Event::Checkpoint { tokens: tokens as u64, bytes });
                self.tokens = tokens;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("checkpoint not saved: {e}"),
        }
        self.at = Instant::now();
    }
}

impl Inner {
    /// The loaded model; a file that cannot be loaded will not load on a retry either.
    fn model(&self) -> Result<Arc<Model>, BackendError> {
        let mut slot = self.model.lock().expect("model lock");
        if let Some(model) = slot.as_ref() {
            return Ok(model.clone());
        }
        let options = LoadOptions { stream: self.config.expert_cache_mb.map(StreamConfig::with_cache_mb) };
        let model =
            Model::load_with(&self.config.path, &options).map_err(|e| BackendError::Permanent(e.to_string()))?;
        let model = Arc::new(model);
        *slot = Some(model.clone());
        Ok(model)
    }

    fn run(
        &self,
        request: &Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> Result<Outcome, BackendError> {
        let model = self.model()?;
        let messages = request.turns.iter().map(|t| ChatMessage::new(t.role.as_str(), t.content.clone())).collect();
        let mut generate = GenerateRequest::new(Prompt::Chat(messages));
        generate.max_new_tokens = request.max_tokens as usize;
        let c = &self.config;
        generate.sampling =
            Sampling { temperature: request.temperature, top_k: c.top_k, top_p: c.top_p, seed: c.seed.unwrap_or(0) };
        let mut think = ThinkSplitter::default();
        let mut outcome = Outcome { model: c.path.display().to_string(), ..Outcome::default() };
        let count = |outcome: &mut Outcome, event: Event| {
            match &event {
                Event::Content(t) => {
                    outcome.content.push_str(t);
                    outcome.output_tokens += 1;
                }
                Event::Reasoning(t) => {
                    outcome.reasoning.push_str(t);
                    outcome.reasoning_tokens += 1;
                }
                Event::Checkpoint { .. } => {}
            }
            let _ = events.send(event);
        };
        let mut stream = match &request.checkpoint {
            Some(path) => model.stream_resumable(generate, path),
            None => model.stream(generate),
        }
        .map_err(backend_error)?;
        // A resumed answer: hand on what the checkpoint restored as if it had just come.
        let replay = stream.take_replay();
        let mut schedule = Schedule {
            every_tokens: c.checkpoint_every_tokens as usize,
            every: c.checkpoint_every,
            tokens: replay.len(),
            at: Instant::now(),
        };
        if !replay.is_empty() {
            tracing::info!(tokens = replay.len(), "resuming from a checkpoint");
            let bytes = stream.checkpoint_bytes().unwrap_or(0);
            let _ = events.send(Event::Checkpoint { tokens: replay.len() as u64, bytes });
        }
        for token in replay {
            for event in think.push(&token.text) {
                count(&mut outcome, event);
            }
        }
        loop {
            if *stop.borrow() {
                // Shutdown: save the state so the restart resumes here.
                stream.cancel();
                schedule.save(&mut stream, &events);
                return Err(BackendError::Stopped);
            }
            let Some(token) = stream.next_token().map_err(backend_error)? else { break };
            for event in think.push(&token.text) {
                count(&mut outcome, event);
            }
            if request.checkpoint.is_some() && schedule.due(stream.generated()) {
                schedule.save(&mut stream, &events);
            }
        }
        let completion = stream.into_completion();
        for event in think.finish() {
            count(&mut outcome, event);
        }
        // Token counts follow the tokens, not the text events (a token may complete no text).
        let generated = completion.tokens.len() as u64;
        let reasoning = outcome.reasoning_tokens.min(generated);
        outcome.reasoning_tokens = reasoning;
        outcome.output_tokens = generated - reasoning;
        outcome.prompt_tokens = Some(completion.prompt_tokens.len() as u64);
        outcome.finish_reason = match completion.stop {
            StopReason::Eos | StopReason::StopString => "stop",
            StopReason::MaxTokens | StopReason::ContextFull => "length",
            StopReason::Cancelled => return Err(BackendError::Stopped),
        }
        .to_string();
        Ok(outcome)
    }
}

impl Backend for Local {
    fn describe(&self) -> String {
        format!(
            "local {}",
            self.inner.config.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        )
    }

    fn generate<'a>(
        &'a self,
        request: &'a Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> BoxFuture<'a, Result<Outcome, BackendError>> {
        Box::pin(async move {
            // Generation blocks for as long as it takes (hours, for a model streamed from SSD): it
            // runs on a blocking thread, checking `stop` between tokens.
            let inner = self.inner.clone();
            let request = request.clone();
            let result = tokio::task::spawn_blocking(move || inner.run(&request, events, stop)).await;
            result.unwrap_or_else(|e| Err(BackendError::Transient(format!("the engine thread failed: {e}"))))
        })
    }
}
