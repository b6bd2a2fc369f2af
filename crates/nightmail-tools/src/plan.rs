//! `model plan`: what a memory budget keeps resident for a model, the bytes each token then reads
//! from disk, and the time per token that predicts on this machine: the disk's sequential direct
//! read rate (measured on the model file, or given) and the kernels' rate over the model's own
//! matrices (a dense one and an expert, at batch 1 and 8, cycled through more memory than the
//! caches hold). A user of the engine, like `model bench`; nothing of the model is loaded.

use nightmail_formats::FormatError;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Serialize;

use nightmail_engine::Result;
use nightmail_engine::stream::{MemoryBudget, MemoryPlan, ModelSizes, io::sequential_bandwidth};
use nightmail_formats::{ModelFile, is_expert_tensor};
use nightmail_model::ExpertId;
use nightmail_model::expert_views;
use nightmail_model::spec::ModelSpec;
use nightmail_tensor::Linear;
use nightmail_tensor::TensorView;

#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub model: PathBuf,
    pub budget: MemoryBudget,
    /// The disk's rate in GB/s; measured on the model file when absent.
    pub disk_gbps: Option<f64>,
    /// Another machine's memory bandwidth in GB/s (a Mac's, planned for from here): each step's
    /// weights are taken as read once from memory at this rate instead of timing the kernels.
    pub mem_gbps: Option<f64>,
    /// Bytes read to measure the disk.
    pub probe_bytes: u64,
    /// Batch sizes to predict a step for.
    pub batches: Vec<usize>,
    /// Prompt tokens to predict the prefill of.
    pub prompt_tokens: Option<usize>,
}

/// A kernel's rate over one of the model's matrices, in weight bytes per second.
#[derive(Debug, Clone, Serialize)]
pub struct KernelRate {
    pub tensor: String,
    pub dtype: String,
    /// GB/s of weights at batch 1 and at batch 8 (per step of 8 tokens).
    pub gbps_batch1: f64,
    pub gbps_batch8: f64,
    /// Timed on this machine, or the given memory bandwidth (`--mem-gbps`) at both batch sizes.
    pub measured: bool,
}

impl KernelRate {
    /// Seconds to run `bytes` of these weights over `batch` tokens at once (linear between the
    /// two measured batch sizes, and beyond).
    fn seconds(&self, bytes: f64, batch: f64) -> f64 {
        let (t1, t8) = (1.0 / (self.gbps_batch1 * 1e9), 1.0 / (self.gbps_batch8 * 1e9));
        bytes * (t1 + (t8 - t1) * (batch - 1.0) / 7.0)
    }
}

/// One predicted step at a batch size.
#[derive(Debug, Clone, Serialize)]
pub struct PredictedStep {
    pub batch: usize,
    pub disk_bytes_per_step: f64,
    pub disk_s_per_step: f64,
    pub compute_s_per_step: f64,
    pub s_per_step: f64,
    pub tokens_per_s: f64,
}

/// A prompt's prefill, predicted: passes as wide as `Model::prefill_chunk` makes them under the
/// budget, each priced as a step of that many rows.
#[derive(Debug, Clone, Serialize)]
pub struct PredictedPrefill {
    pub prompt_tokens: usize,
    pub tokens_per_pass: usize,
    pub passes: usize,
    pub disk_bytes: f64,
    pub disk_s: f64,
    pub compute_s: f64,
    /// Whether `compute_s` comes from kernels timed here; with another machine's memory
    /// bandwidth (`--mem-gbps`) it counts reading each weight once per pass and not the
    /// arithmetic of the pass's rows, so it is a floor, and so is the prediction.
    pub compute_measured: bool,
    pub predicted_prefill_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub plan: MemoryPlan,
    pub disk_gbps: f64,
    /// Whether `disk_gbps` was measured here (or given).
    pub disk_measured: bool,
    pub dense_kernel: KernelRate,
    pub expert_kernel: Option<KernelRate>,
    /// Dense bytes computed per step (all layers, resident or streamed, and the head).
    pub dense_compute_bytes: f64,
    /// Expected share of a token's routed experts found in the cache (uniform routing).
    pub expert_hit_rate: f64,
    /// Bytes read from disk per token at batch 1 (streamed layers and missed experts).
    pub disk_bytes_per_token: f64,
    pub predicted_s_per_token: f64,
    pub steps: Vec<PredictedStep>,
    /// The least batch whose step the kernels take longer to compute than the disk to read;
    /// `None` when none up to 256 does.
    pub disk_bound_until_batch: Option<usize>,
    pub prefill: Option<PredictedPrefill>,
}

