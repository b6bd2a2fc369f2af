//! Every architecture read from its GGUF and from its Hugging Face directory describes the same
//! model.

use std::path::Path;

use serde_json::Value as Json;

use crate::spec::test_files::fixture;
use crate::spec::{Architecture, ModelSpec, RopeStyle, Routing, delta_net::ValueHeadOrder};
use nightmail_formats::ModelFile;

/// `name`'s spec from its config.json and from its GGUF, each checked for the grouped-query
/// attention both fixtures share (4 heads over 2 kv heads of 16, half of each rotated) and
/// for `routing`, the expert widths and which layers route.
pub(crate) fn check_both(
    name: &str,
    architecture: Architecture,
    routing: Routing,
    shared: Option<usize>,
    moe: &[bool],
) {
    for path in [fixture(name), fixture(name).join("model.gguf")] {
        let at = path.display();
        let s = ModelSpec::read(&ModelFile::open(&path).unwrap()).unwrap();
        assert_eq!((s.architecture, s.layers), (architecture, moe.len()), "{at}");
        let a = &s.attention;
        assert_eq!((a.heads, a.kv_heads, a.head_dim, a.rope_dim), (4, 2, 16, 8), "{at}");
        assert_eq!(a.rope_style, crate::spec::RopeStyle::HalfSplit, "{at}");
        let m = s.moe.expect("experts");
        assert_eq!((m.experts, m.routing, m.expert_ffn, m.shared_expert_ffn), (8, routing, 32, shared), "{at}");
        assert_eq!(s.moe_layers, moe, "{at}");
    }
}

/// The paths where two JSON values differ.
fn differences(path: &str, a: &Json, b: &Json, out: &mut Vec<String>) {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                differences(&format!("{path}.{k}"), &x[k], y.get(k).unwrap_or(&Json::Null), out);
            }
        }
        (Json::Array(x), Json::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(format!("{path}: config.json {a}, GGUF {b}")),
        _ => {}
    }
}

/// The fields that describe how a format stores the model rather than the model, checked to be
/// what llama.cpp's converter writes, then taken from the config.json side.
fn as_stored(hf: &ModelSpec, gguf: &mut ModelSpec) {
    let a = gguf.architecture;
    // The key a format counts its MTP layers under.
    gguf.mtp_key.clone_from(&hf.mtp_key);
    // config.json names the MTP layers its config declares (DeepseekV3Config says 1 whether or
    // not the checkpoint holds one); a GGUF counts the blocks it holds: llama.cpp's DeepSeek-V2
    // converter drops the layer (qwen3next's did before conversion/qwen.py's _QwenMtpMixin),
    // GLM-4.5's writes a NextN block in any case.
    let dropped = matches!(a, Architecture::Qwen3Next | Architecture::DeepseekV3) && gguf.mtp_layers == 0;
    let added = a == Architecture::Glm4Moe && (hf.mtp_layers, gguf.mtp_layers) == (0, 1);
    if dropped || added {
        gguf.mtp_layers = hf.mtp_layers;
    }
    // The converter permutes llama's q/k rows for the NORM rope.
    if matches!(a, Architecture::Llama | Architecture::Mixtral) {
        assert_eq!(
            (hf.attention.rope_style, gguf.attention.rope_style),
            (RopeStyle::HalfSplit, RopeStyle::Interleaved)
        );
        gguf.attention.rope_style = hf.attention.rope_style;
    }
    // The converter adds 1 to Qwen3-Next's norms, and tiles Qwen3.5's value heads.
    if a.is_qwen_hybrid() {
        assert_eq!((hf.zero_centered_norms, gguf.zero_centered_norms), (true, false));
        gguf.zero_centered_norms = true;
        let (h, g) = (hf.delta_net.as_ref().unwrap(), gguf.delta_net.as_mut().unwrap());
        let stored = if a == Architecture::Qwen35Moe { ValueHeadOrder::Tiled } else { ValueHeadOrder::Grouped };
        assert_eq!((h.v_head_order, g.v_head_order), (ValueHeadOrder::Grouped, stored));
        g.v_head_order = h.v_head_order;
    }
}

