//! Page-aligned heap buffers: `O_DIRECT` reads need the buffer, the file offset and the length
//! aligned to the device's logical block (open(2), "O_DIRECT"); 4 KiB covers every device here.

use std::ops::Range;
use std::sync::{Arc, Mutex};

/// The alignment of every buffer and direct read.
pub const ALIGN: usize = 4096;

/// A buffer whose start is aligned to [`ALIGN`] and whose length is a multiple of it: an
/// anonymous memory map, recycled through a small pool. (From malloc, buffers of an expert's
/// size come from per-thread arenas after the first few frees and the process keeps freed ones:
/// RSS grew past the cache budget by half. A fresh map per read costs the kernel a page clear
/// per 4 KiB: a third of decode time. Evicted experts' maps are handed to the next reads.)
pub struct AlignedBuf {
    map: Option<memmap2::MmapMut>,
}

/// Maps waiting for reuse, by length; at most [`POOL_BYTES`] in all. The pool sits outside the
/// cache's budget, so it is kept small: it only bridges an eviction and the next reads.
static POOL: Mutex<Vec<memmap2::MmapMut>> = Mutex::new(Vec::new());
const POOL_BYTES: usize = 8 << 20;

impl AlignedBuf {
    /// A buffer of at least `len` bytes (rounded up to [`ALIGN`]); its contents are unspecified.
    pub fn new(len: usize) -> Self {
        let len = len.max(1).next_multiple_of(ALIGN);
        let reused = {
            let mut pool = POOL.lock().expect("buffer pool lock");
            pool.iter().position(|m| m.len() == len).map(|i| pool.swap_remove(i))
        };
        let map = reused.unwrap_or_else(|| {
            memmap2::MmapMut::map_anon(len).unwrap_or_else(|e| panic!("cannot map {len} bytes: {e}"))
        });
        debug_assert!((map.as_ptr() as usize).is_multiple_of(ALIGN));
        AlignedBuf { map: Some(map) }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        self.map.as_deref().expect("a live buffer has its map")
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().expect("a live buffer has its map")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let Some(map) = self.map.take() else { return };
        let mut pool = POOL.lock().expect("buffer pool lock");
        if pool.iter().map(|m| m.len()).sum::<usize>() + map.len() <= POOL_BYTES {
            pool.push(map);
        }
    }
}

/// Weight bytes a matrix computes from without copying them: its own vector (read from a mapped
/// file at load), or a range of a shared buffer that a streamed expert was read into.
#[derive(Clone)]
pub enum WeightBytes {
    Owned(Arc<Vec<u8>>),
    Shared(Arc<AlignedBuf>, Range<usize>),
}

impl WeightBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            WeightBytes::Owned(v) => v,
            WeightBytes::Shared(buf, range) => &buf.as_slice()[range.clone()],
        }
    }
}

impl From<&[u8]> for WeightBytes {
    fn from(bytes: &[u8]) -> Self {
        WeightBytes::Owned(Arc::new(bytes.to_vec()))
    }
}
