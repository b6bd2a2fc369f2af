//! The indexes that answer the worker's questions about jobs (schema 12): how many replies a
//! sender had since a time, a model's last answers, and what is ahead of a job in its model's
//! queue. Each is kept by `queue::write_job` in the transaction that changes the job, so a store
//! with years of finished jobs answers them as fast as an empty one.

use std::time::Duration;

use nightmail_types::{Address, Timestamp};
use sled::transaction::TransactionalTree;

use crate::job::{Job, JobState};
use crate::schema::{ANSWERS, OPEN_JOBS};
use crate::{JobId, Store, StoreError};

/// One of a model's answers, as its pace needs it: when the attempt that answered started, when
/// it was done, and how many tokens it wrote (reasoning included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    pub started_at: Timestamp,
    pub at: Timestamp,
    pub tokens: u64,
}

impl Answered {
    /// From the start of the attempt that finished to done.
    pub fn took(&self) -> Duration {
        self.at.since(self.started_at)
    }
}

/// `address` and a NUL: no address holds one, so one person's keys never share a prefix with
/// another's. The null sender `<>` is the empty address.
fn prefix(address: Option<&Address>) -> Vec<u8> {
    let mut key = address.map_or_else(Vec::new, |a| a.as_str().as_bytes().to_vec());
    key.push(0);
    key
}

fn key(address: Option<&Address>, at: Timestamp, id: JobId) -> Vec<u8> {
    let mut key = prefix(address);
    key.extend_from_slice(&at.0.to_be_bytes());
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// The first and last keys under `address` with times from `from` to `to`.
fn span(address: Option<&Address>, from: Timestamp, to: Timestamp) -> (Vec<u8>, Vec<u8>) {
    (key(address, from, JobId(0)), key(address, to, JobId(u64::MAX)))
}

/// The big-endian number at `at` in `bytes`.
fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

fn id_of(key: &[u8]) -> Option<JobId> {
    JobId::from_be_slice(key.get(key.len().checked_sub(8)?..)?)
}

/// Which of this module's indexes an entry is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Index {
    Replies,
    Answers,
    OpenJobs,
}

/// One entry a job has in an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub index: Index,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// The entries `job` has in these indexes: a reply or notice sent, an answer with its pace, a
/// place in its model's queue.
pub(crate) fn entries(job: &Job) -> Vec<Entry> {
    let mut found = Vec::new();
    if let (Some(at), Some(_)) = (replied_at(&job.state), job.reply) {
        found.push(Entry { index: Index::Replies, key: key(job.sender.as_ref(), at, job.id), value: Vec::new() });
    }
    let tokens = job.progress.as_ref().map_or(0, |p| p.output_tokens + p.reasoning_tokens);
    if let (JobState::Done { at }, Some(started_at), Some(_)) = (&job.state, job.started_at, job.reply)
        && tokens > 0
    {
        let mut value = started_at.0.to_be_bytes().to_vec();
        value.extend_from_slice(&tokens.to_be_bytes());
        found.push(Entry { index: Index::Answers, key: key(Some(&job.model), *at, job.id), value });
    }
    if is_open(&job.state) {
        let key = key(Some(&job.model), job.created_at, job.id);
        found.push(Entry { index: Index::OpenJobs, key, value: Vec::new() });
    }
    found
}

/// The keys `job` may have had while in `state` (its sender, model and arrival never change).
pub(crate) fn keys_in(job: &Job, state: &JobState) -> Vec<(Index, Vec<u8>)> {
    let mut keys = Vec::new();
    if let Some(at) = replied_at(state) {
        keys.push((Index::Replies, key(job.sender.as_ref(), at, job.id)));
    }
    if let JobState::Done { at } = state {
        keys.push((Index::Answers, key(Some(&job.model), *at, job.id)));
    }
    if is_open(state) {
        keys.push((Index::OpenJobs, key(Some(&job.model), job.created_at, job.id)));
    }
    keys
}

fn replied_at(state: &JobState) -> Option<Timestamp> {
    match state {
        JobState::Done { at } | JobState::Failed { at, .. } => Some(*at),
        _ => None,
    }
}

fn is_open(state: &JobState) -> bool {
    matches!(state, JobState::Queued { .. } | JobState::Running { .. })
}

/// The trees of these indexes in one transaction.
#[derive(Clone, Copy)]
pub(crate) struct IndexTrees<'a> {
    pub replies: &'a TransactionalTree,
    pub answers: &'a TransactionalTree,
    pub open_jobs: &'a TransactionalTree,
}

