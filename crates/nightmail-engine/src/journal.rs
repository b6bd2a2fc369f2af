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

use crate::error::EngineError;
use nightmail_formats::FormatError;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::sampling::Sampling;
use nightmail_model::LayerSnapshot;

const MAGIC: &[u8; 8] = b"NMRESUME";
/// Bumped whenever the layout changes; an older file is then read by its own layout, or
/// discarded, never misread.
const VERSION: u32 = 3;
/// Each layer's snapshot in a record is preceded by its kind.
const ROWS: u8 = 0;
const STATE: u8 = 1;
const RECORD: &[u8; 4] = b"NMRC";
/// Header: magic, version, length; record: magic, length, checksum.
const HEADER_FIXED: usize = 8 + 4 + 4;
const RECORD_FIXED: usize = 4 + 8 + 4;

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
const HEADER_DIGEST_BYTES: u64 = 1 << 20;

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

fn bad(path: &Path, what: impl std::fmt::Display) -> EngineError {
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
        let mut reader = Bounded { inner: BufReader::new(&mut file), left: len };
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

/// One record, in the layout of `version`, of what `delta` holds past `tokens_before` tokens and
/// position `from`, and the bytes of recurrent state in it.
fn record(path: &Path, version: u32, delta: &Delta<'_>, tokens_before: usize, from: usize) -> Result<(Vec<u8>, u64)> {
    let mut p = Vec::new();
    let new = &delta.tokens[tokens_before..];
    p.extend_from_slice(&(tokens_before as u64).to_le_bytes());
    p.extend_from_slice(&(new.len() as u32).to_le_bytes());
    for t in new {
        p.extend_from_slice(&t.to_le_bytes());
    }
    p.extend_from_slice(&delta.sampler_position.to_le_bytes());
    p.extend_from_slice(&(from as u64).to_le_bytes());
    p.extend_from_slice(&(delta.end_position as u64).to_le_bytes());
    for snapshot in &delta.kv {
        match snapshot {
            LayerSnapshot::Rows(k, v) => {
                // A version 1 file (resumed after an upgrade) goes on in its own layout.
                if version >= 2 {
                    p.push(ROWS);
                }
                put_tensor(&mut p, k)?;
                put_tensor(&mut p, v)?;
            }
            // Version 1 files were written only for models without recurrent layers, whose
            // network shape differs from any model with them.
            LayerSnapshot::State(..) if version < 2 => {
                return Err(bad(path, "a recurrent state in a version 1 checkpoint"));
            }
            LayerSnapshot::State(conv, recurrent) => {
                p.push(STATE);
                for t in [conv, recurrent] {
                    p.extend_from_slice(&(t.dim(2)? as u64).to_le_bytes());
                    put_tensor(&mut p, t)?;
                }
            }
        }
    }
    p.extend_from_slice(&(delta.logits.len() as u32).to_le_bytes());
    for l in delta.logits {
        p.extend_from_slice(&l.to_le_bytes());
    }
    let mut record = Vec::with_capacity(RECORD_FIXED + p.len());
    record.extend_from_slice(RECORD);
    record.extend_from_slice(&(p.len() as u64).to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    record.extend_from_slice(&p);
    Ok((record, state_bytes(&delta.kv)))
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
    let mut reader = Bounded { inner: BufReader::new(file), left: len };
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

/// The bytes the recurrent states among `kv` take in a record.
fn state_bytes(kv: &[LayerSnapshot]) -> u64 {
    let tensor = |t: &Tensor| (8 + 1 + 4 + 4 + 8 + t.elem_count() * t.dtype().size_in_bytes()) as u64;
    kv.iter()
        .map(|s| match s {
            LayerSnapshot::State(conv, recurrent) => 1 + tensor(conv) + tensor(recurrent),
            LayerSnapshot::Rows(..) => 0,
        })
        .sum()
}

/// A new file's header: magic, version, the identity's length, the identity, its checksum.
fn header(path: &Path, identity: &Identity) -> Result<Vec<u8>> {
    let id = serde_json::to_vec(identity).map_err(|e| bad(path, e))?;
    let mut header = Vec::with_capacity(HEADER_FIXED + id.len() + 4);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&(id.len() as u32).to_le_bytes());
    header.extend_from_slice(&id);
    header.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
    Ok(header)
}

/// A reader that knows how many bytes of the file are left, so that no length read from a
/// damaged file makes us allocate more than the file holds.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Bounded<R> {
    /// The next `n` bytes, or `None` if the file ends first.
    fn bytes(&mut self, n: usize) -> Option<Vec<u8>> {
        if n as u64 > self.left {
            return None;
        }
        let mut buf = vec![0; n];
        self.inner.read_exact(&mut buf).ok()?;
        self.left -= n as u64;
        Some(buf)
    }
}

/// The end of the header and the file's version, if the header is whole, of a version this
/// build reads, and names this generation.
fn read_header(r: &mut Bounded<impl Read>, identity: &Identity) -> Option<(u64, u32)> {
    let (end, version, found) = read_any_header(r)?;
    (found == *identity).then_some((end, version))
}

/// The end of the header, the file's version and the identity it names, if the header is whole
/// and of a version this build reads.
fn read_any_header(r: &mut Bounded<impl Read>) -> Option<(u64, u32, Identity)> {
    let fixed = r.bytes(HEADER_FIXED)?;
    if &fixed[..8] != MAGIC {
        return None;
    }
    let version = u32::from_le_bytes(fixed[8..12].try_into().ok()?);
    let len = u32::from_le_bytes(fixed[12..16].try_into().ok()?) as usize;
    if !(1..=VERSION).contains(&version) {
        return None;
    }
    let id = r.bytes(len)?;
    let crc = u32::from_le_bytes(r.bytes(4)?.try_into().ok()?);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&fixed);
    hasher.update(&id);
    if hasher.finalize() != crc {
        return None;
    }
    let found: Identity = serde_json::from_slice(&id).ok()?;
    Some(((HEADER_FIXED + len + 4) as u64, version, found))
}

