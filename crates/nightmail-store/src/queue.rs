//! The job queue. A job is leased, never popped: `queued -> running(lease) -> done | failed`, and
//! a lease that is not renewed expires and puts the job back. So a crash at any point loses no job
//! (it is still on disk, queued or running) and duplicates none (the lease token guards completion:
//! a worker whose lease was lost cannot complete the job a second time). Expiry is judged on a
//! clock that stops while the machine is suspended (`lease_clock.rs`).

use std::time::Duration;

use nightmail_types::{Address, Timestamp};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::delivery::deliver_in;
use crate::in_progress::{ProgressMail, withdraw_in};
use crate::job_index::IndexTrees;
use crate::outbound::charge_in;
use crate::refs::RefTrees;
use crate::schema::{JOBS, LIVE_JOBS, Tx, decode, encode};
use crate::{Incoming, JobId, MessageKey, Receipt, Store, StoreError, Summary};

/// One message for one model address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// The model address the message was sent to.
    pub model: Address,
    pub message: MessageKey,
    /// The envelope sender (`MAIL FROM`), `None` for the null reverse-path `<>`.
    pub sender: Option<Address>,
    /// `From:` header, as written.
    pub from: String,
    pub subject: String,
    pub message_id: String,
    pub created_at: Timestamp,
    /// How many times the job has been leased.
    pub attempts: u32,
    pub state: JobState,
    /// What the current or last attempt has produced so far (schema 3; absent before).
    #[serde(default)]
    pub progress: Option<Progress>,
    /// The reply delivered when the job finished (schema 3; absent before).
    #[serde(default)]
    pub reply: Option<MessageKey>,
    /// When the current or last attempt started.
    #[serde(default)]
    pub started_at: Option<Timestamp>,
    /// Looked at by the worker's concierge (acknowledged, or found to be a command).
    #[serde(default)]
    pub triaged: bool,
    /// The Message-ID of the acknowledgement sent for this job, if any.
    #[serde(default)]
    pub ack: Option<String>,
    /// The bridge (its upstream address) the question came in through: the answer goes out by
    /// its SMTP server, from its address. `None`: local mail.
    #[serde(default)]
    pub via: Option<Address>,
    /// How the question came (schema 7; mail before).
    #[serde(default)]
    pub origin: Origin,
    /// The message with the answer so far in the asker's `In Progress` mailbox, while the job
    /// has one (`in_progress.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_mail: Option<ProgressMail>,
}

/// How a question reached its model, which decides who the answer goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Mail sent to the model's address: the reply goes to everyone the message went to.
    #[default]
    Mail,
    /// A message the user filed into their `Ask/<model>` folder over IMAP: `sender` is that
    /// user, who asks about a message they may not have written; the reply goes to them alone.
    Ask,
}

impl Job {
    /// A new job, due now, for `model` to answer the stored message `message`.
    pub(crate) fn queued(
        id: JobId,
        model: Address,
        message: MessageKey,
        sender: Option<Address>,
        summary: &Summary,
        origin: Origin,
        now: Timestamp,
    ) -> Job {
        Job {
            id,
            model,
            message,
            sender,
            from: summary.from.clone(),
            subject: summary.subject.clone(),
            message_id: summary.message_id.clone(),
            created_at: now,
            attempts: 0,
            state: JobState::Queued { not_before: now },
            progress: None,
            reply: None,
            started_at: None,
            triaged: false,
            ack: None,
            origin,
            via: None,
            progress_mail: None,
        }
    }
}

/// How far generation has got, saved as it streams so `status` can show it and a crash loses
/// little.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    /// The answer so far.
    pub partial_text: String,
    pub updated_at: Timestamp,
    /// Generated tokens the job's last checkpoint covers: a restart resumes from there.
    #[serde(default)]
    pub checkpoint_tokens: u64,
    /// Prompt tokens the job's last checkpoint covers: fewer than the prompt's while it prefills.
    #[serde(default)]
    pub checkpoint_prompt_tokens: u64,
    /// The answer's length limit, in tokens (0: written before the limit was recorded).
    #[serde(default)]
    pub max_tokens: u64,
    /// The inference engine's figures over its last few seconds, while a local model writes the
    /// answer (`None` for a model server, which reports none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineFigures>,
    /// Once the prompt is in: how many of its tokens the model ran (the rest were restored from
    /// a thread's saved state or the job's checkpoint) and how long that took, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_in: Option<PromptIn>,
    /// The job's research so far, when its model has tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub research: Option<ResearchProgress>,
}

