//! Greedy Whisper decoding (Radford et al. 2022, §2.3 and appendix; openai/whisper decoding.py):
//! the audio in 30-second windows, each decoded from the start-of-transcript prompt with
//! timestamps off, the most likely token at each step, until end-of-text.

use std::path::{Path, PathBuf};

use candle_core::{Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::whisper::{self as w, audio, model::Whisper};
use tokenizers::Tokenizer;

use crate::{TranscribeError, Transcript, decode, mel, resample};

/// A Whisper model loaded from a Hugging Face layout directory, ready to transcribe.
pub struct Transcriber {
    model: Whisper,
    tokenizer: Tokenizer,
    filters: Vec<f32>,
    tokens: SpecialTokens,
    /// Tokens never sampled (the config's suppress_tokens), and those not sampled first.
    suppress: Vec<u32>,
    suppress_first: Vec<u32>,
    language: Option<String>,
    name: String,
}

struct SpecialTokens {
    eot: u32,
    sot: u32,
    transcribe: u32,
    translate: u32,
    no_timestamps: u32,
    /// <|nospeech|> (<|nocaptions|> in the first vocabularies), where the tokenizer has one.
    no_speech: Option<u32>,
}

/// The parts of a transformers WhisperConfig that candle's `Config` leaves out.
#[derive(serde::Deserialize)]
struct ExtraConfig {
    #[serde(default)]
    begin_suppress_tokens: Option<Vec<u32>>,
}

impl Transcriber {
    /// `path` is the model directory (config.json, model.safetensors, tokenizer.json) or a file in it.
    pub fn open(path: &Path) -> Result<Transcriber, TranscribeError> {
        Self::open_with_language(path, None)
    }

    /// As `open`, with the spoken language fixed (a Whisper code such as "en"); `None` detects it.
    pub fn open_with_language(path: &Path, language: Option<&str>) -> Result<Transcriber, TranscribeError> {
        if !path.exists() {
            return Err(TranscribeError::ModelMissing { path: path.to_path_buf() });
        }
        let dir = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new(".")) };
        let invalid = |what: String| TranscribeError::ModelInvalid { path: dir.to_path_buf(), what };
        let config_text =
            std::fs::read_to_string(dir.join("config.json")).map_err(|e| invalid(format!("config.json: {e}")))?;
        let config: w::Config = serde_json::from_str(&config_text).map_err(|e| invalid(format!("config.json: {e}")))?;
        let extra: ExtraConfig =
            serde_json::from_str(&config_text).map_err(|e| invalid(format!("config.json: {e}")))?;
        let tokenizer =
            Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| invalid(format!("tokenizer.json: {e}")))?;
        let id =
            |token: &str| tokenizer.token_to_id(token).ok_or_else(|| invalid(format!("tokenizer.json has no {token}")));
        let tokens = SpecialTokens {
            eot: id(w::EOT_TOKEN)?,
            sot: id(w::SOT_TOKEN)?,
            transcribe: id(w::TRANSCRIBE_TOKEN)?,
            translate: id(w::TRANSLATE_TOKEN)?,
            no_timestamps: id(w::NO_TIMESTAMPS_TOKEN)?,
            no_speech: w::NO_SPEECH_TOKENS.iter().find_map(|t| tokenizer.token_to_id(t)),
        };
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(invalid("no model.safetensors".into()));
        }
        // SAFETY: the weights are mapped read-only; the model directory is not written while the
        // daemon runs (scripts/fetch-whisper.sh renames a finished directory into place).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[weights], w::DTYPE, &Device::Cpu)? };
        let filters = mel::for_candle(mel::filter_bank(w::SAMPLE_RATE, w::N_FFT, config.num_mel_bins), w::N_FFT);
        let suppress = config.suppress_tokens.clone();
        let suppress_first = extra.begin_suppress_tokens.unwrap_or_else(|| vec![220, tokens.eot]);
        let model = Whisper::load(&vb, config)?;
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "whisper".into());
        let transcriber =
            Transcriber { model, tokenizer, filters, tokens, suppress, suppress_first, language: None, name };
        if let Some(language) = language.filter(|_| transcriber.multilingual()) {
            transcriber.language_token(language)?;
        }
        Ok(Transcriber { language: language.map(str::to_owned), ..transcriber })
    }

    /// The model directory's name, e.g. "whisper-tiny.en".
    pub fn model_name(&self) -> &str {
        &self.name
    }

    /// openai/whisper tokenizer.py: English-only models have a 51864-token vocabulary, the
    /// multilingual ones 51865 or more, and only these take language and task tokens.
    fn multilingual(&self) -> bool {
        self.model.config.vocab_size >= 51_865
    }

    fn language_token(&self, language: &str) -> Result<u32, TranscribeError> {
        self.tokenizer
            .token_to_id(&format!("<|{language}|>"))
            .filter(|&id| id > self.tokens.sot && id < self.tokens.translate)
            .ok_or_else(|| TranscribeError::UnknownLanguage { language: language.into() })
    }

    pub fn transcribe(
        &self,
        audio_bytes: &[u8],
        content_type: Option<&str>,
        file_name: Option<&str>,
    ) -> Result<Transcript, TranscribeError> {
        let pcm = decode::decode(audio_bytes, content_type, file_name)?;
        let seconds = pcm.samples.len() as f32 / pcm.sample_rate as f32;
        let samples = resample::resample(&pcm.samples, pcm.sample_rate, w::SAMPLE_RATE as u32);
        let text = self.transcribe_pcm(&samples)?;
        Ok(Transcript { text, seconds })
    }

    /// 16 kHz mono samples to text, one 30-second window at a time.
    fn transcribe_pcm(&self, samples: &[f32]) -> Result<String, TranscribeError> {
        let n_mels = self.model.config.num_mel_bins;
        // openai/whisper audio.py takes the STFT with torch.stft(center=True): frame i is centred
        // on sample i * 160, the signal reflected at the start. candle's frames start at i * 160,
        // so the same reflection of N_FFT / 2 samples goes in front.
        let half = (w::N_FFT / 2).min(samples.len().saturating_sub(1));
        let centred: Vec<f32> = samples[1..=half].iter().rev().chain(samples).copied().collect();
        let mel = audio::pcm_to_mel(&self.model.config, &centred, &self.filters);
        let frames = mel.len() / n_mels;
        let mel = Tensor::from_vec(mel, (1, n_mels, frames), &Device::Cpu)?;
        let content_frames = samples.len() / w::HOP_LENGTH;
        // Each call decodes with its own key/value caches; the weights are shared.
        let mut model = self.model.clone();
        let mut words = Vec::new();
        let mut seek = 0;
        while seek < content_frames {
            // Whisper was trained on whole 30-second windows; pcm_to_mel pads with silence.
            let window = w::N_FRAMES.min(frames - seek);
            let features = model.encoder.forward(&mel.narrow(2, seek, window)?, true)?;
            let text = self.decode_window(&mut model, &features)?;
            if !text.is_empty() {
                words.push(text);
            }
            seek += w::N_FRAMES;
        }
        Ok(words.join(" "))
    }

    fn decode_window(&self, model: &mut Whisper, features: &Tensor) -> Result<String, TranscribeError> {
        let mut prompt = vec![self.tokens.sot];
        if self.multilingual() {
            let language = match &self.language {
                Some(language) => self.language_token(language)?,
                None => self.detect_language(model, features)?,
            };
            prompt.extend([language, self.tokens.transcribe]);
        }
        prompt.push(self.tokens.no_timestamps);
        let mut tokens = prompt.clone();
        let (mut sum_logprob, mut no_speech_prob) = (0.0f64, 0.0f64);
        // openai/whisper decoding.py: sample_len defaults to half the text context.
        let max_new = self.model.config.max_target_positions / 2;
        for step in 0..max_new {
            // The first step reads every prompt position: the one at <|startoftranscript|> gives
            // the probability that the window holds no speech.
            let from = if step == 0 { 0 } else { tokens.len() - 1 };
            let rows = self.logits(model, features, &tokens, step == 0, from)?;
            if step == 0
                && let Some(no_speech) = self.tokens.no_speech
            {
                no_speech_prob = log_softmax_at(&rows[0], no_speech as usize).exp();
            }
            let mut logits = rows.into_iter().next_back().unwrap_or_default();
            // Text tokens lie below <|endoftext|> in every Whisper vocabulary; the rest are
            // special tokens and timestamps, which a plain transcript never holds.
            for (id, logit) in logits.iter_mut().enumerate() {
                if id as u32 > self.tokens.eot {
                    *logit = f32::NEG_INFINITY;
                }
            }
            let suppressed = self.suppress.iter().chain(if step == 0 { &self.suppress_first[..] } else { &[] });
            for &id in suppressed {
                if let Some(logit) = logits.get_mut(id as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
            let next = argmax(&logits);
            sum_logprob += log_softmax_at(&logits, next as usize);
            if next == self.tokens.eot {
                break;
            }
            tokens.push(next);
        }
        // openai/whisper transcribe.py: a window the model deems silent (no-speech probability
        // over 0.6) whose words it is also unsure of (mean log-probability under -1) is skipped;
        // otherwise silence comes out as a stray "you".
        let avg_logprob = sum_logprob / (tokens.len() - prompt.len() + 1) as f64;
        if no_speech_prob > w::NO_SPEECH_THRESHOLD && avg_logprob < w::LOGPROB_THRESHOLD {
            return Ok(String::new());
        }
        let text = self.tokenizer.decode(&tokens[prompt.len()..], true).map_err(|e| TranscribeError::ModelInvalid {
            path: PathBuf::from(&self.name),
            what: format!("tokenizer: {e}"),
        })?;
        Ok(text.trim().to_owned())
    }

    /// openai/whisper decoding.py `detect_language`: one decoder step from <|startoftranscript|>,
    /// the most likely of the language tokens.
    fn detect_language(&self, model: &mut Whisper, features: &Tensor) -> Result<u32, TranscribeError> {
        let rows = self.logits(model, features, &[self.tokens.sot], true, 0)?;
        let languages = (self.tokens.sot + 1) as usize..self.tokens.translate as usize;
        Ok(languages.start as u32 + argmax(&rows[0][languages]))
    }

    /// The next-token logits at positions `from..` of `tokens`.
    fn logits(
        &self,
        model: &mut Whisper,
        features: &Tensor,
        tokens: &[u32],
        first: bool,
        from: usize,
    ) -> Result<Vec<Vec<f32>>, TranscribeError> {
        let input = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
        let hidden = model.decoder.forward(&input, features, first)?;
        let hidden = hidden.i((.., from..))?;
        let logits = model.decoder.final_linear(&hidden)?.squeeze(0)?;
        Ok(logits.to_dtype(candle_core::DType::F32)?.to_vec2()?)
    }
}

/// log(softmax(logits)[index]), by the log-sum-exp of the finite logits.
fn log_softmax_at(logits: &[f32], index: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[index] as f64 - max - sum.ln()
}

fn argmax(values: &[f32]) -> u32 {
    values.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32)
}
