//! COMPRESS DEFLATE (RFC 4978): after the tagged OK both directions are raw DEFLATE (RFC 1951),
//! each response flushed with a sync flush so the client can read it at once (§4). Allowed once,
//! after login (§3: a second COMPRESS gets NO [COMPRESSIONACTIVE]).

use imap_next::imap_types::extensions::compress::CompressionAlgorithm;
use imap_next::imap_types::response::Code;

use super::Done;
use crate::ImapError;
use crate::session::{Flow, Session, State};

pub(crate) fn run(s: &mut Session, algorithm: CompressionAlgorithm) -> Result<Done, ImapError> {
    if matches!(s.state, State::NotAuthenticated) {
        return Err(ImapError::bad("COMPRESS is only allowed after login"));
    }
    if s.compressed {
        return Err(ImapError::no_with(Code::CompressionActive, "compression is already active"));
    }
    match algorithm {
        CompressionAlgorithm::Deflate => Ok(Done { flow: Flow::Compress, ..Done::ok("DEFLATE active") }),
        _ => Err(ImapError::no("only DEFLATE is supported")),
    }
}
