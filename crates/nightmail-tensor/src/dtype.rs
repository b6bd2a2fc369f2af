//! The element type of a tensor in a model file: one of candle's ggml types, or MXFP4, which
//! candle does not know (its GGUF reader rejects type 39). The engine reads and writes files
//! through this type, so a tensor's type is always one the engine can size and compute.

use candle_core::quantized::GgmlDType;

/// A tensor's element type, as a GGUF tensor info or a safetensors header names it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDType {
    /// A type candle's quantized kernels know.
    Ggml(GgmlDType),
    /// OCP Microscaling Formats v1.0 MXFP4 (§5.3.3: 32 E2M1 elements sharing one E8M0 scale) in
    /// ggml's `block_mxfp4` layout (`ggml-common.h`): 17 bytes per block, GGUF type 39.
    Mxfp4,
    /// One of llama.cpp's i-quants or ternary types, which candle does not know.
    LowBit(LowBit),
}

/// llama.cpp's lattice ("i-quant"), ternary, binary and NVFP4 block types (`ggml-common.h`
/// `block_iq*`, `block_tq*`, `block_q1_0`, `block_q2_0`, `block_nvfp4`), each read by its own file
/// in `kernel/`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum LowBit {
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    Iq1M,
    Tq1_0,
    Tq2_0,
    Nvfp4,
    Q1_0,
    Q2_0,
}

impl LowBit {
    /// Every type, with ggml's name and its `enum ggml_type` id (`ggml.h`).
    pub const ALL: [(LowBit, &'static str, u32); 14] = [
        (LowBit::Iq2Xxs, "IQ2_XXS", 16),
        (LowBit::Iq2Xs, "IQ2_XS", 17),
        (LowBit::Iq3Xxs, "IQ3_XXS", 18),
        (LowBit::Iq1S, "IQ1_S", 19),
        (LowBit::Iq4Nl, "IQ4_NL", 20),
        (LowBit::Iq3S, "IQ3_S", 21),
        (LowBit::Iq2S, "IQ2_S", 22),
        (LowBit::Iq4Xs, "IQ4_XS", 23),
        (LowBit::Iq1M, "IQ1_M", 29),
        (LowBit::Tq1_0, "TQ1_0", 34),
        (LowBit::Tq2_0, "TQ2_0", 35),
        (LowBit::Nvfp4, "NVFP4", 40),
        (LowBit::Q1_0, "Q1_0", 41),
        (LowBit::Q2_0, "Q2_0", 42),
    ];

    /// Elements and bytes per block (gguf-py `GGML_QUANT_SIZES`; each type's file lays its
    /// block out in as many, which `kernel/lowbit.rs` tests).
    fn layout(self) -> (usize, usize) {
        match self {
            LowBit::Iq2Xxs | LowBit::Tq2_0 => (256, 66),
            LowBit::Iq2Xs => (256, 74),
            LowBit::Iq3Xxs => (256, 98),
            LowBit::Iq1S => (256, 50),
            LowBit::Iq4Nl => (32, 18),
            LowBit::Iq3S => (256, 110),
            LowBit::Iq2S => (256, 82),
            LowBit::Iq4Xs => (256, 136),
            LowBit::Iq1M => (256, 56),
            LowBit::Tq1_0 => (256, 54),
            LowBit::Nvfp4 => (64, 36),
            LowBit::Q1_0 => (128, 18),
            LowBit::Q2_0 => (64, 18),
        }
    }

    fn row(self) -> (LowBit, &'static str, u32) {
        *Self::ALL.iter().find(|r| r.0 == self).expect("every LowBit has a row")
    }

    pub fn name(self) -> &'static str {
        self.row().1
    }
}

/// ggml's type ids (`ggml.h` `enum ggml_type`) of the types the engine reads and writes.
const GGML_TYPE_IDS: [(GgmlDType, u32); 15] = [
    (GgmlDType::F32, 0),
    (GgmlDType::F16, 1),
    (GgmlDType::Q4_0, 2),
    (GgmlDType::Q4_1, 3),
    (GgmlDType::Q5_0, 6),
    (GgmlDType::Q5_1, 7),
    (GgmlDType::Q8_0, 8),
    (GgmlDType::Q8_1, 9),
    (GgmlDType::Q2K, 10),
    (GgmlDType::Q3K, 11),
    (GgmlDType::Q4K, 12),
    (GgmlDType::Q5K, 13),
    (GgmlDType::Q6K, 14),
    (GgmlDType::Q8K, 15),
    (GgmlDType::BF16, 30),
];

/// `GGML_TYPE_MXFP4` in `ggml.h`.
const MXFP4_TYPE_ID: u32 = 39;

