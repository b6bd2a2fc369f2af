//! `model bench`: what streaming a model costs on this machine. One run measures the disk's
//! sequential direct-read bandwidth, decodes greedily with experts streamed through a cache of the
//! given size, and compares the time per token with the I/O floor: the bytes it read per token
//! over that bandwidth.

use nightmail_formats::FormatError;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use nightmail_engine::Result;
use nightmail_engine::argmax;
use nightmail_engine::stream::{
    DenseStats, MemoryBudget, StreamConfig, StreamStats,
    io::{disk_busy_s, reset_disk_busy, sequential_bandwidth},
};
use nightmail_engine::{LoadOptions, Model, StreamingExperts};
use nightmail_formats::{ModelFile, is_expert_tensor};
use nightmail_model::LayerRecall;
use nightmail_model::timeline;

mod batch;
mod prefill;
mod verify;

pub use batch::{BatchPoint, BatchReport, JoinReport, bench_batch, bench_join};
pub use prefill::{PrefillReport, bench_prefill};
pub use verify::{AcceptancePoint, VerifyPoint, VerifyReport, bench_verify};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub model: PathBuf,
    pub stream: StreamConfig,
    /// One budget for the whole model (dense layers may stream too); the expert cache's size
    /// then comes from the plan, not `stream.cache_bytes`.
    pub memory: Option<MemoryBudget>,
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
    /// Write the decode's timeline here (`stream::timeline`: one JSON span per line).
    pub timeline: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub s_per_token: f64,
    /// Dense and expert bytes read per token.
    pub disk_bytes_per_token: f64,
    pub dense_disk_bytes_per_token: f64,
    pub expert_disk_bytes_per_token: f64,
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
    /// Of the decode time, the fraction with at least one read (dense or expert) in flight, and
    /// the rate the reads achieved while so: where the time over the floor goes (a busy disk
    /// slower than the probe, or an idle one).
    pub disk_busy_fraction: f64,
    pub busy_read_gbps: f64,
    /// The same for expert reads alone.
    pub expert_busy_fraction: f64,
    pub disk_gbps_before: f64,
    pub disk_gbps_after: f64,
    pub direct_io: bool,
    /// Per expert file (one per disk for a striped model): bytes read over the decode and the
    /// rate while its reads were in flight.
    pub disks: Vec<DiskRate>,
    pub tokens: usize,
    pub prefill_s: f64,
    pub dense_bytes: u64,
    pub cache_budget_bytes: u64,
    pub memory_budget_bytes: Option<u64>,
    /// Dense layers resident and streamed under the memory budget.
    pub resident_layers: usize,
    pub streamed_layers: usize,
    #[serde(flatten)]
    pub rss: Rss,
    /// Per MoE layer: distinct experts routed to over the timed tokens.
    pub distinct_experts: Vec<(usize, usize)>,
    pub recall_per_layer: Vec<LayerRecall>,
    pub stats: StreamStats,
    pub dense_stats: Option<DenseStats>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiskRate {
    pub path: PathBuf,
    pub disk_bytes: u64,
    pub busy_gbps: f64,
}

/// Where the expert data of a model starts (or, without experts, its first tensor: to probe
/// the disk on the same file region), and the bytes of its dense weights.
fn expert_region_and_dense_bytes(path: &Path) -> Result<((PathBuf, u64), u64)> {
    let ck = ModelFile::open(path)?;
    type At = Option<(PathBuf, u64)>;
    let (mut first, mut first_dense, mut dense): (At, At, u64) = (None, None, 0);
    let earlier = |slot: &mut At, at: At| {
        if let Some((p, o)) = at
            && slot.as_ref().is_none_or(|(_, f)| o < *f)
        {
            *slot = Some((p, o));
        }
    };
    for t in ck.all_tensors()? {
        if !is_expert_tensor(&t.name) {
            dense += t.bytes.len() as u64;
            earlier(&mut first_dense, ck.locate(&t));
        } else {
            earlier(&mut first, ck.locate(&t));
        }
    }
    let first = first.or(first_dense).ok_or_else(|| FormatError::Unsupported {
        what: format!("benchmarking {}", path.display()),
        hint: "no tensor of the model lies in a file to read it from".into(),
    })?;
    Ok((first, dense))
}

