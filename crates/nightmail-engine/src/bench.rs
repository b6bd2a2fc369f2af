//! `model bench`: what streaming a model costs on this machine. One run measures the disk's
//! sequential direct-read bandwidth, decodes greedily with experts streamed through a cache of the
//! given size, and compares the time per token with the I/O floor: the bytes it read per token
//! over that bandwidth.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::format::{Checkpoint, is_expert_tensor};
use crate::model::LayerRecall;
use crate::sampling::argmax;
use crate::stream::{StreamConfig, StreamStats, io::sequential_bandwidth};
use crate::{LoadOptions, Model};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub model: PathBuf,
    pub stream: StreamConfig,
    /// Decode steps to time (after the prompt's prefill).
    pub tokens: usize,
    pub prompt_tokens: Vec<u32>,
    /// Bytes of the file read sequentially to measure the disk, before and after the decode.
    pub probe_bytes: u64,
    /// Probe reads in flight: the disk's best sequential rate needs a deep queue.
    pub probe_parallel: usize,
    /// Feed back each step's argmax. Otherwise each step is fed a pseudo-random token (seeded),
    /// as llama.cpp's llama-bench does: a random-weight model's greedy output repeats one token,
    /// whose identical routes would make the cache look far better than real text does.
    pub greedy: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub s_per_token: f64,
    pub disk_bytes_per_token: f64,
    /// Asked-for experts already cached from an earlier step.
    pub hit_rate: f64,
    /// Asked-for experts that a prefetch had read or was reading.
    pub prefetch_hit_rate: f64,
    /// Of the experts each step chose, the fraction the prefetch guess named (all MoE layers).
    pub prefetch_recall: f64,
    pub disk_gbps: f64,
    pub floor_s_per_token: f64,
    pub ratio_to_floor: f64,
    /// Routed-expert bytes each token needs (top-k in every MoE layer).
    pub expert_bytes_per_token: f64,
    /// Disk bytes over the bytes of experts that were not already cached.
    pub read_amplification: f64,
    /// Of the decode time, the fraction with at least one expert read in flight, and the rate
    /// the reads achieved while so: where the time over the floor goes.
    pub disk_busy_fraction: f64,
    pub busy_read_gbps: f64,
    pub disk_gbps_before: f64,
    pub disk_gbps_after: f64,
    pub direct_io: bool,
    pub tokens: usize,
    pub prefill_s: f64,
    pub dense_bytes: u64,
    pub cache_budget_bytes: u64,
    #[serde(flatten)]
    pub rss: Rss,
    /// Per MoE layer: distinct experts routed to over the timed tokens.
    pub distinct_experts: Vec<(usize, usize)>,
    pub recall_per_layer: Vec<LayerRecall>,
    pub stats: StreamStats,
}

/// Where the expert data of a model starts (to probe the disk on the same file region), and the
/// bytes of its dense weights.
fn expert_region_and_dense_bytes(path: &Path) -> Result<((PathBuf, u64), u64)> {
    let ck = Checkpoint::open(path)?;
    let (mut first, mut dense): (Option<(PathBuf, u64)>, u64) = (None, 0);
    for t in ck.all_tensors()? {
        if !is_expert_tensor(&t.name) {
            dense += t.bytes.len() as u64;
        } else if let Some((p, o)) = ck.locate(&t)
            && first.as_ref().is_none_or(|(_, f)| o < *f)
        {
            first = Some((p, o));
        }
    }
    let first = first.ok_or_else(|| EngineError::Unsupported {
        what: format!("benchmarking {}", path.display()),
        hint: "the model has no routed experts to stream".into(),
    })?;
    Ok((first, dense))
}

/// This process's resident memory (`/proc/self/status`; zeros where it is missing).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rss {
    pub rss_bytes: u64,
    pub rss_peak_bytes: u64,
    /// Of the current RSS: anonymous memory (weights, cache, heap) and file pages (the binary).
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
}

pub fn rss() -> Rss {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    Rss {
        rss_bytes: field("VmRSS:"),
        rss_peak_bytes: field("VmHWM:"),
        rss_anon_bytes: field("RssAnon:"),
        rss_file_bytes: field("RssFile:"),
    }
}

