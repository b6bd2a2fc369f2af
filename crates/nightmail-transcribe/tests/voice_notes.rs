//! Real voice notes: sentences spoken by espeak-ng, encoded by ffmpeg into each container a mail
//! client may send, transcribed by the Whisper model scripts/fetch-whisper.sh converts. Needs
//! espeak-ng and ffmpeg (scripts/test.sh installs them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use nightmail_transcribe::{Transcriber, is_audio, word_error_rate};

/// The pangram, then plain words a voice note holds: Whisper tiny often hears espeak-ng's "brown
/// fox jumps" as "roundfark stump", so the pangram alone would swing the rate by a third.
const SENTENCE: &str =
    "The quick brown fox jumps over the lazy dog. Please call me back tomorrow morning about the budget meeting.";

/// The bound the task sets.
const MAX_WER: f32 = 0.35;

fn model_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("scripts/fetch-whisper.sh"))
        .output()
        .expect("running scripts/fetch-whisper.sh");
    assert!(out.status.success(), "scripts/fetch-whisper.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(
        String::from_utf8(out.stdout).unwrap().lines().last().expect("fetch-whisper.sh prints the path").trim(),
    )
}

fn transcriber() -> &'static Transcriber {
    static T: OnceLock<Transcriber> = OnceLock::new();
    T.get_or_init(|| Transcriber::open(&model_dir()).expect("opening the Whisper model"))
}

fn run(cmd: &mut Command) {
    let out =
        cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e} (install espeak-ng and ffmpeg, or run scripts/test.sh)"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `sentence` spoken by espeak-ng into a WAV, then re-encoded by ffmpeg with `codec` into `file`.
fn speak(dir: &Path, sentence: &str, file: &str, codec: &[&str]) -> Vec<u8> {
    let wav = dir.join(format!("{file}.src.wav"));
    run(Command::new("espeak-ng").arg("-w").arg(&wav).arg(sentence));
    let out = dir.join(file);
    if codec.is_empty() {
        std::fs::rename(&wav, &out).unwrap();
    } else {
        run(Command::new("ffmpeg")
            .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
            .arg(&wav)
            .args(codec)
            .arg(&out));
    }
    std::fs::read(out).unwrap()
}

fn check(file: &str, content_type: &str, codec: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let audio = speak(dir.path(), SENTENCE, file, codec);
    assert!(is_audio(content_type, Some(file)));
    let transcript = transcriber().transcribe(&audio, Some(content_type), Some(file)).unwrap();
    let wer = word_error_rate(SENTENCE, &transcript.text);
    eprintln!("{file}: {:.2} s, WER {wer:.2}: {:?}", transcript.seconds, transcript.text);
    assert!((4.0..9.0).contains(&transcript.seconds), "{file}: {} s of audio", transcript.seconds);
    assert!(wer <= MAX_WER, "{file}: WER {wer} for {:?}", transcript.text);
}

#[test]
fn wav() {
    check("note.wav", "audio/wav", &[]);
}

#[test]
fn mp3() {
    check("note.mp3", "audio/mpeg", &["-c:a", "libmp3lame", "-b:a", "64k"]);
}

#[test]
fn m4a_aac() {
    // 44.1 kHz stereo, as a phone records, so downmix and resampling are both exercised.
    check("note.m4a", "audio/mp4", &["-ac", "2", "-ar", "44100", "-c:a", "aac", "-b:a", "96k"]);
}

#[test]
fn ogg_opus() {
    check("note.ogg", "audio/ogg; codecs=opus", &["-c:a", "libopus", "-b:a", "32k"]);
}

#[test]
fn webm_opus() {
    check("note.webm", "audio/webm", &["-ac", "2", "-c:a", "libopus", "-b:a", "32k"]);
}

#[test]
fn longer_than_one_window() {
    // Two sentences with 30 s of silence between them: the second lies in the second window.
    let dir = tempfile::tempdir().unwrap();
    let first = "The quick brown fox jumps over the lazy dog.";
    let second = "Please call me back tomorrow morning.";
    speak(dir.path(), first, "a.wav", &[]);
    speak(dir.path(), second, "b.wav", &[]);
    run(Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
        .arg(dir.path().join("a.wav"))
        .arg("-i")
        .arg(dir.path().join("b.wav"))
        .args(["-filter_complex", "[0]apad=pad_dur=30[a];[a][1]concat=n=2:v=0:a=1", "-c:a", "libopus"])
        .arg(dir.path().join("long.ogg")));
    let audio = std::fs::read(dir.path().join("long.ogg")).unwrap();
    let transcript = transcriber().transcribe(&audio, Some("audio/ogg"), Some("long.ogg")).unwrap();
    let reference = format!("{first} {second}");
    let wer = word_error_rate(&reference, &transcript.text);
    eprintln!("long.ogg: {:.2} s, WER {wer:.2}: {:?}", transcript.seconds, transcript.text);
    assert!(transcript.seconds > 33.0, "{} s", transcript.seconds);
    assert!(wer <= MAX_WER, "WER {wer} for {:?}", transcript.text);
}

#[test]
fn not_audio_is_a_decode_error() {
    let err = transcriber().transcribe(b"%PDF-1.4 not a voice note", Some("audio/mpeg"), Some("x.mp3")).unwrap_err();
    assert!(err.to_string().contains("could not be decoded"), "{err}");
}

#[test]
fn missing_model_says_what_to_do() {
    let err = Transcriber::open(Path::new("/nonexistent/whisper-tiny.en")).err().expect("no model there");
    assert!(err.to_string().contains("scripts/fetch-whisper.sh"), "{err}");
}
