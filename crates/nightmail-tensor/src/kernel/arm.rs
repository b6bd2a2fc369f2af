//! The aarch64 paths of the integer kernels (Q4_0, Q4_1, Q8_0 against Q8 activations), chosen
//! at run time, and the 32-byte dot products they share. Every path computes each block's integer
//! sum exactly and then takes the scalar reference's float operations in its order, so every path
//! gives the scalar reference's bits (and a chunk of tokens each token's lone result).
//!
//! `sdot` is written with `asm!`: `vdotq_s32` is still unstable on stable Rust, while `asm!`
//! inside a `#[target_feature(enable = "dotprod")]` function is stable (Arm ARM C7.2.305 SDOT).

use std::arch::aarch64::*;

/// The integer kernels' aarch64 paths, the portable one first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmKernel {
    /// Base NEON (every aarch64 CPU): `smull` to 16-bit products, `sadalp` into 32-bit lanes.
    Neon,
    /// FEAT_DotProd's `sdot` (Apple M1 and later, Neoverse N1): four products into each lane.
    Dotprod,
}

impl ArmKernel {
    /// The best path this CPU has.
    pub fn detect() -> Self {
        if std::arch::is_aarch64_feature_detected!("dotprod") { ArmKernel::Dotprod } else { ArmKernel::Neon }
    }

    /// Whether this CPU has the path's instructions.
    pub fn runs_here(self) -> bool {
        match self {
            ArmKernel::Neon => true,
            ArmKernel::Dotprod => std::arch::is_aarch64_feature_detected!("dotprod"),
        }
    }

    /// The paths this CPU can run, the portable one first.
    pub fn available() -> Vec<Self> {
        [ArmKernel::Neon, ArmKernel::Dotprod].into_iter().filter(|k| k.runs_here()).collect()
    }

    /// Panics unless this CPU has the path's instructions: an `sdot` on a CPU without
    /// FEAT_DotProd dies with SIGILL, a refusal says why.
    pub fn require(self) {
        assert!(self.runs_here(), "the {self:?} kernel needs FEAT_DotProd, which this CPU lacks");
    }
}

/// `kernel`'s instance of `f::<SDOT>(args..)`, a function generic over whether it may use `sdot`:
/// the dotprod instance is called from a function compiled with dotprod (so its `sdot`s inline
/// there), after [`ArmKernel::require`].
macro_rules! dispatch {
    ($kernel:expr, $f:ident($($arg:expr),*)) => {
        match $kernel {
            // SAFETY: the NEON instance uses base NEON only, which every aarch64 CPU has.
            $crate::kernel::arm::ArmKernel::Neon => unsafe { $f::<false>($($arg),*) },
            kernel @ $crate::kernel::arm::ArmKernel::Dotprod => {
                kernel.require();
                // SAFETY: dotprod was required just above.
                unsafe { $crate::kernel::arm::with_dotprod(|| $f::<true>($($arg),*)) }
            }
        }
    };
}
pub(crate) use dispatch;

/// Calls `f` from a function compiled with dotprod, so [`sdot`] inlines into it.
///
/// # Safety
/// The CPU has FEAT_DotProd.
#[inline]
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn with_dotprod<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `acc + Σ` of each lane's four byte products (SDOT, vector form).
///
/// # Safety
/// The CPU has FEAT_DotProd.
#[inline]
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the enclosing function's feature allows.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Σ w·x over a block's 32 signed bytes, `w` as its two 16-byte halves (elements 0..15, 16..31).
/// Exact either way: no 16-bit sum of two products is formed (Q8_0's −128 · −127 pairs would
/// overflow it), and 32-bit lanes hold any block.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd (inside [`ArmKernel::run`]'s `sdot` closure).
#[inline(always)]
pub(crate) unsafe fn block_dot<const SDOT: bool>(w: [int8x16_t; 2], x: &[i8; 32]) -> i32 {
    // SAFETY: two 16-byte loads within the 32 bytes; base NEON, which every aarch64 CPU has;
    // `sdot` only where the caller proved dotprod.
    unsafe {
        let (x0, x1) = (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16)));
        let acc = if SDOT {
            sdot(sdot(vdupq_n_s32(0), w[0], x0), w[1], x1)
        } else {
            let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(w[0]), vget_low_s8(x0)));
            acc = vpadalq_s16(acc, vmull_high_s8(w[0], x0));
            acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w[1]), vget_low_s8(x1)));
            vpadalq_s16(acc, vmull_high_s8(w[1], x1))
        };
        vaddvq_s32(acc)
    }
}

/// Lane k: Σ of the byte products 4k..4k+3 of `w` and `x` (ggml's x86 lane of a 16-byte half),
/// exactly: `sdot` itself, or `smull` to 16-bit products (−128 · −128 fits) and two pairwise adds.
///
/// # Safety
/// `SDOT` only where the CPU has FEAT_DotProd.
#[inline(always)]
pub(crate) unsafe fn quad_sums<const SDOT: bool>(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: register-only base NEON; `sdot` only where the caller proved dotprod.
    unsafe {
        if SDOT {
            sdot(vdupq_n_s32(0), w, x)
        } else {
            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
            vpaddq_s32(lo, vpaddlq_s16(vmull_high_s8(w, x)))
        }
    }
}

