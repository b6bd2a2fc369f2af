//! The engine against transformers on tiny random models of each architecture
//! (tests/fixtures/generate.py): every step's logits within 1e-4 and the same 16 greedy tokens,
//! from the Hugging Face safetensors and from the same weights as GGUF F32. And gpt_oss with its
//! experts in MXFP4 against its dequantized F32 twin.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use nightmail_engine::{GenerateRequest, Model, Prompt};

const TOLERANCE: f32 = 1e-4;

#[derive(serde::Deserialize)]
struct Reference {
    prompt_tokens: Vec<u32>,
    greedy_tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    /// DSA fixtures: how far transformers' logits move when every key is attended.
    dense_gap: Option<f32>,
}

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(arch)
}

fn reference(arch: &str) -> Reference {
    serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("reference.json")).unwrap()).unwrap()
}

/// Greedy generation from `model_path`: the tokens, and the logits row that chose each.
fn greedy(model_path: &Path, prompt: &[u32], tokens: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let model = Model::load(model_path).unwrap_or_else(|e| panic!("loading {}: {e}", model_path.display()));
    let mut request = GenerateRequest::new(Prompt::Tokens(prompt.to_vec()));
    request.max_new_tokens = tokens;
    request.record_logits = true;
    request.stop_at_eos = false;
    let mut rows = Vec::new();
    let completion = model
        .generate(request, |event| {
            rows.push(event.logits.clone().expect("logits were requested"));
            ControlFlow::Continue(())
        })
        .unwrap();
    (completion.tokens, rows)
}

/// Greedy-generate from `model_path` and compare with the fixture's reference; returns the
/// largest logit difference seen.
fn check(arch: &str, model_path: PathBuf) -> f32 {
    let reference = reference(arch);
    let (tokens, rows) = greedy(&model_path, &reference.prompt_tokens, reference.greedy_tokens.len());
    assert_eq!(tokens, reference.greedy_tokens, "{arch} greedy tokens from {}", model_path.display());
    assert_eq!(rows.len(), reference.logits.len());
    let mut worst = 0f32;
    for (step, (ours, theirs)) in rows.iter().zip(&reference.logits).enumerate() {
        assert_eq!(ours.len(), theirs.len(), "{arch} step {step}: vocabulary size");
        let err = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < TOLERANCE, "{arch} step {step} from {}: max |Δlogit| = {err:e}", model_path.display());
        worst = worst.max(err);
    }
    eprintln!("{arch} {}: max |Δlogit| over {} steps = {worst:.3e}", model_path.display(), rows.len());
    worst
}

macro_rules! reference_tests {
    ($($arch:ident),*) => {$(
        mod $arch {
            #[test]
            fn safetensors_logits_and_greedy_tokens_match_transformers() {
                super::check(stringify!($arch), super::fixture(stringify!($arch)));
            }

            #[test]
            fn gguf_logits_and_greedy_tokens_match_transformers() {
                super::check(stringify!($arch), super::fixture(stringify!($arch)).join("model.gguf"));
            }
        }
    )*};
}

// kimi_linear: KDA layers (a 72-token prompt, so transformers' chunked prefill crosses a chunk
// boundary, then recurrent decoding) around a NoPE latent-attention layer.
// glm4_moe: partial rotary, q/k/v biases, per-head q/k norms, DeepSeek-V3's routing; its GGUF
// counts a NextN block. minimax_m2: q/k norms across all heads, partial rotary, sigmoid routing.
reference_tests!(llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss, kimi_linear, glm4_moe, minimax_m2);

// qwen3_next: Gated DeltaNet layers (two value heads per key head; chunked prefill across a chunk
// boundary, then recurrent decoding) around a gated full-attention layer with partial rotation
// and (1 + w) q/k norms; the GGUF as llama.cpp's converter writes it (split attn_qkv/attn_gate,
// norms stored as 1 + w).
reference_tests!(qwen3_next);

// qwen3_5_moe: Qwen3-Next's layers with in_proj_qkv/z/b/a stored apart; its GGUF (`qwen35moe`)
// has the value heads in llama.cpp's tiled order. A 40-token prompt: at 72, no seed below 100
// keeps every router gap above the margin.
reference_tests!(qwen3_5_moe);

// deepseek_v4: hyper-connection streams, one layer each of sliding-window MQA, compressed-sparse
// attention (Lightning Indexer keeping 3 entries) and heavily-compressed attention, a 40-token
// prompt past the window (8) and across 10 CSA and 5 HCA windows, a hash-routed layer and
// sqrtsoftplus routing, the swiglu clamp biting, YaRN on the compressed layers' rotary (original
// context 16, factor 4); its GGUF under llama.cpp's deepseek4 names.
reference_tests!(deepseek_v4);

// deepseek_v3_mtp, glm4_moe_mtp, qwen3_next_mtp: DeepSeek-V3, GLM-4.5 and Qwen3-Next (`mtp.*`) with a multi-token-prediction layer past the last (its own shard
// `mtp.safetensors`; the GGUF's blk.2 counted in block_count and `nextn_predict_layers`): the
// model runs as if it were not there (tests/mtp.rs checks the layer itself).
reference_tests!(deepseek_v3_mtp, glm4_moe_mtp, qwen3_next_mtp);

