//! Text ↔ token ids, through the `tokenizers` crate (pure-Rust regex backend): from
//! `tokenizer.json`, or built from GGUF's gpt2-style BPE metadata (vocabulary, merges, and the
//! pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`, `src/llama-vocab.cpp`).

use std::path::Path;

use candle_core::quantized::tokenizer::TokenizerFromGguf;
use serde_json::Value as Json;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use crate::error::{EngineError, Result};
use crate::format::GgufFile;

pub struct TextTokenizer {
    inner: Tokenizer,
    bos: Option<String>,
    eos: Option<String>,
}

fn tk_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(e.to_string())
}

// llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`'s split regex.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl TextTokenizer {
    pub(crate) fn from_gguf(g: &GgufFile) -> Result<Option<Self>> {
        // No key, or llama.cpp's "none" vocabulary: the model is driven with token ids.
        let model = match g.string("tokenizer.ggml.model") {
            None | Some("none") => return Ok(None),
            Some(m) => m,
        };
        if model != "gpt2" {
            return Err(EngineError::Unsupported {
                what: format!("GGUF tokenizer model `{model}`"),
                hint: "only gpt2-style BPE vocabularies are read from GGUF; use the Hugging Face directory with tokenizer.json".into(),
            });
        }
        let mut inner = Tokenizer::from_gguf(g.content()).map_err(tk_err)?;
        // candle's reader covers qwen2 and llama3 pre-tokenizers; its gpt2 fallback adds a prefix
        // space, which llama.cpp and transformers do not. Set the split llama.cpp uses instead.
        let pre = g.string("tokenizer.ggml.pre").unwrap_or("default");
        let byte_level = || ByteLevel::new(false, true, true);
        let fixed: Option<PreTokenizerWrapper> = match pre {
            "qwen2" => None,
            // SmolLM and the StarCoder family: every digit alone, then GPT-2's byte-level split.
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
                Some(Sequence::new(vec![Digits::new(true).into(), byte_level().into()]).into())
            }
            "llama-bpe" | "llama3" | "smaug-bpe" | "lfm2" => {
                let split =
                    Split::new(SplitPattern::Regex(LLAMA3_SPLIT.into()), SplitDelimiterBehavior::Isolated, false)
                        .map_err(tk_err)?;
                Some(Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into())
            }
            _ => Some(byte_level().into()),
        };
        if let Some(p) = fixed {
            inner.with_pre_tokenizer(Some(p));
        }
        let text = |key: &str| {
            let id = g.uint(key)? as u32;
            g.value("tokenizer.ggml.tokens")?.to_vec().ok()?.get(id as usize)?.to_string().ok().cloned()
        };
        Ok(Some(TextTokenizer {
            bos: text("tokenizer.ggml.bos_token_id"),
            eos: text("tokenizer.ggml.eos_token_id"),
            inner,
        }))
    }

    pub(crate) fn from_hf_dir(dir: &Path) -> Result<Option<Self>> {
        let file = dir.join("tokenizer.json");
        if !file.is_file() {
            return Ok(None);
        }
        let inner =
            Tokenizer::from_file(&file).map_err(|e| EngineError::Tokenizer(format!("{}: {e}", file.display())))?;
        let config = crate::format::read_json_opt(&dir.join("tokenizer_config.json"));
        let special = |key: &str| -> Option<String> {
            match config.as_ref()?.get(key)? {
                Json::String(s) => Some(s.clone()),
                Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        Ok(Some(TextTokenizer { bos: special("bos_token"), eos: special("eos_token"), inner }))
    }

    /// `add_special`: add what the tokenizer adds around a text (e.g. BOS); off for chat prompts,
    /// whose template writes its own special tokens.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, add_special).map_err(tk_err)?.get_ids().to_vec())
    }

    /// Text of `ids`, without special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(tk_err)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn bos_text(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    pub fn eos_text(&self) -> Option<&str> {
        self.eos.as_deref()
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
