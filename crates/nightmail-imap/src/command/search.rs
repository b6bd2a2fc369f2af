//! SEARCH and UID SEARCH (RFC 3501 §6.4.4): every key of §6.4.4, evaluated per message. Header
//! keys match the raw and the decoded (RFC 2047) values, case-insensitively; BODY and TEXT match
//! the raw bytes and the decoded text parts. Dates compare the internal date (SINCE/BEFORE/ON)
//! or the Date header (SENT*), by calendar day, as §6.4.4 says.

use std::num::NonZeroU32;
use std::panic::{AssertUnwindSafe, catch_unwind};

use imap_next::imap_types::core::{AString, Charset, Vec1};
use imap_next::imap_types::datetime::NaiveDate;
use imap_next::imap_types::response::{Code, Data};
use imap_next::imap_types::search::SearchKey;
use imap_next::imap_types::sequence::{SeqOrUid, Sequence, SequenceSet};
use mail_parser::{HeaderValue, MessageParser};
use nightmail_store::{MailEntry, Store};

use super::{Done, condstore};
use crate::ImapError;
use crate::mime;
use crate::session::Session;

/// One message under test; its bytes are loaded only if a key needs them.
struct Candidate<'a> {
    entry: &'a MailEntry,
    seq: u32,
    recent: bool,
    store: &'a Store,
    raw: Option<Vec<u8>>,
}

impl Candidate<'_> {
    fn raw(&mut self) -> &[u8] {
        if self.raw.is_none() {
            self.raw = Some(self.store.message(self.entry.message).ok().flatten().unwrap_or_default());
        }
        self.raw.as_deref().unwrap_or_default()
    }

    fn has(&self, flag: &str) -> bool {
        self.entry.flags.iter().any(|f| f.eq_ignore_ascii_case(flag))
    }
}

fn lower(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_lowercase()
}

fn needle(s: &AString<'_>) -> String {
    lower(s.as_ref())
}

/// The values of header `name`, raw (unfolded) and decoded.
fn header_values(raw: &[u8], name: &str) -> Vec<String> {
    let header = &raw[..mime::header_end(raw)];
    let fields = mime::header_fields(header, &[name.to_string()], false);
    let mut out: Vec<String> = String::from_utf8_lossy(&fields)
        .replace("\r\n ", " ")
        .replace("\r\n\t", " ")
        .lines()
        .filter_map(|l| l.split_once(':').map(|(_, v)| v.trim().to_lowercase()))
        .collect();
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        let Some(m) = MessageParser::default().parse_headers(header) else { return Vec::new() };
        m.header_values(name)
            .map(|v| match v {
                HeaderValue::Text(t) => t.to_lowercase(),
                HeaderValue::TextList(l) => l.join(" ").to_lowercase(),
                HeaderValue::Address(a) => a
                    .iter()
                    .map(|a| format!("{} <{}>", a.name.as_deref().unwrap_or(""), a.address.as_deref().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(", ")
                    .to_lowercase(),
                _ => String::new(),
            })
            .collect::<Vec<_>>()
    }));
    out.extend(decoded.unwrap_or_default());
    out
}

fn header_contains(c: &mut Candidate<'_>, name: &str, want: &AString<'_>) -> bool {
    let want = needle(want);
    let values = header_values(c.raw(), name);
    // §6.4.4 HEADER: an empty string matches every message that has the field.
    values.iter().any(|v| v.contains(&want))
}

fn body_contains(c: &mut Candidate<'_>, want: &AString<'_>, with_header: bool) -> bool {
    let want = needle(want);
    let raw = c.raw();
    let split = mime::header_end(raw);
    let haystack = if with_header { raw } else { &raw[split..] };
    if lower(haystack).contains(&want) {
        return true;
    }
    catch_unwind(AssertUnwindSafe(|| {
        MessageParser::default().parse(raw).is_some_and(|m| {
            (0..m.text_body_count()).any(|i| m.body_text(i).is_some_and(|t| t.to_lowercase().contains(&want)))
        })
    }))
    .unwrap_or(false)
}

