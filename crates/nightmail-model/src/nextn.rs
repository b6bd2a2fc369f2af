//! Where a file keeps its multi-token-prediction layer, which both the layer's load (`mtp.rs`) and
//! the index of streamed experts (`expert_index.rs`) ask.

use nightmail_formats::ModelFile;

use crate::error::Result;
use crate::spec::ModelSpec;

/// The index of the checkpoint's first MTP layer (`spec.layers`) where its configuration counts
/// one and the file holds it (its `eh_proj`): the layer `Mtp::load` loads.
pub fn shipped_layer(ck: &ModelFile, spec: &ModelSpec) -> Result<Option<usize>> {
    let l = spec.layers;
    let held = spec.mtp_layers > 0 && ck.tensor(&format!("blk.{l}.nextn.eh_proj.weight"))?.is_some();
    Ok(held.then_some(l))
}

/// The shipped MTP layer's index where it is a MoE layer (it has a router): its routed experts
/// are the model's too, streamed through the same store and cache (`expert_index.rs`), listed in
/// the memory plan and packed with the rest (`pack/`).
pub fn moe_layer(ck: &ModelFile, spec: &ModelSpec) -> Result<Option<usize>> {
    let Some(l) = shipped_layer(ck, spec)? else { return Ok(None) };
    Ok((spec.moe.is_some() && ck.tensor(&format!("blk.{l}.ffn_gate_inp.weight"))?.is_some()).then_some(l))
}
