//! `nightmail model …`: look inside a model file and generate with it, without the daemon.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use nightmail_engine::{
    Activation, ChatMessage, GenerateRequest, LoadOptions, MemoryBudget, Model, Prompt, Routing, Sampling, StreamConfig,
};

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Architecture, layers, experts, top-k, dtypes, and the bytes of dense weights, of expert
    /// weights and of experts read per token.
    Inspect {
        /// A .gguf file or a Hugging Face model directory.
        path: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// Also state what this much RAM (MiB) holds: resident layers, expert cache, reads per token.
        #[arg(long)]
        memory_mb: Option<usize>,
    },
    /// Generate from a prompt and print the text (or, with --json, one JSON object).
    Generate {
        /// A .gguf file or a Hugging Face model directory.
        #[arg(long)]
        model: PathBuf,
        /// Prompt text (with --chat: the user's message).
        #[arg(long, required_unless_present = "prompt_tokens", conflicts_with = "prompt_tokens")]
        prompt: Option<String>,
        /// Prompt as token ids, e.g. 1,2,3.
        #[arg(long, value_delimiter = ',')]
        prompt_tokens: Option<Vec<u32>>,
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        /// Always take the most likely token (the default unless --temperature is above 0).
        #[arg(long, conflicts_with = "temperature")]
        greedy: bool,
        /// Sampling temperature; 0 means greedy.
        #[arg(long)]
        temperature: Option<f32>,
        #[arg(long)]
        top_k: Option<usize>,
        #[arg(long)]
        top_p: Option<f32>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Wrap the prompt as a user message in the model's chat template.
        #[arg(long)]
        chat: bool,
        /// Stop when the text contains this string (repeatable).
        #[arg(long)]
        stop: Vec<String>,
        /// With --json: add `logits`, the full logits row behind each generated token.
        #[arg(long)]
        logits: bool,
        /// Print one JSON object: prompt_tokens, tokens, text, verify_steps (and logits).
        #[arg(long)]
        json: bool,
        /// Draft tokens ahead and verify them in one model pass: `lookup` (n-gram matches
        /// against the prompt and the answer so far), `model` (the --draft-model's guesses),
        /// `mtp` (the model's own multi-token-prediction layer, DeepSeek-V3's) or `none` (the
        /// default without --draft-model). The tokens are the same either way; only
        /// the number of passes (`verify_steps`) changes.
        #[arg(long)]
        draft: Option<nightmail_engine::Draft>,
        /// A small model of the same tokenizer that guesses the tokens (implies --draft model);
        /// loaded resident beside MODEL.
        #[arg(long)]
        draft_model: Option<PathBuf>,
        /// With drafts: the most tokens guessed per pass (below it, as many as pay for their
        /// rows at the acceptance rate so far and this model's measured cost of a row).
        #[arg(long)]
        draft_max: Option<usize>,
        /// With drafts: take a guess (its row, and a draft model's pass) to cost this fraction
        /// of a one-row pass instead of measuring it (0: guess as many as --draft-max allows).
        #[arg(long)]
        draft_row_cost: Option<f64>,
        /// Stream routed experts from disk through a cache of this many MiB instead of loading
        /// them all.
        #[arg(long, conflicts_with = "memory_mb")]
        cache_mb: Option<usize>,
        /// One memory budget for the whole model: what does not fit (dense layers too) streams
        /// from disk.
        #[arg(long)]
        memory_mb: Option<usize>,
    },
    /// Write a random-weight mixture-of-experts GGUF of any size (llama.cpp loads it too), for
    /// benchmarks.
    Synth {
        #[arg(long, default_value = "qwen3_moe")]
        arch: nightmail_engine::SynthArch,
        #[arg(long)]
        layers: usize,
        #[arg(long)]
        experts: usize,
        #[arg(long)]
        top_k: usize,
        #[arg(long)]
        hidden: usize,
        #[arg(long)]
        expert_ffn: usize,
        /// Routed experts' type: q4_0, q8_0 or mxfp4.
        #[arg(long, default_value = "q4_0")]
        dtype: nightmail_engine::SynthDtype,
        /// Write the non-expert weights in q8_0 or q4_0 instead of f16: the tensors `model pack
        /// --dense` requantizes, in llama.cpp's layout (llama.cpp runs the same file).
        #[arg(long)]
        dense: Option<nightmail_engine::DenseQuant>,
        /// Attention heads (default: hidden / 128, a quarter as many key/value heads).
        #[arg(long)]
        heads: Option<usize>,
        #[arg(long)]
        kv_heads: Option<usize>,
        #[arg(long)]
        head_dim: Option<usize>,
        /// Copy the tokenizer (and chat template) of this GGUF, e.g. the demo model.
        #[arg(long)]
        tokenizer_from: Option<PathBuf>,
        /// Vocabulary size when no tokenizer is copied.
        #[arg(long, default_value_t = 32000)]
        vocab: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Headers only, the data a hole (a sparse file): for `model plan`/`inspect` on a shape
        /// larger than the disk.
        #[arg(long)]
        sparse: bool,
        #[arg(long)]
        out: PathBuf,
    },
    /// Decode with experts streamed from disk and compare the time per token with the I/O floor
    /// (bytes read per token over the disk's bandwidth, measured in the same run).
    Bench {
        #[arg(long)]
        model: PathBuf,
        /// The expert cache's budget.
        #[arg(long, required_unless_present_any = ["memory_mb", "verify"], conflicts_with = "memory_mb")]
        cache_mb: Option<usize>,
        /// One memory budget for the whole model (dense layers stream too; the plan sizes the
        /// expert cache).
        #[arg(long)]
        memory_mb: Option<usize>,
        /// With --memory-mb: tokens of key/value cache to reserve per sequence.
        #[arg(long, default_value_t = nightmail_engine::stream::DEFAULT_KV_TOKENS)]
        kv_tokens: usize,
        /// Decode steps to time.
        #[arg(long, default_value_t = 16)]
        tokens: usize,
        /// Eviction policy: lru or lfu.
        #[arg(long, default_value = "lru")]
        policy: nightmail_engine::CachePolicy,
        /// Next-layer experts prefetched per step (0: none).
        #[arg(long, default_value_t = 8)]
        prefetch: usize,
        /// Prefetch reads in flight at most.
        #[arg(long, default_value_t = 2)]
        prefetch_in_flight: usize,
        /// Expert reads in flight at once.
        #[arg(long, default_value_t = 16)]
        io_threads: usize,
        /// Prompt token ids to prefill before timing.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
        prompt_tokens: Vec<u32>,
        /// MiB read sequentially to measure the disk, before and after.
        #[arg(long, default_value_t = 1024)]
        probe_mb: u64,
        /// Probe reads (4 MiB each) in flight.
        #[arg(long, default_value_t = 16)]
        probe_parallel: usize,
        /// Feed back each step's most likely token instead of a seeded pseudo-random one (a
        /// random-weight model then repeats one token, and its routes).
        #[arg(long)]
        greedy: bool,
        /// Instead: decode this many sequences together at each batch size, e.g. 1,4,8, and
        /// compare their aggregate tokens/s with the first's (`--tokens` steps each).
        #[arg(long, value_delimiter = ',')]
        batch: Vec<usize>,
        /// Instead: time verify passes of one sequence over this many rows each, e.g. 1,2,4,8
        /// (the first is the reference), `--tokens` passes per width, against the bound that
        /// reading each weight once allows; without --cache-mb or --memory-mb the model is
        /// resident.
        #[arg(long, value_delimiter = ',', conflicts_with = "batch")]
        verify: Vec<usize>,
        /// With --verify: the acceptance rates (per guess) to give s/token at.
        #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9")]
        acceptance: Vec<f64>,
        /// With --verify: rounds that take the widths in turn.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// Write the decode's timeline to this file (one JSON span per line: reads in flight,
        /// and what the step was doing; `benches/timeline.py FILE` finds where the disk idles).
        /// With --verify: every timed pass, each step span giving its rows (`timeline.py FILE
        /// --rows K` reads the passes of K rows).
        #[arg(long)]
        timeline: Option<PathBuf>,
    },
    /// Time the MXFP4 mat-vec against this machine's memory bandwidth and candle's Q4_0 mat-vec
    /// on the same shape (GB/s of weights read, and their ratios).
    KernelBench {
        #[arg(long, default_value_t = 4096)]
        rows: usize,
        #[arg(long, default_value_t = 4096)]
        cols: usize,
        /// Token rows per call (1: mat-vec; more: small-batch mat-mul).
        #[arg(long, default_value_t = 1)]
        tokens: usize,
        /// MiB of weights each kernel cycles through, and of the memory sweep (keep it several
        /// times the last-level cache).
        #[arg(long, default_value_t = 2048)]
        working_set_mb: usize,
        /// Timed passes over the working set (the median counts).
        #[arg(long, default_value_t = 5)]
        passes: usize,
        #[arg(long)]
        json: bool,
    },
    /// What a memory budget keeps resident for a model, the bytes each token reads from disk, and
    /// the time per token and batch size that predicts on this machine (or with --disk-gbps).
    Plan {
        /// A .gguf file or a Hugging Face model directory.
        model: PathBuf,
        #[arg(long)]
        memory_mb: usize,
        /// The disk's sequential read rate; measured on the model file when absent.
        #[arg(long)]
        disk_gbps: Option<f64>,
        /// Tokens of key/value cache to reserve per sequence (the largest --batch has as many caches).
        #[arg(long, default_value_t = nightmail_engine::stream::DEFAULT_KV_TOKENS)]
        kv_tokens: usize,
        /// MiB read to measure the disk.
        #[arg(long, default_value_t = 1024)]
        probe_mb: u64,
        /// Batch sizes to predict a step for.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        batch: Vec<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Rewrite a GGUF expert-major: each expert's three matrices contiguous and 4 KiB aligned
    /// (one read per expert), dense tensors together.
    Pack {
        src: PathBuf,
        dst: PathBuf,
        /// Requantize the non-expert weights (attention, shared experts, dense layers, head) to
        /// q8_0 or q4_0; routed experts are copied as they are.
        #[arg(long)]
        dense: Option<nightmail_engine::DenseQuant>,
        /// Spread the experts over one file in each of these directories (a disk each, read in
        /// parallel); DST keeps the dense tensors and lists the parts.
        #[arg(long, value_delimiter = ',')]
        stripe: Vec<PathBuf>,
    },
}

