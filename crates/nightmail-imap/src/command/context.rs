//! CONTEXT=SEARCH (RFC 5267 §4): a `SEARCH RETURN (UPDATE ...)` stays live while its mailbox is
//! selected, and after each command the session tells how its result changed with
//! `* ESEARCH (TAG "t") [UID] ADDTO (0 set)` and `REMOVEFROM (0 set)` (§4.3.3, §4.3.4); the
//! position is 0 since SEARCH results are ascending, so the numbers place themselves. CANCELUPDATE
//! (§4.3.5) ends them. A live search is re-run after every command (not during IDLE).
//!
//! Messages this session expunges are reported in REMOVEFROM before their EXPUNGE responses, by
//! the numbers they had; one another session expunged is only reported in a UID search, since
//! its sequence number is gone by the time the session learns of it (its EXPUNGE tells the
//! client anyway).
//!
//! imap-codec 2.0.0-alpha.10 does not parse CANCELUPDATE (`"CANCELUPDATE" 1*(SP tag-string)`):
//! its tag strings are parsed by imap-codec as the astrings of a `HEADER.FIELDS` list.

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_next::imap_types::command::CommandBody;
use imap_next::imap_types::core::Tag;
use imap_next::imap_types::fetch::{MacroOrMessageDataItemNames, MessageDataItemName, Section};
use imap_next::imap_types::search::SearchKey;
use nightmail_store::Uid;

use super::esearch::sequence_set;
use super::search::matching;
use crate::ImapError;
use crate::session::Session;

/// One search kept up to date (RFC 5267 §4.1 UPDATE).
pub(crate) struct LiveSearch {
    pub tag: String,
    pub uid: bool,
    pub criteria: Vec<SearchKey<'static>>,
    /// The result the client knows, ascending.
    pub uids: Vec<Uid>,
}

/// `tag CANCELUPDATE "t1" ...`: the command's tag and the tag strings, if `bytes` is one.
pub(crate) fn recognise_cancel(bytes: &[u8]) -> Option<(Tag<'static>, Vec<String>)> {
    let space = bytes.iter().position(|&b| b == b' ')?;
    let rest = bytes[space + 1..].strip_prefix(b"CANCELUPDATE ").or_else(|| {
        let word = bytes.get(space + 1..space + 14)?;
        word.eq_ignore_ascii_case(b"CANCELUPDATE ").then(|| &bytes[space + 14..])
    })?;
    let rest = rest.strip_suffix(b"\r\n")?;
    let mut fetch = bytes[..space].to_vec();
    fetch.extend_from_slice(b" FETCH 1 BODY[HEADER.FIELDS (");
    fetch.extend_from_slice(rest);
    fetch.extend_from_slice(b")]\r\n");
    let (left, command) = CommandCodec::default().decode(&fetch).ok()?;
    if !left.is_empty() {
        return None;
    }
    let CommandBody::Fetch { macro_or_item_names: MacroOrMessageDataItemNames::MessageDataItemNames(items), .. } =
        command.body
    else {
        return None;
    };
    let Some(MessageDataItemName::BodyExt { section: Some(Section::HeaderFields(_, names)), .. }) = items.first()
    else {
        return None;
    };
    let tags = names.as_ref().iter().map(|n| String::from_utf8_lossy(n.as_ref()).into_owned()).collect();
    let tag = Tag::try_from(String::from_utf8(bytes[..space].to_vec()).ok()?).ok()?;
    Some((tag, tags))
}

/// RFC 5267 §4.3.5: ends the live searches named; a tag that names none gets BAD.
pub(crate) fn cancel(s: &mut Session, tags: &[String]) -> Result<(), ImapError> {
    let selected = s.selected()?;
    if let Some(unknown) = tags.iter().find(|t| !selected.live.iter().any(|l| &l.tag == *t)) {
        return Err(ImapError::bad(format!("no search with UPDATE has the tag {unknown:?}")));
    }
    selected.live.retain(|l| !tags.contains(&l.tag));
    Ok(())
}

/// The REMOVEFROM lines for `expunged`, by the numbers they have now (before their EXPUNGE).
pub(crate) fn before_expunge(s: &mut Session, expunged: &[Uid]) -> Vec<u8> {
    let Ok(selected) = s.selected() else { return Vec::new() };
    let mut out = Vec::new();
    for live in &mut selected.live {
        let gone: Vec<Uid> = live.uids.iter().copied().filter(|u| expunged.contains(u)).collect();
        if gone.is_empty() {
            continue;
        }
        live.uids.retain(|u| !gone.contains(u));
        let numbers: Vec<u32> = match live.uid {
            true => gone.iter().map(|u| u.0).collect(),
            false => gone
                .iter()
                .filter_map(|&u| selected.messages.iter().position(|m| m.uid == u))
                .map(|i| i as u32 + 1)
                .collect(),
        };
        out.extend(line(&live.tag, live.uid, "REMOVEFROM", &numbers));
    }
    out
}

/// Re-runs each live search and returns the ADDTO and REMOVEFROM lines for what changed.
pub(crate) fn changes(s: &mut Session) -> Vec<u8> {
    let Ok(selected) = s.selected() else { return Vec::new() };
    if selected.live.is_empty() {
        return Vec::new();
    }
    let mut live = std::mem::take(&mut selected.live);
    let mut out = Vec::new();
    for search in &mut live {
        let Ok(hits) = matching(s, &search.criteria) else { continue };
        let Ok(selected) = s.selected() else { break };
        let now: Vec<Uid> = hits.iter().map(|&i| selected.messages[i].uid).collect();
        let number = |u: &Uid| match search.uid {
            true => Some(u.0),
            false => selected.index_of_uid(*u).map(|i| i as u32 + 1),
        };
        let removed: Vec<u32> = search.uids.iter().filter(|u| !now.contains(u)).filter_map(number).collect();
        let added: Vec<u32> = now.iter().filter(|u| !search.uids.contains(u)).filter_map(number).collect();
        out.extend(line(&search.tag, search.uid, "REMOVEFROM", &removed));
        out.extend(line(&search.tag, search.uid, "ADDTO", &added));
        search.uids = now;
    }
    if let Ok(selected) = s.selected() {
        selected.live = live;
    }
    out
}

fn line(tag: &str, uid: bool, item: &str, numbers: &[u32]) -> Vec<u8> {
    if numbers.is_empty() {
        return Vec::new();
    }
    let uid = if uid { " UID" } else { "" };
    format!("* ESEARCH (TAG \"{tag}\"){uid} {item} (0 {})\r\n", sequence_set(numbers)).into_bytes()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cancelupdate_tags_are_read_by_imap_codec() {
        let (tag, tags) = super::recognise_cancel(b"c1 CANCELUPDATE \"a1\" \"b 2\"\r\n").unwrap();
        assert_eq!(tag.as_ref(), "c1");
        assert_eq!(tags, ["a1", "b 2"]);
        assert!(super::recognise_cancel(b"c1 CANCELUPDATE\r\n").is_none());
        assert!(super::recognise_cancel(b"c1 NOOP\r\n").is_none());
    }
}
