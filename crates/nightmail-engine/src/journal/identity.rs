//! What a checkpoint belongs to: the generation, down to the weights' files.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::bad;
use crate::error::Result;
use crate::sampling::Sampling;

/// What a checkpoint belongs to: restoring it into any other generation would be wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Identity {
    /// The model file or directory, and the shape of its network.
    pub model: String,
    pub network: Vec<usize>,
    pub weights: Vec<WeightsFile>,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub stop_at_eos: bool,
    /// SHA-256 of the chat template, for a saved thread state ([`crate::state_cache`]); absent
    /// from a generation's checkpoint, whose identity serializes as it did before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The tool-call grammar decoding was constrained to, if any (absent otherwise, so an
    /// unconstrained checkpoint's identity serializes as it did before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<String>,
}

/// One file of a model's weights, as a checkpoint's identity knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct WeightsFile {
    pub name: String,
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    pub modified: u128,
    /// SHA-256 of the first [`HEADER_DIGEST_BYTES`], hex.
    pub header_sha256: String,
}

/// Enough for the header of every format we read; reading more would cost each resume.
pub(super) const HEADER_DIGEST_BYTES: u64 = 1 << 20;

impl WeightsFile {
    /// The files of the model at `path` (one file, or the files of a directory, by name).
    pub fn of(path: &Path) -> Result<Vec<WeightsFile>> {
        let meta = std::fs::metadata(path).map_err(|e| bad(path, e))?;
        if !meta.is_dir() {
            return Ok(vec![WeightsFile::one(path)?]);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| bad(path, e))? {
            let entry = entry.map_err(|e| bad(path, e))?;
            if entry.file_type().map_err(|e| bad(path, e))?.is_file() {
                files.push(WeightsFile::one(&entry.path())?);
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(files)
    }

    fn one(path: &Path) -> Result<WeightsFile> {
        let file = File::open(path).map_err(|e| bad(path, e))?;
        let meta = file.metadata().map_err(|e| bad(path, e))?;
        let modified = meta.modified().map_err(|e| bad(path, e))?;
        let modified = modified.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut head = Vec::new();
        file.take(HEADER_DIGEST_BYTES).read_to_end(&mut head).map_err(|e| bad(path, e))?;
        let header_sha256 = Sha256::digest(&head).iter().map(|b| format!("{b:02x}")).collect();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        Ok(WeightsFile { name, size: meta.len(), modified, header_sha256 })
    }
}
