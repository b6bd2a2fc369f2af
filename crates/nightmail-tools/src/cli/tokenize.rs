//! `nightmail model tokenize`: the token ids a model's tokenizer gives a text, read from the
//! tokenizer alone (a vocabulary-only GGUF will do), to set beside llama.cpp's `llama-tokenize`.

use std::path::{Path, PathBuf};

use nightmail_engine::{EngineError, TextTokenizer};

use super::error::{CommandError, Doing, Result};

/// Where the text comes from.
pub(super) enum Source {
    Text(String),
    File(PathBuf),
}

/// What llama.cpp's `tokenize` is asked besides the text.
pub(super) struct Options {
    /// BOS/EOS as the vocabulary adds them (`add_special`).
    pub add_special: bool,
    /// Control tokens written in the text are those tokens (`parse_special`).
    pub parse_special: bool,
    pub json: bool,
}

pub(super) fn tokenize(model: PathBuf, source: Source, options: Options) -> Result<()> {
    let text = match source {
        Source::Text(t) => t,
        Source::File(f) => std::fs::read_to_string(&f)
            .map_err(|e| CommandError::Usage(format!("cannot read --file {}: {e}", f.display())))?,
    };
    let tokenizer = open(&model)?.ok_or(EngineError::NoTokenizer)?;
    let tokens = tokenizer
        .encode_with(&text, options.add_special, options.parse_special)
        .map_err(EngineError::from)
        .doing(|| format!("tokenizing with {}", model.display()))?;
    if options.json {
        println!("{}", serde_json::json!({ "model": model, "tokens": tokens }));
    } else {
        println!("{}", tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(" "));
    }
    Ok(())
}

fn open(model: &Path) -> Result<Option<TextTokenizer>> {
    let opened = if model.is_dir() { TextTokenizer::from_hf_dir(model) } else { TextTokenizer::from_gguf_file(model) };
    opened.map_err(EngineError::from).doing(|| format!("reading the tokenizer of {}", model.display()))
}
