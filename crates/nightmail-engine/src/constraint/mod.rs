//! Grammar-constrained decoding of tool calls: once the output holds a call's opener, each step's
//! tokens whose text would take it out of a well-formed call to one of the given tools are masked
//! before sampling, until the call's closing marker; then decoding is free again.
//!
//! The check is a byte-level automaton ([`frame`] over [`json`]) whose state is `Copy`: a token is
//! allowed when feeding its bytes (precomputed once per vocabulary) to a copy of the state does
//! not fail. Greedy checks the argmax first and masks the whole row only when it is refused; with
//! a temperature the whole row is masked and the sampler draws from it as usual. Both are exact:
//! the token taken is the one the sampler takes from the logits with every refused token at −∞
//! (the greedy shortcut gives the same token, as an allowed argmax is still the first largest).
//! The draw itself is the sampler's, one random word as without a grammar, so a checkpoint's
//! sampler position still holds; the automaton's state is rebuilt on resume by replaying the
//! prompt's and the restored tokens' bytes.

mod frame;
mod json;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use nightmail_formats::{TextTokenizer, ToolSyntax};
use serde_json::Value;

use crate::error::{EngineError, GrammarError, Result};
use crate::sampling::{Sampler, argmax};
use frame::{CallGrammar, CallState};
use json::ArgsSchema;

/// The calls a generation may write, for the engine to constrain decoding to them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallGrammar {
    pub syntax: ToolSyntax,
    /// Each function's name and the JSON Schema of its arguments.
    pub tools: Vec<(String, Value)>,
}

impl ToolCallGrammar {
    /// From OpenAI's tools array (the JSON text `Conversation::tools` carries), checked: a list
    /// this returns opens a stream.
    pub fn from_openai_tools(syntax: ToolSyntax, tools: &str) -> std::result::Result<Self, GrammarError> {
        let array: Vec<Value> = serde_json::from_str(tools).map_err(|e| GrammarError::NotTools(e.to_string()))?;
        let tools = array
            .iter()
            .map(|t| {
                let f = t.get("function").unwrap_or(t);
                let name =
                    f.get("name").and_then(Value::as_str).ok_or(GrammarError::NotTools("a tool has no name".into()))?;
                Ok((name.to_string(), f.get("parameters").cloned().unwrap_or(Value::Null)))
            })
            .collect::<std::result::Result<_, GrammarError>>()?;
        let grammar = ToolCallGrammar { syntax, tools };
        grammar.compile()?;
        Ok(grammar)
    }

    /// The automaton; `None` for a syntax decoded freely (see [`frame::frame`]).
    fn compile(&self) -> std::result::Result<Option<CallGrammar>, GrammarError> {
        let Some((opener, parts)) = frame::frame(self.syntax) else { return Ok(None) };
        if self.tools.len() > 64 {
            return Err(GrammarError::TooManyTools { max: 64 });
        }
        let mut names = Vec::new();
        let mut schemas = Vec::new();
        for (name, schema) in &self.tools {
            // A name is written raw inside the frame (a JSON string, before `<`, `:` or a space).
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
                return Err(GrammarError::BadName(name.clone()));
            }
            names.push(name.as_bytes().to_vec());
            schemas.push(ArgsSchema::new(name, schema)?);
        }
        Ok(Some(CallGrammar::new(opener, parts, names, schemas)))
    }

    /// What a checkpoint's identity records of it: resuming under another grammar would be wrong.
    pub(crate) fn identity(&self) -> String {
        format!("{:?} {}", self.syntax, serde_json::to_string(&self.tools).unwrap_or_default())
    }
}

/// Each token's bytes as they appear in decoded text, laid end to end.
pub(crate) struct TokenPieces {
    bytes: Vec<u8>,
    starts: Vec<u32>,
    /// Tokens of text a JSON string holds unescaped (RFC 8259 §7): inside a string value they
    /// leave the automaton's state as it is, so the mask skips feeding them there.
    plain: Vec<bool>,
}

impl TokenPieces {
    pub fn new(tokenizer: &TextTokenizer, vocab: usize) -> Result<TokenPieces> {
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(vocab + 1);
        starts.push(0);
        for id in 0..vocab as u32 {
            // Ids past the tokenizer's vocabulary (padded output rows) have no text.
            if let Ok(piece) = tokenizer.piece_bytes(id) {
                bytes.extend_from_slice(&piece);
            }
            starts.push(bytes.len() as u32);
        }
        Ok(TokenPieces::laid(bytes, starts))
    }

