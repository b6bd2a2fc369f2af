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

/// Maps waiting for reuse, oldest first: at most [`POOL_BYTES`] of them besides the maps of the
/// lengths reserved ([`reserve_pool`]: a stream of dense layers' buffers, an expert store's
/// queued reads). The pool sits outside the
/// budget, so it is kept small: it only bridges a release and the next reads. When it is full
/// the oldest maps go, so that lengths no longer read (the disk probe's) do not hold it.
static POOL: Mutex<Pool> = Mutex::new(Pool { maps: Vec::new(), kept: Vec::new() });
const POOL_BYTES: usize = 8 << 20;

struct Pool {
    maps: Vec<memmap2::MmapMut>,
    /// Reserved lengths and how many maps of each (a length reserved twice keeps two).
    kept: Vec<(usize, usize)>,
}

impl Pool {
    fn take(&mut self, len: usize) -> Option<memmap2::MmapMut> {
        let i = self.maps.iter().rposition(|m| m.len() == len)?;
        Some(self.maps.remove(i))
    }

    /// The maps over the limit, oldest first, taken out (to be unmapped outside the lock).
    fn trim(&mut self) -> Vec<memmap2::MmapMut> {
        let mut kept = self.kept.clone();
        let mut reserved = vec![false; self.maps.len()];
        for (i, m) in self.maps.iter().enumerate().rev() {
            if let Some((_, n)) = kept.iter_mut().find(|(l, n)| *l == m.len() && *n > 0) {
                *n -= 1;
                reserved[i] = true;
            }
        }
        let mut over = self.maps.iter().zip(&reserved).filter(|(_, r)| !**r).map(|(m, _)| m.len()).sum::<usize>();
        let mut gone = Vec::new();
        let mut i = 0;
        for keep in reserved {
            if over > POOL_BYTES && !keep {
                over -= self.maps[i].len();
                gone.push(self.maps.remove(i));
            } else {
                i += 1;
            }
        }
        gone
    }
}

/// Let the pool keep one map of each of these lengths besides its usual bytes: a streamed
/// layer's read buffers, since the layer a step releases is what the read-ahead reads into next
/// while the window it left is free (with layers of one shape the memory stays in the budget).
/// A map faulted in once is read into again without a page fault: into a fresh map each
/// O_DIRECT read first faults in and clears its pages, CPU time the kernel takes from the
/// threads that submit the reads, and with two cores busy computing the disk then idles
/// (measured here: 1.2 GB/s into reused buffers, 0.55 GB/s into fresh ones with both cores busy).
pub fn reserve_pool(lens: &[usize]) {
    let mut pool = POOL.lock().expect("buffer pool lock");
    for l in lens {
        let l = l.next_multiple_of(ALIGN);
        match pool.kept.iter_mut().find(|(k, _)| *k == l) {
            Some((_, n)) => *n += 1,
            None => pool.kept.push((l, 1)),
        }
    }
}

/// Give back what [`reserve_pool`] took.
pub fn unreserve_pool(lens: &[usize]) {
    let gone = {
        let mut pool = POOL.lock().expect("buffer pool lock");
        for l in lens {
            let l = l.next_multiple_of(ALIGN);
            if let Some(i) = pool.kept.iter().position(|&(k, _)| k == l) {
                pool.kept[i].1 -= 1;
                if pool.kept[i].1 == 0 {
                    pool.kept.swap_remove(i);
                }
            }
        }
        pool.trim()
    };
    drop(gone);
}

impl AlignedBuf {
    /// A buffer of at least `len` bytes (rounded up to [`ALIGN`]); its contents are unspecified.
    pub fn new(len: usize) -> Self {
        let len = len.max(1).next_multiple_of(ALIGN);
        let reused = POOL.lock().expect("buffer pool lock").take(len);
        let map = reused.unwrap_or_else(|| {
            memmap2::MmapMut::map_anon(len).unwrap_or_else(|e| panic!("cannot map {len} bytes: {e}"))
        });
        debug_assert!((map.as_ptr() as usize).is_multiple_of(ALIGN));
        AlignedBuf { map: Some(map) }
    }

    /// A fresh map of at least `len` bytes that reads as zeros, never one from the pool: its
    /// pages are the kernel's zero page until written, so reading it costs no memory.
    pub fn zeroed(len: usize) -> Self {
        let len = len.max(1).next_multiple_of(ALIGN);
        AlignedBuf {
            map: Some(memmap2::MmapMut::map_anon(len).unwrap_or_else(|e| panic!("cannot map {len} bytes: {e}"))),
        }
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
        let gone = {
            let mut pool = POOL.lock().expect("buffer pool lock");
            pool.maps.push(map);
            pool.trim()
        };
        drop(gone);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Lengths no other test asks for, so that their reads cannot take these maps.
    const KEPT: usize = 777 * ALIGN;
    const LOOSE: usize = 779 * ALIGN;
    const OTHER: usize = (4 << 20) + 3 * ALIGN;

    fn marked(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new(len);
        b.as_mut_slice()[0] = 0xAB;
        b
    }

    #[test]
    fn a_reserved_length_keeps_its_map_while_the_oldest_others_go() {
        reserve_pool(&[KEPT]);
        drop(marked(KEPT));
        drop(marked(LOOSE));
        // Five maps of 4 MiB, newer than both, overflow the pool's 8 MiB: the unreserved
        // map goes (oldest first), the reserved one stays.
        let others: Vec<AlignedBuf> = (0..5).map(|_| AlignedBuf::new(OTHER)).collect();
        drop(others);
        // A reused map keeps its bytes; a fresh anonymous map is zeroed.
        assert_eq!(AlignedBuf::new(KEPT).as_slice()[0], 0xAB, "the reserved map was unmapped");
        assert_eq!(AlignedBuf::new(LOOSE).as_slice()[0], 0, "the oldest unreserved map was kept");
        unreserve_pool(&[KEPT]);
        assert!(!POOL.lock().unwrap().kept.iter().any(|&(l, _)| l == KEPT));
    }

    /// An expert store reserves one map per queued run, many of one length: each is kept.
    #[test]
    fn a_length_reserved_n_times_keeps_n_maps() {
        const RUN: usize = 781 * ALIGN;
        reserve_pool(&[RUN; 3]);
        // Three maps of one length and 12 MiB of newer others: the three stay.
        let runs: Vec<AlignedBuf> = (0..3).map(|_| marked(RUN)).collect();
        drop(runs);
        drop((0..3).map(|_| AlignedBuf::new(OTHER + ALIGN)).collect::<Vec<_>>());
        let again: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::new(RUN)).collect();
        assert!(again.iter().all(|b| b.as_slice()[0] == 0xAB), "a reserved map was unmapped");
        unreserve_pool(&[RUN; 3]);
        assert!(!POOL.lock().unwrap().kept.iter().any(|&(l, _)| l == RUN));
    }
}
