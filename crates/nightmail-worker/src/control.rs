//! Mail that talks to nightmail rather than to the model: `status` asks about the queue, and
//! replying `cancel` to an acknowledgement cancels that question. Documented in docs/MAIL.md.

use nightmail_config::ModelEntry;
use nightmail_store::{Finish, Job, JobId, JobState, LeasedJob, Origin, StoreError};
use nightmail_types::{HeaderText, Timestamp};

use crate::checkpoints;
use crate::compose::new_message_id;
use crate::letters::{Asked, Content, Letters};
use crate::mail::Mail;
use crate::pacing::{Pace, human_duration};
use crate::setup::Shift;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Subject `status`: the queue as it stands.
    Status,
    /// `cancel` in reply to the acknowledgement of job `target`. `ack_id` is the acknowledgement's
    /// Message-ID, which must match the job's, so a forged reference cancels nothing.
    Cancel { target: JobId, ack_id: String },
}

/// The Message-ID of the acknowledgement of `job`: `<ack.JOB.RANDOM@HOST>`.
pub fn ack_message_id(job: JobId, hostname: &str) -> String {
    format!("<ack.{}.{:016x}@{hostname}>", job.0, rand::random::<u64>())
}

pub fn classify(mail: &Mail) -> Option<Command> {
    if mail.subject.trim().eq_ignore_ascii_case("status") {
        return Some(Command::Status);
    }
    let first = mail.body.lines().map(str::trim).find(|l| !l.is_empty())?;
    let word = first.trim_end_matches(['.', '!']).to_ascii_lowercase();
    if !(word == "cancel" || word.starts_with("cancel ")) {
        return None;
    }
    let ack_id = mail.in_reply_to.iter().chain(mail.references.iter().rev()).find(|id| id.starts_with("<ack."))?;
    let target = ack_id.strip_prefix("<ack.")?.split('.').next()?.parse().ok()?;
    Some(Command::Cancel { target: JobId(target), ack_id: ack_id.clone() })
}

/// The command a job's mail gives, if any. A message filed into an Ask folder is asked about,
/// never obeyed: its words may be anyone's.
pub fn command_in(job: &Job, question: &Mail) -> Option<Command> {
    match job.origin {
        Origin::Mail => classify(question),
        Origin::Ask => None,
    }
}

/// Answers a command mail and ends its job.
pub async fn obey(
    shift: &Shift,
    leased: LeasedJob,
    model: &ModelEntry,
    question: &Mail,
    command: Command,
) -> Result<(), StoreError> {
    let job = leased.job().clone();
    let text = match command {
        Command::Status => status(shift, &job)?,
        Command::Cancel { target, ack_id } => cancel(shift, &job, target, &ack_id).await?,
    };
    let asked = Asked { job: &job, model, question };
    let content = Content::about(&job, format!("{text}\n\n-- \nnightmail\n"));
    // About the asker's own questions: to them alone, whoever the command's headers name.
    let letters = Letters::new(shift);
    let reply = match &job.sender {
        Some(asker) => {
            letters.private(asked, asker, content, new_message_id("reply", job.id.0, &shift.config().hostname))?
        }
        None => letters.reply(asked, content)?,
    };
    shift.store.finish(leased, Finish::Done { reply }, &shift.policy).await?;
    Ok(())
}

/// Cancels `target` for the sender of `job`, if `ack_id` is the acknowledgement it was sent.
async fn cancel(shift: &Shift, job: &Job, target: JobId, ack_id: &str) -> Result<String, StoreError> {
    let Some(t) = shift.store.job(target)?.filter(|t| t.ack.as_deref() == Some(ack_id) && t.sender == job.sender)
    else {
        return Ok(format!("There is no question of yours to cancel behind {ack_id}."));
    };
    let after = shift.store.cancel(target).await?;
    if !checkpoints::may_resume(&after.state) {
        checkpoints::remove(&shift.config().data_dir, target);
    }
    Ok(match after.state {
        JobState::Cancelled { .. } => {
            format!("Cancelled job {target} (\"{}\"). No answer will be sent.", HeaderText::new(&t.subject))
        }
        other => format!(
            "Job {target} (\"{}\") had already ended ({}); nothing to cancel.",
            HeaderText::new(&t.subject),
            other.name()
        ),
    })
}

/// The queue as the sender of `job` may see it: their own questions in full, others counted.
/// Read from the store's index of open jobs.
pub(crate) fn status(shift: &Shift, job: &Job) -> Result<String, StoreError> {
    let pace = Pace::of(&shift.store, &job.model)?;
    let now = Timestamp::now();
    let mut mine = Vec::new();
    let mut others = 0;
    for j in shift.store.open_jobs()?.iter().filter(|j| j.id != job.id) {
        if j.sender == job.sender {
            let mut progress =
                j.progress.as_ref().map(|p| format!(", {} tokens so far", p.output_tokens)).unwrap_or_default();
            if let Some(r) = j.progress.as_ref().and_then(|p| p.research.as_ref()) {
                progress.push_str(&format!(", {} tool calls ({})", r.calls, r.step));
            }
            if let (JobState::Running { .. }, Some(pace)) = (&j.state, &pace) {
                progress.push_str(&format!(", about {} left", human_duration(pace.rest(j))));
            }
            mine.push(format!(
                "  job {}  {}  \"{}\" to {}, {} old{progress}",
                j.id,
                j.state.name(),
                HeaderText::new(&j.subject),
                j.model,
                human_duration(now.since(j.created_at))
            ));
        } else {
            others += 1;
        }
    }
    let mut text = String::from("The queue now:\n\n");
    if mine.is_empty() {
        text.push_str("You have no questions waiting or being answered.\n");
    } else {
        text.push_str("Your questions:\n");
        text.push_str(&mine.join("\n"));
        text.push('\n');
    }
    text.push_str(&format!("Other people's questions waiting or being answered: {others}\n"));
    if let Some(p) = &pace {
        text.push_str(&format!(
            "Answers from {} lately: about {:.0} tokens at {:.2} s/token, {} each.\n",
            job.model,
            p.tokens_per_answer,
            p.s_per_token,
            human_duration(p.answer())
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::parse;

    #[test]
    fn commands_are_recognised() {
        let status = parse(b"Subject:  Status \r\n\r\n").unwrap();
        assert_eq!(classify(&status), Some(Command::Status));
        let cancel = parse(
            b"Subject: Re: q\r\nIn-Reply-To: <ack.42.00ff@n.local>\r\n\r\nCancel.\r\n\r\n> Your question is queued\r\n",
        )
        .unwrap();
        assert_eq!(
            classify(&cancel),
            Some(Command::Cancel { target: JobId(42), ack_id: "<ack.42.00ff@n.local>".into() })
        );
        let question = parse(
            b"Subject: Re: q\r\nIn-Reply-To: <ack.42.00ff@n.local>\r\n\r\nCan you cancel my subscription to X?\r\n",
        )
        .unwrap();
        assert_eq!(classify(&question), None);
        let no_ack = parse(b"Subject: q\r\n\r\ncancel\r\n").unwrap();
        assert_eq!(classify(&no_ack), None, "cancel needs the acknowledgement it answers");
    }
}
