//! Mat-vec kernels, one file per weight type, each with its x86 paths (AVX2, AVX-512 VNNI) and
//! aarch64 paths chosen at run time and a scalar path that sums in the order of the ggml function
//! it cites. On aarch64 (`arm.rs`) every integer kernel against Q8 activations has a NEON and a
//! dotprod path; the multi-token kernels of Q4_0, Q4_1 and Q8_0 also an i8mm one (`smmla`, two
//! rows by two tokens), which every other kernel, and every one-token mat-vec, runs as dotprod.

#[cfg(target_arch = "aarch64")]
pub mod arm;
pub mod attention;
pub mod cpu;
pub mod half;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod k_quant;
#[rustfmt::skip]
mod iq_grids;
mod lattice;
pub mod lowbit;
pub mod matvec;
pub mod mxfp4;
pub mod nibble_x8;
mod nvfp4;
mod q1_0;
mod q2_0;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8;
pub mod q8_0;
pub mod q8_k;
#[cfg(target_arch = "aarch64")]
mod q8_k_arm;
pub mod tq1_0;
pub mod tq2_0;

pub use half::{Bf16Matrix, F16Matrix, HalfFloat, HalfMatrix};
pub use mxfp4::Mxfp4Matrix;
pub use q4_0::Q4_0Matrix;
pub use q4_1::Q4_1Matrix;
pub use q8_0::Q8_0Matrix;