/// What a job's research has done: tool calls, bytes downloaded, and the step it is on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResearchProgress {
    pub calls: u32,
    pub bytes: u64,
    /// What the job is doing now (`searching: ...`, `reading: host/path`), or did last.
    pub step: String,
}

/// How a job's prompt went in, apart from the answer's time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptIn {
    pub prefilled_tokens: u64,
    pub prefill_ms: u64,
}

/// How an engine that streams weights from disk is doing. Whole numbers (per mille, KB/s), so a
/// job record compares exactly; each is `None` when the window had nothing to measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineFigures {
    /// Of the experts the model asked for, those already in RAM (cached or prefetched), per mille.
    pub cache_hit_permille: Option<u32>,
    /// Weights read from disk (experts and streamed layers), in KB per second of wall time.
    pub disk_kb_per_s: Option<u64>,
    /// Of the experts chosen while decoding, those the prefetcher had guessed, per mille.
    pub prefetch_recall_permille: Option<u32>,
}

/// How a leased job ends.
#[derive(Debug)]
pub enum Finish {
    /// Answered: `reply` is delivered in the same transaction that marks the job done, so a crash
    /// either leaves the job to run again with no reply sent, or done with its reply sent once.
    Done { reply: Incoming },
    /// The attempt failed. If this makes the job fail for good, `notice` (a failure notice to
    /// the sender) is delivered with that change; if the job is retried, it is not.
    Failed { reason: String, retry: Retry, notice: Option<Incoming> },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum JobState {
    Queued { not_before: Timestamp },
    Running { lease_token: u64, lease_expires: Timestamp, heartbeat_at: Timestamp },
    Done { at: Timestamp },
    Failed { at: Timestamp, reason: String },
    Cancelled { at: Timestamp },
}

impl JobState {
    /// The name `nightmail status` shows.
    /// When the job ended, if it has.
    pub fn finished_at(&self) -> Option<Timestamp> {
        match self {
            JobState::Done { at } | JobState::Failed { at, .. } | JobState::Cancelled { at } => Some(*at),
            JobState::Queued { .. } | JobState::Running { .. } => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            JobState::Queued { .. } => "queued",
            JobState::Running { .. } => "running",
            JobState::Done { .. } => "done",
            JobState::Failed { .. } => "failed",
            JobState::Cancelled { .. } => "cancelled",
        }
    }
}

/// A job this process holds a lease on. Only [`Store::lease_next`] makes one, and only the holder
/// of the lease can renew, complete or fail the job.
#[derive(Debug)]
pub struct LeasedJob {
    pub(crate) job: Job,
    token: u64,
}

impl LeasedJob {
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Whether `state` (the job as stored now) is still this lease.
    pub(crate) fn holds(&self, state: &JobState) -> bool {
        matches!(state, JobState::Running { lease_token, .. } if *lease_token == self.token)
    }
}

/// How a failed attempt ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Try again after a backoff, unless attempts are used up.
    Transient,
    /// Retrying cannot help (a malformed message, say): fail now.
    Permanent,
}

/// Exponential backoff with jitter, as Postfix and mox do: `base * 2^(attempt-1)`, capped at
/// `max`, times a random factor in [0.75, 1.25]; after `max_attempts` leases the job fails.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { base: Duration::from_secs(60), max: Duration::from_secs(3600), max_attempts: 8 }
    }
}

impl RetryPolicy {
    pub fn backoff(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(20);
        let delay = self.base.saturating_mul(1u32 << exp).min(self.max);
        delay.mul_f64(rand::thread_rng().gen_range(0.75..=1.25))
    }
}

/// Key of the `queue` index: due time first, so the first key is the next job due.
pub(crate) fn queue_key(not_before: Timestamp, id: JobId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&not_before.0.to_be_bytes());
    key[8..].copy_from_slice(&id.to_be_bytes());
    key
}

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

/// `receipt`'s outbound entries charged to `job`'s asker: the model wrote them on their behalf.
fn charged(tx: &Tx<'_>, receipt: Receipt, job: &Job) -> TxResult<Receipt> {
    if let Some(asker) = &job.sender {
        charge_in(tx.outbound, &receipt.outbound, asker)?;
    }
    Ok(receipt)
}

fn abort(e: StoreError) -> ConflictableTransactionError<StoreError> {
    ConflictableTransactionError::Abort(e)
}

