//! Thread state reuse: when a generation ends, the state of everything it ran (the prompt and
//! the answer's tokens: key/value rows, recurrent states, the position) is kept on disk, and a
//! later prompt that starts with the same tokens restores it and prefills only the rest. Every
//! follow-up in a mail thread repeats the whole conversation as its prompt, so this saves all
//! but the new turn's prefill.
//!
//! A saved state is a file in the generation journal's format (`journal/`): a header
//! naming the model (its path, network shape, weights files, a SHA-256 of its chat template) and
//! the exact tokens run, then one record holding every position. It is written beside its name
//! and renamed over it after an fsync, so a crash leaves no half file under the name; a file that
//! is not whole and intact, or names another model, is reported and removed, never restored.
//!
//! Files are found by key: SHA-256 of the model's identity, then of the token ids of the prompt
//! the state was saved after (its anchor). A new prompt is hashed incrementally, so each of its
//! prefixes has a key, and the longest one with a file is tried first. The tokens the file holds
//! are then compared with the new prompt's: only positions whose whole history is identical are
//! restored (a position's keys, values and recurrent state depend on the tokens up to it and
//! nothing else), so an answer the chat template renders differently from how it was generated
//! costs only the positions after the first difference. A model with recurrent layers (KDA) has
//! one state for the last position only, which cannot be cut back: its file is reused only when
//! the new prompt starts with every token it holds.
//!
//! The files of one model are kept within its budget (`state_cache_mb`), least recently used
//! first out; a file's mtime is when it was last written or restored.

use crate::error::EngineError;
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::journal::{Delta, Identity, WeightsFile, read_whole, write_whole};
use crate::model::Model;
use crate::sampling::Sampling;
use nightmail_model::{LayerSnapshot, SequenceState};

/// A file name's ending; the key's hex digits come before it.
const SUFFIX: &str = ".state";
/// Files of another model identity (weights replaced, model removed from the configuration)
/// unused this long are removed by any model's eviction.
const ORPHAN_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Temporary files older than this are a crashed writer's.
const TEMP_AGE: Duration = Duration::from_secs(3600);

/// The saved thread states of one loaded model.
pub struct StateCache {
    dir: PathBuf,
    budget: u64,
    /// What every state saved for this model names, but for its tokens.
    identity: Identity,
    /// SHA-256 of `identity`: where every key starts.
    model_key: [u8; 32],
    layers: usize,
    /// The model has recurrent layers, whose state cannot be cut back.
    recurrent: bool,
}

/// What [`StateCache::find`] restored, and the files it passed over and why.
#[derive(Debug, Default)]
pub struct Reuse {
    /// Prompt positions restored (0: none; the whole prompt is prefilled).
    pub restored: usize,
    /// Saved states found for the prompt but not used: damaged, truncated or of another model
    /// (each file is removed), for the caller to log.
    pub ignored: Vec<EngineError>,
}

pub(crate) struct Found {
    pub kv: Vec<LayerSnapshot>,
    pub position: usize,
}

