//! Accepting one message for its recipients, atomically: a mailbox copy for each local user, a job
//! for each model address, an outbound entry for each remote address, the Message-ID index and the
//! dedupe marks, in one transaction over the raw bytes' file written before it
//! (`message_files.rs`), flushed before the caller may say 250.

use nightmail_types::{Address, Timestamp};
use serde::{Deserialize, Serialize};
use sled::transaction::ConflictableTransactionError;

use crate::job::{Job, Origin};
use crate::mailbox::{MailEntry, append, ensure_mailbox};
use crate::outbound::{Outbound, OutboundId, OutboundState};
use crate::queue::write_job;
use crate::schema::{DEDUPE, MESSAGE_IDS, Tx, decode, encode};
use crate::staging::Staged;
use crate::{JobId, MailboxId, MessageKey, Store, StoreError, Uid};

/// Where one accepted recipient's copy goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recipient {
    /// A local user: the message lands in their INBOX.
    User { user: String, address: Address },
    /// A model address: the message becomes a job. `via`: the bridge (its upstream address) the
    /// message came in through, whose SMTP server the answer goes out by.
    Model { address: Address, via: Option<Address> },
    /// Anyone else: the message waits in the outbound queue for the relay, or for the bridge
    /// `via` names.
    Remote { address: Address, via: Option<Address> },
}

impl Recipient {
    pub fn address(&self) -> &Address {
        match self {
            Recipient::User { address, .. } | Recipient::Model { address, .. } | Recipient::Remote { address, .. } => {
                address
            }
        }
    }
}

/// The headers `status` and the worker show without reparsing the message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub from: String,
    pub subject: String,
    pub message_id: String,
}

/// The first From mailbox as a summary shows it: `Name <addr>`, or whichever half there is.
pub fn author(message: &mail_parser::Message<'_>) -> String {
    message
        .from()
        .and_then(|a| a.first())
        .map(|a| match (a.name(), a.address()) {
            (Some(name), Some(addr)) => format!("{name} <{addr}>"),
            (None, Some(addr)) => addr.to_string(),
            (Some(name), None) => name.to_string(),
            (None, None) => String::new(),
        })
        .unwrap_or_default()
}

/// The Message-ID in angle brackets (mail-parser gives it without), if the header has one.
pub fn message_id(message: &mail_parser::Message<'_>) -> Option<String> {
    message.message_id().filter(|id| !id.trim().is_empty()).map(|id| format!("<{}>", id.trim()))
}

impl Summary {
    /// From, Subject and Message-ID as the header gives them, for a message filed over IMAP.
    /// mail-parser runs behind `catch_unwind` (it can panic on crafted input): a panic costs the
    /// summary, never the server. `None` when the bytes hold no header
    /// field at all, so are no RFC 5322 message.
    pub fn read(raw: &[u8]) -> Option<Summary> {
        std::panic::catch_unwind(|| {
            let message = mail_parser::MessageParser::new().parse_headers(raw)?;
            // RFC 5322 §2.2: a field name is printable ASCII without spaces or colons; a line of
            // text that mail-parser reads as a nameless header is no header at all.
            let field = |name: &str| !name.is_empty() && name.bytes().all(|b| (33..=126).contains(&b) && b != b':');
            if !message.headers().iter().any(|h| field(h.name())) {
                return None;
            }
            Some(Summary {
                from: author(&message),
                subject: message.subject().unwrap_or_default().to_string(),
                message_id: message_id(&message).unwrap_or_default(),
            })
        })
        .unwrap_or_else(|_| Some(Summary::default()))
    }
}

/// A message to store: accepted by SMTP, or written by the worker.
#[derive(Clone, Debug)]
pub struct Incoming {
    /// From [`Store::new_message_key`], so the caller can name it (in `Received:`, in the reply)
    /// before it is stored.
    pub key: MessageKey,
    pub raw: Vec<u8>,
    pub sender: Option<Address>,
    pub recipients: Vec<Recipient>,
    pub summary: Summary,
    /// What identifies a resend of the same message: its Message-ID, or a digest of its bytes
    /// when it has none.
    pub dedupe_id: String,
}

/// What one delivery made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Receipt {
    /// The stored message, if any recipient was new.
    pub message: Option<MessageKey>,
    pub jobs: Vec<JobId>,
    pub mail: Vec<(String, Uid)>,
    pub outbound: Vec<OutboundId>,
    /// Recipients that already had this message (a client resending after a lost connection).
    pub duplicates: Vec<Address>,
}

/// One stored message carrying a given Message-ID, and the addresses that took part in it (its
/// envelope sender and recipients): the worker builds a thread only from messages the asker took
/// part in, so a crafted `References:` cannot pull someone else's mail into a prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRef {
    pub key: MessageKey,
    pub participants: Vec<Address>,
}

