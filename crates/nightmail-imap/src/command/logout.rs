//! LOGOUT (RFC 3501 §6.1.3): untagged BYE, tagged OK, then the server closes the connection.

use imap_next::imap_types::response::Status;

use super::{Done, text};
use crate::ImapError;
use crate::session::{Flow, Session};

pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    let Ok(bye) = Status::bye(None, text("nightmail logging out"));
    s.server.enqueue_status(bye);
    Ok(Done { flow: Flow::Close, ..Done::ok("LOGOUT completed") })
}
