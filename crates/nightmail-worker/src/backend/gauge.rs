//! The local engine's figures for `status`: expert cache hit rate, disk read rate and prefetch
//! recall, each over the few seconds since the last sample rather than since the model loaded,
//! so a watcher sees how the engine is doing now. Read from the engine's own counters
//! (`StreamingExperts::stats`, `StreamingLayers::stats`, `Model::prefetch_recall`).

use std::time::{Duration, Instant};

use nightmail_engine::Model;
use nightmail_store::EngineFigures;

/// How often the figures are sampled (and sent to the jobs in the batch).
pub const EVERY: Duration = Duration::from_secs(1);

/// The engine's running totals at one moment.
#[derive(Clone, Copy, Default)]
struct Totals {
    requests: u64,
    in_ram: u64,
    disk_bytes: u64,
    chosen: u64,
    guessed: u64,
}

impl Totals {
    fn of(model: &Model) -> Totals {
        let mut t = Totals::default();
        if let Some(s) = model.streaming().map(|s| s.stats()) {
            t.requests = s.requests;
            t.in_ram = s.hits + s.prefetch_hits;
            t.disk_bytes = s.disk_bytes;
        }
        if let Some(d) = model.dense_stream().map(|d| d.stats()) {
            t.disk_bytes += d.disk_bytes;
        }
        for layer in model.prefetch_recall() {
            t.chosen += layer.chosen;
            t.guessed += layer.used_hits;
        }
        t
    }
}

/// Samples the engine's counters at most every [`EVERY`].
#[derive(Default)]
pub struct Gauge {
    last: Option<(Instant, Totals)>,
}

impl Gauge {
    /// The figures since the last sample, when one is due and the model streams anything.
    pub fn sample(&mut self, model: &Model) -> Option<EngineFigures> {
        if model.streaming().is_none() && model.dense_stream().is_none() {
            return None;
        }
        // The counters are read only when a sample is due: a step is milliseconds.
        if self.last.is_some_and(|(at, _)| at.elapsed() < EVERY) {
            return None;
        }
        let now = (Instant::now(), Totals::of(model));
        let (at, before) = self.last.replace(now)?;
        let elapsed = now.0.duration_since(at);
        let after = now.1;
        let permille = |part: u64, whole: u64| (whole > 0).then(|| (part * 1000 / whole) as u32);
        Some(EngineFigures {
            cache_hit_permille: permille(after.in_ram - before.in_ram, after.requests - before.requests),
            disk_kb_per_s: Some(((after.disk_bytes - before.disk_bytes) as f64 / 1e3 / elapsed.as_secs_f64()) as u64),
            prefetch_recall_permille: permille(after.guessed - before.guessed, after.chosen - before.chosen),
        })
    }
}
