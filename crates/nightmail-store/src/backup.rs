//! Backups of a running store, and restoring one into an empty place.
//!
//! sled 0.34 has no snapshots and admits one process, so the backup is taken inside the process
//! that holds the store (the daemon, asked over its control socket): every write to the trees
//! holds the gate shared (`schema::Trees::writing`), and the backup holds it exclusively while it
//! reads every tree. The copy is therefore one moment of the store: each transaction is in it
//! whole or not at all, and every message acknowledged before the backup began is in it. Writers
//! wait for that read; the fsyncs come after the gate is released.
//!
//! A backup directory holds `trees/NN.kv` (one file per sled tree: records of
//! `u32 key length, key, u32 value length, value`, big-endian), `messages.kv` (the message files
//! the copied `message_refs` names, as records of key and bytes, copied after the gate is
//! released while no message file may be removed), any extra files the caller adds
//! (`files/...`), and `manifest.json`, written last (after every other file and the directory are
//! fsynced), with the SHA-256, size and record count of each. A directory without a manifest is
//! an interrupted backup; restore refuses it, and one whose files do not match their manifest.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{SCHEMA_VERSION, Store, StoreError};

const FORMAT: &str = "nightmail-backup 1";
const MANIFEST: &str = "manifest.json";
/// sled 0.34's default `idgen_persist_interval`, which `Store::open` uses.
const IDGEN_INTERVAL: u64 = 1_000_000;

/// What a backup holds, as its `manifest.json` says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub schema_version: u32,
    /// When the copy was taken (ms since the epoch).
    pub created_at: u64,
    /// Above every id (message, job, mailbox, outbound entry) the store had handed out: a restored
    /// store hands out ids from above it, so none is given twice.
    pub next_id: u64,
    pub trees: Vec<TreeCopy>,
    /// The message files (schema 13; before, the bytes are in a tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<TreeCopy>,
    pub files: Vec<FileCopy>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeCopy {
    pub name: String,
    pub file: String,
    pub entries: u64,
    pub bytes: u64,
    pub sha256: String,
}

/// A file from beside the store (the data directory's `tls/`, say), kept under `files/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCopy {
    /// Relative to the data directory, and to the backup's `files/`.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |e| StoreError::Io { path: path.to_path_buf(), message: e.to_string() }
}

fn bad(dir: &Path, message: String) -> StoreError {
    StoreError::BadBackup { path: dir.to_path_buf(), message }
}

/// A file being written, hashed as it goes.
struct Hashed {
    out: BufWriter<File>,
    hash: Sha256,
    bytes: u64,
}

impl Hashed {
    fn create(path: &Path) -> Result<Hashed, StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        // The user's mail and the TLS key: readable by the daemon's user alone.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(io_error(path))?;
        Ok(Hashed { out: BufWriter::new(file), hash: Sha256::new(), bytes: 0 })
    }

    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.hash.update(data);
        self.bytes += data.len() as u64;
        self.out.write_all(data)
    }

    fn record(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        for part in [key, value] {
            let len = u32::try_from(part.len()).map_err(io::Error::other)?;
            self.write(&len.to_be_bytes())?;
            self.write(part)?;
        }
        Ok(())
    }

    /// Flushes, fsyncs and returns (bytes, SHA-256).
    fn finish(self) -> io::Result<(u64, String)> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok((self.bytes, hex(&self.hash.finalize())))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// `dir` must not exist, or be an empty directory: a backup or restore never mixes with what is
/// there.
fn ensure_empty(dir: &Path, what: &str) -> Result<(), StoreError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(StoreError::NotEmpty { path: dir.to_path_buf(), what: what.to_string() });
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::create_dir_all(dir).map_err(io_error(dir))?;
            // What it will hold is the user's mail: the daemon's user alone may list it.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_error(dir))
        }
        Err(e) => Err(io_error(dir)(e)),
    }
}