pub fn run(command: ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::Inspect { path, json, memory_mb } => inspect(path, json, memory_mb),
        ModelCommand::Generate {
            model,
            prompt,
            prompt_tokens,
            max_new_tokens,
            greedy,
            temperature,
            top_k,
            top_p,
            seed,
            chat,
            stop,
            logits,
            json,
            draft,
            draft_model,
            draft_max,
            draft_row_cost,
            cache_mb,
            memory_mb,
        } => {
            let draft = match (draft, &draft_model) {
                (None, None) => nightmail_engine::Draft::None,
                (None | Some(nightmail_engine::Draft::Model), Some(_)) => nightmail_engine::Draft::Model,
                (Some(nightmail_engine::Draft::Model), None) => {
                    bail!("--draft model needs --draft-model PATH: the small model that guesses")
                }
                (Some(d), None) => d,
                (Some(_), Some(_)) => bail!("--draft-model drafts with that model: drop --draft, or --draft-model"),
            };
            let prompt = match (prompt, prompt_tokens, chat) {
                (Some(text), None, true) => Prompt::Chat(vec![ChatMessage::new("user", text)]),
                (Some(text), None, false) => Prompt::Text(text),
                (None, Some(tokens), false) => Prompt::Tokens(tokens),
                (None, Some(_), true) => {
                    bail!("--chat needs --prompt TEXT: a chat template renders text, not token ids")
                }
                _ => bail!("give exactly one of --prompt TEXT or --prompt-tokens 1,2,3"),
            };
            let temperature = if greedy { 0.0 } else { temperature.unwrap_or(0.0) };
            let mut request = GenerateRequest::new(prompt);
            request.max_new_tokens = max_new_tokens;
            request.sampling = Sampling { temperature, top_k, top_p, seed };
            request.stop = stop;
            request.record_logits = logits;
            request.draft = draft;
            if let Some(n) = draft_max {
                request.lookup.max_draft = n;
            }
            if let Some(cost) = draft_row_cost {
                request.lookup.length = nightmail_engine::DraftLength::RowCost(cost);
            }
            let options = LoadOptions {
                stream: cache_mb.map(StreamConfig::with_cache_mb),
                // Room for a verify pass's experts: every drafted row routes.
                memory: memory_mb.map(|mb| MemoryBudget {
                    verify_rows: request.draft.verify_rows(request.lookup.max_draft),
                    ..MemoryBudget::mb(mb)
                }),
            };
            generate(model, draft_model, request, json, &options)
        }
        ModelCommand::Synth {
            arch,
            layers,
            experts,
            top_k,
            hidden,
            expert_ffn,
            dtype,
            dense,
            heads,
            kv_heads,
            head_dim,
            tokenizer_from,
            vocab,
            seed,
            sparse,
            out,
        } => {
            let (h, kv, d) = nightmail_engine::SynthSpec::default_heads(hidden);
            let heads = heads.unwrap_or(h);
            let spec = nightmail_engine::SynthSpec {
                arch,
                layers,
                experts,
                top_k,
                hidden,
                expert_ffn,
                dtype,
                heads,
                kv_heads: kv_heads.unwrap_or(if heads == h { kv } else { (heads / 4).max(1) }),
                head_dim: head_dim.unwrap_or(d),
                vocab,
                tokenizer_from,
                context_length: 4096,
                seed,
                dense,
            };
            let write = if sparse { nightmail_engine::synth_headers } else { nightmail_engine::synth };
            let r = write(&spec, &out).with_context(|| format!("writing {}", out.display()))?;
            println!(
                "{}: {} ({} dense, {} experts, {} of experts per token)",
                r.path.display(),
                bytes(r.bytes),
                bytes(r.dense_bytes),
                bytes(r.expert_bytes),
                bytes(r.expert_bytes_per_token)
            );
            Ok(())
        }
        ModelCommand::Bench {
            model,
            cache_mb,
            memory_mb,
            kv_tokens,
            tokens,
            policy,
            prefetch,
            prefetch_in_flight,
            io_threads,
            prompt_tokens,
            probe_mb,
            probe_parallel,
            greedy,
            batch,
            verify,
            acceptance,
            rounds,
            json,
            timeline,
        } => {
            let mut stream = StreamConfig::with_cache_mb(cache_mb.unwrap_or(0));
            stream.policy = policy;
            stream.prefetch_depth = prefetch;
            stream.max_prefetch_in_flight = prefetch_in_flight;
            stream.io_threads = io_threads;
            let opts = nightmail_engine::BenchOptions {
                model,
                stream,
                // Room for the largest batch's caches and experts, and the widest verify pass's.
                memory: memory_mb.map(|mb| MemoryBudget {
                    kv_tokens,
                    batch: batch.iter().copied().max().unwrap_or(1),
                    verify_rows: verify.iter().copied().max().unwrap_or(1),
                    ..MemoryBudget::mb(mb)
                }),
                tokens,
                prompt_tokens,
                probe_bytes: probe_mb << 20,
                probe_parallel,
                greedy,
                timeline,
            };
            if !verify.is_empty() {
                let r = nightmail_engine::bench_verify(&opts, &verify, &acceptance, rounds)?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_verify_bench(&r);
                }
                return Ok(());
            }
            if !batch.is_empty() {
                let r = nightmail_engine::bench_batch(&opts, &batch)?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_batch_bench(&r);
                }
                return Ok(());
            }
            let r = nightmail_engine::bench(&opts)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_bench(&r);
            }
            Ok(())
        }
        ModelCommand::KernelBench { rows, cols, tokens, working_set_mb, passes, json } => {
            let opts = nightmail_engine::KernelBenchOptions {
                rows,
                cols,
                tokens,
                working_set_bytes: working_set_mb << 20,
                passes,
            };
            let r = nightmail_engine::kernel_bench(&opts)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_kernel_bench(&r);
            }
            Ok(())
        }
        ModelCommand::Plan { model, memory_mb, disk_gbps, kv_tokens, probe_mb, batch, json } => {
            let opts = nightmail_engine::PlanOptions {
                model,
                budget: MemoryBudget {
                    kv_tokens,
                    batch: batch.iter().copied().max().unwrap_or(1),
                    ..MemoryBudget::mb(memory_mb)
                },
                disk_gbps,
                probe_bytes: probe_mb << 20,
                batches: batch,
            };
            let r = nightmail_engine::plan(&opts)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_plan(&r);
            }
            Ok(())
        }
        ModelCommand::Pack { src, dst, dense, stripe } => {
            let opts = nightmail_engine::PackOptions { dense, stripe };
            let r =
                nightmail_engine::pack_with(&src, &dst, &opts).with_context(|| format!("packing {}", src.display()))?;
            println!("{}: {} (expert-major)", dst.display(), bytes(r.bytes));
            if let Some(q) = dense {
                println!(
                    "{} non-expert tensors requantized to {}: {} -> {}",
                    r.requantized,
                    q.name(),
                    bytes(r.requantized_from_bytes),
                    bytes(r.requantized_to_bytes)
                );
            }
            Ok(())
        }
    }
}

