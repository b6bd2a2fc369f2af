//! CHECK (RFC 3501 §6.4.1): a checkpoint. Every change is already flushed to disk when its
//! command completes, so there is nothing to do but report changes (RFC 9051 drops CHECK).

use super::Done;
use crate::ImapError;
use crate::session::Session;

pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    s.selected()?;
    Ok(Done::ok("CHECK completed"))
}
