//! The aarch64 paths of the integer kernels against Q8 activations, chosen at run time, and the
//! block dot products they share. Every path computes each block's integer sum exactly and then
//! takes the scalar reference's float operations in its order, so every path gives the scalar
//! reference's bits (and a chunk of tokens each token's lone result).
//!
//! Which kernels have which paths:
//! - NEON and dotprod: every integer kernel here (Q4_0, Q4_1, Q8_0, IQ4_NL, the nibble-packed
//!   types of `nibble_x8.rs`, the K-quants of `q8_k_arm.rs`), one token and chunks of tokens.
//! - i8mm: the multi-token kernels of Q4_0, Q4_1 and Q8_0 (verify rows, prefill, batches), two
//!   rows against two tokens a `smmla`; an odd last row or token, and every one-token mat-vec,
//!   run the dotprod code (one token leaves half of each `smmla` unused). Every other kernel runs
//!   its dotprod instance under [`ArmKernel::I8mm`]. MXFP4 keeps its activations in f32
//!   (`mxfp4.rs`), so it has no integer path to take either.
//!
//! `sdot` and `smmla` are written with `asm!`: `vdotq_s32` and `vmmlaq_s32` are still unstable on
//! stable Rust, while `asm!` inside a `#[target_feature(enable = "...")]` function is stable (Arm
//! ARM C7.2.305 SDOT; SMMLA (vector), FEAT_I8MM).

use std::arch::aarch64::*;

/// The integer kernels' aarch64 paths, the portable one first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmKernel {
    /// Base NEON (every aarch64 CPU): `smull` to 16-bit products, `sadalp` into 32-bit lanes.
    Neon,
    /// FEAT_DotProd's `sdot` (Apple M1 and later, Neoverse N1): four products into each lane.
    Dotprod,
    /// FEAT_I8MM's `smmla` (Apple M2 and later, Neoverse V1/N2) for two rows against two tokens,
    /// with `sdot` for the rest. I8MM does not architecturally imply DotProd (both are optional
    /// from Armv8.2 and each is detected from its own HWCAP bit), so the path needs both.
    I8mm,
}

impl ArmKernel {
    /// The best path this CPU has.
    pub fn detect() -> Self {
        [ArmKernel::I8mm, ArmKernel::Dotprod].into_iter().find(|k| k.runs_here()).unwrap_or(ArmKernel::Neon)
    }

    /// Whether this CPU has the path's instructions (each detection a cached load: this runs
    /// before every dispatched row).
    pub fn runs_here(self) -> bool {
        let dotprod = || std::arch::is_aarch64_feature_detected!("dotprod");
        match self {
            ArmKernel::Neon => true,
            ArmKernel::Dotprod => dotprod(),
            ArmKernel::I8mm => std::arch::is_aarch64_feature_detected!("i8mm") && dotprod(),
        }
    }

    /// The paths this CPU can run, the portable one first.
    pub fn available() -> Vec<Self> {
        [ArmKernel::Neon, ArmKernel::Dotprod, ArmKernel::I8mm].into_iter().filter(|k| k.runs_here()).collect()
    }

    /// Panics unless this CPU has the path's instructions: an `sdot` or `smmla` on a CPU without
    /// them dies with SIGILL, a refusal says why.
    pub fn require(self) {
        if !self.runs_here() {
            let needs: &[(&str, bool)] = match self {
                ArmKernel::Neon => &[],
                ArmKernel::Dotprod => &[("FEAT_DotProd", ArmKernel::Dotprod.runs_here())],
                ArmKernel::I8mm => &[
                    ("FEAT_I8MM", std::arch::is_aarch64_feature_detected!("i8mm")),
                    ("FEAT_DotProd", ArmKernel::Dotprod.runs_here()),
                ],
            };
            let missing: Vec<&str> = needs.iter().filter(|(_, has)| !has).map(|(name, _)| *name).collect();
            panic!("the {self:?} kernel needs {}, which this CPU lacks", missing.join(" and "));
        }
    }
}

