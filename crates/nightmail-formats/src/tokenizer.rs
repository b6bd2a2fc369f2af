//! Text ↔ token ids. A Hugging Face directory's `tokenizer.json` or tiktoken BPE file
//! (`tiktoken.model`, Kimi K2) through the `tokenizers` crate (pure-Rust regex backend); a GGUF's
//! vocabulary as llama.cpp tokenizes it, so that a file gives the ids llama.cpp gives: byte-level
//! BPE (`bpe.rs`, cut into words by the pre-tokenizer `tokenizer.ggml.pre` names, `pre.rs`) and
//! SentencePiece (`spm.rs`), over one vocabulary reader (`vocab.rs`).

mod bpe;
mod merge;
pub mod pre;
mod spm;
mod unicode;
mod vocab;

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value as Json;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

pub struct TextTokenizer {
    inner: Inner,
    bos: Option<String>,
    eos: Option<String>,
}

enum Inner {
    Hf(Box<Tokenizer>),
    /// llama.cpp's tokenizer for `tokenizer.ggml.model = "gpt2"`.
    Bpe(Box<bpe::Bpe>),
    /// llama.cpp's tokenizer for `tokenizer.ggml.model = "llama"`, which no `tokenizers` model
    /// reproduces (it merges by piece score).
    Spm(spm::Spm),
}

fn tk_err(e: impl std::fmt::Display) -> FormatError {
    FormatError::Tokenizer(e.to_string())
}

impl TextTokenizer {
    pub fn from_gguf(g: &GgufFile) -> Result<Option<Self>> {
        // No key, or llama.cpp's "none" vocabulary: the model is driven with token ids.
        let model = match g.string("tokenizer.ggml.model") {
            None | Some("none") => return Ok(None),
            Some(m) => m,
        };
        if model == "llama" {
            return Ok(Some(TextTokenizer::llama_cpp(Inner::Spm(spm::Spm::from_gguf(g)?))));
        }
        if model != "gpt2" {
            return Err(FormatError::Unsupported {
                what: format!("GGUF tokenizer model `{model}`"),
                hint: "GGUF vocabularies are read when they are gpt2-style BPE or SentencePiece (`llama`); use the Hugging Face directory with tokenizer.json".into(),
            });
        }
        Ok(Some(TextTokenizer::llama_cpp(Inner::Bpe(Box::new(bpe::Bpe::from_gguf(g)?)))))
    }

    /// A GGUF vocabulary's tokenizer, BOS and EOS spelt as the vocabulary spells them.
    fn llama_cpp(inner: Inner) -> Self {
        let (vocab, ends) = match &inner {
            Inner::Bpe(b) => (b.vocab(), b.ends()),
            Inner::Spm(s) => (s.vocab(), s.ends()),
            Inner::Hf(_) => unreachable!("a GGUF vocabulary"),
        };
        let text = |id: Option<u32>| id.and_then(|id| vocab.text(id)).map(str::to_string);
        let (bos, eos) = (text(ends.bos), text(ends.eos));
        TextTokenizer { bos, eos, inner }
    }

    /// The vocabulary of a GGUF's tokenizer.
    fn gguf_vocab(&self) -> Option<&vocab::Vocab> {
        match &self.inner {
            Inner::Bpe(b) => Some(b.vocab()),
            Inner::Spm(s) => Some(s.vocab()),
            Inner::Hf(_) => None,
        }
    }

    /// Whether a Hugging Face directory holds a tokenizer this reads.
    pub fn in_hf_dir(dir: &Path) -> bool {
        dir.join("tokenizer.json").is_file() || dir.join(TIKTOKEN_FILE).is_file()
    }