/// This process's resident memory (Linux: `/proc/self/status`, zeros where it is missing; macOS:
/// the task's resident size from mach and the peak from `getrusage`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rss {
    pub rss_bytes: u64,
    pub rss_peak_bytes: u64,
    /// Of the current RSS: anonymous memory (weights, cache, heap) and file pages (the binary);
    /// zeros where the system does not split it (`split` false).
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    pub split: bool,
}

#[cfg(not(target_os = "macos"))]
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
        split: true,
    }
}

/// macOS has no `/proc`: the resident size from `task_info(MACH_TASK_BASIC_INFO)`, the peak from
/// `getrusage`, whose `ru_maxrss` is in bytes there (getrusage(2) on macOS; Linux's is in KiB).
#[cfg(target_os = "macos")]
pub fn rss() -> Rss {
    // SAFETY: both calls write only the structs they are given, sized as they expect.
    let (now, peak) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let peak = if libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0 { usage.ru_maxrss as u64 } else { 0 };
        let mut info: libc::mach_task_basic_info = std::mem::zeroed();
        let mut count = libc::MACH_TASK_BASIC_INFO_COUNT;
        // libc marks mach_task_self deprecated in favour of the mach2 crate; it is the same call.
        #[allow(deprecated)]
        let task = libc::mach_task_self();
        let kr = libc::task_info(task, libc::MACH_TASK_BASIC_INFO, (&raw mut info).cast(), &mut count);
        (if kr == libc::KERN_SUCCESS { info.resident_size } else { 0 }, peak)
    };
    Rss { rss_bytes: now, rss_peak_bytes: peak, rss_anon_bytes: 0, rss_file_bytes: 0, split: false }
}

/// The disk's sequential direct-read rate over the model's expert region, in bytes/s.
fn probe_disk(opts: &BenchOptions, file: &Path, start: u64, what: &str) -> Result<f64> {
    Ok(sequential_bandwidth(file, start, opts.probe_bytes, 4 << 20, opts.probe_parallel)
        .map_err(|source| FormatError::Io { path: file.to_path_buf(), source })
        .inspect(|bw| eprintln!("disk {what}: {:.2} GB/s sequential direct reads", bw / 1e9))?)
}

/// The model loaded with its experts (and, under a memory budget, dense layers) streamed; an
/// error when nothing streams.
fn load_streamed(opts: &BenchOptions) -> Result<Model> {
    let options = LoadOptions { stream: Some(opts.stream.clone()), memory: opts.memory.clone() };
    let model = Model::load_with(&opts.model, &options)?;
    if model.streaming().is_none() && model.dense_stream().is_none() {
        return Err(FormatError::Unsupported {
            what: format!("benchmarking {}", opts.model.display()),
            hint: match &opts.memory {
                Some(_) => "the whole model fits in the memory budget: nothing streams (lower --memory-mb)".into(),
                None => "the model has no routed experts to stream (give --memory-mb to stream dense layers)".into(),
            },
        }
        .into());
    }
    Ok(model)
}

/// Counters of both streams, zeros for the one that does not run.
fn stream_stats(model: &Model) -> (StreamStats, Option<DenseStats>) {
    (model.streaming().map(StreamingExperts::stats).unwrap_or_default(), model.dense_stream().map(|d| d.stats()))
}

