//! `nightmail status`: the queue, from the running daemon if there is one, else from the store.

use std::path::Path;

use anyhow::{Context, bail};
use nightmail_config::Config;
use nightmail_store::{EngineFigures, Job, JobState, Outbound, OutboundState, Progress, Store};
use nightmail_types::Timestamp;
use nightmail_worker::checkpoints;
use serde::{Deserialize, Serialize};

use crate::control::{Request, ask};

#[derive(Serialize, Deserialize)]
pub struct Report {
    /// `daemon` (asked over the control socket) or `store` (read directly).
    pub source: String,
    pub jobs: Vec<JobView>,
    /// Disk used by generation checkpoints, all jobs together.
    #[serde(default)]
    pub checkpoint_bytes: u64,
    /// Mail for outside recipients: waiting, and settled within the last week.
    #[serde(default)]
    pub outbound: Vec<OutboundView>,
    /// Where each bridge's reading of its upstream mailbox stands.
    #[serde(default)]
    pub bridges: Vec<BridgeView>,
}

#[derive(Serialize, Deserialize)]
pub struct BridgeView {
    /// The upstream address.
    pub address: String,
    pub uidvalidity: u32,
    /// Every upstream message up to this UID has been taken.
    pub last_uid: u32,
    /// Upstream messages whose job is queued but whose flag is not set yet.
    pub unflagged: usize,
    /// Why the last connection failed, until one succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub struct OutboundView {
    pub id: u64,
    /// queued, sending, sent, bounced or dropped.
    pub state: String,
    pub sender: String,
    pub recipient: String,
    pub message: u64,
    pub age_secs: u64,
    pub attempts: u32,
    /// Seconds until the next attempt, while queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_in_secs: Option<u64>,
    /// What the smarthost or the connection to it last said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The smarthost's answer once sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
}

impl OutboundView {
    pub fn of(entry: &Outbound, now: Timestamp) -> OutboundView {
        OutboundView {
            id: entry.id.0,
            state: entry.state.name().to_string(),
            sender: entry.sender.as_ref().map_or_else(|| "<>".to_string(), |s| s.to_string()),
            recipient: entry.recipient.to_string(),
            message: entry.message.0,
            age_secs: now.since(entry.created_at).as_secs(),
            attempts: entry.attempts,
            next_attempt_in_secs: match entry.state {
                OutboundState::Queued { not_before } => Some(not_before.since(now).as_secs()),
                _ => None,
            },
            last_error: entry.last_error.clone(),
            reply: match &entry.state {
                OutboundState::Sent { reply, .. } => Some(reply.clone()),
                _ => None,
            },
        }
    }
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
    /// Generated tokens the job's last checkpoint covers: what a restart keeps.
    #[serde(default)]
    pub checkpoint_tokens: u64,
    /// Prompt tokens the job's last checkpoint covers (a restart prefills only the rest).
    #[serde(default)]
    pub checkpoint_prompt_tokens: u64,
    /// Disk used by the job's checkpoint.
    #[serde(default)]
    pub checkpoint_bytes: u64,
    /// The answer's length limit in tokens, once the job has started writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// When the running attempt last reported progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The Message-ID of the acknowledgement sent for this job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack: Option<String>,
    /// How the local engine writing the answer is doing, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineView>,
    /// How the prompt went in, apart from the answer's time, once it is in (the local engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<PromptView>,
    /// A model with tools: the calls it has made, bytes downloaded, and its step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub research: Option<ResearchView>,
}

/// A job's research so far (docs/STATUS.md).
#[derive(Serialize, Deserialize)]
pub struct ResearchView {
    pub tool_calls: u32,
    pub bytes_fetched: u64,
    pub step: String,
}

/// A job's prompt: its length, the tokens the model ran for it and the rest restored (a thread's
/// saved state or the job's checkpoint), and the seconds it took (docs/STATUS.md).
#[derive(Serialize, Deserialize)]
pub struct PromptView {
    pub tokens: u64,
    pub prefilled_tokens: u64,
    pub reused_tokens: u64,
    pub prefill_secs: f64,
}

impl PromptView {
    fn of(p: &Progress) -> Option<PromptView> {
        let prompt_in = p.prompt_in?;
        Some(PromptView {
            tokens: p.prompt_tokens,
            prefilled_tokens: prompt_in.prefilled_tokens,
            reused_tokens: p.prompt_tokens.saturating_sub(prompt_in.prefilled_tokens),
            prefill_secs: prompt_in.prefill_ms as f64 / 1000.0,
        })
    }
}

