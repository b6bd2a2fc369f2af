//! Schema 9: the `live_jobs` tree, the index of jobs still to triage and of running jobs, so the
//! concierge (every second) and the lease sweeper (every 30 s) read the live jobs only, not every
//! job ever received. Built here from the jobs the store holds; inserting the same keys again is
//! safe to re-run.

use crate::StoreError;
use crate::job::Job;
use crate::queue::{live_key, live_lists};
use crate::schema::{JOBS, LIVE_JOBS, decode};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let jobs = db.open_tree(JOBS)?;
    let live = db.open_tree(LIVE_JOBS)?;
    for entry in jobs.iter() {
        let (_, value) = entry?;
        let job: Job = decode(JOBS, &value)?;
        for list in live_lists(&job) {
            live.insert(live_key(list, job.id), &[])?;
        }
    }
    Ok(())
}