/// Applies the records in order; returns the state and the length of the good prefix.
/// What [`replay`] found: the state, the length of the good prefix, and the recurrent-state
/// bytes of all records but the last and of the last.
type Replayed = (Option<Saved>, u64, (u64, u64));

fn replay(
    r: &mut Bounded<impl Read>,
    layers: usize,
    version: u32,
    prompt: Option<usize>,
) -> std::result::Result<Replayed, String> {
    let mut at = 0;
    let (mut superseded, mut last_state) = (0, 0);
    let mut tokens: Vec<u32> = Vec::new();
    let mut position = 0usize;
    let mut chunks: Vec<Vec<LayerSnapshot>> = Vec::new();
    let mut last: Option<(u128, Vec<f32>)> = None;
    while let Some(payload) = next_record(r) {
        let mut r = Reader { bytes: &payload, at: 0 };
        let Some(parsed) = r.record(layers, version) else { break };
        if parsed.tokens_before != tokens.len() || parsed.from != position {
            break;
        }
        // In a checkpoint (`prompt`: its length), a record without logits is a prompt part:
        // nothing drawn yet, short of the prompt's end. A thread state has no logits at all.
        let part = |end: usize| tokens.is_empty() && parsed.tokens.is_empty() && parsed.to < end;
        if parsed.logits.is_empty() && prompt.is_some_and(|end| !part(end)) {
            break;
        }
        tokens.extend(parsed.tokens);
        position = parsed.to;
        superseded += std::mem::replace(&mut last_state, state_bytes(&parsed.kv));
        chunks.push(parsed.kv);
        last = Some((parsed.sampler_position, parsed.logits));
        at += (RECORD_FIXED + payload.len()) as u64;
    }
    let Some((sampler_position, logits)) = last else { return Ok((None, at, (0, 0))) };
    let mut kv = Vec::with_capacity(layers);
    for l in 0..layers {
        let (mut ks, mut vs, mut state) = (Vec::new(), Vec::new(), None);
        for chunk in &chunks {
            match &chunk[l] {
                LayerSnapshot::Rows(k, v) => {
                    ks.push(k);
                    vs.push(v);
                }
                LayerSnapshot::State(conv, recurrent) => state = Some((conv, recurrent)),
            }
        }
        kv.push(match (state, ks.is_empty()) {
            (Some((conv, recurrent)), true) => LayerSnapshot::State(conv.clone(), recurrent.clone()),
            (None, false) => LayerSnapshot::Rows(
                Tensor::cat(&ks, 2).map_err(|e| e.to_string())?,
                Tensor::cat(&vs, 2).map_err(|e| e.to_string())?,
            ),
            _ => return Err(format!("layer {l} changes kind between records")),
        });
    }
    Ok((Some(Saved { tokens, sampler_position, kv, position, logits }), at, (superseded, last_state)))
}

