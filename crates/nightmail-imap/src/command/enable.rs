//! ENABLE (RFC 5161 §3.1): nightmail has no extension that needs enabling, so the ENABLED
//! response lists none; unknown capabilities are ignored as the RFC requires.

use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::extensions::enable::CapabilityEnable;
use imap_next::imap_types::response::Data;

use super::Done;
use crate::ImapError;
use crate::session::{Session, State};

pub(crate) fn run(s: &mut Session, _wanted: Vec1<CapabilityEnable<'static>>) -> Result<Done, ImapError> {
    // RFC 5161 §3.1: valid only in the authenticated state.
    if !matches!(s.state, State::Authenticated(_)) {
        return Err(ImapError::bad("ENABLE is only valid after login and before SELECT"));
    }
    s.data(Data::Enabled { capabilities: vec![] });
    Ok(Done::ok("ENABLE completed"))
}
