//! Qwen3-Next's and Qwen3.5-MoE's Gated DeltaNet layer (Yang et al., arXiv 2412.06464;
//! transformers `Qwen3NextGatedDeltaNet`, llama.cpp src/models/qwen3next.cpp
//! `build_layer_attn_linear`). Per token: q, k and v through a causal depthwise convolution
//! (with SiLU), q and k L2-normalized (q also scaled by k_dim^-½), β = σ(b), one decay per value
//! head g = −exp(A_log)·softplus(a + dt_bias); then the gated delta rule (`delta_rule.rs`, shared
//! with KDA), each key head serving `v_heads / k_heads` value heads; the output RMS-normed per
//! head (weight w, not 1 + w), times SiLU(z), then out_proj.
//!
//! The checkpoints store the projections three ways: transformers' Qwen3-Next fuses q, k, v, z
//! into `in_proj_qkvz` and b, a into `in_proj_ba`, both interleaved per key head (llama.cpp's
//! legacy `ssm_in` and its `ssm_ba`); llama.cpp's converter splits the first into `attn_qkv`
//! and `attn_gate`; Qwen3.5 stores `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`. All
//! are read as they are and their outputs gathered into one order, so a quantized matrix needs
//! no row shuffle.

use candle_core::{Device, Tensor};

use super::delta_rule::{
    DeltaState, Heads, StateShape, convolve, decay_rates, gated_norm, l2_normalize, sigmoid, softplus,
};
use super::layers::Linear;
use super::source::WeightSource;
use crate::error::Result;
use crate::format::Format;
use crate::spec::{DeltaNetSpec, ModelSpec};

pub struct GatedDeltaNet {
    /// The input projections, whose outputs are concatenated into one raw row per token.
    projections: Vec<Linear>,
    /// Where, in the raw row, each of q|k|v's convolution channels, z's channels, β's and α's
    /// logits are.
    conv_in: Vec<usize>,
    z: Vec<usize>,
    b: Vec<usize>,
    a: Vec<usize>,
    /// Depthwise taps `[channels][kernel]`, oldest input first.
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    /// exp(A_log) per value head.
    decay_rate: Vec<f32>,
    /// The gated RMSNorm's weight `[v_dim]` and eps.
    norm: Vec<f32>,
    eps: f32,
    out: Linear,
    spec: DeltaNetSpec,
}

impl GatedDeltaNet {
    /// Layer `l`'s weights under llama.cpp's `qwen3next` / `qwen35moe` names (a Hugging Face
    /// directory translates them); `format` says how A is stored.
    pub(crate) fn load(
        ck: &dyn WeightSource,
        format: Format,
        spec: &ModelSpec,
        d: &DeltaNetSpec,
        l: usize,
    ) -> Result<Self> {
        let hidden = spec.hidden_size;
        let (kd, vd, r) = (d.k_heads * d.k_head_dim, d.v_heads * d.v_head_dim, d.v_heads / d.k_heads);
        let channels = d.conv_channels();
        let name = |n: &str| format!("blk.{l}.{n}");
        let has = |n: &str| -> Result<bool> { Ok(ck.tensor(&name(n))?.is_some()) };
        let linear = |n: &str, rows: usize, cols: usize| -> Result<Linear> {
            let m = ck.require(&name(&format!("{n}.weight")))?;
            m.expect_shape(&[rows, cols])?;
            ck.linear(&m, None)
        };
        let vector = |n: &str, len: usize| ck.vector(&name(n), len);
        let mut projections = Vec::new();
        let (mut conv_in, mut z) = (Vec::with_capacity(channels), Vec::with_capacity(vd));
        if has("ssm_in.weight")? {
            // Per key head: q (k_dim), k (k_dim), its value heads' v, then their z.
            projections.push(linear("ssm_in", 2 * kd + 2 * vd, hidden)?);
            let group = 2 * d.k_head_dim + 2 * r * d.v_head_dim;
            let part = |offset: usize, width: usize| -> Vec<usize> {
                (0..d.k_heads).flat_map(|g| (0..width).map(move |i| g * group + offset + i)).collect()
            };
            conv_in.extend(part(0, d.k_head_dim));
            conv_in.extend(part(d.k_head_dim, d.k_head_dim));
            conv_in.extend(part(2 * d.k_head_dim, r * d.v_head_dim));
            z.extend(part(2 * d.k_head_dim + r * d.v_head_dim, r * d.v_head_dim));
        } else {
            projections.push(linear("attn_qkv", channels, hidden)?);
            projections.push(linear("attn_gate", vd, hidden)?);
            conv_in.extend(0..channels);
            z.extend(channels..channels + vd);
        }
        let at = 2 * kd + 2 * vd;
        let (b, a) = if has("ssm_ba.weight")? {
            // Per key head: its value heads' β logits, then their α.
            projections.push(linear("ssm_ba", 2 * d.v_heads, hidden)?);
            let part = |offset: usize| -> Vec<usize> {
                (0..d.k_heads).flat_map(|g| (0..r).map(move |i| at + g * 2 * r + offset + i)).collect()
            };
            (part(0), part(r))
        } else {
            projections.push(linear("ssm_beta", d.v_heads, hidden)?);
            projections.push(linear("ssm_alpha", d.v_heads, hidden)?);
            ((at..at + d.v_heads).collect(), (at + d.v_heads..at + 2 * d.v_heads).collect())
        };
        let decay_rate = decay_rates(&vector("ssm_a", d.v_heads)?, format);
        Ok(GatedDeltaNet {
            projections,
            conv_in,
            z,
            b,
            a,
            conv: vector("ssm_conv1d.weight", channels * d.conv_kernel)?,
            dt_bias: vector("ssm_dt.bias", d.v_heads)?,
            decay_rate,
            norm: vector("ssm_norm.weight", d.v_head_dim)?,
            eps: spec.rms_norm_eps as f32,
            out: linear("ssm_out", hidden, vd)?,
            spec: d.clone(),
        })
    }

