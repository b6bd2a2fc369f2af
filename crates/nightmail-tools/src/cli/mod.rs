//! `nightmail model …`: look inside a model file, generate with it, make, pack, bench and plan
//! models, without the daemon. The binary parses these arguments and calls [`run`].

mod error;
mod generate;
mod inspect;
mod print;
mod tokenize;

use std::path::PathBuf;

use clap::Subcommand;
use nightmail_engine::{ChatMessage, GenerateRequest, LoadOptions, MemoryBudget, Prompt, Sampling, StreamConfig};

use error::Doing;
pub use error::{CommandError, Result};
use generate::generate;
use inspect::inspect;
use print::{
    bytes, print_batch_bench, print_bench, print_join_bench, print_kernel_bench, print_plan, print_prefill_bench,
    print_verify_bench,
};
use tokenize::tokenize;

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
    /// The token ids the model's tokenizer gives a text, as llama.cpp's llama-tokenize gives
    /// them: BOS/EOS added as the vocabulary says, special tokens in the text read as tokens.
    /// Reads only the tokenizer, so a vocabulary-only GGUF will do.
    Tokenize {
        /// A .gguf file or a Hugging Face model directory.
        #[arg(long)]
        model: PathBuf,
        #[arg(long, required_unless_present = "file", conflicts_with = "file")]
        text: Option<String>,
        /// Tokenize this file's text.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Add no BOS/EOS.
        #[arg(long)]
        no_add_special: bool,
        /// Read special tokens written in the text as text.
        #[arg(long)]
        no_parse_special: bool,
        /// One JSON object whose `tokens` is the list of ids.
        #[arg(long)]
        json: bool,
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
        draft: Option<nightmail_engine::Drafting>,
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
        arch: crate::synth::SynthArch,
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
        dtype: crate::synth::SynthDtype,
        /// Write the non-expert weights in q8_0 or q4_0 instead of f16: the tensors `model pack
        /// --dense` requantizes, in llama.cpp's layout (llama.cpp runs the same file).
        #[arg(long)]
        dense: Option<crate::pack::DenseQuant>,
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
        /// Positions the model declares it was trained on (`context_length`): the longest prompt
        /// nightmail will take in one pass.
        #[arg(long, default_value_t = 4096)]
        context_length: usize,
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
        /// Instead: prefill this many seeded prompt tokens streamed, in passes as wide as the
        /// memory budget allows, against the I/O floor and the same prefill with the model in RAM.
        #[arg(long, conflicts_with_all = ["batch", "verify"])]
        prefill: Option<usize>,
        /// With --prefill: this many prompt tokens per pass instead (e.g. 32, a fixed chunk).
        #[arg(long, requires = "prefill")]
        prefill_chunk: Option<usize>,
        /// With --prefill: skip the prefill with the model in RAM (a memory limit below the
        /// model's size, as when comparing with llama.cpp in a cgroup); resident reads 0.
        #[arg(long, requires = "prefill")]
        prefill_streamed_only: bool,
        /// With one --batch size: after `--tokens` decode steps of the batch alone, a prompt of
        /// this many seeded tokens joins it (its passes carry the batch's decode rows); reports
        /// the batch's decode speed alone and while the prompt prefills, and the prompt's
        /// prefill time beside the same prefill alone.
        #[arg(long, requires = "batch")]
        join_prompt: Option<usize>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// Write the decode's timeline to this file (one JSON span per line: reads in flight,
        /// and what the step was doing; `benches/timeline.py FILE` finds where the disk idles).
        /// With --verify: every timed pass, each step span giving its rows (`timeline.py FILE
        /// --rows K` reads the passes of K rows). With --prefill: the streamed prefill, one step
        /// span over all its passes (`timeline.py FILE --skip 0`).
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
    /// the time per token and batch size that predicts on this machine (or with --disk-gbps and
    /// --mem-gbps, on another).
    Plan {
        /// A .gguf file or a Hugging Face model directory.
        model: PathBuf,
        #[arg(long)]
        memory_mb: usize,
        /// The disk's sequential read rate; measured on the model file when absent.
        #[arg(long)]
        disk_gbps: Option<f64>,
        /// Another machine's memory bandwidth in GB/s (a Mac's: docs/MODELS.md lists them): the
        /// kernels are taken to read each step's weights at this rate instead of being timed here.
        #[arg(long)]
        mem_gbps: Option<f64>,
        /// Tokens of key/value cache to reserve per sequence (the largest --batch has as many caches).
        #[arg(long, default_value_t = nightmail_engine::stream::DEFAULT_KV_TOKENS)]
        kv_tokens: usize,
        /// MiB read to measure the disk.
        #[arg(long, default_value_t = 1024)]
        probe_mb: u64,
        /// Batch sizes to predict a step for.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        batch: Vec<usize>,
        /// Also predict the prefill of a prompt of this many tokens.
        #[arg(long)]
        prompt_tokens: Option<usize>,
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
        dense: Option<crate::pack::DenseQuant>,
        /// Spread the experts over one file in each of these directories (a disk each, read in
        /// parallel); DST keeps the dense tensors and lists the parts.
        #[arg(long, value_delimiter = ',')]
        stripe: Vec<PathBuf>,
    },
}

