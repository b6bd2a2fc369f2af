//! The worker: takes a job from the queue (a lease, never a pop), turns its mail thread into a
//! conversation, runs the model's backend, and delivers a threaded reply, atomically with marking
//! the job done. Loops are refused, failures retried with backoff, and a job that finally fails
//! sends its asker a notice: never silence.

pub mod ask;
pub mod backend;
pub mod checkpoints;
pub mod compose;
pub mod control;
pub mod conversation;
pub mod cost;
pub mod fit;
pub mod html;
pub mod loop_guard;
pub mod mail;
pub mod options;
pub mod outlet;
pub mod progress;
pub mod text;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightmail_config::{Config, Model, ReasoningOutput};
use nightmail_store::{
    Finish, Incoming, Job, JobState, LeasedJob, Origin, Progress, Retry, RetryPolicy, Store, StoreError, Summary,
};
use nightmail_types::{Address, Timestamp};
use tokio::sync::{mpsc, watch};

use crate::backend::{Backend, BackendError, Event, Outcome, Request};
use crate::compose::{Audience, Body, Draft, Stats};
use crate::cost::EnergyMeter;
use crate::mail::Mail;

/// How often the worker looks for due jobs when none is waiting.
const POLL: Duration = Duration::from_millis(250);
/// How often streamed progress is saved to the store.
const SAVE_PROGRESS: Duration = Duration::from_secs(2);
/// Earlier thread messages given to the model, at most.
const MAX_THREAD: usize = 20;
/// Times a prompt is fitted again to a context the server named on refusing it, per attempt.
const MAX_REFITS: u32 = 2;

/// The retry policy the configuration's `[worker]` section describes.
pub fn retry_policy(worker: &nightmail_config::WorkerConfig) -> RetryPolicy {
    RetryPolicy { base: worker.retry_base, max: worker.retry_max, max_attempts: worker.max_attempts }
}

/// The backend for each model address.
pub type Backends = HashMap<Address, Arc<dyn Backend>>;

/// Builds the backends the configuration names.
pub fn backends(config: &Config) -> Backends {
    config.models.iter().map(|model| (model.address.clone(), backend_for(model, &config.data_dir))).collect()
}

fn backend_for(model: &Model, data_dir: &std::path::Path) -> Arc<dyn Backend> {
    match &model.backend {
        nightmail_config::BackendConfig::OpenAi { url, model: name, api_key_env, timeout, retries } => {
            let key = api_key_env.as_ref().and_then(|var| std::env::var(var).ok());
            Arc::new(backend::openai::OpenAi::new(url, name, key, *timeout, *retries))
        }
        nightmail_config::BackendConfig::Local(local) => {
            Arc::new(backend::local::Local::new(local.clone(), checkpoints::states_dir(data_dir)))
        }
    }
}

/// What a job runs with: the configuration and each model's backend as they were when it
/// started. SIGHUP sends a new one (`Setup::reload`); a running job keeps its own.
#[derive(Clone)]
pub struct Setup {
    pub config: Arc<Config>,
    pub backends: Arc<Backends>,
}

impl Setup {
    pub fn new(config: Arc<Config>) -> Setup {
        let backends = Arc::new(backends(&config));
        Setup { config, backends }
    }

    /// The setup for a reloaded configuration `new`. A model whose backend settings did not
    /// change keeps its backend (a local engine keeps its loaded weights); a changed or new one
    /// gets a new backend. A removed model stays with the worker, listed after the configured
    /// ones, so jobs queued for it before the reload (or by an SMTP session that began before
    /// it) are still answered; the servers, given `new`, take no more mail for it. It goes at
    /// the next restart, or when the configuration names its address again.
    pub fn reload(&self, new: &Config) -> Setup {
        let mut config = new.clone();
        let retired = self.config.models.iter().filter(|m| {
            new.model(&m.address).is_none()
                && new.user_by_address(&m.address).is_none()
                && new.bridge(&m.address).is_none()
        });
        config.models.extend(retired.cloned());
        let mut map = Backends::new();
        for model in &config.models {
            let old = self.config.model(&model.address).filter(|old| old.backend == model.backend);
            let backend = match old.and_then(|old| self.backends.get(&old.address)) {
                Some(backend) => backend.clone(),
                None => backend_for(model, &config.data_dir),
            };
            map.insert(model.address.clone(), backend);
        }
        Setup { config: Arc::new(config), backends: Arc::new(map) }
    }
}

