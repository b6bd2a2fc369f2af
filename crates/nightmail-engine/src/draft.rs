//! Drafting: guesses of the next few tokens that one verify pass checks together (speculative
//! decoding, Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318). A verify pass
//! reads each weight once for all its positions, so every guess it accepts is a token that cost
//! no pass of its own.
//!
//! Prompt lookup (Saxena 2023, "Prompt Lookup Decoding"; transformers' `prompt_lookup_num_tokens`,
//! llama.cpp's `lookup` example) guesses without a model: the text so far ends with an n-gram
//! that occurred before, so guess what followed it then. Mail is its best case: a reply quotes
//! the question, a summary repeats the names and phrases of the transcript it summarizes.
//!
//! A draft model (`model.rs`) guesses with a second, small model of the same vocabulary, which
//! guesses well where the answer is in the model's own words too. So does the model's own
//! multi-token-prediction layer where the checkpoint ships one (`mtp.rs`, DeepSeek-V3's).

use serde::{Deserialize, Serialize};

mod lookup;
mod model;
mod mtp;
pub(crate) mod schedule;
pub(crate) mod verify;

pub use lookup::PromptLookup;
pub(crate) use model::DrafterState;
pub use schedule::{
    Acceptance, DraftLength, MatchAcceptance, best_chain_len, best_draft_len, expected_tokens, linear_costs,
};

/// Greedy guesses, for a drafter that runs a network of its own (a draft model, an MTP layer):
/// the most likely id of `logits`, then of each pass `next` runs over the guess before, until
/// `k` (at least one) are made or a guess is an id past the target's `vocab`.
fn greedy_guesses(
    k: usize,
    vocab: usize,
    mut logits: Vec<f32>,
    mut next: impl FnMut(u32) -> crate::error::Result<Vec<f32>>,
) -> crate::error::Result<Vec<u32>> {
    let mut guesses = Vec::with_capacity(k);
    loop {
        let id = crate::sampling::argmax(&logits);
        if id as usize >= vocab {
            break;
        }
        guesses.push(id);
        if guesses.len() == k {
            break;
        }
        logits = next(id)?;
    }
    Ok(guesses)
}

/// How a generation drafts tokens ahead of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Drafting {
    /// One model pass per token.
    #[default]
    None,
    /// N-gram matches against the prompt and the answer so far ([`PromptLookup`]).
    Lookup,
    /// The greedy guesses of the draft model loaded beside the model
    /// (`Model::attach_draft_model`).
    Model,
    /// The greedy guesses of the model's own multi-token-prediction layer
    /// (`Model::attach_mtp`).
    Mtp,
}

impl Drafting {
    /// Rows of the widest pass it runs: the token just chosen and at most `max_draft` guesses
    /// (`PromptLookup::max_draft` caps every drafter's), or 1 without drafts. What a memory
    /// budget reserves experts for (`MemoryBudget::verify_rows`).
    pub fn verify_rows(self, max_draft: usize) -> usize {
        if self == Drafting::None { 1 } else { 1 + max_draft }
    }
}

impl std::str::FromStr for Drafting {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "none" => Ok(Drafting::None),
            "lookup" => Ok(Drafting::Lookup),
            "model" => Ok(Drafting::Model),
            "mtp" => Ok(Drafting::Mtp),
            other => Err(format!("unknown drafter {other:?}: use \"lookup\", \"model\", \"mtp\" or \"none\"")),
        }
    }
}
