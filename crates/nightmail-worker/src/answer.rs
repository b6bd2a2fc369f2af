//! The life of one leased job, in the order it happens: read (its model, its message), gate (loop
//! rules, the rate limit, a command), fit and generate (the thread fitted to the model's context,
//! the backend run), finish (the reply, or a retry later, or a notice that ends it).

use std::time::Instant;

use nightmail_config::{ModelEntry, ReasoningOutput};
use nightmail_store::{Finish, Incoming, Job, LeasedJob, Origin, Progress, PromptIn, Retry, StoreError};
use nightmail_types::{Address, Timestamp};
use tokio::sync::watch;

use crate::backend::{self, BackendAnswer, BackendError, Request};
use crate::compose::{self, Researched, Stats};
use crate::concierge::acknowledgement;
use crate::control::{self, Command, command_in};
use crate::conversation::{self, Conversation};
use crate::cost::EnergyMeter;
use crate::fit::{self, LeftOut};
use crate::gate::{self, Refusal};
use crate::generation::Generation;
use crate::letters::{self, Asked, Content, Letters};
use crate::mail::{self, Mail};
use crate::progress::ProgressTimer;
use crate::research::{Findings, MailSearch, Research, Toolbox};
use crate::setup::Shift;
use crate::{ask, checkpoints, voice};

/// Earlier thread messages given to the model, at most.
const MAX_THREAD: usize = 20;
/// Times a prompt is fitted again to a context the server named on refusing it, per attempt.
const MAX_REFITS: u32 = 2;

/// Why a job ends here for good, and the notice its asker gets (if any).
struct GiveUp {
    reason: String,
    notice: Option<Incoming>,
}

/// What the gate lets through.
enum Gate {
    Question,
    Command(Command),
    Refused(GiveUp),
}

/// How fitting and generating ended.
enum Attempt {
    /// The backend ran to an end: an answer, an error, or a stop.
    Ran(Run),
    /// The question is too long for the model even alone.
    TooLong(LeasedJob, GiveUp),
    /// The lease was lost: the job was cancelled or taken over.
    LeaseLost,
}

/// The last run of the backend: the lease back, what the backend gave, and what it was asked.
struct Run {
    leased: LeasedJob,
    result: Result<BackendAnswer, BackendError>,
    prompt: Prompt,
}

/// The prompt as the backend was given it, and what of the thread was left out to fit it.
struct Prompt {
    conversation: Conversation,
    /// Boxed: a `Run` stays within clippy's bound on `Attempt`'s variants' sizes.
    request: Box<Request>,
    left_out: LeftOut,
    /// What the research found, when the model has tools.
    findings: Option<Box<Findings>>,
    /// The question's voice notes, which the reply says were heard (and by which model) or not.
    voice_notes: Vec<voice::VoiceNote>,
}

/// What the answer has cost since its attempt started: time, and energy where it is measured.
struct Spent {
    started: Instant,
    meter: EnergyMeter,
}

/// Answers one leased job, with the setup it started with.
pub struct Answer<'a> {
    shift: &'a Shift,
    stop: watch::Receiver<bool>,
}

