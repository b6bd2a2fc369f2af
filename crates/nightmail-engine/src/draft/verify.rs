//! A stream's drafts from guess to verdict: which tokens a pass runs after a drawn token (the
//! token alone, or with guesses as a verify pass), which guesses the next drawn token accepts,
//! and the acceptance rates that size the next guesses (`schedule.rs`).

use std::collections::VecDeque;

use nightmail_model::SequenceState;

use super::Drafting;
use super::lookup::Match;
use super::lookup::PromptLookup;
use super::model::DrafterState;
use super::schedule::{Acceptance, DraftLength, MatchAcceptance, best_chain_len, linear_costs};
use crate::error::Result;
use crate::model::Model;

/// What a verify decision reads of its stream.
pub(crate) struct Drawn<'a> {
    pub model: &'a Model,
    pub draft: Drafting,
    pub lookup: &'a PromptLookup,
    pub max_new_tokens: usize,
    pub prompt: &'a [u32],
    /// The tokens generated so far, the one just drawn included.
    pub generated: &'a [u32],
}

/// What runs after a drawn token.
pub(crate) enum Feed {
    /// These tokens: the drawn one, then any guesses (a verify pass, begun on the cache).
    Run(Vec<u32>),
    /// Nothing: the last verify pass ran the token as a guess, and these logits follow it.
    Accepted(Vec<f32>),
}

pub(crate) struct Verifier {
    /// Drafted tokens the last verify pass ran after the last generated token, each with the
    /// logits that follow it: in the cache, but not accepted yet.
    ahead: VecDeque<(u32, Vec<f32>)>,
    /// A drafter's guesses made but not run (the schedule chose plain decoding), judged against
    /// the drawn tokens as run guesses are, so that the acceptance rate is known whether drafting
    /// pays or not.
    shadow: VecDeque<u32>,
    /// The running rate at which guesses hold, and the guesses accepted so far in the current
    /// run (run or shadow): with the model's pass costs they set each pass's number of guesses
    /// (`draft/schedule.rs`).
    acceptance: Acceptance,
    run_accepted: usize,
    /// Prompt lookup's rates by the length of the match a guess was copied from
    /// (`draft::MatchAcceptance`); the match length of the next guess waiting in `ahead`, and
    /// the first guess of the last pass that ran none, with its match length, judged against
    /// the next drawn token as a run guess is.
    by_match: MatchAcceptance,
    ahead_matched: usize,
    first_guess: Option<(u32, usize)>,
    pub(crate) verify_steps: usize,
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    /// The draft model's cache, for `Drafting::Model`, or the MTP layer's, for `Drafting::Mtp`.
    drafter: Option<DrafterState>,
}

impl Verifier {
    pub(crate) fn new(drafter: Option<DrafterState>) -> Self {
        Verifier {
            ahead: VecDeque::new(),
            shadow: VecDeque::new(),
            acceptance: Acceptance::default(),
            run_accepted: 0,
            by_match: MatchAcceptance::default(),
            ahead_matched: 0,
            first_guess: None,
            verify_steps: 0,
            drafted: 0,
            accepted: 0,
            drafter,
        }
    }

    /// Guesses in the cache waiting for their verdict.
    pub(crate) fn waiting(&self) -> usize {
        self.ahead.len()
    }

    /// What to run after `id` was drawn: `id` alone, or with drafts (a verify pass, begun on
    /// the cache); `None` when the last verify pass already ran `id` as a draft, whose logits
    /// are then the next ones. A drawn token that differs from the draft in its place rejects
    /// that draft and those after it: the cache forgets them.
    ///
    /// Drawing the token as usual and accepting the draft when they agree is the speculative
    /// sampling rule of Leviathan et al. (arXiv 2211.17192, Algorithm 1) for a drafter whose
    /// distribution q is a point mass on its draft d: it accepts with probability
    /// min(1, p(d)/q(d)) = p(d), and on rejection the token drawn is distributed as p without d,
    /// renormalized, which is norm(max(0, p − q)). The generator then makes the draws it makes
    /// without drafts, so the same seed gives the same tokens either way.
    pub(crate) fn plan_feed(&mut self, s: Drawn<'_>, cache: &mut SequenceState, id: u32) -> Result<Feed> {
        if s.draft == Drafting::None {
            return Ok(Feed::Run(vec![id]));
        }
        self.judge_shadow(id);
        if let Some((guess, matched)) = self.first_guess.take() {
            self.by_match.record(matched, guess == id);
        }
        if let Some((draft, logits)) = self.ahead.pop_front() {
            if self.drafter.is_none() {
                self.by_match.record(self.ahead_matched, draft == id);
                self.ahead_matched += 1;
            }
            if draft == id {
                self.accepted += 1;
                self.run_accepted += 1;
                if self.ahead.is_empty() {
                    self.verdict(false);
                }
                return Ok(Feed::Accepted(logits));
            }
            self.verdict(true);
            let before_draft = cache.position() - self.ahead.len() - 1;
            self.ahead.clear();
            cache.roll_back(before_draft)?;
        }
        // Guesses that the context or the token budget has no room for are never needed (nor
        // one for the last token: the logits after it are not).
        let context_room = s.model.spec().context_length.saturating_sub(cache.position() + 2);
        let budget = s.max_new_tokens.saturating_sub(s.generated.len() + 1);
        let room = context_room.min(budget).min(s.lookup.max_draft);
        let mut history = s.prompt.to_vec();
        history.extend(s.generated);
        let matched = match self.drafter {
            None => s.lookup.longest_match(&history),
            Some(_) => None,
        };
        let k = self.draft_len(&s, room, matched.map_or(0, |m| m.len));
        if k == 0 {
            self.first_guess = matched.filter(|_| room > 0).map(|m| (history[m.continues_at], m.len));
        } else {
            self.ahead_matched = matched.map_or(0, |m| m.len);
        }
        let mut fed = vec![id];
        if k == 0 {
            // Lookup's rate is judged on its first guesses; a drafter's on its guesses not run.
            if self.shadow.is_empty() && self.drafter.is_some() {
                // A draft model's guess costs a pass of its own: one at a time, and rarer while
                // they fail, is enough to measure how often they hold.
                if self.drafter.as_mut().is_some_and(DrafterState::probe_due) {
                    self.shadow = self.propose(s.model, &history, matched, room.min(1))?.into();
                }
            }
        } else {
            if let Some(d) = self.drafter.as_mut() {
                d.drafting();
            }
            // A run of guesses not run that still holds ends here, none of it rejected.
            if !self.shadow.is_empty() {
                self.shadow.clear();
                self.verdict(false);
            }
            fed.extend(self.propose(s.model, &history, matched, k)?);
        }
        if fed.len() > 1 {
            cache.begin_verify();
        }
        Ok(Feed::Run(fed))
    }

