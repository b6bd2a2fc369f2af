//! `model kernel-bench`: the MXFP4 mat-vec's throughput in GB/s of weights read, against this
//! machine's memory bandwidth (a parallel read sweep, measured in the same run before and after)
//! and against candle's Q4_0 mat-vec (`candle_core::quantized`, ggml's `vec_dot_q4_0_q8_0`) on
//! the same shape; Q4_0's 8-row tile kernels (x86) against each other; and each weight type's
//! kernel, as a model's `Linear` picks it, against Q4_0's.
//! Each kernel cycles through a set of matrices several times the size of the
//! last-level cache, so every pass reads its weights from DRAM, as a streamed expert's are.

use nightmail_formats::FormatError;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;
use serde::Serialize;

use nightmail_engine::Result;
use nightmail_tensor::kernel::mxfp4::{self, Kernel, Mxfp4Matrix};
use nightmail_tensor::{Linear, LowBit, TensorView, WeightBytes, WeightDType};

#[derive(Debug, Clone)]
pub struct KernelBenchOptions {
    pub rows: usize,
    pub cols: usize,
    /// Token rows per call: 1 is a mat-vec, more a small-batch mat-mul.
    pub tokens: usize,
    /// Bytes of weights each kernel cycles through (and of the memory sweep's buffer).
    pub working_set_bytes: usize,
    /// Timed passes over the working set, after one warm-up pass; the median counts.
    pub passes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct KernelFigure {
    pub kernel: String,
    /// Weight bytes read per second (10^9).
    pub gbps: f64,
    /// Weights multiplied per second (10^9), whatever their encoding.
    pub gweights_per_s: f64,
    pub us_per_call: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct KernelBenchReport {
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub matrices: usize,
    pub working_set_bytes: usize,
    /// Threads of rayon's pool (the sweep and nightmail's kernels) and of candle's.
    pub threads: usize,
    pub candle_threads: usize,
    /// The parallel read sweep before and after the kernels, and their mean.
    pub memory_gbps_before: f64,
    pub memory_gbps_after: f64,
    pub memory_gbps: f64,
    /// MXFP4 with the kernel this CPU runs (detected), then the other kernels it can run.
    pub mxfp4: Vec<KernelFigure>,
    pub candle_q4_0: KernelFigure,
    /// x86, rows a multiple of 8: Q4_0 in llama.cpp's 8-row tile order (`Linear`'s Q4_0 here)
    /// with each SIMD kernel this CPU runs, the detected one first, on candle's matrices' bytes.
    pub q4_0_tiles: Vec<KernelFigure>,
    /// The detected MXFP4 kernel's GB/s over the memory bandwidth.
    pub mxfp4_to_memory: f64,
    /// The detected MXFP4 kernel's GB/s over candle's Q4_0.
    pub mxfp4_to_candle_q4_0_gbps: f64,
    /// Weights per second, MXFP4 over candle's Q4_0 (Q4_0 reads 18 bytes per 32 weights, MXFP4 17).
    pub mxfp4_to_candle_q4_0_speed: f64,
    /// Each weight type through `Linear` (the kernel a model's matrix gets on this CPU), Q4_0's
    /// first; empty unless cols is a multiple of 256, the i-quants' super-block.
    pub by_type: Vec<KernelFigure>,
    /// Each of `by_type`'s GB/s over Q4_0's, in the same order.
    pub by_type_to_q4_0_gbps: Vec<f64>,
}

/// The weight types whose kernels `by_type` times, Q4_0 first, then the K-quants (our own
/// kernels, `q2_k.rs` and `k_quant.rs`), the i-quants with kernels and the float types (F32: candle's
/// f32 product, which BF16 weights took before their own kernel).
fn timed_types() -> Vec<WeightDType> {
    let mut types = vec![WeightDType::Ggml(GgmlDType::Q4_0)];
    types.extend(
        [GgmlDType::Q2K, GgmlDType::Q3K, GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K].map(WeightDType::Ggml),
    );
    types.extend(
        LowBit::ALL
            .iter()
            .filter(|r| nightmail_tensor::kernel::lowbit::has_kernel(r.0, 256))
            .map(|r| WeightDType::LowBit(r.0)),
    );
    types.extend([WeightDType::F16, WeightDType::BF16, WeightDType::F32]);
    types
}

/// `dtype` through [`Linear`] on `matrices` random matrices (f16 scales set to 2^-7 where a
/// block starts with one; IQ1_M's spread scale stays random, any value costs the same).
fn linear_figure(
    dtype: WeightDType,
    rows: usize,
    cols: usize,
    matrices: usize,
    x: &Tensor,
    passes: usize,
) -> Result<KernelFigure> {
    let bytes = dtype.byte_len(rows * cols);
    let scale = f16::from_f32(1.0 / 128.0).to_le_bytes();
    let set: Vec<Linear> = (0..matrices)
        .map(|m| {
            let mut b = vec![0u8; bytes];
            match dtype {
                // Float weights of one normal value: random bits would hold subnormals, which
                // slow x86's float units.
                WeightDType::F32 => {
                    b.chunks_exact_mut(4).for_each(|w| w.copy_from_slice(&(1f32 / 128.0).to_le_bytes()))
                }
                WeightDType::BF16 => b
                    .chunks_exact_mut(2)
                    .for_each(|w| w.copy_from_slice(&half::bf16::from_f32(1.0 / 128.0).to_le_bytes())),
                _ => {
                    fill_random(&mut b, 300 + m as u64);
                    b.chunks_exact_mut(dtype.type_size()).for_each(|blk| blk[..2].copy_from_slice(&scale));
                }
            }
            let view = TensorView { name: "bench".into(), dtype, shape: vec![rows, cols], bytes: &b, scale: None };
            Ok(Linear::new(&view, None)?)
        })
        .collect::<Result<_>>()?;
    let s = time_passes(passes, || {
        for m in &set {
            std::hint::black_box(m.forward(x)?);
        }
        Ok(())
    })?;
    Ok(figure(format!("{dtype:?}"), s, bytes * matrices, rows * cols * matrices, matrices))
}

/// Fill `buf` with pseudo-random bytes (splitmix64 per 8 bytes), in parallel.
fn fill_random(buf: &mut [u8], seed: u64) {
    buf.par_chunks_mut(1 << 20).enumerate().for_each(|(c, chunk)| {
        let mut s = seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for word in chunk.chunks_mut(8) {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let z = (z ^ (z >> 31)).to_le_bytes();
            word.copy_from_slice(&z[..word.len()]);
        }
    });
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median seconds of `passes` timed runs of `pass`, after one untimed.
fn time_passes(passes: usize, mut pass: impl FnMut() -> Result<()>) -> Result<f64> {
    pass()?;
    let mut times = Vec::with_capacity(passes);
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        pass()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// The memory's read bandwidth: every thread XORs its share of a buffer of `bytes`.
fn memory_read_gbps(bytes: usize, passes: usize) -> Result<f64> {
    let mut buf = vec![0u64; bytes / 8];
    // SAFETY: a u64 slice viewed as bytes.
    fill_random(unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) }, 1);
    let per_thread = buf.len().div_ceil(rayon::current_num_threads());
    let mut sink = 0u64;
    let s = time_passes(passes, || {
        sink ^= buf.par_chunks(per_thread).map(|c| c.iter().fold(0u64, |a, b| a ^ b)).reduce(|| 0, |a, b| a ^ b);
        Ok(())
    })?;
    std::hint::black_box(sink);
    Ok((buf.len() * 8) as f64 / s / 1e9)
}

fn figure(kernel: String, seconds: f64, bytes: usize, weights: usize, calls: usize) -> KernelFigure {
    KernelFigure {
        kernel,
        gbps: bytes as f64 / seconds / 1e9,
        gweights_per_s: weights as f64 / seconds / 1e9,
        us_per_call: seconds / calls as f64 * 1e6,
    }
}

pub fn kernel_bench(opts: &KernelBenchOptions) -> Result<KernelBenchReport> {
    let (rows, cols) = (opts.rows, opts.cols);
    if rows == 0 || cols == 0 || !cols.is_multiple_of(32) || opts.tokens == 0 {
        return Err(FormatError::Unsupported {
            what: format!("a {rows}x{cols} matrix with {} tokens", opts.tokens),
            hint: "give rows ≥ 1, cols a multiple of 32 and tokens ≥ 1".into(),
        }
        .into());
    }
    let weights = rows * cols;
    let mx_bytes = weights / 32 * mxfp4::BLOCK_BYTES;
    let q4_bytes = weights / 32 * 18;
    let matrices = opts.working_set_bytes.div_ceil(mx_bytes).max(2);
    let x = Tensor::randn(0f32, 1.0, (opts.tokens, cols), &Device::Cpu)?;
    let passes = opts.passes;

    let memory_gbps_before = memory_read_gbps(opts.working_set_bytes, passes)?;

    // MXFP4: random nibbles, scales near 2^-7 (any scale costs the kernel the same).
    let mut mxfp4 = Vec::new();
    {
        let set: Vec<Mxfp4Matrix> = (0..matrices)
            .map(|m| {
                let mut b = vec![0u8; mx_bytes];
                fill_random(&mut b, 100 + m as u64);
                b.iter_mut().step_by(mxfp4::BLOCK_BYTES).for_each(|e| *e = 120 + (*e & 3));
                Mxfp4Matrix::new(WeightBytes::Owned(Arc::new(b)), rows, cols)
            })
            .collect();
        let best = Kernel::detect();
        let others = [Kernel::Avx512, Kernel::Avx2, Kernel::Scalar].into_iter().filter(|k| *k != best && k.runs_here());
        for kernel in std::iter::once(best).chain(others) {
            let s = time_passes(passes, || {
                for m in &set {
                    std::hint::black_box(m.forward_with(&x, kernel)?);
                }
                Ok(())
            })?;
            mxfp4.push(figure(format!("{kernel:?}"), s, mx_bytes * matrices, weights * matrices, matrices));
        }
    }

    // candle's Q4_0 on the same shape: random nibbles, f16 scales of 2^-7.
    let candle_q4_0 = {
        let scale = f16::from_f32(1.0 / 128.0).to_le_bytes();
        let set: Vec<QMatMul> = (0..matrices)
            .map(|m| {
                let mut b = vec![0u8; q4_bytes];
                fill_random(&mut b, 200 + m as u64);
                b.chunks_exact_mut(18).for_each(|blk| blk[..2].copy_from_slice(&scale));
                let storage = QStorage::from_data(Cow::Owned(b), &Device::Cpu, GgmlDType::Q4_0)?;
                Ok(QMatMul::QTensor(Arc::new(QTensor::new(storage, (rows, cols))?)))
            })
            .collect::<Result<_>>()?;
        let s = time_passes(passes, || {
            for m in &set {
                std::hint::black_box(m.forward(&x)?);
            }
            Ok(())
        })?;
        figure("candle Q4_0".into(), s, q4_bytes * matrices, weights * matrices, matrices)
    };

    #[cfg(not(target_arch = "aarch64"))]
    let q4_0_tiles = {
        use nightmail_tensor::kernel::nibble_x8::{TileKernel, q4_0_matmul_with};
        let set: Vec<Vec<u8>> = (0..matrices)
            .map(|m| {
                let mut b = vec![0u8; q4_bytes];
                fill_random(&mut b, 200 + m as u64);
                b.chunks_exact_mut(18)
                    .for_each(|blk| blk[..2].copy_from_slice(&f16::from_f32(1.0 / 128.0).to_le_bytes()));
                b
            })
            .collect();
        let mut kernels: Vec<TileKernel> = TileKernel::available().into_iter().rev().collect();
        kernels.retain(|k| *k != TileKernel::Scalar);
        let mut figures = Vec::new();
        for kernel in kernels.into_iter().filter(|_| rows.is_multiple_of(8)) {
            let s = time_passes(passes, || {
                for b in &set {
                    std::hint::black_box(q4_0_matmul_with(kernel, b, rows, cols, &x)?);
                }
                Ok(())
            })?;
            figures.push(figure(format!("{kernel:?}"), s, q4_bytes * matrices, weights * matrices, matrices));
        }
        figures
    };
    #[cfg(target_arch = "aarch64")]
    let q4_0_tiles = Vec::new();

    let mut by_type = Vec::new();
    if cols.is_multiple_of(256) {
        for dtype in timed_types() {
            let n = opts.working_set_bytes.div_ceil(dtype.byte_len(weights)).max(2);
            by_type.push(linear_figure(dtype, rows, cols, n, &x, passes)?);
        }
    }
    let by_type_to_q4_0_gbps = by_type.iter().map(|f| f.gbps / by_type[0].gbps).collect();

    let memory_gbps_after = memory_read_gbps(opts.working_set_bytes, passes)?;
    let memory_gbps = (memory_gbps_before + memory_gbps_after) / 2.0;
    let best = &mxfp4[0];
    Ok(KernelBenchReport {
        rows,
        cols,
        tokens: opts.tokens,
        matrices,
        working_set_bytes: matrices * mx_bytes,
        threads: rayon::current_num_threads(),
        candle_threads: candle_core::utils::get_num_threads(),
        memory_gbps_before,
        memory_gbps_after,
        memory_gbps,
        mxfp4_to_memory: best.gbps / memory_gbps,
        mxfp4_to_candle_q4_0_gbps: best.gbps / candle_q4_0.gbps,
        mxfp4_to_candle_q4_0_speed: best.gweights_per_s / candle_q4_0.gweights_per_s,
        mxfp4: mxfp4.clone(),
        candle_q4_0,
        q4_0_tiles,
        by_type,
        by_type_to_q4_0_gbps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_kernel_bench_reports_every_figure_and_consistent_ratios() {
        let opts = KernelBenchOptions { rows: 64, cols: 256, tokens: 2, working_set_bytes: 1 << 16, passes: 1 };
        let r = kernel_bench(&opts).unwrap();
        assert!(r.matrices >= 2 && r.memory_gbps > 0.0 && r.candle_q4_0.gbps > 0.0);
        assert_eq!(r.mxfp4[0].kernel, format!("{:?}", Kernel::detect()));
        assert!(r.mxfp4.iter().all(|f| f.gbps > 0.0 && f.us_per_call > 0.0));
        assert!((r.mxfp4_to_memory - r.mxfp4[0].gbps / r.memory_gbps).abs() < 1e-12);
        // Per weight, Q4_0 reads 18/17 of MXFP4's bytes.
        let implied = r.mxfp4_to_candle_q4_0_gbps * 18.0 / 17.0;
        assert!((r.mxfp4_to_candle_q4_0_speed - implied).abs() < 1e-9 * implied);
        assert!(kernel_bench(&KernelBenchOptions { cols: 100, ..opts }).is_err());
        assert_eq!(
            r.by_type.iter().map(|f| f.kernel.as_str()).collect::<Vec<_>>(),
            [
                "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ4_NL", "IQ3_S",
                "IQ2_S", "IQ4_XS", "NVFP4", "F16", "BF16", "F32"
            ]
        );
        assert!(r.by_type.iter().all(|f| f.gbps > 0.0) && r.by_type_to_q4_0_gbps[0] == 1.0);
        #[cfg(not(target_arch = "aarch64"))]
        {
            use nightmail_tensor::kernel::nibble_x8::TileKernel;
            let tiles: Vec<String> = r.q4_0_tiles.iter().map(|f| f.kernel.clone()).collect();
            assert_eq!(tiles.first(), Some(&format!("{:?}", TileKernel::detect())));
            assert_eq!(tiles.len(), TileKernel::available().len() - 1);
            assert!(r.q4_0_tiles.iter().all(|f| f.gbps > 0.0));
        }
    }
}
