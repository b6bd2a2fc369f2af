//! The generation journal: checkpoints of a generation, so that a reply that takes days survives
//! a crash, a `kill -9`, a reboot or an upgrade at the cost of at most one checkpoint interval.
//!
//! One append-only file per generation:
//!
//! ```text
//! header:  "NMRESUME" | version u32 | length u32 | identity (JSON) | crc32 u32
//! record:  "NMRC" | length u64 | crc32 u32 | payload
//! payload: tokens before u64 | count u32 | token ids u32 × count
//!          | sampler position u128 | first position u64 | end position u64
//!          | per layer: kind u8, then
//!              rows (0):  keys, values (each: dtype u8 | heads u32 | dim u32 | length u64 | bytes)
//!              state (1): conv, recurrent (each: rows u64 | dtype u8 | heads u32 | dim u32 | length u64 | bytes)
//!          | logits length u32 | logits f32 × length
//! ```
//!
//! A record holds only what is new since the one before it: the tokens generated and the
//! key/value rows computed since, the sampler's position, and the pending logits row (the one the
//! next token will be drawn from). A recurrent layer (KDA) has no rows: its record holds its
//! whole state, fixed in size, and the last one replayed is the one restored. Version 1 files
//! (before recurrent layers; no kind bytes) are still read. Restoring replays the records in order and stops at the first
//! one that is short, fails its checksum or does not follow on from the one before: a torn write
//! loses that record only, and the file is cut back to the last good one before anything more is
//! appended. The state restored is exactly the state saved, so greedy decoding after a resume
//! gives the bytes an uninterrupted run gives (as does sampling: the generator's position is part
//! of the state).
//!
//! A file whose header does not match the generation asked for (another prompt, sampling,
//! model, weights, or a format version this build does not read) is discarded and generation
//! starts over. The weights count by each file's size, mtime and a SHA-256 of its first MiB (the
//! header: GGUF metadata, safetensors JSON), so a model re-downloaded or re-quantized in place
//! does not resume a generation of the old one. Replay reads the file record by record: the
//! restored state is all it holds in RAM, not the file's bytes besides. A journal holds an
//! advisory lock on its file: one writer at a time.

mod format;
mod identity;

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use nightmail_model::LayerSnapshot;

use crate::error::{EngineError, Result};

use format::*;
pub(crate) use identity::{Identity, WeightsFile};

/// The state a checkpoint file holds, as restored.
pub(crate) struct Saved {
    pub tokens: Vec<u32>,
    pub sampler_position: u128,
    /// Per layer, the keys and values of every position, `[1, heads, positions, dim]`, or the
    /// latest recurrent state.
    pub kv: Vec<LayerSnapshot>,
    /// Positions run (the end of the last record).
    pub position: usize,
    pub logits: Vec<f32>,
}

/// What is appended: the state now, and how much of it the file already holds.
pub(crate) struct Delta<'a> {
    pub tokens: &'a [u32],
    pub sampler_position: u128,
    /// Per layer, the key/value rows from the file's end position to now, or the recurrent
    /// state now.
    pub kv: Vec<LayerSnapshot>,
    pub end_position: usize,
    pub logits: &'a [f32],
}

/// An open checkpoint file, positioned after its last good record.
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    /// Tokens and key/value positions the file holds.
    tokens: usize,
    position: usize,
    bytes: u64,
    /// The layout the file's header declares: records appended follow it.
    version: u32,
    identity: Identity,
    /// Bytes of recurrent states in the file that a later record replaces, and of the last
    /// record's: once the replaced ones outweigh the rest, [`Journal::compact`] is due.
    superseded: u64,
    last_state: u64,
    /// A failed append could not be cut back yet: the next append cuts first.
    torn: bool,
}

pub(super) fn bad(path: &Path, what: impl std::fmt::Display) -> EngineError {
    EngineError::Checkpoint { path: path.to_path_buf(), reason: what.to_string() }
}