/// The payload of the next record if it is whole and intact.
fn next_record(r: &mut Bounded<impl Read>) -> Option<Vec<u8>> {
    let head = r.bytes(RECORD_FIXED)?;
    if &head[..4] != RECORD {
        return None;
    }
    let len = usize::try_from(u64::from_le_bytes(head[4..12].try_into().ok()?)).ok()?;
    let crc = u32::from_le_bytes(head[12..16].try_into().ok()?);
    let payload = r.bytes(len)?;
    (crc32fast::hash(&payload) == crc).then_some(payload)
}

struct Record {
    tokens_before: usize,
    tokens: Vec<u32>,
    sampler_position: u128,
    from: usize,
    to: usize,
    kv: Vec<LayerSnapshot>,
    logits: Vec<f32>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<usize> {
        usize::try_from(u64::from_le_bytes(self.take(8)?.try_into().ok()?)).ok()
    }

    fn record(&mut self, layers: usize, version: u32) -> Option<Record> {
        let tokens_before = self.u64()?;
        let count = self.u32()? as usize;
        let tokens =
            self.take(count.checked_mul(4)?)?.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let tokens = tokens.collect();
        let sampler_position = u128::from_le_bytes(self.take(16)?.try_into().ok()?);
        let (from, to) = (self.u64()?, self.u64()?);
        let rows = to.checked_sub(from)?;
        let mut kv = Vec::with_capacity(layers);
        for _ in 0..layers {
            let kind = if version >= 2 { self.take(1)?[0] } else { ROWS };
            kv.push(match kind {
                ROWS => LayerSnapshot::Rows(self.tensor(rows)?, self.tensor(rows)?),
                STATE => {
                    let conv = self.u64().and_then(|n| self.tensor(n))?;
                    LayerSnapshot::State(conv, self.u64().and_then(|n| self.tensor(n))?)
                }
                _ => return None,
            });
        }
        let n = self.u32()? as usize;
        let logits =
            self.take(n.checked_mul(4)?)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let logits = logits.collect();
        (self.at == self.bytes.len()).then_some(Record {
            tokens_before,
            tokens,
            sampler_position,
            from,
            to,
            kv,
            logits,
        })
    }

    fn tensor(&mut self, rows: usize) -> Option<Tensor> {
        let dtype = match self.take(1)?[0] {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::BF16,
            _ => return None,
        };
        let (heads, dim) = (self.u32()? as usize, self.u32()? as usize);
        let len = self.u64()?;
        if heads.checked_mul(rows)?.checked_mul(dim)?.checked_mul(dtype.size_in_bytes())? != len {
            return None;
        }
        let raw = self.take(len)?;
        Tensor::from_raw_buffer(raw, dtype, &[1, heads, rows, dim], &Device::Cpu).ok()
    }
}

