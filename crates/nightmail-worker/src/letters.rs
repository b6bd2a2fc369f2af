//! The letters the worker writes, each threaded under the question it is about: the reply (to
//! the question's audience, the asker always among it), messages to the asker alone
//! (acknowledgements, command answers, progress), and the failure notice that ends a question
//! the model will not answer. Written by `compose.rs`, sent the way the question came
//! (`outlet.rs`). The model writes on its asker's behalf: the outside people it reaches through
//! the `[relay]` count against the asker's daily relay quota, and a question with no asker
//! reaches no one outside.

use std::time::Duration;

use nightmail_config::ModelEntry;
use nightmail_store::{Incoming, Job, Origin, StoreError, Summary};
use nightmail_types::{Address, HeaderText, Timestamp};

use crate::ask;
use crate::compose::{self, Audience, Body};
use crate::mail::{self, Mail};
use crate::outlet::{self, Author, Outlet};
use crate::setup::Shift;

/// What a job asks: the job, its model and its question, as the worker read them.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    pub job: &'a Job,
    pub model: &'a ModelEntry,
    pub question: &'a Mail,
}

/// What a letter says: its text, its own `X-Nightmail-*` headers, and a text attachment.
pub struct Content {
    pub body: Body,
    pub headers: Vec<(&'static str, HeaderText)>,
    pub attachment: Option<(&'static str, String)>,
}

impl Content {
    /// Plain text that names its job.
    pub fn about(job: &Job, text: String) -> Content {
        let headers = vec![("X-Nightmail-Job", HeaderText::new(&job.id.to_string()))];
        Content { body: Body::Plain(text), headers, attachment: None }
    }
}

/// One letter before it is written: who from, to whom, what, under which Message-ID.
struct Letter<'a> {
    author: Author<'a>,
    audience: Audience,
    content: Content,
    message_id: String,
}

pub struct Letters<'a> {
    shift: &'a Shift,
}

