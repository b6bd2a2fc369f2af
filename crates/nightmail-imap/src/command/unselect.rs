//! UNSELECT (RFC 3691, RFC 9051 §6.4.2): leaves the selected state without expunging.

use super::Done;
use crate::ImapError;
use crate::session::Session;

pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    s.selected()?;
    s.deselect();
    Ok(Done::ok("UNSELECT completed"))
}
