//! Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1; DeepSeek-V3, arXiv
//! 2412.19437 §2.1.1). Each token is compressed to one latent `c` of `kv_lora_rank` (normalized)
//! and one rotary key part `k_pe` of `qk_rope_head_dim` shared by all heads; only those two are
//! cached. Head h's key is `[W_uk[h]·c, k_pe]` and its value `W_uv[h]·c`.
//!
//! Two equal ways to attend (DeepSeek-V3 `inference/model.py`, `attn_impl` "naive" and
//! "absorb"): the plain form up-projects every cached latent to per-head keys and values; the
//! absorbed form folds `W_uk` into the query (`q_nope·W_uk[h]` scores against `c` directly) and
//! `W_uv` into the output (attend over `c`, then up-project once), so a decode step reads the
//! cache at its compressed width. A decode step uses the absorbed form; a prefill chunk whichever
//! costs less (the plain form only for long chunks, see `Mla::plain_is_cheaper`). Follows
//! transformers' `DeepseekV3Attention` for the arithmetic.

use candle_core::{D, Tensor};

use crate::error::Result;
use crate::parts::attention::QUERY_BLOCK;
use crate::parts::dsa::{self, Choices, IndexRows, Indexer};
use crate::parts::rope::Rope;
use crate::source::LayerTensors;
use crate::spec::MlaSpec;
use crate::spec::ModelSpec;
use nightmail_tensor::Numerics;
use nightmail_tensor::{Linear, RmsNorm};

/// Queries: straight from the hidden state, or through DeepSeek's low-rank latent
/// (`q_b(norm(q_a(x)))`).
pub enum MlaQuery {
    Full(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

impl MlaQuery {
    /// The queries, and the normed latent where there is one (DSA's indexer reads it).
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        match self {
            MlaQuery::Full(q) => Ok((q.forward(x)?, None)),
            MlaQuery::LowRank { a, norm, b } => {
                let latent = norm.forward(&a.forward(x)?)?;
                Ok((b.forward(&latent)?, Some(latent)))
            }
        }
    }
}

pub struct Mla {
    pub(crate) query: MlaQuery,
    /// `kv_a_proj_with_mqa`: hidden → latent (kv_lora_rank) and shared rotary key (rope dims).
    pub(crate) kv_a: Linear,
    pub(crate) kv_norm: RmsNorm,
    /// Per head, `[heads, qk_nope_head_dim, kv_lora_rank]` and `[heads, v_head_dim, kv_lora_rank]`.
    pub(crate) k_up: Tensor,
    pub(crate) v_up: Tensor,
    pub(crate) o: Linear,
    /// Kimi K3's gated MLA: `g_proj` `[heads · v_head_dim, hidden]` of the normed layer input;
    /// the attention output is multiplied by its sigmoid before `o` (llama.cpp
    /// src/models/kimi-k3.cpp `build_mla_layer`; tests/fixtures/kimi_k3.py `attach_mla_gate`).
    pub(crate) gate: Option<Linear>,
    /// DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5): each query attends its
    /// `top_k` keys only.
    pub(crate) indexer: Option<Indexer>,
    /// A GLM-5.2 "shared" layer: no indexer of its own, the last full layer's choice.
    pub(crate) shares_choice: bool,
    pub(crate) rope: Rope,
    pub(crate) heads: usize,
    pub(crate) dims: MlaSpec,
    /// `(qk_nope + qk_rope)^-½`, times YaRN's mscale² where the config asks for it.
    pub(crate) softmax_scale: f64,
}

/// One step's queries and compressed keys, rotated, ready to attend.
struct Prepared {
    /// `[heads, tokens, qk_nope]` and `[heads, tokens, qk_rope]`.
    q_nope: Tensor,
    q_pe: Tensor,
}

impl Mla {
    /// The rows of `x` that [`Mla::attend_rows`] takes: the queries `[tokens, heads · (nope +
    /// rope)]`, the latents `[tokens, kv_lora_rank + rope]`, a gated layer's gate logits
    /// `[tokens, heads · v_head_dim]`, then a sparse layer's indexer rows ([`IndexRows`]).
    pub fn project(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let (q, latent) = self.query.forward(x)?;
        let mut rows = vec![q, self.kv_a.forward(x)?];
        rows.extend(self.gate.as_ref().map(|g| g.forward(x)).transpose()?);
        if let (Some(indexer), Some(latent)) = (&self.indexer, &latent) {
            rows.extend(indexer.project(x, latent)?);
        }
        Ok(rows)
    }