impl Journal {
    /// Opens the checkpoint at `path` for the generation `identity`: with its saved state if the
    /// file holds one for this generation, else a new file (replacing any other). The file is
    /// locked for as long as the journal lives: a second writer gets [`EngineError::CheckpointBusy`].
    pub fn open(path: &Path, identity: &Identity, layers: usize) -> Result<(Journal, Option<Saved>)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| bad(path, e))?;
        }
        // Opened without truncating, so that a file another writer holds is locked before
        // anything of it changes.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| bad(path, e))?;
        lock(&file, path)?;
        let len = file.metadata().map_err(|e| bad(path, e))?.len();
        let mut reader = Bounded::new(BufReader::new(&mut file), len);
        if let Some((header_end, version)) = read_header(&mut reader, identity) {
            let (saved, good_end, (superseded, last_state)) =
                replay(&mut reader, layers, version, Some(identity.prompt.len())).map_err(|e| bad(path, e))?;
            // A file with no state yet starts over in this build's layout (an older build must
            // not find prompt records in a file of its version).
            if saved.is_none() && version < VERSION {
                return Ok((Journal::create(path, file, identity)?, None));
            }
            let good_end = header_end + good_end;
            // Cut a torn tail so the next record follows the last good one.
            if good_end < len {
                file.set_len(good_end).map_err(|e| bad(path, e))?;
                file.sync_data().map_err(|e| bad(path, e))?;
            }
            file.seek(SeekFrom::Start(good_end)).map_err(|e| bad(path, e))?;
            let (tokens, position) = saved.as_ref().map_or((0, 0), |s| (s.tokens.len(), s.position));
            let journal = Journal {
                path: path.to_path_buf(),
                file,
                tokens,
                position,
                bytes: good_end,
                version,
                identity: identity.clone(),
                superseded,
                last_state,
                torn: false,
            };
            return Ok((journal, saved));
        }
        Ok((Journal::create(path, file, identity)?, None))
    }

    /// Starts `file` (locked) over with a header for `identity`.
    fn create(path: &Path, mut file: File, identity: &Identity) -> Result<Journal> {
        let header = header(path, identity)?;
        file.set_len(0).and_then(|_| file.seek(SeekFrom::Start(0))).map_err(|e| bad(path, e))?;
        file.write_all(&header).and_then(|_| file.sync_all()).map_err(|e| bad(path, e))?;
        // The file's directory entry is durable too (a new file after a crash).
        if let Some(dir) = path.parent().and_then(|d| File::open(d).ok()) {
            let _ = dir.sync_all();
        }
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            tokens: 0,
            position: 0,
            bytes: header.len() as u64,
            version: VERSION,
            identity: identity.clone(),
            superseded: 0,
            last_state: 0,
            torn: false,
        })
    }

    /// Tokens and key/value positions already saved.
    pub fn saved(&self) -> (usize, usize) {
        (self.tokens, self.position)
    }

    /// Bytes on disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Cuts the file back to its last whole record.
    fn cut_back(&mut self) -> std::io::Result<()> {
        self.file.set_len(self.bytes)?;
        self.file.seek(SeekFrom::Start(self.bytes))?;
        self.file.sync_data()
    }

    /// Appends what is new in `delta` and makes it durable (`fdatasync`) before returning.
    pub fn append(&mut self, delta: &Delta<'_>) -> Result<()> {
        let (record, state) = self.record(delta, self.tokens, self.position)?;
        if self.torn {
            self.cut_back().map_err(|e| bad(&self.path, e))?;
        }
        if let Err(e) = self.file.write_all(&record).and_then(|_| self.file.sync_data()) {
            // A part of the record may be on disk: cut it off, or every later record would
            // follow a torn one and be lost at replay while the file grew.
            self.torn = true;
            if self.cut_back().is_ok() {
                self.torn = false;
            }
            return Err(bad(&self.path, e));
        }
        self.tokens = delta.tokens.len();
        self.position = delta.end_position;
        self.bytes += record.len() as u64;
        self.superseded += std::mem::replace(&mut self.last_state, state);
        Ok(())
    }

    /// Whether the recurrent states later records replaced take more than half the file (each
    /// record holds a recurrent layer's whole state, so without compaction the file would grow
    /// by it at every checkpoint).
    pub fn wants_compaction(&self) -> bool {
        2 * self.superseded > self.bytes
    }

    /// Replaces the file with one holding `delta` alone, which must cover every position from
    /// the first: written beside it, made durable, then renamed over it, so a crash leaves
    /// either file whole.
    pub fn compact(&mut self, delta: &Delta<'_>) -> Result<()> {
        self.version = VERSION;
        let (record, state) = self.record(delta, 0, 0)?;
        // Locked before it takes the name: a writer opening the path after the rename finds
        // the new file already ours.
        let (file, bytes) = write_replacing(&self.path, &self.identity, &record, true)?;
        self.file = file;
        self.tokens = delta.tokens.len();
        self.position = delta.end_position;
        self.bytes = bytes;
        self.superseded = 0;
        self.last_state = state;
        self.torn = false;
        Ok(())
    }

    /// One record of what `delta` holds past `tokens_before` tokens and position `from`, in
    /// this file's layout.
    fn record(&self, delta: &Delta<'_>, tokens_before: usize, from: usize) -> Result<(Vec<u8>, u64)> {
        record(&self.path, self.version, delta, tokens_before, from)
    }
}