    pub(crate) fn state_shape(&self) -> StateShape {
        let d = &self.spec;
        StateShape {
            channels: d.conv_channels(),
            heads: d.v_heads,
            k_dim: d.k_head_dim,
            v_dim: d.v_head_dim,
            kernel: d.conv_kernel,
        }
    }

    /// The raw projections of `x` (`[tokens, hidden]`), one row per token.
    pub(crate) fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let parts = self.projections.iter().map(|p| p.forward(x)).collect::<Result<Vec<_>>>()?;
        Ok(vec![Tensor::cat(&parts, 1)?])
    }

    pub(crate) fn output(&self, attended: &Tensor) -> Result<Tensor> {
        self.out.forward(attended)
    }

    /// Runs projected rows of one sequence through its state: `[tokens, v_heads · v_dim]`,
    /// normed and gated, before out_proj.
    pub(crate) fn attend(&self, rows: &[Tensor], state: &mut DeltaState) -> Result<Tensor> {
        let [raw] = rows else { unreachable!("rows come from GatedDeltaNet::project") };
        let t = raw.dim(0)?;
        let width = raw.dim(1)?;
        let raw: Vec<f32> = raw.flatten_all()?.to_vec1()?;
        let d = &self.spec;
        let (dk, dv, c) = (d.k_head_dim, d.v_head_dim, d.conv_channels());
        let (kd, vd) = (d.k_heads * dk, d.v_heads * dv);
        let row = |i: usize| &raw[i * width..(i + 1) * width];
        let gathered: Vec<f32> = (0..t).flat_map(|i| self.conv_in.iter().map(move |&j| row(i)[j])).collect();
        let mixed = convolve(&self.conv, d.conv_kernel, &gathered, t, &mut state.conv);
        let scale = (dk as f32).powf(-0.5);
        let mut x = Heads::zeros(d.v_heads, t, dk, dv);
        for i in 0..t {
            let m = &mixed[i * c..(i + 1) * c];
            for h in 0..d.v_heads {
                let (kat, vat) = x.at(h, i);
                let kh = d.key_head(h) * dk;
                l2_normalize(&m[kh..kh + dk], scale, &mut x.q[kat..kat + dk]);
                l2_normalize(&m[kd + kh..kd + kh + dk], 1.0, &mut x.k[kat..kat + dk]);
                x.v[vat..vat + dv].copy_from_slice(&m[2 * kd + h * dv..2 * kd + (h + 1) * dv]);
                // transformers: g = −exp(A_log) · softplus(a + dt_bias), one per value head.
                let g = -self.decay_rate[h] * softplus(row(i)[self.a[h]] + self.dt_bias[h]);
                x.g[kat..kat + dk].fill(g);
                x.beta[h * t + i] = sigmoid(row(i)[self.b[h]]);
            }
        }
        let out = x.run(&mut state.recurrent);
        // transformers' Qwen3NextRMSNormGated: SiLU on z.
        let silu = |i: usize, c: usize| {
            let z = row(i)[self.z[c]];
            z * sigmoid(z)
        };
        let y = gated_norm(&out, (d.v_heads, t, dv), &self.norm, self.eps, silu);
        Ok(Tensor::from_vec(y, (t, vd), &Device::Cpu)?)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_next")
    }

    /// `file` of the fixture copied into `dir` with the bytes `from` (once) replaced by `to`, of
    /// the same length, so every offset holds.
    fn renamed(dir: &Path, file: &str, from: &[u8], to: &[u8]) {
        let mut bytes = std::fs::read(fixture().join(file)).unwrap();
        let at = bytes.windows(from.len()).position(|w| w == from).expect("the fixture has it");
        bytes[at..at + to.len()].copy_from_slice(to);
        std::fs::write(dir.join(file), bytes).unwrap();
    }

    #[test]
    fn a_missing_a_log_is_named_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
        renamed(
            dir.path(),
            "model.safetensors",
            b"model.layers.1.linear_attn.A_log",
            b"model.layers.1.linear_attn.X_log",
        );
        let err = crate::Model::load(dir.path()).err().expect("A_log is missing").to_string();
        let want = format!(
            "tensor `model.layers.1.linear_attn.A_log` (GGUF `blk.1.ssm_a`) is missing from {}",
            dir.path().display()
        );
        assert!(err.starts_with(&want), "{err}");
        renamed(dir.path(), "model.gguf", b"blk.1.ssm_a", b"blk.1.ssm_x");
        let path = dir.path().join("model.gguf");
        let err = crate::Model::load(&path).err().expect("ssm_a is missing").to_string();
        assert!(err.starts_with(&format!("tensor `blk.1.ssm_a` is missing from {}", path.display())), "{err}");
    }

    #[test]
    fn a_qwen35moe_gguf_with_a_multi_token_prediction_block_runs_its_main_layers_only() {
        use candle_core::quantized::gguf_file::Value;

        use crate::format::GgufFile;
        use crate::format::gguf_write::{TensorHeader, write_gguf};
        // As conversion/qwen.py writes Qwen3.5 with its MTP block: block_count one more, the
        // block's count in nextn_predict_layers, its tensors after the main ones (here a copy of
        // the last layer's norm).
        let src = crate::format::GgufFile::open(&fixture().join("../qwen3_5_moe/model.gguf")).unwrap();
        let mut metadata: Vec<(String, Value)> = src
            .metadata()
            .iter()
            .filter(|(k, _)| *k != "general.alignment")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        metadata.retain(|(k, _)| k != "qwen35moe.block_count");
        metadata.push(("qwen35moe.block_count".into(), Value::U32(5)));
        metadata.push(("qwen35moe.nextn_predict_layers".into(), Value::U32(1)));
        let mut tensors = src.all_tensors().unwrap();
        let norm = tensors.iter().find(|t| t.name == "blk.3.attn_norm.weight").unwrap().clone();
        tensors.push(crate::format::TensorView { name: "blk.4.attn_norm.weight".into(), ..norm });
        let headers: Vec<TensorHeader> =
            tensors.iter().map(|t| TensorHeader::new(&t.name, t.dtype, &t.shape)).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mtp.gguf");
        write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(tensors[i].bytes)).unwrap();
        assert_eq!(GgufFile::open(&path).unwrap().uint("qwen35moe.block_count"), Some(5));
        let (plain, mtp) = (
            crate::Model::load(fixture().join("../qwen3_5_moe/model.gguf")).unwrap(),
            crate::Model::load(&path).unwrap(),
        );
        assert_eq!(mtp.spec().layers, 4);
        let (mut a, mut b) = (plain.new_cache(), mtp.new_cache());
        let (x, y) = (plain.logits(&[5, 17, 99], &mut a).unwrap(), mtp.logits(&[5, 17, 99], &mut b).unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()));
    }

    #[test]
    fn an_unknown_layer_kind_is_refused_naming_it_and_the_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
        let config = std::fs::read_to_string(fixture().join("config.json")).unwrap();
        let config = config.replacen("\"linear_attention\"", "\"mamba2\"", 1);
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        let err = crate::Model::load(dir.path()).err().expect("an unknown layer kind").to_string();
        let config = dir.path().join("config.json");
        assert!(err.contains(&config.display().to_string()) && err.contains("layer 0's kind \"mamba2\""), "{err}");
    }
}
