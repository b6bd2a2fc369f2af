//! The integrity check (`nightmail check`, and the last step of a restore): every index and every
//! reference points at records and bytes that exist, and every message's holder count
//! (`refs.rs`) is the number of mailbox entries, jobs and outbound entries that hold it, and every
//! held message has its file, of the size and SHA-256 recorded for it. Run while writes wait (the
//! backup's gate), so a change under way is not mistaken for damage; the held files' bytes are read
//! after the gate is released, while no file may be removed. A file nothing references is no
//! damage (a write ahead of its transaction, or a crash's leftover) and goes at the next open.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::delivery::MessageRef;
use crate::ids::mail_key;
use crate::job::{Job, JobState};
use crate::job_index::{self, Index};
use crate::modseq::parse_expunged_key;
use crate::outbound::OutboundState;
use crate::queue::{Live, live_key, live_lists, queue_key};
use crate::refs::Holders;
use crate::schema::{JOBS, MAIL, MAILBOXES, MESSAGE_IDS, MESSAGE_REFS, OUTBOUND, decode};
use crate::{JobId, MailEntry, MailboxId, MailboxInfo, MessageKey, Outbound, Store, StoreError};

/// What the check counted, and each problem it found (none: the store is whole).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Integrity {
    pub messages: u64,
    pub mailboxes: u64,
    pub mail_entries: u64,
    pub jobs: u64,
    pub outbound: u64,
    pub problems: Vec<String>,
}

impl Integrity {
    pub fn is_whole(&self) -> bool {
        self.problems.is_empty()
    }
}

fn key_of(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?))
}

/// What is wrong with held message `key`'s file, if its size or SHA-256 is not the one recorded.
fn file_differs(t: &crate::schema::Trees, key: MessageKey, holders: &Holders) -> Result<Option<String>, StoreError> {
    let Some(raw) = t.files.read(key)? else { return Ok(Some(format!("message {key}'s file is missing"))) };
    if holders.sha256.is_empty() {
        return Ok(None);
    }
    if raw.len() as u64 != holders.size {
        return Ok(Some(format!("message {key}'s file is {} bytes, {} were stored", raw.len(), holders.size)));
    }
    if crate::stable_digest(&raw) != holders.sha256 {
        return Ok(Some(format!("message {key}'s file does not match its SHA-256: the bytes are damaged")));
    }
    Ok(None)
}

