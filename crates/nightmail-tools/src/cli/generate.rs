//! `nightmail model generate`: one completion, streamed to stdout or given as JSON.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use nightmail_engine::{GenerateRequest, LoadOptions, Model};

use super::error::{Doing, Result};

pub(super) fn generate(
    path: PathBuf,
    draft_model: Option<PathBuf>,
    request: GenerateRequest,
    json: bool,
    options: &LoadOptions,
) -> Result<()> {
    let mut model = Model::load_with(&path, options).doing(|| format!("loading {}", path.display()))?;
    if let Some(draft) = draft_model {
        model.attach_draft_model(&draft).doing(|| format!("loading draft model {}", draft.display()))?;
    }
    if request.draft == nightmail_engine::Drafting::Mtp {
        model.attach_mtp().doing(|| format!("loading the MTP layer of {}", path.display()))?;
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