impl<'a> IndexTrees<'a> {
    fn tree(&self, index: Index) -> &'a TransactionalTree {
        match index {
            Index::Replies => self.replies,
            Index::Answers => self.answers,
            Index::OpenJobs => self.open_jobs,
        }
    }

    /// Moves `job`'s entries from what they were in state `old` to what they are now; an entry
    /// that stays the same is not written again (progress is saved every few seconds).
    pub fn update(
        &self,
        old: Option<&JobState>,
        job: &Job,
    ) -> Result<(), sled::transaction::UnabortableTransactionError> {
        let new = entries(job);
        for (index, key) in old.map(|state| keys_in(job, state)).unwrap_or_default() {
            if !new.iter().any(|e| e.index == index && e.key == key) {
                self.tree(index).remove(key)?;
            }
        }
        for entry in new {
            if self.tree(entry.index).get(&entry.key)?.as_deref() != Some(&entry.value[..]) {
                self.tree(entry.index).insert(entry.key, entry.value)?;
            }
        }
        Ok(())
    }

    /// Takes out every entry `job` has (it is being deleted).
    pub fn remove(&self, job: &Job) -> Result<(), sled::transaction::UnabortableTransactionError> {
        for (index, key) in keys_in(job, &job.state) {
            self.tree(index).remove(key)?;
        }
        Ok(())
    }
}

impl Store {
    /// The jobs that sent `sender` (`None`: the null sender) a reply or a notice and finished at
    /// `since` or later. Read from the `replies` index: no job record is decoded.
    pub fn replies_since(&self, sender: Option<&Address>, since: Timestamp) -> Result<Vec<JobId>, StoreError> {
        let (from, to) = span(sender, since, Timestamp(u64::MAX));
        let mut found = Vec::new();
        for key in self.trees.replies.range(from..=to).keys() {
            found.extend(id_of(&key?));
        }
        Ok(found)
    }

    /// `model`'s last `n` answers that wrote something, newest first. Read from the `answers`
    /// index: no job record is decoded.
    pub fn recent_answers(&self, model: &Address, n: usize) -> Result<Vec<Answered>, StoreError> {
        let (from, to) = span(Some(model), Timestamp(0), Timestamp(u64::MAX));
        let mut found = Vec::new();
        for entry in self.trees.answers.range(from..=to).rev().take(n) {
            let (key, value) = entry?;
            let corrupt = || StoreError::Corrupt { tree: ANSWERS, message: "a short entry".into() };
            let done_at = key.len().checked_sub(16).and_then(|at| be_u64(&key, at));
            found.push(Answered {
                started_at: Timestamp(be_u64(&value, 0).ok_or_else(corrupt)?),
                at: Timestamp(done_at.ok_or_else(corrupt)?),
                tokens: be_u64(&value, 8).ok_or_else(corrupt)?,
            });
        }
        Ok(found)
    }

    /// The jobs queued or running for `model` that arrived at `arrived_by` or before, oldest
    /// first: what is ahead of a job that arrived then. Decodes those jobs only.
    pub fn open_jobs_for(&self, model: &Address, arrived_by: Timestamp) -> Result<Vec<Job>, StoreError> {
        let (from, to) = span(Some(model), Timestamp(0), arrived_by);
        let ids = self.trees.open_jobs.range(from..=to).keys();
        ids.map(|key| self.open_job(&key?)).filter_map(Result::transpose).collect()
    }

    /// Every job queued or running, by id. Decodes those jobs only.
    pub fn open_jobs(&self) -> Result<Vec<Job>, StoreError> {
        let mut jobs: Vec<Job> = self
            .trees
            .open_jobs
            .iter()
            .keys()
            .map(|key| self.open_job(&key?))
            .filter_map(Result::transpose)
            .collect::<Result<_, _>>()?;
        jobs.sort_by_key(|j| j.id);
        Ok(jobs)
    }

    /// The job an `open_jobs` key names, if it is still queued or running.
    fn open_job(&self, key: &[u8]) -> Result<Option<Job>, StoreError> {
        let id = id_of(key).ok_or(StoreError::Corrupt { tree: OPEN_JOBS, message: "a short key".into() })?;
        let Some(bytes) = self.trees.jobs.get(id.to_be_bytes())? else { return Ok(None) };
        let job = self.read_counted(&bytes)?;
        Ok(is_open(&job.state).then_some(job))
    }
}
