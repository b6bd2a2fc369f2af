//! `[transcribe]`: the Whisper model that turns voice notes into text. Absent: audio attachments
//! are not transcribed, and replies say so.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{ConfigError, Locator};

#[derive(Clone, Debug, PartialEq)]
pub struct TranscribeConfig {
    /// A Whisper model directory (config.json, model.safetensors, tokenizer.json) or a file in
    /// it; relative to the daemon's working directory, as a `[[model]]` path is.
    pub model: PathBuf,
    /// The spoken language as a Whisper code ("en", "de"); `None`: detected per note.
    pub language: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTranscribe {
    model: Spanned<PathBuf>,
    language: Option<Spanned<String>>,
}

pub(crate) fn check(raw: &RawTranscribe, loc: &Locator<'_>) -> Result<TranscribeConfig, ConfigError> {
    let model = raw.model.get_ref();
    if !model.exists() {
        return Err(loc.spanned(
            &raw.model,
            format!(
                "transcribe.model {} does not exist: run scripts/fetch-whisper.sh and set model = \"models/whisper-tiny.en\", or remove [transcribe]",
                model.display()
            ),
        ));
    }
    let language = match &raw.language {
        Some(language) => {
            let code = language.get_ref().trim().to_ascii_lowercase();
            if code.is_empty() || code.len() > 3 || !code.chars().all(|c| c.is_ascii_lowercase()) {
                return Err(loc.spanned(
                    language,
                    format!("transcribe.language `{}` must be a Whisper language code such as \"en\", or left out to detect it", language.get_ref()),
                ));
            }
            Some(code)
        }
        None => None,
    };
    Ok(TranscribeConfig { model: model.clone(), language })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    #[test]
    fn absent_means_no_transcription() {
        assert_eq!(Config::parse("", None).unwrap().transcribe, None);
    }

    #[test]
    fn reads_model_and_language() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("[transcribe]\nmodel = {:?}\nlanguage = \"EN\"\n", dir.path().display().to_string());
        let t = Config::parse(&text, Some(Path::new("nm.toml"))).unwrap().transcribe.unwrap();
        assert_eq!(t.model, dir.path());
        assert_eq!(t.language.as_deref(), Some("en"));
    }

    #[test]
    fn missing_model_says_what_to_do() {
        let err = Config::parse("[transcribe]\nmodel = \"models/nope\"\n", Some(Path::new("nm.toml")))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("nm.toml:2:"), "{err}");
        assert!(err.contains("scripts/fetch-whisper.sh"), "{err}");
    }

    #[test]
    fn bad_language_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("[transcribe]\nmodel = {:?}\nlanguage = \"English\"\n", dir.path().display().to_string());
        let err = Config::parse(&text, None).unwrap_err().to_string();
        assert!(err.contains("Whisper language code"), "{err}");
    }
}