    /// [`Mla::attend`] of [`Mla::project`]'s rows, times σ(gate logits) where the layer is gated.
    pub fn attend_rows(
        &self,
        rows: &[Tensor],
        start: usize,
        cache: &mut crate::parts::attention::F32Cache,
        choices: &mut Choices,
    ) -> Result<Tensor> {
        let gate = self.gate.as_ref().map(|_| &rows[2]);
        let rest = &rows[2 + usize::from(gate.is_some())..];
        let index = match rest {
            [q, k, w] if self.indexer.is_some() => Some(IndexRows { q, k, w }),
            [] if self.indexer.is_none() => None,
            _ => return Err(candle_core::Error::Msg("latent attention rows of another layer".into()).into()),
        };
        let attended = self.attend(&rows[0], &rows[1], index, start, cache, choices)?;
        Ok(match gate {
            Some(g) => (attended * candle_nn::ops::sigmoid(g)?)?,
            None => attended,
        })
    }

    pub fn output(&self, attended: &Tensor) -> Result<Tensor> {
        Ok(self.o.forward(attended)?)
    }

    /// Attention of projected rows at positions `start..` over `cache`, to which their latents
    /// (`[1, 1, tokens, kv_lora_rank]`) and rotary keys (`[1, 1, tokens, rope]`, a sparse layer's
    /// indexer keys after them) are appended: `[tokens, heads · v_head_dim]`, before the output
    /// projection. A sparse layer keeps its choice in `choices` for the shared layers after it.
    pub fn attend(
        &self,
        q: &Tensor,
        kv: &Tensor,
        index: Option<IndexRows<'_>>,
        start: usize,
        cache: &mut crate::parts::attention::F32Cache,
        choices: &mut Choices,
    ) -> Result<Tensor> {
        let t = q.dim(0)?;
        let (p, c, k_pe) = self.prepare(q, kv, start)?;
        let rope = self.dims.qk_rope_head_dim;
        let (c, k_pe, chosen) = match (&self.indexer, index) {
            (Some(indexer), Some(rows)) => {
                let (c, keys) = cache.append(&c, &dsa::join_keys(&k_pe, &indexer.keys(&rows, start)?)?)?;
                let (k_pe, keys) = dsa::split_keys(&keys, rope)?;
                let chosen = indexer.choose(&rows, &keys, start)?;
                choices.keep(start, &chosen);
                (c, k_pe, Some(chosen))
            }
            _ => {
                let (c, k_pe) = cache.append(&c, &k_pe)?;
                (c, k_pe, self.shares_choice.then(|| choices.at(start, t)).transpose()?)
            }
        };
        let (mut c, mut k_pe) = (c.squeeze(0)?.squeeze(0)?, k_pe.squeeze(0)?.squeeze(0)?.contiguous()?);
        // A decode step reads only the latents its query chose, so its attention costs top_k
        // keys however long the context; a chunk masks the rest instead.
        let (mut chosen, mut picked) = (chosen, false);
        if let Some([Some(keep)]) = chosen.as_deref() {
            let keep = Tensor::from_vec(keep.iter().map(|&j| j as u32).collect(), keep.len(), c.device())?;
            (c, k_pe) = (c.index_select(&keep, 0)?, k_pe.index_select(&keep, 0)?);
            (chosen, picked) = (None, true);
        }
        let chosen = chosen.as_deref();
        // The plain form up-projects every key once for the whole pass.
        let keys = match self.plain_is_cheaper(t) {
            true => Some(self.up_project(&c, &k_pe)?),
            false => None,
        };
        // Queries in blocks of QUERY_BLOCK rows, as grouped attention takes them: the scores are
        // `heads x rows x keys`, not `heads x tokens x keys`, and a block scores only the keys
        // its last row may see (the later ones weigh exactly 0 after the causal mask).
        let mut blocks = Vec::with_capacity(t.div_ceil(QUERY_BLOCK));
        for from in (0..t).step_by(QUERY_BLOCK) {
            let b = QUERY_BLOCK.min(t - from);
            let s = if picked { c.dim(0)? } else { (start + from + b).min(c.dim(0)?) };
            let p = Prepared {
                q_nope: p.q_nope.narrow(1, from, b)?.contiguous()?,
                q_pe: p.q_pe.narrow(1, from, b)?.contiguous()?,
            };
            let chosen = chosen.map(|c| &c[from..from + b]);
            blocks.push(match &keys {
                Some((k, v)) => {
                    let (k, v) = (k.narrow(1, 0, s)?.contiguous()?, v.narrow(1, 0, s)?.contiguous()?);
                    self.plain(&p, &k, &v, start + from, chosen)?
                }
                None => self.absorbed(&p, &c.narrow(0, 0, s)?, &k_pe.narrow(0, 0, s)?, start + from, chosen)?,
            });
        }
        let out = if blocks.len() == 1 { blocks.pop().expect("one block") } else { Tensor::cat(&blocks, 1)? };
        // [heads, tokens, v] → [tokens, heads · v]
        Ok(out.transpose(0, 1)?.reshape((t, self.heads * self.dims.v_head_dim))?)
    }

