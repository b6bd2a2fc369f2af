//! How many tokens to guess before each verify pass: the number k with the most expected tokens
//! per unit of cost (Leviathan et al., arXiv 2211.17192, §3.5, which picks the draft length from
//! the acceptance rate and the cost of a pass). A guess is accepted with probability α given that
//! the ones before it were, so a pass over the drawn token and k guesses yields
//! 1 + α + … + α^k tokens; it costs a one-row pass plus k extra rows.
//!
//! What an extra row costs depends on the model and the machine: on a streamed model a pass is
//! bound by reading weights, read once for all its rows, and a row is nearly free; on a small
//! resident model a row costs about the compute of a whole decode step. So the cost is measured
//! as the model runs ([`PassCosts`]) and the acceptance rate as the stream runs ([`Acceptance`]).

use serde::{Deserialize, Serialize};

/// Where the cost of a verify pass's extra rows comes from.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftLength {
    /// From the model's own passes so far ([`PassCosts`]): guess as long as the last passes
    /// allowed until a pass with guesses has been timed.
    #[default]
    Measured,
    /// Each extra row costs this fraction of a one-row pass (0: guess as many as allowed).
    RowCost(f64),
}

/// A stream's running acceptance rate per guess: counts of guesses accepted and of rejections,
/// decayed at each verdict so that the last dozen passes count most (a reply that quotes, then
/// answers in its own words, changes rate midway). Starts at one of each: α = 1/2.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    accepted: f64,
    rejected: f64,
}

/// How much of the counts each verdict keeps.
const KEEP: f64 = 0.85;

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance { accepted: 1.0, rejected: 1.0 }
    }
}

impl Acceptance {
    /// The verdict on one run of guesses: `accepted` of them held, then one was rejected (or
    /// none was: the run ended with every guess accepted).
    pub fn record(&mut self, accepted: usize, rejected: bool) {
        self.accepted = self.accepted * KEEP + accepted as f64;
        self.rejected = self.rejected * KEEP + f64::from(u8::from(rejected));
    }

    /// The probability that a guess holds given that the ones before it did: accepted guesses
    /// over guesses judged (the geometric distribution's estimate, runs cut short counted).
    pub fn rate(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }
}

/// Tokens a pass with `k` guesses yields on average: 1 + α + … + α^k.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    (0..=k).map(|i| alpha.powi(i as i32)).sum()
}

/// The number of guesses, at most `max`, with the most expected tokens per unit of cost when an
/// extra row costs `row_cost` one-row passes; 0 (plain decoding) unless guessing beats it.
pub fn best_draft_len(alpha: f64, row_cost: f64, max: usize) -> usize {
    best_chain_len(std::iter::repeat(alpha), &linear_costs(row_cost, max))
}

/// The cost of a pass with 0 to `max` guesses, in one-row passes, when each extra row costs
/// `row_cost` of one.
pub fn linear_costs(row_cost: f64, max: usize) -> Vec<f64> {
    (0..=max).map(|k| 1.0 + row_cost.max(0.0) * k as f64).collect()
}

/// As [`best_draft_len`] where each guess has a rate of its own and each length a cost of its
/// own: the i-th of `alphas` is the probability that guess i holds given that those before it
/// did, so a pass with k guesses yields 1 + α₁ + α₁α₂ + … + α₁⋯α_k tokens (Leviathan et al.
/// §3.5 with a rate per place), for `costs[k]` one-row passes (`costs[0]` = 1; at most
/// `costs.len() − 1` guesses). The fewest guesses among equally good lengths.
pub fn best_chain_len(alphas: impl IntoIterator<Item = f64>, costs: &[f64]) -> usize {
    let (mut tokens, mut held) = (1.0, 1.0);
    let mut best: Option<(usize, f64)> = None;
    for (i, (alpha, cost)) in alphas.into_iter().zip(costs.iter().skip(1)).enumerate() {
        held *= alpha;
        tokens += held;
        let value = tokens / cost;
        if best.is_none_or(|(_, v)| value > v) {
            best = Some((i + 1, value));
        }
    }
    // Guessing must beat plain decoding (one token per pass) by a margin: the cost line is a
    // measurement.
    best.filter(|&(_, value)| value > 1.01).map_or(0, |(k, _)| k)
}

/// The shortest match length of each class of [`MatchAcceptance`]: 2 or less, 3, 4-5, 6-11,
/// 12 and more (the rows of the replay in `docs/ENGINE.md` "Speculative decoding").
const MATCH_CLASSES: [usize; 5] = [2, 3, 4, 6, 12];

