//! Reading expert bytes off the disk without the page cache: `pread(2)` on a file opened with
//! `O_DIRECT` into aligned buffers, so the only copy of an expert in RAM is the cache's. Where the
//! file system refuses `O_DIRECT` (tmpfs), reads are buffered and each range is dropped from the
//! page cache after it is read (`posix_fadvise(POSIX_FADV_DONTNEED)`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use nightmail_tensor::{ALIGN, AlignedBuf};

/// One model file opened for expert reads.
pub struct ExpertFile {
    path: PathBuf,
    file: File,
    direct: bool,
    len: u64,
}

/// Bytes `[offset, offset + len)` of a file, read into an aligned buffer that may start before
/// `offset` (the read is widened to [`ALIGN`] boundaries).
pub struct ReadRange {
    pub buf: Arc<AlignedBuf>,
    /// Where `offset` lies in `buf`.
    pub skip: usize,
    /// Bytes the disk delivered (the widened length).
    pub disk_bytes: usize,
}

impl ExpertFile {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let (file, direct) = match open_direct(path) {
            Ok(f) => (f, true),
            Err(_) => (File::open(path)?, false),
        };
        let len = file.metadata()?.len();
        Ok(ExpertFile { path: path.to_path_buf(), file, direct, len })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.len
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Read `[offset, offset + len)`; fails with `UnexpectedEof` if the file ends first.
    pub fn read(&self, offset: u64, len: usize) -> std::io::Result<ReadRange> {
        self.read_parallel(offset, len, 1)
    }

    /// The same read, split into [`PARALLEL_CHUNK`] pieces with up to `parallel` in flight: one
    /// large direct read runs at a fraction of the disk's rate, which needs a deep queue (a
    /// streamed layer is tens of MiB).
    pub fn read_parallel(&self, offset: u64, len: usize, parallel: usize) -> std::io::Result<ReadRange> {
        Ok(read_ranges(&[(self, offset, len)], parallel)?.pop().expect("one range read"))
    }

    /// Fill `buf` from file offset `at`; at least `want` bytes must exist there (the rest of the
    /// aligned buffer may run past the end of the file).
    fn fill(&self, buf: &mut [u8], at: u64, want: usize) -> std::io::Result<()> {
        let mut got = 0;
        while got < want.min(buf.len()) {
            // A direct read must cover whole aligned blocks; a short read means end of file.
            let n = self.file.read_at(&mut buf[got..], at + got as u64)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file ends at byte {} but the range ends at {}", at + got as u64, at + want as u64),
                ));
            }
            got += n;
        }
        Ok(())
    }
}

/// Read several ranges (of one file or several) as one queue of [`PARALLEL_CHUNK`] pieces, up to
/// `parallel` in flight from the first piece to the last: a streamed layer's runs (its tensors
/// apart in the file) then keep the disk's queue as deep across a run's end as inside it, where
/// reading them one after another drained it at each run's last pieces.
pub fn read_ranges(ranges: &[(&ExpertFile, u64, usize)], parallel: usize) -> std::io::Result<Vec<ReadRange>> {
    let _busy = InFlight::begin();
    let mut bufs = Vec::with_capacity(ranges.len());
    for &(_, offset, len) in ranges {
        let start = offset / ALIGN as u64 * ALIGN as u64;
        let skip = (offset - start) as usize;
        bufs.push((start, skip, AlignedBuf::new(skip + len)));
    }
    let pieces: usize = bufs.iter().map(|(_, _, b)| b.len().div_ceil(PARALLEL_CHUNK)).sum();
    let workers = parallel.max(1).min(pieces);
    if workers <= 1 {
        // One read per range (an expert's run, a packed expert's 2.6 MiB): no thread, no split.
        for (&(file, _, len), (start, skip, buf)) in ranges.iter().zip(bufs.iter_mut()) {
            file.fill(buf.as_mut_slice(), *start, *skip + len)?;
        }
    } else {
        // Every piece of every range: (file, its offset, the bytes that must exist there, its buffer).
        let mut queue = Vec::with_capacity(pieces);
        for (&(file, _, len), (start, skip, buf)) in ranges.iter().zip(bufs.iter_mut()) {
            let want = *skip + len;
            for (i, chunk) in buf.as_mut_slice().chunks_mut(PARALLEL_CHUNK).enumerate() {
                let at = i * PARALLEL_CHUNK;
                queue.push((file, *start + at as u64, want.saturating_sub(at), chunk));
            }
        }
        let queue = std::sync::Mutex::new(queue.into_iter());
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| -> std::io::Result<()> {
                        loop {
                            let Some((file, at, want, chunk)) = queue.lock().expect("piece queue").next() else {
                                return Ok(());
                            };
                            file.fill(chunk, at, want)?;
                        }
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("reader thread"))
        })?;
    }
    Ok(ranges
        .iter()
        .zip(bufs)
        .map(|(&(file, _, _), (start, skip, buf))| {
            let total = buf.len();
            if !file.direct {
                drop_from_page_cache(&file.file, start, total);
            }
            ReadRange { buf: Arc::new(buf), skip, disk_bytes: total }
        })
        .collect())
}

/// Seconds during which at least one read of any stream (dense layers or experts, any file) was
/// in flight, since the last [`reset_disk_busy`]: the disk's busy time as the decode saw it, which
/// each stream's own counter cannot give (their reads overlap).
pub fn disk_busy_s() -> f64 {
    let d = DISK.lock().expect("disk busy lock");
    d.busy_s + d.since.map_or(0.0, |t| t.elapsed().as_secs_f64())
}

