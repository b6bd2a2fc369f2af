//! Prompt lookup (Saxena 2023, "Prompt Lookup Decoding"; transformers' `prompt_lookup_num_tokens`,
//! llama.cpp's `lookup` example): the text so far ends with tokens that occurred before, so guess
//! what followed them then.
//!
//! Which earlier occurrence to copy from: the one sharing the longest suffix with the text so far,
//! the latest among equals. A fixed n-gram (the reference's 3 down to 2) takes the latest
//! occurrence of the last two or three tokens, and in mail those are often common words (", the",
//! "of the") that recur with other continuations; the longest match is the passage being quoted
//! or repeated. Once a guessed run is accepted, the match it came from has grown by the run, so
//! the next guess continues the same passage. On SmolLM2's quoting reply (the per-step replay in
//! `docs/ENGINE.md` "Speculative decoding") 8 guesses after a match of two to four tokens hold for
//! 2.3-2.7 on average, after twelve or more for 6.8.
//!
//! The search scans the context once per pass, from the end: a compare per earlier position,
//! microseconds for a context of tens of thousands of tokens, against a model pass of
//! milliseconds to seconds; llama.cpp's n-gram cache (`common/ngram-cache.cpp`) keeps a table
//! instead because its static cache spans a corpus, not one conversation.

use super::DraftLength;

/// Prompt lookup's parameters: the shortest match accepted and the longest compared (longer
/// matches count as this long, so the latest of them wins), the most tokens guessed per pass, and
/// how many of those to guess at each pass (the last two for a draft model's guesses too)
/// ([`DraftLength`]: from the measured cost of a pass's rows and the stream's acceptance rate,
/// `schedule.rs`).
#[derive(Debug, Clone, Copy)]
pub struct PromptLookup {
    pub max_ngram: usize,
    pub min_ngram: usize,
    pub max_draft: usize,
    pub length: DraftLength,
}

impl Default for PromptLookup {
    /// transformers' `prompt_lookup_num_tokens` default is 10 with n-grams of up to 2. Here a match
    /// of at least 2 tokens (a single repeated token predicts little), compared up to 32 back (a
    /// quoted sentence), and at most 8 guesses per pass, as many as the measured cost and
    /// acceptance make worth it (see `benches/drafting.py`).
    fn default() -> Self {
        PromptLookup { max_ngram: 32, min_ngram: 2, max_draft: 8, length: DraftLength::Measured }
    }
}

/// An earlier occurrence of the context's suffix: how many tokens it shares with the end of the
/// context, and where what followed it begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    pub len: usize,
    pub continues_at: usize,
}

impl Match {
    /// Up to `max` tokens of `context` that followed the earlier occurrence: the guesses.
    pub fn continuation(self, context: &[u32], max: usize) -> &[u32] {
        &context[self.continues_at..(self.continues_at + max).min(context.len())]
    }
}

impl PromptLookup {
    /// Up to `max` tokens guessed to follow `context` (the prompt and the tokens generated so
    /// far): the continuation of [`Self::longest_match`]. Empty when no suffix of `min_ngram`
    /// tokens occurred before.
    pub fn propose(&self, context: &[u32], max: usize) -> Vec<u32> {
        let max = max.min(self.max_draft);
        if max == 0 {
            return Vec::new();
        }
        self.longest_match(context).map_or_else(Vec::new, |m| m.continuation(context, max).to_vec())
    }

    /// The earlier occurrence sharing the longest suffix with `context` (compared up to
    /// `max_ngram` tokens), the latest among equals; `None` when none shares `min_ngram`.
    pub fn longest_match(&self, context: &[u32]) -> Option<Match> {
        let cap = self.max_ngram.max(1);
        let (&last, before) = context.split_last()?;
        let mut best: Option<Match> = None;
        // `end` is where an earlier occurrence of the last token sits; the latest first, so that
        // a later one replaces the best only by sharing more.
        for end in (0..before.len()).rev().filter(|&e| before[e] == last) {
            let len = 1
                + (1..=end.min(cap - 1))
                    .take_while(|&back| context[end - back] == context[context.len() - 1 - back])
                    .count();
            if best.is_none_or(|b| len > b.len) {
                best = Some(Match { len, continues_at: end + 1 });
                if len >= cap {
                    break;
                }
            }
        }
        best.filter(|b| b.len >= self.min_ngram.max(1))
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
    fn a_long_quote_wins_over_a_later_short_match() {
        // The prompt quotes a sentence (20..=27 after "1 2 3 4 5 6"); the answer has since said
        // "4 5 6" followed by 90, and now repeats the sentence's opening. The latest 3-gram
        // "4 5 6" is followed by 90; the longest match continues the quote.
        let mut context = vec![1, 2, 3, 4, 5, 6, 20, 21, 22, 23, 24, 25, 26, 27, 9];
        context.extend([7, 4, 5, 6, 90, 91, 8]);
        context.extend([1, 2, 3, 4, 5, 6]);
        let p = PromptLookup::default();
        assert_eq!(p.longest_match(&context), Some(Match { len: 6, continues_at: 6 }));
        assert_eq!(p.propose(&context, 8), vec![20, 21, 22, 23, 24, 25, 26, 27]);
        // Compared only 3 back (a fixed 3-gram), the two "4 5 6" tie and the latest wins.
        let short = PromptLookup { max_ngram: 3, ..p };
        assert_eq!(short.propose(&context, 3), vec![90, 91, 8]);
    }

    #[test]
    fn an_accepted_run_keeps_the_match_on_its_passage() {
        // A passage holds "3 4 5", which later recurs followed by 99. The answer quotes the
        // passage: once the guesses "3 4 5" are accepted, the match has grown to six tokens and
        // keeps to the passage rather than jumping to the latest "3 4 5".
        let mut context = vec![30, 31, 32, 3, 4, 5, 33, 34, 35, 9, 3, 4, 5, 99, 98, 8, 30, 31, 32];
        let p = PromptLookup::default();
        assert_eq!(p.propose(&context, 3), vec![3, 4, 5]);
        context.extend([3, 4, 5]);
        assert_eq!(p.longest_match(&context), Some(Match { len: 6, continues_at: 6 }));
        assert_eq!(p.propose(&context, 3), vec![33, 34, 35]);
        assert_eq!(PromptLookup { max_ngram: 3, ..p }.propose(&context, 2), vec![99, 98]);
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
        // A single shared token is below the default's two.
        assert!(p.propose(&[1, 2, 3, 4, 2], 4).is_empty());
        assert_eq!(PromptLookup { min_ngram: 1, ..p }.propose(&[1, 2, 3, 4, 2], 4), vec![3, 4, 2]);
        // A match at the very end has no continuation to copy but the suffix itself.
        assert_eq!(p.propose(&[1, 2, 1, 2], 4), vec![1, 2]);
    }

    #[test]
    fn matches_as_long_as_the_cap_tie_and_the_latest_wins() {
        let p = PromptLookup { max_ngram: 2, min_ngram: 2, max_draft: 2, ..PromptLookup::default() };
        // "7 8 9" at 0..3 shares three tokens, "8 9" at 5..7 two: both reach the cap of two.
        let context = [7, 8, 9, 40, 41, 8, 9, 50, 51, 7, 8, 9];
        assert_eq!(p.propose(&context, 2), vec![50, 51]);
        assert_eq!(PromptLookup { max_ngram: 3, ..p }.propose(&context, 2), vec![40, 41]);
    }
}
