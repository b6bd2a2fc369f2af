//! One module per command, each citing the section it implements. `dispatch` checks nothing but
//! sends each parsed command to its module, then reports mailbox changes and the tagged result.

pub(crate) mod append;
pub(crate) mod authenticate;
pub(crate) mod binary;
pub(crate) mod capability;
pub(crate) mod catenate;
pub(crate) mod check;
pub(crate) mod close;
pub(crate) mod compress;
pub(crate) mod condstore;
pub(crate) mod context;
pub(crate) mod copy;
pub(crate) mod create;
pub(crate) mod delete;
pub(crate) mod enable;
pub(crate) mod esearch;
pub(crate) mod expunge;
pub(crate) mod fetch;
pub(crate) mod id;
pub(crate) mod idle;
pub(crate) mod list;
pub(crate) mod list_extended;
pub(crate) mod login;
pub(crate) mod logout;
pub(crate) mod r#move;
pub(crate) mod multiappend;
pub(crate) mod namespace;
pub(crate) mod noop;
pub(crate) mod notify;
pub(crate) mod rename;
pub(crate) mod rev2;
pub(crate) mod search;
pub(crate) mod searchres;
pub(crate) mod select;
pub(crate) mod sort;
pub(crate) mod starttls;
pub(crate) mod status;
pub(crate) mod store;
pub(crate) mod subscribe;
pub(crate) mod thread;
pub(crate) mod unselect;

use std::borrow::Cow;

use imap_next::imap_types::command::{Command, CommandBody};
use imap_next::imap_types::core::{AString, IString};
use imap_next::imap_types::core::{Tag, Text};
use imap_next::imap_types::extensions::utf8::QuotedUtf8;
use imap_next::imap_types::flag::Flag;
use imap_next::imap_types::mailbox::{Mailbox, MailboxOther};
use imap_next::imap_types::response::{Code, StatusKind};
use nightmail_types::utf7;

use crate::ImapError;
use crate::session::{Flow, Session};

/// A command that succeeded: the tagged OK's code and text, and what the connection does next.
pub(crate) struct Done {
    pub code: Option<Code<'static>>,
    pub text: Cow<'static, str>,
    pub flow: Flow,
}

impl Done {
    pub fn ok(text: impl Into<Cow<'static, str>>) -> Done {
        Done { code: None, text: text.into(), flow: Flow::Continue }
    }

    pub fn with_code(code: Code<'static>, text: impl Into<Cow<'static, str>>) -> Done {
        Done { code: Some(code), text: text.into(), flow: Flow::Continue }
    }
}

/// Response text (RFC 3501 §9 `text`: 7-bit characters, no CR or LF, not empty). Our texts cite
/// sections as "§", and a mailbox name or a client's word may bring any character, so each
/// character `text` cannot carry is written in ASCII ("§" as "section ", a line break as a
/// space, anything else as "?") rather than losing the whole explanation; an empty text becomes a
/// plain word.
pub(crate) fn text(message: &str) -> Text<'static> {
    let mut ascii = String::with_capacity(message.len());
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '§' => {
                ascii.push_str("section");
                if chars.peek().is_some_and(|next| !next.is_whitespace()) {
                    ascii.push(' ');
                }
            }
            '\r' | '\n' => ascii.push(' '),
            c if c.is_ascii() && c != '\0' => ascii.push(c),
            _ => ascii.push('?'),
        }
    }
    Text::try_from(ascii).unwrap_or_else(|_| Text::unvalidated("done"))
}

/// A mailbox name as the store keeps it: UTF-8, decoded from the wire's modified UTF-7
/// (RFC 3501 §5.1.3), or taken as UTF-8 once the client enabled UTF8=ACCEPT (RFC 6855 §3), with
/// INBOX canonical and a trailing hierarchy delimiter dropped (§6.3.3). A name that is neither
/// gets NO [CANNOT] (see `error.rs`).
pub(crate) fn mailbox_name(s: &Session, mailbox: &Mailbox<'_>) -> Result<String, ImapError> {
    match mailbox {
        Mailbox::Inbox => Ok("INBOX".into()),
        Mailbox::Other(other) => {
            let wire = other.inner().as_ref();
            let name = match s.utf8 {
                true => String::from_utf8(wire.to_vec()).map_err(|_| utf7::InvalidUtf7)?,
                false => utf7::decode(wire)?,
            };
            let name = name.trim_end_matches('/');
            if name.is_empty() || name.contains("//") || name.starts_with('/') {
                return Err(ImapError::no("invalid mailbox name"));
            }
            if name.eq_ignore_ascii_case("INBOX") { Ok("INBOX".into()) } else { Ok(name.to_string()) }
        }
    }
}