pub fn reset_disk_busy() {
    let mut d = DISK.lock().expect("disk busy lock");
    d.busy_s = 0.0;
    if d.since.is_some() {
        d.since = Some(Instant::now());
    }
}

struct DiskBusy {
    reading: usize,
    since: Option<Instant>,
    busy_s: f64,
}

static DISK: std::sync::Mutex<DiskBusy> = std::sync::Mutex::new(DiskBusy { reading: 0, since: None, busy_s: 0.0 });

/// One read in flight, counted in [`DISK`] until dropped.
struct InFlight;

impl InFlight {
    fn begin() -> Self {
        let mut d = DISK.lock().expect("disk busy lock");
        if d.reading == 0 {
            d.since = Some(Instant::now());
        }
        d.reading += 1;
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut d = DISK.lock().expect("disk busy lock");
        d.reading -= 1;
        if d.reading == 0
            && let Some(t) = d.since.take()
        {
            d.busy_s += t.elapsed().as_secs_f64();
        }
    }
}

/// The piece of a parallel read. A streamed layer's 1 MiB pieces, 16 in flight per reader, ran the
/// medium bench's decode 1-11% faster than 4 MiB pieces, 8 in flight, in 6 of 7 alternating pairs
/// (`docs/ENGINE.md`, "The decode's read shape"); fio on this virtual disk served 16 sequential
/// `O_DIRECT` reads of 1 MiB faster than 16 of 4 MiB in 10 of 12 checks. The disk probe keeps
/// its 4 MiB reads (`bench.rs`), so its floor is comparable with the figures measured before.
pub const PARALLEL_CHUNK: usize = 1 << 20;

fn open_direct(path: &Path) -> std::io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        // macOS has no O_DIRECT; F_NOCACHE is its equivalent.
        let f = File::open(path)?;
        #[cfg(target_os = "macos")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: fcntl on a file descriptor we own.
            if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
                return Err(std::io::Error::last_os_error());
            }
            return Ok(f);
        }
        #[allow(unreachable_code)]
        Err(std::io::Error::other("no direct I/O on this system"))
    }
}

/// Tell the kernel it may drop this range of the page cache.
pub fn drop_from_page_cache(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: advisory call on a descriptor we own; failure only means the pages stay cached.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Sequential read bandwidth of `path` (bytes per second): direct reads of `chunk` bytes,
/// `parallel` in flight, over at most `limit` bytes from `start`. Each reader reads into one
/// buffer again and again, so that what is measured is the disk, not the kernel faulting in
/// fresh pages (which the streams avoid by recycling their buffers, `buf.rs`).
pub fn sequential_bandwidth(
    path: &Path,
    start: u64,
    limit: u64,
    chunk: usize,
    parallel: usize,
) -> std::io::Result<f64> {
    let file = Arc::new(ExpertFile::open(path)?);
    let start = start / ALIGN as u64 * ALIGN as u64;
    let end = file.size().min(start + limit) / ALIGN as u64 * ALIGN as u64;
    let chunks: Vec<u64> = (start..end).step_by(chunk).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t0 = Instant::now();
    let total = std::thread::scope(|s| {
        let handles: Vec<_> = (0..parallel.max(1))
            .map(|_| {
                s.spawn(|| -> std::io::Result<u64> {
                    let mut bytes = 0u64;
                    let mut buf = AlignedBuf::new(chunk);
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&off) = chunks.get(i) else { return Ok(bytes) };
                        let len = chunk.min((end - off) as usize);
                        let want = len.next_multiple_of(ALIGN);
                        file.fill(&mut buf.as_mut_slice()[..want], off, len)?;
                        bytes += want as u64;
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("reader thread")).sum::<std::io::Result<u64>>()
    })?;
    Ok(total as f64 / t0.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `len` pseudo-random bytes in a temporary directory, opened, and its bytes.
    fn data_file(len: u32) -> (tempfile::TempDir, ExpertFile, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let data: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = ExpertFile::open(&path).unwrap();
        (dir, file, data)
    }

    #[test]
    fn a_parallel_read_returns_the_same_bytes_as_the_file_and_fails_past_its_end() {
        let (_dir, file, data) = data_file(10_000_123);
        // Unaligned start, three pieces and a partial one, up to the file's last byte.
        let (offset, len) = (12_345u64, data.len() - 12_345);
        let r = file.read_parallel(offset, len, 3).unwrap();
        assert_eq!(&r.buf.as_slice()[r.skip..r.skip + len], &data[offset as usize..]);
        let one = file.read(offset, len).unwrap();
        assert_eq!(&one.buf.as_slice()[one.skip..one.skip + len], &data[offset as usize..]);
        let err = file.read_parallel(offset, len + 1, 3).err().expect("a read past the end fails");
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn ranges_read_as_one_queue_each_get_their_own_bytes_and_one_past_the_end_fails_them_all() {
        let (_dir, file, data) = data_file(5_000_017);
        // A layer's runs: apart in the file, unaligned, one shorter than a piece, one of several.
        let ranges = [(&file, 100_001u64, 700_000usize), (&file, 1_234_567, 3_000_000), (&file, 4_999_000, 1_017)];
        let reads = read_ranges(&ranges, 4).unwrap();
        for (&(_, offset, len), r) in ranges.iter().zip(&reads) {
            let o = offset as usize;
            assert_eq!(&r.buf.as_slice()[r.skip..r.skip + len], &data[o..o + len]);
        }
        let past = [(&file, 0u64, 4096usize), (&file, 4_999_000, 1_018)];
        let err = read_ranges(&past, 4).err().expect("a range past the end fails the read");
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
