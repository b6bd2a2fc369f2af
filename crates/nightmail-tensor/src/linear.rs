//! The two leaf parts: a linear map and RMSNorm.

use candle_core::quantized::{GgmlDType, QMatMul};

use crate::dtype::WeightDType;
use candle_core::{Module, Tensor};

use super::ggml::Numerics;
use crate::bytes::WeightBytes;
use crate::error::Result;
use crate::view::{TensorView, row_values};

/// `y = x · Wᵀ (+ b)`, with W in f32 or in ggml quantized blocks.
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
    /// The weight's second scale ([`TensorView::scale`]), applied to the product before the
    /// bias, as llama.cpp's `build_lora_mm` does.
    scale: Option<f32>,
}

enum Weight {
    Candle(QMatMul),
    F16(Box<crate::kernel::half::F16Matrix>),
    Bf16(Box<crate::kernel::half::Bf16Matrix>),
    Q4_0(Box<crate::kernel::q4_0::Q4_0Matrix>),
    Q4_1(Box<crate::kernel::q4_1::Q4_1Matrix>),
    Q8_0(Box<crate::kernel::q8_0::Q8_0Matrix>),
    Mxfp4(Box<crate::kernel::mxfp4::Mxfp4Matrix>),
    Iq4Nl(Box<crate::kernel::iq4_nl::Iq4NlMatrix>),
    LowBit(Box<dyn crate::kernel::q8_k::LowBitMatrix>),
}

impl Linear {
    /// A matrix copied out of a mapped file.
    pub fn new(weight: &TensorView<'_>, bias: Option<&TensorView<'_>>) -> Result<Self> {
        Self::with_bytes(weight, None, bias)
    }

    /// A matrix over bytes that already live in memory (a streamed expert's read buffer):
    /// the kernel is chosen exactly as for [`Linear::new`], so the arithmetic is the same.
    pub fn from_bytes(weight: &TensorView<'_>, bytes: WeightBytes, bias: Option<&TensorView<'_>>) -> Result<Self> {
        Self::with_bytes(weight, Some(bytes), bias)
    }

    fn with_bytes(weight: &TensorView<'_>, bytes: Option<WeightBytes>, bias: Option<&TensorView<'_>>) -> Result<Self> {
        let mut weight = weight.clone();
        let scale = weight.scale.take();
        // A 1-D weight is a single output row (e.g. Qwen2-MoE's shared-expert gate in GGUF).
        if weight.shape.len() == 1 {
            weight.shape.insert(0, 1);
        }
        let bias = bias.map(|b| b.to_f32()).transpose()?;
        match matvec_path(weight.dtype) {
            MatVecPath::Candle => return Ok(Linear { weight: candle_matmul(&weight)?, bias, scale }),
            MatVecPath::F32 => {
                return Ok(Linear { weight: Weight::Candle(QMatMul::Tensor(weight.to_f32()?)), bias, scale });
            }
            MatVecPath::Native => {}
        }
        let w = match (weight.dtype, &weight.shape[..]) {
            (WeightDType::Ggml(GgmlDType::Q4_0), &[rows, cols]) if cols % 32 == 0 => {
                // Q4_0 computes from the blocks as they are: one copy of them, or none.
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::Q4_0(Box::new(crate::kernel::q4_0::Q4_0Matrix::new(bytes, rows, cols)))
            }
            (WeightDType::Mxfp4, &[rows, cols]) if cols % 32 == 0 => {
                // So does MXFP4: the kernel dequantizes in registers.
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::Mxfp4(Box::new(crate::kernel::mxfp4::Mxfp4Matrix::new(bytes, rows, cols)))
            }
            (WeightDType::LowBit(crate::dtype::LowBit::Iq4Nl), &[rows, cols]) if cols % 32 == 0 => {
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::Iq4Nl(Box::new(crate::kernel::iq4_nl::Iq4NlMatrix::new(bytes, rows, cols)))
            }
            (WeightDType::LowBit(t), &[rows, cols]) if crate::kernel::lowbit::has_kernel(t, cols) => {
                // The i-quants with kernels compute from their blocks too.
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::LowBit(crate::kernel::lowbit::low_bit_matrix(t, bytes, rows, cols).expect("has_kernel"))
            }
            (WeightDType::Ggml(GgmlDType::Q2K), &[rows, cols]) if crate::kernel::q2_k::has_kernel(cols) => {
                // Q2_K in llama.cpp's orders (`q2_k.rs`).
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::LowBit(crate::kernel::q2_k::q2_k_matrix(bytes, rows, cols))
            }
            (
                WeightDType::Ggml(t @ (GgmlDType::Q3K | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K)),
                &[rows, cols],
            ) if crate::kernel::k_quant::has_kernel(cols) => {
                // The K-quants in llama.cpp's orders (`k_quant.rs`).
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::LowBit(crate::kernel::k_quant::k_quant_matrix(t, bytes, rows, cols).expect("a K-quant"))
            }
            (WeightDType::Ggml(GgmlDType::Q4_1), &[rows, cols]) if cols % 32 == 0 => {
                Weight::Q4_1(Box::new(crate::kernel::q4_1::Q4_1Matrix::from_ggml(weight.bytes, rows, cols)))
            }
            (WeightDType::Ggml(GgmlDType::Q8_0), &[rows, cols]) if cols % 32 == 0 => {
                Weight::Q8_0(Box::new(crate::kernel::q8_0::Q8_0Matrix::from_ggml(weight.bytes, rows, cols)))
            }
            (WeightDType::F16, &[rows, cols]) => {
                // F16 too: read as halves where the bytes lie.
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::F16(Box::new(crate::kernel::half::F16Matrix::new(bytes, rows, cols)))
            }
            (WeightDType::BF16, &[rows, cols]) => {
                // And BF16 (most Hugging Face checkpoints' dense weights): kept in two bytes.
                let bytes = bytes.unwrap_or_else(|| WeightBytes::from(weight.bytes));
                Weight::Bf16(Box::new(crate::kernel::half::Bf16Matrix::new(bytes, rows, cols)))
            }
            _ => Weight::Candle(weight.to_matmul()?),
        };
        Ok(Linear { weight: w, bias, scale })
    }