// deepseek_v32 and glm_moe_dsa: DeepSeek Sparse Attention, each layer's lightning indexer keeping
// 4 keys over a 12-token prompt and 16 decoded tokens (halves rotated in DeepSeek-V3.2's indexer,
// adjacent pairs in GLM-5's, whose middle layer is GLM-5.2's "shared" kind); their GGUFs as
// llama.cpp's deepseek32 and glm-dsa converters write them.
reference_tests!(deepseek_v32, glm_moe_dsa);

/// The DSA fixtures test the sparsity: attending every key (dense MLA) moves transformers' own
/// logits by far more than the tolerance, so matching them needs the indexer's choice.
#[test]
fn dense_attention_would_not_match_the_sparse_fixtures() {
    for arch in ["deepseek_v32", "glm_moe_dsa"] {
        let gap = reference(arch).dense_gap.expect("a DSA fixture records its dense gap");
        assert!(gap > 1000.0 * TOLERANCE, "{arch}: dense attention moves the logits by only {gap:e}");
    }
}

/// kimi_k3 (tests/fixtures/kimi_k3.py, no transformers release runs it): KDA with the
/// lower-bounded gate and full-rank output gate, gated NoPE MLA, Stable LatentMoE with SiTU and
/// AttnRes residuals, from the safetensors (its text model under `language_model.`) and from the
/// GGUF as llama.cpp's kimi-k3 converter lays it out (fused AttnRes scores, `ffn_routed_*`, split
/// kv_b, A as −exp(A_log)).
mod kimi_k3 {
    #[test]
    fn safetensors_logits_and_greedy_tokens_match_the_pytorch_reference() {
        super::check("kimi_k3", super::fixture("kimi_k3"));
    }

    #[test]
    fn llama_cpp_layout_gguf_logits_and_greedy_tokens_match_the_pytorch_reference() {
        super::check("kimi_k3", super::fixture("kimi_k3").join("model.gguf"));
    }
}

/// gpt_oss with MXFP4 experts (gpt-oss's `_blocks`/`_scales` pairs) and its twin, the same model
/// with those experts dequantized to F32 by transformers' `convert_moe_packed_tensors`.
mod gpt_oss_mxfp4 {
    use super::*;

    #[test]
    fn the_dequantized_twin_matches_transformers() {
        super::check("gpt_oss_mxfp4/f32", fixture("gpt_oss_mxfp4/f32"));
    }

    /// The MXFP4 model at `path` against the twin: same greedy tokens, logits within 1e-4.
    fn agrees_with_the_twin(path: &Path) {
        let r = reference("gpt_oss_mxfp4/f32");
        let n = r.greedy_tokens.len();
        let (tokens, rows) = greedy(path, &r.prompt_tokens, n);
        let (twin_tokens, twin_rows) = greedy(&fixture("gpt_oss_mxfp4/f32"), &r.prompt_tokens, n);
        assert_eq!(tokens, twin_tokens, "greedy tokens from {}", path.display());
        let mut worst = 0f32;
        for (step, (a, b)) in rows.iter().zip(&twin_rows).enumerate() {
            let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(err < TOLERANCE, "step {step} from {}: max |Δlogit| = {err:e}", path.display());
            worst = worst.max(err);
        }
        eprintln!(
            "gpt_oss MXFP4 {} vs its F32 twin: max |Δlogit| over {} steps = {worst:.3e}",
            path.display(),
            rows.len()
        );
    }

    #[test]
    fn mxfp4_safetensors_experts_agree_with_their_dequantized_f32_twin_at_every_step() {
        agrees_with_the_twin(&fixture("gpt_oss_mxfp4"));
    }

    #[test]
    fn mxfp4_gguf_experts_agree_with_their_dequantized_f32_twin_at_every_step() {
        agrees_with_the_twin(&fixture("gpt_oss_mxfp4").join("model.gguf"));
    }
}

/// The fixtures as llama.cpp's own converter writes them (tests/fixtures/llama_cpp_convert.py runs
/// the llama-cpp-python 0.3.36 sdist's convert_hf_to_gguf.py, F32): its tensor names, permuted
/// q/k, stacked experts and metadata read as written, against transformers' reference.
macro_rules! llama_cpp_converted {
    ($($arch:ident: [$($file:literal),+]),* $(,)?) => {
        mod llama_cpp_converted {$(
            #[test]
            fn $arch() {
                $(super::check(stringify!($arch), super::fixture(stringify!($arch)).join($file));)+
            }
        )*}
    };
}

llama_cpp_converted!(
    llama: ["llama_cpp.gguf"],
    mixtral: ["llama_cpp.gguf"],
    qwen2_moe: ["llama_cpp.gguf"],
    qwen3_moe: ["llama_cpp.gguf"],
    deepseek_v3: ["llama_cpp.gguf"],
    deepseek_v3_mtp: ["llama_cpp.gguf"],
    glm4_moe: ["llama_cpp.gguf"],
    glm4_moe_mtp: ["llama_cpp.gguf"],
    gpt_oss: ["llama_cpp.gguf"],
    minimax_m2: ["llama_cpp.gguf"],
    // `--fuse-gate-up-exps`: the experts' gate and up in one `ffn_gate_up_exps`.
    qwen3_next: ["llama_cpp.gguf", "llama_cpp_fused.gguf"],
    qwen3_next_mtp: ["llama_cpp.gguf", "llama_cpp_fused.gguf"],
    qwen3_5_moe: ["llama_cpp.gguf", "llama_cpp_fused.gguf"],
    kimi_linear: ["llama_cpp.gguf"],
    kimi_k3: ["llama_cpp.gguf"],
);
