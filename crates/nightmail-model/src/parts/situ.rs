//! SiTU, Kimi K3's GLU activation: `β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin)`, a SiLU whose gate
//! saturates at ±β and an up branch soft-clipped at ±β_lin (llama.cpp src/models/kimi-k3.cpp,
//! `kimi_k3_situ`; the reference in tests/fixtures/kimi_k3.py `situ`). Without `β_lin` the up
//! branch passes as it is, as llama.cpp does for a linear beta ≤ 0.

use candle_core::{Result, Tensor};

pub fn situ(g: &Tensor, u: &Tensor, beta: f32, linear_beta: Option<f32>) -> Result<Tensor> {
    let beta = f64::from(beta);
    let a = (((g / beta)?.tanh()? * beta)? * candle_nn::ops::sigmoid(g)?)?;
    let u = match linear_beta {
        Some(lb) if lb > 0.0 => {
            let lb = f64::from(lb);
            ((u / lb)?.tanh()? * lb)?
        }
        _ => u.clone(),
    };
    a * u
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn run(g: &[f32], u: &[f32], linear_beta: Option<f32>) -> Vec<f32> {
        let t = |v: &[f32]| Tensor::new(v, &Device::Cpu).unwrap();
        situ(&t(g), &t(u), 4.0, linear_beta).unwrap().to_vec1().unwrap()
    }

    /// By hand: g = 4, u = 25 gives 4·tanh(1)·σ(4) = 2.99158385 times 25·tanh(1) = 19.0398539,
    /// 56.9593195; g = −4, u = −25 gives two negative factors, 1.04324633; g = 0 gives 0.
    #[test]
    fn values_by_hand() {
        let y = run(&[4.0, -4.0, 0.0], &[25.0, -25.0, 7.0], Some(25.0));
        for (got, want) in y.iter().zip([56.959_32f32, 1.043_246_3, 0.0]) {
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{got} vs {want}");
        }
    }

    /// Without a linear beta the up branch is not clipped: 2.99158385 · 25 = 74.7895964.
    #[test]
    fn no_linear_beta_keeps_up() {
        let y = run(&[4.0], &[25.0], None);
        assert!((y[0] - 74.789_6).abs() < 1e-4, "{}", y[0]);
    }
}