fn print_batch_bench(r: &nightmail_engine::BatchReport) {
    println!("{} steps per batch size; disk {:.2} GB/s; {} experts, top {}", r.tokens, r.disk_gbps, r.experts, r.top_k);
    println!(
        "batch  s/step  tokens/s  speedup  union bound  experts/layer/step  disk/step  (dense)  measured/floor  hit rate"
    );
    for p in &r.points {
        println!(
            "{:>5}  {:>6.3}  {:>8.3}  {:>7.2}  {:>11.2}  {:>18.1}  {:>9}  {:>7}  {:>14.2}  {:>7.1}%",
            p.batch,
            p.s_per_step,
            p.tokens_per_s,
            p.speedup,
            p.union_bound_speedup,
            p.experts_per_layer_step,
            bytes(p.disk_bytes_per_step as u64),
            bytes(p.dense_disk_bytes_per_step as u64),
            p.ratio_to_floor,
            100.0 * p.hit_rate
        );
    }
}

fn print_verify_bench(r: &nightmail_engine::VerifyReport) {
    println!(
        "{} passes per width in {} rounds; disk {:.2} GB/s; {} experts, top {}",
        r.passes, r.rounds, r.disk_gbps, r.experts, r.top_k
    );
    println!(
        "rows  s/pass  cost ratio  bound  cost/bound  experts/layer/pass  disk/pass  (dense)  s/token at acceptance"
    );
    for p in &r.points {
        let at: Vec<String> = p
            .at_acceptance
            .iter()
            .map(|a| format!("{:.2}: {:.3} ({:.2}x)", a.acceptance, a.s_per_token, a.speedup))
            .collect();
        println!(
            "{:>4}  {:>6.3}  {:>10.2}  {:>5.2}  {:>10.2}  {:>18.1}  {:>9}  {:>7}  {}",
            p.positions,
            p.s_per_pass,
            p.cost_ratio,
            p.bound_ratio,
            p.ratio_to_bound,
            p.experts_per_layer_pass,
            bytes(p.disk_bytes_per_pass as u64),
            bytes(p.dense_disk_bytes_per_pass as u64),
            at.join(", ")
        );
    }
}

