//! `model pack SRC DST`: rewrite a GGUF model expert-major. The dense tensors come first,
//! together; then each routed expert's gate, up and down matrices back to back, each 4 KiB
//! aligned, so one direct read fetches a whole expert. The result is a GGUF with the source's
//! metadata plus `nightmail.packed`; llama.cpp does not read its per-expert tensors, nightmail
//! reads both layouts. `--dense q8_0|q4_0` also requantizes the non-expert weights
//! (`requantize.rs`); `--stripe DIR1,DIR2,...` puts the experts in one file per directory (a
//! disk each), in turn, which the main file lists (`nightmail.stripe.parts`).

use nightmail_formats::FormatError;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;

use nightmail_engine::Result;
use nightmail_formats::STRIPE_PARTS;
use nightmail_formats::gguf_write::{TensorHeader, write_gguf};
use nightmail_formats::{ExpertMatrix, ModelFile, is_expert_tensor, packed_expert_bias_name, packed_expert_name};
use nightmail_model::ExpertId;
use nightmail_model::spec::ModelSpec;
use nightmail_model::{expert_biases, expert_layers, expert_views};
use nightmail_tensor::{TensorView, WeightDType};

pub(crate) mod requantize;

pub use requantize::DenseQuant;

/// The version written to `nightmail.packed`.
pub const PACK_VERSION: u32 = 1;

#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// Requantize the non-expert weights to this type (experts are copied as they are).
    pub dense: Option<DenseQuant>,
    /// Spread the experts over files in these directories (one per disk); the dense tensors
    /// and the metadata stay in the main file, which lists the parts.
    pub stripe: Vec<PathBuf>,
}

/// What a pack wrote.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PackReport {
    pub bytes: u64,
    /// Non-expert tensors requantized, and their bytes before and after.
    pub requantized: usize,
    pub requantized_from_bytes: u64,
    pub requantized_to_bytes: u64,
}

pub fn pack(src: &Path, dst: &Path) -> Result<u64> {
    Ok(pack_with(src, dst, &PackOptions::default())?.bytes)
}

/// One tensor of the packed file: its header, and where its bytes come from.
struct Packed<'a> {
    header: TensorHeader,
    view: TensorView<'a>,
    /// Requantized from `view` when written.
    requantize: bool,
    /// The routed expert it belongs to.
    expert: Option<ExpertId>,
}

