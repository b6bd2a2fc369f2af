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
//! guesses well where the answer is in the model's own words too.

use serde::{Deserialize, Serialize};

mod model;
mod schedule;

pub(crate) use model::{DrafterState, check_draft_model, guess_cost};

pub use schedule::{Acceptance, CostLine, DraftLength, PassCosts, best_draft_len, expected_tokens};

/// How a generation drafts tokens ahead of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Draft {
    /// One model pass per token.
    #[default]
    None,
    /// N-gram matches against the prompt and the answer so far ([`PromptLookup`]).
    Lookup,
    /// The greedy guesses of the draft model loaded beside the model
    /// ([`crate::Model::attach_draft_model`]).
    Model,
}

impl std::str::FromStr for Draft {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "none" => Ok(Draft::None),
            "lookup" => Ok(Draft::Lookup),
            "model" => Ok(Draft::Model),
            other => Err(format!("unknown drafter {other:?}: use \"lookup\", \"model\" or \"none\"")),
        }
    }
}

/// Prompt lookup's parameters: the longest n-gram tried first (a longer match predicts better),
/// the shortest accepted, the most tokens guessed per pass, and how many of those to guess at
/// each pass (the last two for a draft model's guesses too) ([`DraftLength`]: from the measured cost of a pass's rows and the stream's
/// acceptance rate, `schedule.rs`).
#[derive(Debug, Clone, Copy)]
pub struct PromptLookup {
    pub max_ngram: usize,
    pub min_ngram: usize,
    pub max_draft: usize,
    pub length: DraftLength,
}

impl Default for PromptLookup {
    /// transformers' `prompt_lookup_num_tokens` default is 10 with n-grams of up to 2. Here
    /// n-grams of 3 down to 2 (a single repeated token predicts little) and at most 8 guesses
    /// per pass, as many as the measured cost and acceptance make worth it (see
    /// `benches/drafting.py`).
    fn default() -> Self {
        PromptLookup { max_ngram: 3, min_ngram: 2, max_draft: 8, length: DraftLength::Measured }
    }
}

impl PromptLookup {
    /// Up to `max` tokens guessed to follow `context` (the prompt and the tokens generated so
    /// far): the continuation of the latest earlier occurrence of its longest matching suffix.
    /// Empty when no suffix of `min_ngram` tokens occurred before.
    pub fn propose(&self, context: &[u32], max: usize) -> Vec<u32> {
        let max = max.min(self.max_draft);
        let len = context.len();
        if max == 0 {
            return Vec::new();
        }
        for n in (self.min_ngram.max(1)..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - n..];
            // The latest occurrence that ends before the suffix itself does: recent text (the
            // answer so far, the last quoted message) predicts the next tokens best.
            let found = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix);
            if let Some(i) = found {
                let from = i + n;
                return context[from..(from + max).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_suffix_that_occurred_before_gives_what_followed_it() {
        let p = PromptLookup { max_ngram: 3, min_ngram: 1, max_draft: 4, ..PromptLookup::default() };
        // "7 8 9" occurred at 1..4 followed by 10 11 12 13; "8 9" alone occurs later too.
        let context = [1, 7, 8, 9, 10, 11, 12, 13, 5, 8, 9, 4, 2, 7, 8, 9];
        assert_eq!(p.propose(&context, 8), vec![10, 11, 12, 13]);
        assert_eq!(p.propose(&context, 2), vec![10, 11]);
    }

    #[test]
    fn a_shorter_match_is_used_when_no_longer_one_occurred_and_the_latest_wins() {
        let p = PromptLookup { max_ngram: 3, min_ngram: 2, max_draft: 3, ..PromptLookup::default() };
        let context = [5, 6, 1, 2, 5, 6, 3, 4, 9, 5, 6];
        assert_eq!(p.propose(&context, 8), vec![3, 4, 9]);
    }

    #[test]
    fn nothing_is_guessed_without_a_match_or_room() {
        let p = PromptLookup::default();
        assert!(p.propose(&[1, 2, 3, 4], 8).is_empty());
        assert!(p.propose(&[1, 2, 1, 2], 0).is_empty());
        assert!(p.propose(&[], 4).is_empty());
        // A match at the very end has no continuation to copy but the suffix itself.
        assert_eq!(p.propose(&[1, 2, 1, 2], 4), vec![1, 2]);
    }
}