/// The local engine's figures over its last second or so (docs/STATUS.md).
#[derive(Serialize, Deserialize)]
pub struct EngineView {
    /// Of the experts asked for, the share already in RAM (cached or prefetched), 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_hit_rate: Option<f64>,
    /// Weights read from disk, in MB (10^6 bytes) per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb_per_s: Option<f64>,
    /// Of the experts chosen while decoding, the share the prefetcher had guessed, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_recall: Option<f64>,
}

impl EngineView {
    fn of(f: &EngineFigures) -> EngineView {
        EngineView {
            cache_hit_rate: f.cache_hit_permille.map(|p| f64::from(p) / 1000.0),
            disk_mb_per_s: f.disk_kb_per_s.map(|kb| kb as f64 / 1000.0),
            prefetch_recall: f.prefetch_recall_permille.map(|p| f64::from(p) / 1000.0),
        }
    }
}

impl JobView {
    fn of(job: &Job, data_dir: &Path, now: Timestamp) -> JobView {
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
            tokens_generated: job.progress.as_ref().map_or(0, |p| p.output_tokens + p.reasoning_tokens),
            checkpoint_tokens: job.progress.as_ref().map_or(0, |p| p.checkpoint_tokens),
            checkpoint_prompt_tokens: job.progress.as_ref().map_or(0, |p| p.checkpoint_prompt_tokens),
            checkpoint_bytes: checkpoints::bytes(data_dir, job.id),
            max_tokens: job.progress.as_ref().map(|p| p.max_tokens).filter(|&m| m > 0),
            updated_at_ms: job.progress.as_ref().map(|p| p.updated_at.0),
            ack: job.ack.clone(),
            prompt: job.progress.as_ref().and_then(PromptView::of),
            research: job.progress.as_ref().and_then(|p| p.research.as_ref()).map(|r| ResearchView {
                tool_calls: r.calls,
                bytes_fetched: r.bytes,
                step: r.step.clone(),
            }),
            engine: match job.state {
                JobState::Running { .. } => job.progress.as_ref().and_then(|p| p.engine.as_ref()).map(EngineView::of),
                _ => None,
            },
            reason: match &job.state {
                JobState::Failed { reason, .. } => Some(reason.clone()),
                _ => None,
            },
        }
    }
}

impl Report {
    pub fn from_store(store: &Store, data_dir: &Path, source: &str) -> anyhow::Result<Report> {
        let now = Timestamp::now();
        let jobs = store.jobs()?.iter().map(|j| JobView::of(j, data_dir, now)).collect();
        let checkpoint_bytes = checkpoints::total_bytes(data_dir);
        let outbound = store.outbound()?.iter().map(|o| OutboundView::of(o, now)).collect();
        let bridges = store
            .bridge_states()?
            .into_iter()
            .map(|(address, s)| BridgeView {
                address,
                uidvalidity: s.uidvalidity,
                last_uid: s.last_uid,
                unflagged: s.unflagged.len(),
                last_error: s.last_error,
            })
            .collect();
        Ok(Report { source: source.to_string(), jobs, checkpoint_bytes, outbound, bridges })
    }
}

pub fn print(config: &Config, json: bool) -> anyhow::Result<()> {
    let report = fetch(config)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_jobs(&report);
    print_outbound(&report);
    print_bridges(&report);
    Ok(())
}

fn print_bridges(report: &Report) {
    for b in &report.bridges {
        match &b.last_error {
            Some(error) => println!("bridge {}: cannot read its mailbox: {error}", b.address),
            None => println!("bridge {}: UIDVALIDITY {}, taken up to UID {}", b.address, b.uidvalidity, b.last_uid),
        }
    }
}

