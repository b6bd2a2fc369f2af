//! A draft model: a second, small model that reads and writes the target's vocabulary, kept
//! resident, which guesses the next k tokens greedily for each verify pass (Leviathan et al.,
//! arXiv 2211.17192, §2; llama.cpp's `common/speculative.cpp`). Its guesses are a point mass,
//! so the acceptance rule of `generate.rs` (`plan_feed`) holds for them as for prompt lookup's.
//!
//! Each stream keeps the draft model's own cache ([`DrafterState`]). Before each guess it is cut
//! back to the longest prefix it shares with the generation so far (the drafts the target
//! rejected are forgotten, as the target's cache forgets them) and runs the accepted tokens it
//! has not seen. A checkpoint or a saved thread state holds none of it: a resumed stream's draft
//! model starts empty and runs the whole history at its first guess.

use crate::error::EngineError;
use std::time::Instant;

use candle_core::Tensor;

use super::mtp::MtpState;
use crate::pass_costs::{CostLine, PassCosts};
use std::path::Path;

use crate::error::Result;
use crate::model::Model;
use nightmail_formats::tokenizer::TextTokenizer;
use nightmail_model::SequenceState;

/// Refuses a draft model whose guesses the target would misread: its tokenizer must spell every
/// id as the target's does, with the same BOS and EOS (llama.cpp's
/// `common_speculative_are_compatible` checks the same, by token text per id). Two models
/// without a tokenizer (driven by ids) must have vocabularies of one size. A draft model must
/// also be cut back to any position between passes, which a recurrent state cannot.
pub(crate) fn check_draft_model(target: &Model, draft: &Model) -> Result<()> {
    let why = match (target.tokenizer(), draft.tokenizer()) {
        (Some(t), Some(d)) => tokenizer_difference(t, d),
        (None, None) => (target.spec().vocab_size != draft.spec().vocab_size).then(|| {
            format!(
                "neither has a tokenizer, and their vocabularies hold {} and {} ids",
                target.spec().vocab_size,
                draft.spec().vocab_size
            )
        }),
        (Some(_), None) => Some("the draft model has no tokenizer".into()),
        (None, Some(_)) => Some("the target has no tokenizer".into()),
    };
    if let Some(why) = why {
        return Err(EngineError::DraftTokenizer { draft: draft.path().into(), target: target.path().into(), why });
    }
    if draft.new_cache().has_state_that_cannot_be_cut_back() {
        return Err(EngineError::DraftModel {
            path: draft.path().into(),
            why: "its layers keep a recurrent state (linear attention) or compressed windows (DeepSeek-V4), \
                  which cannot be cut back to the accepted tokens between passes: use a draft model of \
                  attention layers only"
                .into(),
        });
    }
    Ok(())
}

/// The first way `draft` reads ids differently from `target`, if any.
fn tokenizer_difference(target: &TextTokenizer, draft: &TextTokenizer) -> Option<String> {
    let (n, m) = (target.vocab_size(), draft.vocab_size());
    if n != m {
        return Some(format!("the target's vocabulary holds {n} tokens, the draft model's {m}"));
    }
    if target.bos_text() != draft.bos_text() || target.eos_text() != draft.eos_text() {
        return Some(format!(
            "BOS/EOS are {:?}/{:?} in the target and {:?}/{:?} in the draft model",
            target.bos_text(),
            target.eos_text(),
            draft.bos_text(),
            draft.eos_text()
        ));
    }
    let id = (0..n as u32).find(|&id| target.token_text(id) != draft.token_text(id))?;
    Some(format!(
        "token {id} is {:?} in the target and {:?} in the draft model",
        target.token_text(id).unwrap_or_default(),
        draft.token_text(id).unwrap_or_default()
    ))
}

/// A guess's cost beyond its row in the verify pass: the drafter's pass that made it (of
/// `drafter`'s measured costs), as a fraction of the target's one-row pass (0 until both were
/// timed).
fn guess_cost(drafter: &PassCosts, target: Option<CostLine>) -> f64 {
    match (drafter.one_row_s(), target) {
        (Some(d), Some(t)) if t.base_s > 0.0 => d / t.base_s,
        _ => 0.0,
    }
}

/// The most tokens between two guesses made only to measure how often guesses hold.
const MAX_PROBE_GAP: usize = 32;

/// One stream's side of a drafter that runs a network of its own (a draft model, or the model's
/// MTP layer): its cache, and when to guess next while drafting does not pay.
pub(crate) struct DrafterState {
    side: Side,
    probes: Probes,
}

enum Side {
    /// The draft model's cache and the tokens it has run.
    Model { cache: SequenceState, run: Vec<u32> },
    /// The MTP layer's cache and the model's hidden states it has yet to run (`mtp.rs`).
    Mtp(MtpState),
}

/// Guesses made only to be judged (the schedule chose plain decoding) each cost a draft model's
/// pass: while the schedule keeps choosing plain decoding they are made ever more rarely (the
/// gap doubles at each, up to [`MAX_PROBE_GAP`] tokens), whether they hold or not: a guess that
/// holds but costs more than it saves (a draft model nearly as slow as the model) does not pay
/// either. The rate they measure decays at the pace of their verdicts.
#[derive(Debug, Default)]
struct Probes {
    gap: usize,
    until_next: usize,
}

impl Probes {
    fn due(&mut self) -> bool {
        if self.until_next == 0 {
            return true;
        }
        self.until_next -= 1;
        false
    }

    fn judged(&mut self) {
        self.gap = (self.gap * 2).clamp(1, MAX_PROBE_GAP);
        self.until_next = self.gap;
    }

