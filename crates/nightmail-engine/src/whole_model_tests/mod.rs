//! Tests of the lower crates' parts that need a whole loaded model to show what they claim: the
//! parts live below the runtime, so these live here.

mod embedding;
mod gated_delta_net;
mod hf;
mod kda;
mod mxfp4;
mod streamed_layers;
mod transformer;