/// GGUF stores its floats as f32: both sides' floats at that precision.
fn at_f32(s: &mut ModelSpec) {
    let f = |x: &mut f64| *x = *x as f32 as f64;
    f(&mut s.rms_norm_eps);
    f(&mut s.attention.rope_theta);
    let yarns =
        [s.attention.rope_scaling.as_mut(), s.deepseek_v4.as_mut().and_then(|v| v.compress_rope_scaling.as_mut())];
    for y in yarns.into_iter().flatten() {
        for x in [&mut y.factor, &mut y.beta_fast, &mut y.beta_slow, &mut y.attention_factor, &mut y.mscale_all_dim] {
            f(x);
        }
    }
    if let Some(v) = s.deepseek_v4.as_mut() {
        f(&mut v.compress_rope_theta);
    }
}

/// Where the two readers disagree on fixture `name`, field by field; None where they agree.
fn disagreement(name: &str, mut hf: ModelSpec, mut gguf: ModelSpec) -> Option<String> {
    as_stored(&hf, &mut gguf);
    at_f32(&mut hf);
    at_f32(&mut gguf);
    if hf == gguf {
        return None;
    }
    let mut diff = Vec::new();
    differences("", &serde_json::to_value(&hf).unwrap(), &serde_json::to_value(&gguf).unwrap(), &mut diff);
    Some(format!("{name}:\n  {}", diff.join("\n  ")))
}

/// The fixtures that hold both a config.json and a model.gguf.
fn both_formats() -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(fixture("")).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.retain(|d| d.join("config.json").exists() && d.join("model.gguf").exists());
    dirs.sort();
    assert!(dirs.len() >= 16, "fixtures with both formats: {dirs:?}");
    dirs
}

fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