impl Store {
    /// Writes a consistent copy of the whole store into `dir` (which must be empty or absent),
    /// with the files `extra` (path relative to the data directory, and where it is now), and
    /// returns its manifest. Blocking: writes wait while the trees are read.
    pub fn backup(&self, dir: &Path, extra: &[(String, PathBuf)]) -> Result<Manifest, StoreError> {
        ensure_empty(dir, "the backup directory")?;
        let trees_dir = dir.join("trees");
        std::fs::create_dir(&trees_dir).map_err(io_error(&trees_dir))?;
        let mut open: Vec<(String, String, Hashed, u64)> = Vec::new();
        let (next_id, created_at, held, _holding) = {
            let _quiet = self.trees.quiesce();
            let mut names: Vec<sled::IVec> = self.db.tree_names();
            names.sort();
            for (n, name) in names.iter().enumerate() {
                let name = String::from_utf8(name.to_vec())
                    .map_err(|_| StoreError::Corrupt { tree: "tree names", message: "a name is not UTF-8".into() })?;
                let file = format!("trees/{n:02}.kv");
                let path = dir.join(&file);
                let mut out = Hashed::create(&path)?;
                let mut entries = 0;
                for entry in self.db.open_tree(&name)?.iter() {
                    let (key, value) = entry?;
                    out.record(&key, &value).map_err(io_error(&path))?;
                    entries += 1;
                }
                open.push((name, file, out, entries));
            }
            let held = self.trees.message_refs.iter().keys().collect::<Result<Vec<_>, _>>()?;
            // Taken under the gate, so no file the copied trees reference is removed until the
            // copy below ends (`staging::reap` checks under the gate).
            let holding = self.trees.files.hold_all();
            (self.db.generate_id()?, nightmail_types::Timestamp::now().0, held, holding)
        };
        let mut trees = Vec::with_capacity(open.len());
        for (name, file, out, entries) in open {
            let (bytes, sha256) = out.finish().map_err(io_error(&dir.join(&file)))?;
            trees.push(TreeCopy { name, file, entries, bytes, sha256 });
        }
        sync_dir(&trees_dir)?;
        let messages = self.copy_messages(dir, &held)?;
        drop(_holding);
        let mut files = Vec::with_capacity(extra.len());
        for (relative, source) in extra {
            let target = dir.join("files").join(relative);
            let parent = target.parent().expect("a file under files/ has a parent");
            std::fs::create_dir_all(parent).map_err(io_error(parent))?;
            let data = std::fs::read(source).map_err(io_error(source))?;
            let mut out = Hashed::create(&target)?;
            out.write(&data).map_err(io_error(&target))?;
            let (bytes, sha256) = out.finish().map_err(io_error(&target))?;
            sync_dir(parent)?;
            files.push(FileCopy { path: relative.clone(), bytes, sha256 });
        }
        let manifest = Manifest {
            format: FORMAT.into(),
            schema_version: self.schema_version()?,
            created_at,
            next_id,
            trees,
            messages: Some(messages),
            files,
        };
        // The manifest last, whole or not at all: its presence says the backup is complete.
        let tmp = dir.join("manifest.json.tmp");
        let mut out = Hashed::create(&tmp)?;
        out.write(&serde_json::to_vec_pretty(&manifest).expect("a manifest serialises")).map_err(io_error(&tmp))?;
        out.finish().map_err(io_error(&tmp))?;
        std::fs::rename(&tmp, dir.join(MANIFEST)).map_err(io_error(dir))?;
        sync_dir(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(manifest)
    }
}

impl Store {
    /// Writes `messages.kv`: the file of each message in `held` (`message_refs` keys).
    fn copy_messages(&self, dir: &Path, held: &[sled::IVec]) -> Result<TreeCopy, StoreError> {
        let file = "messages.kv".to_string();
        let path = dir.join(&file);
        let mut out = Hashed::create(&path)?;
        for key in held {
            let id = crate::MessageKey(u64::from_be_bytes(key[..].try_into().map_err(|_| StoreError::Corrupt {
                tree: crate::schema::MESSAGE_REFS,
                message: "a key is not a message key".into(),
            })?));
            let raw = self.trees.files.read(id)?.ok_or_else(|| StoreError::Io {
                path: self.trees.files.path(id),
                message: format!("message {id} is held but its file is missing: run `nightmail check`"),
            })?;
            out.record(key, &raw).map_err(io_error(&path))?;
        }
        let (bytes, sha256) = out.finish().map_err(io_error(&path))?;
        sync_dir(dir)?;
        Ok(TreeCopy { name: crate::message_files::DIR.into(), file, entries: held.len() as u64, bytes, sha256 })
    }
}

/// Reads the manifest of the backup in `dir` and checks every file against it (size, SHA-256,
/// record count). Returns the manifest, or says what is wrong.
pub fn verify_backup(dir: &Path) -> Result<Manifest, StoreError> {
    let text = match std::fs::read(dir.join(MANIFEST)) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(bad(
                dir,
                "no manifest.json: this is not a nightmail backup, or the backup was interrupted before it finished (take it again)".into(),
            ));
        }
        Err(e) => return Err(io_error(dir)(e)),
    };
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| bad(dir, format!("manifest.json is damaged: {e}")))?;
    if manifest.format != FORMAT {
        return Err(bad(dir, format!("unknown backup format `{}` (this build reads `{FORMAT}`)", manifest.format)));
    }
    if manifest.schema_version > SCHEMA_VERSION {
        return Err(StoreError::TooNew { found: manifest.schema_version, known: SCHEMA_VERSION });
    }
    for tree in manifest.trees.iter().chain(&manifest.messages) {
        let (bytes, sha256, entries) = read_tree(dir, tree, |_, _| Ok(()))?;
        check_sums(dir, &tree.file, (bytes, &sha256), (tree.bytes, &tree.sha256))?;
        if entries != tree.entries {
            return Err(bad(dir, format!("{} holds {entries} records, the manifest says {}", tree.file, tree.entries)));
        }
    }
    for file in &manifest.files {
        let relative = safe_relative(dir, &file.path)?;
        let path = dir.join("files").join(relative);
        let data = std::fs::read(&path).map_err(|e| bad(dir, format!("files/{}: {e}", file.path)))?;
        let sha256 = hex(&Sha256::digest(&data));
        check_sums(dir, &format!("files/{}", file.path), (data.len() as u64, &sha256), (file.bytes, &file.sha256))?;
    }
    Ok(manifest)
}

