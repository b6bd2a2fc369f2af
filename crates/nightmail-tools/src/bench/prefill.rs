//! `model bench --prefill`: a long prompt prefilled streamed, against its I/O floor and the model in RAM.

use std::time::Instant;

use serde::Serialize;

use nightmail_engine::{Model, Result};
use nightmail_formats::{ModelFile, is_expert_tensor};
use nightmail_model::timeline;

use super::{
    BenchOptions, Rss, XorShift, expert_region_and_dense_bytes, load_streamed, probe_disk, rss, stream_stats,
    write_timeline,
};

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