impl Store {
    /// Checks that every index points at existing records and bytes (see the module comment).
    /// Blocking; writes wait until the records are read.
    pub fn check(&self) -> Result<Integrity, StoreError> {
        let quiet = self.trees.quiesce();
        let t = &self.trees;
        let mut report = Integrity::default();
        let mut problem = |text: String| {
            if report.problems.len() < 100 {
                report.problems.push(text);
            }
        };
        let mut messages = HashSet::new();
        for listed in t.files.list()? {
            if let crate::message_files::Listed::Message(key) = listed {
                messages.insert(key);
            }
        }
        let mut held: HashMap<MessageKey, u64> = HashMap::new();

        let mut mailboxes = HashMap::new();
        for entry in t.mailboxes.iter() {
            let (_, value) = entry?;
            let info: MailboxInfo = decode(MAILBOXES, &value)?;
            mailboxes.insert(info.id, info);
        }
        for entry in t.mailbox_names.iter() {
            let (name, id) = entry?;
            if !key_of(&id).is_some_and(|id| mailboxes.contains_key(&MailboxId(id))) {
                problem(format!("mailbox name {:?} points at no mailbox", String::from_utf8_lossy(&name)));
            }
        }
        let mut mail_entries = 0;
        let mut present = HashSet::new();
        for entry in t.mail.iter() {
            let (key, value) = entry?;
            mail_entries += 1;
            let mail: MailEntry = decode(MAIL, &value)?;
            let mailbox = MailboxId(key_of(&key).unwrap_or(u64::MAX));
            match mailboxes.get(&mailbox) {
                None => problem(format!("a mail entry of mailbox {mailbox} whose mailbox is gone")),
                // RFC 7162 §3.1.2.1: HIGHESTMODSEQ is the highest of its messages' mod-sequences.
                Some(info) if mail.modseq > info.highest_modseq => problem(format!(
                    "a message of mailbox {mailbox} has mod-sequence {} above the mailbox's highest, {}",
                    mail.modseq, info.highest_modseq
                )),
                Some(_) => {}
            }
            present.insert(key.to_vec());
            if !messages.contains(&mail.message) {
                problem(format!("mailbox {mailbox} holds message {} whose bytes are missing", mail.message));
            }
            *held.entry(mail.message).or_default() += 1;
        }

        // The expunge records (schema 10): each names a UID the mailbox handed out and holds no
        // more, expunged at a mod-sequence the mailbox has reached.
        for key in t.expunged.iter().keys() {
            let key = key?;
            let Some((mailbox, modseq, uid)) = parse_expunged_key(&key) else {
                problem("the expunged tree holds a short key".to_string());
                continue;
            };
            match mailboxes.get(&mailbox) {
                None => problem(format!("an expunge record of mailbox {mailbox}, which is gone")),
                Some(info) if modseq > info.highest_modseq || uid >= info.uid_next => {
                    problem(format!("the expunge of UID {uid} in mailbox {mailbox} at {modseq} is in its future"))
                }
                Some(_) if present.contains(&mail_key(mailbox, uid)[..]) => {
                    problem(format!("UID {uid} of mailbox {mailbox} is recorded as expunged but is still there"))
                }
                Some(_) => {}
            }
        }

        let mut jobs: HashMap<JobId, Job> = HashMap::new();
        let mut expected: HashMap<(Index, Vec<u8>), Vec<u8>> = HashMap::new();
        for entry in t.jobs.iter() {
            let (_, value) = entry?;
            let job: Job = decode(JOBS, &value)?;
            if !messages.contains(&job.message) {
                problem(format!("job {} holds message {} whose bytes are missing", job.id, job.message));
            }
            *held.entry(job.message).or_default() += 1;
            if let JobState::Queued { not_before } = job.state
                && !t.queue.contains_key(queue_key(not_before, job.id))?
            {
                problem(format!("queued job {} is missing from the queue index", job.id));
            }
            for list in live_lists(&job) {
                if !t.live_jobs.contains_key(live_key(list, job.id))? {
                    problem(format!("job {} is missing from the live-jobs index", job.id));
                }
            }
            for entry in job_index::entries(&job) {
                expected.insert((entry.index, entry.key), entry.value);
            }
            jobs.insert(job.id, job);
        }
        // The worker's indexes (schema 12): each entry one that a job has, and no other.
        for (index, tree) in
            [(Index::Replies, &t.replies), (Index::Answers, &t.answers), (Index::OpenJobs, &t.open_jobs)]
        {
            for entry in tree.iter() {
                let (key, value) = entry?;
                if expected.remove(&(index, key.to_vec())).is_none_or(|v| v[..] != value[..]) {
                    problem(format!("the {index:?} index holds an entry no job has"));
                }
            }
        }
        for (index, _) in expected.keys() {
            problem(format!("a job is missing from the {index:?} index"));
        }
        for key in t.queue.iter().keys() {
            let key = key?;
            let id = JobId(key.get(8..).and_then(key_of).unwrap_or(u64::MAX));
            let due = key_of(&key).unwrap_or(u64::MAX);
            let fits = jobs
                .get(&id)
                .is_some_and(|j| matches!(j.state, JobState::Queued { not_before } if not_before.0 == due));
            if !fits {
                problem(format!("the queue index names job {id}, which is not queued then"));
            }
        }
        for key in t.live_jobs.iter().keys() {
            let key = key?;
            let id = JobId(key.get(1..).and_then(key_of).unwrap_or(u64::MAX));
            let list = match key.first() {
                Some(&b) if b == Live::Untriaged as u8 => Live::Untriaged,
                Some(&b) if b == Live::Running as u8 => Live::Running,
                _ => {
                    problem("the live-jobs index holds a key of no list".to_string());
                    continue;
                }
            };
            let fits = jobs.get(&id).is_some_and(|j| live_lists(j).any(|l| l as u8 == list as u8));
            if !fits {
                problem(format!("the live-jobs index names job {id}, which is not in that state"));
            }
        }

        let mut outbound = 0;
        for entry in t.outbound.iter() {
            let (_, value) = entry?;
            outbound += 1;
            let entry: Outbound = decode(OUTBOUND, &value)?;
            // Settled entries have let go of their message (`outbound.rs`).
            if matches!(entry.state, OutboundState::Queued { .. } | OutboundState::Sending { .. }) {
                if !messages.contains(&entry.message) {
                    problem(format!(
                        "outbound entry {} holds message {} whose bytes are missing",
                        entry.id, entry.message
                    ));
                }
                *held.entry(entry.message).or_default() += 1;
            }
        }

        let mut counted = HashSet::new();
        let mut to_read = Vec::new();
        for entry in t.message_refs.iter() {
            let (key, value) = entry?;
            let key = MessageKey(key_of(&key).unwrap_or(u64::MAX));
            let holders: Holders = decode(MESSAGE_REFS, &value)?;
            let actual = held.get(&key).copied().unwrap_or(0);
            if holders.count != actual {
                problem(format!("message {key} is counted as held {} times, but {actual} hold it", holders.count));
            }
            if !messages.contains(&key) {
                problem(format!("message {key} has a holder count but no file ({})", t.files.path(key).display()));
            } else {
                to_read.push((key, holders));
            }
            counted.insert(key);
        }
        messages.retain(|key| counted.contains(key));
        for entry in t.message_ids.iter() {
            let (id, value) = entry?;
            let copies: Vec<MessageRef> = decode(MESSAGE_IDS, &value)?;
            for copy in copies {
                if !messages.contains(&copy.key) {
                    problem(format!(
                        "Message-ID {} points at message {} whose bytes are missing",
                        String::from_utf8_lossy(&id),
                        copy.key
                    ));
                }
            }
        }
        let _holding = t.files.hold_all();
        drop(quiet);
        for (key, holders) in &to_read {
            if let Some(wrong) = file_differs(t, *key, holders)? {
                problem(wrong);
            }
        }
        report.messages = messages.len() as u64;
        report.mailboxes = mailboxes.len() as u64;
        report.mail_entries = mail_entries;
        report.jobs = jobs.len() as u64;
        report.outbound = outbound;
        Ok(report)
    }
}
