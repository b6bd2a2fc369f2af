//! The worker: takes a job from the queue (a lease, never a pop), turns its mail thread into a
//! conversation, runs the model's backend, and delivers a threaded reply, atomically with marking
//! the job done. Loops are refused, failures retried with backoff, and a job that finally fails
//! sends its asker a notice: never silence.

pub mod backend;
pub mod compose;
pub mod conversation;
pub mod loop_guard;
pub mod mail;
pub mod options;
pub mod text;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightmail_config::{Config, Model, ReasoningOutput};
use nightmail_store::{Finish, Incoming, Job, JobState, LeasedJob, Progress, Recipient, Retry, RetryPolicy, Store, StoreError, Summary};
use nightmail_types::{Address, Timestamp};
use tokio::sync::{mpsc, watch};

use crate::backend::{Backend, BackendError, Event, Outcome, Request};
use crate::compose::{Audience, Draft, Stats};
use crate::mail::Mail;

/// How often the worker looks for due jobs when none is waiting.
const POLL: Duration = Duration::from_millis(250);
/// How often streamed progress is saved to the store.
const SAVE_PROGRESS: Duration = Duration::from_secs(2);
/// Earlier thread messages given to the model, at most.
const MAX_THREAD: usize = 20;

/// The backend for each model address.
pub type Backends = HashMap<Address, Arc<dyn Backend>>;

/// Builds the backends the configuration names.
pub fn backends(config: &Config) -> Backends {
    let mut map = Backends::new();
    for model in &config.models {
        let backend: Arc<dyn Backend> = match &model.backend {
            nightmail_config::BackendConfig::OpenAi { url, model: name, api_key_env, timeout, retries } => {
                let key = api_key_env.as_ref().and_then(|var| std::env::var(var).ok());
                Arc::new(backend::openai::OpenAi::new(url, name, key, *timeout, *retries))
            }
            nightmail_config::BackendConfig::Local { .. } => {
                tracing::warn!(model = %model.address, "backend \"local\" is not built into this nightmail yet: its jobs will fail with a notice");
                Arc::new(Unavailable("the local engine is not available in this build".into()))
            }
        };
        map.insert(model.address.clone(), backend);
    }
    map
}

/// A backend that cannot run: every job fails for good with its reason.
struct Unavailable(String);

impl Backend for Unavailable {
    fn describe(&self) -> String {
        "unavailable".into()
    }

    fn generate<'a>(
        &'a self,
        _: &'a Request,
        _: mpsc::UnboundedSender<Event>,
        _: watch::Receiver<bool>,
    ) -> backend::BoxFuture<'a, Result<Outcome, BackendError>> {
        Box::pin(async move { Err(BackendError::Permanent(self.0.clone())) })
    }
}

#[derive(Clone)]
pub struct Worker {
    store: Store,
    config: Arc<Config>,
    backends: Arc<Backends>,
    policy: RetryPolicy,
}

impl Worker {
    pub fn new(store: Store, config: Arc<Config>, backends: Backends) -> Worker {
        let w = &config.worker;
        let policy = RetryPolicy { base: w.retry_base, max: w.retry_max, max_attempts: w.max_attempts };
        Worker { store, config, backends: Arc::new(backends), policy }
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Answers jobs until `stop` turns true, `concurrency` at a time.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let slots = self.config.worker.concurrency;
        let tasks: Vec<_> = (0..slots).map(|_| tokio::spawn(self.clone().run_one(stop.clone()))).collect();
        for task in tasks {
            let _ = task.await;
        }
    }