#[derive(Serialize, Deserialize)]
enum Made {
    Job(JobId),
    Mail(MailboxId, Uid),
    Outbound(OutboundId),
}

/// A dedupe mark: what one delivery made, and when.
#[derive(Serialize, Deserialize)]
struct Mark {
    made: Made,
    at: Timestamp,
}

/// How long a delivery is remembered as a possible resend. A client resends after a lost `250`
/// within minutes or hours (RFC 5321 §4.5.4.1 gives up after 4-5 days); after this, the same
/// message again is a new question (two `status` mails a week apart are two questions).
pub const DEDUPE_WINDOW_MS: u64 = 7 * 24 * 3_600_000;

/// A stable digest (SHA-256) in hex: the same bytes give the same text in every build, unlike
/// std's `DefaultHasher`, whose algorithm may change between Rust releases.
pub fn stable_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// One mark per (sender, recipient, dedupe id): with the sender in the key, one user's message
/// can never make another user's later message "already queued".
fn dedupe_key(sender: Option<&Address>, recipient: &Address, dedupe_id: &str) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    // The null reverse-path `<>` is not an address, so it cannot collide with one.
    h.update(sender.map_or("<>", |s| s.as_str()).as_bytes());
    h.update([0]);
    h.update(recipient.as_str().as_bytes());
    h.update([0]);
    h.update(dedupe_id.as_bytes());
    h.finalize().into()
}

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

/// Adds `reference` to the copies of `message_id` in the index; a copy already there gains the
/// participants it lacked (a user filing a message over IMAP has taken part in it).
pub(crate) fn index_message_id<E: From<StoreError>>(
    message_ids: &sled::transaction::TransactionalTree,
    message_id: &str,
    reference: MessageRef,
) -> Result<(), ConflictableTransactionError<E>> {
    if message_id.is_empty() {
        return Ok(());
    }
    let mut refs: Vec<MessageRef> = match message_ids.get(message_id.as_bytes())? {
        Some(v) => decode(MESSAGE_IDS, &v).map_err(|e| ConflictableTransactionError::Abort(e.into()))?,
        None => Vec::new(),
    };
    let before = refs.clone();
    match refs.iter_mut().find(|r| r.key == reference.key) {
        Some(known) => {
            for p in reference.participants {
                if !known.participants.contains(&p) {
                    known.participants.push(p);
                }
            }
        }
        None => refs.push(reference),
    }
    if refs != before {
        message_ids.insert(message_id.as_bytes(), encode(&refs))?;
    }
    Ok(())
}

/// The body of [`Store::deliver`], for use inside a larger transaction. `ids` holds one fresh id
/// per recipient.
pub(crate) fn deliver_in(tx: &Tx<'_>, incoming: &Incoming, ids: &[u64], now: Timestamp) -> TxResult<Receipt> {
    let message_key = incoming.key;
    let mut receipt = Receipt::default();
    let mut holders = 0;
    for (recipient, &id) in incoming.recipients.iter().zip(ids) {
        let key = dedupe_key(incoming.sender.as_ref(), recipient.address(), &incoming.dedupe_id);
        if let Some(mark) = tx.dedupe.get(key)? {
            let mark: Mark = decode(DEDUPE, &mark).map_err(ConflictableTransactionError::Abort)?;
            // An expired mark is overwritten below.
            if now.0.saturating_sub(mark.at.0) < DEDUPE_WINDOW_MS {
                receipt.duplicates.push(recipient.address().clone());
                continue;
            }
        }
        let made = match recipient {
            Recipient::User { user, .. } => {
                let inbox = ensure_mailbox(tx.meta, tx.mailboxes, tx.mailbox_names, user, "INBOX", MailboxId(id), now)?;
                let mailbox_id = inbox.id;
                let entry = MailEntry {
                    uid: Uid(0),
                    message: message_key,
                    flags: vec!["\\Recent".into()],
                    internal_date: now,
                    size: incoming.raw.len() as u64,
                    modseq: crate::ModSeq::FIRST,
                };
                let uid = append(tx.mailboxes, tx.mail, inbox, &entry)?;
                receipt.mail.push((user.clone(), uid));
                Made::Mail(mailbox_id, uid)
            }
            Recipient::Model { address, via } => {
                let mut job = Job::queued(
                    JobId(id),
                    address.clone(),
                    message_key,
                    incoming.sender.clone(),
                    &incoming.summary,
                    Origin::Mail,
                    now,
                );
                job.via = via.clone();
                write_job(tx.into(), None, &job)?;
                receipt.jobs.push(job.id);
                Made::Job(job.id)
            }
            Recipient::Remote { address, via } => {
                let outbound = Outbound {
                    id: OutboundId(id),
                    message: message_key,
                    sender: incoming.sender.clone(),
                    recipient: address.clone(),
                    created_at: now,
                    attempts: 0,
                    state: OutboundState::Queued { not_before: now },
                    last_error: None,
                    via: via.clone(),
                    charged_to: None,
                };
                tx.outbound.insert(&outbound.id.to_be_bytes(), encode(&outbound))?;
                receipt.outbound.push(outbound.id);
                Made::Outbound(outbound.id)
            }
        };
        tx.dedupe.insert(&key, encode(&Mark { made, at: now }))?;
        receipt.message = Some(message_key);
        holders += 1;
    }
    if receipt.message.is_some() {
        // The bytes are in their file already (`Store::stage`).
        crate::refs::hold_new(tx.message_refs, message_key, holders, &incoming.summary.message_id, &incoming.raw)?;
        let mut participants: Vec<Address> = incoming.sender.iter().cloned().collect();
        participants.extend(incoming.recipients.iter().map(|r| r.address().clone()));
        participants.dedup();
        index_message_id(tx.message_ids, &incoming.summary.message_id, MessageRef { key: message_key, participants })?;
    }
    Ok(receipt)
}