/// A ggml 4-bit block's 16 packed bytes as its 32 weights, minus `offset` (8 for Q4_0, whose
/// nibbles stand for −8..7; 0 for Q4_1): the low nibbles are elements 0..15, the high 16..31.
///
/// # Safety
/// `packed` holds at least 16 bytes.
#[inline(always)]
pub(crate) unsafe fn nibbles(packed: &[u8], offset: i8) -> [int8x16_t; 2] {
    debug_assert!(packed.len() >= 16);
    // SAFETY: a 16-byte load within `packed` (the caller's promise); base NEON.
    unsafe {
        let p = vld1q_u8(packed.as_ptr());
        let lo = vreinterpretq_s8_u8(vandq_u8(p, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(p));
        let off = vdupq_n_s8(offset);
        [vsubq_s8(lo, off), vsubq_s8(hi, off)]
    }
}

/// A block's 16 packed bytes as its 32 weights through a 16-entry table (IQ4_NL's levels),
/// low nibbles elements 0..15, high 16..31, by `tbl` as ggml's NEON `ggml_vec_dot_iq4_nl_q8_0`
/// looks them up.
///
/// # Safety
/// `packed` holds at least 16 bytes.
#[inline(always)]
pub(crate) unsafe fn nibble_levels(packed: &[u8], levels: &[i8; 16]) -> [int8x16_t; 2] {
    debug_assert!(packed.len() >= 16);
    // SAFETY: 16-byte loads within `packed` (the caller's promise) and the table; base NEON.
    unsafe {
        let (p, table) = (vld1q_u8(packed.as_ptr()), vld1q_s8(levels.as_ptr()));
        [vqtbl1q_s8(table, vandq_u8(p, vdupq_n_u8(0x0F))), vqtbl1q_s8(table, vshrq_n_u8::<4>(p))]
    }
}

/// A Q8 block's 32 bytes as two 16-byte halves.
#[inline(always)]
pub(crate) fn bytes(qs: &[i8; 32]) -> [int8x16_t; 2] {
    // SAFETY: two 16-byte loads within the 32 bytes.
    unsafe { [vld1q_s8(qs.as_ptr()), vld1q_s8(qs.as_ptr().add(16))] }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CI runs this crate's tests under three emulated CPUs and names the path each must
    /// choose (scripts/test-arm.sh); elsewhere the expectation is the CPU's own answer.
    fn expected() -> ArmKernel {
        match std::env::var("NIGHTMAIL_ARM_KERNEL").as_deref() {
            Ok("neon") => ArmKernel::Neon,
            Ok("dotprod") => ArmKernel::Dotprod,
            Ok(other) => panic!("NIGHTMAIL_ARM_KERNEL={other}: expected neon or dotprod"),
            Err(_) if std::arch::is_aarch64_feature_detected!("dotprod") => ArmKernel::Dotprod,
            Err(_) => ArmKernel::Neon,
        }
    }

    #[test]
    fn detection_chooses_the_best_path_the_cpu_has() {
        assert_eq!(ArmKernel::detect(), expected());
        assert_eq!(ArmKernel::available().last(), Some(&expected()));
    }

    #[test]
    fn the_dotprod_path_is_refused_on_a_cpu_without_it() {
        let (w, x) = ([3i8; 32], [-2i8; 32]);
        let refused = std::panic::catch_unwind(|| dispatch!(ArmKernel::Dotprod, block_dot(bytes(&w), &x)));
        match expected() {
            ArmKernel::Neon => {
                let message = refused.expect_err("an sdot path ran on a CPU without dotprod");
                let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(text.contains("FEAT_DotProd"), "{text}");
            }
            ArmKernel::Dotprod => assert_eq!(refused.ok(), Some(-192)),
        }
    }

    #[test]
    fn every_path_sums_a_block_exactly() {
        // The extremes (−128 against −127, where a 16-bit pair sum would overflow) and random bytes.
        let mut blocks = vec![([-128i8; 32], [-127i8; 32]), ([127i8; 32], [-128i8; 32])];
        let mut s = 7u64;
        for _ in 0..64 {
            let mut next = || {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8 as i8
            };
            blocks.push((std::array::from_fn(|_| next()), std::array::from_fn(|_| next())));
        }
        for kernel in ArmKernel::available() {
            for (w, x) in &blocks {
                let want: i32 = w.iter().zip(x).map(|(a, b)| *a as i32 * *b as i32).sum();
                let got = dispatch!(kernel, block_dot(bytes(w), x));
                assert_eq!(got, want, "{kernel:?}");
            }
        }
    }
}