/// The disk's sequential direct-read rate over the model's expert region, in bytes/s.
fn probe_disk(opts: &BenchOptions, file: &Path, start: u64, what: &str) -> Result<f64> {
    sequential_bandwidth(file, start, opts.probe_bytes, 4 << 20, opts.probe_parallel)
        .map_err(|source| EngineError::Io { path: file.to_path_buf(), source })
        .inspect(|bw| eprintln!("disk {what}: {:.2} GB/s sequential direct reads", bw / 1e9))
}

/// The model loaded with its experts streamed; an error for a model without routed experts.
fn load_streamed(opts: &BenchOptions) -> Result<Model> {
    let model = Model::load_with(&opts.model, &LoadOptions { stream: Some(opts.stream.clone()) })?;
    if model.streaming().is_none() {
        return Err(EngineError::Unsupported {
            what: format!("benchmarking {}", opts.model.display()),
            hint: "the model has no routed experts to stream".into(),
        });
    }
    Ok(model)
}

/// One batch size of [`bench_batch`].
#[derive(Debug, Clone, Serialize)]
pub struct BatchPoint {
    pub batch: usize,
    pub s_per_step: f64,
    /// Tokens of all sequences together per second, and that over batch 1's.
    pub tokens_per_s: f64,
    pub speedup: f64,
    pub disk_bytes_per_step: f64,
    /// The step's I/O floor (its disk bytes over the disk's rate) and the time over it.
    pub floor_s_per_step: f64,
    pub ratio_to_floor: f64,
    /// Experts fetched per MoE layer per step: the union of the sequences' routes.
    pub experts_per_layer_step: f64,
    /// The speedup an I/O-bound step could reach if each sequence routed independently and
    /// uniformly: `batch · k` expert uses over the expected union `E · (1 − (1 − k/E)^batch)`.
    pub union_bound_speedup: f64,
    pub hit_rate: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub tokens: usize,
    pub disk_gbps: f64,
    pub experts: usize,
    pub top_k: usize,
    pub points: Vec<BatchPoint>,
}

/// Aggregate decode rate at each batch size, in one run on one loaded model: `batch` sequences
/// (each with its own prompt) step together `opts.tokens` times, fed seeded pseudo-random tokens.
pub fn bench_batch(opts: &BenchOptions, batches: &[usize]) -> Result<BatchReport> {
    let ((file, start), _) = expert_region_and_dense_bytes(&opts.model)?;
    let before = probe_disk(opts, &file, start, "before")?;
    let model = load_streamed(opts)?;
    let store = model.streaming().expect("load_streamed returns only models with streamed experts");
    let moe = model.spec().moe.as_ref().expect("a model with streamed experts has an MoE spec");
    let (experts, k) = (moe.experts, moe.routing.top_k());
    let moe_layers = model.spec().moe_layers.iter().filter(|m| **m).count().max(1);
    let vocab = model.spec().vocab_size as u32;
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut measured = Vec::new();
    for &batch in batches {
        let mut caches: Vec<_> = (0..batch).map(|_| model.new_cache()).collect();
        for (i, cache) in caches.iter_mut().enumerate() {
            let prompt: Vec<u32> = opts.prompt_tokens.iter().map(|t| (t + 7 * i as u32) % vocab).collect();
            model.logits(&prompt, cache)?;
        }
        model.reset_stats();
        let t0 = Instant::now();
        for _ in 0..opts.tokens {
            let tokens: Vec<u32> = (0..batch).map(|_| rng.next() % vocab).collect();
            let mut refs: Vec<&mut crate::SequenceState> = caches.iter_mut().collect();
            model.logits_batch(&tokens, &mut refs)?;
        }
        measured.push((batch, t0.elapsed().as_secs_f64(), store.stats()));
        eprintln!("batch {batch}: {:.3} s/step", measured.last().map_or(0.0, |m| m.1) / opts.tokens.max(1) as f64);
    }
    drop(model);
    let bw = (before + probe_disk(opts, &file, start, "after")?) / 2.0;
    let steps = opts.tokens.max(1) as f64;
    let base = measured.first().map(|(b, t, _)| *b as f64 * steps / t).unwrap_or(0.0);
    let points = measured
        .into_iter()
        .map(|(batch, t, stats)| {
            let tokens_per_s = batch as f64 * steps / t;
            let disk = stats.disk_bytes as f64 / steps;
            let floor = disk / bw;
            let expected_union = experts as f64 * (1.0 - (1.0 - k as f64 / experts as f64).powi(batch as i32));
            BatchPoint {
                batch,
                s_per_step: t / steps,
                tokens_per_s,
                speedup: if base > 0.0 { tokens_per_s / base } else { 0.0 },
                disk_bytes_per_step: disk,
                floor_s_per_step: floor,
                ratio_to_floor: if floor > 0.0 { t / steps / floor } else { f64::INFINITY },
                experts_per_layer_step: stats.requests as f64 / steps / moe_layers as f64,
                union_bound_speedup: (batch * k) as f64 / expected_union,
                hit_rate: stats.hits as f64 / stats.requests.max(1) as f64,
            }
        })
        .collect();
    Ok(BatchReport { tokens: opts.tokens, disk_gbps: bw / 1e9, experts, top_k: k, points })
}

