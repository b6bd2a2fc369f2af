//! SEARCHRES (RFC 5182, part of IMAP4rev2: RFC 9051 §6.4.4.1): `SEARCH RETURN (SAVE)` keeps the
//! result in the selected mailbox's search result variable (`Selected::saved`, UIDs, so an
//! expunge takes its messages out), and `$` names it wherever a sequence set may stand.
//!
//! imap-codec 2.0.0-alpha.10 has no `$` in its sequence-set grammar, so a command it refused is
//! rewritten here with the saved set written out and handed back to imap-codec: message numbers
//! for FETCH, STORE, COPY and MOVE, UIDs for their UID forms, and the key `UID set` inside SEARCH,
//! SORT and THREAD criteria (§2.1: `$` there is the saved messages whichever way the command
//! numbers them). An empty variable is an empty set (§2.1): UID 4294967295, which names no
//! message, and a message-number command becomes its UID form over it (nothing to do either way).
//! Only the command line before any literal is rewritten.

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_next::imap_types::IntoStatic;
use imap_next::imap_types::command::Command;
use nightmail_store::Uid;

use super::esearch::sequence_set;
use crate::session::Session;

/// A UID no mailbox reaches: an empty set in a grammar that has none.
const NO_UID: u32 = u32::MAX;

/// RFC 5182 §2.4: what SAVE keeps of the matches (UIDs in mailbox order): all of them, or with
/// MIN and/or MAX but neither ALL nor COUNT, only the lowest and/or highest.
pub(crate) fn kept(uids: &[Uid], min: bool, max: bool, whole: bool) -> Vec<Uid> {
    if whole || !(min || max) {
        return uids.to_vec();
    }
    let mut kept: Vec<Uid> = Vec::new();
    if min && let Some(&first) = uids.first() {
        kept.push(first);
    }
    if max
        && let Some(&last) = uids.last()
        && !kept.contains(&last)
    {
        kept.push(last);
    }
    kept
}

/// Byte ranges of the standalone `$` tokens of the command line (outside quoted strings, before
/// any literal).
fn dollars(line: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    for (i, &b) in line.iter().enumerate() {
        if quoted {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => quoted = true,
            b'{' | b'~' => break,
            b'$' => {
                let before = i.checked_sub(1).map(|j| line[j]);
                let after = line.get(i + 1).copied();
                if matches!(before, Some(b' ' | b'(')) && matches!(after, None | Some(b' ' | b')')) {
                    found.push(i);
                }
            }
            _ => {}
        }
    }
    found
}

/// The command with each `$` written out, or `None` when it has none (or no mailbox is selected).
pub(crate) fn substitute(s: &mut Session, bytes: &[u8]) -> Option<Vec<u8>> {
    let end = bytes.windows(2).position(|w| w == b"\r\n").unwrap_or(bytes.len());
    let positions = dollars(&bytes[..end]);
    if positions.is_empty() {
        return None;
    }
    let selected = s.selected().ok()?;
    // The saved UIDs still in the view, and their message numbers.
    let present: Vec<(u32, u32)> =
        selected.saved.iter().filter_map(|uid| selected.index_of_uid(*uid).map(|i| (i as u32 + 1, uid.0))).collect();
    let mut seqs: Vec<u32> = present.iter().map(|p| p.0).collect();
    let mut uids: Vec<u32> = present.iter().map(|p| p.1).collect();
    seqs.sort_unstable();
    uids.sort_unstable();
    let uid_set = if uids.is_empty() { NO_UID.to_string() } else { sequence_set(&uids) };
    let words: Vec<String> =
        bytes[..end].split(|&b| b == b' ').take(3).map(|w| String::from_utf8_lossy(w).to_ascii_uppercase()).collect();
    let uid_command = words.get(1).is_some_and(|w| w == "UID");
    let name = words.get(if uid_command { 2 } else { 1 }).cloned().unwrap_or_default();
    let criteria = matches!(name.as_str(), "SEARCH" | "SORT" | "THREAD");
    let mut out = Vec::with_capacity(bytes.len() + 64);
    let mut from = 0;
    let mut make_uid = false;
    for &at in &positions {
        out.extend_from_slice(&bytes[from..at]);
        let text = match (criteria, uid_command) {
            (true, _) => format!("UID {uid_set}"),
            (false, true) => uid_set.clone(),
            (false, false) if seqs.is_empty() => {
                make_uid = true;
                NO_UID.to_string()
            }
            (false, false) => sequence_set(&seqs),
        };
        out.extend_from_slice(text.as_bytes());
        from = at + 1;
    }
    out.extend_from_slice(&bytes[from..]);
    if make_uid {
        // `tag CMD NO_UID ...` becomes `tag UID CMD NO_UID ...`.
        let space = out.iter().position(|&b| b == b' ')?;
        out.splice(space + 1..space + 1, b"UID ".iter().copied());
    }
    Some(out)
}

/// A rewritten command as imap-codec reads it; `None` if it still needs one of our grammars
/// (SEARCH RETURN, say).
pub(crate) fn parse(bytes: &[u8]) -> Option<Command<'static>> {
    let (_, command) = CommandCodec::default().decode(bytes).ok()?;
    Some(command.into_static())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_tokens_are_found_outside_strings_and_literals() {
        assert_eq!(dollars(b"a FETCH $ (FLAGS)"), [8]);
        assert_eq!(dollars(b"a SEARCH OR ($ SEEN) SUBJECT \"$\""), [13]);
        assert!(dollars(b"a SEARCH SUBJECT $x").is_empty());
        assert!(dollars(b"a SEARCH SUBJECT {1}").is_empty());
    }

    #[test]
    fn save_keeps_all_or_the_ends_asked_for() {
        let uids = [Uid(2), Uid(5), Uid(9)];
        assert_eq!(kept(&uids, false, false, false), uids);
        assert_eq!(kept(&uids, true, false, false), [Uid(2)]);
        assert_eq!(kept(&uids, true, true, false), [Uid(2), Uid(9)]);
        assert_eq!(kept(&uids, true, false, true), uids);
        assert!(kept(&[], true, true, false).is_empty());
    }
}
