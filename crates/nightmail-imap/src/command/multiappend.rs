//! MULTIAPPEND (RFC 3502): several messages in one APPEND, stored all or none (`append::run_all`).
//!
//! RFC 3502 §6:
//!
//! ```abnf
//! append         = "APPEND" SP mailbox 1*append-message
//! append-message = [SP flag-list] [SP date-time] SP literal
//! ```
//!
//! imap-codec 2.0.0-alpha.10 parses only one `append-message`, so it refuses such a command once
//! imap-next has read all of it (each literal through imap-next's own literal handling: its
//! limit and continuation request). This module takes the refused bytes apart with imap-codec's
//! `Fragmentizer` (lines and literals, never framed by hand) and has imap-codec parse each
//! message as a one-message APPEND: the first with the command's own mailbox, the others after
//! a stand-in `APPEND INBOX`.

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_codec::fragmentizer::{FragmentInfo, Fragmentizer};
use imap_next::imap_types::IntoStatic;
use imap_next::imap_types::command::{Command, CommandBody};
use imap_next::imap_types::core::{Tag, Vec1};
use imap_next::imap_types::mailbox::Mailbox;

use super::append::AppendMessage;

/// A MULTIAPPEND of two or more messages, each parsed by imap-codec.
pub(crate) struct MultiAppend {
    pub tag: Tag<'static>,
    pub mailbox: Mailbox<'static>,
    pub messages: Vec1<AppendMessage>,
}

/// `bytes` (a whole command imap-codec refused) as a MULTIAPPEND, if it is one.
pub(crate) fn recognise(bytes: &[u8]) -> Option<MultiAppend> {
    let mut fragments = Fragmentizer::without_max_message_size();
    fragments.enqueue_bytes(bytes);
    // Where each literal ends: the bytes up to one end and after the one before make one piece.
    let mut literal_ends = Vec::new();
    loop {
        let info = fragments.progress()?;
        if let FragmentInfo::Literal { end, .. } = info {
            literal_ends.push(end);
        }
        if fragments.is_message_complete() {
            break;
        }
    }
    let message = fragments.message_bytes();
    let last = *literal_ends.last()?;
    if &message[last..] != b"\r\n" {
        return None;
    }
    // The first message: the shortest run of pieces that is a whole APPEND (the mailbox may be a
    // literal itself).
    let (taken, first) =
        literal_ends.iter().enumerate().find_map(|(i, &end)| Some((i + 1, parse(&message[..end])?)))?;
    let CommandBody::Append { mailbox, flags, date, message: data } = first.body else { return None };
    let mut messages = vec![AppendMessage { flags, date, message: data }];
    for pair in literal_ends[taken - 1..].windows(2) {
        let mut one = b"x APPEND INBOX".to_vec();
        one.extend_from_slice(&message[pair[0]..pair[1]]);
        let CommandBody::Append { flags, date, message: data, .. } = parse(&one)?.body else { return None };
        messages.push(AppendMessage { flags, date, message: data });
    }
    if messages.len() < 2 {
        return None;
    }
    Some(MultiAppend { tag: first.tag, mailbox, messages: Vec1::try_from(messages).ok()? })
}

/// `command` and a CRLF, parsed by imap-codec as an APPEND with nothing left over (also
/// `catenate`'s way to read a message's flags and date).
pub(crate) fn parse(command: &[u8]) -> Option<Command<'static>> {
    let mut line = command.to_vec();
    line.extend_from_slice(b"\r\n");
    match CommandCodec::default().decode(&line) {
        Ok((rest, command)) if rest.is_empty() && matches!(command.body, CommandBody::Append { .. }) => {
            Some(command.into_static())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use imap_next::imap_types::mailbox::Mailbox;

    use super::recognise;

    #[test]
    fn messages_are_taken_apart_by_literal() {
        let cmd = b"a1 APPEND {6}\r\nDrafts (\\Seen) {3}\r\nabc \"24-Mar-2007 23:00:00 +0200\" {2}\r\nde {1}\r\nf\r\n";
        let multi = recognise(cmd).unwrap();
        assert_eq!(multi.tag.as_ref(), "a1");
        assert!(matches!(&multi.mailbox, Mailbox::Other(_)));
        let messages = multi.messages.as_ref();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[0].flags.len(), 1);
        assert!(messages[1].date.is_some() && messages[1].flags.is_empty());
        assert!(messages[2].date.is_none());
    }

    #[test]
    fn one_message_or_a_bad_one_is_not_a_multiappend() {
        assert!(recognise(b"a1 APPEND INBOX {3}\r\nabc\r\n").is_none());
        assert!(recognise(b"a1 APPEND INBOX {3}\r\nabc (\\Seen {2}\r\nde\r\n").is_none());
        assert!(recognise(b"a1 APPEND INBOX {3}\r\nabc {2}\r\nde junk\r\n").is_none());
        assert!(recognise(b"a1 SEARCH {3}\r\nabc {2}\r\nde\r\n").is_none());
    }
}
