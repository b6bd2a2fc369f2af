//! Where jobs' generation checkpoints live (`data_dir/checkpoints/job-ID.ckpt`, one per job: the
//! journal's saved point the local backend resumes from), and their removal once a job has ended
//! for good.

use std::path::{Path, PathBuf};

use nightmail_store::{JobId, JobState, Store, StoreError};

pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoints")
}

pub fn path(data_dir: &Path, job: JobId) -> PathBuf {
    dir(data_dir).join(format!("job-{}.ckpt", job.0))
}

/// Bytes on disk of a job's checkpoint (0 when it has none).
pub fn bytes(data_dir: &Path, job: JobId) -> u64 {
    std::fs::metadata(path(data_dir, job)).map_or(0, |m| m.len())
}

/// Bytes on disk of all checkpoints.
pub fn total_bytes(data_dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir(data_dir)) else { return 0 };
    entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
}

/// Removes a job's checkpoint, if any.
pub fn remove(data_dir: &Path, job: JobId) {
    let p = path(data_dir, job);
    match std::fs::remove_file(&p) {
        Ok(()) => tracing::debug!(job = %job, "checkpoint removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(job = %job, "cannot remove {}: {e}", p.display()),
    }
}

/// Whether a job in this state may still resume (so its checkpoint is kept).
pub fn may_resume(state: &JobState) -> bool {
    matches!(state, JobState::Queued { .. } | JobState::Running { .. })
}

/// Removes the checkpoints of jobs that have ended (a crash between delivering a reply and
/// removing its checkpoint leaves one behind) and files that belong to no job.
pub fn sweep(data_dir: &Path, store: &Store) -> Result<usize, StoreError> {
    let Ok(entries) = std::fs::read_dir(dir(data_dir)) else { return Ok(0) };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let id = name.to_str().and_then(|n| n.strip_prefix("job-")?.strip_suffix(".ckpt")?.parse::<u64>().ok());
        let keep = match id {
            Some(id) => store.job(JobId(id))?.is_some_and(|j| may_resume(&j.state)),
            None => false,
        };
        if !keep && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}
