//! The control socket, `data_dir/control.sock`: how `nightmail status` asks a running daemon,
//! since sled lets only one process open the store. One JSON request line, one JSON answer line.

use std::path::{Path, PathBuf};

use anyhow::Context;
use nightmail_store::Store;
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;

#[derive(Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Request {
    Status,
    /// Make a waiting outbound entry due now.
    OutboundRetry {
        id: u64,
    },
    /// Give up on a waiting outbound entry.
    OutboundDrop {
        id: u64,
    },
    /// Write a consistent copy of the store into `dir` (absolute, empty or absent).
    Backup {
        dir: PathBuf,
    },
    /// Check that every index points at existing records and bytes.
    Check,
    /// Rebuild the mail index (`search_mail`) of these users: address and mailbox owner name,
    /// from the asking command's configuration.
    Reindex {
        users: Vec<(nightmail_types::Address, String)>,
    },
}

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

pub fn bind(data_dir: &Path) -> anyhow::Result<UnixListener> {
    let path = socket_path(data_dir);
    // The store lock is already ours, so a socket file left here is from a daemon that died.
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path).with_context(|| format!("binding the control socket {}", path.display()))
}

pub fn unlink(data_dir: &Path) {
    let _ = std::fs::remove_file(socket_path(data_dir));
}

/// Asks the daemon whose data is in `data_dir`. `Ok(None)` when no daemon answers.
pub fn ask(data_dir: &Path, request: &Request) -> anyhow::Result<Option<serde_json::Value>> {
    ask_with(data_dir, request, std::time::Duration::from_secs(30))
}

/// [`ask`], waiting up to `wait` for the answer.
pub fn ask_with(
    data_dir: &Path,
    request: &Request,
    wait: std::time::Duration,
) -> anyhow::Result<Option<serde_json::Value>> {
    use std::io::{BufRead, Write};
    let path = socket_path(data_dir);
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(&path) else {
        return Ok(None);
    };
    stream.set_read_timeout(Some(wait))?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer)?;
    Ok(Some(serde_json::from_str(&answer).context("the daemon's answer on the control socket")?))
}

/// Asks the daemon whose data is in `config.data_dir`; when none answers, opens the store (sled
/// admits one process, so this works only while no daemon runs) and runs `direct` on it.
pub fn ask_or_open(
    config: &nightmail_config::Config,
    request: &Request,
    wait: std::time::Duration,
    direct: impl FnOnce(&Store) -> anyhow::Result<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    if let Some(value) = ask_with(&config.data_dir, request, wait)? {
        return Ok(value);
    }
    let dir = config.data_dir.join("store");
    let store = Store::open(&dir).with_context(|| {
        format!("no daemon answered on {}, and the store is not readable", socket_path(&config.data_dir).display())
    })?;
    direct(&store)
}