    /// The schedule runs guesses again: probe at once the next time it stops.
    fn reset(&mut self) {
        *self = Probes::default();
    }
}

impl DrafterState {
    pub(crate) fn new(drafter: &Model) -> Self {
        DrafterState { side: Side::Model { cache: drafter.new_cache(), run: Vec::new() }, probes: Probes::default() }
    }

    /// For `model`'s own MTP layer.
    pub(crate) fn mtp(model: &Model) -> Result<Self> {
        Ok(DrafterState { side: Side::Mtp(MtpState::new(model)?), probes: Probes::default() })
    }

    /// Whether the model's passes must hand their hidden states to [`DrafterState::target_ran`].
    pub(crate) fn wants_hidden(&self) -> bool {
        matches!(self.side, Side::Mtp(_))
    }

    /// The model ran positions `start..` with these hidden states (`[tokens, hidden]`).
    pub(crate) fn target_ran(&mut self, model: &Model, start: usize, hidden: &Tensor) -> Result<()> {
        match &mut self.side {
            Side::Mtp(m) => m.target_ran(model, start, hidden),
            Side::Model { .. } => Ok(()),
        }
    }

    /// A guess's cost beyond its row (see [`guess_cost`]), for the stream of `model`.
    pub(crate) fn guess_cost(&self, model: &Model, target: Option<CostLine>) -> f64 {
        let passes = match &self.side {
            Side::Model { .. } => model.draft_model().map(|d| &d.passes),
            Side::Mtp(_) => model.mtp_passes(),
        };
        passes.map_or(0.0, |p| guess_cost(p, target))
    }

    /// Whether to make a guess that will only be judged, not run ([`Probes`]).
    pub(crate) fn probe_due(&mut self) -> bool {
        self.probes.due()
    }

    /// Such a guess was judged.
    pub(crate) fn probed(&mut self) {
        self.probes.judged();
    }

    /// The schedule runs guesses: probing starts over when it stops.
    pub(crate) fn drafting(&mut self) {
        self.probes.reset();
    }

    /// Up to `k` tokens the drafter of `model`'s stream guesses to follow `history`.
    pub(crate) fn propose(&mut self, model: &Model, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let vocab = model.spec().vocab_size;
        match &mut self.side {
            Side::Mtp(m) => m.propose(model, history, k, vocab),
            Side::Model { cache, run } => {
                let drafter = model.draft_model().ok_or(EngineError::NoDraftModel)?;
                propose_with_model(cache, run, drafter, history, k, vocab)
            }
        }
    }
}

/// Up to `k` tokens the draft model guesses to follow `history` (the prompt and the tokens
/// generated so far, the last one drawn but not yet run by the target), each the draft model's
/// most likely token after the ones before; fewer where its context ends or it guesses an id
/// past the target's `vocab`. `cache` holds the draft model's run of the tokens `run`.
fn propose_with_model(
    cache: &mut SequenceState,
    run: &mut Vec<u32>,
    drafter: &Model,
    history: &[u32],
    k: usize,
    vocab: usize,
) -> Result<Vec<u32>> {
    // The last guess is not run: positions up to history.len() + k − 2 must fit.
    let k = k.min((drafter.spec().context_length + 1).saturating_sub(history.len()));
    if k == 0 || history.is_empty() {
        return Ok(Vec::new());
    }
    // Keep what the cache shares with the history, less at least one token to run for logits.
    let shared = run.iter().zip(history).take_while(|(a, b)| a == b).count().min(history.len() - 1);
    cache.truncate(shared)?;
    run.truncate(shared);
    let logits = pass(cache, drafter, &history[shared..])?;
    run.extend(&history[shared..]);
    super::greedy_guesses(k, vocab, logits, |id| {
        let logits = pass(cache, drafter, &[id])?;
        run.push(id);
        Ok(logits)
    })
}

/// Runs `tokens` on the draft model's `cache`, timing a one-token pass (the cost of a guess).
fn pass(cache: &mut SequenceState, drafter: &Model, tokens: &[u32]) -> Result<Vec<f32>> {
    let t0 = Instant::now();
    let logits = drafter.logits(tokens, cache)?;
    if tokens.len() == 1 {
        drafter.passes.record(1, t0.elapsed().as_secs_f64());
    }
    Ok(logits)
}

impl Model {
    /// Loads the model at `path`, resident, as this model's draft model (`Drafting::Model`). It is
    /// refused unless its tokenizer spells every id as this model's does, and unless its state
    /// is keys and values (cut back to the accepted tokens after each verify pass).
    pub fn attach_draft_model(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let drafter = Model::load(path)?;
        check_draft_model(self, &drafter)?;
        self.drafter = Some(Box::new(drafter));
        Ok(())
    }

    /// The draft model, when one is attached.
    pub fn draft_model(&self) -> Option<&Model> {
        self.drafter.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_grow_rarer_while_plain_decoding_lasts_and_start_over_after_drafting() {
        let mut p = Probes::default();
        let mut made = Vec::new();
        for t in 0..200 {
            // The schedule drafts from token 150 to 159.
            if (150..160).contains(&t) {
                p.reset();
            } else if p.due() {
                made.push(t);
                p.judged();
            }
        }
        // Gaps of 1, 2, 4, … up to 32 tokens between probes, then from the start again.
        let gaps: Vec<usize> = made.windows(2).map(|w| w[1] - w[0] - 1).take(8).collect();
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 32, 32]);
        let after: Vec<usize> = made.iter().copied().filter(|&t| t >= 160).take(4).collect();
        assert_eq!(after, [160, 162, 165, 170]);
    }
}
