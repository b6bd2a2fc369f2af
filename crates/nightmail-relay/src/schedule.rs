//! When to try a recipient again, and when to give up. Postfix and mox retry on a growing
//! interval; ours is about 1 m, 5 m, 15 m, 1 h, 4 h, then every 8 h, each ±10 % so that many
//! messages refused at once do not all come back at once, until `relay.give_up_after_hours`.

use std::time::Duration;

use nightmail_store::{Outbound, Settle};
use nightmail_types::Timestamp;
use rand::Rng;

use crate::route::Outcome;

const STEPS: [Duration; 5] = [
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(15 * 60),
    Duration::from_secs(3600),
    Duration::from_secs(4 * 3600),
];
const LAST: Duration = Duration::from_secs(8 * 3600);

/// The wait after the `attempts`-th failed attempt, before jitter.
pub fn backoff(attempts: u32) -> Duration {
    STEPS.get(attempts.saturating_sub(1) as usize).copied().unwrap_or(LAST)
}

fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(0.9..=1.1))
}

/// How `entry` is settled after an attempt that ended in `outcome` at `now`. A temporary failure
/// past the entry's deadline bounces (RFC 3463 4.4.7, delivery time expired); before it, the
/// next attempt is never set later than the deadline, so the last one is made at it.
pub fn settle(entry: &Outbound, outcome: &Outcome, now: Timestamp, give_up_after: Duration) -> Settle {
    match outcome {
        Outcome::Accepted { reply } => Settle::Sent { reply: reply.clone() },
        Outcome::Failed { error, permanent: true } => Settle::Bounced { error: error.clone() },
        Outcome::Failed { error, permanent: false } => {
            let deadline = entry.created_at.plus(give_up_after);
            if now >= deadline {
                Settle::Bounced { error: expired(error, give_up_after) }
            } else {
                let not_before = now.plus(jittered(backoff(entry.attempts))).min(deadline);
                Settle::Retry { error: error.clone(), not_before }
            }
        }
    }
}

/// The text of an expiry, which the bounce shows; [`is_expiry`] recognises it.
fn expired(error: &str, give_up_after: Duration) -> String {
    format!("{EXPIRED} {} hours; the last attempt said: {error}", give_up_after.as_secs() / 3600)
}

const EXPIRED: &str = "gave up after";

pub(crate) fn is_expiry(error: &str) -> bool {
    error.starts_with(EXPIRED)
}

#[cfg(test)]
mod tests {
    use nightmail_store::{MessageKey, OutboundId, OutboundState};
    use nightmail_types::Address;

    use super::*;

    fn entry(created_at: Timestamp, attempts: u32) -> Outbound {
        Outbound {
            id: OutboundId(1),
            message: MessageKey(1),
            sender: None,
            recipient: Address::parse("bob@x.org").unwrap(),
            created_at,
            attempts,
            state: OutboundState::default(),
            last_error: None,
            via: None,
            charged_to: None,
        }
    }

    #[test]
    fn the_schedule_grows_then_stays_at_eight_hours() {
        let minutes: Vec<u64> = (1..=8).map(|a| backoff(a).as_secs() / 60).collect();
        assert_eq!(minutes, [1, 5, 15, 60, 240, 480, 480, 480]);
    }

    #[test]
    fn temporary_failures_retry_with_jitter_until_the_deadline_then_bounce() {
        let day = Duration::from_secs(72 * 3600);
        let t0 = Timestamp(1_000_000_000);
        let temp = Outcome::Failed { error: "451 4.3.0 later".into(), permanent: false };
        let Settle::Retry { not_before, error } = settle(&entry(t0, 1), &temp, t0, day) else { panic!() };
        assert_eq!(error, "451 4.3.0 later");
        let wait = not_before.since(t0).as_secs();
        assert!((54..=66).contains(&wait), "about a minute, jittered: {wait}");
        // Near the deadline the next attempt is at the deadline, not 8 hours after it.
        let late = t0.plus(day - Duration::from_secs(60));
        let Settle::Retry { not_before, .. } = settle(&entry(t0, 9), &temp, late, day) else { panic!() };
        assert_eq!(not_before, t0.plus(day));
        let Settle::Bounced { error } = settle(&entry(t0, 10), &temp, t0.plus(day), day) else { panic!() };
        assert!(is_expiry(&error) && error.contains("72 hours") && error.contains("451 4.3.0"), "{error}");
        // A permanent refusal bounces at once; a 250 is sent.
        let perm = Outcome::Failed { error: "550 5.1.1 no".into(), permanent: true };
        assert_eq!(settle(&entry(t0, 1), &perm, t0, day), Settle::Bounced { error: "550 5.1.1 no".into() });
        let ok = Outcome::Accepted { reply: "250 ok".into() };
        assert_eq!(settle(&entry(t0, 1), &ok, t0, day), Settle::Sent { reply: "250 ok".into() });
    }
}
