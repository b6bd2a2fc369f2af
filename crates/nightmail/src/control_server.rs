//! The daemon's side of the control socket (`control.rs`): one task per connection reads a
//! request line and answers it from the store.

use std::path::{Path, PathBuf};

use nightmail_store::Store;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use crate::control::Request;
use crate::status::Report;

pub async fn serve(listener: UnixListener, store: Store, data_dir: PathBuf, mut stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("control socket accept failed: {e}");
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let (store, data_dir) = (store.clone(), data_dir.clone());
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &store, &data_dir).await {
                tracing::debug!("control request failed: {e}");
            }
        });
    }
}

async fn answer(stream: UnixStream, store: &Store, data_dir: &Path) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).take_line(&mut line).await?;
    let response = match serde_json::from_str::<Request>(&line) {
        Ok(Request::Status) => serde_json::to_value(Report::from_store(store, data_dir, "daemon")?)?,
        Ok(Request::OutboundRetry { id }) => crate::outbound::answer(store, crate::outbound::Action::Retry, id).await,
        Ok(Request::OutboundDrop { id }) => crate::outbound::answer(store, crate::outbound::Action::Drop, id).await,
        Ok(Request::Backup { dir }) => crate::backup::answer_backup(store, data_dir, dir).await,
        Ok(Request::Check) => crate::backup::answer_check(store).await,
        Ok(Request::Reindex { users }) => crate::reindex::answer(store, data_dir, users).await,
        Err(e) => serde_json::json!({ "error": format!("bad request: {e}") }),
    };
    let mut text = serde_json::to_vec(&response)?;
    text.push(b'\n');
    write.write_all(&text).await?;
    Ok(())
}

trait TakeLine {
    async fn take_line(&mut self, line: &mut String) -> std::io::Result<usize>;
}

impl<R: tokio::io::AsyncRead + Unpin> TakeLine for BufReader<R> {
    /// A request line of at most 64 KiB.
    async fn take_line(&mut self, line: &mut String) -> std::io::Result<usize> {
        use tokio::io::AsyncReadExt;
        let mut limited = self.take(64 * 1024);
        limited.read_line(line).await
    }
}
