//! Whisper's log-mel input. candle's `pcm_to_mel` does the STFT and log compression (openai/whisper
//! audio.py `log_mel_spectrogram`); it needs the mel filter bank, which whisper ships as
//! mel_filters.npz made by `librosa.filters.mel(sr=16000, n_fft=400, n_mels=N)`. We compute the
//! same bank here: Slaney's mel scale (Auditory Toolbox; librosa's default, htk=False) with
//! triangles normalised to unit area ("slaney" norm), so no weights file ships with the crate.

/// Slaney's scale: linear at 200/3 Hz per mel below 1 kHz, logarithmic above (librosa hz_to_mel).
fn hz_to_mel(hz: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let log_step = 6.4f64.ln() / 27.0;
    if hz >= MIN_LOG_HZ { min_log_mel + (hz / MIN_LOG_HZ).ln() / log_step } else { hz / F_SP }
}

fn mel_to_hz(mel: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let log_step = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel { MIN_LOG_HZ * (log_step * (mel - min_log_mel)).exp() } else { mel * F_SP }
}

/// `n_mels` rows of `n_fft / 2 + 1` weights, row-major, as `pcm_to_mel` reads them.
pub fn filter_bank(sample_rate: usize, n_fft: usize, n_mels: usize) -> Vec<f32> {
    let bins = n_fft / 2 + 1;
    let nyquist = sample_rate as f64 / 2.0;
    let fft_hz: Vec<f64> = (0..bins).map(|k| k as f64 * nyquist / (bins - 1) as f64).collect();
    // n_mels + 2 edges evenly spaced in mel from 0 Hz to Nyquist: filter i spans edges i..i+2.
    let top = hz_to_mel(nyquist);
    let edges: Vec<f64> = (0..n_mels + 2).map(|i| mel_to_hz(top * i as f64 / (n_mels + 1) as f64)).collect();
    let mut bank = vec![0f32; n_mels * bins];
    for m in 0..n_mels {
        let (lo, center, hi) = (edges[m], edges[m + 1], edges[m + 2]);
        // Unit area in Hz: a triangle of base (hi - lo) and height 2 / (hi - lo).
        let norm = 2.0 / (hi - lo);
        for (k, &f) in fft_hz.iter().enumerate() {
            let rising = (f - lo) / (center - lo);
            let falling = (hi - f) / (hi - center);
            bank[m * bins + k] = (rising.min(falling).max(0.0) * norm) as f32;
        }
    }
    bank
}

/// candle's `pcm_to_mel` adds each negative-frequency bin's power onto its positive twin (bins 1
/// to N/2 - 1), doubling them; whisper's `log_mel_spectrogram` takes the one-sided |STFT|^2. Halving
/// those weights gives whisper's input, which the model was trained on.
pub fn for_candle(mut bank: Vec<f32>, n_fft: usize) -> Vec<f32> {
    let bins = n_fft / 2 + 1;
    for row in bank.chunks_mut(bins) {
        for weight in &mut row[1..bins - 1] {
            *weight *= 0.5;
        }
    }
    bank
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_matches_librosa_points() {
        // librosa.hz_to_mel(1000) == 15 and hz_to_mel(8000) == 45.245640471924965 (htk=False).
        assert!((hz_to_mel(1000.0) - 15.0).abs() < 1e-12);
        assert!((hz_to_mel(8000.0) - 45.245_640_471_924_965).abs() < 1e-9);
        for hz in [0.0, 300.0, 999.0, 1000.0, 4321.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-9);
        }
    }

    #[test]
    fn whisper_bank_matches_librosa() {
        let bank = filter_bank(16_000, 400, 80);
        assert_eq!(bank.len(), 80 * 201);
        assert!(bank.iter().all(|&w| w >= 0.0));
        // (filter, peak bin, peak weight) from numpy following librosa.filters.mel(sr=16000,
        // n_fft=400, n_mels=80)'s formulas, float32 as whisper's mel_filters.npz stores them.
        for (m, bin, weight) in [
            (0, 1, 0.024_862_595),
            (10, 10, 0.019_908_22),
            (33, 33, 0.018_177_474),
            (60, 93, 0.006_591_093),
            (79, 192, 0.003_164_711_6),
        ] {
            let row = &bank[m * 201..(m + 1) * 201];
            let peak = (0..201).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            assert_eq!(peak, bin, "filter {m}");
            assert!((row[bin] - weight).abs() < 1e-7, "filter {m}: {} vs {weight}", row[bin]);
        }
        // Slaney normalisation gives each triangle unit area in Hz; bins are 40 Hz apart, so the
        // wide upper filters sum to about 1/40.
        let area: f32 = bank[79 * 201..].iter().sum::<f32>() * 40.0;
        assert!((area - 0.997).abs() < 1e-3, "area {area}");
    }
}