    pub fn from_hf_dir(dir: &Path) -> Result<Option<Self>> {
        let file = dir.join("tokenizer.json");
        let config = crate::hf::read_json_opt(&dir.join("tokenizer_config.json"));
        let inner = if file.is_file() {
            Tokenizer::from_file(&file).map_err(|e| FormatError::Tokenizer(format!("{}: {e}", file.display())))?
        } else if dir.join(TIKTOKEN_FILE).is_file() {
            from_tiktoken(&dir.join(TIKTOKEN_FILE), config.as_ref())?
        } else {
            return Ok(None);
        };
        let special = |key: &str| -> Option<String> {
            match config.as_ref()?.get(key)? {
                Json::String(s) => Some(s.clone()),
                Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        Ok(Some(TextTokenizer {
            bos: special("bos_token"),
            eos: special("eos_token"),
            inner: Inner::Hf(Box::new(inner)),
        }))
    }

    /// The tokenizer of a GGUF file alone (a whole model, or a vocabulary-only file as llama.cpp
    /// keeps for its tokenizer tests); `None` when the file has none.
    pub fn from_gguf_file(path: &Path) -> Result<Option<Self>> {
        Self::from_gguf(&GgufFile::open(path)?)
    }

    /// `add_special`: add what the tokenizer adds around a text (e.g. BOS); off for chat prompts,
    /// whose template writes its own special tokens. Special tokens written in the text are read
    /// as those tokens.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, true)
    }

    /// llama.cpp's `tokenize(text, add_special, parse_special)`: without `parse_special`,
    /// control tokens written in the text are read as text (user-defined ones are still
    /// tokens). A Hugging Face tokenizer always reads its special tokens.
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Hf(t) => Ok(t.encode(text, add_special).map_err(tk_err)?.get_ids().to_vec()),
            Inner::Bpe(b) => b.encode(text, add_special, parse_special),
            Inner::Spm(s) => s.encode(text, add_special, parse_special),
        }
    }

    /// The pre-tokenizer a GGUF's BPE vocabulary names; `None` for other tokenizers.
    pub fn pre_tokenizer(&self) -> Option<pre::PreTokenizer> {
        match &self.inner {
            Inner::Bpe(b) => Some(b.pre_tokenizer()),
            _ => None,
        }
    }

    /// Text of `ids`, without special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Inner::Hf(t) => t.decode(ids, true).map_err(tk_err),
            Inner::Bpe(b) => b.decode(ids),
            Inner::Spm(s) => s.decode(ids),
        }
    }

    /// The bytes token `id` adds inside a decoded text, as `decode` writes it there (a byte
    /// token may be part of a character; control tokens add nothing): what a constraint on
    /// decoding checks each candidate token by.
    pub fn piece_bytes(&self, id: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        match &self.inner {
            Inner::Hf(t) => out.extend_from_slice(t.decode(&[id], true).map_err(tk_err)?.as_bytes()),
            Inner::Bpe(b) => b.push_piece(id, &mut out)?,
            Inner::Spm(s) => s.push_piece(id, &mut out)?,
        }
        Ok(out)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.inner {
            Inner::Hf(t) => t.token_to_id(text),
            _ => self.gguf_vocab()?.id(text),
        }
    }

    /// The vocabulary's spelling of token `id` (as the file stores it, special tokens included).
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Hf(t) => t.id_to_token(id),
            _ => self.gguf_vocab()?.text(id).map(str::to_string),
        }
    }

    pub fn bos_text(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    pub fn eos_text(&self) -> Option<&str> {
        self.eos.as_deref()
    }

    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Hf(t) => t.get_vocab_size(true),
            _ => self.gguf_vocab().map_or(0, vocab::Vocab::len),
        }
    }
}

/// Kimi K2's tiktoken file; its pre-tokenizer split is in its Python code, not the file.
const TIKTOKEN_FILE: &str = "tiktoken.model";

/// Kimi K2's `pat_str` (`tokenization_kimi.py`): CJK runs alone, cased words with English
/// contractions, up to three digits, punctuation runs, then whitespace as tiktoken's cl100k.
const KIMI_SPLIT: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Kimi K2 reserves 256 + 2 special ids after the ranks (`num_reserved_special_tokens + 2`);
/// those `added_tokens_decoder` does not name are `<|reserved_token_{id}|>`.
const TIKTOKEN_RESERVED: usize = 258;

