//! LOGOUT (RFC 3501 §6.1.3): untagged BYE, tagged OK, then the server closes the connection.
//! Updates to the selected mailbox still pending are sent before the BYE (§7.4.1: a client
//! in LOGOUT state can no longer take them); `dispatch` sends none after it.

use imap_next::imap_types::response::Status;

use super::{Done, text};
use crate::ImapError;
use crate::session::{Flow, Session};

pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    if let Err(e) = s.sync(true) {
        tracing::warn!("imap: mailbox update before LOGOUT failed: {e}");
    }
    let Ok(bye) = Status::bye(None, text("nightmail logging out"));
    s.server.enqueue_status(bye);
    Ok(Done { flow: Flow::Close, ..Done::ok("LOGOUT completed") })
}
