//! Drafting with the model's own multi-token-prediction layer (`nightmail-model/src/mtp.rs`; DeepSeek-V3
//! technical report §2.2 and §5.4.3, where its one MTP module guesses the second next token and
//! 85-90% of those guesses hold). Its first guess follows the token just drawn: at the model's
//! position p − 1 it reads the model's hidden state there and the drawn token. Each further guess
//! chains the layer on its own output hidden state and the guess before (vLLM's `EagleProposer`
//! does the same with DeepSeek's single MTP layer).
//!
//! The layer keeps a cache of its own per stream, which must hold, at each position, what it
//! computed from the model's hidden state there. So every pass of the model hands its hidden
//! states to [`MtpState::target_ran`] (a verify pass's rejected positions are replaced by the next
//! pass over them), the layer runs them at the next guess, and the positions it ran on its own
//! chained states are cut from its cache before then, as a draft model's rejected guesses are.
//! A checkpoint or a saved thread state holds none of it, and the model's hidden states before
//! a restored position are not known: a resumed stream's MTP layer starts at that position, its
//! cache holding only what came after (the guesses see less; the tokens are the same).

use crate::error::EngineError;
use std::collections::VecDeque;
use std::time::Instant;

use candle_core::Tensor;

use crate::error::Result;
use crate::model::Model;
use crate::pass_costs::PassCosts;
use nightmail_formats::ModelFile;
use nightmail_model::SequenceState;

pub(crate) struct MtpState {
    cache: SequenceState,
    /// The model's position that the layer's position 0 stands for (0 unless the stream began
    /// from a restored state). Attention under RoPE depends only on the distance between
    /// positions, so the shift changes no score.
    first: usize,
    /// The model's positions first..run are in the cache, each run from the model's own
    /// hidden state.
    run: usize,
    /// The model's hidden states (`[1, hidden]`, after its final norm) at positions run.., not
    /// run yet.
    pending: VecDeque<Tensor>,
}

impl MtpState {
    pub(crate) fn new(model: &Model) -> Result<Self> {
        let cache = model.net.new_mtp_cache().ok_or(EngineError::NoMtpLayer)?;
        Ok(MtpState { cache, first: 0, run: 0, pending: VecDeque::new() })
    }

    /// The model ran positions `start..` and gave these hidden states (`[tokens, hidden]`).
    /// Positions from `start` on that were kept from an earlier pass were rejected guesses.
    pub(crate) fn target_ran(&mut self, model: &Model, start: usize, hidden: &Tensor) -> Result<()> {
        let known = self.run + self.pending.len();
        if start < self.run || start > known {
            // Positions the layer cannot join up with (a stream restored from a saved state has no
            // hidden states before it): it starts over there.
            self.cache = model.net.new_mtp_cache().ok_or(EngineError::NoMtpLayer)?;
            (self.first, self.run) = (start, start);
            self.pending.clear();
        } else {
            self.pending.truncate(start - self.run);
        }
        for i in 0..hidden.dim(0)? {
            self.pending.push_back(hidden.narrow(0, i, 1)?);
        }
        Ok(())
    }