pub(crate) fn read_job(jobs: &TransactionalTree, id: JobId) -> TxResult<Job> {
    let bytes = jobs.get(id.to_be_bytes())?.ok_or_else(|| abort(StoreError::NoSuchJob(id)))?;
    decode(JOBS, &bytes).map_err(abort)
}

/// Which list of live jobs (`live_jobs` tree, schema 9) an index key names.
#[derive(Clone, Copy)]
pub(crate) enum Live {
    /// Queued and not yet looked at by the concierge.
    Untriaged = b'n' as isize,
    /// Leased by a worker: the lease sweeper's list.
    Running = b'r' as isize,
}

pub(crate) fn live_key(list: Live, id: JobId) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = list as u8;
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

/// The live-job lists `job` belongs in: finished jobs are in none, so the concierge and the
/// lease sweeper never visit history.
pub(crate) fn live_lists(job: &Job) -> impl Iterator<Item = Live> {
    let untriaged = matches!(job.state, JobState::Queued { .. }) && !job.triaged;
    let running = matches!(job.state, JobState::Running { .. });
    [(untriaged, Live::Untriaged), (running, Live::Running)].into_iter().filter(|(on, _)| *on).map(|(_, l)| l)
}

/// The trees a job's state lives in: the record and the indexes kept in step with it.
#[derive(Clone, Copy)]
pub(crate) struct JobTrees<'a> {
    pub jobs: &'a TransactionalTree,
    pub queue: &'a TransactionalTree,
    pub live: &'a TransactionalTree,
    pub index: IndexTrees<'a>,
}

impl<'a> JobTrees<'a> {
    /// The view of a transaction over `Trees::of_jobs`, in its order.
    fn of_view(view: &'a [TransactionalTree]) -> Self {
        let index = IndexTrees { replies: &view[3], answers: &view[4], open_jobs: &view[5] };
        JobTrees { jobs: &view[0], queue: &view[1], live: &view[2], index }
    }
}

impl<'a> From<&crate::schema::Tx<'a>> for JobTrees<'a> {
    fn from(tx: &crate::schema::Tx<'a>) -> Self {
        let index = IndexTrees { replies: tx.replies, answers: tx.answers, open_jobs: tx.open_jobs };
        JobTrees { jobs: tx.jobs, queue: tx.queue, live: tx.live_jobs, index }
    }
}

/// Writes `job` and, in the same transaction, its entries in the `queue`, `live_jobs` and
/// `job_index.rs` indexes (`old`: its state before, to find the entries to drop).
pub(crate) fn write_job(t: JobTrees<'_>, old: Option<&JobState>, job: &Job) -> TxResult<()> {
    if let Some(JobState::Queued { not_before }) = old {
        t.queue.remove(&queue_key(*not_before, job.id)[..])?;
    }
    if let JobState::Queued { not_before } = job.state {
        t.queue.insert(&queue_key(not_before, job.id)[..], &[][..])?;
    }
    for list in [Live::Untriaged, Live::Running] {
        t.live.remove(&live_key(list, job.id)[..])?;
    }
    for list in live_lists(job) {
        t.live.insert(&live_key(list, job.id)[..], &[][..])?;
    }
    t.index.update(old, job)?;
    t.jobs.insert(&job.id.to_be_bytes()[..], encode(job))?;
    Ok(())
}

impl Store {
    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<Job>, StoreError> {
        self.trees.jobs.iter().values().map(|v| self.read_counted(&v?)).collect()
    }

    /// The queued jobs the concierge has not looked at yet, oldest first: read through the
    /// `live_jobs` index, so the cost is that of the new jobs, not of every job ever received.
    pub fn untriaged_jobs(&self) -> Result<Vec<Job>, StoreError> {
        self.live_jobs(Live::Untriaged)
    }

    /// The jobs a worker holds a lease on.
    pub fn running_jobs(&self) -> Result<Vec<Job>, StoreError> {
        self.live_jobs(Live::Running)
    }

    fn live_jobs(&self, list: Live) -> Result<Vec<Job>, StoreError> {
        let mut found = Vec::new();
        for key in self.trees.live_jobs.scan_prefix([list as u8]).keys() {
            let key = key?;
            let id = JobId::from_be_slice(&key[1..])
                .ok_or_else(|| StoreError::Corrupt { tree: LIVE_JOBS, message: "a key is not 9 bytes".into() })?;
            // A job the index names is always there (they change in one transaction).
            let bytes = self.trees.jobs.get(id.to_be_bytes())?.ok_or(StoreError::NoSuchJob(id))?;
            found.push(self.read_counted(&bytes)?);
        }
        Ok(found)
    }

