//! `nightmail status`: the queue, from the running daemon if there is one, else from the store.

use anyhow::{Context, bail};
use nightmail_config::Config;
use nightmail_store::{Job, JobState, Store};
use nightmail_types::Timestamp;
use serde::{Deserialize, Serialize};

use crate::control::{Request, ask};

#[derive(Serialize, Deserialize)]
pub struct Report {
    /// `daemon` (asked over the control socket) or `store` (read directly).
    pub source: String,
    pub jobs: Vec<JobView>,
}

#[derive(Serialize, Deserialize)]
pub struct JobView {
    pub id: u64,
    pub state: String,
    pub model: String,
    pub from: String,
    pub subject: String,
    pub message_id: String,
    pub created_at_ms: u64,
    pub age_secs: u64,
    pub attempts: u32,
    /// Answer tokens generated so far (or in the end).
    pub tokens_generated: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The Message-ID of the acknowledgement sent for this job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack: Option<String>,
}

impl JobView {
    fn of(job: &Job, now: Timestamp) -> JobView {
        JobView {
            id: job.id.0,
            state: job.state.name().to_string(),
            model: job.model.to_string(),
            from: job.from.clone(),
            subject: job.subject.clone(),
            message_id: job.message_id.clone(),
            created_at_ms: job.created_at.0,
            age_secs: now.since(job.created_at).as_secs(),
            attempts: job.attempts,
            tokens_generated: job.progress.as_ref().map_or(0, |p| p.output_tokens),
            ack: job.ack.clone(),
            reason: match &job.state {
                JobState::Failed { reason, .. } => Some(reason.clone()),
                _ => None,
            },
        }
    }
}

impl Report {
    pub fn from_store(store: &Store, source: &str) -> anyhow::Result<Report> {
        let now = Timestamp::now();
        let jobs = store.jobs()?.iter().map(|j| JobView::of(j, now)).collect();
        Ok(Report { source: source.to_string(), jobs })
    }
}

pub fn print(config: &Config, json: bool) -> anyhow::Result<()> {
    let report = match ask(&config.data_dir, &Request::Status)? {
        Some(value) => {
            if let Some(error) = value.get("error") {
                bail!("the daemon refused the request: {error}");
            }
            serde_json::from_value(value).context("the daemon's status report")?
        }
        None => {
            let dir = config.data_dir.join("store");
            if !dir.exists() {
                Report { source: "store".into(), jobs: Vec::new() }
            } else {
                let store = Store::open(&dir).with_context(|| {
                    format!(
                        "no daemon answered on {}, and the store is not readable",
                        crate::control::socket_path(&config.data_dir).display()
                    )
                })?;
                Report::from_store(&store, "store")?
            }
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if report.jobs.is_empty() {
        println!("no jobs");
        return Ok(());
    }
    println!("{:>20}  {:<9}  {:>7}  {:<28}  {:<32}  MESSAGE-ID", "ID", "STATE", "AGE", "FROM", "SUBJECT");
    for job in &report.jobs {
        println!(
            "{:>20}  {:<9}  {:>7}  {:<28}  {:<32}  {}",
            job.id,
            job.state,
            age(job.age_secs),
            clip(&job.from, 28),
            clip(&job.subject, 32),
            job.message_id
        );
    }
    Ok(())
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        text.chars().take(width - 1).collect::<String>() + "…"
    }
}