/// `kernel`'s instance of `f::<SDOT>(args..)`, a function generic over whether it may use `sdot`:
/// the dotprod instance is called from a function compiled with dotprod (so its `sdot`s inline
/// there), after [`ArmKernel::require`]; [`ArmKernel::I8mm`] runs the dotprod instance too.
/// `dispatch!(kernel, f(args..), i8mm: g(args..))` runs `g` instead under I8mm, from a function
/// compiled with i8mm and dotprod.
macro_rules! dispatch {
    ($kernel:expr, $f:ident($($arg:expr),*)) => {
        match $kernel {
            // SAFETY: the NEON instance uses base NEON only, which every aarch64 CPU has.
            $crate::kernel::arm::ArmKernel::Neon => unsafe { $f::<false>($($arg),*) },
            kernel @ ($crate::kernel::arm::ArmKernel::Dotprod | $crate::kernel::arm::ArmKernel::I8mm) => {
                kernel.require();
                // SAFETY: dotprod was required just above (I8mm requires it too).
                unsafe { $crate::kernel::arm::with_dotprod(|| $f::<true>($($arg),*)) }
            }
        }
    };
    ($kernel:expr, $f:ident($($arg:expr),*), i8mm: $g:ident($($g_arg:expr),*)) => {
        match $kernel {
            kernel @ $crate::kernel::arm::ArmKernel::I8mm => {
                kernel.require();
                // SAFETY: i8mm and dotprod were required just above.
                unsafe { $crate::kernel::arm::with_i8mm(|| $g($($g_arg),*)) }
            }
            kernel => $crate::kernel::arm::dispatch!(kernel, $f($($arg),*)),
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

/// Calls `f` from a function compiled with i8mm and dotprod, so [`smmla`] and [`sdot`] inline
/// into it.
///
/// # Safety
/// The CPU has FEAT_I8MM and FEAT_DotProd.
#[inline]
#[target_feature(enable = "dotprod,i8mm")]
pub(crate) unsafe fn with_i8mm<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `acc +` the 2×2 matrix product of `a`'s two 8-byte rows with `b`'s: lane 2i + j gains
/// Σ_k a[8i + k] · b[8j + k] (SMMLA: `a` a 2×8 matrix by rows, `b` an 8×2 one by columns).
///
/// # Safety
/// The CPU has FEAT_I8MM.
#[inline]
#[target_feature(enable = "i8mm")]
pub(crate) unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the enclosing function's feature allows.
    unsafe {
        std::arch::asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Two blocks' 32 bytes (each as its two 16-byte halves) as [`smmla`] operands: vector k holds
/// bytes 8k..8k+7 of `first`, then the same bytes of `second` (ggml's NEON `vmmlaq_s32` paths
/// zip two rows' 64-bit lanes the same way).
#[inline(always)]
pub(crate) fn interleave(first: [int8x16_t; 2], second: [int8x16_t; 2]) -> [int8x16_t; 4] {
    // SAFETY: register-only base NEON.
    unsafe {
        let zip = |a: int8x16_t, b: int8x16_t| {
            let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
            [vreinterpretq_s8_s64(vzip1q_s64(a, b)), vreinterpretq_s8_s64(vzip2q_s64(a, b))]
        };
        let ([w0, w1], [w2, w3]) = (zip(first[0], second[0]), zip(first[1], second[1]));
        [w0, w1, w2, w3]
    }
}

/// The four integer block sums of two weight rows against two tokens, both [`interleave`]d:
/// lanes row 0 · token 0, row 0 · token 1, row 1 · token 0, row 1 · token 1. Exact: a lane
/// holds at most 32 · 128 · 128 in magnitude.
///
/// # Safety
/// The CPU has FEAT_I8MM.
#[inline(always)]
pub(crate) unsafe fn pair_dots(w: &[int8x16_t; 4], x: &[int8x16_t; 4]) -> int32x4_t {
    // SAFETY: the caller's proof of i8mm is passed on.
    unsafe { w.iter().zip(x).fold(vdupq_n_s32(0), |acc, (w, x)| smmla(acc, *w, *x)) }
}

/// Two rows' values in [`pair_dots`]' lanes: `[row0, row0, row1, row1]`.
#[inline(always)]
pub(crate) fn row_lanes(row0: f32, row1: f32) -> float32x4_t {
    // SAFETY: register-only base NEON.
    unsafe { vcombine_f32(vdup_n_f32(row0), vdup_n_f32(row1)) }
}

/// Two tokens' values (`tokens[0..2]`) in [`pair_dots`]' lanes: `[t0, t1, t0, t1]`.
#[inline(always)]
pub(crate) fn token_lanes(tokens: &[f32]) -> float32x4_t {
    let tokens = &tokens[..2];
    // SAFETY: a 2-lane load within the two values; base NEON.
    unsafe {
        let pair = vld1_f32(tokens.as_ptr());
        vcombine_f32(pair, pair)
    }
}

/// Writes [`pair_dots`]-laid-out `lanes` to `out[0][t]`, `out[0][t + 1]`, `out[1][t]`, `out[1][t + 1]`.
#[inline(always)]
pub(crate) fn store_pair(out: &mut [&mut [f32]; 2], t: usize, lanes: float32x4_t) {
    let [row0, row1] = out;
    let (row0, row1) = (&mut row0[t..t + 2], &mut row1[t..t + 2]);
    // SAFETY: 2-lane stores within the two bounds-checked pairs; base NEON.
    unsafe {
        vst1_f32(row0.as_mut_ptr(), vget_low_f32(lanes));
        vst1_f32(row1.as_mut_ptr(), vget_high_f32(lanes));
    }
}

/// Writes a chunk of `n` tokens' results for two rows: each pair of tokens' [`pair_dots`]
/// lanes, then, for an odd `n`, the last token's two values.
pub(crate) fn store_pairs(out: &mut [&mut [f32]; 2], pairs: &[float32x4_t], last: [f32; 2], n: usize) {
    for (p, sum) in pairs.iter().enumerate().take(n / 2) {
        store_pair(out, 2 * p, *sum);
    }
    if n % 2 == 1 {
        out[0][n - 1] = last[0];
        out[1][n - 1] = last[1];
    }
}

/// [`store_pair`]'s inverse: `out[0][t..t + 2]` and `out[1][t..t + 2]` as [`pair_dots`]' lanes.
#[inline(always)]
pub(crate) fn load_pair(out: &[&mut [f32]; 2], t: usize) -> float32x4_t {
    let (row0, row1) = (&out[0][t..t + 2], &out[1][t..t + 2]);
    // SAFETY: 2-lane loads within the two bounds-checked pairs; base NEON.
    unsafe { vcombine_f32(vld1_f32(row0.as_ptr()), vld1_f32(row1.as_ptr())) }
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
        let (dotprod, i8mm) =
            (std::arch::is_aarch64_feature_detected!("dotprod"), std::arch::is_aarch64_feature_detected!("i8mm"));
        match std::env::var("NIGHTMAIL_ARM_KERNEL").as_deref() {
            Ok("neon") => ArmKernel::Neon,
            Ok("dotprod") => ArmKernel::Dotprod,
            Ok("i8mm") => ArmKernel::I8mm,
            Ok(other) => panic!("NIGHTMAIL_ARM_KERNEL={other}: expected neon, dotprod or i8mm"),
            Err(_) if dotprod && i8mm => ArmKernel::I8mm,
            Err(_) if dotprod => ArmKernel::Dotprod,
            Err(_) => ArmKernel::Neon,
        }
    }

    /// Random bytes from seed `s`.
    fn random_bytes<const N: usize>(s: &mut u64) -> [i8; N] {
        std::array::from_fn(|_| {
            *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (*s >> 56) as u8 as i8
        })
    }

    fn scalar_dot(w: &[i8; 32], x: &[i8; 32]) -> i32 {
        w.iter().zip(x).map(|(a, b)| *a as i32 * *b as i32).sum()
    }

    /// Two rows' blocks against two tokens' blocks in `smmla`, the lanes as an array.
    ///
    /// # Safety
    /// The CPU has FEAT_I8MM.
    unsafe fn pair_sums(w: [&[i8; 32]; 2], x: [&[i8; 32]; 2]) -> [i32; 4] {
        let mut lanes = [0i32; 4];
        // SAFETY: the caller's proof of i8mm; a 4-lane store into 4 integers.
        unsafe {
            let acc = pair_dots(&interleave(bytes(w[0]), bytes(w[1])), &interleave(bytes(x[0]), bytes(x[1])));
            vst1q_s32(lanes.as_mut_ptr(), acc);
        }
        lanes
    }

    /// The dotprod instance the i8mm form of `dispatch!` needs, never asked for under I8mm.
    unsafe fn unused<const SDOT: bool>() -> [i32; 4] {
        unreachable!("only the i8mm path is dispatched")
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
            ArmKernel::Dotprod | ArmKernel::I8mm => assert_eq!(refused.ok(), Some(-192)),
        }
    }

    #[test]
    fn the_i8mm_path_is_refused_on_a_cpu_without_it() {
        let (w0, w1, x0, x1) = ([3i8; 32], [-1i8; 32], [-2i8; 32], [5i8; 32]);
        let refused =
            std::panic::catch_unwind(|| dispatch!(ArmKernel::I8mm, unused(), i8mm: pair_sums([&w0, &w1], [&x0, &x1])));
        if expected() == ArmKernel::I8mm {
            assert_eq!(refused.ok(), Some([-192, 480, 64, -160]));
        } else {
            let message = refused.expect_err("an smmla path ran on a CPU without i8mm");
            let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(text.contains("FEAT_I8MM"), "{text}");
            assert!(!ArmKernel::I8mm.runs_here() && !ArmKernel::available().contains(&ArmKernel::I8mm));
        }
    }

    #[test]
    fn every_path_sums_a_block_exactly() {
        // The extremes (−128 against −127, where a 16-bit pair sum would overflow) and random bytes.
        let mut blocks = vec![([-128i8; 32], [-127i8; 32]), ([127i8; 32], [-128i8; 32])];
        let mut s = 7u64;
        for _ in 0..64 {
            blocks.push((random_bytes(&mut s), random_bytes(&mut s)));
        }
        for kernel in ArmKernel::available() {
            for (w, x) in &blocks {
                let want = scalar_dot(w, x);
                let got = dispatch!(kernel, block_dot(bytes(w), x));
                assert_eq!(got, want, "{kernel:?}");
            }
        }
        // `smmla`'s two rows against two tokens: the largest sum (−128 · −128 throughout) and
        // four blocks at a time of the ones above.
        if ArmKernel::available().contains(&ArmKernel::I8mm) {
            let (low, high) = ([-128i8; 32], [127i8; 32]);
            let mut fours = vec![[&low, &low, &low, &high]];
            fours.extend(blocks.chunks_exact(2).map(|b| [&b[0].0, &b[1].0, &b[0].1, &b[1].1]));
            for [w0, w1, x0, x1] in fours {
                let want = [scalar_dot(w0, x0), scalar_dot(w0, x1), scalar_dot(w1, x0), scalar_dot(w1, x1)];
                let got = dispatch!(ArmKernel::I8mm, unused(), i8mm: pair_sums([w0, w1], [x0, x1]));
                assert_eq!(got, want);
            }
        }
    }
}
