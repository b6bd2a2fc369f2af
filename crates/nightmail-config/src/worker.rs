//! `[worker]`: how many jobs are answered at once, their leases, retries and retention.

use std::time::Duration;

use serde::Deserialize;

/// The worker that answers jobs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Jobs answered at once; 0 accepts and queues mail without answering it.
    pub concurrency: usize,
    /// How long a job's lease lasts without a heartbeat; a crashed worker's job is retaken after it.
    pub lease: Duration,
    /// Replies to one sender per hour at most: a loop that slips past the header rules stops here.
    pub max_replies_per_sender_per_hour: u32,
    /// Backoff for failed attempts: doubles from `retry_base`, at most `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Attempts before a job fails with a notice to the sender.
    pub max_attempts: u32,
    /// How long a finished job (and the question bytes only it holds) is kept; `None` (0 days in
    /// the file): for ever. The users' mail is never touched.
    pub retention: Option<Duration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawWorker {
    concurrency: usize,
    lease_secs: u64,
    max_replies_per_sender_per_hour: u32,
    retry_base_secs: u64,
    retry_max_secs: u64,
    max_attempts: u32,
    retention_days: u64,
}

impl Default for RawWorker {
    fn default() -> Self {
        RawWorker {
            concurrency: 4,
            lease_secs: 300,
            max_replies_per_sender_per_hour: 30,
            retry_base_secs: 60,
            retry_max_secs: 3600,
            max_attempts: 8,
            retention_days: 30,
        }
    }
}

pub(crate) fn check(raw: &RawWorker) -> WorkerConfig {
    WorkerConfig {
        concurrency: raw.concurrency,
        lease: Duration::from_secs(raw.lease_secs.max(10)),
        max_replies_per_sender_per_hour: raw.max_replies_per_sender_per_hour,
        retry_base: Duration::from_secs(raw.retry_base_secs),
        retry_max: Duration::from_secs(raw.retry_max_secs.max(raw.retry_base_secs)),
        max_attempts: raw.max_attempts.max(1),
        retention: (raw.retention_days > 0).then(|| Duration::from_secs(raw.retention_days.saturating_mul(86_400))),
    }
}
