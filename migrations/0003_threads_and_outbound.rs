//! Schema 3: the `message_ids` index (Message-ID -> stored copies and who took part), which the
//! worker follows to rebuild a thread, and the `outbound` tree for mail to remote recipients.
//! Jobs gain `progress` and `reply` (serde defaults, no rewrite needed).
//!
//! The index is backfilled from the jobs a schema-2 store holds: those are the messages sent to
//! model addresses, whose Message-ID, sender and model the job records. (Before schema 3 the only
//! other mail was between local users, which no thread needs.)

use crate::StoreError;
use crate::delivery::MessageRef;
use crate::job::Job;
use crate::schema::{JOBS, MESSAGE_IDS, OUTBOUND, decode, encode};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    db.open_tree(OUTBOUND)?;
    let index = db.open_tree(MESSAGE_IDS)?;
    for entry in db.open_tree(JOBS)?.iter() {
        let (_, value) = entry?;
        let job: Job = decode(JOBS, &value)?;
        if job.message_id.is_empty() {
            continue;
        }
        let mut refs: Vec<MessageRef> = match index.get(job.message_id.as_bytes())? {
            Some(v) => decode(MESSAGE_IDS, &v)?,
            None => Vec::new(),
        };
        match refs.iter_mut().find(|r| r.key == job.message) {
            Some(existing) => {
                if !existing.participants.contains(&job.model) {
                    existing.participants.push(job.model.clone());
                }
            }
            None => {
                let participants = job.sender.iter().cloned().chain([job.model.clone()]).collect();
                refs.push(MessageRef { key: job.message, participants });
            }
        }
        index.insert(job.message_id.as_bytes(), encode(&refs))?;
    }
    Ok(())
}