pub fn plan(opts: &PlanOptions) -> Result<PlanReport> {
    let ck = ModelFile::open(&opts.model)?;
    let spec = ModelSpec::read(&ck)?;
    let plan = MemoryPlan::new(ModelSizes::read(&ck, &spec)?, opts.budget.clone())?;
    let (disk_gbps, disk_measured) = match opts.disk_gbps {
        Some(g) => (g, false),
        None => (measure_disk(&ck, &opts.model, opts.probe_bytes)? / 1e9, true),
    };
    let dense_kernel = rate_or_memory(&dense_matrix(&ck)?, opts.mem_gbps)?;
    let expert_kernel = match spec.moe_layers.iter().position(|m| *m) {
        Some(layer) => {
            let [gate, ..] = expert_views(&ck, &spec, ExpertId { layer, expert: 0 })?;
            Some(rate_or_memory(&gate, opts.mem_gbps)?)
        }
        None => None,
    };
    let sizes = &plan.sizes;
    let dense_compute_bytes = sizes.layers.iter().map(|l| l.disk_bytes).sum::<usize>() as f64 + head_bytes(&ck)? as f64;
    let expert_hit_rate = plan.expert_hit_rate();
    let bw = disk_gbps * 1e9;
    // A window of two layers reads one while the other computes; with one, they take turns.
    let overlapped = plan.window_bytes >= 2 * sizes.layers.iter().map(|l| l.stream_bytes).max().unwrap_or(0);
    let step = |batch: usize| -> PredictedStep {
        let (k, union) = (sizes.top_k as f64, plan.distinct_experts(batch));
        let expert_bytes = plan.expert_bytes_per_step(batch);
        let disk = plan.disk_bytes_per_step(batch);
        let disk_s = disk / bw;
        // Each distinct expert runs on the tokens routed to it: batch · k / union of them.
        let per_expert = if union > 0.0 { (batch as f64 * k / union).max(1.0) } else { 1.0 };
        let compute_s = dense_kernel.seconds(dense_compute_bytes, batch as f64)
            + expert_kernel.as_ref().map_or(0.0, |r| r.seconds(expert_bytes, per_expert));
        // With a two-layer window a step takes the longer of its reads and its compute, and
        // nothing serial besides: the next layer's read-ahead is in flight while a router runs
        // (docs/ENGINE.md, "The decode's read shape", measures it). A single-layer window takes
        // turns.
        let s =
            if overlapped || plan.dense_disk_bytes_per_token == 0 { disk_s.max(compute_s) } else { disk_s + compute_s };
        PredictedStep {
            batch,
            disk_bytes_per_step: disk,
            disk_s_per_step: disk_s,
            compute_s_per_step: compute_s,
            s_per_step: s,
            tokens_per_s: batch as f64 / s,
        }
    };
    let first = step(1);
    let disk_bound_until_batch = (1..=256).find(|&b| {
        let s = step(b);
        s.compute_s_per_step >= s.disk_s_per_step
    });
    // A pass of c prompt tokens is a step of c rows, but for its cache hits: passes sweep every
    // layer's union in order through a cache smaller than the bank, so LRU has evicted each
    // expert before the next pass asks for it again (`model bench --prefill` measures the
    // bank read once per pass).
    let prefill = opts.prompt_tokens.filter(|&n| n > 0).map(|n| {
        let width = nightmail_engine::prefill_tokens_per_pass(&spec, Some(&plan), n);
        let (full, rest) = (n / width, n % width);
        let widths: Vec<usize> = std::iter::repeat_n(width, full).chain((rest > 0).then_some(rest)).collect();
        let disk = |w: usize| {
            let experts = if plan.experts_resident { 0.0 } else { plan.expert_bytes_per_step(w) };
            plan.dense_disk_bytes_per_token as f64 + experts
        };
        let disk_bytes: f64 = widths.iter().map(|&w| disk(w)).sum();
        let compute_s: f64 = widths.iter().map(|&w| step(w).compute_s_per_step).sum();
        let disk_s = disk_bytes / bw;
        PredictedPrefill {
            prompt_tokens: n,
            tokens_per_pass: width,
            passes: widths.len(),
            disk_bytes,
            disk_s,
            compute_s,
            compute_measured: opts.mem_gbps.is_none(),
            predicted_prefill_s: widths.iter().map(|&w| (disk(w) / bw).max(step(w).compute_s_per_step)).sum(),
        }
    });
    Ok(PlanReport {
        prefill,
        disk_gbps,
        disk_measured,
        dense_compute_bytes,
        expert_hit_rate,
        disk_bytes_per_token: first.disk_bytes_per_step,
        predicted_s_per_token: first.s_per_step,
        steps: opts.batches.iter().map(|&b| step(b)).collect(),
        disk_bound_until_batch,
        dense_kernel,
        expert_kernel,
        plan,
    })
}

