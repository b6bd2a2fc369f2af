//! A GGUF vocabulary as llama.cpp reads it (`src/llama-vocab.cpp`, `llama_vocab::impl::load`):
//! each token's text, score and kind, and the special tokens that are cut out of a text whole
//! before the rest is tokenized (`tokenizer_st_partition`). SentencePiece (`spm.rs`) and BPE
//! (`bpe.rs`) vocabularies share it.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use nightmail_tensor::TensorError;

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

/// Token types as GGUF stores them (`tokenizer.ggml.token_type`, gguf-py `TokenType`).
mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const BYTE: i32 = 6;
}

/// Texts llama.cpp makes control tokens whatever type the file gives them
/// (`llama_vocab::impl::load`: its end-of-generation list, which holds the end-of-turn one, and
/// its fill-in-the-middle lists; llama.cpp marks only the first FIM token of each kind it meets,
/// here all are).
const CONTROL_BY_NAME: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// What a token is, which decides how it is found in text and what it decodes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A piece of text, `▁` for a space.
    Normal,
    /// `<0xNN>`: one byte, for text no piece covers (byte fallback).
    Byte(u8),
    /// User-defined: matched whole in text, decoded as written.
    Literal,
    /// Control or unknown (`<s>`, `</s>`, `<unk>`, `[INST]`): matched whole in text, decoded as
    /// nothing.
    Hidden,
    /// Unused, padding or of no known type: never matched whole in text, decoded as nothing.
    Silent,
}

pub(super) struct Token {
    pub text: String,
    pub score: f32,
    pub kind: Kind,
}

/// A vocabulary's tokens, by id and by text.
pub(super) struct Vocab {
    pub tokens: Vec<Token>,
    pub ids: HashMap<String, u32>,
    /// Tokens found whole in text before the rest is tokenized, longest first
    /// (`cache_special_tokens`).
    specials: Vec<u32>,
}

fn bad(key: &str, reason: impl Into<String>) -> FormatError {
    FormatError::BadMetadata { key: key.to_string(), reason: reason.into() }
}

/// A numeric GGUF array (`scores` may be f32 or i32, `token_type` i32).
fn numbers(g: &GgufFile, key: &str, n: usize) -> Result<Option<Vec<f64>>> {
    let Some(v) = g.value(key) else { return Ok(None) };
    let list = v.to_vec().map_err(|_| bad(key, "as something other than an array"))?;
    if list.len() < n {
        return Err(bad(key, format!("{} entries for {n} tokens", list.len())));
    }
    list.iter()
        .map(|v| match v {
            Value::F32(x) => Ok(*x as f64),
            Value::I32(x) => Ok(*x as f64),
            _ => Err(bad(key, "with entries that are not f32 or i32")),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

impl Vocab {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        let list = g
            .value(TOKENS)
            .ok_or_else(|| FormatError::MissingMetadata { key: TOKENS.into() })?
            .to_vec()
            .map_err(|_| bad(TOKENS, "as something other than an array"))?;
        let n = list.len();
        let scores = numbers(g, "tokenizer.ggml.scores", n)?;
        let types = numbers(g, "tokenizer.ggml.token_type", n)?;
        let mut tokens = Vec::with_capacity(n);
        let mut ids = HashMap::with_capacity(n);
        for (i, v) in list.iter().enumerate() {
            let mut text = v.to_string().map_err(|_| bad(TOKENS, format!("token {i} as a non-string")))?.clone();
            if text.is_empty() {
                // As llama.cpp names an empty token, so that it can never match.
                text = format!("[EMPTY_{i}]");
            }
            if let Some(first) = ids.insert(text.clone(), i as u32) {
                return Err(bad(TOKENS, format!("`{text}` twice, as tokens {first} and {i}")));
            }
            let score = scores.as_ref().map_or(0.0, |s| s[i] as f32);
            // No types at all: every token is normal (llama.cpp's default attribute).
            let kind = match types.as_ref().map_or(token_type::NORMAL, |t| t[i] as i32) {
                _ if CONTROL_BY_NAME.contains(&text.as_str()) => Kind::Hidden,
                token_type::NORMAL => Kind::Normal,
                token_type::UNKNOWN | token_type::CONTROL => Kind::Hidden,
                token_type::USER_DEFINED => Kind::Literal,
                token_type::BYTE => Kind::Byte(byte_of(&text).ok_or_else(|| {
                    bad("tokenizer.ggml.token_type", format!("token {i} `{text}` as a byte, which is not <0xNN>"))
                })?),
                _ => Kind::Silent,
            };
            tokens.push(Token { text, score, kind });
        }
        let mut specials: Vec<u32> =
            (0..n as u32).filter(|&i| matches!(tokens[i as usize].kind, Kind::Hidden | Kind::Literal)).collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].text.len()));
        Ok(Vocab { tokens, ids, specials })
    }

    /// The id of the token whose key is `key` (optional), `default` without the key; `None`
    /// when that id is past the vocabulary.
    pub fn special_id(&self, g: &GgufFile, key: &str, default: Option<u32>) -> Option<u32> {
        let id = g.uint(key).map(|v| v as u32).or(default)?;
        ((id as usize) < self.tokens.len()).then_some(id)
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|t| t.text.as_str())
    }

    /// Token `id`, or the error a decode of an id past the vocabulary gives.
    pub fn token(&self, id: u32) -> Result<&Token> {
        Ok(self.tokens.get(id as usize).ok_or(TensorError::TokenOutOfRange { id, vocab: self.tokens.len() })?)
    }

    /// `tokenizer_st_partition`: each special token in turn, longest first, cuts the stretches
    /// of text not yet cut at each of its occurrences. Without `parse_special` only user-defined
    /// tokens are cut, control and unknown ones stay text.
    pub fn split_specials<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut fragments = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        for &id in &self.specials {
            let token = &self.tokens[id as usize];
            if !parse_special && token.kind == Kind::Hidden {
                continue;
            }
            let needle = token.text.as_str();
            if !fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(needle))) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }
}

