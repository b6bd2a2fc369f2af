//! MiniMax-M2 (transformers `MiniMaxM2ForCausalLM`, llama.cpp `minimax-m2`): grouped-query
//! attention with q/k norms across all heads and partial rotary (`rotary_dim`); sigmoid routing
//! with a correction bias, no shared expert.

use super::Row;
use super::moe::{MoeKeys, Scoring, SigmoidDefaults};
use super::source::{Gguf, Hf};
use crate::error::Result;
use crate::spec::{Activation, Architecture, ModelSpec, MoeSpec};

pub(super) const ROW: Row = Row {
    architecture: Architecture::MinimaxM2,
    gguf: &["minimax-m2"],
    gguf_experts: None,
    gguf_mtp_in_blocks: false,
    hf: &["minimax_m2"],
    hf_classes: &[],
    read_gguf,
    read_hf,
};

const ROUTER: SigmoidDefaults = SigmoidDefaults { normalize: true, scale: 1.0, shared_experts: 0 };

/// `MiniMaxM2TopKRouter` always renormalizes, as llama.cpp's minimax-m2 graph does, whatever a
/// file says: DeepSeek-V3's router with one group.
fn moe(mut k: MoeKeys) -> Result<MoeSpec> {
    k.normalize = Some(true);
    k.sigmoid_moe(ROUTER, Scoring::Sigmoid, Activation::SwiGlu)
}

fn read_gguf(g: &Gguf) -> Result<ModelSpec> {
    let mut s = g.base()?;
    s.attention.rope_scaling = g.yarn()?;
    s.moe = g.moe_keys()?.map(moe).transpose()?;
    Ok(s)
}

fn read_hf(h: &Hf) -> Result<ModelSpec> {
    let mut s = h.base()?;
    s.attention.rope_scaling = h.yarn()?;
    s.moe = h.moe_keys()?.map(moe).transpose()?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Routing;
    use crate::spec::arch::tests::check_both;
    use crate::spec::test_files::fixture;

    #[test]
    fn minimax_m2_reads_the_same_from_config_json_and_from_its_gguf_keys() {
        let routing = Routing::GroupedSigmoid { top_k: 2, groups: 1, top_groups: 1, normalize: true, scale: 1.0 };
        check_both("minimax_m2", Architecture::MinimaxM2, routing, None, &[true, true]);
    }

    #[test]
    fn a_q_norm_neither_one_head_nor_all_heads_wide_is_refused_naming_it() {
        use candle_core::quantized::gguf_file::Value;

        use nightmail_formats::GgufFile;
        use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
        // MiniMax-M2's GGUF with a q norm of 24 (neither 16 per head nor 64 across four).
        let src = GgufFile::open(&fixture("minimax_m2/model.gguf")).unwrap();
        let metadata: Vec<(String, Value)> = src.metadata().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let tensors = src.all_tensors().unwrap();
        let narrowed = |t: &nightmail_tensor::TensorView<'_>| t.name == "blk.0.attn_q_norm.weight";
        let headers: Vec<TensorHeader> = tensors
            .iter()
            .map(|t| TensorHeader::new(&t.name, t.dtype, if narrowed(t) { &[24] } else { &t.shape }))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        write_gguf(&path, &metadata, &headers, 32, |i, w| {
            w.write_all(if narrowed(&tensors[i]) { &tensors[i].bytes[..24 * 4] } else { tensors[i].bytes })
        })
        .unwrap();
        let err = crate::spec::test_files::load_error(&path).expect("a q norm of 24");
        assert!(err.contains("blk.0.attn_q_norm.weight") && err.contains("[24]"), "{err}");
    }
}
