//! Qwen3-Next's and Qwen3.5-MoE's Gated DeltaNet layers (Yang et al., arXiv 2412.06464), read
//! from transformers' `config.json` (`Qwen3NextConfig`, `Qwen3_5MoeTextConfig`) or llama.cpp's
//! `qwen3next` / `qwen35moe` GGUF keys (conversion/qwen.py `Qwen3NextModel`).

use crate::error::ModelError;
use nightmail_formats::FormatError;
use serde::Serialize;
use serde_json::Value as Json;

use crate::error::Result;
use nightmail_formats::GgufFile;

/// A Gated DeltaNet layer's widths, and which layers are such.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeltaNetSpec {
    /// Query/key heads and value heads (each key head serves `v_heads / k_heads` value heads).
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    /// The causal depthwise convolution over q, k and v (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// The layers (from 0) that are Gated DeltaNet; the others are gated full attention.
    pub layers: Vec<usize>,
    pub v_head_order: ValueHeadOrder,
}

/// Which key head a value head reads when value heads outnumber key heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueHeadOrder {
    /// transformers' `repeat_interleave`: value head h reads key head h / (v_heads / k_heads).
    Grouped,
    /// llama.cpp's qwen35 converter reorders value heads so that `ggml_repeat` tiles the key
    /// heads (`_LinearAttentionVReorderBase`): value head h reads key head h % k_heads.
    Tiled,
}

impl DeltaNetSpec {
    /// The key head that value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        match self.v_head_order {
            ValueHeadOrder::Grouped => h / (self.v_heads / self.k_heads),
            ValueHeadOrder::Tiled => h % self.k_heads,
        }
    }

    /// The convolution's channels: q, k (key width each) and v.
    pub fn conv_channels(&self) -> usize {
        2 * self.k_heads * self.k_head_dim + self.v_heads * self.v_head_dim
    }

    /// Sizes the layer divides by or indexes with: refused when 0 or inconsistent, naming `key`.
    fn check(self, bad: impl Fn(String) -> ModelError) -> Result<Self> {
        for (name, v) in [
            ("key heads", self.k_heads),
            ("value heads", self.v_heads),
            ("key head size", self.k_head_dim),
            ("value head size", self.v_head_dim),
            ("convolution kernel", self.conv_kernel),
        ] {
            if v == 0 {
                return Err(bad(format!("gives the linear attention's {name} as 0")));
            }
        }
        if !self.v_heads.is_multiple_of(self.k_heads) {
            return Err(bad(format!(
                "gives {} value heads, not a multiple of its {} key heads",
                self.v_heads, self.k_heads
            )));
        }
        Ok(self)
    }
}

/// The layer kinds from `layer_types` (`linear_attention` / `full_attention`), else every
/// `full_attention_interval`-th layer full (transformers' `Qwen3NextConfig.__post_init__`, 4 by
/// default); the widths from the `linear_*` keys, with `Qwen3NextConfig`'s defaults.
pub(in crate::spec) fn from_hf(c: &Json, path: &std::path::Path, layers: usize) -> Result<DeltaNetSpec> {
    let bad = |reason: String| FormatError::BadConfig { path: path.to_path_buf(), reason };
    let width = |key: &str, default: u64| -> Result<usize> {
        match c.get(key).filter(|v| !v.is_null()) {
            None => Ok(default as usize),
            Some(v) => {
                Ok(v.as_u64().map(|n| n as usize).ok_or_else(|| bad(format!("`{key}` is {v}, not a number")))?)
            }
        }
    };
    let linear = match c.get("layer_types").filter(|v| !v.is_null()) {
        Some(types) => linear_layers(types, layers).map_err(bad)?,
        None => {
            let interval = width("full_attention_interval", 4)?;
            if interval == 0 {
                return Err(ModelError::from(bad("`full_attention_interval` is 0".into())));
            }
            (0..layers).filter(|l| (l + 1) % interval != 0).collect()
        }
    };
    DeltaNetSpec {
        k_heads: width("linear_num_key_heads", 16)?,
        v_heads: width("linear_num_value_heads", 32)?,
        k_head_dim: width("linear_key_head_dim", 128)?,
        v_head_dim: width("linear_value_head_dim", 128)?,
        conv_kernel: width("linear_conv_kernel_dim", 4)?,
        layers: linear,
        v_head_order: ValueHeadOrder::Grouped,
    }
    .check(|r| ModelError::from(bad(format!("config {r}"))))
}

/// The layers `layer_types` marks `linear_attention` (Qwen3-Next's and Kimi Linear's configs
/// both spell their kinds so); anything but that and `full_attention` is refused, as is a list
/// of another length than `num_hidden_layers`. The error is the reason, for the caller to name
/// its file.
pub(in crate::spec) fn linear_layers(types: &Json, layers: usize) -> std::result::Result<Vec<usize>, String> {
    let types = types.as_array().ok_or("`layer_types` is not a list")?;
    if types.len() != layers {
        return Err(format!("`layer_types` names {} layers, `num_hidden_layers` is {layers}", types.len()));
    }
    let mut linear = Vec::new();
    for (l, t) in types.iter().enumerate() {
        match t.as_str() {
            Some("linear_attention") => linear.push(l),
            Some("full_attention") => {}
            _ => {
                return Err(format!(
                    "layer {l}'s kind {t} in `layer_types` is not one nightmail runs \
                     (`linear_attention` or `full_attention`)"
                ));
            }
        }
    }
    Ok(linear)
}

