//! Voice notes: a mail's audio attachments transcribed on this machine with the `[transcribe]`
//! Whisper model (nightmail-transcribe) before its conversation is built. Transcribing runs on
//! tokio's blocking pool, once per attempt at a job: a resumed job transcribes again (greedy
//! decoding gives the same words), so nothing about a note is kept in its checkpoint.

use std::sync::{Arc, Mutex};

use nightmail_config::TranscribeConfig;
use nightmail_transcribe::Transcriber;

use crate::mail::Mail;

/// What became of one audio attachment.
#[derive(Clone, Debug, PartialEq)]
pub enum VoiceNote {
    Heard {
        name: String,
        model: String,
        text: String,
    },
    /// No `[transcribe]` section: the note reaches the model as its name only.
    NoModel {
        name: String,
    },
    Failed {
        name: String,
        why: String,
    },
}

impl VoiceNote {
    /// The note as the model reads it, inside its message's turn.
    pub fn in_conversation(&self) -> String {
        match self {
            VoiceNote::Heard { name, model, text } => {
                format!(
                    "---------- Voice note: {name} (transcribed by {model} on this machine) ----------\n{}",
                    text.trim()
                )
            }
            VoiceNote::NoModel { name } => {
                format!("[voice note {name}: not transcribed — no [transcribe] model is configured; see docs/MAIL.md]")
            }
            VoiceNote::Failed { name, why } => format!("[voice note {name}: not transcribed — {why}]"),
        }
    }

    /// The line the reply carries about the note, so the asker knows what the model heard.
    pub fn in_reply(&self) -> String {
        match self {
            VoiceNote::Heard { name, model, .. } => {
                format!("Voice note {name} was transcribed by {model} on this machine; the model read the transcript.")
            }
            VoiceNote::NoModel { name } => format!(
                "Voice note {name} was not heard: this server has no [transcribe] model. Its operator can enable one (docs/MAIL.md, Voice notes); until then, write the question out."
            ),
            VoiceNote::Failed { name, why } => format!("Voice note {name} was not heard: {why}."),
        }
    }
}

/// Transcribes the audio attachments of `mails`, filling each one's `voice_notes` (one per audio
/// attachment, in order). The audio itself is dropped afterwards: the conversation needs only the
/// words, and the mail is cloned for every fitting of the prompt.
pub async fn hear(config: Option<&TranscribeConfig>, mails: &mut [Mail]) {
    for mail in mails.iter_mut() {
        for (name, content_type, audio) in std::mem::take(&mut mail.audio_attachments) {
            let note = match config {
                None => VoiceNote::NoModel { name },
                Some(config) => {
                    let (config, file) = (config.clone(), name.clone());
                    let job = tokio::task::spawn_blocking(move || transcribe(&config, &file, &content_type, &audio));
                    job.await
                        .unwrap_or_else(|e| VoiceNote::Failed { name, why: format!("the transcriber stopped ({e})") })
                }
            };
            tracing::info!(note = ?note_summary(&note), "voice note");
            mail.voice_notes.push(note);
        }
    }
}

fn note_summary(note: &VoiceNote) -> String {
    match note {
        VoiceNote::Heard { name, model, text } => {
            format!("{name}: {} words by {model}", text.split_whitespace().count())
        }
        other => other.in_reply(),
    }
}

fn transcribe(config: &TranscribeConfig, name: &str, content_type: &str, audio: &[u8]) -> VoiceNote {
    let failed = |why: String| VoiceNote::Failed { name: name.to_string(), why };
    let transcriber = match transcriber(config) {
        Ok(t) => t,
        Err(e) => return failed(e.to_string()),
    };
    match transcriber.transcribe(audio, Some(content_type), Some(name)) {
        Ok(t) if t.text.trim().is_empty() => {
            failed(format!("{:.0} s of audio held no words Whisper recognised", t.seconds))
        }
        Ok(t) => VoiceNote::Heard { name: name.to_string(), model: transcriber.model_name().to_string(), text: t.text },
        Err(e) => failed(e.to_string()),
    }
}

/// The model is opened on the first voice note and kept while the configuration names it (a
/// reload that changes `[transcribe]` opens the new one).
fn transcriber(config: &TranscribeConfig) -> Result<Arc<Transcriber>, nightmail_transcribe::TranscribeError> {
    static OPEN: Mutex<Option<(TranscribeConfig, Arc<Transcriber>)>> = Mutex::new(None);
    let mut open = OPEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((opened, transcriber)) = open.as_ref()
        && opened == config
    {
        return Ok(transcriber.clone());
    }
    let transcriber = Arc::new(Transcriber::open_with_language(&config.model, config.language.as_deref())?);
    *open = Some((config.clone(), transcriber.clone()));
    Ok(transcriber)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation;
    use crate::mail::parse;

    const WITH_NOTE: &[u8] = b"From: Ann <ann@x.org>\r\nTo: kimi@n.local\r\nSubject: listen\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nSee the note.\r\n--b\r\nContent-Type: audio/ogg\r\nContent-Disposition: attachment; filename=note.ogg\r\nContent-Transfer-Encoding: base64\r\n\r\nT2dnUwACAAAAAAAAAAA=\r\n--b--\r\n";

    #[tokio::test]
    async fn without_a_model_the_note_is_reported_not_heard() {
        let mut question = parse(WITH_NOTE).unwrap();
        assert_eq!(question.audio_attachments.len(), 1);
        assert_eq!(question.audio_attachments[0].0, "note.ogg");
        hear(None, std::slice::from_mut(&mut question)).await;
        assert!(question.audio_attachments.is_empty());
        assert_eq!(question.voice_notes, [VoiceNote::NoModel { name: "note.ogg".into() }]);
        let turns = conversation::build(None, &[], &question, |_| false).turns;
        assert_eq!(
            turns[0].content,
            "See the note.\n\n[voice note note.ogg: not transcribed — no [transcribe] model is configured; see docs/MAIL.md]"
        );
        let line = question.voice_notes[0].in_reply();
        assert!(line.contains("not heard") && line.contains("[transcribe]"), "{line}");
    }

    #[test]
    fn a_heard_note_names_its_model() {
        let note =
            VoiceNote::Heard { name: "n.m4a".into(), model: "whisper-tiny.en".into(), text: " Call me. ".into() };
        assert_eq!(
            note.in_conversation(),
            "---------- Voice note: n.m4a (transcribed by whisper-tiny.en on this machine) ----------\nCall me."
        );
        assert!(note.in_reply().contains("transcribed by whisper-tiny.en"));
    }
}