/// Writes `[1, heads, rows, dim]` as dtype, heads, dim, byte length and the little-endian bytes.
fn put_tensor(out: &mut Vec<u8>, t: &Tensor) -> Result<()> {
    let (_, heads, _, dim) = t.dims4()?;
    let t = t.contiguous()?;
    let tag: u8 = match t.dtype() {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        other => {
            return Err(FormatError::Unsupported {
                what: format!("a {other:?} key/value cache in a checkpoint"),
                hint: "keep the cache in F32, F16 or BF16".into(),
            }
            .into());
        }
    };
    let flat = t.flatten_all()?;
    let bytes: Vec<u8> = match t.dtype() {
        DType::F16 => flat.to_vec1::<half::f16>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::BF16 => flat.to_vec1::<half::bf16>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => flat.to_vec1::<f32>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    out.push(tag);
    out.extend_from_slice(&(heads as u32).to_le_bytes());
    out.extend_from_slice(&(dim as u32).to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    fn identity() -> Identity {
        Identity {
            model: "m".into(),
            network: vec![2, 4],
            weights: Vec::new(),
            prompt: vec![1, 2, 3],
            sampling: Sampling::greedy(),
            stop: Vec::new(),
            stop_at_eos: true,
            template: None,
            tool_calls: None,
        }
    }

    fn rows(from: usize, to: usize) -> Vec<(Tensor, Tensor)> {
        (0..2)
            .map(|l| {
                let n = to - from;
                let k: Vec<f32> = (0..2 * n * 3).map(|i| (l * 1000 + from * 10 + i) as f32).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                (
                    Tensor::from_vec(k, (1, 2, n, 3), &Device::Cpu).unwrap(),
                    Tensor::from_vec(v, (1, 2, n, 3), &Device::Cpu).unwrap(),
                )
            })
            .collect()
    }

    fn append(j: &mut Journal, tokens: &[u32], to: usize) {
        let from = j.saved().1;
        let logits = vec![tokens.len() as f32; 5];
        j.append(&Delta {
            tokens,
            sampler_position: tokens.len() as u128 * 7,
            kv: rows(from, to).into_iter().map(|(k, v)| LayerSnapshot::Rows(k, v)).collect(),
            end_position: to,
            logits: &logits,
        })
        .unwrap();
    }

    /// A record without logits up to position `to`, after `tokens`.
    fn part(j: &mut Journal, tokens: &[u32], to: usize) {
        let from = j.saved().1;
        let kv = rows(from, to).into_iter().map(|(k, v)| LayerSnapshot::Rows(k, v)).collect();
        j.append(&Delta { tokens, sampler_position: 0, kv, end_position: to, logits: &[] }).unwrap();
    }

    #[test]
    fn prompt_parts_replay_short_of_the_prompt_and_never_after_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let eight = Identity { prompt: (1..=8).collect(), ..identity() };
        let (mut j, _) = Journal::open(&path, &eight, 2).unwrap();
        part(&mut j, &[], 3);
        part(&mut j, &[], 5);
        let good = std::fs::metadata(&path).unwrap().len();
        // Not a prompt part: it ends at the prompt's end, where logits are due.
        part(&mut j, &[], 8);
        drop(j);
        let (mut j, saved) = Journal::open(&path, &eight, 2).unwrap();
        let saved = saved.expect("two prompt parts");
        assert_eq!((saved.position, saved.tokens.len(), saved.logits.len()), (5, 0, 0));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
        append(&mut j, &[10], 9);
        let good = std::fs::metadata(&path).unwrap().len();
        part(&mut j, &[10], 10);
        drop(j);
        let (_, saved) = Journal::open(&path, &eight, 2).unwrap();
        let saved = saved.unwrap();
        assert_eq!((saved.position, saved.tokens, saved.logits), (9, vec![10], vec![1.0; 5]));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "no prompt part after a token");
    }

    #[test]
    fn records_replay_into_the_state_saved_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let (mut j, saved) = Journal::open(&path, &identity(), 2).unwrap();
        assert!(saved.is_none());
        append(&mut j, &[10], 4);
        append(&mut j, &[10, 11, 12], 6);
        let good = std::fs::metadata(&path).unwrap().len();
        append(&mut j, &[10, 11, 12, 13], 7);
        drop(j);
        // A write torn half-way through the last record.
        let full = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(good + (full - good) / 2).unwrap();
        drop(f);

        let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
        let saved = saved.expect("the first two records");
        assert_eq!(saved.tokens, vec![10, 11, 12]);
        assert_eq!(saved.sampler_position, 21);
        assert_eq!(saved.logits, vec![3.0; 5]);
        assert_eq!(j.saved(), (3, 6));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "the torn record is cut off");
        let all = rows(0, 4).into_iter().zip(rows(4, 6));
        assert_eq!(saved.position, 6);
        for (snapshot, ((k0, v0), (k1, v1))) in saved.kv.iter().zip(all) {
            let LayerSnapshot::Rows(k, v) = snapshot else { panic!("attention layers restore rows") };
            let want_k = Tensor::cat(&[&k0, &k1], 2).unwrap();
            let want_v = Tensor::cat(&[&v0, &v1], 2).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(flat(k), flat(&want_k));
            assert_eq!(flat(v), flat(&want_v));
        }
    }

    #[test]
    fn a_flipped_byte_ends_the_replay_at_the_record_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
        append(&mut j, &[10], 4);
        let first = std::fs::metadata(&path).unwrap().len() as usize;
        append(&mut j, &[10, 11], 5);
        drop(j);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[first + RECORD_FIXED + 3] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
        assert_eq!(saved.unwrap().tokens, vec![10]);
    }

    #[test]
    fn a_checkpoint_of_another_generation_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
        append(&mut j, &[10], 4);
        drop(j);
        let other = Identity { prompt: vec![1, 2, 4], ..identity() };
        let (j, saved) = Journal::open(&path, &other, 2).unwrap();
        assert!(saved.is_none());
        assert_eq!(j.saved(), (0, 0));
        drop(j);
        // ... and the file now belongs to the new generation.
        let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
        assert!(saved.is_none());
    }

    /// Two attempts of one job (the first's lease expired while it still ran) must not append
    /// to one journal: the second is refused, and the file is the first's, untouched.
    #[test]
    fn a_second_writer_is_refused_while_the_first_holds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let (mut first, _) = Journal::open(&path, &identity(), 2).unwrap();
        append(&mut first, &[10], 4);
        let before = std::fs::read(&path).unwrap();
        // Even one for another generation, which would otherwise start the file over.
        let other = Identity { prompt: vec![9], ..identity() };
        let Err(e) = Journal::open(&path, &other, 2) else { panic!("a second writer opened the checkpoint") };
        assert!(matches!(e, EngineError::CheckpointBusy { .. }), "{e}");
        assert!(e.to_string().contains("being written by another generation"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "the refused writer changed the file");
        append(&mut first, &[10, 11], 5);
        drop(first);
        let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
        assert_eq!(saved.unwrap().tokens, vec![10, 11]);
    }

    /// Set in the child process that [`a_failed_append_is_cut_back_to_the_last_whole_record`]
    /// starts, to the directory it works in.
    const FSIZE_CHILD: &str = "NIGHTMAIL_TEST_FSIZE_CHILD";

    /// A write that fails half-way (here: past `RLIMIT_FSIZE`, which writes what fits and then
    /// fails with `EFBIG`, as a full disk does) must not leave a torn record for the next ones to
    /// follow. The limit is a process's, so the test runs in a child: this test binary again,
    /// filtered to this test.
    #[test]
    fn a_failed_append_is_cut_back_to_the_last_whole_record() {
        if let Some(dir) = std::env::var_os(FSIZE_CHILD) {
            return failed_append_in_child(Path::new(&dir));
        }
        let dir = tempfile::tempdir().unwrap();
        let name = concat!(module_path!(), "::a_failed_append_is_cut_back_to_the_last_whole_record");
        let name = name.split_once("::").unwrap().1;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(FSIZE_CHILD, dir.path())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        assert!(log.contains("1 passed"), "the child ran no test: {log}");
    }

    fn failed_append_in_child(dir: &Path) {
        let path = dir.join("job.ckpt");
        let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
        append(&mut j, &[10], 4);
        let good = std::fs::metadata(&path).unwrap().len();
        assert_eq!(j.bytes(), good);
        let set_limit = |soft: libc::rlim_t| {
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: plain libc calls on a valid rlimit; the signal is ignored so that a write
            // past the limit fails with EFBIG instead of killing the process.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim), 0);
                lim.rlim_cur = soft.min(lim.rlim_max);
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
            }
        };
        // Room for a part of the next record only.
        set_limit((good + 40) as libc::rlim_t);
        let logits = vec![2.0; 5];
        let kv = rows(4, 5).into_iter().map(|(k, v)| LayerSnapshot::Rows(k, v)).collect();
        let delta = Delta { tokens: &[10, 11], sampler_position: 14, kv, end_position: 5, logits: &logits };
        let Err(e) = j.append(&delta) else { panic!("the append past RLIMIT_FSIZE succeeded") };
        assert!(e.to_string().contains("job.ckpt"), "{e}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "the torn record was left in the file");
        assert_eq!((j.bytes(), j.saved()), (good, (1, 4)));

        // Space again: the next append follows the last whole record and is replayed.
        set_limit(libc::RLIM_INFINITY);
        append(&mut j, &[10, 11, 12], 6);
        drop(j);
        let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
        assert_eq!(saved.expect("both records").tokens, vec![10, 11, 12]);
    }

    /// The same path and shape with other weights (re-downloaded, re-quantized, edited) is
    /// another model: its size, mtime or header digest tells.
    #[test]
    fn a_checkpoint_of_other_weights_at_the_same_path_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.gguf");
        std::fs::write(&model, [b"GGUF".as_slice(), &[7u8; 4096]].concat()).unwrap();
        let with_weights = || Identity { weights: WeightsFile::of(&model).unwrap(), ..identity() };
        let path = dir.path().join("job.ckpt");
        let (mut j, _) = Journal::open(&path, &with_weights(), 2).unwrap();
        append(&mut j, &[10], 4);
        drop(j);
        let (j, saved) = Journal::open(&path, &with_weights(), 2).unwrap();
        assert_eq!(saved.expect("the same weights resume").tokens, vec![10]);
        drop(j);

        // One byte of the header changed, with the size and mtime as they were.
        let f = OpenOptions::new().write(true).open(&model).unwrap();
        let mtime = f.metadata().unwrap().modified().unwrap();
        f.write_all_at(b"X", 10).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        assert_eq!(with_weights().weights[0].modified, identity_modified(&mtime));
        let (mut j, saved) = Journal::open(&path, &with_weights(), 2).unwrap();
        assert!(saved.is_none(), "a checkpoint of another header was resumed");
        append(&mut j, &[20], 4);
        drop(j);

        // Only the mtime changed (a copy without -p, or a rewrite of the same bytes).
        let f = OpenOptions::new().write(true).open(&model).unwrap();
        f.set_modified(mtime + std::time::Duration::from_secs(5)).unwrap();
        drop(f);
        let (_, saved) = Journal::open(&path, &with_weights(), 2).unwrap();
        assert!(saved.is_none(), "a checkpoint of weights with another mtime was resumed");
    }

    fn identity_modified(t: &std::time::SystemTime) -> u128 {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    }

    #[test]
    fn garbage_is_not_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        std::fs::write(&path, b"NMRESUME\x01\x00\x00\x00\xff\xff\xff\xffnonsense").unwrap();
        let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
        assert!(saved.is_none());
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// A recurrent layer's state `[1, 1, 3, 4]` and `[1, 2, 4, 4]` filled with `x`.
    fn state(x: f32) -> LayerSnapshot {
        LayerSnapshot::State(
            Tensor::full(x, (1, 1, 3, 4), &Device::Cpu).unwrap(),
            Tensor::full(-x, (1, 2, 4, 4), &Device::Cpu).unwrap(),
        )
    }

    #[test]
    fn a_recurrent_layer_restores_its_latest_state_beside_an_attention_layers_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
        for (tokens, from, to, x) in [(&[10u32][..], 0, 4, 1.0), (&[10, 11][..], 4, 5, 2.0)] {
            let (k, v) = rows(from, to).remove(0);
            let kv = vec![LayerSnapshot::Rows(k, v), state(x)];
            j.append(&Delta { tokens, sampler_position: 0, kv, end_position: to, logits: &[0.5] }).unwrap();
        }
        drop(j);
        let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
        let saved = saved.unwrap();
        assert_eq!((saved.position, j.saved()), (5, (2, 5)));
        let LayerSnapshot::Rows(k, _) = &saved.kv[0] else { panic!("layer 0 holds rows") };
        assert_eq!(k.dims(), [1, 2, 5, 3], "the rows of both records, appended");
        let LayerSnapshot::State(conv, recurrent) = &saved.kv[1] else { panic!("layer 1 holds a state") };
        assert_eq!((conv.dims(), recurrent.dims()), ([1, 1, 3, 4].as_slice(), [1, 2, 4, 4].as_slice()));
        assert!(flat(conv).iter().all(|x| *x == 2.0) && flat(recurrent).iter().all(|x| *x == -2.0), "the latest state");
    }

    #[test]
    fn a_version_1_file_without_layer_kinds_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        // Version 1's header and one record: the same fields, no kind byte before each layer.
        let id = serde_json::to_vec(&identity()).unwrap();
        let mut file = Vec::new();
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&1u32.to_le_bytes());
        file.extend_from_slice(&(id.len() as u32).to_le_bytes());
        file.extend_from_slice(&id);
        file.extend_from_slice(&crc32fast::hash(&file).to_le_bytes());
        let mut p = Vec::new();
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&10u32.to_le_bytes());
        p.extend_from_slice(&7u128.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&4u64.to_le_bytes());
        for (k, v) in rows(0, 4) {
            put_tensor(&mut p, &k).unwrap();
            put_tensor(&mut p, &v).unwrap();
        }
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&0.25f32.to_le_bytes());
        file.extend_from_slice(RECORD);
        file.extend_from_slice(&(p.len() as u64).to_le_bytes());
        file.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
        file.extend_from_slice(&p);
        std::fs::write(&path, &file).unwrap();
        let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
        let saved = saved.expect("a version 1 record");
        assert_eq!((saved.tokens, saved.sampler_position, saved.position), (vec![10], 7, 4));
        assert_eq!(j.saved(), (1, 4));
        for (got, (k, _)) in saved.kv.iter().zip(rows(0, 4)) {
            let LayerSnapshot::Rows(got, _) = got else { panic!("version 1 holds rows") };
            assert_eq!(flat(got), flat(&k));
        }
        // Resumed after an upgrade, the generation goes on in the file's own layout.
        let mut j = j;
        append(&mut j, &[10, 11], 6);
        drop(j);
        let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
        let saved = saved.unwrap();
        assert_eq!((saved.tokens, saved.position), (vec![10, 11], 6));
    }

    #[test]
    fn replaced_recurrent_states_are_compacted_away_and_the_state_survives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
        let mut tokens = Vec::new();
        let (mut compactions, mut appended) = (0, j.bytes());
        for step in 0..40usize {
            tokens.push(step as u32);
            let (from, to) = (j.saved().1, step + 1);
            let all = |from: usize| -> Vec<LayerSnapshot> {
                // Row values that depend on the position alone, so any split concatenates alike.
                let values: Vec<f32> = (0..2)
                    .flat_map(|h| (from..to).flat_map(move |p| (0..3).map(move |d| (p * 100 + h * 10 + d) as f32)))
                    .collect();
                let k = Tensor::from_vec(values, (1, 2, to - from, 3), &Device::Cpu).unwrap();
                let v = k.neg().unwrap();
                // A recurrent state far larger than a token's rows, as KDA's is.
                let x = step as f32;
                let conv = Tensor::full(x, (1, 1, 3, 16), &Device::Cpu).unwrap();
                let s = Tensor::full(-x, (1, 4, 16, 16), &Device::Cpu).unwrap();
                vec![LayerSnapshot::Rows(k, v), LayerSnapshot::State(conv, s)]
            };
            let delta = Delta {
                tokens: &tokens,
                sampler_position: step as u128,
                kv: all(from),
                end_position: to,
                logits: &[1.0],
            };
            let before = j.bytes();
            j.append(&delta).unwrap();
            appended += j.bytes() - before;
            if j.wants_compaction() {
                j.compact(&Delta { kv: all(0), ..delta }).unwrap();
                compactions += 1;
            }
            assert_eq!(std::fs::metadata(&path).unwrap().len(), j.bytes());
            // Never more than twice what the live state needs (plus the record just added).
            assert!(j.bytes() <= 2 * (j.bytes() - j.superseded) + 1024, "step {step}: {} bytes", j.bytes());
        }
        assert!(compactions >= 2, "{compactions} compactions");
        assert!(j.bytes() * 4 < appended, "{} bytes kept of {appended} appended", j.bytes());
        // The file compaction renamed into place is locked as the old one was.
        assert!(matches!(Journal::open(&path, &identity(), 2), Err(EngineError::CheckpointBusy { .. })));
        drop(j);
        let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
        let saved = saved.unwrap();
        assert_eq!((saved.tokens.len(), saved.position, saved.sampler_position, j.saved()), (40, 40, 39, (40, 40)));
        let LayerSnapshot::Rows(k, _) = &saved.kv[0] else { panic!("rows") };
        let want: Vec<f32> = (0..2)
            .flat_map(|h| (0..40).flat_map(move |p| (0..3).map(move |d| (p * 100 + h * 10 + d) as f32)))
            .collect();
        assert_eq!(flat(k), want, "every position's rows, across compactions");
        let LayerSnapshot::State(conv, _) = &saved.kv[1] else { panic!("a state") };
        assert!(flat(conv).iter().all(|x| *x == 39.0), "the latest state");
    }
}