    /// A float weight `[out, in]` already in memory.
    pub fn from_tensor(weight: Tensor) -> Self {
        Linear { weight: Weight::Candle(QMatMul::Tensor(weight)), bias: None, scale: None }
    }

    /// Row `i` of the weight as f32 (the caller checked it exists): the row of the file's
    /// tensor, dequantized from the same bytes by the same code (`format::row_values`), or read
    /// from the f32 or f16 values a conversion at load made of them, which hold it exactly. A
    /// tied embedding reads its rows here (`nightmail-model/src/parts/embedding.rs`).
    pub fn row(&self, i: usize) -> Result<Vec<f32>> {
        let row = self.unscaled_row(i)?;
        Ok(match self.scale {
            Some(s) => row.into_iter().map(|v| v * s).collect(),
            None => row,
        })
    }

    fn unscaled_row(&self, i: usize) -> Result<Vec<f32>> {
        let values =
            |dtype: GgmlDType, cols: usize, bytes: &[u8]| row_values("output.weight", dtype.into(), cols, bytes);
        match &self.weight {
            Weight::F16(w) => Ok(w.row(i)),
            Weight::Bf16(w) => Ok(w.row(i)),
            Weight::Q4_0(w) => values(GgmlDType::Q4_0, w.cols(), w.row_bytes(i)),
            Weight::Q4_1(w) => values(GgmlDType::Q4_1, w.cols(), w.row_bytes(i)),
            Weight::Q8_0(w) => values(GgmlDType::Q8_0, w.cols(), &w.row_bytes(i)),
            Weight::Mxfp4(w) => row_values("output.weight", WeightDType::Mxfp4, w.cols(), w.row_bytes(i)),
            Weight::LowBit(w) => row_values("output.weight", w.dtype(), w.cols(), w.row_bytes(i)),
            Weight::Iq4Nl(w) => {
                row_values("output.weight", WeightDType::LowBit(crate::dtype::LowBit::Iq4Nl), w.cols(), w.row_bytes(i))
            }
            Weight::Candle(QMatMul::QTensor(q)) => {
                let (rows, cols) = q.shape().dims2()?;
                let data = q.data()?;
                let len = data.len() / rows;
                values(q.dtype(), cols, &data[i * len..(i + 1) * len])
            }
            Weight::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => {
                Ok(t.get(i)?.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?)
            }
        }
    }

    /// `x`: `[tokens, in]` → `[tokens, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            Weight::Candle(w) => w.forward(x)?,
            Weight::F16(w) => w.forward(x)?,
            Weight::Bf16(w) => w.forward(x)?,
            Weight::Q4_0(w) => w.forward(x)?,
            Weight::Q4_1(w) => w.forward(x)?,
            Weight::Q8_0(w) => w.forward(x)?,
            Weight::Mxfp4(w) => w.forward(x)?,
            Weight::LowBit(w) => w.forward(x)?,
            Weight::Iq4Nl(w) => w.forward(x)?,
        };
        let y = match self.scale {
            Some(s) => y.affine(s as f64, 0.0)?,
            None => y,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Who computes a matrix: our kernel, candle-core's, or an f32 product of the dequantized
/// weights (the same weights without activation rounding: a reference for the other two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatVecPath {
    Native,
    Candle,
    F32,
}

/// The environment switch read when a model loads: `NIGHTMAIL_MATVEC=candle` sends every type
/// candle has to its kernels on any CPU (to test on x86_64 the path Apple Silicon takes);
/// `NIGHTMAIL_MATVEC=f32` computes every matrix in f32 from its dequantized weights.
pub const MATVEC_ENV: &str = "NIGHTMAIL_MATVEC";

