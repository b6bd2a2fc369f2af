//! NVFP4 in ggml's layout (ggml-common.h `block_nvfp4`): 64 E2M1 values a block in four groups of
//! 16, each group with its own unsigned E4M3 scale. A checkpoint's per-tensor second scale is a
//! tensor of its own (`<name>.scale`), which the loaders refuse rather than ignore.

use super::mxfp4::KVALUES;

/// Elements per block.
pub(crate) const QK: usize = 64;
/// Elements that share a scale.
const GROUP: usize = 16;
/// Four scale bytes, then 32 bytes of two values each.
pub(crate) const BLOCK_BYTES: usize = 36;

/// ggml-impl.h `ggml_ue4m3_to_fp32`: E4M3 without its sign (bias 7, subnormals below exponent
/// 1), halved as the doubled E2M1 values ask; 0 and 0x7F (E4M3's NaN) read as 0.
fn ue4m3(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = (i32::from((x >> 3) & 0xF), f32::from(x & 0x7));
    let raw = if exp == 0 { man * 2f32.powi(-9) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    raw * 0.5
}

/// ggml-quants.c `dequantize_row_nvfp4`, one block: in each group of 16, byte j holds element j
/// in its low nibble and element j + 8 in its high one.
pub(crate) fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = b.split_at(QK / GROUP);
    for (s, (group, y)) in qs.chunks_exact(GROUP / 2).zip(y.chunks_exact_mut(GROUP)).enumerate() {
        let d = ue4m3(scales[s]);
        for (j, q) in group.iter().enumerate() {
            y[j] = f32::from(KVALUES[usize::from(q & 0x0F)]) * d;
            y[j + GROUP / 2] = f32::from(KVALUES[usize::from(q >> 4)]) * d;
        }
    }
}
