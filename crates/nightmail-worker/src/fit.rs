//! Fitting a prompt to the model's context. A prompt that does not fit would fail the same way on
//! every retry, so it is made to fit before it is sent: the thread's oldest messages go first,
//! then the longest attachment (a forwarded message counts as one) is cut, or left out when
//! little of it would be left; the reply says what went. Only a question that does not fit on its
//! own fails, at once, with a notice giving the limit.

use crate::backend::{Backend, BackendError, Measure, Request};
use crate::mail::Mail;

/// An attachment cut shorter than this many characters is left out instead.
const SHORTEST_CUT: usize = 400;
/// Characters cut beyond the estimate of what is over: more than the cut marker's length.
const CUT_PADDING: usize = 128;

/// What fitting did to one attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// `the attachment NAME` or `the forwarded message "SUBJECT"`.
    pub what: String,
    /// Its length as it came, in characters.
    pub had: usize,
    /// Characters kept; `None`: left out.
    pub kept: Option<usize>,
}

impl Cut {
    fn said(&self) -> String {
        match self.kept {
            Some(kept) => format!("{} was cut to its first {kept} of {} characters", self.what, self.had),
            None => format!("{} ({} characters) was left out", self.what, self.had),
        }
    }
}

/// Where a prompt may go: the context, less the room kept for the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub context: usize,
    /// Tokens kept for the answer: the answer's limit, but at most a quarter of the context.
    pub reserve: usize,
}

impl Limit {
    pub fn new(context: usize, max_tokens: u32) -> Limit {
        Limit { context, reserve: (max_tokens as usize).min(context / 4) }
    }

    fn prompt(&self) -> usize {
        self.context - self.reserve
    }
}

/// What fitting left out, as the reply states it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeftOut {
    /// Messages dropped from the start of the thread.
    pub thread_messages: usize,
    /// Per attachment cut or left out: what it is, its length as it came (in characters), and
    /// what was done to it.
    pub attachments: Vec<Cut>,
    /// The limit it was fitted to, when anything was left out.
    pub limit: Option<Limit>,
    /// Whether the token counts were estimated (no tokenizer at hand).
    pub estimated: bool,
}

impl LeftOut {
    /// The note the reply carries, if anything was left out.
    pub fn note(&self) -> Option<String> {
        let limit = self.limit?;
        let mut parts = Vec::new();
        if self.thread_messages > 0 {
            parts.push(format!("the thread's {} oldest message(s) were left out", self.thread_messages));
        }
        parts.extend(self.attachments.iter().map(Cut::said));
        let about = if self.estimated { "about " } else { "" };
        Some(format!(
            "To fit the model's context ({} tokens, {about}{} for the question and {} kept for the answer), {}.",
            limit.context,
            limit.prompt(),
            limit.reserve,
            parts.join("; ")
        ))
    }
}

/// Why a question cannot be asked at all.
#[derive(Debug, PartialEq, Eq)]
pub struct TooLong {
    pub prompt_tokens: usize,
    pub limit: Limit,
    pub estimated: bool,
}

impl std::fmt::Display for TooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let about = if self.estimated { "about " } else { "" };
        write!(
            f,
            "the question is {about}{} tokens on its own, and the model's context holds {} ({} for the question, {} kept for the answer): shorten it",
            self.prompt_tokens,
            self.limit.context,
            self.limit.prompt(),
            self.limit.reserve
        )
    }
}

/// Makes `thread` and `question` fit the context `backend` measures (at most `configured`),
/// building the request from them with `build`. An estimated count is multiplied by `scale` (1,
/// or more once a server has counted a refused prompt as longer than its estimate). A backend
/// that knows no context, and has none configured, gets them as they are. A measuring error is
/// left to generation to meet.
pub async fn fit(
    backend: &dyn Backend,
    configured: Option<usize>,
    scale: f64,
    thread: &mut Vec<Mail>,
    question: &mut Mail,
    build: impl Fn(&[Mail], &Mail) -> Request,
) -> Result<LeftOut, TooLong> {
    let mut left_out = LeftOut::default();
    loop {
        let request = build(thread, question);
        let measured = match backend.measure(&request).await {
            Ok(m) if m.exact => m,
            Ok(m) => Measure { prompt_tokens: (m.prompt_tokens as f64 * scale).ceil() as usize, ..m },
            Err(BackendError::Stopped) => return Ok(left_out),
            Err(e) => {
                tracing::warn!("cannot measure the prompt, sending it as it is: {e}");
                return Ok(left_out);
            }
        };
        let context = match (measured.context, configured) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(c) => c,
                None => return Ok(left_out),
            },
        };
        let limit = Limit::new(context, request.max_tokens);
        left_out.estimated = !measured.exact;
        if measured.prompt_tokens <= limit.prompt() {
            return Ok(left_out);
        }
        left_out.limit = Some(limit);
        if !thread.is_empty() {
            thread.remove(0);
            left_out.thread_messages += 1;
            continue;
        }
        // Characters per token, from this prompt: how much to cut for the tokens over.
        let chars: usize = request.turns.iter().map(|t| t.content.chars().count()).sum();
        let per_token = (chars as f64 / measured.prompt_tokens.max(1) as f64).max(1.0);
        let over = measured.prompt_tokens - limit.prompt();
        // A cut a little short is cut again on the next round (the padding removes the marker
        // the last cut left).
        match cut_longest(question, (over as f64 * per_token) as usize + CUT_PADDING) {
            Some(cut) => match left_out.attachments.iter_mut().find(|c| c.what == cut.what) {
                Some(before) => *before = Cut { had: before.had, ..cut },
                None => left_out.attachments.push(cut),
            },
            None => return Err(TooLong { prompt_tokens: measured.prompt_tokens, limit, estimated: !measured.exact }),
        }
    }
}

