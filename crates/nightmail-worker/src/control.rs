//! Mail that talks to nightmail rather than to the model: `status` asks about the queue, and
//! replying `cancel` to an acknowledgement cancels that question. Documented in docs/MAIL.md.

use nightmail_store::JobId;

use crate::mail::Mail;

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
