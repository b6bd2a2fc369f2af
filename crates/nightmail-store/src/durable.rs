//! What makes a flushed change survive a power cut, not only `kill -9`.
//!
//! sled 0.34's `Db::flush` writes its log and waits with `sync_file_range` on Linux
//! (`pagecache/iobuf.rs`): the data reaches the device's queue, but neither the file's metadata
//! (its new length) nor the device's volatile cache is flushed, and values over sled's blob
//! threshold go to files under `blobs/` that it never fsyncs (`pagecache/blob_io.rs`). Its own
//! `fsync` comes from a background thread every 500 ms. RFC 5321 §6.1 asks that a 250 mean the
//! message is on stable storage, as Postfix and Stalwart mean it, so after sled's flush we fsync
//! ourselves: every blob file not yet synced and the `blobs/` directory first (a log record must
//! never point at a blob a power cut can take away), then sled's log file `db`.
//!
//! `File::sync_all` is `fsync` on Linux and `fcntl(F_FULLFSYNC)` on macOS, where plain `fsync`
//! does not flush the drive's cache.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The files of one sled directory and which of its blobs are known to be on stable storage.
pub(crate) struct Durability {
    dir: PathBuf,
    /// sled's log. fsync applies to the file, whichever descriptor asks.
    log: File,
    /// Blob files fsynced since the store was opened (sled never rewrites a blob: a new value is a
    /// new file), and whether the directory entries above them have been synced once.
    synced: Mutex<Synced>,
    /// Group commit: flushes asked for (`requested`) and the number the last finished flush
    /// covered (`covered`, held while a flush runs), so one flush serves every caller that asked
    /// before it began.
    requested: AtomicU64,
    covered: Mutex<u64>,
}

#[derive(Default)]
struct Synced {
    blobs: HashSet<OsString>,
    parents: bool,
}

impl Durability {
    /// For the sled database in `dir`, once sled has opened it (and so created its files).
    pub(crate) fn new(dir: &Path) -> io::Result<Durability> {
        let log = File::open(dir.join("db"))?;
        Ok(Durability {
            dir: dir.to_path_buf(),
            log,
            synced: Mutex::default(),
            requested: AtomicU64::new(0),
            covered: Mutex::new(0),
        })
    }

    /// Makes everything `db` holds durable: sled's own flush, then the fsyncs it leaves out.
    ///
    /// Callers that ask while a flush runs wait for it, then share the next one: a caller's writes
    /// are done before it takes its number, and a flush covers every number taken before it
    /// starts, so a caller whose number is covered returns at once. Ten IMAP clients appending at
    /// once thus wait for about two flushes each, not for up to ten in a row.
    pub(crate) fn flush(&self, db: &sled::Db) -> io::Result<()> {
        let ticket = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let mut covered = self.covered.lock().unwrap_or_else(|p| p.into_inner());
        if *covered >= ticket {
            return Ok(());
        }
        let covers = self.requested.load(Ordering::SeqCst);
        self.sync_blobs()?;
        db.flush().map_err(io::Error::other)?;
        self.log.sync_all()?;
        *covered = covers;
        Ok(())
    }

    fn sync_blobs(&self) -> io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        if !synced.parents {
            // The entries of `db` and `blobs/` in the store's directory, and of that directory in
            // its parent (created just before sled opened it).
            sync_dir(&self.dir)?;
            if let Some(parent) = self.dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
            synced.parents = true;
        }
        let blobs = self.dir.join("blobs");
        let entries = match std::fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut present = HashSet::new();
        let mut new = false;
        for entry in entries {
            let name = entry?.file_name();
            if !synced.blobs.contains(&name) {
                match File::open(blobs.join(&name)) {
                    Ok(file) => file.sync_all()?,
                    // Removed by sled's garbage collection since the listing: nothing to keep.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new = true;
            }
            present.insert(name);
        }
        if new {
            sync_dir(&blobs)?;
        }
        synced.blobs = present;
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
