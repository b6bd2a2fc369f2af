//! CAPABILITY (RFC 3501 §6.1.1, §7.2.1): what this server speaks. STARTTLS only while the
//! connection is plain and TLS is configured (RFC 3501 §6.2.1); LOGINDISABLED until login is
//! allowed (§6.2.3: off loopback, only after STARTTLS).

use imap_next::imap_types::auth::AuthMechanism;
use imap_next::imap_types::core::{Atom, Vec1};
use imap_next::imap_types::extensions::compress::CompressionAlgorithm;
use imap_next::imap_types::extensions::thread::ThreadingAlgorithm;
use imap_next::imap_types::extensions::utf8::Utf8Kind;
use imap_next::imap_types::response::{Capability, Data};

use super::Done;
use crate::ImapError;
use crate::session::Session;

fn other(atom: &'static str) -> Capability<'static> {
    Capability::from(Atom::unvalidated(atom))
}

pub(crate) fn list(s: &Session) -> Vec1<Capability<'static>> {
    // RFC 9051: IMAP4rev2 beside IMAP4rev1; a client picks it with ENABLE (`command/rev2.rs`).
    let mut caps = vec![Capability::Imap4Rev1, other("IMAP4rev2")];
    if s.shared.tls.is_some() && !s.tls_active {
        caps.push(Capability::StartTls);
    }
    if s.login_allowed() {
        caps.push(Capability::Auth(AuthMechanism::Plain));
        caps.push(Capability::SaslIr);
    } else {
        caps.push(Capability::LoginDisabled);
    }
    caps.extend([
        Capability::Idle,
        Capability::Enable,
        Capability::Id,
        Capability::Namespace,
        Capability::UidPlus,
        Capability::Move,
        Capability::Unselect,
        other("SPECIAL-USE"),
        other("CHILDREN"),
        // RFC 7888: imap-next reads `{n+}` without a continuation request, and refuses one over
        // the literal limit with BAD once it is read (the bytes are never taken for commands).
        Capability::LiteralPlus,
        // RFC 5256: grammar from imap-codec; `command/sort.rs`, `command/thread.rs`.
        Capability::Sort(None),
        // RFC 5957: DISPLAYFROM and DISPLAYTO, `order::Keys`.
        Capability::Sort(Some(imap_next::imap_types::extensions::sort::SortAlgorithm::Display)),
        Capability::Thread(ThreadingAlgorithm::References),
        Capability::Thread(ThreadingAlgorithm::OrderedSubject),
        // RFC 4731, RFC 5267 §3: the RETURN clause and ESEARCH response are ours
        // (`command/esearch.rs`).
        other("ESEARCH"),
        other("ESORT"),
        // RFC 5267 §4: RETURN (UPDATE, CONTEXT, PARTIAL) and CANCELUPDATE, `command/context.rs`.
        other("CONTEXT=SEARCH"),
        // RFC 5258, RFC 5819: the grammar is ours (`command/list_extended.rs`), the listing
        // `command/list.rs`.
        other("LIST-EXTENDED"),
        other("LIST-STATUS"),
        // RFC 3516: `command/binary.rs`.
        Capability::Binary,
        // RFC 6855: `enable.rs`, names in `mailbox_name`/`wire_name`, APPEND's UTF8 data in
        // `append::utf8_data`.
        Capability::Utf8(Utf8Kind::Accept),
        // RFC 7162: `command/condstore.rs`, mod-sequences from the store's schema 10.
        Capability::CondStore,
        Capability::QResync,
        // RFC 3502: `command/multiappend.rs`, stored all or none by `append::run_all`.
        other("MULTIAPPEND"),
        // RFC 4469: `command/catenate.rs`, URLs (RFC 5092) in `imap_url.rs`; no URLAUTH.
        other("CATENATE"),
        // RFC 5465: `command/notify.rs` (grammar), `notify.rs` (the feed).
        other("NOTIFY"),
        // RFC 8438: STATUS SIZE, `command/status.rs` (imap-codec's `ext_status_size`).
        other("STATUS=SIZE"),
        // RFC 5182: RETURN (SAVE) and `$`, `command/searchres.rs`.
        other("SEARCHRES"),
    ]);
    // RFC 4978: `command/compress.rs`, until it is active.
    if !s.compressed {
        caps.push(Capability::Compress { algorithm: CompressionAlgorithm::Deflate });
    }
    Vec1::try_from(caps).expect("IMAP4rev1 is always listed")
}

/// RFC 3501 §6.1.1.
pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    let caps = list(s);
    s.data(Data::Capability(caps));
    Ok(Done::ok("CAPABILITY completed"))
}
