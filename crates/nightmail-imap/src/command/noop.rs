//! NOOP (RFC 3501 §6.1.2): does nothing but lets the server report mailbox changes, which
//! `dispatch` does after every command. Clients without IDLE poll with it (mutt does).

use super::Done;
use crate::ImapError;
use crate::session::Session;

pub(crate) fn run(_s: &mut Session) -> Result<Done, ImapError> {
    Ok(Done::ok("NOOP completed"))
}