/// BOS and EOS, and whether `tokenize(add_special)` adds each (`tokenizer.ggml.add_bos_token`,
/// `add_eos_token`, with the vocabulary type's defaults).
pub(super) struct Ends {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}

impl Ends {
    /// `bos` and `eos`: the ids when the file names none (`None`: no such token).
    pub fn read(g: &GgufFile, vocab: &Vocab, bos: Option<u32>, eos: Option<u32>, add_bos: bool) -> Result<Self> {
        let bos = vocab.special_id(g, "tokenizer.ggml.bos_token_id", bos);
        let eos = vocab.special_id(g, "tokenizer.ggml.eos_token_id", eos);
        let add_bos = g.boolean("tokenizer.ggml.add_bos_token").unwrap_or(add_bos);
        let add_eos = g.boolean("tokenizer.ggml.add_eos_token").unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(bad("tokenizer.ggml.add_bos_token", "true, but there is no BOS token"));
        }
        if add_eos && eos.is_none() {
            return Err(bad("tokenizer.ggml.add_eos_token", "true, but there is no EOS token"));
        }
        Ok(Ends { bos, eos, add_bos, add_eos })
    }

    /// What `body` adds to `out`, with BOS before and EOS after when `add_special` asks and the
    /// vocabulary adds them.
    pub fn around(&self, add_special: bool, body: impl FnOnce(&mut Vec<u32>) -> Result<()>) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        body(&mut out)?;
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// `detokenize(remove_special = true)`: `ids` without the BOS first and EOS last that
    /// encoding adds; and whether a BOS was taken off.
    pub fn strip<'i>(&self, mut ids: &'i [u32]) -> (&'i [u32], bool) {
        let mut dropped_bos = false;
        if let (true, Some(&first)) = (self.add_bos, ids.first())
            && Some(first) == self.bos
        {
            dropped_bos = true;
            ids = &ids[1..];
        }
        if let (true, Some(&last)) = (self.add_eos, ids.last())
            && Some(last) == self.eos
        {
            ids = &ids[..ids.len() - 1];
        }
        (ids, dropped_bos)
    }
}

/// `<0xNN>` → the byte (`llama_vocab::impl::token_to_byte`).
pub(super) fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

pub(super) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}
