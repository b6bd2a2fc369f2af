//! The journal's bytes: the header, a record's layout, and reading them back (see the
//! module above for the layout).

use std::io::Read;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use nightmail_formats::FormatError;
use nightmail_model::LayerSnapshot;

use super::{Delta, Identity, Saved, bad};
use crate::error::Result;

pub(super) const MAGIC: &[u8; 8] = b"NMRESUME";
/// Bumped whenever the layout changes; an older file is then read by its own layout, or
/// discarded, never misread.
pub(super) const VERSION: u32 = 3;
/// Each layer's snapshot in a record is preceded by its kind.
pub(super) const ROWS: u8 = 0;
pub(super) const STATE: u8 = 1;
pub(super) const RECORD: &[u8; 4] = b"NMRC";
/// Header: magic, version, length; record: magic, length, checksum.
pub(super) const HEADER_FIXED: usize = 8 + 4 + 4;
pub(super) const RECORD_FIXED: usize = 4 + 8 + 4;

/// One record, in the layout of `version`, of what `delta` holds past `tokens_before` tokens and
/// position `from`, and the bytes of recurrent state in it.
pub(super) fn record(
    path: &Path,
    version: u32,
    delta: &Delta<'_>,
    tokens_before: usize,
    from: usize,
) -> Result<(Vec<u8>, u64)> {
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
/// The bytes the recurrent states among `kv` take in a record.
pub(super) fn state_bytes(kv: &[LayerSnapshot]) -> u64 {
    let tensor = |t: &Tensor| (8 + 1 + 4 + 4 + 8 + t.elem_count() * t.dtype().size_in_bytes()) as u64;
    kv.iter()
        .map(|s| match s {
            LayerSnapshot::State(conv, recurrent) => 1 + tensor(conv) + tensor(recurrent),
            LayerSnapshot::Rows(..) => 0,
        })
        .sum()
}

/// A new file's header: magic, version, the identity's length, the identity, its checksum.
pub(super) fn header(path: &Path, identity: &Identity) -> Result<Vec<u8>> {
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
pub(super) struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R> Bounded<R> {
    /// `inner`, of which `left` bytes remain.
    pub(super) fn new(inner: R, left: u64) -> Self {
        Bounded { inner, left }
    }
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
pub(super) fn read_header(r: &mut Bounded<impl Read>, identity: &Identity) -> Option<(u64, u32)> {
    let (end, version, found) = read_any_header(r)?;
    (found == *identity).then_some((end, version))
}

/// The end of the header, the file's version and the identity it names, if the header is whole
/// and of a version this build reads.
pub(super) fn read_any_header(r: &mut Bounded<impl Read>) -> Option<(u64, u32, Identity)> {
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
pub(super) type Replayed = (Option<Saved>, u64, (u64, u64));

pub(super) fn replay(
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
pub(super) fn next_record(r: &mut Bounded<impl Read>) -> Option<Vec<u8>> {
    let head = r.bytes(RECORD_FIXED)?;
    if &head[..4] != RECORD {
        return None;
    }
    let len = usize::try_from(u64::from_le_bytes(head[4..12].try_into().ok()?)).ok()?;
    let crc = u32::from_le_bytes(head[12..16].try_into().ok()?);
    let payload = r.bytes(len)?;
    (crc32fast::hash(&payload) == crc).then_some(payload)
}

pub(super) struct Record {
    tokens_before: usize,
    tokens: Vec<u32>,
    sampler_position: u128,
    from: usize,
    to: usize,
    kv: Vec<LayerSnapshot>,
    logits: Vec<f32>,
}

pub(super) struct Reader<'a> {
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
pub(super) fn put_tensor(out: &mut Vec<u8>, t: &Tensor) -> Result<()> {
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