    /// How many tokens to guess, at most `room`: as many as pay for their rows
    /// ([`best_draft_len`]) at the stream's acceptance rate and the model's measured cost of an
    /// extra row, plus a drafter's pass per guess (none measured yet: as many as allowed,
    /// which measures it); for prompt lookup, whose text so far ends with `matched` tokens of an
    /// earlier passage, at the rates of guesses after matches as long
    /// ([`MatchAcceptance::draft_len`]), and one guess where none pays but no row has been timed
    /// for a while ([`crate::pass_costs::PassCosts::probe_due`]).
    fn draft_len(&self, s: &Drawn<'_>, room: usize, matched: usize) -> usize {
        let costs = match s.lookup.length {
            DraftLength::RowCost(r) => linear_costs(r, room),
            // A drafter that always guesses (a draft model) would never time a one-row pass, and
            // without one no row's cost is known: after a verify pass, one plain pass times it.
            DraftLength::Measured if self.verify_steps > 0 && s.model.passes.one_row_s().is_none() => {
                return 0;
            }
            DraftLength::Measured => {
                let line = s.model.passes.line();
                let drafting = self.drafter.as_ref().map_or(0.0, |d| d.guess_cost(s.model, line));
                let rows = s.model.passes.guess_costs(room).unwrap_or_else(|| linear_costs(0.0, room));
                rows.iter().enumerate().map(|(k, c)| c + drafting * k as f64).collect()
            }
        };
        match self.drafter {
            None => match self.by_match.draft_len(matched, &costs) {
                0 if matched > 0 && s.lookup.length == DraftLength::Measured => {
                    usize::from(s.model.passes.probe_due()).min(room)
                }
                k => k,
            },
            Some(_) => best_chain_len(std::iter::repeat(self.acceptance.rate()), &costs),
        }
    }

    /// Up to `k` guesses of the tokens after `history`, from the request's drafter.
    /// `matched`: prompt lookup's match, already found for this pass (`None` for a drafter).
    fn propose(&mut self, model: &Model, history: &[u32], matched: Option<Match>, k: usize) -> Result<Vec<u32>> {
        match self.drafter.as_mut() {
            Some(state) => state.propose(model, history, k),
            None => Ok(matched.map_or_else(Vec::new, |m| m.continuation(history, k).to_vec())),
        }
    }

    /// Judges the next guess that was not run against the drawn token `id`.
    fn judge_shadow(&mut self, id: u32) {
        let Some(guess) = self.shadow.pop_front() else { return };
        if let Some(d) = self.drafter.as_mut() {
            d.probed();
        }
        if guess == id {
            self.run_accepted += 1;
            if self.shadow.is_empty() {
                self.verdict(false);
            }
        } else {
            self.shadow.clear();
            self.verdict(true);
        }
    }

    /// A run of guesses ended: rejected at its next guess, or all accepted.
    fn verdict(&mut self, rejected: bool) {
        self.acceptance.record(std::mem::take(&mut self.run_accepted), rejected);
    }

    /// The logits of a pass over `fed` (one row per token of a verify pass, else the last):
    /// the first follows the drawn token, the others wait beside their drafts.
    pub(crate) fn take_rows(&mut self, fed: &[u32], rows: Vec<Vec<f32>>) -> Option<Vec<f32>> {
        self.verify_steps += 1;
        self.drafted += fed.len() - 1;
        let mut rows = rows.into_iter();
        let next = rows.next();
        self.ahead = fed[1..].iter().copied().zip(rows).collect();
        next
    }

    /// Whether this stream's drafter reads the model's hidden states (an MTP layer).
    pub(crate) fn wants_hidden(&self) -> bool {
        self.drafter.as_ref().is_some_and(DrafterState::wants_hidden)
    }

    /// The model ran this stream's positions `start..` with these hidden states.
    pub(crate) fn target_ran(
        &mut self,
        model: &Model,
        start: usize,
        hidden: Option<&candle_core::Tensor>,
    ) -> Result<()> {
        match (hidden, self.drafter.as_mut()) {
            (Some(h), Some(d)) => d.target_ran(model, start, h),
            _ => Ok(()),
        }
    }

    /// Rolls back drafts still waiting for their verdict: they are not part of the generation
    /// (a checkpoint or a saved state holds accepted tokens only).
    pub(crate) fn forget_drafts(&mut self, cache: &mut SequenceState) -> Result<()> {
        if !self.ahead.is_empty() {
            let accepted = cache.position() - self.ahead.len();
            self.ahead.clear();
            cache.roll_back(accepted)?;
        }
        Ok(())
    }
}