fn print_bench(r: &nightmail_engine::BenchReport) {
    println!("tokens          {} (after a {:.2} s prefill)", r.tokens, r.prefill_s);
    println!("s/token         {:.3}", r.s_per_token);
    println!(
        "disk            {:.2} GB/s sequential direct reads (before {:.2}, after {:.2}){}",
        r.disk_gbps,
        r.disk_gbps_before,
        r.disk_gbps_after,
        if r.direct_io { "" } else { ", expert reads buffered (no O_DIRECT here)" }
    );
    println!(
        "disk/token      {} (dense {}, experts {}; experts needed {})",
        bytes(r.disk_bytes_per_token as u64),
        bytes(r.dense_disk_bytes_per_token as u64),
        bytes(r.expert_disk_bytes_per_token as u64),
        bytes(r.expert_bytes_per_token as u64)
    );
    if let Some(budget) = r.memory_budget_bytes {
        println!(
            "memory budget   {}: {} dense layers resident, {} streamed",
            bytes(budget),
            r.resident_layers,
            r.streamed_layers
        );
    }
    if let Some(d) = &r.dense_stats {
        println!(
            "dense stream    waited {:.1}% of the decode for layers ({} of {} asked for), window {}",
            100.0 * d.wait_s / (r.s_per_token * r.tokens.max(1) as f64),
            d.waits,
            d.requests,
            bytes(d.window_budget_bytes)
        );
    }
    // A striped model: each part's disk on its own line.
    if r.disks.len() > 1 {
        for d in &r.disks {
            println!(
                "per disk        {}: {} read, {:.2} GB/s while busy",
                d.path.display(),
                bytes(d.disk_bytes),
                d.busy_gbps
            );
        }
    }
    println!("I/O floor       {:.3} s/token; measured / floor = {:.2}", r.floor_s_per_token, r.ratio_to_floor);
    println!(
        "cache           hit rate {:.1}%, prefetch hits {:.1}%, budget {}",
        100.0 * r.hit_rate,
        100.0 * r.prefetch_hit_rate,
        bytes(r.cache_budget_bytes)
    );
    println!("prefetch recall {:.1}%", 100.0 * r.prefetch_recall);
    println!("read amplif.    {:.3}", r.read_amplification);
    println!(
        "disk busy       {:.1}% of the decode, reading at {:.2} GB/s while busy",
        100.0 * r.disk_busy_fraction,
        r.busy_read_gbps
    );
    println!(
        "memory          RSS {} (peak {}; anonymous {}, file {}), dense weights {}",
        bytes(r.rss.rss_bytes),
        bytes(r.rss.rss_peak_bytes),
        bytes(r.rss.rss_anon_bytes),
        bytes(r.rss.rss_file_bytes),
        bytes(r.dense_bytes)
    );
    let distinct: Vec<String> = r.distinct_experts.iter().map(|(_, n)| n.to_string()).collect();
    println!("distinct experts per layer over the timed tokens: {}", distinct.join(" "));
}