/// xorshift64* (Marsaglia 2003; Vigna 2016): the bench's seeded token stream.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u32
    }
}

pub fn bench(opts: &BenchOptions) -> Result<BenchReport> {
    let ((file, start), dense) = expert_region_and_dense_bytes(&opts.model)?;
    let before = probe_disk(opts, &file, start, "before")?;
    let model = load_streamed(opts)?;
    let store = model.streaming().expect("load_streamed returns only models with streamed experts");
    let vocab = model.spec().vocab_size as u32;
    let prompt: Vec<u32> = opts.prompt_tokens.iter().map(|t| t % vocab).collect();
    let mut cache = model.new_cache();
    let t0 = Instant::now();
    let mut logits = model.logits(&prompt, &mut cache)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    model.reset_stats();
    let t0 = Instant::now();
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    for _ in 0..opts.tokens {
        let next = if opts.greedy { argmax(&logits) } else { rng.next() % vocab };
        logits = model.logits(&[next], &mut cache)?;
    }
    let decode_s = t0.elapsed().as_secs_f64();
    let stats = store.stats();
    let recall = model.prefetch_recall();
    let rss = rss();
    let direct_io = store.is_direct();
    drop(model);
    let after = probe_disk(opts, &file, start, "after")?;

    let n = opts.tokens.max(1) as f64;
    let bw = (before + after) / 2.0;
    let disk_bytes_per_token = stats.disk_bytes as f64 / n;
    let floor = disk_bytes_per_token / bw;
    let s_per_token = decode_s / n;
    let req = stats.requests.max(1) as f64;
    let avg_expert = if stats.disk_reads > 0 { stats.disk_bytes as f64 / stats.disk_reads as f64 } else { 0.0 };
    let (chosen, used): (u64, u64) = recall.iter().fold((0, 0), |(c, u), r| (c + r.chosen, u + r.used_hits));
    let not_cached = (stats.misses + stats.prefetch_hits) as f64 * avg_expert;
    Ok(BenchReport {
        s_per_token,
        disk_bytes_per_token,
        hit_rate: stats.hits as f64 / req,
        prefetch_hit_rate: stats.prefetch_hits as f64 / req,
        prefetch_recall: if chosen > 0 { used as f64 / chosen as f64 } else { 0.0 },
        disk_gbps: bw / 1e9,
        floor_s_per_token: floor,
        ratio_to_floor: if floor > 0.0 { s_per_token / floor } else { f64::INFINITY },
        expert_bytes_per_token: stats.requests as f64 / n * avg_expert,
        read_amplification: if not_cached > 0.0 { stats.disk_bytes as f64 / not_cached } else { 0.0 },
        disk_busy_fraction: stats.disk_busy_s / decode_s,
        busy_read_gbps: if stats.disk_busy_s > 0.0 { stats.disk_bytes as f64 / stats.disk_busy_s / 1e9 } else { 0.0 },
        disk_gbps_before: before / 1e9,
        disk_gbps_after: after / 1e9,
        direct_io,
        tokens: opts.tokens,
        prefill_s,
        dense_bytes: dense,
        cache_budget_bytes: opts.stream.cache_bytes as u64,
        rss,
        distinct_experts: stats.distinct_experts.clone(),
        recall_per_layer: recall,
        stats,
    })
}
