//! `nightmail status --watch`: a live view of the answers being written, one progress bar per
//! running job (indicatif): who asked and about what, tokens written of the answer's limit,
//! seconds per token over the last half minute and since the view started, and the time left at
//! the recent pace, and for a local model that streams weights from disk the engine's figures
//! (expert cache hits, disk read rate, prefetch recall). It polls the same report as `status` (the daemon's control socket, else the
//! store) once a second and runs until interrupted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use nightmail_config::Config;

use crate::status::{JobView, Report, age, clip, engine_line, fetch};

/// The window "now" is measured over.
const RECENT: Duration = Duration::from_secs(30);

/// What one job's bar has seen: every poll's token count, the oldest kept only within `RECENT`.
struct Seen {
    bar: ProgressBar,
    /// Whether the bar knows the answer's limit yet (a job's first report may come before it).
    bounded: bool,
    first: (Instant, u64),
    recent: Vec<(Instant, u64)>,
}

impl Seen {
    fn observe(&mut self, at: Instant, tokens: u64) {
        self.recent.push((at, tokens));
        // Keep one sample at or before the window's start, so the window is always covered.
        while self.recent.len() > 2 && at.duration_since(self.recent[1].0) >= RECENT {
            self.recent.remove(0);
        }
    }

    /// Seconds per token between two samples, if any token came between them.
    fn pace(from: (Instant, u64), to: (Instant, u64)) -> Option<f64> {
        (to.1 > from.1).then(|| to.0.duration_since(from.0).as_secs_f64() / (to.1 - from.1) as f64)
    }

    fn message(&self, job: &JobView) -> String {
        let last = *self.recent.last().expect("observed at least once");
        let now = Seen::pace(self.recent[0], last);
        let average = Seen::pace(self.first, last);
        let shown = |p: Option<f64>| p.map_or_else(|| "-".to_string(), |p| format!("{p:.2}"));
        let eta = match (now.or(average), job.max_tokens) {
            (Some(pace), Some(limit)) if limit > job.tokens_generated => {
                format!("at most {} left", age((pace * (limit - job.tokens_generated) as f64) as u64))
            }
            _ => "time left unknown".to_string(),
        };
        let mut text = format!("{} s/token now, {} on average; {eta}", shown(now), shown(average));
        if let Some(engine) = &job.engine {
            text.push_str(&format!("\n  engine: {}", engine_line(engine)));
        }
        text
    }
}

pub fn run(config: &Config) -> anyhow::Result<()> {
    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
    let header = multi.add(ProgressBar::new_spinner());
    header.set_style(ProgressStyle::with_template("{msg}").expect("a fixed template"));
    let style = ProgressStyle::with_template("{prefix}\n  [{bar:40}] {pos}/{len} tokens  {msg}")
        .expect("a fixed template")
        .progress_chars("=> ");
    let unbounded =
        ProgressStyle::with_template("{prefix}\n  {spinner} {pos} tokens  {msg}").expect("a fixed template");
    let mut bars: HashMap<u64, Seen> = HashMap::new();
    loop {
        let report = fetch(config)?;
        let at = Instant::now();
        header.set_message(summary(&report));
        let running: Vec<&JobView> = report.jobs.iter().filter(|j| j.state == "running").collect();
        for job in &running {
            let seen = bars.entry(job.id).or_insert_with(|| {
                let bar = multi.add(ProgressBar::new(0));
                bar.set_style(unbounded.clone());
                bar.set_prefix(format!("job {}: {} · {}", job.id, clip(&job.from, 32), clip(&job.subject, 48)));
                Seen { bar, bounded: false, first: (at, job.tokens_generated), recent: Vec::new() }
            });
            if let Some(limit) = job.max_tokens {
                seen.bar.set_length(limit);
                if !seen.bounded {
                    seen.bar.set_style(style.clone());
                    seen.bounded = true;
                }
            }
            seen.observe(at, job.tokens_generated);
            seen.bar.set_position(job.tokens_generated);
            seen.bar.set_message(seen.message(job));
        }
        // A job no longer running has been answered, has failed or waits to retry: its bar goes.
        bars.retain(|id, seen| {
            let still = running.iter().any(|j| j.id == *id);
            if !still {
                seen.bar.finish_and_clear();
                multi.remove(&seen.bar);
            }
            still
        });
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn summary(report: &Report) -> String {
    let count = |state: &str| report.jobs.iter().filter(|j| j.state == state).count();
    format!(
        "nightmail ({}): {} running, {} queued, {} done, {} failed   (Ctrl-C to leave)",
        report.source,
        count("running"),
        count("queued"),
        count("done"),
        count("failed")
    )
}