/// The output head's bytes (the embedding's, when tied), computed every step.
fn head_bytes(ck: &ModelFile) -> Result<usize> {
    Ok(match ck.tensor("output.weight")? {
        Some(h) => h.bytes.len(),
        None => ck.require("token_embd.weight")?.bytes.len(),
    })
}

/// The disk's sequential direct-read rate over the model's first file, in bytes/s.
fn measure_disk(ck: &ModelFile, model: &Path, probe: u64) -> Result<f64> {
    let t = ck.require("token_embd.weight")?;
    let (file, _) = ck.locate(&t).unwrap_or_else(|| (model.to_path_buf(), 0));
    Ok(sequential_bandwidth(&file, 0, probe, 4 << 20, 16).map_err(|source| FormatError::Io { path: file, source })?)
}

/// The kernel's rate over `weight` timed here, or, given another machine's memory bandwidth, that
/// bandwidth at every batch: a step that reads its weights once from memory cannot go faster, so
/// the prediction is the best that machine can do with kernels that keep up with its memory.
fn rate_or_memory(weight: &TensorView<'_>, mem_gbps: Option<f64>) -> Result<KernelRate> {
    match mem_gbps {
        Some(gbps) => Ok(KernelRate {
            tensor: weight.name.clone(),
            dtype: format!("{:?}", weight.dtype),
            gbps_batch1: gbps,
            gbps_batch8: gbps,
            measured: false,
        }),
        None => rate(weight),
    }
}

/// Layer 0's largest dense matrix.
fn dense_matrix(ck: &ModelFile) -> Result<TensorView<'_>> {
    let largest = ck
        .all_tensors()?
        .into_iter()
        .filter(|t| t.shape.len() == 2 && !is_expert_tensor(&t.name))
        // GGUF, transformers, or a multimodal checkpoint's text model (`language_model.model...`).
        .filter(|t| {
            t.name.starts_with("blk.0.") || t.name.starts_with("model.layers.0.") || t.name.contains(".model.layers.0.")
        })
        .max_by_key(|t| t.bytes.len())
        .ok_or_else(|| FormatError::MissingTensor { name: "a matrix of layer 0".into() })?;
    Ok(largest)
}

