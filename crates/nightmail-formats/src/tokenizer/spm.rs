//! SentencePiece vocabularies as GGUF carries them (`tokenizer.ggml.model = "llama"`: the Llama-2
//! family, Mistral and most Mixtral GGUFs), tokenized as llama.cpp does (`src/llama-vocab.cpp`:
//! `llm_tokenizer_spm_session`, `llama_vocab::impl::tokenize` and `detokenize`), so a GGUF gives
//! the same ids here as in llama.cpp. Not SentencePiece's own encoder: llama.cpp merges the
//! adjacent pair whose merged piece has the highest score, for BPE and unigram vocabularies alike.

use super::merge::merge;
use super::vocab::{Ends, Fragment, Kind, Vocab};
use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

/// SentencePiece's whitespace marker (U+2581): a space in the text is this in the pieces.
const SPACE: &str = "\u{2581}";

/// A SentencePiece vocabulary read from GGUF, with llama.cpp's SPM settings.
pub struct Spm {
    vocab: Vocab,
    ends: Ends,
    /// SentencePiece's `add_dummy_prefix`: a space before the text, dropped again on decoding.
    add_space_prefix: bool,
}

impl Spm {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let vocab = Vocab::from_gguf(g)?;
        // llama.cpp's SPM defaults: <unk> <s> </s> at 0 1 2, BOS added, a space prefixed.
        let ends = Ends::read(g, &vocab, Some(1), Some(2), true)?;
        Ok(Spm { vocab, ends, add_space_prefix: g.boolean("tokenizer.ggml.add_space_prefix").unwrap_or(true) })
    }

    pub(super) fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub(super) fn ends(&self) -> &Ends {
        &self.ends
    }

    /// llama.cpp's `tokenize(text, add_special, parse_special)`: user-defined tokens written in
    /// the text are those tokens, and control and unknown ones too with `parse_special`; the
    /// text between them is
    /// merged from its characters, each stretch with a space before it when it starts the text
    /// or follows a special token (`add_space_prefix`).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.ends.around(add_special, |out| self.encode_into(text, parse_special, out))
    }

    fn encode_into(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) -> Result<()> {
        let mut after_special = true;
        for fragment in self.vocab.split_specials(text, parse_special) {
            match fragment {
                Fragment::Text(t) => {
                    let mut escaped = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && after_special {
                        escaped.push_str(SPACE);
                    }
                    escaped.push_str(&t.replace(' ', SPACE));
                    self.merge(&escaped, out)?;
                    after_special = false;
                }
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
            }
        }
        Ok(())
    }

    /// `llm_tokenizer_spm_session::tokenize`: start from single characters and keep merging the
    /// adjacent pair whose concatenation is the highest-scoring token (the leftmost among equal
    /// scores); what is left is a token, or else its bytes' `<0xNN>` tokens.
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let score =
            |_: &str, _: &str, joined: &str| self.vocab.id(joined).map(|id| self.vocab.tokens[id as usize].score);
        for piece in merge(text, score) {
            match self.vocab.id(piece) {
                Some(id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        out.push(self.byte_token(b)?);
                    }
                }
            }
        }
        Ok(())
    }

    /// `llama_vocab::byte_to_token`: `<0xNN>`, else the byte itself as a token.
    fn byte_token(&self, b: u8) -> Result<u32> {
        let hex = format!("<0x{b:02X}>");
        self.vocab
            .id(&hex)
            .or_else(|| if b.is_ascii() { self.vocab.id(&char::from(b).to_string()) } else { None })
            .ok_or_else(|| {
                FormatError::Tokenizer(format!(
                    "the text has byte 0x{b:02X}, which the vocabulary has neither as a piece nor as {hex}: the model cannot read this text"
                ))
            })
    }

    /// llama.cpp's `detokenize(remove_special = true, unparse_special = false)`: a leading BOS
    /// (with add_bos) and a trailing EOS (with add_eos) dropped, control and unknown tokens
    /// decoded as nothing, and the space prefixed on encoding taken off the first token. Bytes,
    /// as `<0xNN>` tokens may end inside a character.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let (ids, dropped_bos) = self.ends.strip(ids);
        // llama.cpp keeps the space after a dropped BOS.
        let mut strip_space = self.add_space_prefix && !dropped_bos;
        let mut out = Vec::new();
        for &id in ids {
            let start = out.len();
            self.push_piece(id, &mut out)?;
            if strip_space && out.get(start) == Some(&b' ') {
                out.remove(start);
            }
            strip_space = false;
        }
        Ok(out)
    }

    /// The bytes token `id` adds inside a decoded text (none for a control token).
    pub fn push_piece(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        let token = self.vocab.token(id)?;
        match token.kind {
            Kind::Normal => out.extend_from_slice(token.text.replace(SPACE, " ").as_bytes()),
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

#[cfg(test)]
mod tests {
    use super::super::vocab::byte_of;
    use super::*;

    fn fixture(name: &str) -> Spm {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/spm").join(name);
        Spm::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
    }

    #[test]
    fn token_types_become_kinds_and_im_end_is_made_control_by_its_name() {
        let spm = fixture("model.gguf");
        let kind = |t: &str| spm.vocab.tokens[spm.vocab.id(t).unwrap() as usize].kind;
        assert_eq!(kind("<unk>"), Kind::Hidden);
        assert_eq!(kind("<s>"), Kind::Hidden);
        assert_eq!(kind("[INST]"), Kind::Hidden);
        assert_eq!(kind("<tool>"), Kind::Literal);
        // User-defined in the file; llama.cpp makes it an end-of-generation control token.
        assert_eq!(kind("<|im_end|>"), Kind::Hidden);
        assert_eq!(kind("<0x0A>"), Kind::Byte(b'\n'));
        assert_eq!(kind("[PAD2047]"), Kind::Silent);
        assert_eq!((spm.ends.bos, spm.ends.eos, spm.vocab.len()), (Some(1), Some(2), 2048));
        assert!(spm.add_space_prefix && spm.ends.add_bos && !spm.ends.add_eos);
    }

    #[test]
    fn byte_fallback_spells_an_unknown_character_in_its_utf8_bytes() {
        let spm = fixture("model.gguf");
        let ids = spm.encode("😀", false, true).unwrap();
        let bytes: Vec<u32> = "😀".bytes().map(|b| spm.vocab.id(&format!("<0x{b:02X}>")).unwrap()).collect();
        assert_eq!(&ids[ids.len() - 4..], &bytes[..]);
        assert_eq!(spm.decode(&ids).unwrap(), "😀");
        // A cut inside the character decodes to a replacement character, as a stream shows it.
        assert_eq!(spm.decode(&ids[..ids.len() - 1]).unwrap(), "\u{FFFD}");
    }

    #[test]
    fn special_tokens_split_the_text_longest_first() {
        let spm = fixture("model.gguf");
        let id = |t: &str| spm.vocab.id(t).unwrap();
        let ids = spm.encode("[/INST]</s>", false, true).unwrap();
        assert_eq!(ids, vec![id("[/INST]"), id("</s>")]);
    }

    #[test]
    fn byte_of_reads_only_two_hex_digits() {
        assert_eq!(byte_of("<0x0A>"), Some(10));
        assert_eq!(byte_of("<0xff>"), Some(255));
        assert_eq!(byte_of("<0x100>"), None);
        assert_eq!(byte_of("0x0A"), None);
    }
}