fn check_sums(dir: &Path, file: &str, found: (u64, &str), expected: (u64, &str)) -> Result<(), StoreError> {
    if found.0 != expected.0 {
        return Err(bad(
            dir,
            format!("{file} is {} bytes, the manifest says {}: the backup is incomplete", found.0, expected.0),
        ));
    }
    if found.1 != expected.1 {
        return Err(bad(dir, format!("{file} does not match its SHA-256 in the manifest: the backup is damaged")));
    }
    Ok(())
}

/// A manifest's path must stay inside the backup (and the data directory it is restored to).
fn safe_relative<'a>(dir: &Path, path: &'a str) -> Result<&'a Path, StoreError> {
    let relative = Path::new(path);
    if relative.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
        Ok(relative)
    } else {
        Err(bad(dir, format!("the manifest names a file outside the backup: {path}")))
    }
}

/// Reads one tree file, giving each record to `each`; returns (bytes, SHA-256, records).
fn read_tree(
    dir: &Path,
    tree: &TreeCopy,
    mut each: impl FnMut(Vec<u8>, Vec<u8>) -> Result<(), StoreError>,
) -> Result<(u64, String, u64), StoreError> {
    let relative = safe_relative(dir, &tree.file)?;
    let path = dir.join(relative);
    let file = File::open(&path).map_err(|e| bad(dir, format!("{}: {e}", tree.file)))?;
    let mut input = BufReader::new(file);
    let mut hash = Sha256::new();
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut part = |input: &mut BufReader<File>, first: bool| -> Result<Option<Vec<u8>>, StoreError> {
        let mut len = [0u8; 4];
        match input.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && first => return Ok(None),
            Err(_) => return Err(bad(dir, format!("{} ends inside a record: the backup is incomplete", tree.file))),
        }
        let n = u32::from_be_bytes(len) as u64;
        if bytes + 4 + n > tree.bytes {
            return Err(bad(dir, format!("{} has a record running past its size in the manifest", tree.file)));
        }
        let mut data = vec![0u8; n as usize];
        input
            .read_exact(&mut data)
            .map_err(|_| bad(dir, format!("{} ends inside a record: the backup is incomplete", tree.file)))?;
        hash.update(len);
        hash.update(&data);
        bytes += 4 + n;
        Ok(Some(data))
    };
    while let Some(key) = part(&mut input, true)? {
        let value = part(&mut input, false)?.expect("a value follows its key");
        entries += 1;
        each(key, value)?;
    }
    Ok((bytes, hex(&hash.finalize()), entries))
}

