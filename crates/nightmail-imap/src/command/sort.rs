//! SORT and UID SORT (RFC 5256 §3): the messages SEARCH would find, ordered by the criteria in
//! turn, ties by sequence number (§3: "the order of the messages in the mailbox"). The keys are
//! `order::Keys`, DISPLAYFROM and DISPLAYTO among them (RFC 5957 §4, SORT=DISPLAY; imap-codec
//! parses them, and an unknown key gets its BAD). A MODSEQ
//! key (RFC 7162 §3.1.5) adds the matches' highest mod-sequence, as for SEARCH.

use std::cmp::Ordering;
use std::num::NonZeroU32;

use imap_next::imap_types::core::{Charset, Vec1};
use imap_next::imap_types::extensions::sort::{SortCriterion, SortKey};
use imap_next::imap_types::response::Data;
use imap_next::imap_types::search::SearchKey;

use super::search::{check_charset, matching, names_modseq, number};
use super::{Done, condstore};
use crate::ImapError;
use crate::order::Keys;
use crate::session::Session;
use nightmail_store::Uid;

/// One message as SORT compares it.
struct Row {
    index: usize,
    size: u64,
    arrival: u64,
    keys: Keys,
}

fn compare(a: &Row, b: &Row, key: &SortKey) -> Ordering {
    match key {
        SortKey::Arrival => a.arrival.cmp(&b.arrival),
        SortKey::Cc => a.keys.cc.cmp(&b.keys.cc),
        SortKey::Date => a.keys.sent.cmp(&b.keys.sent),
        SortKey::From => a.keys.from.cmp(&b.keys.from),
        SortKey::Size => a.size.cmp(&b.size),
        SortKey::Subject => a.keys.subject.cmp(&b.keys.subject),
        SortKey::To => a.keys.to.cmp(&b.keys.to),
        SortKey::DisplayFrom => a.keys.display_from.cmp(&b.keys.display_from),
        SortKey::DisplayTo => a.keys.display_to.cmp(&b.keys.display_to),
    }
}

/// Reads the sort and thread keys of the messages at `indices` of the selected mailbox.
pub(crate) fn keys_of(s: &mut Session, indices: &[usize]) -> Result<Vec<(usize, u64, u64, Keys)>, ImapError> {
    let store = s.shared.store.clone();
    let selected = s.selected()?;
    let mut out = Vec::with_capacity(indices.len());
    for &i in indices {
        let entry = &selected.messages[i];
        let internal = (entry.internal_date.0 / 1000) as i64;
        let raw = store.message(entry.message)?.unwrap_or_default();
        out.push((i, entry.size, entry.internal_date.0, Keys::read(&raw, internal)));
    }
    Ok(out)
}

/// The numbers (UIDs with `uid`) of the messages `search` finds, in the order of `criteria`.
pub(crate) fn sorted(
    s: &mut Session,
    criteria: &Vec1<SortCriterion>,
    charset: &Charset<'_>,
    search: &Vec1<SearchKey<'_>>,
    uid: bool,
) -> Result<Vec<NonZeroU32>, ImapError> {
    check_charset(charset)?;
    let hits = matching(s, search.as_ref())?;
    let mut rows: Vec<Row> =
        keys_of(s, &hits)?.into_iter().map(|(index, size, arrival, keys)| Row { index, size, arrival, keys }).collect();
    rows.sort_by(|a, b| {
        criteria
            .as_ref()
            .iter()
            .map(|c| if c.reverse { compare(b, a, &c.key) } else { compare(a, b, &c.key) })
            .find(|o| o.is_ne())
            .unwrap_or_else(|| a.index.cmp(&b.index))
    });
    Ok(rows.iter().filter_map(|r| number(s, r.index, uid)).collect())
}

pub(crate) fn run(
    s: &mut Session,
    criteria: Vec1<SortCriterion>,
    charset: Charset<'static>,
    search: Vec1<SearchKey<'static>>,
    uid: bool,
) -> Result<Done, ImapError> {
    let modseq = search.as_ref().iter().any(names_modseq);
    if modseq {
        condstore::enable_condstore(s);
        condstore::catch_up_flags(s, |_| false)?;
    }
    let numbers = sorted(s, &criteria, &charset, &search, uid)?;
    // RFC 7162 §3.1.5 (SORT as SEARCH): with MODSEQ among the keys, the matches' highest.
    let highest = match modseq {
        true => {
            let selected = s.selected()?;
            let index =
                |n: NonZeroU32| if uid { selected.index_of_uid(Uid(n.get())) } else { Some(n.get() as usize - 1) };
            numbers.iter().filter_map(|&n| index(n)).map(|i| selected.messages[i].modseq).max().map(condstore::wire)
        }
        false => None,
    };
    s.data(Data::Sort(numbers, highest));
    Ok(Done::ok(if uid { "UID SORT completed" } else { "SORT completed" }))
}
