//! Schema 2: the `queue` tree, an index of queued jobs ordered by when they are due, so taking the
//! next job reads one key instead of scanning every job ever received. Built here from the jobs a
//! schema-1 store holds.

use crate::StoreError;
use crate::job::{Job, JobState};
use crate::queue::queue_key;
use crate::schema::{JOBS, QUEUE, decode};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let jobs = db.open_tree(JOBS)?;
    let queue = db.open_tree(QUEUE)?;
    for entry in jobs.iter() {
        let (_, value) = entry?;
        let job: Job = decode(JOBS, &value)?;
        if let JobState::Queued { not_before } = job.state {
            queue.insert(queue_key(not_before, job.id), &[])?;
        }
    }
    Ok(())
}
