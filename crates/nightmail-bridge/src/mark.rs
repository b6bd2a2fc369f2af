//! Where reading resumes after SELECT (RFC 3501 §2.3.1.1: a UID means something only under the
//! UIDVALIDITY it was given under).

use nightmail_store::BridgeState;
use nightmail_types::Timestamp;

/// How this connection starts reading.
#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// The bridge's first run: everything already in the mailbox is older than the bridge.
    Fresh(BridgeState),
    /// The same UIDVALIDITY: go on after `last_uid` (flagging what a crash left unflagged).
    Resume(BridgeState),
    /// A new UIDVALIDITY: every UID is read again, and only mail after the newest INTERNALDATE
    /// taken is new (no flood of old mail).
    Renumbered { old: u32, state: BridgeState },
}

impl Start {
    pub fn state(self) -> BridgeState {
        match self {
            Start::Fresh(s) | Start::Resume(s) | Start::Renumbered { state: s, .. } => s,
        }
    }
}

/// `uid_next` is the mailbox's UIDNEXT at SELECT; `now` the time of the first start.
pub fn start(stored: Option<BridgeState>, uidvalidity: u32, uid_next: u32, now: Timestamp) -> Start {
    match stored.filter(|s| s.uidvalidity != 0) {
        // Never read (at most an error was recorded).
        None => {
            // INTERNALDATE has whole seconds: a floor a second back keeps a message that arrives
            // in the second the bridge starts.
            let floor = Timestamp((now.0 / 1000).saturating_sub(1) * 1000);
            Start::Fresh(BridgeState {
                uidvalidity,
                last_uid: uid_next.saturating_sub(1),
                floor,
                last_internal_date: floor,
                unflagged: Vec::new(),
                last_error: None,
            })
        }
        Some(state) if state.uidvalidity == uidvalidity => Start::Resume(state),
        Some(state) => Start::Renumbered {
            old: state.uidvalidity,
            state: BridgeState {
                uidvalidity,
                last_uid: 0,
                floor: state.last_internal_date.max(state.floor),
                last_internal_date: state.last_internal_date,
                // Their UIDs belong to the old numbering.
                unflagged: Vec::new(),
                last_error: None,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_start_skips_what_is_there_and_a_renumbering_keeps_the_date() {
        let now = Timestamp(1_700_000_000_500);
        let Start::Fresh(first) = start(None, 7, 501, now) else { panic!() };
        assert_eq!((first.last_uid, first.floor), (500, Timestamp(1_699_999_999_000)));
        let taken = BridgeState { last_uid: 502, last_internal_date: Timestamp(1_700_000_100_000), ..first.clone() };
        assert_eq!(start(Some(taken.clone()), 7, 510, now), Start::Resume(taken.clone()));
        let Start::Renumbered { old, state } = start(Some(taken), 9, 3, now) else { panic!() };
        assert_eq!((old, state.uidvalidity, state.last_uid, state.floor), (7, 9, 0, Timestamp(1_700_000_100_000)));
        // A mark holding only a connection error is a first start.
        let error_only = BridgeState { last_error: Some("TLS failed".into()), ..BridgeState::default() };
        assert!(matches!(start(Some(error_only), 7, 501, now), Start::Fresh(s) if s.last_uid == 500));
    }
}