/// Writes a file of `identity`'s header and `record` beside `path` under a name of its own,
/// makes it durable, then renames it over `path` and makes the directory entry durable: a crash
/// leaves either file whole, never a part of the new one under the name. With `locked`, the new
/// file is locked before it takes the name. Returns it, positioned at its end, and its length.
fn write_replacing(path: &Path, identity: &Identity, record: &[u8], locked: bool) -> Result<(File, u64)> {
    let io = |e| bad(path, e);
    let mut bytes = header(path, identity)?;
    bytes.extend_from_slice(record);
    // Unique per writer: two models of the same weights may save the same state at once.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}-{n}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp).map_err(io)?;
    if locked {
        lock(&file, &tmp)?;
    }
    let written = file.write_all(&bytes).and_then(|_| file.sync_all()).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    if let Some(dir) = path.parent().and_then(|d| File::open(d).ok()) {
        let _ = dir.sync_all();
    }
    Ok((file, bytes.len() as u64))
}

/// Writes a whole state (`delta` covering every position from the first, in one record) to
/// `path` for `identity`, atomically ([`write_replacing`]). Returns the bytes written. The
/// thread state cache's files ([`crate::state_cache`]) are such files.
pub(crate) fn write_whole(path: &Path, identity: &Identity, delta: &Delta<'_>) -> Result<u64> {
    let (record, _) = record(path, VERSION, delta, 0, 0)?;
    Ok(write_replacing(path, identity, &record, false)?.1)
}

/// Reads a file [`write_whole`] wrote, without changing it: its identity and state. A file that
/// is not whole and intact (a bad header, a torn or damaged record, bytes after it) is an error
/// saying what is wrong, never a state.
pub(crate) fn read_whole(path: &Path, layers: usize) -> Result<(Identity, Saved)> {
    let file = File::open(path).map_err(|e| bad(path, e))?;
    let len = file.metadata().map_err(|e| bad(path, e))?.len();
    let mut reader = Bounded::new(BufReader::new(file), len);
    let (header_end, version, identity) =
        read_any_header(&mut reader).ok_or_else(|| bad(path, "no intact header of a version this build reads"))?;
    let (saved, good_end, _) = replay(&mut reader, layers, version, None).map_err(|e| bad(path, e))?;
    let saved = saved.ok_or_else(|| bad(path, "no intact record"))?;
    if header_end + good_end != len {
        return Err(bad(path, format!("{} bytes after the last intact record", len - header_end - good_end)));
    }
    Ok((identity, saved))
}

/// Takes the checkpoint's advisory lock (flock(2) on Unix, LockFileEx on Windows): one writer
/// per file, so a job whose lease expired while its holder slept cannot have two attempts
/// appending to the same journal. The lock goes with the file descriptor, so a crashed writer
/// holds none. A process this one forks holds a copy of the descriptor until it execs (the
/// daemon runs search commands; the tests run themselves again): a lock still held is asked again
/// for up to [`LOCK_PATIENCE`] before the file is called busy, far less than a second writer holds it.
fn lock(file: &File, path: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(EngineError::CheckpointBusy { path: path.to_path_buf() });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(bad(path, e)),
        }
    }
}

/// How long a held checkpoint lock is asked again: a forked child's copy of the descriptor goes
/// at its exec, within milliseconds.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

#[cfg(test)]
mod tests;
