//! `model bench --verify`: verify passes of several rows against the bound of reading each weight once.

use std::time::Instant;

use serde::Serialize;

use nightmail_engine::{Model, Result};
use nightmail_model::timeline;

use super::{
    BenchOptions, XorShift, expert_region_and_dense_bytes, load_streamed, probe_disk, stream_stats, write_timeline,
};

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
