//! llama.cpp's i-quant and ternary block types, which candle does not know: each block decoded
//! by its type's file, as ggml's `dequantize_row_*` (ggml-quants.c) and gguf-py's `quants.py`
//! decode it, so that a weight read here is the weight llama.cpp reads.

use half::f16;

use crate::dtype::LowBit;

/// Elements in a super-block (ggml `QK_K`).
pub(crate) const QK_K: usize = 256;

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
    }
}

/// Elements and bytes per block of `t`.
pub fn layout(t: LowBit) -> (usize, usize) {
    let (elems, bytes, _) = codec(t);
    (elems, bytes)
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
        LowBit::Iq2Xxs | LowBit::Iq2Xs | LowBit::Iq3Xxs | LowBit::Iq4Xs => cols.is_multiple_of(QK_K),
        _ => false,
    }
}

/// The f16 at `b[i..i + 2]`, widened.
pub(crate) fn half(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The little-endian u16 at `b[i..i + 2]`.
pub(crate) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// The little-endian u32 at `b[i..i + 4]`.
pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Byte `j` of a grid point (ggml reads the table's words as bytes, little-endian).
pub(crate) fn grid_byte(point: u64, j: usize) -> u8 {
    (point >> (8 * j)) as u8
}

/// The 8 bytes of a grid point (two 4-byte IQ3 points side by side) with bit j of `signs`
/// negating byte j: the signed weights before the sub-block scale.
pub(crate) fn signed_point(point: u64, signs: u8) -> [i8; 8] {
    std::array::from_fn(|j| {
        let g = grid_byte(point, j) as i8;
        if signs & (1 << j) != 0 { -g } else { g }
    })
}

/// ±1 for bit `j` of `signs` (ggml `kmask_iq2xs[j]`).
pub(crate) fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` blocks of random bytes with a small finite f16 scale first, reproducibly.
    pub(crate) fn random_blocks(block_bytes: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        };
        let mut out = Vec::with_capacity(block_bytes * n);
        for _ in 0..n {
            let d = f16::from_f32(0.001 + next() as f32 / 255.0 * 0.01).to_le_bytes();
            out.extend_from_slice(&d);
            out.extend((2..block_bytes).map(|_| next()));
        }
        out
    }

    #[test]
    fn every_type_dequantizes_random_blocks_bit_for_bit_as_gguf_py_does() {
        // tests/fixtures/lowbit/generate.py: random blocks, then gguf-py quants.py's values.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lowbit");
        for (t, name, _) in LowBit::ALL {
            let (elems, size) = layout(t);
            let file = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
            let blocks = file.len() / (size + 4 * elems);
            assert!(blocks > 0 && file.len() == blocks * (size + 4 * elems), "{name}: {} bytes", file.len());
            let (bytes, values) = file.split_at(blocks * size);
            let want: Vec<u32> = values.chunks_exact(4).map(|v| u32::from_le_bytes(v.try_into().unwrap())).collect();
            let mut got = vec![0f32; blocks * elems];
            dequantize(t, bytes, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), *w, "{name} element {i}: {g} vs gguf-py's {}", f32::from_bits(*w));
            }
        }
    }
}
