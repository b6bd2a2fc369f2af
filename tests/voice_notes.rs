//! Voice notes end to end: mutt sends a question with an m4a and an Ogg/Opus note (spoken by
//! espeak-ng, encoded by ffmpeg) to the real daemon configured with `[transcribe]` and the Whisper
//! model scripts/fetch-whisper.sh converts. The model server records the prompt nightmail built
//! (common::RecordingBackend), so the test reads what the model was given: each note's words.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Daemon, PASSWORD, external, wait_for_jobs};
use nightmail_transcribe::word_error_rate;

const SPOKEN: &str =
    "The quick brown fox jumps over the lazy dog. Please call me back tomorrow morning about the budget meeting.";

fn whisper_model() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch-whisper.sh");
    let out = Command::new("bash").arg(script).output().unwrap();
    assert!(out.status.success(), "scripts/fetch-whisper.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(
        String::from_utf8(out.stdout).unwrap().lines().last().expect("fetch-whisper.sh prints the path").trim(),
    )
}

/// `SPOKEN` as a voice note `file`, encoded with `codec`.
fn voice_note(dir: &Path, file: &str, codec: &[&str]) -> PathBuf {
    let wav = dir.join(format!("{file}.wav"));
    let status = external("espeak-ng", "espeak-ng").arg("-w").arg(&wav).arg(SPOKEN).status().unwrap();
    assert!(status.success());
    let out = dir.join(file);
    let status = external("ffmpeg", "ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
        .arg(&wav)
        .args(codec)
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    out
}

/// Sends from me@ to kimi@ with mutt in batch mode, the notes attached (`mutt -a FILE... --`).
fn mutt_send(daemon: &Daemon, subject: &str, body: &str, attachments: &[PathBuf]) {
    let dir = daemon.dir.path();
    let rc = dir.join("muttrc.send");
    std::fs::write(
        &rc,
        format!(
            "set from=me@nightmail.test\nset smtp_url=smtp://me@127.0.0.1:{}/\nset smtp_pass=\"{PASSWORD}\"\n\
set ssl_starttls=no\nset ssl_force_tls=no\nset copy=no\nset timeout=1\n",
            daemon.smtp.port()
        ),
    )
    .unwrap();
    let mut mutt = external("mutt", "mutt");
    mutt.env("HOME", dir).arg("-n").arg("-F").arg(&rc).args(["-s", subject, "-a"]);
    mutt.args(attachments).args(["--", "kimi@nightmail.test"]);
    let mut child = mutt.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "mutt failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The words under the "Voice note: NAME" heading of the prompt's user turn.
fn transcript_in(prompt: &str, name: &str) -> String {
    let heading =
        format!("---------- Voice note: {name} (transcribed by whisper-tiny.en on this machine) ----------\n");
    let at = prompt.find(&heading).unwrap_or_else(|| panic!("no {heading:?} in the prompt: {prompt}"));
    let rest = &prompt[at + heading.len()..];
    rest.split("\n\n").next().unwrap().to_string()
}

#[test]
fn mutt_voice_notes_are_transcribed_into_the_prompt_and_the_reply_says_by_whom() {
    let model = whisper_model();
    let backend = common::RecordingBackend::answering("I will call you tomorrow morning.");
    let mut daemon = Daemon::start_with(|dir| {
        let transcribe = format!("[transcribe]\nmodel = {:?}\n", model.display().to_string());
        // Two notes at phone bit rates pass the test config's 100 kB limit once base64-encoded.
        common::config_answering(dir, "", &backend.url, 1)
            .replace("max_message_bytes = 100000", "max_message_bytes = 1000000")
            .replace("[worker]\n", &format!("{transcribe}\n[worker]\n"))
    });
    let dir = daemon.dir.path().to_path_buf();
    let m4a = voice_note(&dir, "note.m4a", &["-ac", "2", "-ar", "44100", "-c:a", "aac", "-b:a", "96k"]);
    let ogg = voice_note(&dir, "note.ogg", &["-c:a", "libopus", "-b:a", "32k"]);
    mutt_send(&daemon, "voice notes", "Two notes for you.\n", &[m4a, ogg]);
    let jobs = wait_for_jobs(&daemon, 1, Duration::from_secs(240));
    assert_eq!(jobs[0]["state"], "done", "{jobs:#?}");

    let requests = backend.prompts();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let messages: serde_json::Value = serde_json::from_str(&requests[0]).unwrap();
    let user = messages.as_array().unwrap().iter().rfind(|m| m["role"] == "user").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(user.starts_with("Two notes for you."), "{user}");
    for name in ["note.m4a", "note.ogg"] {
        let heard = transcript_in(&user, name);
        let wer = word_error_rate(SPOKEN, &heard);
        eprintln!("{name}: WER {wer:.2}: {heard:?}");
        assert!(wer <= 0.35, "{name}: WER {wer} for {heard:?}");
    }
    assert!(!user.contains("Other attachments"), "the notes are not listed as files: {user}");

    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let reply =
        inbox.iter().find(|m| m.contains("I will call you tomorrow morning.")).unwrap_or_else(|| panic!("{inbox:#?}"));
    let parsed = mail_parser::MessageParser::default().parse(reply.as_bytes()).unwrap();
    let text = parsed.body_text(0).unwrap().replace("\r\n", "\n");
    for name in ["note.m4a", "note.ogg"] {
        assert!(
            text.contains(&format!("Voice note {name} was transcribed by whisper-tiny.en on this machine")),
            "{text}"
        );
    }
}

#[test]
fn without_transcribe_the_reply_says_the_note_was_not_heard() {
    let backend = common::RecordingBackend::answering("Noted.");
    let mut daemon = Daemon::start_with(|dir| common::config_answering(dir, "", &backend.url, 1));
    let dir = daemon.dir.path().to_path_buf();
    let ogg = voice_note(&dir, "note.ogg", &["-c:a", "libopus", "-b:a", "16k"]);
    mutt_send(&daemon, "a note", "Listen to this.\n", &[ogg]);
    wait_for_jobs(&daemon, 1, Duration::from_secs(120));
    let prompt = backend.prompts().remove(0);
    assert!(
        prompt
            .contains("[voice note note.ogg: not transcribed — no [transcribe] model is configured; see docs/MAIL.md]"),
        "{prompt}"
    );
    daemon.stop();
    let inbox = daemon.mailbox("me", "INBOX");
    let reply = inbox.iter().find(|m| m.contains("Noted.")).unwrap_or_else(|| panic!("{inbox:#?}"));
    let text = mail_parser::MessageParser::default()
        .parse(reply.as_bytes())
        .unwrap()
        .body_text(0)
        .unwrap()
        .replace("\r\n", "\n");
    assert!(text.contains("Voice note note.ogg was not heard: this server has no [transcribe] model"), "{text}");
}
