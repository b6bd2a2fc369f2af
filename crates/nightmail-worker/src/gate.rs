//! Whether a question is answered at all: automatic mail never is (RFC 3834 §2, list mail,
//! another model: `loop_guard.rs`), and a person gets at most so many replies an hour.

use nightmail_store::{Job, Origin, StoreError};
use nightmail_types::Timestamp;

use crate::loop_guard;
use crate::mail::Mail;
use crate::setup::Shift;

/// Why a question is not answered at all.
pub enum Refusal {
    /// Automatic mail (RFC 3834, list mail, another model): silently.
    Automatic(String),
    /// The sender's hourly reply limit: with a notice.
    RateLimited(String),
}

/// Why this message must not be answered, if so: loop rules (not for an Ask job: the user asked
/// about this message on purpose, and the answer goes to them alone), then the per-sender limit,
/// counted from the store's index of replies.
pub fn refusal(shift: &Shift, job: &Job, question: &Mail) -> Result<Option<Refusal>, StoreError> {
    let signs = loop_guard::Signs {
        envelope_sender: job.sender.as_ref(),
        from: question.from.iter().map(|p| p.address.clone()).collect(),
        auto_submitted: question.auto_submitted.as_deref(),
        precedence: question.precedence.as_deref(),
        list_unsubscribe: question.list_unsubscribe,
        list_id: question.list_id,
        auto_response_suppress: question.auto_response_suppress.as_deref(),
    };
    if job.origin == Origin::Mail
        && let Some(reason) = loop_guard::refuse(&signs, |a| shift.is_model(a))
    {
        return Ok(Some(Refusal::Automatic(reason)));
    }
    let limit = shift.config().worker.max_replies_per_sender_per_hour;
    let hour_ago = Timestamp(Timestamp::now().0.saturating_sub(3_600_000));
    let recent = shift.store.replies_since(job.sender.as_ref(), hour_ago)?.iter().filter(|id| **id != job.id).count();
    if recent as u32 >= limit {
        return Ok(Some(Refusal::RateLimited(format!(
            "{recent} replies to this sender in the last hour (limit {limit})"
        ))));
    }
    Ok(None)
}