fn print_plan(r: &nightmail_engine::PlanReport) {
    let p = &r.plan;
    let layers = p.sizes.layers.len();
    println!(
        "budget          {} (the least that runs: {})",
        bytes(p.budget_bytes as u64),
        bytes(p.minimum_bytes as u64)
    );
    println!(
        "resident        output head and norm {}, key/value cache {}, {} of {layers} dense layers ({})",
        bytes(p.fixed_bytes as u64),
        bytes(p.kv_bytes as u64),
        p.resident_layers.len(),
        bytes(p.resident_layer_bytes as u64)
    );
    let (table, row) = (bytes(p.sizes.embedding_bytes as u64), bytes(p.sizes.embedding_row_bytes as u64));
    if p.sizes.embedding_tied {
        println!("embedding       {table}, the output head's: a token reads one row ({row}) of the head");
    } else {
        println!("embedding       {table} in the file, not resident: a token reads one row ({row}) from it");
    }
    if let Some(m) = &p.sizes.mtp {
        println!(
            "mtp             layer {}: dense {} resident, routed experts {} {}",
            m.layer,
            bytes(p.mtp_bytes as u64),
            bytes(m.expert_bytes as u64),
            if p.experts_resident { "resident" } else { "through the expert cache" }
        );
    }
    if !p.streamed_layers.is_empty() {
        println!(
            "streamed        {} dense layers, read ahead through a window of {}",
            p.streamed_layers.len(),
            bytes(p.window_bytes as u64)
        );
    }
    match (p.experts_resident, p.sizes.cached_expert_bytes()) {
        (_, 0) => {}
        (true, n) => println!("experts         all resident ({})", bytes(n as u64)),
        (false, n) => println!(
            "experts         cache {} of {} (expected hit rate {:.1}%)",
            bytes(p.expert_cache_bytes as u64),
            bytes(n as u64),
            100.0 * r.expert_hit_rate
        ),
    }
    println!(
        "disk/token      {} (dense {}), at {:.2} GB/s{}",
        bytes(r.disk_bytes_per_token as u64),
        bytes(p.dense_disk_bytes_per_token as u64),
        r.disk_gbps,
        if r.disk_measured { " measured here" } else { " given" }
    );
    for k in std::iter::once(&r.dense_kernel).chain(&r.expert_kernel) {
        println!(
            "kernel          {} ({}): {:.2} GB/s at batch 1, {:.2} GB/s at batch 8",
            k.tensor, k.dtype, k.gbps_batch1, k.gbps_batch8
        );
    }
    println!("predicted       {:.3} s/token", r.predicted_s_per_token);
    println!("batch  s/step  disk s  compute s  tokens/s");
    for s in &r.steps {
        println!(
            "{:>5}  {:>6.3}  {:>6.3}  {:>9.3}  {:>8.2}",
            s.batch, s.s_per_step, s.disk_s_per_step, s.compute_s_per_step, s.tokens_per_s
        );
    }
    match r.disk_bound_until_batch {
        Some(b) => println!("the disk stops being the limit at batch {b}"),
        None => println!("the disk stays the limit up to batch 256"),
    }
}

