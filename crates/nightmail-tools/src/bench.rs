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

/// One batch size of [`bench_batch`].
#[derive(Debug, Clone, Serialize)]
pub struct BatchPoint {
    pub batch: usize,
    pub s_per_step: f64,
    /// Tokens of all sequences together per second, and that over batch 1's.
    pub tokens_per_s: f64,
    pub speedup: f64,
    pub disk_bytes_per_step: f64,
    /// Of those, the streamed dense layers': the same at every batch size, since a step reads
    /// each layer once for all its sequences.
    pub dense_disk_bytes_per_step: f64,
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
    /// The process's memory after the last batch size (its peak over all of them).
    #[serde(flatten)]
    pub rss: Rss,
}

/// Aggregate decode rate at each batch size, in one run on one loaded model: `batch` sequences
/// (each with its own prompt) step together `opts.tokens` times, fed seeded pseudo-random tokens.
pub fn bench_batch(opts: &BenchOptions, batches: &[usize]) -> Result<BatchReport> {
    let ((file, start), _) = expert_region_and_dense_bytes(&opts.model)?;
    let before = probe_disk(opts, &file, start, "before")?;
    let model = load_streamed(opts)?;
    let (experts, k) = model.spec().moe.as_ref().map_or((0, 0), |m| (m.experts, m.routing.top_k()));
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
            let mut refs: Vec<&mut nightmail_engine::SequenceState> = caches.iter_mut().collect();
            model.logits_batch(&tokens, &mut refs)?;
        }
        measured.push((batch, t0.elapsed().as_secs_f64(), stream_stats(&model)));
        eprintln!("batch {batch}: {:.3} s/step", measured.last().map_or(0.0, |m| m.1) / opts.tokens.max(1) as f64);
    }
    let rss = rss();
    drop(model);
    let bw = (before + probe_disk(opts, &file, start, "after")?) / 2.0;
    let steps = opts.tokens.max(1) as f64;
    let base = measured.first().map(|(b, t, _)| *b as f64 * steps / t).unwrap_or(0.0);
    // The shared stream's bytes per step (the same at every batch size), and one expert's.
    let dense_step =
        measured.first().and_then(|(_, _, (_, d))| d.as_ref()).map_or(0.0, |d| d.disk_bytes as f64 / steps);
    let expert_bytes = measured
        .iter()
        .map(|(_, _, (s, _))| (s.disk_bytes, s.disk_reads))
        .fold((0, 0), |(b, r), (x, y)| (b + x, r + y));
    let one_expert = if expert_bytes.1 > 0 { expert_bytes.0 as f64 / expert_bytes.1 as f64 } else { 0.0 };
    let points = measured
        .into_iter()
        .map(|(batch, t, (stats, dense))| {
            let tokens_per_s = batch as f64 * steps / t;
            let dense_disk = dense.map_or(0, |d| d.disk_bytes) as f64 / steps;
            let disk = stats.disk_bytes as f64 / steps + dense_disk;
            let floor = disk / bw;
            let expected_union = if experts > 0 {
                experts as f64 * (1.0 - (1.0 - k as f64 / experts as f64).powi(batch as i32))
            } else {
                0.0
            };
            // Alone, each sequence reads the dense stream and its k experts per layer; together,
            // the stream once and the union of their experts.
            let per_layer = one_expert * moe_layers as f64;
            let alone = batch as f64 * (dense_step + k as f64 * per_layer);
            let together = dense_step + expected_union * per_layer;
            BatchPoint {
                batch,
                s_per_step: t / steps,
                tokens_per_s,
                speedup: if base > 0.0 { tokens_per_s / base } else { 0.0 },
                disk_bytes_per_step: disk,
                dense_disk_bytes_per_step: dense_disk,
                floor_s_per_step: floor,
                ratio_to_floor: if floor > 0.0 { t / steps / floor } else { f64::INFINITY },
                experts_per_layer_step: stats.requests as f64 / steps / moe_layers as f64,
                union_bound_speedup: if together > 0.0 { alone / together } else { batch as f64 },
                hit_rate: stats.hits as f64 / stats.requests.max(1) as f64,
            }
        })
        .collect();
    Ok(BatchReport { tokens: opts.tokens, disk_gbps: bw / 1e9, experts, top_k: k, points, rss })
}

