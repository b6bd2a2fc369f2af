//! `model pack SRC DST`: rewrite a GGUF model expert-major. The dense tensors come first,
//! together; then each routed expert's gate, up and down matrices back to back, each 4 KiB
//! aligned, so one direct read fetches a whole expert. The result is a GGUF with the source's
//! metadata plus `nightmail.packed`; llama.cpp does not read its per-expert tensors, nightmail
//! reads both layouts.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use crate::error::{EngineError, Result};
use crate::format::gguf_write::{TensorHeader, write_gguf};
use crate::format::{
    Checkpoint, ExpertMatrix, TensorView, is_expert_tensor, packed_expert_bias_name, packed_expert_name,
};
use crate::model::ExpertId;
use crate::spec::ModelSpec;
use crate::stream::{expert_biases, expert_views};

/// The version written to `nightmail.packed`.
pub const PACK_VERSION: u32 = 1;

pub fn pack(src: &Path, dst: &Path) -> Result<u64> {
    let ck = Checkpoint::open(src)?;
    let Checkpoint::Gguf(g) = &ck else {
        return Err(EngineError::Unsupported {
            what: "packing a Hugging Face directory".into(),
            hint: "convert it to GGUF first (llama.cpp convert_hf_to_gguf.py), or stream it as it is".into(),
        });
    };
    let spec = ModelSpec::read(&ck)?;
    let moe = spec.moe.as_ref().ok_or_else(|| EngineError::Unsupported {
        what: format!("packing {}", src.display()),
        hint: "the model has no routed experts".into(),
    })?;
    let mut metadata: Vec<(String, Value)> =
        g.metadata().iter().filter(|(k, _)| *k != "general.alignment").map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    metadata.push(("nightmail.packed".into(), Value::U32(PACK_VERSION)));

    let mut views: Vec<(String, TensorView<'_>)> = Vec::new();
    for t in ck.all_tensors()?.into_iter().filter(|t| !is_expert_tensor(&t.name)) {
        views.push((t.name.clone(), t));
    }
    for layer in (0..spec.layers).filter(|l| spec.moe_layers[*l]) {
        for expert in 0..moe.experts {
            let id = ExpertId { layer, expert };
            for (m, v) in ExpertMatrix::ALL.into_iter().zip(expert_views(&ck, &spec, id)?) {
                views.push((packed_expert_name(id, m), v));
            }
            // gpt-oss's biases follow their expert's matrices, inside the same read.
            for (m, b) in ExpertMatrix::ALL.into_iter().zip(expert_biases(&ck, &spec, id)?) {
                if let Some(b) = b {
                    views.push((packed_expert_bias_name(id, m), b));
                }
            }
        }
    }
    let headers: Vec<TensorHeader> =
        views.iter().map(|(n, v)| TensorHeader::new(n.clone(), v.dtype, &v.shape)).collect();
    let mut since_release = 0usize;
    write_gguf(dst, &metadata, &headers, 4096, |i, w| {
        let bytes = views[i].1.bytes;
        w.write_all(bytes)?;
        // Copying through the map faults the source in: let its pages go as we pass.
        since_release += bytes.len();
        if since_release > 1 << 30 {
            ck.release_pages();
            since_release = 0;
        }
        Ok(())
    })
    .map_err(|source| EngineError::Io { path: dst.to_path_buf(), source })?;
    ck.release_pages();
    Ok(std::fs::metadata(dst).map_err(|source| EngineError::Io { path: dst.to_path_buf(), source })?.len())
}
