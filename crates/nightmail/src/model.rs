//! `nightmail model …`: look inside a model file and generate with it, without the daemon.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use nightmail_engine::{ChatMessage, GenerateRequest, Model, Prompt, Sampling};

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
        /// Print one JSON object: prompt_tokens, tokens, text (and logits).
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::Inspect { path, json } => inspect(path, json),
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
        } => {
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
            generate(model, request, json)
        }
    }
}

fn inspect(path: PathBuf, json: bool) -> anyhow::Result<()> {
    let info = nightmail_engine::inspect(&path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    let s = &info.spec;
    let a = &s.attention;
    println!("model          {} ({:?})", info.path.display(), info.format);
    println!("architecture   {:?}", s.architecture);
    println!("layers         {}", s.layers);
    println!("hidden         {}  vocab {}  context {}", s.hidden_size, s.vocab_size, s.context_length);
    println!(
        "attention      {} heads, {} kv heads, head dim {}, rope theta {}",
        a.heads, a.kv_heads, a.head_dim, a.rope_theta
    );
    match &s.moe {
        Some(m) => println!(
            "experts        {} per layer in {} MoE layers, top-{}, expert ffn {}{}",
            m.experts,
            s.moe_layers.iter().filter(|x| **x).count(),
            m.routing.top_k(),
            m.expert_ffn,
            m.shared_expert_ffn.map(|f| format!(", shared expert ffn {f}")).unwrap_or_default()
        ),
        None => println!("experts        none (dense ffn {})", s.ffn),
    }
    let dtypes: Vec<String> =
        info.dtypes.iter().map(|(d, u)| format!("{d} ({} tensors, {})", u.tensors, bytes(u.bytes))).collect();
    println!("dtypes         {}", dtypes.join(", "));
    println!("parameters     {}", info.parameters);
    println!("dense weights  {}", bytes(info.dense_bytes));
    println!("expert weights {}", bytes(info.expert_bytes));
    println!("experts/token  {}", bytes(info.expert_bytes_per_token));
    println!("tokenizer      {}  chat template {}", yes(info.has_tokenizer), yes(info.has_chat_template));
    Ok(())
}

fn generate(path: PathBuf, request: GenerateRequest, json: bool) -> anyhow::Result<()> {
    let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
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
        });
        if !rows.is_empty() {
            out["logits"] = serde_json::json!(rows);
        }
        writeln!(stdout, "{out}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "{} prompt tokens in {:.2}s, {generated} new tokens at {tps:.1} tokens/s, stop: {:?}",
            completion.prompt_tokens.len(),
            completion.prefill.as_secs_f64(),
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
