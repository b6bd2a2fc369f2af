//! One run of the backend for a job: the answer streams in while its progress is saved, the
//! lease renewed, and the asker shown the answer so far (`progress.rs`), until it ends, the
//! worker stops, or the lease is lost (the job was cancelled or taken over).

use std::time::{Duration, Instant};

use nightmail_store::{LeasedJob, Progress, ResearchProgress, StoreError};
use nightmail_types::Timestamp;
use tokio::sync::{mpsc, watch};

use crate::backend::{Backend, BackendAnswer, BackendError, Event, Request};
use crate::letters::{Asked, Letters};
use crate::progress::{self, ProgressTimer};
use crate::setup::Shift;

/// How often streamed progress is saved to the store.
const SAVE_PROGRESS: Duration = Duration::from_secs(2);

/// What a run of the backend ended with: the lease back, with the answer or the backend's error.
pub type Generated = (LeasedJob, Result<BackendAnswer, BackendError>);

/// A job's generation: the question it answers and when its asker is next shown progress, kept
/// across the runs of one attempt (a prompt fitted again to a smaller context runs again).
pub struct Generation<'a> {
    shift: &'a Shift,
    asked: Asked<'a>,
    timer: ProgressTimer,
    /// The job's research so far, shown with its progress (`None` without tools).
    pub research: Option<ResearchProgress>,
}

impl<'a> Generation<'a> {
    pub fn new(shift: &'a Shift, asked: Asked<'a>, timer: ProgressTimer) -> Generation<'a> {
        Generation { shift, asked, timer, research: None }
    }

    /// Streams the backend's answer, saving progress and renewing the lease as it comes. Returns
    /// the lease with the result, or `None` if the lease was lost.
    pub async fn run(
        &mut self,
        mut leased: LeasedJob,
        backend: &dyn Backend,
        request: &Request,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Option<Generated>, StoreError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let (halt_tx, halt) = watch::channel(false);
        let generation = backend.generate(request, events_tx, halt);
        tokio::pin!(generation);
        let mut progress = Progress {
            max_tokens: u64::from(request.max_tokens),
            research: self.research.clone(),
            ..Progress::default()
        };
        let mut last_save = Instant::now();
        let mut save_now = false;
        let mut last_renew = Instant::now();
        let shift = self.shift;
        let (store, lease) = (&shift.store, shift.config().worker.lease);
        if let Err(e) = self.show_progress(&mut leased, &progress).await {
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
                        Event::Restarted => {
                            (progress.output_tokens, progress.reasoning_tokens) = (0, 0);
                            progress.partial_text.clear();
                            save_now = true;
                        }
                        Event::Engine(figures) => progress.engine = Some(figures),
                        Event::Prompt { tokens, prompt_in } => {
                            progress.prompt_tokens = tokens;
                            progress.prompt_in = Some(prompt_in);
                            save_now = true;
                        }
                        Event::Checkpoint { tokens, prompt_tokens, .. } => {
                            progress.checkpoint_tokens = tokens;
                            progress.checkpoint_prompt_tokens = prompt_tokens;
                            // Saved at once, so `status` shows what a restart would keep.
                            save_now = true;
                        }
                    }
                    if save_now || last_save.elapsed() >= SAVE_PROGRESS {
                        save_now = false;
                        progress.updated_at = Timestamp::now();
                        if let Err(e) = store.record_progress(&mut leased, progress.clone()).await {
                            let _ = halt_tx.send(true);
                            return lost(e);
                        }
                        last_save = Instant::now();
                    }
                    if let Err(e) = self.show_progress(&mut leased, &progress).await {
                        let _ = halt_tx.send(true);
                        return lost(e);
                    }
                }
                _ = tokio::time::sleep_until((last_renew + lease / 3).into()) => {}
                _ = stop.changed() => { let _ = halt_tx.send(true); }
            }
            if last_renew.elapsed() >= lease / 3 {
                if let Err(e) = store.renew(&mut leased, lease).await {
                    let _ = halt_tx.send(true);
                    return lost(e);
                }
                last_renew = Instant::now();
            }
        };
        Ok(Some((leased, result)))
    }

    /// Records a research step (a tool call starting or done) as the job's progress, renews the
    /// lease, and shows it to the asker when due. `None`: the lease was lost.
    pub async fn research_step(
        &mut self,
        mut leased: LeasedJob,
        research: ResearchProgress,
    ) -> Result<Option<LeasedJob>, StoreError> {
        self.research = Some(research);
        let progress =
            Progress { research: self.research.clone(), updated_at: Timestamp::now(), ..Progress::default() };
        let store = &self.shift.store;
        let saved = async {
            store.record_progress(&mut leased, progress.clone()).await?;
            store.renew(&mut leased, self.shift.config().worker.lease).await?;
            self.show_progress(&mut leased, &progress).await
        };
        match saved.await {
            Ok(()) => Ok(Some(leased)),
            Err(e) => lost(e),
        }
    }

    /// Files the job's `In Progress` message and sends its progress mail, each when due. Only a
    /// lost lease stops the answer; a store that cannot take them now is told again next time.
    async fn show_progress(&mut self, leased: &mut LeasedJob, progress: &Progress) -> Result<(), StoreError> {
        let shown: Result<(), StoreError> = async {
            let (shift, asked, timer) = (self.shift, self.asked, &mut self.timer);
            let job = asked.job;
            let Some(asker) = job.sender.as_ref().filter(|a| !shift.is_model(a)) else { return Ok(()) };
            let letters = Letters::new(shift);
            if let Some(owner) = timer.owner.clone().filter(|_| timer.filing_due(progress)) {
                let page = letters.to_asker(asked, asker, progress::page(progress, job.id.0), "progress")?;
                shift.store.file_progress(leased, &owner, &page.raw).await?;
                timer.filed(progress);
            }
            if timer.mail_due() {
                let text = progress::mail(progress, job.id.0);
                let mail = letters.to_asker(asked, asker, text, "progress-mail")?;
                shift.store.deliver(&mail).await?;
                timer.mailed();
            }
            Ok(())
        }
        .await;
        match shown {
            Err(StoreError::LeaseLost(id)) => Err(StoreError::LeaseLost(id)),
            Err(e) => {
                tracing::warn!(job = %self.asked.job.id, "cannot show the answer so far: {e}");
                // Tried again an interval later, not at the next token.
                self.timer.filed(progress);
                self.timer.mailed();
                Ok(())
            }
            Ok(()) => Ok(()),
        }
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