impl<'a> Answer<'a> {
    pub fn new(shift: &'a Shift, stop: watch::Receiver<bool>) -> Answer<'a> {
        Answer { shift, stop }
    }

    /// Runs one leased job to its end: done with a reply, retried later, or failed with a notice.
    pub async fn run(&self, leased: LeasedJob) -> Result<(), StoreError> {
        let job = leased.job().clone();
        let (model, question) = match self.read(&job)? {
            Ok(read) => read,
            Err(give_up) => return self.give_up(leased, give_up).await,
        };
        let asked = Asked { job: &job, model: &model, question: &question };
        match self.gate(asked)? {
            Gate::Question => {}
            Gate::Command(command) => return control::obey(self.shift, leased, &model, &question, command).await,
            Gate::Refused(give_up) => return self.give_up(leased, give_up).await,
        }
        if !job.triaged {
            let ack = acknowledgement(self.shift, asked)?;
            self.shift.store.triage(job.id, ack).await?;
        }
        let spent = Spent { started: Instant::now(), meter: EnergyMeter::start() };
        let run = match self.fit_and_generate(leased, asked, spent.started).await? {
            Attempt::Ran(run) => run,
            Attempt::TooLong(leased, give_up) => return self.give_up(leased, give_up).await,
            Attempt::LeaseLost => return Ok(()),
        };
        self.finish(asked, run, spent).await
    }

    /// The job's model and its question as read from the store, or why the job ends unread.
    fn read(&self, job: &Job) -> Result<Result<(ModelEntry, Mail), GiveUp>, StoreError> {
        let letters = Letters::new(self.shift);
        let Some(model) = self.shift.config().model(&job.model).cloned() else {
            // Removed from the configuration while the question waited (a restart; a SIGHUP keeps
            // removed models until then): the asker learns it from the address they wrote to.
            let reason = format!("{} is no longer a model address in the configuration", job.model);
            let notice = letters.notice(job, letters::gone_model(job), None, &reason)?;
            return Ok(Err(GiveUp { reason, notice }));
        };
        if job.attempts > self.shift.policy.max_attempts {
            // Leased again after `max_attempts` interrupted attempts (crashes, kills, power cuts):
            // end it with a notice before reading the message, which may be what crashes us.
            let reason = format!("interrupted {} times without finishing", job.attempts - 1);
            let notice = letters.notice(job, (&model).into(), None, &reason)?;
            return Ok(Err(GiveUp { reason, notice }));
        }
        let Some(raw) = self.shift.store.message(job.message)? else {
            return Ok(Err(GiveUp { reason: "the stored message is missing".into(), notice: None }));
        };
        match mail::parse(&raw) {
            Ok(question) => Ok(Ok((model, question))),
            Err(e) => {
                let why = format!("your message could not be read: {e}");
                let notice = letters.notice(job, (&model).into(), None, &why)?;
                Ok(Err(GiveUp { reason: e.to_string(), notice }))
            }
        }
    }

    /// Whether the question is answered, obeyed as a command, or refused.
    fn gate(&self, asked: Asked<'_>) -> Result<Gate, StoreError> {
        let Asked { job, model, question } = asked;
        if let Some(refusal) = gate::refusal(self.shift, job, question)? {
            let (reason, notice) = match refusal {
                // Automatic mail gets no answer and no notice: a notice is mail too, and would loop.
                Refusal::Automatic(reason) => (reason, None),
                // A person over the rate limit learns why, once per refused question (to them alone).
                Refusal::RateLimited(reason) => {
                    let why = format!("{reason}; send it again later");
                    (reason, Letters::new(self.shift).notice(job, model.into(), Some(question), &why)?)
                }
            };
            tracing::info!(job = %job.id, "not answering: {reason}");
            return Ok(Gate::Refused(GiveUp { reason: format!("not answered: {reason}"), notice }));
        }
        Ok(command_in(job, question).map_or(Gate::Question, Gate::Command))
    }

    /// Fits the thread to the model's context and runs the backend, fitting again (up to
    /// `MAX_REFITS` times) when a server names a smaller context on refusing the prompt.
    async fn fit_and_generate(
        &self,
        mut leased: LeasedJob,
        asked: Asked<'_>,
        started: Instant,
    ) -> Result<Attempt, StoreError> {
        let Asked { job, model, question } = asked;
        let backend = self.shift.setup.backends.get(&job.model).cloned().expect("every model address has a backend");
        // Only an asker with an account here has an In Progress mailbox (not a bridge's outside asker).
        let owner = job.sender.as_ref().and_then(|s| self.shift.config().user_by_address(s)).map(|u| u.name.clone());
        let mut generation = Generation::new(self.shift, asked, ProgressTimer::new(model, owner, started));
        let mut whole_thread = self.thread(question, job.sender.as_ref())?;
        // Voice notes become words before the prompt is fitted: the transcript is what it holds.
        let transcribe = self.shift.config().transcribe.as_ref();
        voice::hear(transcribe, &mut whole_thread).await;
        let mut heard = question.clone();
        voice::hear(transcribe, std::slice::from_mut(&mut heard)).await;
        let question = &heard;
        let mut research = self.research(asked)?;
        let build = |thread: &[Mail], question: &Mail| self.request(asked, &self.converse(asked, thread, question));
        let mut refits = 0;
        // Estimated prompt lengths times this: raised when a server counts a refused prompt longer.
        let mut scale = 1.0;
        loop {
            // The prompt is fitted to the model's context from the question as read; the reply is
            // threaded under the question as it came.
            let (mut thread, mut fitted) = (whole_thread.clone(), question.clone());
            let context = model.context_tokens;
            let left_out = match fit::fit(backend.as_ref(), context, scale, &mut thread, &mut fitted, build).await {
                Ok(left_out) => left_out,
                Err(too_long) => {
                    let why = too_long.to_string();
                    tracing::info!(job = %job.id, "not answering: {why}");
                    let notice = Letters::new(self.shift).notice(job, model.into(), Some(question), &why)?;
                    return Ok(Attempt::TooLong(leased, GiveUp { reason: why, notice }));
                }
            };
            let conversation = self.converse(asked, &thread, &fitted);
            let request = self.request(asked, &conversation);
            let generated = match research.as_mut() {
                Some(research) => {
                    research.generate(&mut generation, leased, backend.as_ref(), &request, self.stop.clone()).await?
                }
                None => generation.run(leased, backend.as_ref(), &request, self.stop.clone()).await?,
            };
            let Some((back, result)) = generated else {
                // The lease was lost: cancelled (the checkpoint has no use now) or taken over.
                if !self.shift.store.job(job.id)?.is_some_and(|j| checkpoints::may_resume(&j.state)) {
                    checkpoints::remove(&self.shift.config().data_dir, job.id);
                }
                return Ok(Attempt::LeaseLost);
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
                result => {
                    let findings =
                        research.as_ref().zip(result.as_ref().ok()).map(|(r, answer)| Box::new(r.findings(answer)));
                    let voice_notes = question.voice_notes.clone();
                    let prompt = Prompt { conversation, request: Box::new(request), left_out, findings, voice_notes };
                    return Ok(Attempt::Ran(Run { leased: back, result, prompt }));
                }
            }
        }
    }

    /// Ends the attempt by what the backend gave: the reply delivered with the job's `done`, the
    /// job left to run again (shutdown), or a failed attempt (retried, or a notice at the last).
    async fn finish(&self, asked: Asked<'_>, run: Run, spent: Spent) -> Result<(), StoreError> {
        let Asked { job, model, .. } = asked;
        let Run { mut leased, result, prompt } = run;
        let store = &self.shift.store;
        let data_dir = &self.shift.config().data_dir;
        match result {
            Ok(outcome) => {
                let reply = self.reply(asked, &outcome, &prompt, spent)?;
                let totals = Progress {
                    prompt_tokens: outcome.prompt_tokens.unwrap_or(0),
                    output_tokens: outcome.output_tokens,
                    reasoning_tokens: outcome.reasoning_tokens,
                    partial_text: String::new(),
                    updated_at: Timestamp::now(),
                    checkpoint_tokens: 0,
                    checkpoint_prompt_tokens: 0,
                    max_tokens: u64::from(prompt.request.max_tokens),
                    engine: None,
                    research: prompt.findings.as_ref().map(|f| f.progress.clone()),
                    prompt_in: outcome
                        .prefilled_tokens
                        .zip(outcome.prefill_ms)
                        .map(|(prefilled_tokens, ms)| PromptIn { prefilled_tokens, prefill_ms: u64::from(ms) }),
                };
                store.record_progress(&mut leased, totals).await?;
                let (done, receipt) = store.finish(leased, Finish::Done { reply }, &self.shift.policy).await?;
                // Delivered: the checkpoint has done its work (a crash before this line leaves it
                // to the start-up sweep).
                checkpoints::remove(data_dir, done.id);
                tracing::info!(job = %done.id, tokens = outcome.output_tokens, delivered = ?receipt.map(|r| r.mail.len()), "answered");
                Ok(())
            }
            // Shutdown: leave the lease to expire or to start-up recovery; the job runs again.
            Err(BackendError::Stopped) => Ok(()),
            Err(e) => {
                let retry = match e {
                    BackendError::Permanent(_) | BackendError::ContextExceeded { .. } => Retry::Permanent,
                    _ => Retry::Transient,
                };
                let tries = leased.job().attempts;
                let why = format!("{e} (attempt {tries} of {})", self.shift.policy.max_attempts);
                let notice = Letters::new(self.shift).notice(job, model.into(), Some(asked.question), &why)?;
                let finish = Finish::Failed { reason: e.to_string(), retry, notice };
                let (job, _) = store.finish(leased, finish, &self.shift.policy).await?;
                if !checkpoints::may_resume(&job.state) {
                    checkpoints::remove(data_dir, job.id);
                }
                tracing::warn!(job = %job.id, state = job.state.name(), "attempt failed: {e}");
                Ok(())
            }
        }
    }

    /// The reply that carries the model's answer, with notes on what was ignored or left out and
    /// what it cost.
    fn reply(
        &self,
        asked: Asked<'_>,
        outcome: &BackendAnswer,
        prompt: &Prompt,
        spent: Spent,
    ) -> Result<Incoming, StoreError> {
        let Asked { job, model, .. } = asked;
        let Prompt { conversation, request, left_out, findings, voice_notes } = prompt;
        let Spent { started, meter } = spent;
        let options = &conversation.options;
        let mut notes = Vec::new();
        if !options.unknown.is_empty() {
            notes.push(format!("Options not understood and ignored: {}", options.unknown.join(", ")));
        }
        notes.extend(voice_notes.iter().map(voice::VoiceNote::in_reply));
        notes.extend(left_out.note());
        if let Some(limit) = findings.as_ref().and_then(|f| f.limit.as_ref()) {
            notes.push(format!("Research stopped early: {limit}; the answer uses what was found by then"));
        }
        if outcome.finish_reason == "length" {
            notes.push(format!(
                "The answer stopped at the length limit ({} tokens); ask again with @max-tokens N for more.",
                request.max_tokens
            ));
        }
        let backend = self.shift.setup.backends.get(&job.model).expect("every model address has a backend");
        let stats = Stats {
            model_address: &model.address,
            backend: backend.describe(),
            outcome,
            wall: started.elapsed(),
            job: job.id.0,
            energy: meter.finish(started.elapsed(), model.cost.watts),
            api_price: model.cost.api_price,
            research: findings.as_ref().map(|f| Researched { sources: f.sources.clone(), summary: f.summary.clone() }),
        };
        let (body, headers) = compose::answer(&stats, &notes);
        let attachment = (model.reasoning_output == ReasoningOutput::Attach && !outcome.reasoning.trim().is_empty())
            .then(|| ("reasoning.txt", outcome.reasoning.clone()));
        Letters::new(self.shift).reply(asked, Content { body, headers, attachment })
    }

    /// The job's research, when its model has tools: the asker's own mail searchable only when
    /// the asker has an account here.
    fn research(&self, asked: Asked<'_>) -> Result<Option<Research>, StoreError> {
        let Asked { job, model, .. } = asked;
        if model.tools.is_empty() {
            return Ok(None);
        }
        let config = self.shift.config();
        let asker = job.sender.as_ref().filter(|s| config.user_by_address(s).is_some());
        let mail = self
            .shift
            .setup
            .mail_index
            .clone()
            .zip(asker)
            .map(|(index, asker)| MailSearch::new(index, self.shift.store.clone(), asker.clone()));
        let toolbox = Toolbox::new(model.tools.clone(), config.research.clone(), mail);
        let dir = checkpoints::dir(&config.data_dir);
        Research::open(toolbox, &dir, job.id.0)
            .map(Some)
            .map_err(|e| StoreError::Io { path: dir, message: format!("the research journal: {e}") })
    }

    /// The conversation the model is given: a thread's turns, or an Ask folder's framed question.
    fn converse(&self, asked: Asked<'_>, thread: &[Mail], question: &Mail) -> Conversation {
        let system_prompt = asked.model.system_prompt.as_deref();
        let is_model = |a: &Address| self.shift.is_model(a);
        match (asked.job.origin, asked.job.sender.as_ref()) {
            (Origin::Ask, Some(asker)) => ask::build(system_prompt, thread, question, asker, is_model),
            _ => conversation::build(system_prompt, thread, question, is_model),
        }
    }

    /// The backend request for `conversation`: the model's settings under the question's options.
    fn request(&self, asked: Asked<'_>, conversation: &Conversation) -> Request {
        let (options, model) = (&conversation.options, asked.model);
        Request {
            turns: conversation.turns.clone(),
            max_tokens: options.max_tokens.unwrap_or(model.max_tokens),
            temperature: options.temperature.unwrap_or(model.temperature),
            reasoning: options.reasoning.or(model.reasoning.then_some(true)),
            model: options.model.clone(),
            checkpoint: Some(checkpoints::path(&self.shift.config().data_dir, asked.job.id)),
            tools: Vec::new(),
        }
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
            let Some(key) = self.shift.store.find_by_message_id(id, sender)? else { continue };
            let Some(raw) = self.shift.store.message(key)? else { continue };
            if let Ok(mail) = mail::parse(&raw) {
                thread.push(mail);
            }
        }
        Ok(thread)
    }

    /// Ends the job for good, delivering its notice if any.
    async fn give_up(&self, leased: LeasedJob, give_up: GiveUp) -> Result<(), StoreError> {
        let finish = Finish::Failed { reason: give_up.reason, retry: Retry::Permanent, notice: give_up.notice };
        self.shift.store.finish(leased, finish, &self.shift.policy).await?;
        Ok(())
    }
}