fn print_kernel_bench(r: &nightmail_engine::KernelBenchReport) {
    println!(
        "shape           {}x{}, {} token(s) per call, {} matrices ({} of MXFP4)",
        r.rows,
        r.cols,
        r.tokens,
        r.matrices,
        bytes(r.working_set_bytes as u64)
    );
    println!("threads         {} (candle: {})", r.threads, r.candle_threads);
    println!(
        "memory          {:.2} GB/s parallel read (before {:.2}, after {:.2})",
        r.memory_gbps, r.memory_gbps_before, r.memory_gbps_after
    );
    for f in r.mxfp4.iter().chain([&r.candle_q4_0]) {
        let name = if f.kernel.starts_with("candle") { f.kernel.clone() } else { format!("MXFP4 {}", f.kernel) };
        println!(
            "{name:<15} {:.2} GB/s of weights, {:.2} G weights/s, {:.1} µs per call",
            f.gbps, f.gweights_per_s, f.us_per_call
        );
    }
    println!("MXFP4 / memory bandwidth      {:.2}", r.mxfp4_to_memory);
    println!("MXFP4 / candle Q4_0 (GB/s)    {:.2}", r.mxfp4_to_candle_q4_0_gbps);
    println!("MXFP4 / candle Q4_0 (speed)   {:.2}", r.mxfp4_to_candle_q4_0_speed);
}

