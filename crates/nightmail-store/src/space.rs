//! Free space: new mail is refused while the disk is short, before anything is written.
//!
//! sled 0.34 cannot survive running out of space: the first failed log write sets a global error
//! (`Config::set_global_error` in `pagecache/iobuf.rs`) that every later operation returns until
//! the process restarts. So the store never lets mail from outside get near that point: it keeps
//! [`MIN_FREE_BYTES`] free for what it must write without asking (the worker's replies and
//! notices, sled's segments and snapshots), and a submission that would eat into that floor gets
//! [`StoreError::Full`], which SMTP answers `452 4.3.1` (RFC 3463 §3.4, RFC 1870 §6.1). Nothing
//! of the refused message was written, so nothing half-written can show over IMAP, and the next
//! submission after space returns is accepted without a restart. A disk filled by another program
//! past the floor can still stop sled; then only a restart helps.

use std::path::Path;

use crate::{Store, StoreError};

/// What stays free for writes that cannot be refused. sled writes its log in 512 KiB segments
/// and rewrites live data when it cleans segments; 64 segments leave room for both.
pub const MIN_FREE_BYTES: u64 = 32 * 1024 * 1024;

/// Bytes an unprivileged writer may still use on the file system holding `dir` (statvfs(3):
/// `f_bavail` blocks of `f_frsize` bytes; root's reserved blocks are not counted on).
fn available(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a valid statvfs for the call to fill.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between Linux and macOS
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

impl Store {
    /// Whether a message of `bytes` may be accepted now: `Err(StoreError::Full)` while taking it
    /// would leave less than [`MIN_FREE_BYTES`] free. It is counted once: its bytes go to a file
    /// of their own (`message_files.rs`), which sled's cleaner never moves.
    pub fn ensure_room(&self, bytes: u64) -> Result<(), StoreError> {
        let free = available(self.path())
            .map_err(|e| StoreError::Io { path: self.path().to_path_buf(), message: format!("statvfs: {e}") })?;
        let needed = MIN_FREE_BYTES.saturating_add(bytes);
        if free < needed {
            return Err(StoreError::Full { path: self.path().to_path_buf(), free, needed });
        }
        Ok(())
    }
}
