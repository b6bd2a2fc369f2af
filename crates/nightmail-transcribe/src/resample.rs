//! Sample-rate conversion to Whisper's 16 kHz by band-limited (windowed-sinc) interpolation:
//! J. O. Smith, "Digital Audio Resampling" (ccrma.stanford.edu/~jos/resample). Each output
//! sample sums the input under a sinc whose cutoff is the lower Nyquist frequency, so downsampling
//! from 44.1 or 48 kHz does not fold the upper band into speech.

use std::f64::consts::PI;

/// Zero crossings of the sinc kept on each side; 16 leaves the stop band about 60 dB down with the
/// Blackman window, ample for speech recognition.
const ZERO_CROSSINGS: f64 = 16.0;

pub fn resample(input: &[f32], from_hz: u32, to_hz: u32) -> Vec<f32> {
    if from_hz == to_hz || input.is_empty() {
        return input.to_vec();
    }
    let ratio = f64::from(to_hz) / f64::from(from_hz);
    // Lowpass at the lower of the two Nyquist frequencies, in input-sample units.
    let cutoff = ratio.min(1.0);
    let half_width = ZERO_CROSSINGS / cutoff;
    let out_len = (input.len() as f64 * ratio).floor() as usize;
    let mut out = Vec::with_capacity(out_len);
    for n in 0..out_len {
        let center = n as f64 / ratio;
        let first = (center - half_width).ceil().max(0.0) as usize;
        let last = ((center + half_width).floor() as usize).min(input.len() - 1);
        let mut acc = 0.0f64;
        for (k, &x) in input.iter().enumerate().take(last + 1).skip(first) {
            let t = k as f64 - center;
            acc += f64::from(x) * cutoff * sinc(cutoff * t) * blackman(t / half_width);
        }
        out.push(acc as f32);
    }
    out
}

fn sinc(x: f64) -> f64 {
    if x.abs() < 1e-12 { 1.0 } else { (PI * x).sin() / (PI * x) }
}

/// Blackman window over t in [-1, 1].
fn blackman(t: f64) -> f64 {
    if t.abs() > 1.0 {
        return 0.0;
    }
    let phase = PI * (t + 1.0);
    0.42 - 0.5 * phase.cos() + 0.08 * (2.0 * phase).cos()
}

#[cfg(test)]
mod tests {
    use super::resample;

    fn tone(hz: f64, rate: u32, seconds: f64) -> Vec<f32> {
        let n = (f64::from(rate) * seconds) as usize;
        (0..n).map(|i| (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin() as f32).collect()
    }

    fn rms(x: &[f32]) -> f64 {
        (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
    }

    #[test]
    fn keeps_speech_band_and_removes_what_16k_cannot_hold() {
        let kept = resample(&tone(440.0, 48_000, 1.0), 48_000, 16_000);
        assert_eq!(kept.len(), 16_000);
        // A sine's RMS is 1/sqrt(2); the middle avoids the edges where the kernel is cut.
        let middle = &kept[1000..15_000];
        assert!((rms(middle) - std::f64::consts::FRAC_1_SQRT_2).abs() < 0.01, "rms {}", rms(middle));
        let expected = tone(440.0, 16_000, 1.0);
        let err = middle.iter().zip(&expected[1000..15_000]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 0.01, "max error {err}");
        // 12 kHz is above 16 kHz's Nyquist frequency: it must be filtered out, not aliased to 4 kHz.
        let removed = resample(&tone(12_000.0, 48_000, 1.0), 48_000, 16_000);
        assert!(rms(&removed[1000..15_000]) < 0.01, "rms {}", rms(&removed[1000..15_000]));
    }

    #[test]
    fn upsamples_8k() {
        let up = resample(&tone(300.0, 8_000, 1.0), 8_000, 16_000);
        assert_eq!(up.len(), 16_000);
        let expected = tone(300.0, 16_000, 1.0);
        let err =
            up[1000..15_000].iter().zip(&expected[1000..15_000]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 0.01, "max error {err}");
    }
}