/// Prompt lookup's acceptance rate by the length of the match a guess was copied from: a guess
/// after a match of 12 or more tokens holds almost always (a quote in progress), one after a
/// match of 2-5 tokens about two times in three (on SmolLM2's quoting reply: 0.97 and
/// 0.62-0.67), so one rate for every guess either stops a copy in progress when the short
/// matches fail, or pays for rows that short matches waste. A guess `j` places after the first
/// of a match of `L` counts at length `L + j`: the answer has then followed the passage `j`
/// tokens further, and it holds about as often as a first guess after such a match (the same
/// replay).
///
/// Each class starts from Laplace's rule of succession for a run that held as many times as
/// its shortest match is long, (L + 1)/(L + 2) with the weight of two verdicts, which the
/// stream's own verdicts outweigh within a few passes: a class seen rarely in an answer (a long
/// copy comes once or twice) keeps a sensible rate instead of the uninformed 1/2.
#[derive(Debug, Clone, Copy)]
pub struct MatchAcceptance {
    classes: [Acceptance; MATCH_CLASSES.len()],
}

impl Default for MatchAcceptance {
    fn default() -> Self {
        MatchAcceptance {
            classes: MATCH_CLASSES.map(|len| {
                let n = len as f64;
                Acceptance { accepted: 2.0 * (n + 1.0) / (n + 2.0), rejected: 2.0 / (n + 2.0) }
            }),
        }
    }
}

impl MatchAcceptance {
    fn class(matched: usize) -> usize {
        MATCH_CLASSES.iter().rposition(|&shortest| matched >= shortest).unwrap_or(0)
    }

    /// A guess copied after `matched` tokens of the passage held or not.
    pub fn record(&mut self, matched: usize, held: bool) {
        self.classes[Self::class(matched)].record(usize::from(held), !held);
    }

    /// The rate at which a guess after a match of `matched` tokens holds.
    pub fn rate(&self, matched: usize) -> f64 {
        self.classes[Self::class(matched)].rate()
    }

