//! A job's values: the record of one message for one model address, its state, its progress as
//! it streams, and how an attempt ends (`queue.rs` holds the transactions that change them).

use std::time::Duration;

use nightmail_types::{Address, Timestamp};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::in_progress::ProgressMail;
use crate::{Incoming, JobId, MessageKey, Summary};

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
    pub(crate) token: u64,
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