pub fn pack_with(src: &Path, dst: &Path, opts: &PackOptions) -> Result<PackReport> {
    let ck = ModelFile::open(src)?;
    let ModelFile::Gguf(g) = &ck else {
        return Err(FormatError::Unsupported {
            what: "packing a Hugging Face directory".into(),
            hint: "convert it to GGUF first (llama.cpp convert_hf_to_gguf.py), or stream it as it is".into(),
        }
        .into());
    };
    let spec = ModelSpec::read(&ck)?;
    if spec.moe.is_none() && !opts.stripe.is_empty() {
        return Err(FormatError::Unsupported {
            what: format!("striping {}", src.display()),
            hint: "--stripe spreads routed experts over disks, and the model has none".into(),
        }
        .into());
    }
    // Without experts there is nothing to lay out, but a spine to requantize.
    if spec.moe.is_none() && opts.dense.is_none() {
        return Err(FormatError::Unsupported {
            what: format!("packing {}", src.display()),
            hint: "the model has no routed experts (--dense q8_0 requantizes its weights)".into(),
        }
        .into());
    }
    let mut metadata: Vec<(String, Value)> =
        g.metadata().iter().filter(|(k, _)| *k != "general.alignment").map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    metadata.push(("nightmail.packed".into(), Value::U32(PACK_VERSION)));
    if let Some(q) = opts.dense {
        metadata.push(("nightmail.dense_type".into(), Value::String(q.name().into())));
    }

    // I32 index tables (DeepSeek-V4's `tid2eid`) go into the pack as F32 (exact small
    // integers), which `ModelFile::index_table` reads back.
    let tables = g
        .table_names()
        .into_iter()
        .map(|n| {
            let (values, shape) = g.index_table(&n)?.expect("a listed table");
            Ok((n, shape, values.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect::<Vec<u8>>()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut report = PackReport::default();
    let mut tensors: Vec<Packed<'_>> = Vec::new();
    for (name, shape, bytes) in &tables {
        tensors.push(Packed {
            header: TensorHeader::new(name.clone(), WeightDType::F32, shape),
            view: TensorView { name: name.clone(), dtype: WeightDType::F32, shape: shape.clone(), bytes, scale: None },
            requantize: false,
            expert: None,
        });
    }
    let tied = ck.tensor("output.weight")?.is_none();
    let dense: Vec<TensorView<'_>> = ck.all_tensors()?.into_iter().filter(|t| !is_expert_tensor(&t.name)).collect();
    let target =
        |t: &TensorView<'_>| opts.dense.and_then(|q| requantize::target(t, q, requantize::is_head(&t.name, tied)));
    // A requantized matrix takes its second scale into its values (`TensorView::to_f32`), so
    // the scale's own tensor is left out; kept, it would be applied twice.
    let folded: Vec<String> = dense
        .iter()
        .filter(|t| t.scale.is_some() && target(t).is_some())
        .filter_map(|t| t.name.strip_suffix(".weight").map(|base| format!("{base}.scale")))
        .collect();
    for t in dense.into_iter().filter(|t| !folded.contains(&t.name)) {
        let to = target(&t);
        let header = TensorHeader::new(t.name.clone(), to.map_or(t.dtype, Into::into), &t.shape);
        if to.is_some() {
            report.requantized += 1;
            report.requantized_from_bytes += t.bytes.len() as u64;
            report.requantized_to_bytes += header.byte_len() as u64;
        }
        tensors.push(Packed { header, view: t, requantize: to.is_some(), expert: None });
    }
    // Each packed expert matrix's second scale, as a one-value tensor beside it
    // (`<packed name>.scale`, which `GgufFile::tensor` reads back with the matrix).
    let mut expert_scales: Vec<(String, ExpertId, [u8; 4])> = Vec::new();
    if let Some(moe) = &spec.moe {
        for layer in expert_layers(&ck, &spec)? {
            for expert in 0..moe.experts {
                let id = ExpertId { layer, expert };
                for (m, v) in ExpertMatrix::ALL.into_iter().zip(expert_views(&ck, &spec, id)?) {
                    if let Some(s) = v.scale {
                        let name = packed_expert_name(id, m).replace(".weight", ".scale");
                        expert_scales.push((name, id, s.to_le_bytes()));
                    }
                }
            }
        }
    }
    let mut scales = expert_scales.iter().peekable();
    if let Some(moe) = &spec.moe {
        // The MTP layer's experts too (`nightmail-model/src/mtp.rs`): its dense tensors are among the rest.
        for layer in expert_layers(&ck, &spec)? {
            for expert in 0..moe.experts {
                let id = ExpertId { layer, expert };
                for (m, v) in ExpertMatrix::ALL.into_iter().zip(expert_views(&ck, &spec, id)?) {
                    tensors.push(Packed {
                        header: TensorHeader::new(packed_expert_name(id, m), v.dtype, &v.shape),
                        view: v,
                        requantize: false,
                        expert: Some(id),
                    });
                }
                while let Some((name, _, bytes)) = scales.next_if(|(_, e, _)| *e == id) {
                    tensors.push(Packed {
                        header: TensorHeader::new(name.clone(), WeightDType::F32, &[1]),
                        view: TensorView {
                            name: name.clone(),
                            dtype: WeightDType::F32,
                            shape: vec![1],
                            bytes,
                            scale: None,
                        },
                        requantize: false,
                        expert: Some(id),
                    });
                }
                // gpt-oss's biases follow their expert's matrices, inside the same read.
                for (m, b) in ExpertMatrix::ALL.into_iter().zip(expert_biases(&ck, &spec, id)?) {
                    if let Some(b) = b {
                        tensors.push(Packed {
                            header: TensorHeader::new(packed_expert_bias_name(id, m), b.dtype, &b.shape),
                            view: b,
                            requantize: false,
                            expert: Some(id),
                        });
                    }
                }
            }
        }
    }
    let (main, parts) = stripe(tensors, &opts.stripe);
    let mut part_paths = Vec::with_capacity(parts.len());
    for (i, (dir, part)) in opts.stripe.iter().zip(&parts).enumerate() {
        let stem = dst.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let path = dir.join(format!("{stem}.stripe-{}-of-{}.gguf", i + 1, parts.len()));
        let meta = vec![("nightmail.stripe.part".to_string(), Value::U32(i as u32 + 1))];
        report.bytes += write(&ck, &path, &meta, part)?;
        let path = std::fs::canonicalize(&path).map_err(|source| FormatError::Io { path: path.clone(), source })?;
        part_paths.push(Value::String(path.to_string_lossy().into_owned()));
    }
    if !part_paths.is_empty() {
        metadata.push((STRIPE_PARTS.into(), Value::Array(part_paths)));
    }
    report.bytes += write(&ck, dst, &metadata, &main)?;
    Ok(report)
}

/// The main file's tensors and each stripe part's: with no stripe directories, all in the main
/// file; otherwise the dense tensors stay there and the experts (a whole expert's matrices and
/// biases together, one read) go to the parts in turn.
fn stripe<'a>(tensors: Vec<Packed<'a>>, dirs: &[PathBuf]) -> (Vec<Packed<'a>>, Vec<Vec<Packed<'a>>>) {
    if dirs.is_empty() {
        return (tensors, Vec::new());
    }
    let mut parts: Vec<Vec<Packed<'a>>> = (0..dirs.len()).map(|_| Vec::new()).collect();
    let (mut main, mut expert, mut last) = (Vec::new(), 0usize, None);
    for t in tensors {
        match t.expert {
            Some(id) => {
                if last.is_some_and(|l| l != id) {
                    expert += 1;
                }
                last = Some(id);
                parts[expert % dirs.len()].push(t);
            }
            None => main.push(t),
        }
    }
    (main, parts)
}

/// Writes `tensors` as one GGUF at `path`; its size.
fn write(ck: &ModelFile, path: &Path, metadata: &[(String, Value)], tensors: &[Packed<'_>]) -> Result<u64> {
    let headers: Vec<TensorHeader> = tensors.iter().map(|t| t.header.clone()).collect();
    let mut since_release = 0usize;
    write_gguf(path, metadata, &headers, 4096, |i, w| {
        let t = &tensors[i];
        if t.requantize {
            let WeightDType::Ggml(dtype) = t.header.dtype else { unreachable!("requantized to a ggml type") };
            let bytes = requantize::requantize(&t.view, dtype).map_err(std::io::Error::other)?;
            w.write_all(&bytes)?;
        } else {
            w.write_all(t.view.bytes)?;
        }
        // Copying through the map faults the source in: let its pages go as we pass.
        since_release += t.view.bytes.len();
        if since_release > 1 << 30 {
            ck.release_pages();
            since_release = 0;
        }
        Ok(())
    })
    .map_err(|source| FormatError::Io { path: path.to_path_buf(), source })?;
    ck.release_pages();
    Ok(std::fs::metadata(path).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })?.len())
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::GgmlDType;

    use super::*;

    fn fixture(arch: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(arch).join("model.gguf")
    }

    #[test]
    fn a_dense_pack_changes_only_float_non_expert_tensors_and_copies_the_experts() {
        let dir = tempfile::tempdir().unwrap();
        for arch in ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "kimi_linear"] {
            let (plain, dense) = (dir.path().join("plain.gguf"), dir.path().join("dense.gguf"));
            pack(&fixture(arch), &plain).unwrap();
            let report = pack_with(
                &fixture(arch),
                &dense,
                &PackOptions { dense: Some(DenseQuant::Q4_0), ..PackOptions::default() },
            )
            .unwrap();
            let (a, b) = (ModelFile::open(&plain).unwrap(), ModelFile::open(&dense).unwrap());
            let (ta, tb) = (a.all_tensors().unwrap(), b.all_tensors().unwrap());
            assert_eq!(ta.len(), tb.len(), "{arch}");
            let mut changed = 0;
            for (x, y) in ta.iter().zip(&tb) {
                assert_eq!((&x.name, &x.shape), (&y.name, &y.shape), "{arch}");
                if x.dtype == y.dtype {
                    assert!(x.bytes == y.bytes, "{arch}: {} changed without a new type", x.name);
                    continue;
                }
                assert!(!is_expert_tensor(&x.name) && !x.name.contains("expert"), "{arch}: {} requantized", x.name);
                assert!(matches!(x.dtype, WeightDType::F32 | WeightDType::F16 | WeightDType::BF16), "{}", x.name);
                // The head keeps 8 bits.
                let want = if x.name == "output.weight" { GgmlDType::Q8_0 } else { GgmlDType::Q4_0 };
                assert_eq!(y.dtype, WeightDType::Ggml(want), "{arch}: {}", x.name);
                changed += 1;
            }
            assert!(changed > 0 && changed == report.requantized, "{arch}: {changed} vs {report:?}");
        }
    }

    #[test]
    fn a_model_without_experts_packs_only_to_requantize() {
        let dir = tempfile::tempdir().unwrap();
        let err = pack(&fixture("llama"), &dir.path().join("x.gguf")).unwrap_err().to_string();
        assert!(err.contains("no routed experts") && err.contains("--dense"), "{err}");
        let opts = PackOptions { dense: Some(DenseQuant::Q8_0), ..PackOptions::default() };
        assert!(pack_with(&fixture("llama"), &dir.path().join("y.gguf"), &opts).unwrap().requantized > 0);
    }
}
