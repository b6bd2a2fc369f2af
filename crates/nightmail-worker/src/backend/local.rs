//! nightmail's own engine on this machine (`backend = "local"`). The model is loaded (memory
//! mapped) on first use and kept; generation runs on a blocking thread and streams each token.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nightmail_engine::{
    ChatMessage, EngineError, GenerateRequest, LoadOptions, Model, Prompt, Sampling, StopReason, StreamConfig,
};
use tokio::sync::{mpsc, watch};

use super::{Backend, BackendError, BoxFuture, Event, Outcome, Request, ThinkSplitter};

pub struct Local {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: u64,
    expert_cache_mb: Option<usize>,
    model: Mutex<Option<Arc<Model>>>,
}

impl Local {
    pub fn new(
        path: PathBuf,
        top_p: Option<f32>,
        top_k: Option<usize>,
        seed: Option<u64>,
        expert_cache_mb: Option<usize>,
    ) -> Local {
        let seed = seed.unwrap_or(0);
        Local { inner: Arc::new(Inner { path, top_p, top_k, seed, expert_cache_mb, model: Mutex::new(None) }) }
    }
}

impl Inner {
    /// The loaded model; a file that cannot be loaded will not load on a retry either.
    fn model(&self) -> Result<Arc<Model>, BackendError> {
        let mut slot = self.model.lock().expect("model lock");
        if let Some(model) = slot.as_ref() {
            return Ok(model.clone());
        }
        let options = LoadOptions { stream: self.expert_cache_mb.map(StreamConfig::with_cache_mb) };
        let model = Model::load_with(&self.path, &options).map_err(|e| BackendError::Permanent(e.to_string()))?;
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
        generate.sampling =
            Sampling { temperature: request.temperature, top_k: self.top_k, top_p: self.top_p, seed: self.seed };
        let mut think = ThinkSplitter::default();
        let mut outcome = Outcome { model: self.path.display().to_string(), ..Outcome::default() };
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
            }
            let _ = events.send(event);
        };
        let completion = model
            .generate(generate, |token| {
                if *stop.borrow() {
                    return ControlFlow::Break(());
                }
                for event in think.push(&token.text) {
                    count(&mut outcome, event);
                }
                ControlFlow::Continue(())
            })
            .map_err(|e| match e {
                // A damaged model file stays damaged: fail the job with a notice, not retries.
                EngineError::ExpertRead { .. } => BackendError::Permanent(e.to_string()),
                e => BackendError::Transient(e.to_string()),
            })?;
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
        format!("local {}", self.inner.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
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