/// Restores the backup in `backup` into `store_dir` (which must be empty or absent), and its
/// files under `files_dir` (the data directory). The whole backup is verified before anything is
/// written. The store is then opened (migrating an older backup) and checked; returns the
/// manifest and the check.
pub fn restore(backup: &Path, store_dir: &Path, files_dir: &Path) -> Result<(Manifest, crate::Integrity), StoreError> {
    let manifest = verify_backup(backup)?;
    ensure_empty(store_dir, "the store directory")?;
    // sled keeps its id generator outside the trees, and on opening a store it has used it
    // recovers the counter at the last persisted value plus twice its persist interval (sled 0.34
    // `pagecache/mod.rs`), persisted values being multiples of the interval. So the new store is
    // written, then opened once more with an interval that is a multiple of sled's default and at
    // least `next_id`: the counter is recovered, and persisted, above every id in the backup.
    let interval = manifest.next_id.div_ceil(IDGEN_INTERVAL).max(1) * IDGEN_INTERVAL;
    // The files first, synced each, as a live store writes them before their references.
    if let Some(messages) = &manifest.messages {
        let files = crate::message_files::MessageFiles::new(store_dir);
        read_tree(backup, messages, |key, raw| {
            let key: [u8; 8] = key.try_into().map_err(|_| bad(backup, "messages.kv holds a bad key".into()))?;
            files.write(crate::MessageKey(u64::from_be_bytes(key)), &raw)
        })?;
    }
    for pass in 0..2 {
        let db = sled::Config::new().path(store_dir).idgen_persist_interval(interval).open()?;
        if pass == 0 {
            for tree in &manifest.trees {
                let target = db.open_tree(&tree.name)?;
                let mut batch = sled::Batch::default();
                let mut pending = 0;
                read_tree(backup, tree, |key, value| {
                    batch.insert(key, value);
                    pending += 1;
                    if pending == 1024 {
                        target.apply_batch(std::mem::take(&mut batch))?;
                        pending = 0;
                    }
                    Ok(())
                })?;
                target.apply_batch(batch)?;
            }
        }
        crate::durable::Durability::new(store_dir).and_then(|d| d.flush(&db)).map_err(io_error(store_dir))?;
    }
    for file in &manifest.files {
        let relative = safe_relative(backup, &file.path)?;
        let target = files_dir.join(relative);
        let parent = target.parent().expect("a restored file has a parent");
        std::fs::create_dir_all(parent).map_err(io_error(parent))?;
        let data = std::fs::read(backup.join("files").join(relative)).map_err(io_error(backup))?;
        let mut out = Hashed::create(&target)?;
        out.write(&data).map_err(io_error(&target))?;
        out.finish().map_err(io_error(&target))?;
        sync_dir(parent)?;
    }
    let store = Store::open(store_dir)?;
    let integrity = store.check()?;
    Ok((manifest, integrity))
}