impl<'a> Letters<'a> {
    pub fn new(shift: &'a Shift) -> Letters<'a> {
        Letters { shift }
    }

    /// A message from the model to the asker alone, threaded under the question, under a fresh
    /// Message-ID of `kind`.
    pub fn to_asker(
        &self,
        asked: Asked<'_>,
        asker: &Address,
        text: String,
        kind: &str,
    ) -> Result<Incoming, StoreError> {
        let message_id = compose::new_message_id(kind, asked.job.id.0, &self.shift.config().hostname);
        self.private(asked, asker, Content::about(asked.job, text), message_id)
    }

    /// `content` from the model to the asker alone, threaded under the question, as `message_id`.
    pub fn private(
        &self,
        asked: Asked<'_>,
        asker: &Address,
        content: Content,
        message_id: String,
    ) -> Result<Incoming, StoreError> {
        let audience = Audience { to: vec![mail::Person { address: asker.clone(), name: None }], cc: Vec::new() };
        self.write(asked.job, asked.question, Letter { author: asked.model.into(), audience, content, message_id })
    }

    /// A message from the model to the question's audience (reply-all, with the asker kept
    /// whatever its Reply-To says; the asker alone for an Ask job), threaded under it.
    pub fn reply(&self, asked: Asked<'_>, content: Content) -> Result<Incoming, StoreError> {
        let job = asked.job;
        let is_model = |a: &Address| self.shift.is_model(a);
        let audience = match (job.origin, job.sender.as_ref()) {
            (Origin::Ask, Some(asker)) => ask::audience(asker),
            (Origin::Mail, Some(asker)) if !is_model(asker) => {
                let mut audience = Audience::reply_all(asked.question, Some(asker), is_model);
                audience.keep(asker);
                audience
            }
            _ => Audience::reply_all(asked.question, job.sender.as_ref(), is_model),
        };
        let message_id = compose::new_message_id("reply", job.id.0, &self.shift.config().hostname);
        self.write(job, asked.question, Letter { author: asked.model.into(), audience, content, message_id })
    }

    /// A failure notice to the asker, threaded under the question when it could be read; none
    /// for the null sender or a model.
    pub fn notice(
        &self,
        job: &Job,
        author: Author<'_>,
        question: Option<&Mail>,
        why: &str,
    ) -> Result<Option<Incoming>, StoreError> {
        let fallback = Mail {
            subject: job.subject.clone(),
            message_id: Some(job.message_id.clone()).filter(|s| !s.is_empty()),
            ..Mail::default()
        };
        let question = question.unwrap_or(&fallback);
        let Some(sender) = job.sender.as_ref().filter(|s| !self.shift.is_model(s)) else { return Ok(None) };
        let text = format!(
            "Your question could not be answered.\n\nReason: {why}\n\nJob {} for {}. Send the question again to retry.\n\n-- \nnightmail\n",
            job.id, author.address,
        );
        let mut content = Content::about(job, text);
        content.headers.push(("X-Nightmail-Failure", HeaderText::new(why)));
        let letter = Letter {
            author,
            audience: Audience { to: vec![mail::Person { address: sender.clone(), name: None }], cc: Vec::new() },
            content,
            message_id: compose::new_message_id("failure", job.id.0, &self.shift.config().hostname),
        };
        Ok(Some(self.write(job, question, letter)?))
    }

    /// Writes `letter`, threaded under `parent`, ready to deliver, by the way `job` came in.
    fn write(&self, job: &Job, parent: &Mail, letter: Letter<'_>) -> Result<Incoming, StoreError> {
        let Letter { author, mut audience, content, message_id } = letter;
        let outlet = Outlet::new(self.shift.config(), job.via.as_ref());
        let name = HeaderText::new(author.name.unwrap_or_else(|| author.address.local_part()));
        let from = outlet.from(author);
        let subject = compose::reply_subject(&parent.subject);
        // Outside people are reached only through the relay or the bridge, and only so many per
        // reply and per asker a day.
        let (max, why) = self.outside_cap(job, &outlet)?;
        let left_out = audience.limit_outside(|a| !self.shift.is_model(a) && outlet.is_outside(a), max);
        let body = if left_out.is_empty() {
            content.body
        } else {
            content.body.map(|text| compose::with_note(text, &compose::left_out_note(&left_out, &why)))
        };
        let raw = compose::write(compose::ReplyMail {
            from: (name.clone(), from),
            audience: &audience,
            subject: subject.clone(),
            message_id: message_id.clone(),
            parent,
            body,
            headers: content.headers,
            attachment: content.attachment,
        });
        let recipients = audience
            .everyone()
            .filter(|p| !self.shift.is_model(&p.address))
            .map(|p| outlet.recipient(&p.address))
            .chain(outlet.archive())
            .collect();
        Ok(Incoming {
            key: self.shift.store.new_message_key()?,
            raw,
            sender: Some(from.clone()),
            recipients,
            summary: Summary {
                from: format!("{name} <{from}>"),
                subject: subject.to_string(),
                message_id: message_id.clone(),
            },
            dedupe_id: message_id,
        })
    }

    /// At most how many outside people one letter for `job` reaches: the outlet's cap, and for
    /// mail through the `[relay]` what is left of the asker's daily relay quota, with the reason
    /// named to those left out.
    fn outside_cap(&self, job: &Job, outlet: &Outlet<'_>) -> Result<(usize, String), StoreError> {
        let (max, why) = outlet.cap();
        let Some(relay) = self.shift.config().relay.as_ref().filter(|_| job.via.is_none() && max > 0) else {
            return Ok((max, why));
        };
        let Some(asker) = job.sender.as_ref() else {
            return Ok((0, "the question has no sender whose relay quota could count it".into()));
        };
        let quota = relay.max_relay_recipients_per_user_per_day;
        let day_ago = Timestamp::now().minus(Duration::from_secs(24 * 3600));
        let left = quota.saturating_sub(self.shift.store.relay_used(asker, day_ago)?);
        if left >= max {
            return Ok((max, why));
        }
        let why =
            format!("<{asker}> reached the daily relay quota: relay.max_relay_recipients_per_user_per_day = {quota}");
        Ok((left, why))
    }
}

/// The author of a notice about a job whose model is gone from the configuration: the address
/// the question was sent to.
pub fn gone_model(job: &Job) -> Author<'_> {
    outlet::Author { address: &job.model, name: None }
}
