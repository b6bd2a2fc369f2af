//! Raw message bytes as immutable files beside sled's own: `messages/<kk>/<key>`, `kk` the key's
//! low byte in hex (keys are handed out in order, so the 256 directories fill evenly). sled 0.34
//! keeps every value it has read as live heap and charges a value over its blob threshold only its
//! pointer, so `cache_capacity` cannot bound messages kept in a tree; a file read goes through the
//! kernel's page cache, which the kernel reclaims, and leaves nothing on our heap.
//!
//! The order of writes keeps every reference pointing at a whole file, even across a power cut: a
//! file is written under a temporary name, fsynced, renamed into place and its directory fsynced
//! before the transaction that references it; releasing the last holder records the key in
//! `collected` (`refs.rs`), and the file is removed only once that transaction is flushed. A crash
//! in between leaves a file nothing references, removed when the store is next opened
//! (`staging.rs` keeps that order).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::{MessageKey, StoreError};

/// The directory under the store's that holds the files.
pub(crate) const DIR: &str = "messages";
const TMP: &str = ".tmp";

/// The message files of one store.
#[derive(Clone)]
pub(crate) struct MessageFiles {
    dir: PathBuf,
    /// Held while a directory is made and its entry synced, so no writer trusts a directory whose
    /// entry another writer has not yet synced.
    making: Arc<Mutex<()>>,
    /// Backups copying files now: the files they copy are not removed until they finish.
    copying: Arc<AtomicUsize>,
}

/// What [`MessageFiles::list`] finds.
pub(crate) enum Listed {
    Message(MessageKey),
    /// A temporary file or anything else not named as a message: never referenced.
    Stray(PathBuf),
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |e| StoreError::Io { path: path.to_path_buf(), message: e.to_string() }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl MessageFiles {
    pub fn new(store_dir: &Path) -> MessageFiles {
        MessageFiles { dir: store_dir.join(DIR), making: Arc::default(), copying: Arc::default() }
    }

    fn shard(&self, key: MessageKey) -> PathBuf {
        self.dir.join(format!("{:02x}", key.0 & 0xff))
    }

    pub fn path(&self, key: MessageKey) -> PathBuf {
        self.shard(key).join(format!("{:016x}", key.0))
    }

    /// Makes `dir` (0700 whatever the umask) if missing and syncs its entry in its parent.
    fn make_dir(&self, dir: &Path) -> io::Result<()> {
        let _making = self.making.lock().unwrap_or_else(|p| p.into_inner());
        if dir.is_dir() {
            return Ok(());
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        sync_dir(dir.parent().expect("a message directory has a parent"))
    }

    /// Writes `raw` as message `key`, durably (see the module comment), with mode 0600.
    pub fn write(&self, key: MessageKey, raw: &[u8]) -> Result<(), StoreError> {
        let shard = self.shard(key);
        self.make_dir(&self.dir).map_err(io_error(&self.dir))?;
        self.make_dir(&shard).map_err(io_error(&shard))?;
        let path = self.path(key);
        let tmp = shard.join(format!("{:016x}{TMP}", key.0));
        let written = (|| {
            let mut file =
                std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            file.write_all(raw)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            sync_dir(&shard)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(io_error(&path))
    }

    /// The bytes of message `key`, `None` if it has no file.
    pub fn read(&self, key: MessageKey) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&path)(e)),
        }
    }

    /// Removes message `key`'s file, if there is one.
    pub fn remove(&self, key: MessageKey) -> Result<(), StoreError> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error(&path)(e)),
            _ => Ok(()),
        }
    }

    /// Every file under the directory.
    pub fn list(&self) -> Result<Vec<Listed>, StoreError> {
        let mut found = Vec::new();
        let shards = match std::fs::read_dir(&self.dir) {
            Ok(shards) => shards,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(io_error(&self.dir)(e)),
        };
        for shard in shards {
            let shard = shard.map_err(io_error(&self.dir))?.path();
            if !shard.is_dir() {
                found.push(Listed::Stray(shard));
                continue;
            }
            for entry in std::fs::read_dir(&shard).map_err(io_error(&shard))? {
                let path = entry.map_err(io_error(&shard))?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                match u64::from_str_radix(name, 16) {
                    Ok(key) if name.len() == 16 && path == self.path(MessageKey(key)) => {
                        found.push(Listed::Message(MessageKey(key)))
                    }
                    _ => found.push(Listed::Stray(path)),
                }
            }
        }
        Ok(found)
    }

    /// Whether a backup is copying the files now (none may be removed).
    pub fn copying(&self) -> bool {
        self.copying.load(Ordering::SeqCst) > 0
    }

    /// Removes a file found under the directory that is no message's.
    pub fn remove_stray(&self, path: &Path) -> Result<(), StoreError> {
        std::fs::remove_file(path).map_err(io_error(path))
    }

    /// Keeps every file in place until the returned guard is dropped (a backup copying them).
    pub fn hold_all(&self) -> Holding {
        self.copying.fetch_add(1, Ordering::SeqCst);
        Holding(self.copying.clone())
    }
}

/// While alive, no message file is removed.
pub(crate) struct Holding(Arc<AtomicUsize>);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
