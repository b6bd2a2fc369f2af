//! Audio bytes to mono f32 samples. symphonia demuxes MP4/M4A, MP3, WAV, Ogg and Matroska/WebM and
//! decodes AAC, MP3 and PCM; Opus (RFC 6716, the codec of Ogg and WebM voice notes) has no
//! symphonia decoder, so its packets go to libopus through the `opus` crate.

use std::io::Cursor;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{CODEC_TYPE_NULL, CODEC_TYPE_OPUS, CodecParameters, DecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::{FormatOptions, FormatReader};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use crate::TranscribeError;

/// Opus always decodes at 48 kHz (RFC 7845 §5.1: the header's input rate is informational).
const OPUS_RATE: u32 = 48_000;

/// Decoded audio, channels already averaged into one.
pub struct Pcm {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

fn err(what: impl std::fmt::Display) -> TranscribeError {
    TranscribeError::Decode { what: what.to_string() }
}

pub fn decode(audio: &[u8], content_type: Option<&str>, file_name: Option<&str>) -> Result<Pcm, TranscribeError> {
    let mut hint = Hint::new();
    if let Some(ext) = file_name.and_then(|n| std::path::Path::new(n).extension()).and_then(|e| e.to_str()) {
        hint.with_extension(&ext.to_ascii_lowercase());
    }
    if let Some(essence) = content_type.and_then(|t| t.split(';').next()) {
        hint.mime_type(essence.trim());
    }
    let source = MediaSourceStream::new(Box::new(Cursor::new(audio.to_vec())), Default::default());
    let probed = symphonia::default::get_probe()
        .format(&hint, source, &FormatOptions::default(), &MetadataOptions::default())
        .map_err(|e| err(format!("unknown container: {e}")))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| err("no audio track"))?;
    let (track_id, params) = (track.id, track.codec_params.clone());
    let pcm = if params.codec == CODEC_TYPE_OPUS {
        decode_opus(format.as_mut(), track_id, &params)?
    } else {
        decode_symphonia(format.as_mut(), track_id, &params)?
    };
    if pcm.samples.is_empty() {
        return Err(TranscribeError::Empty);
    }
    Ok(pcm)
}

fn decode_symphonia(
    format: &mut dyn FormatReader,
    track_id: u32,
    params: &CodecParameters,
) -> Result<Pcm, TranscribeError> {
    let mut decoder = symphonia::default::get_codecs()
        .make(params, &DecoderOptions::default())
        .map_err(|e| err(format!("unsupported codec: {e}")))?;
    let mut samples = Vec::new();
    let mut sample_rate = params.sample_rate;
    let mut buffer: Option<SampleBuffer<f32>> = None;
    while let Some(packet) = next_packet(format, track_id)? {
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            // A damaged frame is skipped, as players do; the rest of the note is still speech.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(err(e)),
        };
        let spec = *decoded.spec();
        sample_rate = Some(spec.rate);
        let buf = match &mut buffer {
            Some(buf) if buf.capacity() >= decoded.capacity() * spec.channels.count() => buf,
            _ => buffer.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        buf.copy_interleaved_ref(decoded);
        downmix_into(buf.samples(), spec.channels.count(), &mut samples);
    }
    let sample_rate = sample_rate.ok_or_else(|| err("no sample rate"))?;
    Ok(Pcm { samples, sample_rate })
}

fn decode_opus(format: &mut dyn FormatReader, track_id: u32, params: &CodecParameters) -> Result<Pcm, TranscribeError> {
    // libopus downmixes a stereo stream itself when asked for one channel.
    let mut decoder = opus::Decoder::new(OPUS_RATE, opus::Channels::Mono).map_err(|e| err(format!("libopus: {e}")))?;
    // 120 ms, the longest Opus packet (RFC 6716 §3.2.1).
    let mut frame = vec![0f32; OPUS_RATE as usize * 120 / 1000];
    let mut samples = Vec::new();
    while let Some(packet) = next_packet(format, track_id)? {
        match decoder.decode_float(&packet.data, &mut frame, false) {
            Ok(n) => samples.extend_from_slice(&frame[..n]),
            Err(_) => continue,
        }
    }
    // The encoder's pre-skip (RFC 7845 §4.2) is priming, not audio.
    let skip = (params.delay.unwrap_or(0) as usize).min(samples.len());
    samples.drain(..skip);
    Ok(Pcm { samples, sample_rate: OPUS_RATE })
}

fn next_packet(
    format: &mut dyn FormatReader,
    track_id: u32,
) -> Result<Option<symphonia::core::formats::Packet>, TranscribeError> {
    loop {
        match format.next_packet() {
            Ok(packet) if packet.track_id() == track_id => return Ok(Some(packet)),
            Ok(_) => continue,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(SymphoniaError::ResetRequired) => return Ok(None),
            Err(e) => return Err(err(e)),
        }
    }
}

fn downmix_into(interleaved: &[f32], channels: usize, out: &mut Vec<f32>) {
    let channels = channels.max(1);
    out.extend(interleaved.chunks_exact(channels).map(|frame| frame.iter().sum::<f32>() / channels as f32));
}
