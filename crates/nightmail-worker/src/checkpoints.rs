//! Where jobs' generation checkpoints live (`data_dir/checkpoints/job-ID.ckpt`, one per job: the
//! journal's saved point the local backend resumes from; a research job adds its journal of tool
//! calls, `job-ID.research`, and a checkpoint per later round, `job-ID.rN.ckpt`), and their
//! removal once a job has ended for good.

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

/// The job a file of the checkpoints directory belongs to: `job-ID.ckpt`, and a research job's
/// `job-ID.research` journal and `job-ID.rN.ckpt` rounds.
fn owner(name: &str) -> Option<JobId> {
    let (id, _) = name.strip_prefix("job-")?.split_once('.')?;
    id.parse().ok().map(JobId)
}

/// Removes a job's checkpoints (its research journal and rounds too), if any.
pub fn remove(data_dir: &Path, job: JobId) {
    let Ok(entries) = std::fs::read_dir(dir(data_dir)) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_str().and_then(owner) != Some(job) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => tracing::debug!(job = %job, "checkpoint removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(job = %job, "cannot remove {}: {e}", entry.path().display()),
        }
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
        let keep = match name.to_str().and_then(owner) {
            Some(id) => store.job(id)?.is_some_and(|j| may_resume(&j.state)),
            None => false,
        };
        if !keep && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_files_are_told_apart_by_their_id() {
        assert_eq!(owner("job-12.ckpt"), Some(JobId(12)));
        assert_eq!(owner("job-12.research"), Some(JobId(12)));
        assert_eq!(owner("job-12.r3.ckpt"), Some(JobId(12)));
        assert_eq!(owner("job-1.ckpt.tmp"), Some(JobId(1)));
        assert_eq!(owner("job-x.ckpt"), None);
        assert_eq!(owner("notes.txt"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(super::dir(dir.path())).unwrap();
        for name in ["job-12.ckpt", "job-12.research", "job-12.r1.ckpt", "job-120.ckpt"] {
            std::fs::write(super::dir(dir.path()).join(name), b"x").unwrap();
        }
        remove(dir.path(), JobId(12));
        let left: Vec<String> = std::fs::read_dir(super::dir(dir.path()))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["job-120.ckpt"]);
    }
}
