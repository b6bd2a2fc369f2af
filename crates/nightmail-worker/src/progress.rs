//! The answer so far, shown to its asker while it is written: a message in their `In Progress`
//! mailbox, replaced every `progress_every_secs` (the store files it and withdraws it when the
//! job ends: `nightmail-store` `in_progress.rs`), and, for very long jobs, a mail every
//! `progress_mail_every_hours`. This module says when each is due and what it says; the worker
//! writes the message like any other it sends (`compose.rs`).

use std::time::{Duration, Instant};

use nightmail_config::ModelEntry;
use nightmail_store::Progress;

/// When the next progress message and progress mail are due for one attempt of a job.
pub struct ProgressTimer {
    /// The asker's user name (whose `In Progress` mailbox gets the message); `None` for an asker
    /// with no account here, who gets no progress message.
    pub owner: Option<String>,
    every: Duration,
    mail_every: Option<Duration>,
    /// When the message was last filed, and with how many tokens.
    filed: Option<(Instant, u64)>,
    mailed_at: Instant,
}

impl ProgressTimer {
    pub fn new(model: &ModelEntry, owner: Option<String>, started: Instant) -> ProgressTimer {
        ProgressTimer {
            owner,
            every: model.progress_every,
            mail_every: model.progress_mail_every,
            filed: None,
            mailed_at: started,
        }
    }

    /// Whether the `In Progress` message should be (re)filed now: at the start, as soon as the
    /// first words are written (or restored from a checkpoint), then every `progress_every`, and
    /// only when the answer has grown since.
    pub fn filing_due(&self, progress: &Progress) -> bool {
        self.owner.is_some()
            && match self.filed {
                None => true,
                Some((at, tokens)) => tokens != written(progress) && (tokens == 0 || at.elapsed() >= self.every),
            }
    }

    pub fn filed(&mut self, progress: &Progress) {
        self.filed = Some((Instant::now(), written(progress)));
    }

    /// Whether a progress mail is due (never, unless `progress_mail_every_hours` is set).
    pub fn mail_due(&self) -> bool {
        self.mail_every.is_some_and(|every| self.mailed_at.elapsed() >= every)
    }

    pub fn mailed(&mut self) {
        self.mailed_at = Instant::now();
    }
}

/// How far the job has got, as the messages show it: tokens written, and tool calls made.
fn written(progress: &Progress) -> u64 {
    progress.output_tokens + progress.reasoning_tokens + progress.research.as_ref().map_or(0, |r| u64::from(r.calls))
}

/// The text of the `In Progress` message.
pub fn page(progress: &Progress, job: u64) -> String {
    let so_far = if progress.partial_text.trim().is_empty() {
        "Nothing of the answer is written yet: the model is reading the question.".to_string()
    } else {
        progress.partial_text.trim().to_string()
    };
    format!(
        "This answer is being written ({}). This message is replaced as it grows, and removed when \
         the answer is sent.\n{}\n{so_far}\n\n-- \nnightmail: job {job}, in progress\n",
        tokens(progress),
        research(progress)
    )
}

/// The text of a progress mail.
pub fn mail(progress: &Progress, job: u64) -> String {
    format!(
        "Your question is still being answered ({}). The answer so far:\n\n{}\n\n-- \nnightmail: job {job}, in progress\n",
        tokens(progress),
        progress.partial_text.trim()
    )
}

/// The research line: the step the job is on, and what it has done.
fn research(progress: &Progress) -> String {
    match &progress.research {
        Some(r) => format!(
            "\nResearching, {} tool call{} so far ({} KB read): {}\n",
            r.calls,
            if r.calls == 1 { "" } else { "s" },
            r.bytes.div_ceil(1024),
            r.step
        ),
        None => String::new(),
    }
}

fn tokens(progress: &Progress) -> String {
    let mut text = format!("{} tokens so far", written(progress));
    if progress.max_tokens > 0 {
        text.push_str(&format!(" of at most {}", progress.max_tokens));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(every_secs: u64) -> ModelEntry {
        let text = format!(
            "[[model]]\naddress = \"k@x\"\nbackend = \"openai\"\nurl = \"http://h/v1\"\nprogress_every_secs = {every_secs}\n"
        );
        nightmail_config::Config::parse(&text, None).unwrap().models.remove(0)
    }

    #[test]
    fn filed_at_the_start_then_only_when_due_and_grown() {
        let progress = Progress { output_tokens: 3, ..Progress::default() };
        let mut s = ProgressTimer::new(&model(3600), Some("me".into()), Instant::now());
        assert!(s.filing_due(&progress), "the first filing is at once");
        s.filed(&progress);
        assert!(!s.filing_due(&Progress { output_tokens: 9, ..Progress::default() }), "not before the interval");
        let mut s = ProgressTimer::new(&model(3600), Some("me".into()), Instant::now());
        s.filed(&Progress::default());
        assert!(s.filing_due(&progress), "the first words are shown at once, not an interval later");
        let mut s = ProgressTimer::new(&model(1), Some("me".into()), Instant::now());
        s.filed = Some((Instant::now() - Duration::from_secs(2), 3));
        assert!(!s.filing_due(&progress), "an answer that has not grown is not filed again");
        assert!(s.filing_due(&Progress { output_tokens: 4, ..Progress::default() }));
        let nobody = ProgressTimer::new(&model(1), None, Instant::now());
        assert!(!nobody.filing_due(&progress), "an asker with no mailbox here gets no progress message");
        assert!(!nobody.mail_due(), "progress mail is off by default");
    }

    #[test]
    fn the_page_says_what_it_is() {
        let p = Progress { output_tokens: 5, max_tokens: 100, partial_text: "Paris is".into(), ..Progress::default() };
        let text = page(&p, 7);
        assert!(text.contains("5 tokens so far of at most 100"), "{text}");
        assert!(text.contains("\n\nParis is\n\n-- \nnightmail: job 7, in progress"), "{text}");
        assert!(page(&Progress::default(), 7).contains("Nothing of the answer is written yet"));
    }
}
