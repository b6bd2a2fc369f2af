//! Page-aligned heap buffers: `O_DIRECT` reads need the buffer, the file offset and the length
//! aligned to the device's logical block (open(2), "O_DIRECT"); 4 KiB covers every device here.

use std::ops::Range;
use std::sync::Arc;

/// The alignment of every buffer and direct read.
pub const ALIGN: usize = 4096;

/// A buffer whose start is aligned to [`ALIGN`] and whose length is a multiple of it: an
/// anonymous memory map of its own, so that dropping it returns the memory to the system at once.
/// (From malloc, buffers of an expert's size come from per-thread arenas after the first few
/// frees, and the process keeps freed ones: RSS grew past the cache budget by half.)
pub struct AlignedBuf {
    map: memmap2::MmapMut,
}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes (rounded up to [`ALIGN`]).
    pub fn new(len: usize) -> Self {
        let len = len.max(1).next_multiple_of(ALIGN);
        let map = memmap2::MmapMut::map_anon(len).unwrap_or_else(|e| panic!("cannot map {len} bytes: {e}"));
        debug_assert!((map.as_ptr() as usize).is_multiple_of(ALIGN));
        AlignedBuf { map }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map
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
