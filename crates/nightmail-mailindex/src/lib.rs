//! Full-text search over one user's own mail, for the worker's `search_mail` tool.
//!
//! Each user has an index of their own, in `data_dir/mail_index/<sha256 of the address>/`, so a
//! search opens only the asking user's files: another user's mail is not filtered out, it is
//! never opened. Every document also carries its owner's address, and a search requires it, as a
//! second guard. The index holds nothing the store does not: a lost or stale one is rebuilt from
//! the store (`nightmail check --reindex`).
//!
//! Every mailbox of the user is indexed, Sent, Ask folders, `In Progress` and the model's own
//! replies included: they are the user's mail, and a model researching a thread may need what it
//! answered before.

mod catch_up;
mod error;
mod schema;
mod search;
mod state;
mod text;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nightmail_types::Address;
use serde::{Deserialize, Serialize};
use tantivy::{Index, IndexReader, ReloadPolicy};

pub use error::IndexError;

use crate::schema::Fields;
use crate::state::IndexedMailboxes;

/// The mail indexes of every user, under one directory. Cheap to clone: clones share the open
/// indexes, and any of them may be used from any task.
#[derive(Clone)]
pub struct MailIndex {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Each user's address and the name their mailboxes are stored under (`[[users]]` `name`).
    owners: HashMap<Address, String>,
    open: Mutex<HashMap<Address, Arc<UserIndex>>>,
}

/// One user's open index.
pub(crate) struct UserIndex {
    pub(crate) path: PathBuf,
    pub(crate) index: Index,
    pub(crate) reader: IndexReader,
    pub(crate) fields: Fields,
    /// Held by a catch-up or rebuild: tantivy allows one writer per index.
    pub(crate) writing: Mutex<()>,
}

/// One message a search found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MailHit {
    pub mailbox: String,
    pub uid: u32,
    /// RFC 2822: the Date header, else when the store received the message.
    pub date: Option<String>,
    pub from: String,
    pub subject: String,
    /// The body's best fragment for the query, matched words between `**`.
    pub snippet: String,
    pub message_id: Option<String>,
}

/// What one catch-up did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchUp {
    /// Messages read from the store and added.
    pub indexed: usize,
    /// Messages taken out: expunged, or in a mailbox deleted or re-indexed.
    pub removed: usize,
    /// Mailboxes indexed from their first UID again: new, or with a new UIDVALIDITY or name.
    pub reindexed: Vec<String>,
    /// Messages the parser could not read, indexed by their raw bytes.
    pub unreadable: usize,
}

/// What a rebuild of every user's index did (sent over the control socket by a running daemon).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildReport {
    /// Each configured user and the messages now in their index, in address order.
    pub users: Vec<(Address, usize)>,
    /// Owners of mailboxes in the store that no configured user is (a removed user, a bridge's
    /// own mailboxes): nobody can search as them, so they have no index.
    pub skipped_owners: Vec<String>,
}

impl MailIndex {
    /// Opens the directory of all users' indexes (`data_dir/mail_index`), creating it if
    /// missing. Users' indexes are opened when first used.
    pub fn open(dir: &Path) -> Result<MailIndex, IndexError> {
        // The index holds the mail's text: private as the store is (0700, whatever the umask).
        let changed = nightmail_store::make_private(dir)
            .map_err(|e| IndexError::Io { path: dir.to_path_buf(), source: std::io::Error::other(e.to_string()) })?;
        nightmail_store::log_made_private(dir, &changed);
        Ok(MailIndex {
            inner: Arc::new(Inner { dir: dir.to_path_buf(), owners: HashMap::new(), open: Mutex::default() }),
        })
    }

    /// The users whose mail is indexed: each address with the owner name its mailboxes are
    /// stored under in the store. [`MailIndex::catch_up`] and [`MailIndex::rebuild`] know only
    /// these.
    pub fn with_users(self, users: impl IntoIterator<Item = (Address, String)>) -> MailIndex {
        let owners = users.into_iter().collect();
        MailIndex { inner: Arc::new(Inner { dir: self.inner.dir.clone(), owners, open: Mutex::default() }) }
    }