fn read(p: &Path) -> ModelSpec {
    ModelSpec::read(&ModelFile::open(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_fixture_reads_the_same_from_its_gguf_and_its_config_json() {
    let failures: Vec<String> =
        both_formats().iter().filter_map(|d| disagreement(&name(d), read(d), read(&d.join("model.gguf")))).collect();
    assert!(failures.is_empty(), "the two readers disagree:\n{}", failures.join("\n"));
}

/// The keys whose absence each architecture fills with its own default, in config.json and in
/// the GGUF (without the `{arch}.` prefix).
const DEFAULTED_HF: &[&str] = &[
    "n_shared_experts",
    "num_shared_experts",
    "routed_scaling_factor",
    "norm_topk_prob",
    "moe_renormalize",
    "swiglu_limit",
];
const DEFAULTED_GGUF: &[&str] =
    &["expert_shared_count", "expert_weights_scale", "expert_weights_norm", "swiglu_clamp_exp", "swiglu_limit"];

/// `dir`'s fixture with the defaulted keys taken out of both files, in `out`.
fn without_defaulted_keys(dir: &Path, out: &Path) {
    use candle_core::quantized::gguf_file::Value;

    use nightmail_formats::GgufFile;
    use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
    for f in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
        let n = f.file_name().unwrap();
        if n != "config.json" && n != "model.gguf" {
            std::os::unix::fs::symlink(&f, out.join(n)).unwrap();
        }
    }
    let mut c: Json = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let o = c.as_object_mut().unwrap();
    if let Some(t) = o.get_mut("text_config").and_then(Json::as_object_mut) {
        t.retain(|k, _| !DEFAULTED_HF.contains(&k.as_str()));
    }
    o.retain(|k, _| !DEFAULTED_HF.contains(&k.as_str()));
    std::fs::write(out.join("config.json"), serde_json::to_vec(&c).unwrap()).unwrap();
    let src = GgufFile::open(&dir.join("model.gguf")).unwrap();
    let arch = src.string("general.architecture").unwrap().to_string();
    let dropped: Vec<String> = DEFAULTED_GGUF.iter().map(|k| format!("{arch}.{k}")).collect();
    let metadata: Vec<(String, Value)> =
        src.metadata().iter().filter(|(k, _)| !dropped.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let tensors = src.all_tensors().unwrap();
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| TensorHeader::new(&t.name, t.dtype, &t.shape)).collect();
    write_gguf(&out.join("model.gguf"), &metadata, &headers, 32, |i, w| w.write_all(tensors[i].bytes)).unwrap();
}

#[test]
fn every_architectures_defaults_are_the_same_for_both_formats() {
    let mut failures = Vec::new();
    for dir in both_formats() {
        let out = tempfile::tempdir().unwrap();
        without_defaulted_keys(&dir, out.path());
        let (hf, gguf) = (read(out.path()), read(&out.path().join("model.gguf")));
        failures.extend(disagreement(&name(&dir), hf, gguf));
    }
    assert!(failures.is_empty(), "the two readers' defaults disagree:\n{}", failures.join("\n"));
}

/// The spec of `fixture`'s GGUF with key `{arch}.{key}` set to `value`.
fn with_key(
    fixture_dir: &str,
    key: &str,
    value: candle_core::quantized::gguf_file::Value,
) -> crate::error::Result<ModelSpec> {
    use nightmail_formats::GgufFile;
    use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
    let src = GgufFile::open(&fixture(fixture_dir).join("model.gguf")).unwrap();
    let key = format!("{}.{key}", src.string("general.architecture").unwrap());
    let mut metadata: Vec<_> = src
        .metadata()
        .iter()
        .filter(|(k, _)| **k != key && k.as_str() != "general.alignment")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push((key, value));
    let tensors = src.all_tensors().unwrap();
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| TensorHeader::new(&t.name, t.dtype, &t.shape)).collect();
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("model.gguf");
    write_gguf(&path, &metadata, &headers, 32, |i, w| w.write_all(tensors[i].bytes)).unwrap();
    ModelSpec::read(&ModelFile::open(&path).unwrap())
}

#[test]
fn deepseek_v4s_per_layer_swiglu_clamps_read_as_its_one_limit() {
    use candle_core::quantized::gguf_file::Value;
    let plain = read(&fixture("deepseek_v4").join("model.gguf"));
    let limits = |v: &[f32]| Value::Array(v.iter().map(|x| Value::F32(*x)).collect());
    let n = plain.layers;
    // As llama.cpp's converter writes them: `[swiglu_limit] * block_count`, for both.
    let limit = match plain.ffn_activation {
        crate::spec::Activation::ClampedSilu { limit } => limit,
        other => panic!("{other:?}"),
    };
    assert_eq!(with_key("deepseek_v4", "swiglu_clamp_exp", limits(&vec![limit; n])).unwrap(), plain);
    let mut uneven = vec![limit; n];
    uneven[n - 1] = limit + 1.0;
    let e = with_key("deepseek_v4", "swiglu_clamp_exp", limits(&uneven)).unwrap_err().to_string();
    assert!(e.contains("differing between layers"), "{e}");
    let e = with_key("deepseek_v4", "swiglu_clamp_shexp", limits(&vec![limit + 1.0; n])).unwrap_err().to_string();
    assert!(e.contains("shared expert clamped"), "{e}");
}

#[test]
fn k3s_expert_width_reads_as_a_scalar_or_one_per_layer() {
    use candle_core::quantized::gguf_file::Value;
    let plain = read(&fixture("kimi_k3").join("model.gguf"));
    let moe = plain.moe.as_ref().expect("experts");
    // One per layer, 0 where a layer is dense (llama.cpp's `n_ff_exp_arr`).
    let widths = plain.moe_layers.iter().map(|m| Value::U32(if *m { moe.expert_ffn as u32 } else { 0 })).collect();
    assert_eq!(with_key("kimi_k3", "expert_feed_forward_length", Value::Array(widths)).unwrap(), plain);
    let scalar = Value::U32(moe.expert_ffn as u32);
    assert_eq!(with_key("kimi_k3", "expert_feed_forward_length", scalar).unwrap(), plain);
}