    /// Up to `k` guesses of the tokens after `history` (the prompt and the tokens so far, the last
    /// one drawn but not yet run by the model); none where the model's hidden states up to the
    /// drawn token are not all known, fewer where a guess is an id past `vocab`.
    pub(crate) fn propose(&mut self, model: &Model, history: &[u32], k: usize, vocab: usize) -> Result<Vec<u32>> {
        if k == 0 || history.len() < 2 {
            return Ok(Vec::new());
        }
        // The model has run positions up to p − 1; the drawn token is at p.
        let p = history.len() - 1;
        self.cache.truncate(self.run - self.first)?;
        let count = p.saturating_sub(self.run).min(self.pending.len());
        if count == 0 {
            return Ok(Vec::new());
        }
        // Position i reads h_i and the token at i + 1.
        let rows: Vec<Tensor> = self.pending.drain(..count).collect();
        let tokens = &history[self.run + 1..=self.run + count];
        let (logits, out) = self.pass(model, tokens, &Tensor::cat(&rows, 0)?)?;
        self.run += count;
        if self.run != p {
            return Ok(Vec::new());
        }
        let logits = logits.get(count - 1)?.to_vec1::<f32>()?;
        let mut h = out.narrow(0, count - 1, 1)?;
        #[cfg(test)]
        tests::FIRST_GUESSES.with(|g| g.borrow_mut().push((p, crate::sampling::argmax(&logits))));
        super::greedy_guesses(k, vocab, logits, |id| {
            let (logits, next) = self.pass(model, &[id], &h)?;
            h = next;
            Ok(logits.get(0)?.to_vec1::<f32>()?)
        })
    }

    /// The layer over `tokens` and `hidden`, timing a one-row pass (the cost of a guess).
    fn pass(&mut self, model: &Model, tokens: &[u32], hidden: &Tensor) -> Result<(Tensor, Tensor)> {
        let t0 = Instant::now();
        let out = rayon::scope(|_| model.net.forward_mtp(tokens, hidden, &mut self.cache))?;
        if let (1, Some(passes)) = (tokens.len(), model.mtp_passes()) {
            passes.record(1, t0.elapsed().as_secs_f64());
        }
        Ok(out)
    }
}

impl Model {
    /// Loads the model's own multi-token-prediction layer (`Drafting::Mtp`, `nightmail-model/src/mtp.rs`): refused
    /// for a model whose configuration counts none, naming the key, or whose file lacks its
    /// tensors, naming the first missing one.
    pub fn attach_mtp(&mut self) -> Result<()> {
        if self.spec.mtp_layers == 0 {
            return Err(EngineError::NoMtp { path: self.path.clone(), key: self.spec.mtp_key.clone() });
        }
        let ck = ModelFile::open(&self.path)?;
        self.net.attach_mtp(&ck, &self.spec, self.streaming.is_some())?;
        ck.release_pages();
        self.mtp_passes = Some(PassCosts::default());
        Ok(())
    }

    /// The MTP layer's logits at each position of `tokens` but the last (`[len − 1][vocab]`):
    /// row i reads the model's hidden state at i and the token at i + 1, and predicts the token
    /// at i + 2. For checking it against a reference; drafting runs it a guess at a time.
    pub fn mtp_logits(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let mut state = self.net.new_mtp_cache().ok_or(EngineError::NoMtpLayer)?;
        if tokens.len() < 2 {
            return Ok(Vec::new());
        }
        let mut cache = self.new_cache();
        let logits = rayon::scope(|_| -> Result<Tensor> {
            let (_, hidden) = self.net.forward_verify_groups_hidden(&mut [(&mut cache, tokens)], &[true])?;
            let hidden = hidden[0].as_ref().expect("asked for").narrow(0, 0, tokens.len() - 1)?;
            Ok(self.net.forward_mtp(&tokens[1..], &hidden, &mut state)?.0)
        })?;
        Ok(logits.to_vec2::<f32>()?)
    }

    /// The measured cost of the MTP layer's passes, when it is loaded.
    pub(crate) fn mtp_passes(&self) -> Option<&PassCosts> {
        self.mtp_passes.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    use crate::draft::{DraftLength, Drafting, PromptLookup};
    use crate::model::Model;
    use crate::request::{GenerateRequest, Prompt};
    use crate::sampling::argmax;
    use nightmail_formats::{HfDir, hf::write_f32_safetensors};

    thread_local! {
        /// Each first guess made on this thread: (the drawn token's position, the guess).
        pub(super) static FIRST_GUESSES: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
    }

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3_mtp")
    }

