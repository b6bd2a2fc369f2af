//! `model bench --batch`: sequences decoded together, and a long prompt joining them.

use std::time::Instant;

use serde::Serialize;

use nightmail_engine::Result;

use super::{BenchOptions, Rss, XorShift, expert_region_and_dense_bytes, load_streamed, probe_disk, rss, stream_stats};

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
