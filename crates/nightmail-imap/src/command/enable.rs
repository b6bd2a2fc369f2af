//! ENABLE (RFC 5161 §3.1): UTF8=ACCEPT (RFC 6855 §3) is the one extension that needs enabling;
//! ENABLED lists it when asked for, and unknown capabilities are ignored as the RFC requires.

use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::extensions::enable::CapabilityEnable;
use imap_next::imap_types::extensions::utf8::Utf8Kind;
use imap_next::imap_types::response::Data;

use super::Done;
use crate::ImapError;
use crate::session::{Session, State};

pub(crate) fn run(s: &mut Session, wanted: Vec1<CapabilityEnable<'static>>) -> Result<Done, ImapError> {
    // RFC 5161 §3.1: valid only in the authenticated state.
    if !matches!(s.state, State::Authenticated(_)) {
        return Err(ImapError::bad("ENABLE is only valid after login and before SELECT"));
    }
    let utf8 = CapabilityEnable::Utf8(Utf8Kind::Accept);
    let mut enabled = Vec::new();
    if wanted.as_ref().contains(&utf8) {
        s.utf8 = true;
        enabled.push(utf8);
    }
    s.data(Data::Enabled { capabilities: enabled });
    Ok(Done::ok("ENABLE completed"))
}
