//! SEARCH RETURN (RFC 4731 ESEARCH) and SORT RETURN (RFC 5267 §3 ESORT): MIN, MAX, COUNT and
//! ALL of the matches in one `* ESEARCH (TAG "t") [UID] ...` response; for SORT, MIN and MAX are
//! the first and last in sort order and ALL lists them in that order. With a MODSEQ key
//! (RFC 7162 §3.1.5) the response ends in the highest mod-sequence of the messages it reports.
//!
//! imap-codec 2.0.0-alpha.10 has neither the `RETURN (...)` clause nor the ESEARCH response, so
//! this module reads only that clause (RFC 4731 §3 `search-return-opts`), from the bytes of a
//! command imap-codec refused; the rest of the command, without the clause, is parsed by
//! imap-codec as a plain SEARCH. The response line is written here (`esearch-response`, §3).

use std::fmt::Write as _;
use std::num::NonZeroU32;

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_next::imap_types::IntoStatic;
use imap_next::imap_types::command::CommandBody;
use imap_next::imap_types::core::Tag;
use nightmail_store::{ModSeq, Uid};

use super::condstore;
use super::context::LiveSearch;
use super::search::{check_charset, matching, names_modseq, number};
use super::searchres::kept;
use super::sort::sorted;
use crate::ImapError;
use crate::session::Session;

/// RFC 4731 §3 search-return-opt, RFC 5182's SAVE (`searchres.rs`), and RFC 5267 §4's
/// CONTEXT, UPDATE and PARTIAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReturnOption {
    Min,
    Max,
    All,
    Count,
    /// §4.2: a hint, nothing to do.
    Context,
    /// §4.1: keep the search live (`context`).
    Update,
    /// RFC 5182 §2.4: keep the result for `$`.
    Save,
    /// §4.4 `"PARTIAL" SP partial-range`: the results at these positions (1-based, low first).
    Partial(u32, u32),
}

/// RFC 5267 §4.4 `partial-range = nz-number ":" nz-number`, either way round.
fn partial_range(range: &str) -> Result<ReturnOption, String> {
    let bad = || format!("PARTIAL {range}: a range of two positions is needed (RFC 5267 §4.4: PARTIAL 1:10)");
    let (a, b) = range.split_once(':').ok_or_else(bad)?;
    let number = |n: &str| {
        let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| n.parse::<u32>().ok()).flatten().filter(|&n| n > 0).ok_or_else(bad)
    };
    let (a, b) = (number(a)?, number(b)?);
    Ok(ReturnOption::Partial(a.min(b), a.max(b)))
}

/// A SEARCH or SORT with a RETURN clause, taken apart.
pub(crate) struct ReturnSearch {
    pub tag: Tag<'static>,
    pub uid: bool,
    sort: bool,
    options: Result<Vec<ReturnOption>, String>,
    /// The command without the clause: a plain SEARCH for imap-codec.
    plain: Vec<u8>,
}

impl ReturnSearch {
    /// The tagged OK's text.
    pub(crate) fn done_text(&self) -> &'static str {
        match (self.uid, self.sort) {
            (false, false) => "SEARCH completed",
            (true, false) => "UID SEARCH completed",
            (false, true) => "SORT completed",
            (true, true) => "UID SORT completed",
        }
    }
}

fn strip_prefix_ci<'b>(bytes: &'b [u8], prefix: &[u8]) -> Option<&'b [u8]> {
    (bytes.len() >= prefix.len() && bytes[..prefix.len()].eq_ignore_ascii_case(prefix)).then(|| &bytes[prefix.len()..])
}

/// `tag [UID] SEARCH|SORT RETURN (opts) rest`, or `None` when `bytes` is not such a command.
pub(crate) fn recognise(bytes: &[u8]) -> Option<ReturnSearch> {
    let space = bytes.iter().position(|&b| b == b' ')?;
    let tag = Tag::try_from(String::from_utf8(bytes[..space].to_vec()).ok()?).ok()?;
    let mut rest = &bytes[space + 1..];
    let uid = strip_prefix_ci(rest, b"UID ");
    rest = uid.unwrap_or(rest);
    let (sort, after) = match strip_prefix_ci(rest, b"SEARCH RETURN (") {
        Some(after) => (false, after),
        None => (true, strip_prefix_ci(rest, b"SORT RETURN (")?),
    };
    rest = after;
    let close = rest.iter().position(|&b| b == b')')?;
    let options = std::str::from_utf8(&rest[..close]).ok()?;
    let criteria = rest[close + 1..].strip_prefix(b" ")?;
    let mut words = options.split_ascii_whitespace();
    let mut parsed = Vec::new();
    let options = loop {
        let Some(word) = words.next() else { break Ok(parsed) };
        let option = match word.to_ascii_uppercase().as_str() {
            "MIN" => Ok(ReturnOption::Min),
            "MAX" => Ok(ReturnOption::Max),
            "ALL" => Ok(ReturnOption::All),
            "COUNT" => Ok(ReturnOption::Count),
            "CONTEXT" => Ok(ReturnOption::Context),
            "UPDATE" => Ok(ReturnOption::Update),
            "SAVE" => Ok(ReturnOption::Save),
            "PARTIAL" => partial_range(words.next().unwrap_or_default()),
            other => Err(format!(
                "RETURN option {other} is not supported (RFC 4731, RFC 5267: MIN MAX ALL COUNT SAVE CONTEXT UPDATE PARTIAL)"
            )),
        };
        match option {
            Ok(option) => parsed.push(option),
            Err(e) => break Err(e),
        }
    };
    let mut plain = bytes[..space + 1].to_vec();
    if uid.is_some() {
        plain.extend_from_slice(b"UID ");
    }
    plain.extend_from_slice(if sort { b"SORT " } else { b"SEARCH " });
    plain.extend_from_slice(criteria);
    Some(ReturnSearch { tag, uid: uid.is_some(), sort, options, plain })
}