    /// The directory of `user`'s index. Named by the SHA-256 of the address, not the address:
    /// an address may hold characters a file system treats specially (`/`, `..`, case folding,
    /// non-UTF-8 limits), and a digest has one fixed, safe shape that no address can steer into
    /// another user's directory.
    pub fn user_dir(&self, user: &Address) -> PathBuf {
        self.inner.dir.join(nightmail_store::stable_digest(user.as_str().as_bytes()))
    }

    pub(crate) fn owner(&self, user: &Address) -> Result<&str, IndexError> {
        self.inner.owners.get(user).map(String::as_str).ok_or_else(|| IndexError::UnknownUser { address: user.clone() })
    }

    pub(crate) fn users(&self) -> Vec<(&Address, &str)> {
        let mut users: Vec<(&Address, &str)> = self.inner.owners.iter().map(|(a, o)| (a, o.as_str())).collect();
        users.sort();
        users
    }

    /// `user`'s open index; with `create`, a missing or unusable one is made afresh, else a
    /// missing one is [`IndexError::NotIndexed`].
    pub(crate) fn user_index(&self, user: &Address, create: bool) -> Result<Arc<UserIndex>, IndexError> {
        let mut open = self.inner.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(index) = open.get(user) {
            return Ok(index.clone());
        }
        let path = self.user_dir(user);
        let index = match UserIndex::open(&path) {
            Ok(Some(index)) => index,
            Ok(None) if !create => return Err(IndexError::NotIndexed { address: user.clone() }),
            Ok(None) => UserIndex::create(&path)?,
            Err(e) if create => {
                // Derived data only: throwing it away loses nothing the store does not hold.
                tracing::warn!(user = %user, error = %e, "mail index unusable; starting it afresh");
                UserIndex::create(&path)?
            }
            Err(e) => return Err(e),
        };
        let index = Arc::new(index);
        open.insert(user.clone(), index.clone());
        Ok(index)
    }
}

impl UserIndex {
    /// The index in `path`: `None` if there is none, an error if it cannot be used (damaged, or
    /// written under another schema).
    fn open(path: &Path) -> Result<Option<UserIndex>, IndexError> {
        if !path.join("meta.json").exists() {
            return Ok(None);
        }
        let index = Index::open_in_dir(path).map_err(|e| IndexError::tantivy(path, e))?;
        let metas = index.load_metas().map_err(|e| IndexError::tantivy(path, e))?;
        let fields = Fields::of(&index.schema());
        let (Some(fields), Some(_)) = (fields, IndexedMailboxes::from_payload(metas.payload.as_deref())) else {
            return Err(IndexError::Index { path: path.to_path_buf(), message: "written by another version".into() });
        };
        Self::with(path, index, fields).map(Some)
    }

    /// A new, empty index in `path`, replacing whatever was there.
    fn create(path: &Path) -> Result<UserIndex, IndexError> {
        let io = |source| IndexError::Io { path: path.to_path_buf(), source };
        if path.exists() {
            std::fs::remove_dir_all(path).map_err(io)?;
        }
        std::fs::create_dir_all(path).map_err(io)?;
        let (schema, fields) = Fields::schema();
        let index = Index::create_in_dir(path, schema).map_err(|e| IndexError::tantivy(path, e))?;
        let user = Self::with(path, index, fields)?;
        // The first commit carries the (empty) record, so the directory opens as ours from now on.
        let mut writer = user.writer()?;
        let mut commit = writer.prepare_commit().map_err(|e| IndexError::tantivy(path, e))?;
        commit.set_payload(&IndexedMailboxes::empty().to_payload());
        commit.commit().map_err(|e| IndexError::tantivy(path, e))?;
        Ok(user)
    }

    fn with(path: &Path, index: Index, fields: Fields) -> Result<UserIndex, IndexError> {
        schema::register_tokenizer(&index);
        // Reloaded by hand after each commit: no watcher thread per user.
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| IndexError::tantivy(path, e))?;
        Ok(UserIndex { path: path.to_path_buf(), index, reader, fields, writing: Mutex::new(()) })
    }
}
