//! Schema 12: the `replies`, `answers` and `open_jobs` indexes (`job_index.rs` in the store), so
//! the worker's rate limit, pace and queue positions read only what they need instead of every
//! job ever received. Built here from the jobs the store holds; inserting the same entries
//! again is safe to re-run.

use crate::StoreError;
use crate::job::Job;
use crate::job_index::{Index, entries};
use crate::schema::{ANSWERS, JOBS, OPEN_JOBS, REPLIES, decode};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let jobs = db.open_tree(JOBS)?;
    let replies = db.open_tree(REPLIES)?;
    let answers = db.open_tree(ANSWERS)?;
    let open_jobs = db.open_tree(OPEN_JOBS)?;
    for entry in jobs.iter() {
        let (_, value) = entry?;
        let job: Job = decode(JOBS, &value)?;
        for entry in entries(&job) {
            let tree = match entry.index {
                Index::Replies => &replies,
                Index::Answers => &answers,
                Index::OpenJobs => &open_jobs,
            };
            tree.insert(entry.key, entry.value)?;
        }
    }
    Ok(())
}