pub fn run(command: ModelCommand) -> Result<()> {
    match command {
        ModelCommand::Inspect { path, json, memory_mb } => inspect(path, json, memory_mb),
        ModelCommand::Tokenize { model, text, file, no_add_special, no_parse_special, json } => {
            let source = match (text, file) {
                (Some(t), _) => tokenize::Source::Text(t),
                (None, Some(f)) => tokenize::Source::File(f),
                (None, None) => return Err(CommandError::Usage("give the text with --text T or --file F".into())),
            };
            let options = tokenize::Options { add_special: !no_add_special, parse_special: !no_parse_special, json };
            tokenize(model, source, options)
        }
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
                (None, None) => nightmail_engine::Drafting::None,
                (None | Some(nightmail_engine::Drafting::Model), Some(_)) => nightmail_engine::Drafting::Model,
                (Some(nightmail_engine::Drafting::Model), None) => {
                    return Err(CommandError::Usage(
                        "--draft model needs --draft-model PATH: the small model that guesses".into(),
                    ));
                }
                (Some(d), None) => d,
                (Some(_), Some(_)) => {
                    return Err(CommandError::Usage(
                        "--draft-model drafts with that model: drop --draft, or --draft-model".into(),
                    ));
                }
            };
            let prompt = match (prompt, prompt_tokens, chat) {
                (Some(text), None, true) => Prompt::Chat(vec![ChatMessage::new("user", text)].into()),
                (Some(text), None, false) => Prompt::Text(text),
                (None, Some(tokens), false) => Prompt::Tokens(tokens),
                (None, Some(_), true) => {
                    return Err(CommandError::Usage(
                        "--chat needs --prompt TEXT: a chat template renders text, not token ids".into(),
                    ));
                }
                _ => {
                    return Err(CommandError::Usage(
                        "give exactly one of --prompt TEXT or --prompt-tokens 1,2,3".into(),
                    ));
                }
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
            context_length,
            seed,
            sparse,
            out,
        } => {
            let (h, kv, d) = crate::synth::SynthSpec::default_heads(hidden);
            let heads = heads.unwrap_or(h);
            let spec = crate::synth::SynthSpec {
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
                context_length,
                seed,
                dense,
            };
            let write = if sparse { crate::synth::synth_headers } else { crate::synth::synth };
            let r = write(&spec, &out).doing(|| format!("writing {}", out.display()))?;
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
            prefill,
            prefill_chunk,
            prefill_streamed_only,
            join_prompt,
            json,
            timeline,
        } => {
            let mut stream = StreamConfig::with_cache_mb(cache_mb.unwrap_or(0));
            stream.policy = policy;
            stream.prefetch_depth = prefetch;
            stream.max_prefetch_in_flight = prefetch_in_flight;
            stream.io_threads = io_threads;
            let opts = crate::bench::BenchOptions {
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
            if let Some(tokens) = prefill {
                let r = crate::bench::bench_prefill(&opts, tokens, prefill_chunk, !prefill_streamed_only)?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_prefill_bench(&r);
                }
                return Ok(());
            }
            if !verify.is_empty() {
                let r = crate::bench::bench_verify(&opts, &verify, &acceptance, rounds)?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_verify_bench(&r);
                }
                return Ok(());
            }
            if let Some(prompt) = join_prompt {
                let [batch] = batch[..] else {
                    return Err(CommandError::Usage("--join-prompt takes one --batch size".into()));
                };
                let r = crate::bench::bench_join(&opts, batch, prompt)?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_join_bench(&r);
                }
                return Ok(());
            }
            if !batch.is_empty() {
                let r = crate::bench::bench_batch(&opts, &batch)?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_batch_bench(&r);
                }
                return Ok(());
            }
            let r = crate::bench::bench(&opts)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_bench(&r);
            }
            Ok(())
        }
        ModelCommand::KernelBench { rows, cols, tokens, working_set_mb, passes, json } => {
            let opts = crate::kernel_bench::KernelBenchOptions {
                rows,
                cols,
                tokens,
                working_set_bytes: working_set_mb << 20,
                passes,
            };
            let r = crate::kernel_bench::kernel_bench(&opts)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_kernel_bench(&r);
            }
            Ok(())
        }
        ModelCommand::Plan {
            model,
            memory_mb,
            disk_gbps,
            mem_gbps,
            kv_tokens,
            probe_mb,
            batch,
            prompt_tokens,
            json,
        } => {
            let opts = crate::plan::PlanOptions {
                model,
                budget: MemoryBudget {
                    kv_tokens,
                    batch: batch.iter().copied().max().unwrap_or(1),
                    ..MemoryBudget::mb(memory_mb)
                },
                disk_gbps,
                mem_gbps,
                probe_bytes: probe_mb << 20,
                batches: batch,
                prompt_tokens,
            };
            let r = crate::plan::plan(&opts)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_plan(&r);
            }
            Ok(())
        }
        ModelCommand::Pack { src, dst, dense, stripe } => {
            let opts = crate::pack::PackOptions { dense, stripe };
            let r = crate::pack::pack_with(&src, &dst, &opts).doing(|| format!("packing {}", src.display()))?;
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
