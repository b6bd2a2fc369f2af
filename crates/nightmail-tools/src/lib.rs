//! The `nightmail model ...` commands as a library: make a synthetic model of any size
//! (`synth.rs`), repack one expert-major for streaming (`pack/`), measure a model's decode and
//! verify passes (`bench.rs`) and its kernels (`kernel_bench.rs`), predict its speed from the
//! disk and the kernels (`plan.rs`), and describe a file (`inspect.rs`). Built on the runtime;
//! nothing below it depends on this crate.

mod bench;
pub mod cli;
mod inspect;
mod kernel_bench;
mod pack;
mod plan;
pub mod synth;

pub use bench::{
    AcceptancePoint, BatchPoint, BatchReport, BenchOptions, BenchReport, DiskRate, Rss, VerifyPoint, VerifyReport,
    bench, bench_batch, bench_verify, rss,
};
pub use inspect::{DtypeUse, LayerKinds, ModelInfo, MtpTensors, RamFit, inspect, inspect_with_memory};
pub use kernel_bench::{KernelBenchOptions, KernelBenchReport, KernelFigure, kernel_bench};
pub use pack::{DenseQuant, PackOptions, PackReport, pack, pack_with};
pub use plan::{KernelRate, PlanOptions, PlanReport, PredictedStep, plan};
pub use synth::{SynthArch, SynthDtype, SynthReport, SynthSpec, synth, synth_headers};