impl WeightDType {
    pub const F32: WeightDType = WeightDType::Ggml(GgmlDType::F32);
    pub const F16: WeightDType = WeightDType::Ggml(GgmlDType::F16);
    pub const BF16: WeightDType = WeightDType::Ggml(GgmlDType::BF16);

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            WeightDType::Ggml(d) => d.block_size(),
            WeightDType::Mxfp4 => crate::kernel::mxfp4::QK,
            WeightDType::LowBit(t) => t.layout().0,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            WeightDType::Ggml(d) => d.type_size(),
            WeightDType::Mxfp4 => crate::kernel::mxfp4::BLOCK_BYTES,
            WeightDType::LowBit(t) => t.layout().1,
        }
    }

    /// Bytes a tensor of this type and element count occupies.
    pub fn byte_len(self, elems: usize) -> usize {
        elems / self.block_size() * self.type_size()
    }

    /// The GGUF tensor-info type id.
    pub fn gguf_type_id(self) -> u32 {
        match self {
            WeightDType::Ggml(d) => {
                GGML_TYPE_IDS.iter().find(|(t, _)| *t == d).map(|(_, id)| *id).expect("every GgmlDType has an id")
            }
            WeightDType::Mxfp4 => MXFP4_TYPE_ID,
            WeightDType::LowBit(t) => t.row().2,
        }
    }

    /// The type a GGUF tensor info names, if the engine knows it.
    pub fn from_gguf_type_id(id: u32) -> Option<Self> {
        if id == MXFP4_TYPE_ID {
            return Some(WeightDType::Mxfp4);
        }
        if let Some(r) = LowBit::ALL.iter().find(|r| r.2 == id) {
            return Some(WeightDType::LowBit(r.0));
        }
        GGML_TYPE_IDS.iter().find(|(_, i)| *i == id).map(|(t, _)| WeightDType::Ggml(*t))
    }
}

impl From<GgmlDType> for WeightDType {
    fn from(d: GgmlDType) -> Self {
        WeightDType::Ggml(d)
    }
}

/// ggml's spelling (`Q4_0`, `MXFP4`): what `model inspect` prints and errors name.
impl std::fmt::Debug for WeightDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // candle spells the K types without ggml's underscore (`Q4K`).
            WeightDType::Ggml(d) => match d {
                GgmlDType::Q2K => f.write_str("Q2_K"),
                GgmlDType::Q3K => f.write_str("Q3_K"),
                GgmlDType::Q4K => f.write_str("Q4_K"),
                GgmlDType::Q5K => f.write_str("Q5_K"),
                GgmlDType::Q6K => f.write_str("Q6_K"),
                GgmlDType::Q8K => f.write_str("Q8_K"),
                d => write!(f, "{d:?}"),
            },
            WeightDType::Mxfp4 => f.write_str("MXFP4"),
            WeightDType::LowBit(t) => f.write_str(t.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_type_ids_round_trip_and_mxfp4_is_39_with_17_byte_blocks_of_32() {
        for (d, id) in GGML_TYPE_IDS {
            assert_eq!(WeightDType::from_gguf_type_id(id), Some(WeightDType::Ggml(d)));
            assert_eq!(WeightDType::Ggml(d).gguf_type_id(), id);
        }
        assert_eq!(WeightDType::from_gguf_type_id(39), Some(WeightDType::Mxfp4));
        assert_eq!(WeightDType::Mxfp4.gguf_type_id(), 39);
        assert_eq!(WeightDType::Mxfp4.byte_len(64 * 32), 64 * 17);
        assert_eq!(WeightDType::from_gguf_type_id(43), None);
        assert_eq!(format!("{:?}", WeightDType::Mxfp4), "MXFP4");
        assert_eq!(format!("{:?}", WeightDType::Ggml(GgmlDType::Q4_0)), "Q4_0");
        assert_eq!(format!("{:?}", WeightDType::Ggml(GgmlDType::Q4K)), "Q4_K");
        for (t, name, id) in LowBit::ALL {
            assert_eq!(WeightDType::from_gguf_type_id(id), Some(WeightDType::LowBit(t)));
            assert_eq!(
                (WeightDType::LowBit(t).gguf_type_id(), format!("{:?}", WeightDType::LowBit(t))),
                (id, name.into())
            );
        }
        // gguf-py's GGML_QUANT_SIZES.
        let sizes = [66, 74, 98, 50, 18, 110, 82, 136, 56, 54, 66, 36, 18, 18];
        for ((t, _, _), bytes) in LowBit::ALL.into_iter().zip(sizes) {
            let elems = match t {
                LowBit::Iq4Nl => 32,
                LowBit::Nvfp4 | LowBit::Q2_0 => 64,
                LowBit::Q1_0 => 128,
                _ => 256,
            };
            assert_eq!(
                (WeightDType::LowBit(t).block_size(), WeightDType::LowBit(t).type_size()),
                (elems, bytes),
                "{t:?}"
            );
        }
    }
}
