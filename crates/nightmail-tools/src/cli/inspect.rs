//! `nightmail model inspect`: what a model file is, as text or JSON.

use std::path::PathBuf;

use nightmail_engine::{Activation, MemoryBudget, Routing, TemplateSource};

use super::error::Result;
use super::print::{bytes, yes};

pub(super) fn inspect(path: PathBuf, json: bool, memory_mb: Option<usize>) -> Result<()> {
    let info = crate::inspect::inspect_with_memory(&path, memory_mb.map(MemoryBudget::mb))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    let s = &info.spec;
    let a = &s.attention;
    println!("model          {} ({:?})", info.path.display(), info.format);
    println!("architecture   {:?}", s.architecture);
    let k = &info.layer_kinds;
    println!(
        "layers         {} ({} attention, {} latent attention, {} KDA linear attention; {} dense, {} MoE)",
        s.layers, k.attention, k.latent_attention, k.linear_attention, k.dense_ffn, k.moe
    );
    if s.mtp_layers > 0 {
        // Counted by the configuration; the weights are looked for when draft = "mtp" loads them.
        println!(
            "mtp            {} multi-token-prediction layer(s) declared past the last (draft = \"mtp\")",
            s.mtp_layers
        );
    }
    println!("hidden         {}  vocab {}  context {}", s.hidden_size, s.vocab_size, s.context_length);
    match &a.mla {
        Some(m) => println!(
            "attention      latent (MLA): {} heads, kv latent {} + rope key {} cached per token, q latent {}, qk head dim {} + {}, v head dim {}, rope theta {}",
            a.heads,
            m.kv_lora_rank,
            m.qk_rope_head_dim,
            m.q_lora_rank.map_or("none".to_string(), |r| r.to_string()),
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
            a.rope_theta
        ),
        None => println!(
            "attention      {} heads, {} kv heads, head dim {}, rope theta {}{}{}",
            a.heads,
            a.kv_heads,
            a.head_dim,
            a.rope_theta,
            sliding_layers(a),
            if a.sinks { ", attention sinks" } else { "" }
        ),
    }
    if let Some(d) = &s.sparse_attention {
        println!(
            "sparse attn    DeepSeek Sparse Attention: an indexer of {} heads of {} keeps each query's {} best keys; its key of {} cached per token beside the latent",
            d.heads, d.head_dim, d.top_k, d.head_dim
        );
    }
    if let Some(y) = &a.rope_scaling {
        println!(
            "rope scaling   YaRN factor {} over original context {}, beta {}/{}{}, attention factor {:.4}, softmax factor {:.4}",
            y.factor,
            y.original_context,
            y.beta_fast,
            y.beta_slow,
            if y.truncate { "" } else { " (ramp not rounded)" },
            y.attention_factor,
            y.softmax_factor()
        );
    }
    match &s.moe {
        Some(m) => println!(
            "experts        {} per layer in {} MoE layers, {}, expert ffn {}{}{}{}",
            m.experts,
            s.moe_layers.iter().filter(|x| **x).count(),
            routing(&m.routing),
            m.expert_ffn,
            m.latent.map(|l| format!(" in a latent of {} (Stable LatentMoE)", l.width)).unwrap_or_default(),
            m.shared_expert_ffn.map(|f| format!(", shared expert ffn {f}")).unwrap_or_default(),
            match m.activation {
                Activation::SwiGlu => String::new(),
                Activation::ClampedSwiGlu { alpha, limit } =>
                    format!(", clamped SwiGLU (alpha {alpha}, limit {limit})"),
                Activation::Situ { beta, linear_beta } => match linear_beta {
                    Some(lb) => format!(", SiTU (beta {beta}, linear beta {lb})"),
                    None => format!(", SiTU (beta {beta})"),
                },
                Activation::ClampedSilu { limit } => format!(", SwiGLU clamped at {limit}"),
            }
        ),
        None => println!("experts        none (dense ffn {})", s.ffn),
    }
    let dtypes: Vec<String> =
        info.dtypes.iter().map(|(d, u)| format!("{d} ({} tensors, {})", u.tensors, bytes(u.bytes))).collect();
    println!("dtypes         {}", dtypes.join(", "));
    println!("parameters     {}", info.parameters);
    println!("dense weights  {}", bytes(info.dense_bytes));
    println!("expert weights {}", bytes(info.expert_bytes));
    println!("experts/token  {} ({} routed experts in all)", bytes(info.expert_bytes_per_token), info.experts);
    if let Some(m) = &info.mtp {
        println!(
            "mtp weights    {} tensors, {} ({} of routed experts), {} parameters, apart from the totals above",
            m.tensors,
            bytes(m.bytes),
            bytes(m.expert_bytes),
            m.parameters
        );
    }
    if let Some(r) = &info.ram {
        let p = &r.plan;
        println!(
            "memory         {} holds {} of {} layers ({}) and an expert cache of {}{}: {:.0}% of experts hit, {} read from disk per token",
            bytes(p.budget_bytes as u64),
            p.resident_layers.len(),
            p.resident_layers.len() + p.streamed_layers.len(),
            bytes(p.resident_layer_bytes as u64),
            bytes(p.expert_cache_bytes as u64),
            if p.experts_resident { " (every expert)" } else { "" },
            100.0 * r.expert_hit_rate,
            bytes(r.disk_bytes_per_token as u64)
        );
    }
    let template = match info.chat_template {
        Some(TemplateSource::File) => "yes",
        Some(TemplateSource::BuiltIn) => "built in (the family's own prompt format)",
        None => "no",
    };
    println!("tokenizer      {}  chat template {template}", yes(info.has_tokenizer));
    Ok(())
}

/// `, sliding window W on N of L layers`, or nothing when every layer attends to all.
fn sliding_layers(a: &nightmail_engine::AttentionSpec) -> String {
    let windows: Vec<usize> = a.sliding_window.iter().flatten().copied().collect();
    match windows.first() {
        None => String::new(),
        Some(w) if windows.len() == a.sliding_window.len() => format!(", sliding window {w}"),
        Some(w) => format!(", sliding window {w} on {} of {} layers", windows.len(), a.sliding_window.len()),
    }
}

fn routing(r: &Routing) -> String {
    match r {
        Routing::SoftmaxTopK { top_k, normalize: true } => format!("top-{top_k} of the softmax, renormalized"),
        Routing::SoftmaxTopK { top_k, normalize: false } => format!("top-{top_k} of the softmax"),
        Routing::TopKSoftmax { top_k } => format!("top-{top_k} logits, softmax over them"),
        Routing::GroupedSigmoid { top_k, groups, top_groups, normalize, scale } => format!(
            "top-{top_k}, sigmoid routing in {groups} groups (best {top_groups}), {}weights × {scale}",
            if *normalize { "normalized " } else { "" }
        ),
        Routing::SqrtSoftplus { top_k, scale } => {
            format!(
                "top-{top_k}, sqrt(softplus) routing, normalized weights × {scale} (hash-routed layers by token id)"
            )
        }
    }
}