    /// Decodes a job record, counting it: the test that the concierge's and the sweeper's work
    /// does not grow with finished jobs counts these reads.
    pub(crate) fn read_counted(&self, bytes: &[u8]) -> Result<Job, StoreError> {
        self.job_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        decode(JOBS, bytes)
    }

    /// Runs `f` in one transaction over the trees a job's state lives in.
    pub(crate) fn job_transaction<A>(&self, f: impl Fn(JobTrees<'_>) -> TxResult<A>) -> Result<A, StoreError> {
        let _writing = self.trees.writing();
        let trees = self.trees.of_jobs();
        Ok(trees[..].transaction(|view| f(JobTrees::of_view(view)))?)
    }

    /// How many job records this store has decoded from a scan since it was opened.
    #[doc(hidden)]
    pub fn job_reads(&self) -> u64 {
        self.job_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn job(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        self.trees.jobs.get(id.to_be_bytes())?.map(|v| decode(JOBS, &v)).transpose()
    }

    /// Leases the job that is due first, if any is due now, for `lease_for`.
    pub async fn lease_next(&self, lease_for: Duration) -> Result<Option<LeasedJob>, StoreError> {
        let now = Timestamp::now();
        loop {
            let Some(first) = self.trees.queue.iter().keys().next().transpose()? else {
                return Ok(None);
            };
            let due = u64::from_be_bytes(first[..8].try_into().expect("queue keys are 16 bytes"));
            if due > now.0 {
                return Ok(None);
            }
            let id = JobId::from_be_slice(&first[8..]).expect("queue keys are 16 bytes");
            match self.lease(id, lease_for).await? {
                Some(leased) => return Ok(Some(leased)),
                // Taken or cancelled since we looked: the index entry is stale.
                None => {
                    let _writing = self.trees.writing();
                    self.trees.queue.remove(&first)?;
                }
            }
        }
    }

    /// Applies `change` to a leased job if the lease still holds.
    async fn with_lease(&self, leased: &LeasedJob, change: impl Fn(&mut Job)) -> Result<Job, StoreError> {
        let id = leased.job.id;
        let job = self.job_transaction(|t| {
            let mut job = read_job(t.jobs, id)?;
            match job.state {
                JobState::Running { lease_token, .. } if lease_token == leased.token => {}
                _ => return Err(abort(StoreError::LeaseLost(id))),
            }
            let old = job.state.clone();
            change(&mut job);
            write_job(t, Some(&old), &job)?;
            Ok(job)
        })?;
        self.flush().await?;
        Ok(job)
    }

    /// Heartbeat: extends the lease. Fails with [`StoreError::LeaseLost`] if the job was cancelled
    /// or re-leased meanwhile; the worker must then stop.
    pub async fn renew(&self, leased: &mut LeasedJob, lease_for: Duration) -> Result<(), StoreError> {
        let now = Timestamp::now();
        leased.job = self
            .with_lease(leased, |job| {
                if let JobState::Running { lease_expires, heartbeat_at, .. } = &mut job.state {
                    *lease_expires = now.plus(lease_for);
                    *heartbeat_at = now;
                }
            })
            .await?;
        self.leases.hold(leased.job.id, leased.token, lease_for);
        Ok(())
    }

    /// Saves generation progress while the lease holds.
    pub async fn record_progress(&self, leased: &mut LeasedJob, progress: Progress) -> Result<(), StoreError> {
        leased.job = self.with_lease(leased, |job| job.progress = Some(progress.clone())).await?;
        Ok(())
    }

    /// Marks a leased job done, with no reply.
    pub async fn complete(&self, leased: LeasedJob) -> Result<Job, StoreError> {
        let at = Timestamp::now();
        let job = self.with_lease(&leased, |job| job.state = JobState::Done { at }).await?;
        self.leases.release(job.id);
        Ok(job)
    }

    /// Ends an attempt that failed, with no notice: back to the queue after a backoff, or failed
    /// for good.
    pub async fn fail(
        &self,
        leased: LeasedJob,
        reason: &str,
        retry: Retry,
        policy: &RetryPolicy,
    ) -> Result<Job, StoreError> {
        let finish = Finish::Failed { reason: reason.to_string(), retry, notice: None };
        Ok(self.finish(leased, finish, policy).await?.0)
    }

    /// Ends a leased job (see [`Finish`]), delivering its reply or notice atomically with the
    /// state change. Returns the job as it now is and what was delivered.
    pub async fn finish(
        &self,
        leased: LeasedJob,
        finish: Finish,
        policy: &RetryPolicy,
    ) -> Result<(Job, Option<Receipt>), StoreError> {
        let now = Timestamp::now();
        let id = leased.job.id;
        let backoff = policy.backoff(leased.job.attempts);
        let mail = match &finish {
            Finish::Done { reply } => Some(reply),
            Finish::Failed { notice, .. } => notice.as_ref(),
        };
        let ids = match mail {
            Some(m) => self.recipient_ids(m)?,
            None => Vec::new(),
        };
        let result = self.trees.transaction(|tx| {
            let mut job = read_job(tx.jobs, id)?;
            match job.state {
                JobState::Running { lease_token, .. } if lease_token == leased.token => {}
                _ => return Err(abort(StoreError::LeaseLost(id))),
            }
            let old = job.state.clone();
            let mut receipt = None;
            // Ended or waiting to retry, the job is not running: its answer so far goes.
            let withdrawn = withdraw_in(tx, &mut job)?;
            match &finish {
                Finish::Done { reply } => {
                    receipt = Some(charged(tx, deliver_in(tx, reply, &ids, now)?, &job)?);
                    job.reply = Some(reply.key);
                    job.state = JobState::Done { at: now };
                }
                Finish::Failed { reason, retry, notice } => {
                    if *retry == Retry::Transient && job.attempts < policy.max_attempts {
                        job.state = JobState::Queued { not_before: now.plus(backoff) };
                    } else {
                        if let Some(notice) = notice {
                            receipt = Some(charged(tx, deliver_in(tx, notice, &ids, now)?, &job)?);
                            job.reply = Some(notice.key);
                        }
                        job.state = JobState::Failed { at: now, reason: reason.clone() };
                    }
                }
            }
            write_job(tx.into(), Some(&old), &job)?;
            Ok((job, receipt, withdrawn))
        })?;
        let (job, receipt, withdrawn) = result;
        self.leases.release(id);
        self.flush().await?;
        // IMAP sessions in IDLE learn of the reply (or notice) now.
        if let Some(receipt) = &receipt {
            self.announce(receipt);
        }
        if let Some(mailbox) = withdrawn {
            self.notify(mailbox);
        }
        Ok((job, receipt))
    }

    /// Marks a job triaged, delivering its acknowledgement (if any) in the same transaction.
    /// A job already finished is left as it is. Returns the job as it now is.
    pub async fn triage(&self, id: JobId, ack: Option<Incoming>) -> Result<Job, StoreError> {
        let now = Timestamp::now();
        let ids = match &ack {
            Some(m) => self.recipient_ids(m)?,
            None => Vec::new(),
        };
        let (job, receipt) = self.trees.transaction(|tx| {
            let mut job = read_job(tx.jobs, id)?;
            if job.triaged || !matches!(job.state, JobState::Queued { .. } | JobState::Running { .. }) {
                return Ok((job, None));
            }
            job.triaged = true;
            let mut receipt = None;
            if let Some(ack) = &ack {
                receipt = Some(charged(tx, deliver_in(tx, ack, &ids, now)?, &job)?);
                job.ack = Some(ack.summary.message_id.clone());
            }
            let state = job.state.clone();
            write_job(tx.into(), Some(&state), &job)?;
            Ok((job, receipt))
        })?;
        self.flush().await?;
        if let Some(receipt) = &receipt {
            self.announce(receipt);
        }
        Ok(job)
    }

    /// Leases one particular queued job, if it is still queued (due or not: the concierge uses
    /// this to answer commands at once).
    pub async fn lease(&self, id: JobId, lease_for: Duration) -> Result<Option<LeasedJob>, StoreError> {
        let now = Timestamp::now();
        let token: u64 = rand::random();
        let leased = self.job_transaction(|t| {
            let mut job = read_job(t.jobs, id)?;
            if !matches!(job.state, JobState::Queued { .. }) {
                return Ok(None);
            }
            let old = job.state.clone();
            job.attempts += 1;
            job.started_at = Some(now);
            job.state = JobState::Running { lease_token: token, lease_expires: now.plus(lease_for), heartbeat_at: now };
            write_job(t, Some(&old), &job)?;
            Ok(Some(job))
        })?;
        if leased.is_some() {
            self.leases.hold(id, token, lease_for);
        }
        self.flush().await?;
        Ok(leased.map(|job| LeasedJob { job, token }))
    }

    /// Deletes the jobs that finished (done, failed or cancelled) before `before`, with their hold
    /// on the question's bytes: a message no mailbox, job or outbound entry still holds is deleted
    /// with it, one in a mailbox is kept. The reply is not touched (the mailboxes it was filed in
    /// hold it). Returns how many jobs went.
    pub async fn purge_jobs(&self, before: Timestamp) -> Result<usize, StoreError> {
        let old: Vec<JobId> =
            self.jobs()?.iter().filter(|j| j.state.finished_at().is_some_and(|at| at < before)).map(|j| j.id).collect();
        let t = &self.trees;
        let mut purged = 0;
        for id in old {
            let writing = self.trees.writing();
            let gone = (&t.jobs, &t.message_refs, &t.messages, &t.message_ids, &t.replies, &t.answers, &t.open_jobs)
                .transaction(|(jobs, refs, messages, message_ids, replies, answers, open_jobs)| {
                    // Re-read: a job is never un-finished, but it may already be gone.
                    let Some(bytes) = jobs.get(id.to_be_bytes())? else { return Ok(false) };
                    let job: Job = decode(JOBS, &bytes).map_err(ConflictableTransactionError::Abort)?;
                    jobs.remove(&id.to_be_bytes()[..])?;
                    IndexTrees { replies, answers, open_jobs }.remove(&job)?;
                    RefTrees { refs, messages, message_ids }.release::<StoreError>(job.message)?;
                    Ok(true)
                })?;
            drop(writing);
            purged += usize::from(gone);
        }
        if purged > 0 {
            self.flush().await?;
        }
        Ok(purged)
    }

    /// Cancels a job that has not finished. Returns the job as it now is.
    pub async fn cancel(&self, id: JobId) -> Result<Job, StoreError> {
        let at = Timestamp::now();
        let (job, withdrawn) = self.trees.transaction(|tx| {
            let mut job = read_job(tx.jobs, id)?;
            let mut withdrawn = None;
            if matches!(job.state, JobState::Queued { .. } | JobState::Running { .. }) {
                let old = job.state.clone();
                job.state = JobState::Cancelled { at };
                withdrawn = withdraw_in(tx, &mut job)?;
                write_job(tx.into(), Some(&old), &job)?;
            }
            Ok((job, withdrawn))
        })?;
        self.leases.release(id);
        self.flush().await?;
        if let Some(mailbox) = withdrawn {
            self.notify(mailbox);
        }
        Ok(job)
    }

    /// Puts back in the queue every running job whose lease has expired (on the awake-time clock
    /// for the leases this process granted, else on the wall clock), or, with `all`, every
    /// running job (at start-up: the process that held those leases is gone, since sled admits
    /// one process). A job already leased `max_attempts` times goes back too: the worker, which can
    /// write the notice, ends it with one on its next lease before running any of it, so a message
    /// that crashes the daemon each time neither crashes it forever nor fails silently. Returns
    /// how many jobs changed.
    pub async fn recover_leases(&self, all: bool) -> Result<usize, StoreError> {
        let now = Timestamp::now();
        let mut recovered = 0;
        let expired = |id: JobId, state: &JobState| match state {
            JobState::Running { lease_token, lease_expires, .. } => {
                all || self.leases.expired(id, *lease_token).unwrap_or(*lease_expires <= now)
            }
            _ => false,
        };
        // Through the index of running jobs (schema 9): every 30 s, it must not read history.
        for job in self.running_jobs()? {
            if !expired(job.id, &job.state) {
                continue;
            }
            let id = job.id;
            let changed = self.job_transaction(|t| {
                let mut job = read_job(t.jobs, id)?;
                if !expired(id, &job.state) {
                    return Ok(false);
                }
                let old = job.state.clone();
                job.state = JobState::Queued { not_before: now };
                write_job(t, Some(&old), &job)?;
                Ok(true)
            })?;
            if changed {
                self.leases.release(id);
            }
            recovered += usize::from(changed);
        }
        if recovered > 0 {
            self.flush().await?;
        }
        Ok(recovered)
    }
}
