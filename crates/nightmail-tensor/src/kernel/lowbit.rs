//! llama.cpp's i-quant, ternary, binary and NVFP4 block types, which candle does not know: each block decoded
//! by its type's file, as ggml's `dequantize_row_*` (ggml-quants.c) and gguf-py's `quants.py`
//! decode it, so that a weight read here is the weight llama.cpp reads.

use super::lattice::QK_K;
use super::nvfp4;
use crate::dtype::LowBit;

/// A block decoder: one block's bytes into its elements.
type Decode = fn(&[u8], &mut [f32]);

/// Elements and bytes per block of `t` (ggml-common.h's `block_*` structs), and its decoder.
fn codec(t: LowBit) -> (usize, usize, Decode) {
    use super::*;
    match t {
        LowBit::Iq2Xxs => (QK_K, iq2_xxs::BLOCK_BYTES, iq2_xxs::dequantize_block),
        LowBit::Iq2Xs => (QK_K, iq2_xs::BLOCK_BYTES, iq2_xs::dequantize_block),
        LowBit::Iq2S => (QK_K, iq2_s::BLOCK_BYTES, iq2_s::dequantize_block),
        LowBit::Iq3Xxs => (QK_K, iq3_xxs::BLOCK_BYTES, iq3_xxs::dequantize_block),
        LowBit::Iq3S => (QK_K, iq3_s::BLOCK_BYTES, iq3_s::dequantize_block),
        LowBit::Iq1S => (QK_K, iq1_s::BLOCK_BYTES, iq1_s::dequantize_block),
        LowBit::Iq1M => (QK_K, iq1_m::BLOCK_BYTES, iq1_m::dequantize_block),
        LowBit::Iq4Nl => (iq4_nl::QK, iq4_nl::BLOCK_BYTES, iq4_nl::dequantize_block),
        LowBit::Iq4Xs => (QK_K, iq4_xs::BLOCK_BYTES, iq4_xs::dequantize_block),
        LowBit::Tq1_0 => (QK_K, tq1_0::BLOCK_BYTES, tq1_0::dequantize_block),
        LowBit::Tq2_0 => (QK_K, tq2_0::BLOCK_BYTES, tq2_0::dequantize_block),
        LowBit::Nvfp4 => (nvfp4::QK, nvfp4::BLOCK_BYTES, nvfp4::dequantize_block),
        LowBit::Q1_0 => (q1_0::QK, q1_0::BLOCK_BYTES, q1_0::dequantize_block),
        LowBit::Q2_0 => (q2_0::QK, q2_0::BLOCK_BYTES, q2_0::dequantize_block),
    }
}

/// The matrix of `t` over `bytes` (`rows` × `cols`) for a type with a super-block kernel.
pub fn low_bit_matrix(
    t: LowBit,
    bytes: crate::bytes::WeightBytes,
    rows: usize,
    cols: usize,
) -> Option<Box<dyn super::q8_k::LowBitMatrix>> {
    use super::q8_k::SuperBlockMatrix;
    use super::{iq2_s::Iq2S, iq2_xs::Iq2Xs, iq2_xxs::Iq2Xxs, iq3_s::Iq3S, iq3_xxs::Iq3Xxs, iq4_xs::Iq4Xs};
    if t == LowBit::Nvfp4 && cols.is_multiple_of(nvfp4::QK) {
        return Some(Box::new(nvfp4::Nvfp4Matrix::new(bytes, rows, cols)));
    }
    if !cols.is_multiple_of(QK_K) {
        return None;
    }
    Some(match t {
        LowBit::Iq2Xxs => Box::new(SuperBlockMatrix::<Iq2Xxs>::new(bytes, rows, cols)),
        LowBit::Iq2Xs => Box::new(SuperBlockMatrix::<Iq2Xs>::new(bytes, rows, cols)),
        LowBit::Iq3Xxs => Box::new(SuperBlockMatrix::<Iq3Xxs>::new(bytes, rows, cols)),
        LowBit::Iq2S => Box::new(SuperBlockMatrix::<Iq2S>::new(bytes, rows, cols)),
        LowBit::Iq3S => Box::new(SuperBlockMatrix::<Iq3S>::new(bytes, rows, cols)),
        LowBit::Iq4Xs => Box::new(SuperBlockMatrix::<Iq4Xs>::new(bytes, rows, cols)),
        _ => return None,
    })
}

/// `bytes` (whole blocks of `t`) decoded into `out`, one element per weight.
pub fn dequantize(t: LowBit, bytes: &[u8], out: &mut [f32]) {
    let (elems, size, block) = codec(t);
    for (b, y) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(elems)) {
        block(b, y);
    }
}

/// Whether `t` has a kernel for rows of `cols` elements (IQ4_NL's `iq4_nl.rs`, the super-block
/// types' `q8_k.rs`); the others compute from their weights dequantized to f32.
pub fn has_kernel(t: LowBit, cols: usize) -> bool {
    match t {
        LowBit::Iq4Nl => cols.is_multiple_of(super::iq4_nl::QK),
        LowBit::Nvfp4 => cols.is_multiple_of(nvfp4::QK),
        LowBit::Iq2Xxs | LowBit::Iq2Xs | LowBit::Iq2S | LowBit::Iq3Xxs | LowBit::Iq3S | LowBit::Iq4Xs => {
            cols.is_multiple_of(QK_K)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_dequantizes_random_blocks_bit_for_bit_as_llama_cpp_does() {
        // tests/fixtures/lowbit/generate.py: random blocks, then gguf-py quants.py's values (and
        // ggml's own `to_float` where gguf-py has none).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lowbit");
        for (t, name, _) in LowBit::ALL {
            let (elems, size, _) = codec(t);
            let d = crate::WeightDType::LowBit(t);
            assert_eq!((d.block_size(), d.type_size()), (elems, size), "{name}: dtype.rs's sizes, the file's layout");
            let file = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
            let blocks = file.len() / (size + 4 * elems);
            assert!(blocks > 0 && file.len() == blocks * (size + 4 * elems), "{name}: {} bytes", file.len());
            let (bytes, values) = file.split_at(blocks * size);
            let want: Vec<u32> = values.chunks_exact(4).map(|v| u32::from_le_bytes(v.try_into().unwrap())).collect();
            let mut got = vec![0f32; blocks * elems];
            dequantize(t, bytes, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), *w, "{name} element {i}: {g} vs the reference's {}", f32::from_bits(*w));
            }
        }
    }
}
