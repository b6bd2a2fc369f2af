//! Byte-level BPE vocabularies as GGUF carries them (`tokenizer.ggml.model = "gpt2"`), tokenized
//! as llama.cpp does (`src/llama-vocab.cpp`: `llm_tokenizer_bpe_session`, `tokenize` and
//! `token_to_piece`): special tokens cut out first, the rest cut into words by the pre-tokenizer
//! `tokenizer.ggml.pre` names (`pre.rs`), each word's bytes spelt in GPT-2's alphabet and merged
//! by the rank of `tokenizer.ggml.merges`.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::merge::merge;
use super::pre::{PreTokenizer, Splitter};
use super::vocab::{Ends, Fragment, Kind, Vocab};
use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

pub struct Bpe {
    vocab: Vocab,
    /// The rank of merging a pair: its line in `tokenizer.ggml.merges`.
    ranks: HashMap<(String, String), u32>,
    pre: PreTokenizer,
    splitter: Splitter,
    ends: Ends,
    /// GPT-2's alphabet: byte → the character that spells it, and back.
    alphabet: Vec<char>,
    bytes: HashMap<char, u8>,
}

fn bad(key: &str, reason: impl Into<String>) -> FormatError {
    FormatError::BadMetadata { key: key.to_string(), reason: reason.into() }
}

impl Bpe {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        // llama.cpp's fallback for a file without the key, with a warning that quality degrades.
        let pre = PreTokenizer::from_name(g.string("tokenizer.ggml.pre").unwrap_or("default"))?;
        let vocab = Vocab::from_gguf(g)?;
        const MERGES: &str = "tokenizer.ggml.merges";
        let mut ranks = HashMap::new();
        match g.value(MERGES) {
            Some(v) => {
                let list = v.to_vec().map_err(|_| bad(MERGES, "as something other than an array"))?;
                for (rank, m) in list.iter().enumerate() {
                    let m = m.to_string().map_err(|_| bad(MERGES, format!("merge {rank} as a non-string")))?;
                    // As llama.cpp reads a merge: cut at the first space after the first byte.
                    if let Some(at) = m.bytes().skip(1).position(|b| b == b' ').map(|at| at + 1) {
                        ranks.entry((m[..at].to_string(), m[at + 1..].to_string())).or_insert(rank as u32);
                    }
                }
            }
            // Kimi K2's files may leave the merges out; llama.cpp reads them without.
            None if pre == PreTokenizer::KimiK2 => {}
            None => return Err(FormatError::MissingMetadata { key: MERGES.into() }),
        }
        let mut ends = Ends::read(g, &vocab, None, None, pre.adds_bos())?;
        if !pre.has_bos() {
            ends.bos = None;
            ends.add_bos = false;
        }
        let alphabet = byte_alphabet();
        let bytes = alphabet.iter().enumerate().map(|(b, c)| (*c, b as u8)).collect();
        Ok(Bpe { vocab, ranks, splitter: pre.splitter()?, pre, ends, alphabet, bytes })
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    pub(super) fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub(super) fn ends(&self) -> &Ends {
        &self.ends
    }

    /// llama.cpp's `tokenize(text, add_special, parse_special)` for a BPE vocabulary.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.ends.around(add_special, |out| {
            for fragment in self.vocab.split_specials(text, parse_special) {
                match fragment {
                    Fragment::Text(t) => {
                        for word in self.splitter.split(t)? {
                            self.merge(&self.spell(word), out);
                        }
                    }
                    Fragment::Token(id) => out.push(id),
                }
            }
            Ok(())
        })
    }

    /// A word's bytes in GPT-2's alphabet (`unicode_byte_encoding_process`).
    fn spell(&self, word: &str) -> String {
        word.bytes().map(|b| self.alphabet[b as usize]).collect()
    }

    /// `llm_tokenizer_bpe_session::tokenize` on one word: from its characters, keep merging the
    /// adjacent pair of lowest rank (the leftmost among equal ranks); each part left is a token,
    /// or else its ASCII bytes are.
    fn merge(&self, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.pre.ignore_merges()
            && let Some(id) = self.vocab.id(word)
        {
            out.push(id);
            return;
        }
        // The lowest rank merges first.
        let rank = |l: &str, r: &str, _: &str| self.ranks.get(&(l.to_string(), r.to_string())).map(|r| Reverse(*r));
        for piece in merge(word, rank) {
            match self.vocab.id(piece) {
                Some(id) => out.push(id),
                // llama.cpp looks each byte of the spelt piece up alone: only ASCII ones can be
                // tokens.
                None => out.extend(piece.bytes().filter_map(|b| self.vocab.id(&char::from(b).to_string()))),
            }
        }
    }

    /// llama.cpp's `detokenize(remove_special = true, unparse_special = false)`: control and
    /// unknown tokens decode to nothing, user-defined ones as written, the rest from GPT-2's
    /// alphabet back to bytes. Bytes, as a token may end inside a character.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let (ids, _) = self.ends.strip(ids);
        let mut out = Vec::new();
        for &id in ids {
            self.push_piece(id, &mut out)?;
        }
        Ok(out)
    }

    /// The bytes token `id` adds to a decoded text (none for a control token).
    pub fn push_piece(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        let token = self.vocab.token(id)?;
        match token.kind {
            // `llama_decode_text`: characters outside the alphabet are kept as they are.
            Kind::Normal => {
                for c in token.text.chars() {
                    match self.bytes.get(&c) {
                        Some(b) => out.push(*b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
            }
            Kind::Literal => out.extend_from_slice(token.text.as_bytes()),
            Kind::Byte(b) => out.push(b),
            Kind::Hidden | Kind::Silent => {}
        }
        Ok(())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the rest for code points
/// from 256 up, so that every byte string is a printable string.
pub(super) fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("a byte is a char")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("below the surrogates")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_spells_every_byte_once() {
        let a = byte_alphabet();
        assert_eq!((a[b' ' as usize], a[b'\n' as usize], a[b'A' as usize]), ('Ġ', 'Ċ', 'A'));
        assert_eq!(a.iter().collect::<std::collections::HashSet<_>>().len(), 256);
    }
}