    /// The fixture with an MTP layer that echoes the model: its block an identity (attention
    /// output and every expert's down projection zero), `eh_proj` passing the hidden half on and
    /// its norms ones, so its logits at position i are (to rounding) the model's own at i: it
    /// guesses that the drawn token repeats, which holds where the model repeats itself.
    fn echo(dir: &Path) {
        let src = fixture();
        for name in ["config.json", "model.safetensors"] {
            std::fs::copy(src.join(name), dir.join(name)).unwrap();
        }
        let hf = HfDir::open(&src).unwrap();
        let mut tensors = Vec::new();
        for v in hf.all_tensors().unwrap().into_iter().filter(|v| v.name.starts_with("model.layers.2.")) {
            let n = v.shape.iter().product::<usize>();
            let mut values: Vec<f32> = v.to_f32().unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let name = v.name.as_str();
            if name.ends_with("eh_proj.weight") {
                let h = v.shape[0];
                values = (0..n).map(|i| if i % (2 * h) == h + i / (2 * h) { 1.0 } else { 0.0 }).collect();
            } else if name.ends_with("enorm.weight")
                || name.ends_with("hnorm.weight")
                || name.ends_with("shared_head.norm.weight")
            {
                values = vec![1.0; n];
            } else if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                values = vec![0.0; n];
            }
            tensors.push((v.name.clone(), v.shape.clone(), values.iter().flat_map(|x| x.to_le_bytes()).collect()));
        }
        write_f32_safetensors(&dir.join("mtp.safetensors"), &tensors).unwrap();
    }

    #[test]
    fn accepted_and_rejected_guesses_leave_the_layer_as_a_fresh_run_of_the_accepted_tokens() {
        let dir = tempfile::tempdir().unwrap();
        echo(dir.path());
        let mut model = Model::load(dir.path()).unwrap();
        model.attach_mtp().unwrap();
        // After this prompt the model runs on with nine 0s, where the echo's guesses hold, and
        // then other tokens, where they fail.
        let mut request = GenerateRequest::new(Prompt::Tokens(vec![1, 2, 3, 1, 2, 3]));
        request.max_new_tokens = 33;
        request.stop_at_eos = false;
        request.lookup = PromptLookup { length: DraftLength::RowCost(0.0), ..PromptLookup::default() };
        let lead = model.generate(request.clone(), |_| std::ops::ControlFlow::Continue(())).unwrap();
        let mut prompt = vec![1, 2, 3, 1, 2, 3];
        prompt.extend(&lead.tokens);
        request.prompt = Prompt::Tokens(prompt.clone());
        request.max_new_tokens = 20;
        let plain = model.generate(request.clone(), |_| std::ops::ControlFlow::Continue(())).unwrap();
        assert_eq!(plain.tokens[..9], [0; 9]);
        request.draft = Drafting::Mtp;
        FIRST_GUESSES.with(|g| g.borrow_mut().clear());
        let drafted = model.generate(request, |_| std::ops::ControlFlow::Continue(())).unwrap();
        assert_eq!(drafted.tokens, plain.tokens);
        let (accepted, guessed) = (drafted.accepted, drafted.drafted);
        assert!(accepted >= 6 && guessed > accepted, "{accepted} of {guessed} guesses held");
        eprintln!("the echoing MTP layer: {accepted} of {guessed} guesses held");
        assert_eq!(drafted.verify_steps + drafted.accepted, plain.verify_steps);
        // Each first guess is what the layer gives at that position run afresh over the accepted
        // tokens: its cache held no rejected guess and no chained state, and every position's
        // hidden state was the model's.
        let mut sequence = prompt.clone();
        sequence.extend(&drafted.tokens);
        let fresh = model.mtp_logits(&sequence).unwrap();
        let firsts = FIRST_GUESSES.with(|g| g.borrow().clone());
        assert!(firsts.len() >= 8, "{firsts:?}");
        for (p, guess) in firsts {
            assert_eq!(guess, argmax(&fresh[p - 1]), "the first guess after position {p}");
        }
    }
}