/// `1:3,5,7:8` (RFC 3501 sequence-set) of the numbers in their order: runs of consecutive
/// ascending numbers become ranges.
pub(crate) fn sequence_set(numbers: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < numbers.len() {
        let start = numbers[i];
        while i + 1 < numbers.len() && numbers[i + 1] == numbers[i] + 1 {
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        let _ = if numbers[i] == start { write!(out, "{start}") } else { write!(out, "{start}:{}", numbers[i]) };
        i += 1;
    }
    out
}

/// Runs the search and returns the ESEARCH response line (CRLF included).
pub(crate) fn run(s: &mut Session, search: ReturnSearch) -> Result<Vec<u8>, ImapError> {
    let mut options = search.options.map_err(ImapError::bad)?;
    // §3.1: RETURN () means RETURN (ALL); so does a CONTEXT hint alone (RFC 5267 §4.2).
    if options.iter().all(|o| *o == ReturnOption::Context) {
        options.push(ReturnOption::All);
    }
    if options.contains(&ReturnOption::Update) && search.sort {
        return Err(ImapError::bad("UPDATE applies to SEARCH only here: CONTEXT=SORT is not offered"));
    }
    let save = options.contains(&ReturnOption::Save);
    let result = match CommandCodec::default().decode(&search.plain) {
        Ok((_, command)) => answer(s, &search.tag, search.sort, options, command.body),
        Err(_) => Err(ImapError::bad("syntax error in the command after RETURN (...)")),
    };
    // RFC 5182 §2.4: a SEARCH (SAVE) that fails leaves the variable empty.
    if result.is_err()
        && save
        && let Ok(selected) = s.selected()
    {
        selected.saved.clear();
    }
    result
}

/// A plain SEARCH in an IMAP4rev2 session: RFC 9051 §6.4.4 answers it with ESEARCH, as if it
/// said RETURN (ALL) (§7.3.4: the SEARCH response is IMAP4rev1's).
pub(crate) fn as_esearch(
    s: &mut Session,
    tag: &Tag<'static>,
    body: CommandBody<'static>,
) -> Result<Vec<u8>, ImapError> {
    answer(s, tag, false, vec![ReturnOption::All], body)
}

/// The ESEARCH line of a parsed SEARCH or SORT with these return options.
fn answer(
    s: &mut Session,
    tag: &Tag<'static>,
    sort: bool,
    options: Vec<ReturnOption>,
    body: CommandBody<'_>,
) -> Result<Vec<u8>, ImapError> {
    let update = options.contains(&ReturnOption::Update);
    // With MODSEQ among the keys, each match's mod-sequence, in the order of `numbers`.
    let mut modseqs: Option<Vec<ModSeq>> = None;
    let (numbers, uid): (Vec<u32>, bool) = match body {
        CommandBody::Search { charset, criteria, uid } if !sort => {
            if let Some(charset) = &charset {
                check_charset(charset)?;
            }
            let modseq = criteria.as_ref().iter().any(names_modseq);
            if modseq {
                condstore::enable_condstore(s);
                condstore::catch_up_flags(s, |_| false)?;
            }
            let hits = matching(s, criteria.as_ref())?;
            if update {
                let selected = s.selected()?;
                let uids = hits.iter().map(|&i| selected.messages[i].uid).collect();
                let tag = tag.inner().to_string();
                selected.live.retain(|l| l.tag != tag);
                selected.live.push(LiveSearch {
                    tag,
                    uid,
                    criteria: criteria.as_ref().iter().map(|k| k.clone().into_static()).collect(),
                    uids,
                });
            }
            if modseq {
                let selected = s.selected()?;
                modseqs = Some(hits.iter().map(|&i| selected.messages[i].modseq).collect());
            }
            // View order is both sequence and UID order: the numbers come out ascending.
            let numbers: Vec<u32> = hits.into_iter().filter_map(|i| number(s, i, uid)).map(|n| n.get()).collect();
            (numbers, uid)
        }
        CommandBody::Sort { sort_criteria, charset, search_criteria, uid } if sort => {
            let numbers = sorted(s, &sort_criteria, &charset, &search_criteria, uid)?;
            (numbers.into_iter().map(NonZeroU32::get).collect(), uid)
        }
        _ => return Err(ImapError::bad("syntax error in the command after RETURN (...)")),
    };
    if options.contains(&ReturnOption::Save) {
        let selected = s.selected()?;
        let uids: Vec<Uid> = match uid {
            true => numbers.iter().map(|&n| Uid(n)).collect(),
            false => numbers.iter().filter_map(|&n| selected.messages.get(n as usize - 1)).map(|m| m.uid).collect(),
        };
        let has = |o| options.contains(&o);
        let whole = has(ReturnOption::All) || has(ReturnOption::Count);
        selected.saved = kept(&uids, has(ReturnOption::Min), has(ReturnOption::Max), whole);
        // §2.4: SAVE alone returns no ESEARCH.
        if options.iter().all(|o| matches!(o, ReturnOption::Save | ReturnOption::Context)) {
            return Ok(Vec::new());
        }
    }
    let mut line = format!("* ESEARCH (TAG \"{}\")", tag.inner());
    if uid {
        line.push_str(" UID");
    }
    // §3.1: MIN, MAX and ALL are left out when nothing matched; COUNT is always given.
    for option in [ReturnOption::Min, ReturnOption::Max, ReturnOption::Count, ReturnOption::All] {
        if !options.contains(&option) {
            continue;
        }
        let _ = match (option, numbers.first(), numbers.last()) {
            (ReturnOption::Min, Some(min), _) => write!(line, " MIN {min}"),
            (ReturnOption::Max, _, Some(max)) => write!(line, " MAX {max}"),
            (ReturnOption::Count, ..) => write!(line, " COUNT {}", numbers.len()),
            (ReturnOption::All, Some(_), _) => write!(line, " ALL {}", sequence_set(&numbers)),
            _ => Ok(()),
        };
    }
    // RFC 5267 §4.4: the results at those positions, NIL when there are none.
    for option in &options {
        if let ReturnOption::Partial(low, high) = *option {
            let part = numbers.get(low as usize - 1..(high as usize).min(numbers.len())).unwrap_or_default();
            let set = if part.is_empty() { "NIL".to_string() } else { sequence_set(part) };
            let _ = write!(line, " PARTIAL ({low}:{high} {set})");
        }
    }
    // RFC 7162 §3.1.5 with RFC 4731: the highest mod-sequence of the messages the response
    // reports: all matches for ALL or COUNT, else only those MIN and MAX name; none if none match.
    if let Some(modseqs) = modseqs.filter(|m| !m.is_empty()) {
        let whole = options.contains(&ReturnOption::All) || options.contains(&ReturnOption::Count);
        let reported = modseqs.iter().enumerate().filter(|&(i, _)| {
            whole
                || (i == 0 && options.contains(&ReturnOption::Min))
                || (i + 1 == modseqs.len() && options.contains(&ReturnOption::Max))
        });
        if let Some((_, highest)) = reported.max_by_key(|&(_, m)| *m) {
            let _ = write!(line, " MODSEQ {highest}");
        }
    }
    line.push_str("\r\n");
    Ok(line.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_clauses_are_taken_apart_and_sets_compressed() {
        let r = recognise(b"a1 UID SEARCH RETURN (MIN count) SEEN\r\n").unwrap();
        assert_eq!(r.tag.inner(), "a1");
        assert_eq!(r.options.unwrap(), vec![ReturnOption::Min, ReturnOption::Count]);
        assert_eq!(r.plain, b"a1 UID SEARCH SEEN\r\n");
        assert_eq!(recognise(b"a1 SEARCH RETURN (SAVE) ALL\r\n").unwrap().options.unwrap(), [ReturnOption::Save]);
        assert!(recognise(b"a1 SEARCH RETURN (KEEP) ALL\r\n").unwrap().options.is_err());
        let partial = recognise(b"a1 SEARCH RETURN (PARTIAL 4:2 UPDATE) ALL\r\n").unwrap().options.unwrap();
        assert_eq!(partial, vec![ReturnOption::Partial(2, 4), ReturnOption::Update]);
        for bad in ["PARTIAL 1", "PARTIAL 1:*", "PARTIAL *:1", "PARTIAL 0:3", "PARTIAL"] {
            let cmd = format!("a1 SEARCH RETURN ({bad}) ALL\r\n");
            assert!(recognise(cmd.as_bytes()).unwrap().options.is_err(), "{bad}");
        }
        assert!(recognise(b"a1 FETCH 1 (FLAGS)\r\n").is_none());
        assert_eq!(sequence_set(&[1, 2, 3, 5, 7, 8]), "1:3,5,7:8");
    }
}
