//! The copy of each reply in the upstream Sent folder, so the bot's mailbox at the provider shows
//! the whole conversation: APPEND (RFC 3501 §6.3.11) over a connection of its own (the reader's
//! is in IDLE), `\Seen`, creating the folder if it is missing.

use crate::connect::{ImapSession, Login};

/// Appends `raw` to `mailbox`. Failures are logged, not retried: the reply itself has gone out.
pub async fn append(login: &Login, mailbox: &str, raw: &[u8]) {
    if let Err(e) = try_append(login, mailbox, raw).await {
        tracing::warn!(server = ?login, "the reply was sent but not appended to {mailbox}: {e}");
    }
}

async fn try_append(login: &Login, mailbox: &str, raw: &[u8]) -> Result<(), String> {
    let mut session = login.session().await.map_err(|e| e.to_string())?;
    let timeout = login.timeout;
    let result = match once(&mut session, mailbox, raw, timeout).await {
        Ok(Ok(())) => Ok(()),
        // async-imap reports a refused APPEND without the server's text, so TRYCREATE (RFC 3501
        // §6.3.11) cannot be told from other refusals: CREATE (harmless if it exists) and retry.
        Ok(Err(_)) => {
            let _ = tokio::time::timeout(timeout, session.create(mailbox)).await;
            match once(&mut session, mailbox, raw, timeout).await {
                Ok(r) => r.map_err(|e| format!("APPEND: {e}")),
                Err(_) => Err("APPEND: no answer".into()),
            }
        }
        Err(_) => Err("APPEND: no answer".into()),
    };
    let _ = tokio::time::timeout(timeout, session.logout()).await;
    result?;
    tracing::info!(server = ?login, "reply appended to {mailbox}");
    Ok(())
}

async fn once(
    session: &mut ImapSession,
    mailbox: &str,
    raw: &[u8],
    timeout: std::time::Duration,
) -> Result<Result<(), async_imap::error::Error>, tokio::time::error::Elapsed> {
    tokio::time::timeout(timeout, session.append(mailbox, Some("(\\Seen)"), None, raw)).await
}