impl StateCache {
    /// The states of `model` under `dir`, kept within `budget_bytes` (0 saves nothing).
    pub fn open(model: &Model, dir: impl Into<PathBuf>, budget_bytes: u64) -> Result<StateCache> {
        let template = model.chat_template().map(|t| hex(&Sha256::digest(t.source().as_bytes())));
        let identity = Identity {
            model: model.path().display().to_string(),
            network: model.network_shape(),
            weights: WeightsFile::of(model.path())?,
            prompt: Vec::new(),
            sampling: Sampling::greedy(),
            stop: Vec::new(),
            stop_at_eos: false,
            template: Some(template.unwrap_or_default()),
            tool_calls: None,
        };
        let json = serde_json::to_vec(&identity)
            .map_err(|e| EngineError::Checkpoint { path: model.path().to_path_buf(), reason: e.to_string() })?;
        Ok(StateCache {
            dir: dir.into(),
            budget: budget_bytes,
            identity,
            model_key: Sha256::digest(&json).into(),
            layers: model.spec().layers,
            recurrent: model.spec().kda.as_ref().is_some_and(|k| !k.layers.is_empty()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes on disk of this model's saved states.
    pub fn bytes(&self) -> u64 {
        self.files().iter().map(|f| f.len).sum()
    }

    /// File names start with this: the model's part of the key.
    fn model_prefix(&self) -> String {
        hex(&self.model_key[..8])
    }

    /// The file names of the states anchored after each prefix of `tokens`: `names[n - 1]` for
    /// the first n tokens.
    fn names(&self, tokens: &[u32]) -> Vec<String> {
        let prefix = self.model_prefix();
        let mut hasher = Sha256::new();
        hasher.update(self.model_key);
        tokens
            .iter()
            .map(|t| {
                hasher.update(t.to_le_bytes());
                format!("{prefix}-{}{SUFFIX}", hex(&hasher.clone().finalize()))
            })
            .collect()
    }

    /// The longest saved state `prompt` starts with, restorable with at least one prompt token
    /// left to run (whose logits the next token is drawn from).
    pub(crate) fn find(&self, prompt: &[u32], ignored: &mut Vec<EngineError>) -> Option<Found> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return None };
        let prefix = self.model_prefix();
        let present: HashSet<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix) && n.ends_with(SUFFIX))
            .collect();
        if present.is_empty() {
            return None;
        }
        let names = self.names(prompt);
        for (n, name) in names.iter().enumerate().rev().filter(|(_, name)| present.contains(*name)) {
            let path = self.dir.join(name);
            match self.restorable(&path, prompt, n + 1) {
                Ok(Some(found)) => {
                    touch(&path);
                    return Some(found);
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    ignored.push(e);
                }
            }
        }
        None
    }

    /// What of the state at `path`, anchored after `prompt`'s first `anchor` tokens, can be
    /// restored for `prompt`: `None` when it does not fit, an error when it is damaged or names
    /// another model.
    fn restorable(&self, path: &Path, prompt: &[u32], anchor: usize) -> Result<Option<Found>> {
        let (identity, saved) = read_whole(path, self.layers)?;
        let refuse = |reason: &str| EngineError::Checkpoint { path: path.to_path_buf(), reason: reason.to_string() };
        let held = &identity.prompt;
        if (Identity { prompt: Vec::new(), ..identity.clone() }) != self.identity {
            return Err(refuse("a saved state of another model, weights or chat template"));
        }
        if saved.position != held.len() || !saved.tokens.is_empty() || held.get(..anchor) != prompt.get(..anchor) {
            return Err(refuse("a saved state whose tokens do not match its name"));
        }
        let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let usable = if self.recurrent {
            // The recurrent state is that after the last token held, no other.
            if common == held.len() && held.len() < prompt.len() { held.len() } else { 0 }
        } else {
            common.min(prompt.len() - 1)
        };
        if usable == 0 {
            return Ok(None);
        }
        let kv = saved
            .kv
            .into_iter()
            .map(|s| match s {
                LayerSnapshot::Rows(k, v) if usable < saved.position => Ok(LayerSnapshot::Rows(
                    k.narrow(2, 0, usable)?.contiguous()?,
                    v.narrow(2, 0, usable)?.contiguous()?,
                )),
                s => Ok(s),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Found { kv, position: usable }))
    }

    /// Saves `cache`, the state after `tokens`, under the key of its first `anchor` tokens (the
    /// prompt it answered), replacing a state saved there before; then evicts the least recently
    /// used states past the budget. Returns the bytes written, or `None` when the state alone
    /// would exceed the budget.
    pub(crate) fn save(&self, tokens: &[u32], anchor: usize, cache: &SequenceState) -> Result<Option<u64>> {
        let position = cache.position();
        let anchor = anchor.min(position);
        if anchor == 0 || tokens.len() != position {
            return Ok(None);
        }
        let kv = (0..cache.layers())
            .map(|l| cache.snapshot(l, 0, position))
            .collect::<Result<Vec<_>, nightmail_model::ModelError>>()?;
        let size: u64 = kv
            .iter()
            .map(|s| match s {
                LayerSnapshot::Rows(a, b) | LayerSnapshot::State(a, b) => {
                    ((a.elem_count() + b.elem_count()) * a.dtype().size_in_bytes()) as u64
                }
            })
            .sum();
        if size > self.budget {
            return Ok(None);
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| EngineError::Checkpoint { path: self.dir.clone(), reason: e.to_string() })?;
        let name = self.names(&tokens[..anchor]).pop().expect("anchor > 0");
        let identity = Identity { prompt: tokens.to_vec(), ..self.identity.clone() };
        let delta = Delta { tokens: &[], sampler_position: 0, kv, end_position: position, logits: &[] };
        let bytes = write_whole(&self.dir.join(&name), &identity, &delta)?;
        self.evict(&name);
        Ok(Some(bytes))
    }