/// Cuts `chars` characters off the end of the question's longest attachment or forwarded
/// message, or leaves it out when less than [`SHORTEST_CUT`] would be left. Says what it did;
/// `None` when the question has nothing attached left.
fn cut_longest(question: &mut Mail, chars: usize) -> Option<Cut> {
    let attachments = question.text_attachments.iter().enumerate().map(|(i, (_, t))| (Piece::Attachment(i), t.len()));
    let forwarded = question.forwarded.iter().enumerate().map(|(i, f)| (Piece::Forwarded(i), f.body.len()));
    let (piece, _) = attachments.chain(forwarded).max_by_key(|(_, len)| *len)?;
    let (what, text) = match piece {
        Piece::Attachment(i) => {
            let (name, text) = &mut question.text_attachments[i];
            (format!("the attachment {name}"), text)
        }
        Piece::Forwarded(i) => {
            let f = &mut question.forwarded[i];
            (format!("the forwarded message \"{}\"", f.subject), &mut f.body)
        }
    };
    let had = text.chars().count();
    let keep = had.saturating_sub(chars);
    if keep >= SHORTEST_CUT {
        let at = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
        text.truncate(at);
        text.push_str("\n[... cut here: the rest was left out to fit the model's context]");
        return Some(Cut { what, had, kept: Some(keep) });
    }
    match piece {
        Piece::Attachment(i) => drop(question.text_attachments.remove(i)),
        Piece::Forwarded(i) => drop(question.forwarded.remove(i)),
    }
    Some(Cut { what, had, kept: None })
}

/// An attachment of the question, by kind and place.
#[derive(Clone, Copy)]
enum Piece {
    Attachment(usize),
    Forwarded(usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendAnswer, BoxFuture, Event, estimate_tokens};
    use crate::conversation;
    use crate::mail::parse;
    use tokio::sync::{mpsc, watch};

    /// A backend with a context of `context` tokens and no tokenizer (estimates).
    struct Sized(usize);

    impl Backend for Sized {
        fn describe(&self) -> String {
            "sized".into()
        }

        fn measure<'a>(&'a self, request: &'a Request) -> BoxFuture<'a, Result<Measure, BackendError>> {
            Box::pin(async move {
                Ok(Measure { prompt_tokens: estimate_tokens(&request.turns), exact: false, context: Some(self.0) })
            })
        }

        fn generate<'a>(
            &'a self,
            _: &'a Request,
            _: mpsc::UnboundedSender<Event>,
            _: watch::Receiver<bool>,
        ) -> BoxFuture<'a, Result<BackendAnswer, BackendError>> {
            Box::pin(async { Err(BackendError::Stopped) })
        }
    }

    fn build(thread: &[Mail], question: &Mail) -> Request {
        let turns = conversation::build(None, thread, question, |_| false).turns;
        Request {
            turns,
            max_tokens: 100,
            temperature: 0.0,
            reasoning: None,
            model: None,
            checkpoint: None,
            tools: Vec::new(),
        }
    }

    fn mail(body: &str, attachment: Option<&str>) -> Mail {
        let raw = match attachment {
            None => format!("From: a@x\r\nSubject: s\r\n\r\n{body}\r\n"),
            Some(text) => format!(
                "From: a@x\r\nSubject: s\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\n{body}\r\n--b\r\nContent-Type: text/plain; name=\"book.txt\"\r\nContent-Disposition: attachment; filename=\"book.txt\"\r\n\r\n{text}\r\n--b--\r\n"
            ),
        };
        parse(raw.as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn the_oldest_messages_go_first_then_the_attachment_is_cut() {
        let thread = vec![mail(&"old words ".repeat(100), None), mail("recent", None)];
        let mut question = mail("What does the book say?", Some(&"a line of the book\n".repeat(200)));
        let mut t = thread.clone();
        // 1000 tokens: the question and a cut attachment fit, the old message does not.
        let left = fit(&Sized(1000), None, 1.0, &mut t, &mut question, build).await.unwrap();
        assert_eq!(left.thread_messages, 2, "both thread messages go before the attachment is touched");
        assert!(t.is_empty());
        assert_eq!(left.attachments.len(), 1, "{left:?}");
        assert!(left.attachments[0].said().starts_with("the attachment book.txt was cut to its first"), "{left:?}");
        assert_eq!(left.attachments[0].had, 3800, "the length as it came, however many rounds of cutting");
        let fitted = build(&t, &question);
        assert!(estimate_tokens(&fitted.turns) <= 900, "fits beside the 100 kept for the answer");
        assert!(fitted.turns[0].content.contains("[... cut here"));
        let note = left.note().unwrap();
        assert!(note.starts_with("To fit the model's context (1000 tokens, about 900 for the question"), "{note}");
        assert!(note.contains("the thread's 2 oldest message(s) were left out"), "{note}");
    }

    #[tokio::test]
    async fn a_prompt_that_fits_is_left_alone_and_a_question_too_long_on_its_own_fails() {
        let mut thread = vec![mail("hello", None)];
        let mut question = mail("short", None);
        let left = fit(&Sized(1000), None, 1.0, &mut thread, &mut question, build).await.unwrap();
        assert_eq!((left.note(), thread.len()), (None, 1));
        // The configured context is the smaller: it rules.
        let mut long = mail(&"word ".repeat(400), Some("a short attachment"));
        let e = fit(&Sized(100_000), Some(200), 1.0, &mut thread, &mut long, build).await.unwrap_err();
        assert_eq!(e.limit, Limit { context: 200, reserve: 50 });
        assert!(e.to_string().contains("and the model's context holds 200 (150 for the question, 50 kept"), "{e}");
        assert!(long.text_attachments.is_empty(), "the attachment was left out before giving up");
    }
}