/// One JSON span per line (`benches/timeline.py` reads them).
fn write_timeline(path: &Path, spans: &[timeline::Span]) -> Result<()> {
    let mut text = String::new();
    for s in spans {
        text.push_str(&serde_json::to_string(s).expect("a span serializes"));
        text.push('\n');
    }
    Ok(std::fs::write(path, text).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })?)
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
    let vocab = model.spec().vocab_size as u32;
    let prompt: Vec<u32> = opts.prompt_tokens.iter().map(|t| t % vocab).collect();
    let mut cache = model.new_cache();
    let t0 = Instant::now();
    let mut logits = model.logits(&prompt, &mut cache)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    model.reset_stats();
    reset_disk_busy();
    if opts.timeline.is_some() {
        timeline::start();
    }
    let t0 = Instant::now();
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    for _ in 0..opts.tokens {
        let next = if opts.greedy { argmax(&logits) } else { rng.next() % vocab };
        let step = timeline::now();
        logits = model.logits(&[next], &mut cache)?;
        timeline::record_step(1, step);
    }
    let decode_s = t0.elapsed().as_secs_f64();
    let busy_s = disk_busy_s();
    if let Some(path) = &opts.timeline {
        write_timeline(path, &timeline::stop())?;
    }
    let (stats, dense_stats) = stream_stats(&model);
    let recall = model.prefetch_recall();
    let rss = rss();
    let direct_io = model.streaming().is_none_or(StreamingExperts::is_direct)
        && model.dense_stream().is_none_or(nightmail_engine::StreamingLayers::is_direct);
    let plan = model.memory_plan().cloned();
    drop(model);
    let after = probe_disk(opts, &file, start, "after")?;

    let n = opts.tokens.max(1) as f64;
    let bw = (before + after) / 2.0;
    let dense_disk = dense_stats.as_ref().map_or(0, |d| d.disk_bytes) as f64 / n;
    let disk_bytes_per_token = stats.disk_bytes as f64 / n + dense_disk;
    let floor = disk_bytes_per_token / bw;
    let s_per_token = decode_s / n;
    let req = stats.requests.max(1) as f64;
    let avg_expert = if stats.disk_reads > 0 { stats.disk_bytes as f64 / stats.disk_reads as f64 } else { 0.0 };
    let (chosen, used): (u64, u64) = recall.iter().fold((0, 0), |(c, u), r| (c + r.chosen, u + r.used_hits));
    let not_cached = (stats.misses + stats.prefetch_hits) as f64 * avg_expert;
    Ok(BenchReport {
        s_per_token,
        disk_bytes_per_token,
        dense_disk_bytes_per_token: dense_disk,
        expert_disk_bytes_per_token: stats.disk_bytes as f64 / n,
        hit_rate: stats.hits as f64 / req,
        prefetch_hit_rate: stats.prefetch_hits as f64 / req,
        prefetch_recall: if chosen > 0 { used as f64 / chosen as f64 } else { 0.0 },
        disk_gbps: bw / 1e9,
        floor_s_per_token: floor,
        ratio_to_floor: if floor > 0.0 { s_per_token / floor } else { f64::INFINITY },
        expert_bytes_per_token: stats.requests as f64 / n * avg_expert,
        read_amplification: if not_cached > 0.0 { stats.disk_bytes as f64 / not_cached } else { 0.0 },
        disk_busy_fraction: busy_s / decode_s,
        busy_read_gbps: if busy_s > 0.0 { disk_bytes_per_token * n / busy_s / 1e9 } else { 0.0 },
        expert_busy_fraction: stats.disk_busy_s / decode_s,
        disk_gbps_before: before / 1e9,
        disk_gbps_after: after / 1e9,
        direct_io,
        disks: stats
            .files
            .iter()
            .map(|f| DiskRate { path: f.path.clone(), disk_bytes: f.disk_bytes, busy_gbps: f.busy_gbps() })
            .collect(),
        tokens: opts.tokens,
        prefill_s,
        dense_bytes: dense,
        cache_budget_bytes: stats.cache_budget_bytes,
        memory_budget_bytes: opts.memory.as_ref().map(|m| m.bytes as u64),
        resident_layers: plan.as_ref().map_or(0, |p| p.resident_layers.len()),
        streamed_layers: plan.as_ref().map_or(0, |p| p.streamed_layers.len()),
        rss,
        distinct_experts: stats.distinct_experts.clone(),
        recall_per_layer: recall,
        stats,
        dense_stats,
    })
}