/// llama.cpp's keys (src/models/qwen3next.cpp `load_arch_hparams`): `ssm.state_size` is the key
/// head size, `ssm.group_count` the key heads, `ssm.time_step_rank` the value heads,
/// `ssm.inner_size` the value width; every `full_attention_interval`-th layer (4 by default) is
/// full attention.
pub(in crate::spec) fn from_gguf(g: &GgufFile, arch: &str, layers: usize) -> Result<DeltaNetSpec> {
    let key = |k: &str| format!("{arch}.{k}");
    let need =
        |k: &str| g.uint(&key(k)).map(|v| v as usize).ok_or_else(|| FormatError::MissingMetadata { key: key(k) });
    let v_heads = need("ssm.time_step_rank")?;
    let inner = need("ssm.inner_size")?;
    let interval = g.uint(&key("full_attention_interval")).unwrap_or(4) as usize;
    if interval == 0 {
        return Err(FormatError::BadMetadata { key: key("full_attention_interval"), reason: "as 0".into() }.into());
    }
    DeltaNetSpec {
        k_heads: need("ssm.group_count")?,
        v_heads,
        k_head_dim: need("ssm.state_size")?,
        v_head_dim: inner.checked_div(v_heads).unwrap_or(0),
        conv_kernel: need("ssm.conv_kernel")?,
        layers: (0..layers).filter(|l| (l + 1) % interval != 0).collect(),
        // conversion/qwen.py: only the qwen35 family's converter reorders value heads.
        v_head_order: if arch == "qwen3next" { ValueHeadOrder::Grouped } else { ValueHeadOrder::Tiled },
    }
    .check(|reason| ModelError::from(FormatError::BadMetadata { key: key("ssm.*"), reason }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(config: &str) -> Result<DeltaNetSpec> {
        from_hf(&serde_json::from_str(config).unwrap(), std::path::Path::new("/m/config.json"), 4)
    }

    #[test]
    fn layer_kinds_come_from_layer_types_or_the_full_attention_interval() {
        let s =
            of(r#"{"full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4}"#).unwrap();
        assert_eq!((&s.layers[..], s.k_heads, s.v_heads, s.k_head_dim), (&[0, 2][..], 2, 4, 128));
        assert_eq!((s.key_head(0), s.key_head(1), s.key_head(2), s.key_head(3)), (0, 0, 1, 1));
        let s = of(r#"{"layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]}"#)
            .unwrap();
        assert_eq!(s.layers, vec![1, 2]);
        let tiled = DeltaNetSpec { v_head_order: ValueHeadOrder::Tiled, ..s };
        assert_eq!((tiled.key_head(16), tiled.key_head(17)), (0, 1));
    }

    #[test]
    fn qwen3_next_and_qwen3_5_moe_read_the_same_from_config_json_and_from_their_gguf_keys() {
        use crate::spec::{Architecture, ModelSpec, Routing};
        use nightmail_formats::ModelFile;
        let fixtures = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        for (arch, want, order) in [
            ("qwen3_next", Architecture::Qwen3Next, ValueHeadOrder::Grouped),
            ("qwen3_5_moe", Architecture::Qwen35Moe, ValueHeadOrder::Tiled),
        ] {
            let read = |p: std::path::PathBuf| ModelSpec::read(&ModelFile::open(&p).unwrap()).unwrap();
            let (hf, gguf) = (read(fixtures.join(arch)), read(fixtures.join(arch).join("model.gguf")));
            for (s, tiled, centred) in [(&hf, ValueHeadOrder::Grouped, true), (&gguf, order, false)] {
                assert_eq!(s.architecture, want);
                let d = s.delta_net.as_ref().expect("DeltaNet layers");
                let shape = (d.k_heads, d.v_heads, d.k_head_dim, d.v_head_dim, d.conv_kernel, &d.layers[..]);
                assert_eq!(shape, (2, 4, 8, 8, 4, &[0, 1, 2][..]), "{arch}");
                assert_eq!(d.v_head_order, tiled, "{arch}: only llama.cpp's qwen35 converter tiles");
                let a = &s.attention;
                assert_eq!((a.heads, a.kv_heads, a.head_dim, a.rope_dim, a.output_gate), (4, 2, 16, 4, true));
                assert_eq!(s.zero_centered_norms, centred, "{arch}: the converter adds 1 to the norms");
                let moe = s.moe.as_ref().expect("experts");
                let routing = Routing::SoftmaxTopK { top_k: 2, normalize: true };
                assert_eq!(
                    (moe.experts, moe.routing, moe.expert_ffn, moe.shared_expert_ffn),
                    (4, routing, 16, Some(16))
                );
                assert!(s.moe_layers.iter().all(|m| *m) && s.is_recurrent(0) && !s.is_recurrent(3));
            }
        }
    }

    #[test]
    fn an_unknown_layer_kind_or_inconsistent_heads_are_refused_naming_the_config() {
        let err = of(r#"{"layer_types": ["linear_attention", "mamba", "full_attention", "linear_attention"]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("/m/config.json") && err.contains("layer 1") && err.contains("\"mamba\""), "{err}");
        let err = of(r#"{"linear_num_key_heads": 3, "linear_num_value_heads": 4}"#).unwrap_err().to_string();
        assert!(err.contains("/m/config.json") && err.contains("not a multiple of its 3 key heads"), "{err}");
        let err = of(r#"{"layer_types": ["linear_attention"]}"#).unwrap_err().to_string();
        assert!(err.contains("names 1 layers"), "{err}");
    }
}