#[derive(Clone)]
pub struct Worker {
    store: Store,
    config: Arc<Config>,
    backends: Arc<Backends>,
    policy: RetryPolicy,
    /// Where SIGHUP announces a new setup; each job and triage pass takes the latest.
    live: Option<watch::Receiver<Setup>>,
}

impl Worker {
    pub fn new(store: Store, config: Arc<Config>, backends: Backends) -> Worker {
        let policy = retry_policy(&config.worker);
        Worker { store, config, backends: Arc::new(backends), policy, live: None }
    }

    /// A worker that takes each job's models from the latest setup sent on `live`. The
    /// `[worker]` section (slots, lease, retries) is the first setup's: it needs a restart.
    pub fn reloading(store: Store, live: watch::Receiver<Setup>) -> Worker {
        let Setup { config, backends } = live.borrow().clone();
        let policy = retry_policy(&config.worker);
        Worker { store, config, backends, policy, live: Some(live) }
    }

    /// This worker with the latest setup: what a job that starts now runs with, to its end.
    fn current(&self) -> Worker {
        let mut worker = self.clone();
        if let Some(live) = &self.live {
            let Setup { config, backends } = live.borrow().clone();
            (worker.config, worker.backends) = (config, backends);
        }
        worker
    }

    /// Answers jobs until `stop` turns true, `concurrency` at a time.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        match checkpoints::sweep(&self.config.data_dir, &self.store) {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} checkpoint(s) of jobs that had ended"),
            Err(e) => tracing::warn!("cannot sweep checkpoints: {e}"),
        }
        match self.store.sweep_progress_mail().await {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} In Progress message(s) of jobs that had ended"),
            Err(e) => tracing::warn!("cannot sweep the In Progress mailboxes: {e}"),
        }
        let slots = self.config.worker.concurrency;
        let mut tasks: Vec<_> = (0..slots).map(|_| tokio::spawn(self.clone().run_one(stop.clone()))).collect();
        if slots > 0 {
            tasks.push(tokio::spawn(self.clone().concierge(stop.clone())));
        }
        for task in tasks {
            let _ = task.await;
        }
    }

    async fn run_one(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            match self.store.lease_next(self.config.worker.lease).await {
                Ok(Some(leased)) => {
                    let id = leased.job().id;
                    if let Err(e) = self.current().process(leased, stop.clone()).await {
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

    /// A model's address, or a bridge's (a model's voice at a provider): never answered, never
    /// written to, its turns in a thread are the assistant's.
    fn is_model(&self, address: &Address) -> bool {
        self.config.model(address).is_some() || self.config.bridge(address).is_some()
    }

    /// Runs one leased job to its end: done with a reply, retried later, or failed with a notice.
    async fn process(&self, leased: LeasedJob, stop: watch::Receiver<bool>) -> Result<(), StoreError> {
        let job = leased.job().clone();
        let Some(model) = self.config.model(&job.model).cloned() else {
            // Removed from the configuration while the question waited (a restart; a SIGHUP keeps
            // removed models until then): the asker learns it from the address they wrote to.
            let reason = format!("{} is no longer a model address in the configuration", job.model);
            let author = outlet::Author { address: &job.model, name: None };
            let notice = self.notice(&job, author, None, &reason)?;
            return self.give_up(leased, &reason, notice).await;
        };
        if job.attempts > self.policy.max_attempts {
            // Leased again after `max_attempts` interrupted attempts (crashes, kills, power cuts):
            // end it with a notice before reading the message, which may be what crashes us.
            let reason = format!("interrupted {} times without finishing", job.attempts - 1);
            let notice = self.notice(&job, (&model).into(), None, &reason)?;
            return self.give_up(leased, &reason, notice).await;
        }
        let Some(raw) = self.store.message(job.message)? else {
            return self.give_up(leased, "the stored message is missing", None).await;
        };
        let question = match mail::parse(&raw) {
            Ok(m) => m,
            Err(e) => {
                let notice =
                    self.notice(&job, (&model).into(), None, &format!("your message could not be read: {e}"))?;
                return self.give_up(leased, &e.to_string(), notice).await;
            }
        };
        if let Some(refusal) = self.refusal(&job, &question)? {
            let (reason, notice) = match refusal {
                // Automatic mail gets no answer and no notice: a notice is mail too, and would loop.
                Refusal::Automatic(reason) => (reason, None),
                // A person over the rate limit learns why, once per refused question (to them alone).
                Refusal::RateLimited(reason) => {
                    let why = format!("{reason}; send it again later");
                    (reason, self.notice(&job, (&model).into(), Some(&question), &why)?)
                }
            };
            tracing::info!(job = %job.id, "not answering: {reason}");
            return self.give_up(leased, &format!("not answered: {reason}"), notice).await;
        }
        if let Some(command) = command_in(&job, &question) {
            return self.command(leased, &model, &question, command).await;
        }
        if !job.triaged {
            let ack = self.acknowledgement(&job, &model, &question)?;
            self.store.triage(job.id, ack).await?;
        }

        let backend = self.backends.get(&job.model).cloned().expect("every model address has a backend");
        let system_prompt = model.system_prompt.as_deref();
        let converse = |thread: &[Mail], question: &Mail| match (job.origin, job.sender.as_ref()) {
            (Origin::Ask, Some(asker)) => ask::build(system_prompt, thread, question, asker, |a| self.is_model(a)),
            _ => conversation::build(system_prompt, thread, question, |a| self.is_model(a)),
        };
        let request_of = |conversation: &conversation::Conversation| {
            let options = &conversation.options;
            Request {
                turns: conversation.turns.clone(),
                max_tokens: options.max_tokens.unwrap_or(model.max_tokens),
                temperature: options.temperature.unwrap_or(model.temperature),
                reasoning: options.reasoning.or(model.reasoning.then_some(true)),
                model: options.model.clone(),
                checkpoint: Some(checkpoints::path(&self.config.data_dir, job.id)),
            }
        };
        let meter = EnergyMeter::start();
        let started = Instant::now();
        // Only an asker with an account here has an In Progress mailbox (not a bridge's outside asker).
        let owner = job.sender.as_ref().and_then(|s| self.config.user_by_address(s)).map(|u| u.name.clone());
        let asked = Asked { job: &job, model: &model, question: &question };
        let mut schedule = progress::Schedule::new(&model, owner, started);
        let whole_thread = self.thread(&question, job.sender.as_ref())?;
        let build = |thread: &[Mail], question: &Mail| request_of(&converse(thread, question));
        let mut leased = leased;
        let mut refits = 0;
        // Estimated prompt lengths times this: raised when a server counts a refused prompt longer.
        let mut scale = 1.0;
        let (leased, result, left_out, conversation, request) = loop {
            // The prompt is fitted to the model's context from the question as read; the reply is
            // threaded under the question as it came.
            let (mut thread, mut fitted) = (whole_thread.clone(), question.clone());
            let context = model.context_tokens;
            let left_out = match fit::fit(backend.as_ref(), context, scale, &mut thread, &mut fitted, build).await {
                Ok(left_out) => left_out,
                Err(too_long) => {
                    let why = too_long.to_string();
                    tracing::info!(job = %job.id, "not answering: {why}");
                    let notice = self.notice(&job, (&model).into(), Some(&question), &why)?;
                    return self.give_up(leased, &why, notice).await;
                }
            };
            let conversation = converse(&thread, &fitted);
            let request = request_of(&conversation);
            let Some((back, result)) =
                self.generate(leased, backend.as_ref(), &request, stop.clone(), &asked, &mut schedule).await?
            else {
                // The lease was lost: cancelled (the checkpoint has no use now) or taken over.
                if !self.store.job(job.id)?.is_some_and(|j| checkpoints::live(&j.state)) {
                    checkpoints::remove(&self.config.data_dir, job.id);
                }
                return Ok(());
            };
            match result {
                // The server named a context the prompt did not fit: fitted to it, asked again now.
                Err(BackendError::ContextExceeded { context, prompt_tokens, .. }) if refits < MAX_REFITS => {
                    tracing::info!(job = %job.id, context, "the server's context is smaller: fitting the prompt to it");
                    // The server counted at least one token over its context; where our estimate
                    // said less, later estimates are scaled up to its count.
                    let counted = prompt_tokens.unwrap_or(context + 1) as f64;
                    scale = f64::max(scale, counted / backend::estimate_tokens(&request.turns).max(1) as f64);
                    refits += 1;
                    leased = back;
                }
                result => break (back, result, left_out, conversation, request),
            }
        };
        let options = &conversation.options;
        match result {
            Ok(outcome) => {
                let mut notes = Vec::new();
                if !options.unknown.is_empty() {
                    notes.push(format!("Options not understood and ignored: {}", options.unknown.join(", ")));
                }
                notes.extend(left_out.note());
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
                    energy: meter.finish(started.elapsed(), model.cost.watts),
                    api_price: model.cost.api_price,
                };
                let (body, headers) = compose::answer(&stats, &notes);
                let attachment = (model.reasoning_output == ReasoningOutput::Attach
                    && !outcome.reasoning.trim().is_empty())
                .then(|| ("reasoning.txt", outcome.reasoning.clone()));
                let reply = self.message(&job, &model, &question, body, headers, attachment, None)?;
                let mut leased = leased;
                let totals = Progress {
                    prompt_tokens: outcome.prompt_tokens.unwrap_or(0),
                    output_tokens: outcome.output_tokens,
                    reasoning_tokens: outcome.reasoning_tokens,
                    partial_text: String::new(),
                    updated_at: Timestamp::now(),
                    checkpoint_tokens: 0,
                    max_tokens: u64::from(request.max_tokens),
                    engine: None,
                };
                self.store.record_progress(&mut leased, totals).await?;
                let (done, receipt) = self.store.finish(leased, Finish::Done { reply }, &self.policy).await?;
                // Delivered: the checkpoint has done its work (a crash before this line leaves it
                // to the start-up sweep).
                checkpoints::remove(&self.config.data_dir, done.id);
                tracing::info!(job = %done.id, tokens = outcome.output_tokens, delivered = ?receipt.map(|r| r.mail.len()), "answered");
                Ok(())
            }
            Err(BackendError::Stopped) => {
                // Shutdown: leave the lease to expire or to start-up recovery; the job runs again.
                Ok(())
            }
            Err(e) => {
                let retry = match e {
                    BackendError::Permanent(_) | BackendError::ContextExceeded { .. } => Retry::Permanent,
                    _ => Retry::Transient,
                };
                let tries = leased.job().attempts;
                let why = format!("{e} (attempt {tries} of {})", self.policy.max_attempts);
                let notice = self.notice(&job, (&model).into(), Some(&question), &why)?;
                let (job, _) = self
                    .store
                    .finish(leased, Finish::Failed { reason: e.to_string(), retry, notice }, &self.policy)
                    .await?;
                if !checkpoints::live(&job.state) {
                    checkpoints::remove(&self.config.data_dir, job.id);
                }
                tracing::warn!(job = %job.id, state = job.state.name(), "attempt failed: {e}");
                Ok(())
            }
        }
    }

    /// Looks at newly queued jobs while the answering tasks are busy: answers commands (`status`,
    /// `cancel`) at once and acknowledges questions, so neither waits behind a days-long answer.
    async fn concierge(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            if let Err(e) = self.current().triage_queue().await {
                tracing::error!("concierge: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL * 2) => {}
                _ = stop.changed() => {}
            }
        }
    }

    async fn triage_queue(&self) -> Result<(), StoreError> {
        // The store's index of untriaged jobs: this runs every second, and must not read history.
        for job in self.store.untriaged_jobs()? {
            if job.triaged || !matches!(job.state, JobState::Queued { .. }) {
                continue;
            }
            let (Some(model), Some(raw)) = (self.config.model(&job.model).cloned(), self.store.message(job.message)?)
            else {
                self.store.triage(job.id, None).await?;
                continue;
            };
            let Ok(question) = mail::parse(&raw) else {
                self.store.triage(job.id, None).await?;
                continue;
            };
            if self.refusal(&job, &question)?.is_some() {
                self.store.triage(job.id, None).await?;
                continue;
            }
            if let Some(command) = command_in(&job, &question) {
                if let Some(leased) = self.store.lease(job.id, self.config.worker.lease).await? {
                    self.command(leased, &model, &question, command).await?;
                }
                continue;
            }
            let ack = self.acknowledgement(&job, &model, &question)?;
            self.store.triage(job.id, ack).await?;
        }
        Ok(())
    }

    /// The acknowledgement of a new question, if the model sends them.
    fn acknowledgement(&self, job: &Job, model: &Model, question: &Mail) -> Result<Option<Incoming>, StoreError> {
        // An Ask job was acknowledged by the IMAP command's OK, which names it.
        if !model.ack || job.sender.is_none() || job.origin == Origin::Ask {
            return Ok(None);
        }
        let jobs = self.store.jobs()?;
        let ahead = jobs
            .iter()
            .filter(|j| j.model == job.model && j.id != job.id && j.created_at <= job.created_at)
            .filter(|j| matches!(j.state, JobState::Queued { .. } | JobState::Running { .. }))
            .count();
        let when = match Pace::of(&jobs, &job.model) {
            None if ahead == 0 => "It is next in the queue.".to_string(),
            None => format!("{ahead} question(s) are ahead of it; there is no timing yet to estimate from."),
            Some(pace) => {
                let own = pace.answer();
                let wait: Duration = jobs
                    .iter()
                    .filter(|j| j.model == job.model && j.id != job.id && j.created_at <= job.created_at)
                    .filter_map(|j| match j.state {
                        JobState::Queued { .. } => Some(pace.answer()),
                        JobState::Running { .. } => Some(pace.rest(j)),
                        _ => None,
                    })
                    .sum();
                let rate = format!("at {:.2} s/token, the pace of recent answers", pace.s_per_token);
                if ahead == 0 {
                    format!("It is next; it should take about {} ({rate}).", human_duration(own))
                } else {
                    format!(
                        "{ahead} question(s) are ahead of it: it should start in about {} and take about {} ({rate}).",
                        human_duration(wait),
                        human_duration(own)
                    )
                }
            }
        };
        let body = format!(
            "Your question \"{}\" is queued for {} as job {}.\n{when}\n\nReply to this message with \"cancel\" to cancel it, or send a message with the subject \"status\" to see the queue.\n\n-- \nnightmail\n",
            question.subject, model.address, job.id
        );
        let message_id = control::ack_message_id(job.id, &self.config.hostname);
        let headers = vec![("X-Nightmail-Job", job.id.to_string())];
        self.message(job, model, question, Body::Plain(body), headers, None, Some(message_id)).map(Some)
    }

    /// Answers a command mail and ends its job.
    async fn command(
        &self,
        leased: LeasedJob,
        model: &Model,
        question: &Mail,
        command: control::Command,
    ) -> Result<(), StoreError> {
        let job = leased.job().clone();
        let text = match command {
            control::Command::Status => self.status_text(&job)?,
            control::Command::Cancel { target, ack_id } => match self.store.job(target)? {
                Some(t) if t.ack.as_deref() == Some(ack_id.as_str()) && t.sender == job.sender => {
                    let after = self.store.cancel(target).await?;
                    if !checkpoints::live(&after.state) {
                        checkpoints::remove(&self.config.data_dir, target);
                    }
                    match after.state {
                        JobState::Cancelled { .. } => {
                            format!("Cancelled job {target} (\"{}\"). No answer will be sent.", t.subject)
                        }
                        other => format!(
                            "Job {target} (\"{}\") had already ended ({}); nothing to cancel.",
                            t.subject,
                            other.name()
                        ),
                    }
                }
                _ => format!("There is no question of yours to cancel behind {ack_id}."),
            },
        };
        let body = format!("{text}\n\n-- \nnightmail\n");
        let reply = self.message(
            &job,
            model,
            question,
            Body::Plain(body),
            vec![("X-Nightmail-Job", job.id.to_string())],
            None,
            None,
        )?;
        self.store.finish(leased, Finish::Done { reply }, &self.policy).await?;
        Ok(())
    }

    fn status_text(&self, job: &Job) -> Result<String, StoreError> {
        let jobs = self.store.jobs()?;
        let pace = Pace::of(&jobs, &job.model);
        let now = Timestamp::now();
        let mut mine = Vec::new();
        let mut others = 0;
        for j in jobs
            .iter()
            .filter(|j| j.id != job.id && matches!(j.state, JobState::Queued { .. } | JobState::Running { .. }))
        {
            if j.sender == job.sender {
                let mut progress =
                    j.progress.as_ref().map(|p| format!(", {} tokens so far", p.output_tokens)).unwrap_or_default();
                if let (JobState::Running { .. }, Some(pace)) = (&j.state, &pace) {
                    progress.push_str(&format!(", about {} left", human_duration(pace.rest(j))));
                }
                mine.push(format!(
                    "  job {}  {}  \"{}\" to {}, {} old{progress}",
                    j.id,
                    j.state.name(),
                    j.subject,
                    j.model,
                    human_duration(now.since(j.created_at))
                ));
            } else {
                others += 1;
            }
        }
        let mut text = String::from("The queue now:\n\n");
        if mine.is_empty() {
            text.push_str("You have no questions waiting or being answered.\n");
        } else {
            text.push_str("Your questions:\n");
            text.push_str(&mine.join("\n"));
            text.push('\n');
        }
        text.push_str(&format!("Other people's questions waiting or being answered: {others}\n"));
        if let Some(p) = &pace {
            text.push_str(&format!(
                "Answers from {} lately: about {:.0} tokens at {:.2} s/token, {} each.\n",
                job.model,
                p.tokens_per_answer,
                p.s_per_token,
                human_duration(p.answer())
            ));
        }
        Ok(text)
    }

    /// Streams the backend's answer, saving progress and renewing the lease as it comes. Returns
    /// the lease with the result, or `None` if the lease was lost (the job was cancelled or taken
    /// over).
    #[allow(clippy::too_many_arguments)]
    async fn generate(
        &self,
        mut leased: LeasedJob,
        backend: &dyn Backend,
        request: &Request,
        mut stop: watch::Receiver<bool>,
        asked: &Asked<'_>,
        schedule: &mut progress::Schedule,
    ) -> Result<Option<(LeasedJob, Result<Outcome, BackendError>)>, StoreError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let (halt_tx, halt) = watch::channel(false);
        let generation = backend.generate(request, events_tx, halt);
        tokio::pin!(generation);
        let mut progress = Progress { max_tokens: u64::from(request.max_tokens), ..Progress::default() };
        let mut last_save = Instant::now();
        let mut save_now = false;
        let mut last_renew = Instant::now();
        let lease = self.config.worker.lease;
        if let Err(e) = self.show_progress(&mut leased, asked, schedule, &progress).await {
            let _ = halt_tx.send(true);
            return lost(e);
        }
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
                        Event::Engine(figures) => progress.engine = Some(figures),
                        Event::Checkpoint { tokens, .. } => {
                            progress.checkpoint_tokens = tokens;
                            // Saved at once, so `status` shows what a restart would keep.
                            save_now = true;
                        }
                    }
                    if save_now || last_save.elapsed() >= SAVE_PROGRESS {
                        save_now = false;
                        progress.updated_at = Timestamp::now();
                        if let Err(e) = self.store.record_progress(&mut leased, progress.clone()).await {
                            let _ = halt_tx.send(true);
                            return lost(e);
                        }
                        last_save = Instant::now();
                    }
                    if let Err(e) = self.show_progress(&mut leased, asked, schedule, &progress).await {
                        let _ = halt_tx.send(true);
                        return lost(e);
                    }
                }
                _ = tokio::time::sleep_until((last_renew + lease / 3).into()) => {}
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

    /// Files the job's `In Progress` message and sends its progress mail, each when due. Only a
    /// lost lease stops the answer; a store that cannot take them now is told again next time.
    async fn show_progress(
        &self,
        leased: &mut LeasedJob,
        asked: &Asked<'_>,
        schedule: &mut progress::Schedule,
        progress: &Progress,
    ) -> Result<(), StoreError> {
        let shown: Result<(), StoreError> = async {
            let (job, model, question) = (asked.job, asked.model, asked.question);
            let Some(asker) = job.sender.as_ref().filter(|a| !self.is_model(a)) else { return Ok(()) };
            if let Some(owner) = schedule.owner.clone().filter(|_| schedule.filing_due(progress)) {
                let page =
                    self.to_asker(job, model, question, asker, progress::page(progress, job.id.0), "progress")?;
                self.store.file_progress(leased, &owner, &page.raw).await?;
                schedule.filed(progress);
            }
            if schedule.mail_due() {
                let text = progress::mail(progress, job.id.0);
                let mail = self.to_asker(job, model, question, asker, text, "progress-mail")?;
                self.store.deliver(&mail).await?;
                schedule.mailed();
            }
            Ok(())
        }
        .await;
        match shown {
            Err(StoreError::LeaseLost(id)) => Err(StoreError::LeaseLost(id)),
            Err(e) => {
                tracing::warn!(job = %asked.job.id, "cannot show the answer so far: {e}");
                // Tried again an interval later, not at the next token.
                schedule.filed(progress);
                schedule.mailed();
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// A message from the model to the asker alone, threaded under the question.
    #[allow(clippy::too_many_arguments)]
    fn to_asker(
        &self,
        job: &Job,
        model: &Model,
        question: &Mail,
        asker: &Address,
        text: String,
        kind: &str,
    ) -> Result<Incoming, StoreError> {
        let audience = Audience { to: vec![mail::Person { address: asker.clone(), name: None }], cc: Vec::new() };
        let message_id = compose::new_message_id(kind, job.id.0, &self.config.hostname);
        let headers = vec![("X-Nightmail-Job", job.id.to_string())];
        self.outgoing(model.into(), job, &audience, question, Body::Plain(text), headers, None, message_id)
    }

    /// Why this message must not be answered, if so: loop rules (not for an Ask job: the user
    /// asked about this message on purpose, and the answer goes to them alone), then the
    /// per-sender limit.
    fn refusal(&self, job: &Job, question: &Mail) -> Result<Option<Refusal>, StoreError> {
        let signs = loop_guard::Signs {
            envelope_sender: job.sender.as_ref(),
            from: question.from.iter().map(|p| p.address.clone()).collect(),
            auto_submitted: question.auto_submitted.as_deref(),
            precedence: question.precedence.as_deref(),
            list_unsubscribe: question.list_unsubscribe,
            list_id: question.list_id,
            auto_response_suppress: question.auto_response_suppress.as_deref(),
        };
        if job.origin == Origin::Mail
            && let Some(reason) = loop_guard::refuse(&signs, |a| self.is_model(a))
        {
            return Ok(Some(Refusal::Automatic(reason)));
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
            return Ok(Some(Refusal::RateLimited(format!(
                "{recent} replies to this sender in the last hour (limit {limit})"
            ))));
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

    /// A message from the model to the question's audience (reply-all; the asker alone for an Ask
    /// job), threaded under it.
    #[allow(clippy::too_many_arguments)]
    fn message(
        &self,
        job: &Job,
        model: &Model,
        question: &Mail,
        body: Body,
        headers: Vec<(&'static str, String)>,
        attachment: Option<(&'static str, String)>,
        message_id: Option<String>,
    ) -> Result<Incoming, StoreError> {
        let audience = match (job.origin, job.sender.as_ref()) {
            (Origin::Ask, Some(asker)) => ask::audience(asker),
            _ => Audience::reply_all(question, job.sender.as_ref(), |a| self.is_model(a)),
        };
        let message_id =
            message_id.unwrap_or_else(|| compose::new_message_id("reply", job.id.0, &self.config.hostname));
        self.outgoing(model.into(), job, &audience, question, body, headers, attachment, message_id)
    }

    /// A failure notice to the asker, threaded under the question when it could be read.
    fn notice(
        &self,
        job: &Job,
        author: outlet::Author<'_>,
        question: Option<&Mail>,
        why: &str,
    ) -> Result<Option<Incoming>, StoreError> {
        let fallback = Mail {
            subject: job.subject.clone(),
            message_id: Some(job.message_id.clone()).filter(|s| !s.is_empty()),
            ..Mail::default()
        };
        let question = question.unwrap_or(&fallback);
        let audience = match &job.sender {
            Some(sender) => Audience { to: vec![mail::Person { address: sender.clone(), name: None }], cc: Vec::new() },
            None => return Ok(None),
        };
        if self.is_model(&audience.to[0].address) {
            return Ok(None);
        }
        let message_id = compose::new_message_id("failure", job.id.0, &self.config.hostname);
        let body = format!(
            "Your question could not be answered.\n\nReason: {why}\n\nJob {} for {}. Send the question again to retry.\n\n-- \nnightmail\n",
            job.id, author.address,
        );
        let headers = vec![("X-Nightmail-Job", job.id.to_string()), ("X-Nightmail-Failure", why.to_string())];
        Ok(Some(self.outgoing(author, job, &audience, question, Body::Plain(body), headers, None, message_id)?))
    }

    /// Writes a message from `author` to `audience`, threaded under `parent`, ready to deliver, by
    /// the way `job` came in (`outlet.rs`).
    #[allow(clippy::too_many_arguments)]
    fn outgoing(
        &self,
        author: outlet::Author<'_>,
        job: &Job,
        audience: &Audience,
        parent: &Mail,
        body: Body,
        headers: Vec<(&'static str, String)>,
        attachment: Option<(&'static str, String)>,
        message_id: String,
    ) -> Result<Incoming, StoreError> {
        let outlet = outlet::Outlet::new(&self.config, job.via.as_ref());
        let name = author.name.unwrap_or_else(|| author.address.local_part()).to_string();
        let from = outlet.from(author);
        let subject = compose::reply_subject(&parent.subject);
        // Outside people are reached only through the relay or the bridge, and only so many per
        // reply.
        let mut audience = audience.clone();
        let (max, why) = outlet.cap();
        let left_out = audience.limit_outside(|a| !self.is_model(a) && outlet.is_outside(a), max);
        let body = if left_out.is_empty() {
            body
        } else {
            body.map(|text| compose::with_note(text, &compose::left_out_note(&left_out, &why)))
        };
        let audience = &audience;
        let raw = compose::write(Draft {
            from: (&name, from),
            audience,
            subject: subject.clone(),
            message_id: message_id.clone(),
            parent,
            body,
            headers,
            attachment,
        });
        let recipients = audience
            .everyone()
            .filter(|p| !self.is_model(&p.address))
            .map(|p| outlet.recipient(&p.address))
            .chain(outlet.archive())
            .collect();
        Ok(Incoming {
            key: self.store.new_message_key()?,
            raw,
            sender: Some(from.clone()),
            recipients,
            summary: Summary { from: format!("{name} <{from}>"), subject, message_id: message_id.clone() },
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

/// What a job asks: the job, its model and its question, as the worker read them.
struct Asked<'a> {
    job: &'a Job,
    model: &'a Model,
    question: &'a Mail,
}

/// Why a question is not answered at all.
enum Refusal {
    /// Automatic mail (RFC 3834, list mail, another model): silently.
    Automatic(String),
    /// The sender's hourly reply limit: with a notice.
    RateLimited(String),
}

/// The command a job's mail gives (`status`, `cancel`), if any. A message filed into an Ask folder
/// is asked about, never obeyed: its words may be anyone's.
fn command_in(job: &Job, question: &Mail) -> Option<control::Command> {
    match job.origin {
        Origin::Mail => control::classify(question),
        Origin::Ask => None,
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

/// How fast `model` has answered lately: seconds per generated token and tokens per answer, over
/// its last five answers (from the start of the attempt that finished to done).
struct Pace {
    s_per_token: f64,
    tokens_per_answer: f64,
}

impl Pace {
    fn of(jobs: &[Job], model: &Address) -> Option<Pace> {
        let mut done: Vec<(Timestamp, Duration, u64)> = jobs
            .iter()
            .filter(|j| &j.model == model && j.reply.is_some())
            .filter_map(|j| match (&j.state, j.started_at, &j.progress) {
                (JobState::Done { at }, Some(start), Some(p)) if p.output_tokens + p.reasoning_tokens > 0 => {
                    Some((*at, at.since(start), p.output_tokens + p.reasoning_tokens))
                }
                _ => None,
            })
            .collect();
        done.sort_by_key(|(at, _, _)| *at);
        let recent: Vec<_> = done.iter().rev().take(5).collect();
        let tokens: u64 = recent.iter().map(|(_, _, t)| t).sum();
        (tokens > 0).then(|| Pace {
            s_per_token: recent.iter().map(|(_, d, _)| d.as_secs_f64()).sum::<f64>() / tokens as f64,
            tokens_per_answer: tokens as f64 / recent.len() as f64,
        })
    }

    /// A typical answer's time.
    fn answer(&self) -> Duration {
        Duration::from_secs_f64(self.s_per_token * self.tokens_per_answer)
    }

    /// What is left of a running job, if it runs to a typical length.
    fn rest(&self, job: &Job) -> Duration {
        let so_far = job.progress.as_ref().map_or(0, |p| p.output_tokens + p.reasoning_tokens) as f64;
        Duration::from_secs_f64(self.s_per_token * (self.tokens_per_answer - so_far).max(0.0))
    }
}

fn human_duration(d: Duration) -> String {
    match d.as_secs() {
        s if s < 90 => format!("{s} s"),
        s if s < 5400 => format!("{} min", (s + 30) / 60),
        s if s < 172_800 => format!("{:.1} h", s as f64 / 3600.0),
        s => format!("{:.1} days", s as f64 / 86_400.0),
    }
}
