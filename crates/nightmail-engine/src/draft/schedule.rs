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

use std::sync::Mutex;

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

/// Widest pass kept apart; wider ones are counted at this width.
const WIDTHS: usize = 32;

/// Weight of the newest pass in each width's running mean.
const NEW_WEIGHT: f64 = 0.2;

/// The wall time of a model's decode and verify passes, by the rows they ran (a running mean per
/// width), and the line through them: the time of a one-row pass and of each extra row.
#[derive(Debug, Default)]
pub struct PassCosts {
    /// Per width − 1: (mean seconds, passes seen).
    by_width: Mutex<Vec<(f64, u64)>>,
}

/// A pass's cost as `base_s + per_row_s · (rows − 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostLine {
    pub base_s: f64,
    pub per_row_s: f64,
}

impl CostLine {
    /// An extra row's cost over a one-row pass's.
    pub fn row_cost(&self) -> f64 {
        if self.base_s > 0.0 { self.per_row_s / self.base_s } else { 0.0 }
    }
}

impl PassCosts {
    /// A pass over `rows` rows (after the prompt: decode steps and verify passes) took `secs`.
    pub fn record(&self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() {
            return;
        }
        let mut by_width = self.by_width.lock().expect("pass costs lock");
        if by_width.is_empty() {
            by_width.resize(WIDTHS, (0.0, 0));
        }
        let (mean, seen) = &mut by_width[rows.min(WIDTHS) - 1];
        *mean = if *seen == 0 { secs } else { *mean + NEW_WEIGHT * (secs - *mean) };
        *seen += 1;
    }

    /// The running mean of a one-row pass, once one was timed (a draft model's guess).
    pub fn one_row_s(&self) -> Option<f64> {
        let by_width = self.by_width.lock().expect("pass costs lock");
        by_width.first().filter(|(_, seen)| *seen > 0).map(|(mean, _)| *mean)
    }

    /// The least-squares line through the widths seen (each weighted by its passes, up to 8),
    /// with a per-row cost of at least zero; `None` until passes of two widths, one of them a
    /// one-row pass, have been timed.
    pub fn line(&self) -> Option<CostLine> {
        let by_width = self.by_width.lock().expect("pass costs lock");
        let points: Vec<(f64, f64, f64)> = by_width
            .iter()
            .enumerate()
            .filter(|(_, (_, seen))| *seen > 0)
            .map(|(w, &(mean, seen))| (w as f64, mean, seen.min(8) as f64))
            .collect();
        if points.len() < 2 || by_width[0].1 == 0 {
            return None;
        }
        let total: f64 = points.iter().map(|p| p.2).sum();
        let mx = points.iter().map(|p| p.0 * p.2).sum::<f64>() / total;
        let my = points.iter().map(|p| p.1 * p.2).sum::<f64>() / total;
        let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
        let per_row_s = (sxy / sxx).max(0.0);
        Some(CostLine { base_s: (my - per_row_s * mx).max(f64::MIN_POSITIVE), per_row_s })
    }
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
    let value = |k: usize| expected_tokens(alpha, k) / (1.0 + row_cost.max(0.0) * k as f64);
    let best = (1..=max).max_by(|&a, &b| value(a).total_cmp(&value(b)).then(b.cmp(&a)));
    // Guessing must beat plain decoding by a margin: the cost line is a measurement.
    best.filter(|&k| value(k) > value(0) * 1.01).unwrap_or(0)
}

/// Prompt lookup's number of guesses when the schedule chose `scheduled` (0: guessing does not
/// pay at the stream's rate) and the text so far ends with `matched` tokens of an earlier
/// passage: at least `matched`, at most `room`.
///
/// The schedule's α is one rate for every guess, but a guess's odds depend on how long the copy
/// has run: a passage the answer has followed for `matched` tokens is likely to be followed about
/// as far again (the longer a run has lasted, the longer its expected rest, for run lengths with
/// a heavy tail). On SmolLM2's replies (the replay in `docs/ENGINE.md` "Speculative decoding"),
/// a guess after a match of 2-5 tokens holds 0.65-0.76 of the time, after 12 or more 0.98, and
/// the j-th guess of a match of L holds about as often as the first of a match of L + j.
pub fn lookup_draft_len(scheduled: usize, matched: usize, room: usize) -> usize {
    if scheduled == 0 { 0 } else { scheduled.max(matched.min(room)) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_cost_line_is_fit_through_the_timed_widths() {
        let costs = PassCosts::default();
        assert_eq!(costs.line(), None);
        for _ in 0..4 {
            costs.record(1, 1.0);
        }
        assert_eq!(costs.line(), None, "one width gives no slope");
        for (rows, secs) in [(3, 1.5), (5, 2.0), (9, 3.0)] {
            costs.record(rows, secs);
        }
        let line = costs.line().unwrap();
        assert!((line.base_s - 1.0).abs() < 1e-9 && (line.per_row_s - 0.25).abs() < 1e-9, "{line:?}");
        assert!((line.row_cost() - 0.25).abs() < 1e-9);
        assert_eq!(costs.one_row_s(), Some(1.0));
        assert_eq!(PassCosts::default().one_row_s(), None);
        // A running mean: a slower pass moves its width's mean a fifth of the way.
        costs.record(9, 8.0);
        assert!(costs.line().unwrap().per_row_s > 0.25);
    }

    #[test]
    fn lookup_guesses_as_far_as_the_copy_has_run_when_guessing_pays() {
        // The schedule says guessing does not pay: no match length changes that.
        assert_eq!(lookup_draft_len(0, 12, 8), 0);
        // A short match keeps the schedule's length; a long one guesses as far, within room.
        assert_eq!(lookup_draft_len(2, 1, 8), 2);
        assert_eq!(lookup_draft_len(2, 5, 8), 5);
        assert_eq!(lookup_draft_len(2, 30, 8), 8);
        assert_eq!(lookup_draft_len(1, 30, 3), 3);
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
