//! `nightmail outbound retry|drop ID`: acts on waiting outbound mail, through the running daemon
//! if there is one (sled admits one process), else on the store directly.

use anyhow::{Context, bail};
use nightmail_config::Config;
use nightmail_store::{OutboundId, Store};
use nightmail_types::Timestamp;

use crate::control::Request;
use crate::status::OutboundView;

#[derive(Clone, Copy)]
pub enum Action {
    Retry,
    Drop,
}

/// Applies `action` to entry `id`: `{"ok": entry}` or `{"error": why}`, as the control socket
/// answers.
pub async fn answer(store: &Store, action: Action, id: u64) -> serde_json::Value {
    let now = Timestamp::now();
    let result = match action {
        Action::Retry => store.retry_outbound(OutboundId(id), now).await,
        Action::Drop => store.drop_outbound(OutboundId(id), now).await,
    };
    match result {
        Ok(entry) => serde_json::json!({ "ok": OutboundView::of(&entry, now) }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

pub fn run(config: &Config, action: Action, id: u64) -> anyhow::Result<()> {
    let request = match action {
        Action::Retry => Request::OutboundRetry { id },
        Action::Drop => Request::OutboundDrop { id },
    };
    let value = crate::control::ask_or_open(config, &request, std::time::Duration::from_secs(30), |store| {
        Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(answer(store, action, id)))
    })?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        bail!("{error}");
    }
    let entry: OutboundView = serde_json::from_value(value["ok"].clone()).context("the answer about the entry")?;
    match action {
        Action::Retry => {
            println!("outbound {} to {}: due now (attempt {} next)", entry.id, entry.recipient, entry.attempts + 1)
        }
        Action::Drop => println!("outbound {} to {}: dropped", entry.id, entry.recipient),
    }
    Ok(())
}