/// The path a matrix of `dtype` takes on this CPU. Our Q4_0, Q4_1, Q8_0 and F16 kernels have
/// x86_64 SIMD (AVX2, F16C) and aarch64 NEON (every aarch64 CPU) besides a scalar loop; on an
/// x86_64 CPU without AVX2, candle's quantized mat-vec and, for F16, its half-precision matmul
/// do the work. MXFP4 is not a candle type: it keeps its own kernels everywhere. F32 always goes
/// to candle.
pub fn matvec_path(dtype: WeightDType) -> MatVecPath {
    let switch = std::env::var(MATVEC_ENV).unwrap_or_default().to_ascii_lowercase();
    if switch == "f32" {
        return MatVecPath::F32;
    }
    // NEON is in every aarch64 CPU, and with it every aarch64 path of our kernels.
    let neon = cfg!(target_arch = "aarch64");
    let ours = match dtype {
        WeightDType::Ggml(GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::F16 | GgmlDType::BF16) => {
            neon || crate::kernel::matvec::has_avx2_f16c()
        }
        WeightDType::Ggml(GgmlDType::Q8_0) => neon || crate::kernel::cpu::has_avx2(),
        // Q2_K in llama.cpp's AVX2 orders or its NEON one (`q2_k.rs`); on x86 without AVX2, candle's kernel.
        WeightDType::Ggml(GgmlDType::Q2K) => crate::kernel::q2_k::has_kernel(QK_K_COLS),
        // Q3_K to Q6_K in llama.cpp's orders (`k_quant.rs`): AVX2 on x86, every aarch64 CPU.
        // Q5_0 and Q5_1 stay with candle.
        WeightDType::Ggml(GgmlDType::Q3K | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K) => {
            crate::kernel::k_quant::has_kernel(QK_K_COLS)
        }
        // Neither are llama.cpp's i-quants and ternary types: their own kernels where they have
        // one (scalar without AVX2 or on aarch64), else an f32 product of their dequantized weights.
        WeightDType::Mxfp4 | WeightDType::LowBit(_) => return MatVecPath::Native,
        _ => return MatVecPath::Candle,
    };
    if ours && switch != "candle" { MatVecPath::Native } else { MatVecPath::Candle }
}

/// A width every super-block type accepts, to ask whether a type's kernel exists on this CPU.
const QK_K_COLS: usize = 256;

/// candle's matrix for `weight`: its quantized blocks as they are, F16 as a half tensor.
fn candle_matmul(weight: &TensorView<'_>) -> Result<Weight> {
    if weight.dtype == WeightDType::F16 {
        let halves = weight.to_qtensor()?.dequantize_f16(&candle_core::Device::Cpu)?;
        return Ok(Weight::Candle(QMatMul::TensorF16(halves)));
    }
    Ok(Weight::Candle(weight.to_matmul()?))
}

/// RMSNorm without a weight, `x · rsqrt(mean(x²) + eps)` over the last axis (DeepSeek-V4's
/// `DeepseekV4UnweightedRMSNorm`: its per-head query norm and the hyper-connection input).
pub fn unweighted_rms(x: &Tensor, eps: f32) -> Result<Tensor> {
    let mean = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
    Ok(x.broadcast_mul(&(mean + f64::from(eps))?.sqrt()?.recip()?)?)
}

/// Root-mean-square layer norm (Zhang & Sennrich 2019, arXiv 1910.07467), over the last axis.
pub struct RmsNorm {
    weight: Tensor,
    /// The weight as a vector, for ggml's row loop.
    row_weight: Vec<f32>,
    eps: f32,
    numerics: Numerics,
}

impl RmsNorm {
    pub fn new(weight: &TensorView<'_>, eps: f64, numerics: Numerics) -> Result<Self> {
        let weight = weight.to_f32()?;
        Ok(RmsNorm { row_weight: weight.to_vec1()?, weight, eps: eps as f32, numerics })
    }

    /// The norm with 1 + w as its weight: transformers' `Qwen3NextRMSNorm` multiplies the
    /// normed row by `(1.0 + weight)`, and adding first computes the same product.
    pub fn plus_one(self) -> Result<Self> {
        Ok(RmsNorm {
            weight: (self.weight + 1.0)?,
            row_weight: self.row_weight.iter().map(|w| w + 1.0).collect(),
            ..self
        })
    }

    pub fn from_tensor(weight: Tensor, eps: f64) -> Self {
        let row_weight = weight.to_vec1().expect("a norm weight is a vector");
        RmsNorm { weight, row_weight, eps: eps as f32, numerics: Numerics::Reference }
    }

    /// The width of the rows it normalizes.
    pub fn width(&self) -> usize {
        self.row_weight.len()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        match self.numerics {
            Numerics::Reference => Ok(candle_nn::ops::rms_norm(&x, &self.weight, self.eps)?),
            Numerics::Ggml => {
                let w = &self.row_weight;
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                let mut y = vec![0f32; xs.len()];
                for (x, y) in xs.chunks_exact(w.len()).zip(y.chunks_exact_mut(w.len())) {
                    super::ggml::rms_norm(x, w, self.eps, y);
                }
                Ok(Tensor::from_vec(y, x.shape(), x.device())?)
            }
        }
    }
}