/// A stored name as the client is sent it: modified UTF-7, or after ENABLE UTF8=ACCEPT a quoted
/// UTF-8 string (RFC 6855 §3, RFC 9755 §3 `uQUOTED-CHAR`).
pub(crate) fn wire_name(s: &Session, name: &str) -> Option<Mailbox<'static>> {
    if s.utf8 && !name.is_ascii() {
        let quoted = QuotedUtf8::try_from(name.to_string()).ok()?;
        return Some(Mailbox::Other(MailboxOther::unvalidated(AString::String(IString::QuotedUtf8(quoted)))));
    }
    Mailbox::try_from(utf7::encode(name)).ok()
}

/// Flags as the store keeps them: system flags with their backslash, keywords as given.
pub(crate) fn flag_names(flags: &[Flag<'_>]) -> Vec<String> {
    flags.iter().map(|f| f.to_string()).filter(|f| !f.eq_ignore_ascii_case("\\Recent")).collect()
}

pub(crate) async fn dispatch(s: &mut Session, command: Command<'static>) -> Flow {
    let tag = command.tag;
    // RFC 3501 §7.4.1: no EXPUNGE while FETCH, STORE or SEARCH by sequence number runs, since
    // the client could not tell which message a number meant.
    let expunges_allowed = !matches!(
        command.body,
        CommandBody::Fetch { uid: false, .. }
            | CommandBody::Store { uid: false, .. }
            | CommandBody::Search { uid: false, .. }
            | CommandBody::Copy { uid: false, .. }
            | CommandBody::Sort { uid: false, .. }
            | CommandBody::Thread { uid: false, .. }
    );
    let logout = matches!(command.body, CommandBody::Logout);
    let result = match command.body {
        body @ CommandBody::Search { .. } if s.rev2 => rev2::search(s, &tag, body),
        CommandBody::Capability => capability::run(s),
        CommandBody::Noop => noop::run(s),
        CommandBody::Logout => logout::run(s),
        CommandBody::StartTLS => starttls::run(s),
        CommandBody::Login { username, password } => login::run(s, username, password).await,
        CommandBody::Select { mailbox, parameters } => select::run(s, mailbox, false, parameters).await,
        CommandBody::Examine { mailbox, parameters } => select::run(s, mailbox, true, parameters).await,
        CommandBody::Unselect => unselect::run(s),
        CommandBody::Create { mailbox } => create::run(s, mailbox).await,
        CommandBody::Delete { mailbox } => delete::run(s, mailbox).await,
        CommandBody::Rename { from, to } => rename::run(s, from, to).await,
        CommandBody::Subscribe { mailbox } => subscribe::run(s, mailbox, true).await,
        CommandBody::Unsubscribe { mailbox } => subscribe::run(s, mailbox, false).await,
        CommandBody::List { reference, mailbox_wildcard } => list::run(s, reference, mailbox_wildcard, false),
        CommandBody::Lsub { reference, mailbox_wildcard } => list::run(s, reference, mailbox_wildcard, true),
        CommandBody::Status { mailbox, item_names } => status::run(s, mailbox, &item_names),
        CommandBody::Append { mailbox, flags, date, message } => append::run(s, mailbox, flags, date, message).await,
        CommandBody::Check => check::run(s),
        CommandBody::Close => close::run(s).await,
        CommandBody::Expunge => expunge::run(s, None).await,
        CommandBody::ExpungeUid { sequence_set } => expunge::run(s, Some(sequence_set)).await,
        CommandBody::Search { charset, criteria, uid } => search::run(s, charset, criteria, uid),
        CommandBody::Sort { sort_criteria, charset, search_criteria, uid } => {
            sort::run(s, sort_criteria, charset, search_criteria, uid)
        }
        CommandBody::Thread { algorithm, charset, search_criteria, uid } => {
            thread::run(s, algorithm, charset, search_criteria, uid)
        }
        CommandBody::Fetch { sequence_set, macro_or_item_names, uid, modifiers } => {
            fetch::run(s, sequence_set, macro_or_item_names, uid, &modifiers).await
        }
        CommandBody::Store { sequence_set, kind, response, flags, uid, modifiers } => {
            store::run(s, sequence_set, kind, response, flags, uid, &modifiers).await
        }
        CommandBody::Copy { sequence_set, mailbox, uid } => copy::run(s, sequence_set, mailbox, uid).await,
        CommandBody::Move { sequence_set, mailbox, uid } => r#move::run(s, sequence_set, mailbox, uid).await,
        CommandBody::Enable { capabilities } => enable::run(s, capabilities),
        CommandBody::Id { parameters } => id::run(s, parameters),
        CommandBody::Namespace => namespace::run(s),
        CommandBody::Compress { algorithm } => compress::run(s, algorithm),
        // AUTHENTICATE and IDLE arrive as their own flow events; the rest are not advertised.
        _ => Err(ImapError::bad("command not supported")),
    };
    reply(s, tag, result, expunges_allowed, !logout)
}

/// CANCELUPDATE (RFC 5267 §4.3.5), which imap-codec does not parse: see `context`.
pub(crate) fn dispatch_cancel(s: &mut Session, tag: Tag<'static>, tags: Vec<String>) -> Flow {
    let result = context::cancel(s, &tags).map(|()| Done::ok("CANCELUPDATE completed"));
    reply(s, tag, result, true, true)
}

/// NOTIFY (RFC 5465), which imap-codec does not parse: see `notify`.
pub(crate) fn dispatch_notify(s: &mut Session, command: notify::Notify) -> Flow {
    let result = notify::run(s, command.request);
    reply(s, command.tag, result, true, true)
}

/// MULTIAPPEND (RFC 3502), which imap-codec does not parse: see `multiappend`.
pub(crate) async fn dispatch_multiappend(s: &mut Session, multi: multiappend::MultiAppend) -> Flow {
    let result = append::run_all(s, multi.mailbox, multi.messages).await;
    reply(s, multi.tag, result, true, true)
}

/// APPEND with CATENATE (RFC 4469), which imap-codec does not parse: see `catenate`.
pub(crate) async fn dispatch_catenate(s: &mut Session, recognised: catenate::Recognised) -> Flow {
    let result = match recognised.request {
        Ok(request) => catenate::run(s, request).await,
        Err(syntax) => Err(ImapError::bad(syntax)),
    };
    reply(s, recognised.tag, result, true, true)
}

/// The tagged reply to a command, after the untagged updates it allows (`sync`).
fn reply(
    s: &mut Session,
    tag: Tag<'static>,
    result: Result<Done, ImapError>,
    expunges_allowed: bool,
    sync: bool,
) -> Flow {
    if sync && let Err(e) = s.sync(expunges_allowed) {
        tracing::warn!("imap: mailbox update failed: {e}");
    }
    // RFC 5267 §4.3: what the command changed in the live searches, before its tagged reply.
    if sync {
        let lines = context::changes(s);
        s.write_raw(&lines);
    }
    match result {
        Ok(done) => {
            s.tagged(tag, StatusKind::Ok, done.code, &done.text);
            done.flow
        }
        Err(e) => {
            let (kind, code, message) = e.reply();
            s.tagged(tag, kind, code, &message);
            if s.close_after_reply { Flow::Close } else { Flow::Continue }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::text;

    #[test]
    fn a_text_keeps_its_words_when_it_holds_what_imap_text_cannot_carry() {
        assert_eq!(
            text("unknown LIST return option X (RFC 5258 §3)").inner(),
            "unknown LIST return option X (RFC 5258 section 3)"
        );
        assert_eq!(text("no mailbox Entwürfe\r\nhere").inner(), "no mailbox Entw?rfe  here");
        assert_eq!(text("RFC 3501 § 6.3").inner(), "RFC 3501 section 6.3");
        assert_eq!(text("").inner(), "done");
    }
}
