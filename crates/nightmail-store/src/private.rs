//! The store is for its owner alone: every message and job is in it, so its directories are
//! 0700 and its files 0600 whatever the umask of whoever started the daemon, and a store an
//! older build left readable by others is made private when it is opened.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::StoreError;

/// Creates `dir` (and missing parents) as 0700, then takes the group's and others' bits off
/// everything under it that has any. Symbolic links are left alone (and not followed): their
/// targets are not ours. Returns the paths changed.
pub fn make_private(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| StoreError::Io { path, message: e.to_string() }
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(dir))?;
    let mut changed = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            // Gone since it was listed (sled removes old segments and blobs).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path)(e)),
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7700)).map_err(io(&path))?;
            changed.push(path.clone());
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(io(&path))? {
                pending.push(entry.map_err(io(&path))?.path());
            }
        }
    }
    Ok(changed)
}

/// Logs what [`make_private`] changed, in one line.
pub fn log_made_private(dir: &Path, changed: &[PathBuf]) {
    if let Some(first) = changed.first() {
        tracing::warn!(
            dir = %dir.display(),
            count = changed.len(),
            first = %first.display(),
            "made private: group and others could read these paths (modes now 0700/0600)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_readable_tree_is_made_private_and_links_are_left_alone() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("data");
        std::fs::create_dir_all(dir.join("store/blobs")).unwrap();
        std::fs::write(dir.join("store/db"), b"x").unwrap();
        std::fs::write(dir.join("store/blobs/1"), b"x").unwrap();
        let outside = top.path().join("model.gguf");
        std::fs::write(&outside, b"x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        for (path, m) in
            [("", 0o755), ("store", 0o755), ("store/blobs", 0o775), ("store/db", 0o644), ("store/blobs/1", 0o666)]
        {
            std::fs::set_permissions(dir.join(path), std::fs::Permissions::from_mode(m)).unwrap();
        }
        let changed = make_private(&dir).unwrap();
        assert_eq!(changed.len(), 5);
        for path in ["", "store", "store/blobs"] {
            assert_eq!(mode(&dir.join(path)), 0o700, "{path}");
        }
        for path in ["store/db", "store/blobs/1"] {
            assert_eq!(mode(&dir.join(path)), 0o600, "{path}");
        }
        assert_eq!(mode(&outside), 0o644, "a link's target is not ours");
        assert!(make_private(&dir).unwrap().is_empty(), "nothing left to change");
        let fresh = top.path().join("new/deeper");
        make_private(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }
}