fn day_of_internal(c: &Candidate<'_>) -> chrono::NaiveDate {
    chrono::DateTime::from_timestamp_millis(c.entry.internal_date.0 as i64).unwrap_or_default().date_naive()
}

fn day_sent(c: &mut Candidate<'_>) -> Option<chrono::NaiveDate> {
    let raw = c.raw().to_vec();
    catch_unwind(AssertUnwindSafe(|| {
        let m = MessageParser::default().parse_headers(&raw[..mime::header_end(&raw)])?;
        let d = m.date()?;
        chrono::NaiveDate::from_ymd_opt(d.year as i32, d.month as u32, d.day as u32)
    }))
    .ok()
    .flatten()
}

fn in_set(set: &SequenceSet, value: u32, largest: u32) -> bool {
    let v = |s: &SeqOrUid| match s {
        SeqOrUid::Value(v) => v.get(),
        SeqOrUid::Asterisk => largest,
    };
    set.0.as_ref().iter().any(|seq| match seq {
        Sequence::Single(s) => v(s) == value,
        Sequence::Range(a, b) => {
            let (a, b) = (v(a), v(b));
            (a.min(b)..=a.max(b)).contains(&value)
        }
    })
}

struct Limits {
    count: u32,
    max_uid: u32,
}

fn matches(key: &SearchKey<'_>, c: &mut Candidate<'_>, limits: &Limits) -> bool {
    let date = |d: &NaiveDate| *d.as_ref();
    match key {
        SearchKey::And(keys) => keys.as_ref().iter().all(|k| matches(k, c, limits)),
        SearchKey::SequenceSet(set) => in_set(set, c.seq, limits.count),
        SearchKey::Uid(set) => in_set(set, c.entry.uid.0, limits.max_uid),
        SearchKey::All => true,
        SearchKey::Answered => c.has("\\Answered"),
        SearchKey::Unanswered => !c.has("\\Answered"),
        SearchKey::Deleted => c.has("\\Deleted"),
        SearchKey::Undeleted => !c.has("\\Deleted"),
        SearchKey::Draft => c.has("\\Draft"),
        SearchKey::Undraft => !c.has("\\Draft"),
        SearchKey::Flagged => c.has("\\Flagged"),
        SearchKey::Unflagged => !c.has("\\Flagged"),
        SearchKey::Seen => c.has("\\Seen"),
        SearchKey::Unseen => !c.has("\\Seen"),
        SearchKey::Recent => c.recent,
        SearchKey::Old => !c.recent,
        SearchKey::New => c.recent && !c.has("\\Seen"),
        SearchKey::Keyword(k) => c.has(k.as_ref()),
        SearchKey::Unkeyword(k) => !c.has(k.as_ref()),
        SearchKey::Bcc(s) => header_contains(c, "Bcc", s),
        SearchKey::Cc(s) => header_contains(c, "Cc", s),
        SearchKey::From(s) => header_contains(c, "From", s),
        SearchKey::To(s) => header_contains(c, "To", s),
        SearchKey::Subject(s) => header_contains(c, "Subject", s),
        SearchKey::Header(name, s) => header_contains(c, &String::from_utf8_lossy(name.as_ref()), s),
        SearchKey::Body(s) => body_contains(c, s, false),
        SearchKey::Text(s) => body_contains(c, s, true),
        SearchKey::Before(d) => day_of_internal(c) < date(d),
        SearchKey::On(d) => day_of_internal(c) == date(d),
        SearchKey::Since(d) => day_of_internal(c) >= date(d),
        SearchKey::SentBefore(d) => day_sent(c).is_some_and(|s| s < date(d)),
        SearchKey::SentOn(d) => day_sent(c).is_some_and(|s| s == date(d)),
        SearchKey::SentSince(d) => day_sent(c).is_some_and(|s| s >= date(d)),
        SearchKey::Larger(n) => c.entry.size > u64::from(*n),
        SearchKey::Smaller(n) => c.entry.size < u64::from(*n),
        SearchKey::Not(k) => !matches(k, c, limits),
        SearchKey::Or(a, b) => matches(a, c, limits) || matches(b, c, limits),
        // RFC 7162 §3.1.5: one mod-sequence per message, so a flag's entry name asks the same.
        SearchKey::ModSequence { modseq, .. } => c.entry.modseq.0 >= *modseq,
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// RFC 3501 §6.4.4: SEARCH's charset must be one the server supports, else NO [BADCHARSET].
/// SORT and THREAD (RFC 5256) name theirs the same way.
pub(crate) fn check_charset(charset: &Charset<'_>) -> Result<(), ImapError> {
    let name = match charset {
        Charset::Atom(a) => a.as_ref().to_string(),
        Charset::Quoted(q) => q.inner().to_string(),
    };
    if !name.eq_ignore_ascii_case("UTF-8") && !name.eq_ignore_ascii_case("US-ASCII") {
        return Err(ImapError::no_with(Code::BadCharset { allowed: vec![] }, "only UTF-8 and US-ASCII are supported"));
    }
    Ok(())
}

/// The view positions of the selected mailbox's messages that match every key of `criteria`,
/// ascending: what SEARCH answers, and what SORT and THREAD order.
pub(crate) fn matching(s: &mut Session, criteria: &[SearchKey<'_>]) -> Result<Vec<usize>, ImapError> {
    let store = s.shared.store.clone();
    let selected = s.selected()?;
    let limits = Limits { count: selected.exists(), max_uid: selected.messages.last().map_or(0, |m| m.uid.0) };
    let mut hits = Vec::new();
    for (i, entry) in selected.messages.iter().enumerate() {
        let mut c = Candidate {
            entry,
            seq: i as u32 + 1,
            recent: selected.recent.contains(&entry.uid),
            store: &store,
            raw: None,
        };
        if criteria.iter().all(|k| matches(k, &mut c, &limits)) {
            hits.push(i);
        }
    }
    Ok(hits)
}

/// The numbers a SEARCH, SORT or THREAD response gives for view position `index`.
pub(crate) fn number(s: &mut Session, index: usize, uid: bool) -> Option<NonZeroU32> {
    let selected = s.selected().ok()?;
    NonZeroU32::new(if uid { selected.messages.get(index)?.uid.0 } else { index as u32 + 1 })
}

/// Whether a search key is or holds MODSEQ (RFC 7162 §3.1.5, a CONDSTORE enabling command).
pub(crate) fn names_modseq(key: &SearchKey<'_>) -> bool {
    match key {
        SearchKey::ModSequence { .. } => true,
        SearchKey::And(keys) => keys.as_ref().iter().any(names_modseq),
        SearchKey::Not(k) => names_modseq(k),
        SearchKey::Or(a, b) => names_modseq(a) || names_modseq(b),
        _ => false,
    }
}

pub(crate) fn run(
    s: &mut Session,
    charset: Option<Charset<'static>>,
    criteria: Vec1<SearchKey<'static>>,
    uid: bool,
) -> Result<Done, ImapError> {
    if let Some(charset) = &charset {
        check_charset(charset)?;
    }
    let modseq = criteria.as_ref().iter().any(names_modseq);
    if modseq {
        condstore::enable_condstore(s);
        condstore::catch_up_flags(s, |_| false)?;
    }
    let hits = matching(s, criteria.as_ref())?;
    // RFC 7162 §3.1.5: with MODSEQ among the keys, the highest mod-sequence of the matches.
    let highest = match modseq {
        true => {
            let selected = s.selected()?;
            hits.iter().map(|&i| selected.messages[i].modseq).max().map(condstore::wire)
        }
        false => None,
    };
    let hits = hits.into_iter().filter_map(|i| number(s, i, uid)).collect();
    s.data(Data::Search(hits, highest));
    Ok(Done::ok(if uid { "UID SEARCH completed" } else { "SEARCH completed" }))
}
