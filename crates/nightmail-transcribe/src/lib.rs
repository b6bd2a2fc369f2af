//! Speech to text on this machine. An audio file (m4a/AAC, mp3, Ogg/Opus, WAV, WebM) is decoded,
//! downmixed to mono, resampled to 16 kHz, turned into Whisper's log-mel spectrogram and
//! transcribed by a Whisper model (Radford et al. 2022, "Robust Speech Recognition via Large-Scale
//! Weak Supervision") run with candle. Knows no mail: the worker hands it bytes and a content type.

mod decode;
mod mel;
mod resample;
mod wer;
mod whisper;

use std::path::{Path, PathBuf};

pub use wer::{normalized_words, word_error_rate};
pub use whisper::Transcriber;

/// What a voice note said.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    /// The words, windows joined by a space, trimmed.
    pub text: String,
    /// Length of the decoded audio.
    pub seconds: f32,
}

#[derive(Debug, thiserror::Error)]
pub enum TranscribeError {
    #[error(
        "no Whisper model at {path}: run scripts/fetch-whisper.sh, then point [transcribe] model at models/whisper-tiny.en"
    )]
    ModelMissing { path: PathBuf },
    #[error(
        "{path}: {what}: a Whisper model is a directory with config.json, model.safetensors and tokenizer.json (scripts/fetch-whisper.sh makes one)"
    )]
    ModelInvalid { path: PathBuf, what: String },
    #[error("the audio could not be decoded ({what}): send it as m4a/AAC, mp3, Ogg/Opus, WAV or WebM")]
    Decode { what: String },
    #[error("the audio holds no samples: nothing to transcribe")]
    Empty,
    #[error(
        "Whisper failed while transcribing ({0}): the model files may be damaged; run scripts/fetch-whisper.sh again"
    )]
    Inference(#[from] candle_core::Error),
    #[error(
        "language {language:?} is not one this Whisper model knows: set [transcribe] language to a code such as \"en\", or leave it out to detect"
    )]
    UnknownLanguage { language: String },
}

/// Audio by MIME type (RFC 2046 `audio/*`; also `video/webm` and `video/mp4`, which phones use for
/// voice memos) or, for the `application/octet-stream` many clients send, by file extension.
pub fn is_audio(content_type: &str, file_name: Option<&str>) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence.starts_with("audio/") || essence == "video/webm" || essence == "video/ogg" {
        return true;
    }
    let extension = file_name
        .and_then(|name| Path::new(name).extension())
        .and_then(|ext| ext.to_str())
        .map(str::to_ascii_lowercase);
    matches!(extension.as_deref(), Some("m4a" | "aac" | "mp3" | "ogg" | "oga" | "opus" | "wav" | "webm" | "weba"))
        && (essence.is_empty()
            || essence == "application/octet-stream"
            || essence == "video/mp4"
            || essence == "application/ogg")
}

#[cfg(test)]
mod tests {
    use super::is_audio;

    #[test]
    fn audio_by_type_or_extension() {
        assert!(is_audio("audio/mp4", Some("note.m4a")));
        assert!(is_audio("audio/ogg; codecs=opus", None));
        assert!(is_audio("video/webm", Some("voice.webm")));
        assert!(is_audio("application/octet-stream", Some("Note.M4A")));
        assert!(is_audio("application/ogg", Some("x.opus")));
        assert!(!is_audio("application/octet-stream", Some("report.pdf")));
        assert!(!is_audio("text/plain", Some("notes.mp3.txt")));
        assert!(!is_audio("image/png", Some("a.png")));
    }
}
