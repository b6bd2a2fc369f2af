//! A typed, borrowed view of one tensor's bytes inside a mapped file.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};

use crate::dtype::WeightDType;
use candle_core::{DType, Device, Tensor};

use crate::error::{Result, TensorError};

/// One tensor in a mapped file: its element type, its shape (outermost dimension first, as
/// PyTorch writes it; GGUF's dimensions are reversed on reading) and its bytes, not copied.
#[derive(Clone)]
pub struct TensorView<'a> {
    pub name: String,
    pub dtype: WeightDType,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
    /// llama.cpp's second scale, a tensor `<name>.scale` beside `<name>.weight` (a converted
    /// ModelOpt NVFP4 checkpoint's `weight_scale_2`, llama.cpp conversion/base.py
    /// `_repack_nvfp4`): the values are the blocks' times it. llama.cpp multiplies a product by
    /// it (llama-graph.cpp `build_lora_mm`, `build_lora_mm_id`), and so does [`crate::Linear`].
    pub scale: Option<f32>,
}

impl<'a> TensorView<'a> {
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes a tensor of this type and element count occupies (ggml block layout).
    pub fn byte_len(dtype: WeightDType, elems: usize) -> usize {
        dtype.byte_len(elems)
    }

    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(TensorError::Shape {
                name: self.name.clone(),
                found: self.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    /// The weights as a dense f32 tensor (norm weights, biases, and float matrices).
    pub fn to_f32(&self) -> Result<Tensor> {
        let dev = &Device::Cpu;
        let t = match self.dtype {
            WeightDType::F32 => Tensor::from_raw_buffer(self.bytes, DType::F32, &self.shape, dev)?,
            WeightDType::F16 => {
                Tensor::from_raw_buffer(self.bytes, DType::F16, &self.shape, dev)?.to_dtype(DType::F32)?
            }
            WeightDType::BF16 => {
                Tensor::from_raw_buffer(self.bytes, DType::BF16, &self.shape, dev)?.to_dtype(DType::F32)?
            }
            WeightDType::Mxfp4 => {
                self.check_blocks()?;
                let mut out = vec![0f32; self.elem_count()];
                crate::kernel::mxfp4::dequantize(self.bytes, &mut out);
                Tensor::from_vec(out, self.shape.as_slice(), dev)?
            }
            WeightDType::LowBit(t) => {
                self.check_blocks()?;
                let mut out = vec![0f32; self.elem_count()];
                crate::kernel::lowbit::dequantize(t, self.bytes, &mut out);
                Tensor::from_vec(out, self.shape.as_slice(), dev)?
            }
            WeightDType::Ggml(_) => self.unscaled().to_qtensor()?.dequantize(dev)?,
        };
        Ok(match self.scale {
            Some(s) => t.affine(s as f64, 0.0)?,
            None => t,
        })
    }

    /// The same blocks without a second scale (a product's factor to apply after it).
    pub fn unscaled(&self) -> TensorView<'a> {
        TensorView { scale: None, ..self.clone() }
    }

    /// A matrix ready for `x · Wᵀ`: float weights become an f32 tensor (exact arithmetic for the
    /// reference tests); quantized ones stay in their ggml blocks and use candle's kernels.
    pub fn to_matmul(&self) -> Result<QMatMul> {
        match self.dtype {
            WeightDType::F32 | WeightDType::F16 | WeightDType::BF16 | WeightDType::Mxfp4 | WeightDType::LowBit(_) => {
                Ok(QMatMul::Tensor(self.to_f32()?))
            }
            WeightDType::Ggml(_) => Ok(QMatMul::QTensor(std::sync::Arc::new(self.to_qtensor()?))),
        }
    }

    /// The ggml blocks, copied once out of the map into candle's storage.
    pub fn to_qtensor(&self) -> Result<QTensor> {
        check_supported(&self.name, self.dtype)?;
        if self.scale.is_some() {
            // candle's blocks cannot carry it: the caller multiplies by it (`Linear`).
            return Err(TensorError::UnsupportedDType {
                name: self.name.clone(),
                dtype: format!("{:?} with a second scale, as candle blocks", self.dtype),
            });
        }
        let WeightDType::Ggml(dtype) = self.dtype else {
            return Err(TensorError::UnsupportedDType { name: self.name.clone(), dtype: format!("{:?}", self.dtype) });
        };
        self.check_blocks()?;
        // candle reinterprets the bytes as blocks in place, which needs their alignment; GGUF
        // aligns tensor data to 32 bytes, so the copy below only runs for odd files.
        let align = match dtype {
            GgmlDType::F32 => 4,
            _ => 2,
        };
        let storage = if (self.bytes.as_ptr() as usize).is_multiple_of(align) {
            QStorage::from_data(Cow::Borrowed(self.bytes), &Device::Cpu, dtype)?
        } else {
            let mut words = vec![0u32; self.bytes.len().div_ceil(4)];
            // SAFETY: `words` has at least `bytes.len()` bytes and does not overlap the map.
            let buf = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), self.bytes.len()) };
            buf.copy_from_slice(self.bytes);
            QStorage::from_data(Cow::Borrowed(&*buf), &Device::Cpu, dtype)?
        };
        Ok(QTensor::new(storage, self.shape.as_slice())?)
    }

    /// The innermost dimension must be whole blocks.
    fn check_blocks(&self) -> Result<()> {
        let block = self.dtype.block_size();
        if self.shape.last().is_none_or(|c| c % block != 0) {
            return Err(TensorError::Shape {
                name: self.name.clone(),
                found: self.shape.clone(),
                expected: vec![block],
            });
        }
        Ok(())
    }

    /// Row `i` of a 2-D tensor as f32, dequantizing only that row (embedding lookup).
    pub fn row(&self, i: usize) -> Result<Vec<f32>> {
        let [rows, cols] = self.shape[..] else {
            return Err(TensorError::Shape {
                name: self.name.clone(),
                found: self.shape.clone(),
                expected: vec![0, 0],
            });
        };
        if i >= rows {
            return Err(TensorError::TokenOutOfRange { id: i as u32, vocab: rows });
        }
        let len = self.bytes.len() / rows;
        let row = row_values(&self.name, self.dtype, cols, &self.bytes[i * len..(i + 1) * len])?;
        Ok(match self.scale {
            Some(s) => row.into_iter().map(|v| v * s).collect(),
            None => row,
        })
    }
}

/// One row of `cols` elements of `dtype`, as f32: how [`TensorView::row`] dequantizes a row of
/// the mapped tensor, for the same bytes read from elsewhere (the file, a tied output head), so
/// that the values are the same.
pub fn row_values(name: &str, dtype: WeightDType, cols: usize, bytes: &[u8]) -> Result<Vec<f32>> {
    let one = TensorView { name: name.to_string(), dtype, shape: vec![1, cols], bytes, scale: None };
    Ok(one.to_f32()?.flatten_all()?.to_vec1::<f32>()?)
}

/// The ggml types this issue reads (candle also decodes the rest of its k-quants).
pub fn check_supported(name: &str, dtype: WeightDType) -> Result<()> {
    use GgmlDType::*;
    match dtype {
        WeightDType::Mxfp4 | WeightDType::LowBit(_) => Ok(()),
        WeightDType::Ggml(F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K) => Ok(()),
        other => Err(TensorError::UnsupportedDType { name: name.to_string(), dtype: format!("{other:?}") }),
    }
}
