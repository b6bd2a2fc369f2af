//! The worker: takes a job from the queue (a lease, never a pop), turns its mail thread into a
//! conversation, runs the model's backend, and delivers a threaded reply, atomically with marking
//! the job done. Loops are refused, failures retried with backoff, and a job that finally fails
//! sends its asker a notice: never silence.
//!
//! A job's life, module by module, from the top: `answer` (read, gate, fit and generate,
//! finish), `concierge` (a new job acknowledged, or answered at once if a command), `control`
//! (`status`, `cancel`), `generation` (the backend's stream, progress, the lease), `gate` (loop
//! rules, the rate limit), `letters` (replies and notices), `pacing` (how long answers take),
//! `setup` (what a job runs with). Each imports only modules after it in this list, and the
//! modules below them (mail, conversation, fit, compose, backend…) none of these; this file
//! wires them.

pub mod answer;
pub mod concierge;
pub mod control;
pub mod gate;
pub mod generation;
pub mod letters;
pub mod pacing;
pub mod research;
pub mod setup;

pub mod ask;
pub mod backend;
pub mod checkpoints;
pub mod compose;
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
pub mod voice;

use std::sync::Arc;
use std::time::Duration;

use nightmail_config::Config;
use nightmail_store::{RetryPolicy, Store};
use tokio::sync::watch;

use crate::setup::Shift;
pub use crate::setup::{Backends, Setup, backends, retry_policy};

/// How often the worker looks for due jobs when none is waiting; the concierge looks every two.
const POLL: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct Worker {
    store: Store,
    setup: Setup,
    policy: RetryPolicy,
    /// Where SIGHUP announces a new setup; each job and triage pass takes the latest.
    live: Option<watch::Receiver<Setup>>,
}

impl Worker {
    pub fn new(store: Store, config: Arc<Config>, backends: Backends) -> Worker {
        let policy = retry_policy(&config.worker);
        let mail_index = setup::mail_index(&config, None);
        Worker { store, setup: Setup { config, backends: Arc::new(backends), mail_index }, policy, live: None }
    }

    /// A worker that takes each job's models from the latest setup sent on `live`. The
    /// `[worker]` section (slots, lease, retries) is the first setup's: it needs a restart.
    pub fn reloading(store: Store, live: watch::Receiver<Setup>) -> Worker {
        let setup = live.borrow().clone();
        let policy = retry_policy(&setup.config.worker);
        Worker { store, setup, policy, live: Some(live) }
    }

    /// The latest setup: what a job that starts now runs with, to its end.
    fn shift(&self) -> Shift {
        let setup = self.live.as_ref().map_or_else(|| self.setup.clone(), |live| live.borrow().clone());
        Shift { store: self.store.clone(), setup, policy: self.policy.clone() }
    }

    /// Answers jobs until `stop` turns true, `concurrency` at a time.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let data_dir = &self.setup.config.data_dir;
        match checkpoints::sweep(data_dir, &self.store) {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} checkpoint(s) of jobs that had ended"),
            Err(e) => tracing::warn!("cannot sweep checkpoints: {e}"),
        }
        match self.store.sweep_progress_mail().await {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} In Progress message(s) of jobs that had ended"),
            Err(e) => tracing::warn!("cannot sweep the In Progress mailboxes: {e}"),
        }
        let slots = self.setup.config.worker.concurrency;
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
            match self.store.lease_next(self.setup.config.worker.lease).await {
                Ok(Some(leased)) => {
                    let id = leased.job().id;
                    let shift = self.shift();
                    if let Err(e) = answer::Answer::new(&shift, stop.clone()).run(leased).await {
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

    /// The concierge's loop: a look at new jobs every `2 * POLL`, with the latest setup.
    async fn concierge(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let shift = self.shift();
            if let Err(e) = concierge::Concierge::new(&shift).triage_queue().await {
                tracing::error!("concierge: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL * 2) => {}
                _ = stop.changed() => {}
            }
        }
    }
}