fn inspect(path: PathBuf, json: bool, memory_mb: Option<usize>) -> anyhow::Result<()> {
    let info = nightmail_engine::inspect_with_memory(&path, memory_mb.map(MemoryBudget::mb))?;
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
    println!("tokenizer      {}  chat template {}", yes(info.has_tokenizer), yes(info.has_chat_template));
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

fn generate(
    path: PathBuf,
    draft_model: Option<PathBuf>,
    request: GenerateRequest,
    json: bool,
    options: &LoadOptions,
) -> anyhow::Result<()> {
    let mut model = Model::load_with(&path, options).with_context(|| format!("loading {}", path.display()))?;
    if let Some(draft) = draft_model {
        model.attach_draft_model(&draft).with_context(|| format!("loading draft model {}", draft.display()))?;
    }
    if request.draft == nightmail_engine::Draft::Mtp {
        model.attach_mtp().with_context(|| format!("loading the MTP layer of {}", path.display()))?;
    }
    let mut rows = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let completion = model.generate(request, |event| {
        if let Some(row) = &event.logits {
            rows.push(row.clone());
        }
        if !json {
            let _ = write!(stdout, "{}", event.text);
            let _ = stdout.flush();
        }
        ControlFlow::Continue(())
    })?;
    let generated = completion.tokens.len();
    let decode_s = completion.decode.as_secs_f64();
    // The first token comes from the prefill; the others are decode steps.
    let tps = if generated > 1 && decode_s > 0.0 { (generated - 1) as f64 / decode_s } else { 0.0 };
    if json {
        let mut out = serde_json::json!({
            "prompt_tokens": completion.prompt_tokens,
            "tokens": completion.tokens,
            "text": completion.text,
            "reasoning": completion.reply.reasoning,
            "answer": completion.reply.answer,
            "stop": completion.stop,
            "prefill_seconds": completion.prefill.as_secs_f64(),
            "decode_tokens_per_second": tps,
            "decode_seconds": decode_s,
            "verify_steps": completion.verify_steps,
            "drafted": completion.drafted,
            "accepted": completion.accepted,
            // The cost line drafting chose its guesses by (one-row pass and each extra row, s).
            "pass_cost": model.pass_costs().line(),
        });
        if !rows.is_empty() {
            out["logits"] = serde_json::json!(rows);
        }
        writeln!(stdout, "{out}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "{} prompt tokens in {:.2}s, {generated} new tokens at {tps:.1} tokens/s in {} passes, stop: {:?}",
            completion.prompt_tokens.len(),
            completion.prefill.as_secs_f64(),
            completion.verify_steps,
            completion.stop
        );
    }
    Ok(())
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