    /// This model's files, and the other files of the directory that are due for removal.
    fn files(&self) -> Vec<StateFile> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let prefix = self.model_prefix();
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                let used = meta.modified().ok()?;
                let ours = name.starts_with(&prefix) && name.ends_with(SUFFIX);
                Some(StateFile { path: e.path(), name, len: meta.len(), used, ours })
            })
            .collect()
    }

    /// Removes this model's least recently used states until they fit the budget (never `kept`,
    /// the one just written), other models' states unused for [`ORPHAN_AGE`], and temporary
    /// files a crashed writer left.
    fn evict(&self, kept: &str) {
        let now = SystemTime::now();
        let age = |f: &StateFile| now.duration_since(f.used).unwrap_or_default();
        let (mut ours, others): (Vec<StateFile>, Vec<StateFile>) = self.files().into_iter().partition(|f| f.ours);
        for f in others {
            let stale = if f.name.ends_with(SUFFIX) { ORPHAN_AGE } else { TEMP_AGE };
            if age(&f) > stale {
                let _ = std::fs::remove_file(&f.path);
            }
        }
        ours.sort_by_key(|f| (f.name == kept, f.used));
        let mut total: u64 = ours.iter().map(|f| f.len).sum();
        for f in ours {
            if total <= self.budget || f.name == kept {
                break;
            }
            if std::fs::remove_file(&f.path).is_ok() {
                total -= f.len;
            }
        }
    }
}

struct StateFile {
    path: PathBuf,
    name: String,
    len: u64,
    used: SystemTime,
    ours: bool,
}

/// Marks a state as used now (its mtime), for the least-recently-used order.
fn touch(path: &Path) {
    if let Ok(f) = OpenOptions::new().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{GenerateRequest, Prompt};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
    }

    /// A state file put under this model's name that another model wrote (the same network
    /// from its GGUF) is refused, reported and removed: the header names the model, not the
    /// file name alone.
    #[test]
    fn a_state_naming_another_model_is_refused_even_under_this_models_key() {
        let dir = tempfile::tempdir().unwrap();
        let prompt: Vec<u32> = (3..30).collect();
        let other = Model::load(fixture("llama/model.gguf")).unwrap();
        let theirs = StateCache::open(&other, dir.path().join("theirs"), 1 << 30).unwrap();
        let mut request = GenerateRequest::new(Prompt::Tokens(prompt.clone()));
        request.max_new_tokens = 3;
        let mut stream = other.stream(request).unwrap();
        while stream.next_token().unwrap().is_some() {}
        assert!(stream.keep(&theirs).unwrap().is_some());
        let written = std::fs::read_dir(theirs.dir()).unwrap().next().unwrap().unwrap().path();

        let model = Model::load(fixture("llama")).unwrap();
        let ours = StateCache::open(&model, dir.path().join("ours"), 1 << 30).unwrap();
        std::fs::create_dir_all(ours.dir()).unwrap();
        let name = ours.names(&prompt).pop().unwrap();
        std::fs::copy(&written, ours.dir().join(&name)).unwrap();
        let mut next = prompt.clone();
        next.extend([5, 6, 7]);
        let mut ignored = Vec::new();
        assert!(ours.find(&next, &mut ignored).is_none(), "another model's state was restored");
        assert_eq!(ignored.len(), 1);
        assert!(ignored[0].to_string().contains("another model"), "{}", ignored[0]);
        assert!(!ours.dir().join(&name).exists());
    }
}