    /// How many guesses to copy after a match of `matched` tokens when a pass with k guesses
    /// costs `costs[k]` one-row passes (at most `costs.len() − 1`): the best length at each
    /// guess's own rate ([`best_chain_len`]), and when that is any, at least `matched`. The floor: a passage followed for `matched` tokens
    /// is likely followed about as far again (the longer a run has lasted, the longer its
    /// expected rest, for run lengths with a heavy tail), beyond what the classes' rates, learnt
    /// from few long copies, foresee.
    pub fn draft_len(&self, matched: usize, costs: &[f64]) -> usize {
        let room = costs.len().saturating_sub(1);
        match best_chain_len((0..room).map(|j| self.rate(matched + j)), costs) {
            0 => 0,
            k => k.max(matched.min(room)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass_costs::{OWN_FIGURE, PassCosts, SAMPLES};

    #[test]
    fn a_pass_is_priced_at_its_own_widths_figure_where_timed_and_below_the_line() {
        let costs = PassCosts::default();
        assert_eq!(costs.guess_costs(8), None);
        for _ in 0..SAMPLES {
            costs.record(1, 1.0);
        }
        // Two rows cost 1.3 passes, nine 4.2: the line's row is 0.4 of a pass.
        for _ in 0..OWN_FIGURE {
            costs.record(2, 1.3);
            costs.record(9, 4.2);
        }
        let row = costs.line().unwrap().row_cost();
        let priced = costs.guess_costs(8).unwrap();
        assert_eq!(priced.len(), 9);
        assert!((priced[0] - 1.0).abs() < 1e-9 && (priced[1] - 1.3).abs() < 1e-9 && (priced[8] - 4.2).abs() < 1e-9);
        assert!((priced[4] - (1.0 + 4.0 * row)).abs() < 1e-9, "{priced:?}");
        // A width timed fewer times is priced at the line, and no wider pass costs less.
        costs.record(5, 1.1);
        let priced = costs.guess_costs(8).unwrap();
        assert!(priced.windows(2).all(|w| w[0] <= w[1]), "{priced:?}");
        assert!((priced[4] - (1.0 + 4.0 * costs.line().unwrap().row_cost())).abs() < 1e-9);
        // Three preempted passes of three rows do not price it, nor every wider pass, above
        // the line.
        for _ in 0..OWN_FIGURE {
            costs.record(3, 10.0);
        }
        let row = costs.line().unwrap().row_cost();
        let priced = costs.guess_costs(8).unwrap();
        assert!((priced[2] - (1.0 + 2.0 * row)).abs() < 1e-9 && priced[2] < 3.0, "{priced:?}");
        // So a guess that holds 0.6 of the time pays for a first row at 0.3 of a pass, where the
        // line's average row would not.
        let by_match = MatchAcceptance::default();
        let mut fuzzy = by_match;
        for _ in 0..3 {
            fuzzy.record(2, false);
            fuzzy.record(2, true);
        }
        let curve = [1.0, 1.3, 1.8, 2.4, 3.0, 3.6, 4.2, 4.8, 5.4];
        assert!(fuzzy.draft_len(2, &curve) >= 2);
        assert_eq!(fuzzy.draft_len(2, &linear_costs(0.6, 8)), 0);
    }

    #[test]
    fn free_rows_guess_as_many_as_allowed_and_rows_as_dear_as_a_pass_guess_none() {
        assert_eq!(best_draft_len(0.5, 0.0, 8), 8);
        // Even a guess that always holds only breaks even when a row costs a pass.
        assert_eq!(best_draft_len(0.999, 1.0, 8), 0);
        assert_eq!(best_draft_len(0.0, 0.0, 8), 0);
    }

    #[test]
    fn the_length_follows_the_acceptance_rate_at_a_given_row_cost() {
        // A row at 0.3 of a pass: a guess pays from α > 0.3 on, longer runs as α grows.
        assert_eq!(best_draft_len(0.25, 0.3, 8), 0);
        let (low, high) = (best_draft_len(0.5, 0.3, 8), best_draft_len(0.9, 0.3, 8));
        assert!(low >= 1 && high > low, "{low} {high}");
        // Each choice is the best of all lengths.
        for alpha in [0.4, 0.6, 0.8, 0.95] {
            let k = best_draft_len(alpha, 0.3, 8);
            let v = |k: usize| expected_tokens(alpha, k) / (1.0 + 0.3 * k as f64);
            assert!((0..=8).all(|j| v(j) <= v(k) * 1.01), "alpha {alpha}: {k}");
        }
    }

    #[test]
    fn a_rate_per_place_gives_the_best_length_of_its_chain() {
        // One rate for every place is best_draft_len's choice.
        for (alpha, cost) in [(0.5, 0.3), (0.9, 0.3), (0.7, 0.65), (0.99, 1.0), (0.4, 0.0)] {
            let one = best_draft_len(alpha, cost, 8);
            assert_eq!(best_chain_len(std::iter::repeat_n(alpha, 8), &linear_costs(cost, 8)), one);
        }
        // Two likely guesses before doubtful ones: the chain stops where a guess no longer
        // pays for its row (the third holds 0.3 of the time at a row of 0.3), where one rate
        // of 0.9 for every place would run five; its choice is the best of every length.
        let alphas = [0.9, 0.9, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3];
        let k = best_chain_len(alphas, &linear_costs(0.3, 8));
        let value = |k: usize| {
            let held: f64 = (0..=k).map(|i| alphas[..i].iter().product::<f64>()).sum();
            held / (1.0 + 0.3 * k as f64)
        };
        assert_eq!((k, best_draft_len(0.9, 0.3, 8)), (2, 5));
        assert!((0..=8).all(|j| value(j) <= value(k)), "{k}");
    }

    #[test]
    fn a_long_copy_is_guessed_where_short_matches_fail() {
        let mut by_match = MatchAcceptance::default();
        // Before any verdict: the longer the match, the likelier its guess (rule of succession).
        let rates: Vec<f64> = [2, 3, 4, 6, 12].iter().map(|&l| by_match.rate(l)).collect();
        assert!(rates.windows(2).all(|w| w[0] < w[1]) && rates[0] == 0.75, "{rates:?}");
        assert_eq!(by_match.rate(1), by_match.rate(2));
        assert_eq!(by_match.rate(40), by_match.rate(12));
        // The answer's own words: its short matches fail. A row at 0.65 of a pass (a loaded
        // machine) then guesses nothing after 2-5 tokens of match...
        for _ in 0..10 {
            by_match.record(2, false);
            by_match.record(4, false);
        }
        assert!(by_match.rate(4) < 0.2);
        assert_eq!(by_match.draft_len(2, &linear_costs(0.65, 8)), 0);
        // ...but still copies a passage followed for 12 tokens, which the single rate of
        // every guess (now under 0.2) would not.
        assert!(by_match.rate(12) > 0.9);
        assert_eq!(by_match.draft_len(12, &linear_costs(0.65, 8)), 8);
        assert_eq!(best_draft_len(0.2, 0.65, 8), 0);
        // A class's own verdicts move only it.
        for _ in 0..10 {
            by_match.record(20, false);
        }
        assert!(by_match.rate(12) < 0.2 && by_match.rate(6) > 0.8);
    }

    #[test]
    fn lookup_guesses_at_least_as_far_as_the_copy_has_run_when_guessing_pays() {
        let by_match = MatchAcceptance::default();
        // Free rows: as many as allowed, whatever the match.
        assert_eq!(by_match.draft_len(2, &linear_costs(0.0, 8)), 8);
        // A dear row: the chain's length, raised to the match's within room.
        let chain = best_chain_len((0..8).map(|j| by_match.rate(7 + j)), &linear_costs(0.5, 8));
        assert!((1..7).contains(&chain), "{chain}");
        assert_eq!(by_match.draft_len(7, &linear_costs(0.5, 8)), 7);
        assert_eq!(by_match.draft_len(30, &linear_costs(0.5, 3)), 3);
        // Rows as dear as a pass: no rate pays, no match length changes that.
        assert_eq!(by_match.draft_len(30, &linear_costs(1.0, 8)), 0);
    }

    #[test]
    fn the_acceptance_rate_follows_recent_verdicts() {
        let mut a = Acceptance::default();
        assert_eq!(a.rate(), 0.5);
        for _ in 0..20 {
            a.record(4, false);
        }
        assert!(a.rate() > 0.95, "{}", a.rate());
        for _ in 0..30 {
            a.record(0, true);
        }
        assert!(a.rate() < 0.1, "{}", a.rate());
    }
}