    /// Per cached position and head, the plain form costs (nope + v)·kv multiply-adds to
    /// up-project it plus t·(nope + rope + v) to attend; the absorbed form t·(2·kv + rope) (t
    /// queries against the latent and the rotary key, then the latent sum), plus terms that do not
    /// grow with the cache. So the plain form pays only for chunks of more than
    /// (nope + v)·kv / (2·kv − nope − v) tokens: about 170 at DeepSeek-V3's widths, never when
    /// the latent is no wider than the heads. A decode step is always absorbed.
    fn plain_is_cheaper(&self, tokens: usize) -> bool {
        let d = self.dims;
        let per_token = (2 * d.kv_lora_rank).saturating_sub(d.qk_nope_head_dim + d.v_head_dim);
        tokens > 1 && tokens * per_token > (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank
    }

    /// Splits and rotates: the queries' nope and rope parts, the normalized latent and the
    /// rotated shared key, the last two shaped as the cache holds them.
    fn prepare(&self, q: &Tensor, kv: &Tensor, start: usize) -> Result<(Prepared, Tensor, Tensor)> {
        let d = self.dims;
        let t = q.dim(0)?;
        let q = q.reshape((t, self.heads, d.qk_nope_head_dim + d.qk_rope_head_dim))?.transpose(0, 1)?;
        let q_nope = q.narrow(D::Minus1, 0, d.qk_nope_head_dim)?.contiguous()?;
        let q_pe = q.narrow(D::Minus1, d.qk_nope_head_dim, d.qk_rope_head_dim)?.unsqueeze(0)?;
        let c = self.kv_norm.forward(&kv.narrow(1, 0, d.kv_lora_rank)?)?;
        let k_pe = kv.narrow(1, d.kv_lora_rank, d.qk_rope_head_dim)?.reshape((1, 1, t, d.qk_rope_head_dim))?;
        // Kimi Linear (NoPE) keeps the shared key part but rotates nothing.
        let (q_pe, k_pe) = if d.nope {
            (q_pe.squeeze(0)?.contiguous()?, k_pe.contiguous()?)
        } else {
            (self.rope.apply(&q_pe, start)?.squeeze(0)?, self.rope.apply(&k_pe, start)?)
        };
        Ok((Prepared { q_nope, q_pe }, c.reshape((1, 1, t, d.kv_lora_rank))?, k_pe))
    }

    /// Every cached latent up-projected to per-head keys and values, for the plain form.
    /// `c`: `[s, kv_lora_rank]`, `k_pe`: `[s, rope]` → `[heads, s, nope + rope]`, `[heads, s, v]`.
    fn up_project(&self, c: &Tensor, k_pe: &Tensor) -> Result<(Tensor, Tensor)> {
        let (h, s, d) = (self.heads, c.dim(0)?, self.dims);
        let up = |w: &Tensor, width: usize| -> Result<Tensor> {
            // [s, kv] · [kv, h·width] → [h, s, width]
            let w = w.reshape((h * width, d.kv_lora_rank))?;
            Ok(c.matmul(&w.t()?)?.reshape((s, h, width))?.transpose(0, 1)?.contiguous()?)
        };
        let k_nope = up(&self.k_up, d.qk_nope_head_dim)?;
        let v = up(&self.v_up, d.v_head_dim)?;
        let k_pe = k_pe.unsqueeze(0)?.broadcast_as((h, s, d.qk_rope_head_dim))?;
        Ok((Tensor::cat(&[&k_nope, &k_pe.contiguous()?], D::Minus1)?, v))
    }

    /// Attend as MHA over up-projected keys and values: `[heads, tokens, v]`.
    fn plain(&self, p: &Prepared, k: &Tensor, v: &Tensor, start: usize, chosen: Chosen<'_>) -> Result<Tensor> {
        let q = Tensor::cat(&[&p.q_nope, &p.q_pe], D::Minus1)?;
        let scores = (q.matmul(&k.t()?)? * self.softmax_scale)?;
        let probs = self.softmax(scores, start, chosen)?;
        Ok(probs.matmul(v)?)
    }

    /// Attend over the latents themselves: `W_uk` folded into the query, `W_uv` applied after.
    fn absorbed(&self, p: &Prepared, c: &Tensor, k_pe: &Tensor, start: usize, chosen: Chosen<'_>) -> Result<Tensor> {
        let (h, t) = (self.heads, p.q_nope.dim(1)?);
        // [h, t, nope] · [h, nope, kv] → [h, t, kv]: each head's query in latent space.
        let q_latent = p.q_nope.matmul(&self.k_up)?;
        let kv = self.dims.kv_lora_rank;
        let scores_nope = q_latent.reshape((h * t, kv))?.matmul(&c.t()?)?;
        let rope = self.dims.qk_rope_head_dim;
        let scores_pe = p.q_pe.contiguous()?.reshape((h * t, rope))?.matmul(&k_pe.t()?)?;
        let s = c.dim(0)?;
        let scores = ((scores_nope + scores_pe)? * self.softmax_scale)?.reshape((h, t, s))?;
        let probs = self.softmax(scores, start, chosen)?;
        // [h·t, s] · [s, kv] → [h, t, kv] · [h, kv, v] → [h, t, v]
        let latent = probs.reshape((h * t, s))?.matmul(c)?.reshape((h, t, kv))?;
        Ok(latent.matmul(&self.v_up.transpose(1, 2)?)?)
    }

    /// Causal softmax of `[heads, tokens, keys]` for queries at positions `start..`, over the
    /// keys the indexer chose where it did (transformers folds the choice into the mask the same way).
    fn softmax(&self, scores: Tensor, start: usize, chosen: Chosen<'_>) -> Result<Tensor> {
        let (t, s) = (scores.dim(1)?, scores.dim(2)?);
        let sparse = chosen.is_some_and(|c| c.iter().any(Option::is_some));
        let scores = if t > 1 || sparse { scores.broadcast_add(&dsa::mask(t, s, start, chosen)?)? } else { scores };
        Ok(candle_nn::ops::softmax_last_dim(&scores)?)
    }
}

/// Per query, the keys DSA's indexer chose (None: every visible one).
type Chosen<'a> = Option<&'a [Option<Vec<usize>>]>;

/// Transformers' DeepseekV3RMSNorm default: the latent norms (`q_a_layernorm`,
/// `kv_a_layernorm`) use 1e-6 whatever `rms_norm_eps` says, as DeepSeek-V3's reference does.
const LATENT_NORM_EPS: f64 = 1e-6;

impl Mla {
    /// A layer's latent attention. The key/value up-projection comes as transformers' one
    /// `kv_b_proj` (`[heads · (nope + v), kv_lora_rank]`, GGUF `attn_kv_b` in older conversions) or
    /// as llama.cpp's split `attn_k_b` (`[heads, kv_lora_rank, nope]`, transposed for the absorbed
    /// query) and `attn_v_b` (`[heads, v, kv_lora_rank]`).
    pub fn load(w: &LayerTensors<'_>, spec: &ModelSpec, d: &MlaSpec) -> Result<Mla> {
        let (a, hidden, heads) = (&spec.attention, spec.hidden_size, spec.attention.heads);
        let qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
        let query = match d.q_lora_rank {
            Some(r) => MlaQuery::LowRank {
                a: w.weight("attn_q_a", r, hidden)?,
                norm: RmsNorm::new(&w.require("attn_q_a_norm.weight")?, LATENT_NORM_EPS, Numerics::Reference)?,
                b: w.weight("attn_q_b", heads * qk, r)?,
            },
            None => MlaQuery::Full(w.weight("attn_q", heads * qk, hidden)?),
        };
        let (k_up, v_up) = match w.opt("attn_kv_b.weight")? {
            Some(kv_b) => {
                kv_b.expect_shape(&[heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank])?;
                let kv_b = kv_b.to_f32()?.reshape((heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank))?;
                (
                    kv_b.narrow(1, 0, d.qk_nope_head_dim)?.contiguous()?,
                    kv_b.narrow(1, d.qk_nope_head_dim, d.v_head_dim)?.contiguous()?,
                )
            }
            None => {
                let (k_b, v_b) = (w.require("attn_k_b.weight")?, w.require("attn_v_b.weight")?);
                k_b.expect_shape(&[heads, d.kv_lora_rank, d.qk_nope_head_dim])?;
                v_b.expect_shape(&[heads, d.v_head_dim, d.kv_lora_rank])?;
                (k_b.to_f32()?.transpose(1, 2)?.contiguous()?, v_b.to_f32()?)
            }
        };
        let yarn = a.rope_scaling.as_ref();
        Ok(Mla {
            query,
            kv_a: w.weight("attn_kv_a_mqa", d.kv_lora_rank + d.qk_rope_head_dim, hidden)?,
            kv_norm: RmsNorm::new(&w.require("attn_kv_a_norm.weight")?, LATENT_NORM_EPS, Numerics::Reference)?,
            k_up,
            v_up,
            o: w.weight("attn_output", hidden, heads * d.v_head_dim)?,
            gate: if d.output_gate { Some(w.weight("attn_gate", heads * d.v_head_dim, hidden)?) } else { None },
            indexer: match (&spec.sparse_attention, d.q_lora_rank) {
                (Some(dsa), Some(rank)) if dsa.is_full(w.layer) => {
                    Some(Indexer::load(w, spec, dsa, rank, d.qk_rope_head_dim)?)
                }
                _ => None,
            },
            shares_choice: spec.sparse_attention.as_ref().is_some_and(|dsa| !dsa.is_full(w.layer)),
            rope: Rope::new(d.qk_rope_head_dim, a.rope_theta, a.rope_style, yarn),
            heads,
            dims: *d,
            // transformers' `yarn_apply_mscale`; llama.cpp's deepseek2 kq_scale.
            softmax_scale: (qk as f64).powf(-0.5) * yarn.map_or(1.0, |y| y.softmax_factor()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RopeStyle;
    use candle_core::{DType, Device};

    fn random(shape: &[usize], seed: u64) -> Tensor {
        // A fixed xorshift stream: the test needs no RNG crate state to reproduce.
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.8
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn mla() -> Mla {
        let dims = MlaSpec {
            q_lora_rank: None,
            kv_lora_rank: 16,
            qk_nope_head_dim: 8,
            qk_rope_head_dim: 4,
            v_head_dim: 6,
            nope: false,
            output_gate: false,
        };
        let (hidden, heads) = (32, 3);
        let norm = RmsNorm::from_tensor(Tensor::ones(16, DType::F32, &Device::Cpu).unwrap(), 1e-6);
        Mla {
            query: MlaQuery::Full(Linear::from_tensor(random(&[heads * 12, hidden], 1))),
            kv_a: Linear::from_tensor(random(&[16 + 4, hidden], 2)),
            kv_norm: norm,
            k_up: random(&[heads, 8, 16], 3),
            v_up: random(&[heads, 6, 16], 4),
            o: Linear::from_tensor(random(&[hidden, heads * 6], 5)),
            gate: None,
            indexer: None,
            shares_choice: false,
            rope: Rope::new(4, 10000.0, RopeStyle::Interleaved, None),
            heads,
            dims,
            softmax_scale: 1.0 / 12f64.sqrt(),
        }
    }

    /// Tokens `cached..total` of `x` attended both ways over the latents of all before them:
    /// (plain, absorbed), each `[heads · new tokens · v]`.
    fn both_forms(m: &Mla, x: &Tensor, cached: usize) -> (Vec<f32>, Vec<f32>) {
        let mut cache = crate::parts::attention::F32Cache::new();
        let rows = m.project(&x.narrow(0, 0, cached).unwrap()).unwrap();
        m.attend_rows(&rows, 0, &mut cache, &mut Choices::default()).unwrap();
        let rows = m.project(&x.narrow(0, cached, x.dim(0).unwrap() - cached).unwrap()).unwrap();
        let (p, c, k_pe) = m.prepare(&rows[0], &rows[1], cached).unwrap();
        let (c, k_pe) = cache.append(&c, &k_pe).unwrap();
        let (c, k_pe) = (c.squeeze(0).unwrap().squeeze(0).unwrap(), k_pe.squeeze(0).unwrap().squeeze(0).unwrap());
        let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (k, v) = m.up_project(&c, &k_pe).unwrap();
        (flat(m.plain(&p, &k, &v, cached, None).unwrap()), flat(m.absorbed(&p, &c, &k_pe, cached, None).unwrap()))
    }

    fn worst(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
    }

    #[test]
    fn the_absorbed_decode_equals_the_plain_form() {
        // The seventh token, both ways, over the same six cached latents.
        let (plain, absorbed) = both_forms(&mla(), &random(&[7, 32], 6), 6);
        assert_eq!(plain.len(), 3 * 6);
        let worst = worst(&plain, &absorbed);
        assert!(worst < 1e-6, "absorbed and plain attention differ by {worst:e}");
        assert!(plain.iter().any(|v| v.abs() > 1e-3), "the check is not vacuous");
    }

    #[test]
    fn both_forms_agree_on_a_chunk_after_cached_tokens_and_the_plain_one_is_for_long_chunks() {
        let m = mla();
        let (plain, absorbed) = both_forms(&m, &random(&[8, 32], 8), 3);
        let worst = worst(&plain, &absorbed);
        assert!(worst < 1e-6, "the forms differ by {worst:e} on a causal chunk");
        // DeepSeek-V3's widths: (128 + 128)·512 / (2·512 − 256) ≈ 170.7 tokens.
        let wide = Mla {
            dims: MlaSpec {
                q_lora_rank: None,
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
                nope: false,
                output_gate: false,
            },
            ..mla()
        };
        assert!(!wide.plain_is_cheaper(1) && !wide.plain_is_cheaper(170) && wide.plain_is_cheaper(171));
        assert!(!m.plain_is_cheaper(5) && m.plain_is_cheaper(13));
    }

    #[test]
    fn a_prefill_and_token_by_token_decoding_agree() {
        let m = mla();
        // 150 tokens: a prefill the plain form takes in three query blocks (the last partial),
        // against decode steps the absorbed one takes.
        let x = random(&[150, 32], 7);
        assert!(m.plain_is_cheaper(150) && 150 > 2 * QUERY_BLOCK);
        let rows = m.project(&x).unwrap();
        let mut cache = crate::parts::attention::F32Cache::new();
        let all = m.attend_rows(&rows, 0, &mut cache, &mut Choices::default()).unwrap().to_vec2::<f32>().unwrap();
        let mut cache = crate::parts::attention::F32Cache::new();
        for (i, want) in all.iter().enumerate() {
            let one: Vec<Tensor> = rows.iter().map(|t| t.narrow(0, i, 1).unwrap()).collect();
            let one = m.attend_rows(&one, i, &mut cache, &mut Choices::default()).unwrap().to_vec2::<f32>().unwrap();
            let worst = worst(&one[0], want);
            assert!(worst < 1e-6, "token {i}: {worst:e}");
        }
    }
}