    fn laid(bytes: Vec<u8>, starts: Vec<u32>) -> TokenPieces {
        let plain = starts
            .windows(2)
            .map(|w| {
                let piece = &bytes[w[0] as usize..w[1] as usize];
                !piece.is_empty() && piece.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
            })
            .collect();
        TokenPieces { bytes, starts, plain }
    }

    fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.starts.get(i), self.starts.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a as usize..b as usize],
            _ => &[],
        }
    }
}

/// A generation's constraint: the grammar and where its output stands.
pub(crate) struct Constraint {
    grammar: CallGrammar,
    /// Tokens holding the opener's first byte: only they can open a call from an idle watch.
    opening: Vec<bool>,
    state: CallState,
    pieces: Arc<TokenPieces>,
    eos: Vec<u32>,
}

impl Constraint {
    /// `None` when the syntax is decoded freely.
    pub fn new(request: &ToolCallGrammar, pieces: Arc<TokenPieces>, eos: &[u32]) -> Result<Option<Constraint>> {
        let Some(grammar) = request.compile().map_err(EngineError::Grammar)? else { return Ok(None) };
        let state = grammar.start();
        let first = grammar.opener_start();
        let opening = (0..pieces.plain.len() as u32).map(|id| pieces.piece(id).contains(&first)).collect();
        Ok(Some(Constraint { grammar, opening, state, pieces, eos: eos.to_vec() }))
    }

    /// The state after `id`, if the grammar allows it. Inside a call, a token that writes no
    /// text (an end of sequence, a control token) is refused: it would end or stall the call.
    fn after(&self, id: u32) -> Option<CallState> {
        let piece = self.pieces.piece(id);
        if self.grammar.in_call(&self.state) && (piece.is_empty() || self.eos.contains(&id)) {
            return None;
        }
        let plain = self.pieces.plain.get(id as usize) == Some(&true) && self.grammar.in_plain_string(&self.state);
        let idle = self.opening.get(id as usize) == Some(&false) && self.grammar.idle(&self.state);
        if plain || idle {
            return Some(self.state);
        }
        let mut s = self.state;
        piece.iter().all(|&b| self.grammar.feed(&mut s, b)).then_some(s)
    }

    /// Sets every refused token's logit to −∞ (in chunks across threads: each token's check is
    /// independent, and a whole vocabulary is tens of thousands of them).
    pub fn mask(&self, logits: &mut [f32]) {
        use rayon::prelude::*;
        logits.par_chunks_mut(4096).enumerate().for_each(|(chunk, row)| {
            for (i, l) in row.iter_mut().enumerate() {
                if *l != f32::NEG_INFINITY && self.after((chunk * 4096 + i) as u32).is_none() {
                    *l = f32::NEG_INFINITY;
                }
            }
        });
    }

    /// The sampler's token from `logits` with the refused ones masked (in place, when masking
    /// was needed), and the state moved past it.
    pub fn pick(&mut self, logits: &mut [f32], sampler: &mut Sampler) -> Result<u32> {
        if sampler.is_greedy() {
            let id = argmax(logits);
            if let Some(s) = self.after(id) {
                self.state = s;
                return Ok(id);
            }
        }
        self.mask(logits);
        if logits.iter().all(|l| *l == f32::NEG_INFINITY) {
            return Err(EngineError::ConstraintDeadEnd);
        }
        let id = sampler.sample(logits);
        self.advance(id)?;
        Ok(id)
    }

    /// Reads the prompt's text, so that a prompt ending inside a call (a forced opener) is
    /// continued as one. What the prompt holds that no call continues (an example in the
    /// instructions) only starts the watch for the opener over.
    pub fn prime(&mut self, prompt: &[u32]) {
        for &id in prompt {
            for &b in self.pieces.piece(id) {
                if !self.grammar.feed(&mut self.state, b) {
                    self.state = self.grammar.start();
                }
            }
        }
    }

    /// Moves past a token taken (or restored from a checkpoint: replaying them rebuilds the state).
    pub fn advance(&mut self, id: u32) -> Result<()> {
        self.state = self.after(id).ok_or(EngineError::ConstraintDeadEnd)?;
        Ok(())
    }
}