    async fn run_one(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            match self.store.lease_next(self.config.worker.lease).await {
                Ok(Some(leased)) => {
                    let id = leased.job().id;
                    if let Err(e) = self.process(leased, stop.clone()).await {
                        tracing::error!(job = %id, "job ended with a store error: {e}");
                    }
                }
                Ok(None) => {
                    tokio::select! {
                        _ = tokio::time::sleep(POLL) => {}
                        _ = stop.changed() => {}
                    }
                }
                Err(e) => {
                    tracing::error!("cannot take a job from the queue: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn is_model(&self, address: &Address) -> bool {
        self.config.model(address).is_some()
    }

    /// Runs one leased job to its end: done with a reply, retried later, or failed with a notice.
    async fn process(&self, leased: LeasedJob, stop: watch::Receiver<bool>) -> Result<(), StoreError> {
        let job = leased.job().clone();
        let Some(model) = self.config.model(&job.model).cloned() else {
            let reason = format!("{} is no longer a model address in the configuration", job.model);
            return self.give_up(leased, &reason, None).await;
        };
        let Some(raw) = self.store.message(job.message)? else {
            return self.give_up(leased, "the stored message is missing", None).await;
        };
        let question = match mail::parse(&raw) {
            Ok(m) => m,
            Err(e) => {
                let notice = self.notice(&job, &model, None, &format!("your message could not be read: {e}"))?;
                return self.give_up(leased, &e.to_string(), notice).await;
            }
        };
        if let Some(reason) = self.refusal(&job, &question)? {
            tracing::info!(job = %job.id, "not answering: {reason}");
            return self.give_up(leased, &format!("not answered: {reason}"), None).await;
        }

        let thread = self.thread(&question, job.sender.as_ref())?;
        let conversation = conversation::build(model.system_prompt.as_deref(), &thread, &question, |a| self.is_model(a));
        let options = &conversation.options;
        let request = Request {
            turns: conversation.turns.clone(),
            max_tokens: options.max_tokens.unwrap_or(model.max_tokens),
            temperature: options.temperature.unwrap_or(model.temperature),
            reasoning: options.reasoning.or(model.reasoning.then_some(true)),
            model: options.model.clone(),
        };
        let backend = self.backends.get(&job.model).cloned().expect("every model address has a backend");
        let started = Instant::now();
        let Some((leased, result)) = self.generate(leased, backend.as_ref(), &request, stop).await? else {
            return Ok(());
        };
        match result {
            Ok(outcome) => {
                let mut notes = Vec::new();
                if !options.unknown.is_empty() {
                    notes.push(format!("Options not understood and ignored: {}", options.unknown.join(", ")));
                }
                if outcome.finish_reason == "length" {
                    notes.push(format!(
                        "The answer stopped at the length limit ({} tokens); ask again with @max-tokens N for more.",
                        request.max_tokens
                    ));
                }
                let stats = Stats {
                    model_address: &model.address,
                    backend: backend.describe(),
                    outcome: &outcome,
                    wall: started.elapsed(),
                    job: job.id.0,
                };
                let (body, headers) = compose::answer(&stats, &notes);
                let attachment = (model.reasoning_output == ReasoningOutput::Attach && !outcome.reasoning.trim().is_empty())
                    .then(|| ("reasoning.txt", outcome.reasoning.clone()));
                let reply = self.reply(&job, &model, &question, body, headers, attachment)?;
                let (done, receipt) = self.store.finish(leased, Finish::Done { reply }, &self.policy).await?;
                tracing::info!(job = %done.id, tokens = outcome.output_tokens, delivered = ?receipt.map(|r| r.mail.len()), "answered");
                Ok(())
            }
            Err(BackendError::Stopped) => {
                // Shutdown: leave the lease to expire or to start-up recovery; the job runs again.
                Ok(())
            }
            Err(e) => {
                let retry = if matches!(e, BackendError::Permanent(_)) { Retry::Permanent } else { Retry::Transient };
                let tries = leased.job().attempts;
                let why = format!("{e} (attempt {tries} of {})", self.policy.max_attempts);
                let notice = self.notice(&job, &model, Some(&question), &why)?;
                let (job, _) =
                    self.store.finish(leased, Finish::Failed { reason: e.to_string(), retry, notice }, &self.policy).await?;
                tracing::warn!(job = %job.id, state = job.state.name(), "attempt failed: {e}");
                Ok(())
            }
        }
    }

    /// Streams the backend's answer, saving progress and renewing the lease as it comes. Returns
    /// the lease with the result, or `None` if the lease was lost (the job was cancelled or taken
    /// over).
    async fn generate(
        &self,
        mut leased: LeasedJob,
        backend: &dyn Backend,
        request: &Request,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Option<(LeasedJob, Result<Outcome, BackendError>)>, StoreError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let (halt_tx, halt) = watch::channel(false);
        let generation = backend.generate(request, events_tx, halt);
        tokio::pin!(generation);
        let mut progress = Progress::default();
        let mut last_save = Instant::now();
        let mut last_renew = Instant::now();
        let lease = self.config.worker.lease;
        let result = loop {
            tokio::select! {
                result = &mut generation => break result,
                Some(event) = events.recv() => {
                    match event {
                        Event::Content(t) => {
                            progress.output_tokens += 1;
                            progress.partial_text.push_str(&t);
                        }
                        Event::Reasoning(_) => progress.reasoning_tokens += 1,
                    }
                    if last_save.elapsed() >= SAVE_PROGRESS {
                        progress.updated_at = Timestamp::now();
                        if let Err(e) = self.store.record_progress(&mut leased, progress.clone()).await {
                            let _ = halt_tx.send(true);
                            return lost(e);
                        }
                        last_save = Instant::now();
                    }
                }
                _ = tokio::time::sleep(lease / 3), if last_renew.elapsed() >= lease / 3 => {}
                _ = stop.changed() => { let _ = halt_tx.send(true); }
            }
            if last_renew.elapsed() >= lease / 3 {
                if let Err(e) = self.store.renew(&mut leased, lease).await {
                    let _ = halt_tx.send(true);
                    return lost(e);
                }
                last_renew = Instant::now();
            }
        };
        Ok(Some((leased, result)))
    }

    /// Why this message must not be answered, if so: loop rules, then the per-sender limit.
    fn refusal(&self, job: &Job, question: &Mail) -> Result<Option<String>, StoreError> {
        let signs = loop_guard::Signs {
            envelope_sender: job.sender.as_ref(),
            from: question.from.iter().map(|p| p.address.clone()).collect(),
            auto_submitted: question.auto_submitted.as_deref(),
            precedence: question.precedence.as_deref(),
            list_unsubscribe: question.list_unsubscribe,
            list_id: question.list_id,
            auto_response_suppress: question.auto_response_suppress.as_deref(),
        };
        if let Some(reason) = loop_guard::refuse(&signs, |a| self.is_model(a)) {
            return Ok(Some(reason));
        }
        let limit = self.config.worker.max_replies_per_sender_per_hour;
        let hour_ago = Timestamp(Timestamp::now().0.saturating_sub(3_600_000));
        let recent = self
            .store
            .jobs()?
            .iter()
            .filter(|j| j.id != job.id && j.sender == job.sender && j.reply.is_some())
            .filter(|j| matches!(j.state, JobState::Done { at } | JobState::Failed { at, .. } if at >= hour_ago))
            .count();
        if recent as u32 >= limit {
            return Ok(Some(format!("{recent} replies to this sender in the last hour (limit {limit})")));
        }
        Ok(None)
    }

    /// The earlier messages of the question's thread that its sender took part in, oldest first.
    fn thread(&self, question: &Mail, sender: Option<&Address>) -> Result<Vec<Mail>, StoreError> {
        let Some(sender) = sender else { return Ok(Vec::new()) };
        let mut ids: Vec<&String> = question.references.iter().collect();
        for id in &question.in_reply_to {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let mut thread = Vec::new();
        for id in ids.iter().rev().take(MAX_THREAD).rev() {
            let Some(key) = self.store.find_by_message_id(id, sender)? else { continue };
            let Some(raw) = self.store.message(key)? else { continue };
            if let Ok(mail) = mail::parse(&raw) {
                thread.push(mail);
            }
        }
        Ok(thread)
    }

    /// A message from the model to the question's audience.
    fn reply(
        &self,
        job: &Job,
        model: &Model,
        question: &Mail,
        body: String,
        headers: Vec<(&'static str, String)>,
        attachment: Option<(&'static str, String)>,
    ) -> Result<Incoming, StoreError> {
        let audience = Audience::reply_all(question, job.sender.as_ref(), |a| self.is_model(a));
        let message_id = compose::new_message_id("reply", job.id.0, &self.config.hostname);
        let name = model.name.clone().unwrap_or_else(|| model.address.local_part().to_string());
        let subject = compose::reply_subject(&question.subject);
        let raw = compose::write(Draft {
            from: (&name, &model.address),
            audience: &audience,
            subject: subject.clone(),
            message_id: message_id.clone(),
            parent: question,
            body,
            headers,
            attachment,
        });
        Ok(self.outgoing(job, model, &name, raw, &audience, subject, message_id)?)
    }

    /// A failure notice to the asker, threaded under the question when it could be read.
    fn notice(&self, job: &Job, model: &Model, question: Option<&Mail>, why: &str) -> Result<Option<Incoming>, StoreError> {
        let fallback = Mail { subject: job.subject.clone(), message_id: Some(job.message_id.clone()).filter(|s| !s.is_empty()), ..Mail::default() };
        let question = question.unwrap_or(&fallback);
        let audience = match &job.sender {
            Some(sender) => Audience { to: vec![mail::Person { address: sender.clone(), name: None }], cc: Vec::new() },
            None => return Ok(None),
        };
        if self.is_model(&audience.to[0].address) {
            return Ok(None);
        }
        let message_id = compose::new_message_id("failure", job.id.0, &self.config.hostname);
        let name = model.name.clone().unwrap_or_else(|| model.address.local_part().to_string());
        let subject = compose::reply_subject(&question.subject);
        let body = format!(
            "Your question could not be answered.\n\nReason: {why}\n\nJob {} for {}, received {}. Send the question again to retry.\n\n-- \nnightmail\n",
            job.id,
            model.address,
            job.created_at.0 / 1000,
        );
        let raw = compose::write(Draft {
            from: (&name, &model.address),
            audience: &audience,
            subject: subject.clone(),
            message_id: message_id.clone(),
            parent: question,
            body,
            headers: vec![("X-Nightmail-Job", job.id.to_string()), ("X-Nightmail-Failure", why.to_string())],
            attachment: None,
        });
        Ok(Some(self.outgoing(job, model, &name, raw, &audience, subject, message_id)?))
    }

    #[allow(clippy::too_many_arguments)]
    fn outgoing(
        &self,
        _job: &Job,
        model: &Model,
        name: &str,
        raw: Vec<u8>,
        audience: &Audience,
        subject: String,
        message_id: String,
    ) -> Result<Incoming, StoreError> {
        let recipients = audience
            .everyone()
            .filter(|p| !self.is_model(&p.address))
            .map(|p| match self.config.user_by_address(&p.address) {
                Some(user) => Recipient::User { user: user.name.clone(), address: p.address.clone() },
                None => Recipient::Remote { address: p.address.clone() },
            })
            .collect();
        Ok(Incoming {
            key: self.store.new_message_key()?,
            raw,
            sender: Some(model.address.clone()),
            recipients,
            summary: Summary { from: format!("{name} <{}>", model.address), subject, message_id: message_id.clone() },
            dedupe_id: message_id,
        })
    }

    /// Ends the job for good with `reason`, delivering `notice` if any.
    async fn give_up(&self, leased: LeasedJob, reason: &str, notice: Option<Incoming>) -> Result<(), StoreError> {
        let finish = Finish::Failed { reason: reason.to_string(), retry: Retry::Permanent, notice };
        self.store.finish(leased, finish, &self.policy).await?;
        Ok(())
    }
}

/// A store error while generating: a lost lease ends the attempt quietly (`None`); anything else
/// is an error.
fn lost<T>(e: StoreError) -> Result<Option<T>, StoreError> {
    match e {
        StoreError::LeaseLost(id) => {
            tracing::info!(job = %id, "lease lost (cancelled or taken over): stopping this attempt");
            Ok(None)
        }
        other => Err(other),
    }
}