/// Time `weight`'s kernel at batch 1 and 8 over copies of it filling 64 MiB or more, so that
/// each call reads its weights from memory, as a whole model's pass does.
fn rate(weight: &TensorView<'_>) -> Result<KernelRate> {
    const WORKING_SET: usize = 64 << 20;
    let copies = WORKING_SET.div_ceil(weight.bytes.len().max(1)).clamp(1, 64);
    let matrices =
        (0..copies).map(|_| Linear::new(weight, None)).collect::<Result<Vec<_>, nightmail_tensor::TensorError>>()?;
    let cols = weight.shape[1];
    let gbps = |batch: usize| -> Result<f64> {
        let x = Tensor::randn(0f32, 1.0, (batch, cols), &Device::Cpu)?;
        let mut calls = 0usize;
        let seconds = rayon::scope(|_| -> Result<f64> {
            // One warm-up pass, then whole passes until a quarter second has gone by.
            for m in &matrices {
                m.forward(&x)?;
            }
            let t = Instant::now();
            while t.elapsed().as_secs_f64() < 0.25 {
                for m in &matrices {
                    m.forward(&x)?;
                    calls += 1;
                }
            }
            Ok(t.elapsed().as_secs_f64())
        })?;
        Ok(calls as f64 * weight.bytes.len() as f64 / seconds / 1e9)
    };
    Ok(KernelRate {
        tensor: weight.name.clone(),
        dtype: format!("{:?}", weight.dtype),
        gbps_batch1: gbps(1)?,
        gbps_batch8: gbps(8)?,
        measured: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_k3_directory_plans_from_its_language_model_tensors() {
        let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3");
        let budget = MemoryBudget { bytes: 64 << 20, kv_tokens: 64, batch: 1, verify_rows: 1, stream_layers: None };
        let opts = PlanOptions {
            model,
            budget,
            disk_gbps: Some(1.0),
            mem_gbps: None,
            probe_bytes: 0,
            batches: vec![1],
            prompt_tokens: None,
        };
        let r = plan(&opts).unwrap();
        assert!(r.dense_kernel.tensor.starts_with("language_model.model.layers.0."), "{}", r.dense_kernel.tensor);
        assert!(r.plan.experts_resident && r.disk_bytes_per_token == 0.0 && r.predicted_s_per_token > 0.0);
        // Its own head, the final norm and AttnRes's last mix, all F32; not the embedding, which
        // a token reads a row of.
        assert_eq!(r.plan.sizes.fixed_bytes, (256 * 32 + 3 * 32) * 4);
        assert_eq!((r.plan.sizes.embedding_bytes, r.plan.sizes.embedding_row_bytes), (256 * 32 * 4, 32 * 4));
    }

    #[test]
    fn a_plan_with_every_layer_streamed_reads_them_each_token_and_predicts_from_the_given_disk() {
        let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe/model.gguf");
        let budget = MemoryBudget {
            bytes: 64 << 20,
            kv_tokens: 64,
            batch: 1,
            verify_rows: 1,
            stream_layers: Some(vec![0, 1, 2]),
        };
        let opts = PlanOptions {
            model,
            budget,
            disk_gbps: Some(0.001),
            mem_gbps: None,
            probe_bytes: 0,
            batches: vec![1, 8],
            prompt_tokens: Some(300),
        };
        let r = plan(&opts).unwrap();
        assert!(!r.disk_measured && r.plan.resident_layers.is_empty());
        let dense: usize = r.plan.sizes.layers.iter().map(|l| l.disk_bytes).sum();
        assert_eq!(r.plan.dense_disk_bytes_per_token, dense);
        // The window holds two layers: reading and computing overlap, and at 1 MB/s the disk
        // is the limit.
        let one = &r.steps[0];
        assert!(one.disk_s_per_step >= dense as f64 / 1e6 && one.s_per_step == one.disk_s_per_step, "{one:?}");
        assert_eq!(r.predicted_s_per_token, one.s_per_step);
        // Eight sequences share the dense stream: more tokens per second than one.
        assert!(r.steps[1].tokens_per_s > one.tokens_per_s, "{:?}", r.steps);
        // A 300-token prompt in passes that each read the dense stream once: fewer reads than
        // its tokens, and the passes cover the prompt.
        let p = r.prefill.as_ref().expect("a prefill was asked for");
        assert_eq!(p.passes, 300usize.div_ceil(p.tokens_per_pass), "{p:?}");
        assert!(p.disk_bytes < 300.0 * r.disk_bytes_per_token, "{p:?}");
    }

    #[test]
    fn a_given_memory_bandwidth_replaces_the_timed_kernels_at_every_batch() {
        let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe/model.gguf");
        let budget = MemoryBudget { bytes: 64 << 20, kv_tokens: 64, batch: 8, verify_rows: 1, stream_layers: None };
        let opts = PlanOptions {
            model,
            budget,
            disk_gbps: Some(1.0),
            mem_gbps: Some(100.0),
            probe_bytes: 0,
            batches: vec![1, 8],
            prompt_tokens: None,
        };
        let r = plan(&opts).unwrap();
        let expert = r.expert_kernel.as_ref().expect("a MoE fixture");
        for k in [&r.dense_kernel, expert] {
            assert!(!k.measured && k.gbps_batch1 == 100.0 && k.gbps_batch8 == 100.0, "{k:?}");
        }
        // Memory-bound: a step's compute time is its weight bytes over the bandwidth, once per
        // step whatever the batch.
        for step in &r.steps {
            let weights = r.dense_compute_bytes + r.plan.expert_bytes_per_step(step.batch);
            let want = weights / 100e9;
            assert!((step.compute_s_per_step - want).abs() <= 1e-12 * want.max(1.0), "{step:?} vs {want}");
        }
    }
}