/// A tiktoken BPE file (one `base64(token) rank` per line) as a `tokenizers` BPE: tiktoken merges
/// the adjacent pair whose concatenation has the lowest rank, which is the BPE whose merges are
/// ordered by the rank of what they make (llama.cpp's converter derives them the same way,
/// `QwenModel.bpe`). Tokens are spelt in GPT-2's byte-to-unicode alphabet, as byte-level BPE
/// vocabularies are; a whole piece that is a token is emitted as one (tiktoken's first lookup).
fn from_tiktoken(path: &Path, config: Option<&Json>) -> Result<Tokenizer> {
    let bad = |what: String| FormatError::Tokenizer(format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let mut ranks: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut by_rank: Vec<(u32, Vec<u8>)> = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let (token, rank) = line.split_once(' ').ok_or_else(|| bad(format!("line {}: not `token rank`", n + 1)))?;
        let token = base64_decode(token).ok_or_else(|| bad(format!("line {}: bad base64", n + 1)))?;
        let rank: u32 = rank.trim().parse().map_err(|_| bad(format!("line {}: bad rank", n + 1)))?;
        ranks.insert(token.clone(), rank);
        by_rank.push((rank, token));
    }
    by_rank.sort();
    let alphabet = bpe::byte_alphabet();
    let spell = |bytes: &[u8]| -> String { bytes.iter().map(|b| alphabet[*b as usize]).collect() };
    let mut merges = Vec::new();
    for (rank, token) in by_rank.iter().filter(|(_, t)| t.len() > 1) {
        match bpe_parts(&ranks, token, *rank).as_slice() {
            [a, b] => merges.push((spell(a), spell(b))),
            _ => return Err(bad(format!("token of rank {rank} is not the merge of two lower-ranked tokens"))),
        }
    }
    let vocab: tokenizers::models::bpe::Vocab = by_rank.iter().map(|(r, t)| (spell(t), *r)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(true).build().map_err(tk_err)?;
    let mut tk = Tokenizer::new(bpe);
    let split =
        Split::new(SplitPattern::Regex(KIMI_SPLIT.into()), SplitDelimiterBehavior::Isolated, false).map_err(tk_err)?;
    let pre: PreTokenizerWrapper = Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into();
    tk.with_pre_tokenizer(Some(pre));
    tk.with_decoder(Some(ByteLevelDecoder::default()));
    // Special tokens take the ids after the ranks, in order.
    let base = by_rank.len() as u32;
    let mut named: HashMap<u32, String> = HashMap::new();
    if let Some(Json::Object(added)) = config.and_then(|c| c.get("added_tokens_decoder")) {
        for (id, t) in added {
            if let (Ok(id), Some(content)) = (id.parse::<u32>(), t.get("content").and_then(Json::as_str)) {
                named.insert(id, content.to_string());
            }
        }
    }
    let last = named.keys().copied().max().map_or(0, |m| m + 1).max(base + TIKTOKEN_RESERVED as u32);
    let specials: Vec<AddedToken> = (base..last)
        .map(|id| AddedToken::from(named.remove(&id).unwrap_or_else(|| format!("<|reserved_token_{id}|>")), true))
        .collect();
    tk.add_special_tokens(specials.clone()).map_err(tk_err)?;
    for (i, t) in specials.iter().enumerate() {
        if tk.token_to_id(&t.content) != Some(base + i as u32) {
            return Err(bad(format!("special token `{}` did not get id {}", t.content, base + i as u32)));
        }
    }
    Ok(tk)
}

/// tiktoken's byte-pair merge of `token` using only ranks below `max_rank`: the parts left.
fn bpe_parts(ranks: &HashMap<Vec<u8>, u32>, token: &[u8], max_rank: u32) -> Vec<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = token.iter().map(|b| vec![*b]).collect();
    loop {
        let best = (0..parts.len().saturating_sub(1))
            .filter_map(|i| {
                let pair = [parts[i].as_slice(), parts[i + 1].as_slice()].concat();
                ranks.get(&pair).filter(|r| **r < max_rank).map(|r| (*r, i))
            })
            .min();
        let Some((_, i)) = best else { return parts };
        let right = parts.remove(i + 1);
        parts[i].extend(right);
    }
}

/// Standard base64 (RFC 4648 §4), padded or not.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Case {
        text: String,
        ids: Vec<u32>,
    }

    #[derive(serde::Deserialize)]
    struct Expected {
        cases: Vec<Case>,
    }

    /// tests/fixtures/tiktoken: a tiny Kimi K2-style tiktoken.model, and the ids the `tiktoken`
    /// package gives a few texts with Kimi's split (tests/fixtures/tiktoken/generate.py).
    #[test]
    fn a_tiktoken_model_encodes_as_tiktoken_does() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiktoken");
        assert!(TextTokenizer::in_hf_dir(&dir));
        let tk = TextTokenizer::from_hf_dir(&dir).unwrap().expect("the fixture has tiktoken.model");
        let expected: Expected =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        for case in &expected.cases {
            assert_eq!(tk.encode(&case.text, false).unwrap(), case.ids, "{:?}", case.text);
        }
        assert_eq!(tk.bos_text(), Some("[BOS]"));
        assert_eq!(tk.token_id("<|im_end|>"), Some(316 + 2));
        let plain = &expected.cases[0];
        assert_eq!(tk.decode(&plain.ids).unwrap(), plain.text);
    }

    #[test]
    fn base64_decodes_padded_and_unpadded() {
        assert_eq!(base64_decode("IQ==").unwrap(), b"!");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("5oiR").unwrap(), "我".as_bytes());
    }
}
