//! The job queue. A job is leased, never popped: `queued -> running(lease) -> done | failed`, and
//! a lease that is not renewed expires and puts the job back. So a crash at any point loses no job
//! (it is still on disk, queued or running) and duplicates none (the lease token guards completion:
//! a worker whose lease was lost cannot complete the job a second time). Expiry is judged on a
//! clock that stops while the machine is suspended (`lease_clock.rs`).

use std::time::Duration;

use nightmail_types::Timestamp;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};

use crate::delivery::deliver_in;
use crate::in_progress::withdraw_in;
use crate::job::{Finish, Job, JobState, LeasedJob, Progress, Retry, RetryPolicy};
use crate::job_index::IndexTrees;
use crate::outbound::charge_in;
use crate::refs::RefTrees;
use crate::schema::{JOBS, LIVE_JOBS, Tx, decode, encode};
use crate::{Incoming, JobId, Receipt, Store, StoreError};

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
        let (ids, _staged) = self.ready(mail)?;
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
        let (ids, _staged) = self.ready(ack.as_ref())?;
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
            let gone = (&t.jobs, &t.message_refs, &t.collected, &t.message_ids, &t.replies, &t.answers, &t.open_jobs)
                .transaction(|(jobs, refs, collected, message_ids, replies, answers, open_jobs)| {
                // Re-read: a job is never un-finished, but it may already be gone.
                let Some(bytes) = jobs.get(id.to_be_bytes())? else { return Ok(false) };
                let job: Job = decode(JOBS, &bytes).map_err(ConflictableTransactionError::Abort)?;
                jobs.remove(&id.to_be_bytes()[..])?;
                IndexTrees { replies, answers, open_jobs }.remove(&job)?;
                RefTrees { refs, collected, message_ids }.release::<StoreError>(job.message)?;
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