/// One width of [`bench_verify`]: a pass over `positions` rows of one sequence (the drawn token
/// and `positions − 1` guesses; 1 is a plain decode step).
#[derive(Debug, Clone, Serialize)]
pub struct VerifyPoint {
    pub positions: usize,
    pub s_per_pass: f64,
    /// The pass's time over a one-row pass's.
    pub cost_ratio: f64,
    /// What reading each needed weight once allows an I/O-bound pass: the dense stream once and
    /// the experts as the union of the rows' routes (expected under uniform routing), over a
    /// one-row pass's bytes.
    pub bound_ratio: f64,
    /// `cost_ratio / bound_ratio`: how far a pass's cost is above what its reads allow.
    pub ratio_to_bound: f64,
    pub disk_bytes_per_pass: f64,
    pub dense_disk_bytes_per_pass: f64,
    /// The pass's measured disk bytes over a one-row pass's.
    pub read_ratio: f64,
    /// Experts fetched per MoE layer per pass: the union of the rows' routes.
    pub experts_per_layer_pass: f64,
    pub hit_rate: f64,
    /// At each acceptance rate asked for: the tokens a pass yields and the resulting s/token.
    pub at_acceptance: Vec<AcceptancePoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AcceptancePoint {
    /// The probability that a guess holds given that the ones before it held.
    pub acceptance: f64,
    pub tokens_per_pass: f64,
    pub s_per_token: f64,
    /// Plain decoding's s/token over this.
    pub speedup: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Passes timed per width (over `rounds` rounds that take the widths in turn).
    pub passes: usize,
    pub rounds: usize,
    pub disk_gbps: f64,
    pub experts: usize,
    pub top_k: usize,
    pub points: Vec<VerifyPoint>,
}

/// The cost of a verify pass by its number of rows, on one loaded model (streamed as `opts` says,
/// or resident without a cache or a budget): per width, a sequence whose prompt was prefilled
/// runs `opts.tokens` passes of seeded pseudo-random tokens, each rolled back to its first row
/// after it (as a pass whose guesses were all rejected), so every width runs at the same depth.
/// The widths take turns over `rounds` rounds, so that a change in the machine's load falls on
/// all of them.
pub fn bench_verify(opts: &BenchOptions, widths: &[usize], acceptance: &[f64], rounds: usize) -> Result<VerifyReport> {
    let ((file, start), _) = expert_region_and_dense_bytes(&opts.model)?;
    let before = probe_disk(opts, &file, start, "before")?;
    let model = if opts.memory.is_none() && opts.stream.cache_bytes == 0 {
        Model::load(&opts.model)?
    } else {
        load_streamed(opts)?
    };
    let (experts, k) = model.spec().moe.as_ref().map_or((0, 0), |m| (m.experts, m.routing.top_k()));
    let moe_layers = model.spec().moe_layers.iter().filter(|m| **m).count().max(1);
    let vocab = model.spec().vocab_size as u32;
    let prompt: Vec<u32> = opts.prompt_tokens.iter().map(|t| t % vocab).collect();
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let rounds = rounds.max(1);
    let per_round = opts.tokens.div_ceil(rounds).max(1);
    // Per width: seconds, expert stats summed (disk bytes, reads, requests, hits), dense bytes.
    let mut sums = vec![(0.0, 0u64, 0u64, 0u64, 0u64, 0u64); widths.len()];
    if opts.timeline.is_some() {
        timeline::start();
    }
    for _ in 0..rounds {
        for (i, &width) in widths.iter().enumerate() {
            let width = width.max(1);
            let mut cache = model.new_cache();
            model.logits(&prompt, &mut cache)?;
            model.reset_stats();
            let t0 = Instant::now();
            for _ in 0..per_round {
                let fed: Vec<u32> = (0..width).map(|_| rng.next() % vocab).collect();
                let pass = timeline::now();
                if width == 1 {
                    model.logits(&fed, &mut cache)?;
                } else {
                    let at = cache.position();
                    cache.begin_verify();
                    model.verify_pass(&mut cache, &fed)?;
                    let back = timeline::now();
                    cache.roll_back(at + 1)?;
                    timeline::record("roll_back", 0, None, 0, back);
                }
                timeline::record_step(width, pass);
            }
            let secs = t0.elapsed().as_secs_f64();
            let (stats, dense) = stream_stats(&model);
            let s = &mut sums[i];
            s.0 += secs;
            s.1 += stats.disk_bytes;
            s.2 += stats.disk_reads;
            s.3 += stats.requests;
            s.4 += stats.hits;
            s.5 += dense.map_or(0, |d| d.disk_bytes);
        }
    }
    if let Some(path) = &opts.timeline {
        write_timeline(path, &timeline::stop())?;
    }
    drop(model);
    let bw = (before + probe_disk(opts, &file, start, "after")?) / 2.0;
    let passes = (per_round * rounds) as f64;
    let (reads, read_bytes) = sums.iter().fold((0, 0), |(r, b), s| (r + s.2, b + s.1));
    let one_expert = if reads > 0 { read_bytes as f64 / reads as f64 } else { 0.0 };
    // The bytes an I/O-bound pass of `w` rows needs: the dense stream once, the experts of the
    // expected union of `w` independent uniform routes. The dense stream is the same at every
    // width: its mean over them, since a width's count moves by a layer with where the
    // read-ahead stood when its timing began.
    let dense_pass = sums.iter().map(|s| s.5 as f64).sum::<f64>() / passes / sums.len().max(1) as f64;
    let needed = |w: usize| {
        let union =
            if experts > 0 { experts as f64 * (1.0 - (1.0 - k as f64 / experts as f64).powi(w as i32)) } else { 0.0 };
        dense_pass + union * one_expert * moe_layers as f64
    };
    let base_s = sums.first().map_or(0.0, |s| s.0 / passes);
    let base_disk = sums.first().map_or(0.0, |s| (s.1 + s.5) as f64 / passes);
    let points = widths
        .iter()
        .zip(&sums)
        .map(|(&w, &(secs, expert_disk, _, requests, hits, dense_disk))| {
            let s_per_pass = secs / passes;
            let cost_ratio = if base_s > 0.0 { s_per_pass / base_s } else { 0.0 };
            let bound_ratio = if needed(1) > 0.0 { needed(w) / needed(1) } else { 1.0 };
            let disk = (expert_disk + dense_disk) as f64 / passes;
            VerifyPoint {
                positions: w,
                s_per_pass,
                cost_ratio,
                bound_ratio,
                ratio_to_bound: cost_ratio / bound_ratio,
                disk_bytes_per_pass: disk,
                dense_disk_bytes_per_pass: dense_disk as f64 / passes,
                read_ratio: if base_disk > 0.0 { disk / base_disk } else { 0.0 },
                experts_per_layer_pass: requests as f64 / passes / moe_layers as f64,
                hit_rate: hits as f64 / requests.max(1) as f64,
                at_acceptance: acceptance
                    .iter()
                    .map(|&a| {
                        let tokens_per_pass = nightmail_engine::draft::expected_tokens(a, w.saturating_sub(1));
                        let s_per_token = s_per_pass / tokens_per_pass;
                        AcceptancePoint {
                            acceptance: a,
                            tokens_per_pass,
                            s_per_token,
                            speedup: if s_per_token > 0.0 { base_s / s_per_token } else { 0.0 },
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(VerifyReport { passes: passes as usize, rounds, disk_gbps: bw / 1e9, experts, top_k: k, points })
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

/// [`bench_join`]'s figures: a batch decoding alone, then while a long prompt joins it.
#[derive(Debug, Clone, Serialize)]
pub struct JoinReport {
    pub batch: usize,
    pub join_prompt_tokens: usize,
    /// The joining prompt's passes (`Model::prefill_chunk`), each carrying the batch's decode rows.
    pub join_passes: usize,
    pub join_chunk: usize,
    /// Seconds per decode step of the batch alone, before the prompt joins.
    pub decode_s_per_step: f64,
    /// Seconds per step while the prompt prefills: each such step is one of its passes, and the
    /// batch decodes one token in it.
    pub joined_s_per_step: f64,
    /// The batch's decode tokens/s alone and while the prompt joins.
    pub decode_tokens_per_s: f64,
    pub joined_tokens_per_s: f64,
    /// The joining prompt's prefill time (its passes), and the same prompt prefilled alone.
    pub join_prefill_s: f64,
    pub alone_prefill_s: f64,
}

/// `batch` sequences decode `opts.tokens` steps alone; then a prompt of `prompt` seeded tokens
/// joins, prefilled in passes as wide as the budget allows, the batch's decode rows riding in
/// each pass; then the same prompt is prefilled alone (a fresh cache) for comparison.
pub fn bench_join(opts: &BenchOptions, batch: usize, prompt: usize) -> Result<JoinReport> {
    let model = load_streamed(opts)?;
    let vocab = model.spec().vocab_size as u32;
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut caches: Vec<_> = (0..batch).map(|_| model.new_cache()).collect();
    for (i, cache) in caches.iter_mut().enumerate() {
        let p: Vec<u32> = opts.prompt_tokens.iter().map(|t| (t + 7 * i as u32) % vocab).collect();
        model.logits(&p, cache)?;
    }
    let long: Vec<u32> = (0..prompt.max(1)).map(|_| rng.next() % vocab).collect();
    let chunk = model.prefill_chunk(long.len());
    let mut decode = |caches: &mut [nightmail_engine::SequenceState], pass: Option<(&mut _, &[u32])>| {
        let tokens: Vec<u32> = (0..caches.len()).map(|_| rng.next() % vocab).collect();
        let mut groups: Vec<(&mut nightmail_engine::SequenceState, &[u32])> =
            caches.iter_mut().zip(tokens.chunks(1)).collect();
        groups.extend(pass);
        model.logits_groups(&mut groups).map(|_| ())
    };
    let steps = opts.tokens.max(1);
    let t0 = Instant::now();
    for _ in 0..steps {
        decode(&mut caches, None)?;
    }
    let decode_s = t0.elapsed().as_secs_f64() / steps as f64;
    let mut joining = model.new_cache();
    let t0 = Instant::now();
    for pass in long.chunks(chunk) {
        decode(&mut caches, Some((&mut joining, pass)))?;
    }
    let join_s = t0.elapsed().as_secs_f64();
    let passes = long.len().div_ceil(chunk);
    drop(caches);
    let mut alone = model.new_cache();
    let t0 = Instant::now();
    model.prefill(&long, &mut alone, chunk)?;
    let alone_s = t0.elapsed().as_secs_f64();
    let joined_s = join_s / passes as f64;
    Ok(JoinReport {
        batch,
        join_prompt_tokens: long.len(),
        join_passes: passes,
        join_chunk: chunk,
        decode_s_per_step: decode_s,
        joined_s_per_step: joined_s,
        decode_tokens_per_s: batch as f64 / decode_s,
        joined_tokens_per_s: batch as f64 / joined_s,
        join_prefill_s: join_s,
        alone_prefill_s: alone_s,
    })
}

/// [`bench_prefill`]'s figures: one prompt prefilled with the model streamed, the bytes that
/// took over the disk's rate, and the same prefill with the model in RAM.
#[derive(Debug, Clone, Serialize)]
pub struct PrefillReport {
    pub prefill_tokens: usize,
    /// Prompt tokens per pass: the memory budget's (`Model::prefill_chunk`), or `--prefill-chunk`.
    pub prefill_chunk: usize,
    pub prefill_passes: usize,
    pub prefill_s: f64,
    /// Dense and expert bytes the streamed prefill read, over the disk rate measured in the run.
    pub prefill_io_floor_s: f64,
    /// The same prefill (same passes) with every weight resident.
    pub prefill_resident_s: f64,
    /// `prefill_s` over the larger of the two floors.
    pub ratio_to_bound: f64,
    pub prefill_disk_bytes: u64,
    pub prefill_expert_disk_bytes: u64,
    /// Expert bytes read over the bytes of every routed expert: how many times the prefill read
    /// the expert bank.
    pub expert_bank_reads: f64,
    pub disk_gbps: f64,
    pub memory_budget_bytes: Option<u64>,
    pub cache_budget_bytes: u64,
    #[serde(flatten)]
    pub rss: Rss,
}

/// Prefills `tokens` seeded pseudo-random prompt tokens with the model streamed, in passes of
/// `chunk` tokens or of the width the memory budget allows, then (with `resident`) the same passes
/// with the model loaded whole.
pub fn bench_prefill(
    opts: &BenchOptions,
    tokens: usize,
    chunk: Option<usize>,
    resident: bool,
) -> Result<PrefillReport> {
    let ((file, start), _) = expert_region_and_dense_bytes(&opts.model)?;
    let before = probe_disk(opts, &file, start, "before")?;
    let model = load_streamed(opts)?;
    let vocab = model.spec().vocab_size as u32;
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let prompt: Vec<u32> = (0..tokens.max(1)).map(|_| rng.next() % vocab).collect();
    let chunk = chunk.unwrap_or_else(|| model.prefill_chunk(prompt.len())).max(1);
    model.reset_stats();
    let mut cache = model.new_cache();
    if opts.timeline.is_some() {
        timeline::start();
    }
    let t0 = Instant::now();
    let pass = timeline::now();
    model.prefill(&prompt, &mut cache, chunk)?;
    timeline::record_step(chunk, pass);
    let prefill_s = t0.elapsed().as_secs_f64();
    if let Some(path) = &opts.timeline {
        write_timeline(path, &timeline::stop())?;
    }
    let (stats, dense) = stream_stats(&model);
    let rss = rss();
    let expert_bank: u64 = {
        let ck = ModelFile::open(&opts.model)?;
        ck.all_tensors()?.iter().filter(|t| is_expert_tensor(&t.name)).map(|t| t.bytes.len() as u64).sum()
    };
    drop((cache, model));
    let after = probe_disk(opts, &file, start, "after")?;
    let bw = (before + after) / 2.0;
    let disk = stats.disk_bytes + dense.map_or(0, |d| d.disk_bytes);
    let io_floor = disk as f64 / bw;
    // The model whole in RAM (its pages read once before timing), the same passes.
    let resident_s = if resident {
        let resident = Model::load(&opts.model)?;
        resident.prefill(&prompt[..prompt.len().min(chunk)], &mut resident.new_cache(), chunk)?;
        let mut cache = resident.new_cache();
        let t0 = Instant::now();
        resident.prefill(&prompt, &mut cache, chunk)?;
        t0.elapsed().as_secs_f64()
    } else {
        0.0
    };
    let bound = io_floor.max(resident_s);
    Ok(PrefillReport {
        prefill_tokens: prompt.len(),
        prefill_chunk: chunk,
        prefill_passes: prompt.len().div_ceil(chunk),
        prefill_s,
        prefill_io_floor_s: io_floor,
        prefill_resident_s: resident_s,
        ratio_to_bound: if bound > 0.0 { prefill_s / bound } else { 0.0 },
        prefill_disk_bytes: disk,
        prefill_expert_disk_bytes: stats.disk_bytes,
        expert_bank_reads: if expert_bank > 0 { stats.disk_bytes as f64 / expert_bank as f64 } else { 0.0 },
        disk_gbps: bw / 1e9,
        memory_budget_bytes: opts.memory.as_ref().map(|m| m.bytes as u64),
        cache_budget_bytes: stats.cache_budget_bytes,
        rss,
    })
}