impl Store {
    /// Deletes the dedupe marks older than [`DEDUPE_WINDOW_MS`]: they no longer mark anything (a
    /// delivery overwrites an expired one), and without a sweep the tree would grow by one mark
    /// per recipient of every message ever received. Returns how many were deleted.
    pub async fn sweep_dedupe(&self) -> Result<usize, StoreError> {
        let now = Timestamp::now();
        let mut removed = 0;
        for entry in self.trees.dedupe.iter() {
            let (key, value) = entry?;
            let mark: Mark = decode(DEDUPE, &value)?;
            if now.0.saturating_sub(mark.at.0) < DEDUPE_WINDOW_MS {
                continue;
            }
            // Only if unchanged: a delivery may have renewed the mark since it was read.
            let _writing = self.trees.writing();
            if self.trees.dedupe.compare_and_swap(&key, Some(&value), None::<&[u8]>)?.is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            self.flush().await?;
        }
        Ok(removed)
    }

    /// A fresh key for a message about to be delivered.
    pub fn new_message_key(&self) -> Result<MessageKey, StoreError> {
        Ok(MessageKey(self.db.generate_id()?))
    }

    /// Fresh ids, one per recipient of `incoming`. Taken outside transactions: a transaction may
    /// run more than once on conflict and must do the same thing each time; unused ids are skipped.
    pub(crate) fn recipient_ids(&self, incoming: &Incoming) -> Result<Vec<u64>, StoreError> {
        Ok(incoming.recipients.iter().map(|_| self.db.generate_id()).collect::<Result<Vec<u64>, _>>()?)
    }

    /// What a transaction that may deliver `mail` needs ahead of it: fresh ids for its recipients
    /// and its file, written (`Store::stage`).
    pub(crate) fn ready(&self, mail: Option<&Incoming>) -> Result<(Vec<u64>, Staged), StoreError> {
        let ids = match mail {
            Some(m) => self.recipient_ids(m)?,
            None => Vec::new(),
        };
        Ok((ids, self.stage(mail.map(|m| (m.key, m.raw.as_slice())))?))
    }

    /// Stores a message for its recipients and flushes. When this returns `Ok`, the message, its
    /// mailbox copies, its jobs and its outbound entries are on disk. While the disk is short of
    /// space it writes nothing and returns [`StoreError::Full`] (see `space.rs`).
    pub async fn deliver(&self, incoming: &Incoming) -> Result<Receipt, StoreError> {
        self.deliver_at(incoming, Timestamp::now()).await
    }

    /// [`Store::deliver`] as if at `now` (tests of expiring marks).
    #[doc(hidden)]
    pub async fn deliver_at(&self, incoming: &Incoming, now: Timestamp) -> Result<Receipt, StoreError> {
        self.ensure_room(incoming.raw.len() as u64)?;
        let (ids, _staged) = self.ready(Some(incoming))?;
        let receipt = self.trees.transaction(|tx| deliver_in(tx, incoming, &ids, now))?;
        self.flush().await?;
        self.announce(&receipt);
        Ok(receipt)
    }

    /// The stored message with this Message-ID that `participant` took part in, if any: how the
    /// worker follows `In-Reply-To` and `References` through a thread.
    pub fn find_by_message_id(
        &self,
        message_id: &str,
        participant: &Address,
    ) -> Result<Option<MessageKey>, StoreError> {
        let Some(v) = self.trees.message_ids.get(message_id.as_bytes())? else { return Ok(None) };
        let refs: Vec<MessageRef> = decode(MESSAGE_IDS, &v)?;
        Ok(refs.into_iter().find(|r| r.participants.contains(participant)).map(|r| r.key))
    }
}