/// The report from the running daemon, else read from the store.
pub fn fetch(config: &Config) -> anyhow::Result<Report> {
    Ok(match ask(&config.data_dir, &Request::Status)? {
        Some(value) => {
            if let Some(error) = value.get("error") {
                bail!("the daemon refused the request: {error}");
            }
            serde_json::from_value(value).context("the daemon's status report")?
        }
        None => {
            let dir = config.data_dir.join("store");
            if !dir.exists() {
                Report {
                    source: "store".into(),
                    jobs: Vec::new(),
                    checkpoint_bytes: 0,
                    outbound: Vec::new(),
                    bridges: Vec::new(),
                }
            } else {
                let store = Store::open(&dir).with_context(|| {
                    format!(
                        "no daemon answered on {}, and the store is not readable",
                        crate::control::socket_path(&config.data_dir).display()
                    )
                })?;
                Report::from_store(&store, &config.data_dir, "store")?
            }
        }
    })
}

/// The engine's figures, as `status` and the watch show them: `-` for one the last second had
/// nothing to measure.
fn prompt_line(p: &PromptView) -> String {
    format!("{} tokens ({} reused), in {:.1} s", p.tokens, p.reused_tokens, p.prefill_secs)
}

pub fn engine_line(e: &EngineView) -> String {
    let share = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.0}%", v * 100.0));
    let rate = e.disk_mb_per_s.map_or_else(|| "-".to_string(), |v| format!("{v:.1} MB/s"));
    format!("cache hits {}, disk {rate}, prefetch recall {}", share(e.cache_hit_rate), share(e.prefetch_recall))
}

fn print_jobs(report: &Report) {
    if report.jobs.is_empty() {
        println!("no jobs");
        return;
    }
    println!(
        "{:>20}  {:<9}  {:>7}  {:>13}  {:<28}  {:<32}  MESSAGE-ID",
        "ID", "STATE", "AGE", "TOKENS (SAVED)", "FROM", "SUBJECT"
    );
    for job in &report.jobs {
        println!(
            "{:>20}  {:<9}  {:>7}  {:>13}  {:<28}  {:<32}  {}",
            job.id,
            job.state,
            age(job.age_secs),
            format!("{} ({})", job.tokens_generated, job.checkpoint_tokens),
            clip(&job.from, 28),
            clip(&job.subject, 32),
            job.message_id
        );
        // A running job's prompt and engine lines; a finished one's prompt is in its reply's footer.
        if job.state == "running"
            && let Some(prompt) = &job.prompt
        {
            println!("{:>20}  prompt: {}", "", prompt_line(prompt));
        }
        if let Some(engine) = &job.engine {
            println!("{:>20}  engine: {}", "", engine_line(engine));
        }
        if let Some(r) = &job.research {
            println!(
                "{:>20}  research: {} tool calls, {} KB fetched; {}",
                "",
                r.tool_calls,
                r.bytes_fetched.div_ceil(1024),
                r.step
            );
        }
    }
    if report.checkpoint_bytes > 0 {
        println!("checkpoints on disk: {:.1} MiB", report.checkpoint_bytes as f64 / (1024.0 * 1024.0));
    }
}

/// Outbound mail still waiting, each with its last error; settled entries only as counts;
/// nothing at all when there has been none.
fn print_outbound(report: &Report) {
    let waiting: Vec<&OutboundView> =
        report.outbound.iter().filter(|o| o.state == "queued" || o.state == "sending").collect();
    let settled = |state: &str| report.outbound.iter().filter(|o| o.state == state).count();
    if report.outbound.is_empty() {
        return;
    }
    println!();
    if waiting.is_empty() {
        println!("no outbound mail waiting");
    } else {
        println!("outbound mail waiting (`nightmail outbound retry|drop ID`):");
        println!(
            "{:>20}  {:<8}  {:>7}  {:>8}  {:>7}  {:<28}  LAST ERROR",
            "ID", "STATE", "AGE", "ATTEMPTS", "NEXT", "TO"
        );
        for o in waiting {
            println!(
                "{:>20}  {:<8}  {:>7}  {:>8}  {:>7}  {:<28}  {}",
                o.id,
                o.state,
                age(o.age_secs),
                o.attempts,
                o.next_attempt_in_secs.map_or_else(|| "-".to_string(), age),
                clip(&o.recipient, 28),
                o.last_error.as_deref().unwrap_or("-")
            );
        }
    }
    let (sent, bounced, dropped) = (settled("sent"), settled("bounced"), settled("dropped"));
    if sent + bounced + dropped > 0 {
        println!("outbound in the last week: {sent} sent, {bounced} bounced, {dropped} dropped");
    }
}

pub(crate) fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

pub(crate) fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        text.chars().take(width - 1).collect::<String>() + "…"
    }
}
