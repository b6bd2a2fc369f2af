//! Dense layers that do not stay in RAM, streamed from disk in layer order: reader threads read
//! each layer's tensors (the extents its build asked for at load) with the experts' `O_DIRECT`
//! reader, build the layer over the read buffers, and run ahead of the step through the next
//! layers (wrapping round to the first for the next token) as far as a byte window allows. The
//! order is fully known, so the disk reads the next layers while the current ones compute.

use nightmail_formats::FormatError;
use nightmail_model::ModelError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::quantized::GgmlDType;
use serde::Serialize;

use super::io::{ExpertFile, ReadRange, read_ranges};
use nightmail_model::Result;
use nightmail_model::expert_index::{MatrixExtent, Run, aligned_span, runs};
use nightmail_model::timeline;
use nightmail_model::{DecoderLayer, LayerBuilder, LayerStore, Recorded, WeightSource};
use nightmail_tensor::Linear;
use nightmail_tensor::{TensorView, WeightDType};
use nightmail_tensor::{WeightBytes, reserve_pool, unreserve_pool};

/// Pieces of one layer's read in flight (`io::PARALLEL_CHUNK` each): the disk's full rate needs
/// a deep queue; 4 in flight let the layers fall behind the expert reads (the steps waited
/// 0.33-0.45 s per token for their layers, against 0.05-0.12 with 16).
const PARALLEL_READS: usize = 16;

/// Where one streamed layer's tensors lie, and the reads that fetch them.
#[derive(Debug, Clone)]
pub struct LayerExtent {
    pub layer: usize,
    /// Each tensor its build asked for, under the GGUF name it asked by.
    pub tensors: Vec<MatrixExtent>,
    pub runs: Vec<Run>,
}

impl LayerExtent {
    /// The extents of the tensors layer `layer`'s build asked for at load (indices into `files`,
    /// which grows with new files).
    pub(crate) fn new(layer: usize, recorded: Vec<Recorded>, files: &mut Vec<PathBuf>) -> Result<Self> {
        let mut tensors = Vec::with_capacity(recorded.len());
        for r in recorded {
            let Some((path, offset)) = r.location else {
                return Err(FormatError::Unsupported {
                    what: format!("streaming layer {layer}: tensor {} is rebuilt at load", r.name),
                    hint: "no range of the file holds it as the engine computes from it: give the model more \
                           memory (memory_mb, --memory-mb) so that this layer stays resident"
                        .into(),
                }
                .into());
            };
            let file = match files.iter().position(|f| *f == path) {
                Some(i) => i,
                None => {
                    files.push(path);
                    files.len() - 1
                }
            };
            tensors.push(MatrixExtent {
                name: r.name,
                file,
                offset,
                len: r.len,
                dtype: r.dtype,
                shape: r.shape,
                scale: r.scale,
            });
        }
        let runs = runs(tensors.iter().enumerate());
        Ok(LayerExtent { layer, tensors, runs })
    }

    /// Bytes the layer's reads fetch (widened to aligned blocks).
    pub fn disk_bytes(&self) -> usize {
        self.runs.iter().map(|r| aligned_span(r.offset, r.len)).sum()
    }

    /// Memory the layer takes while read and built: its read buffers, and the copies the kernels
    /// make of the tensors they do not compute from in place.
    pub fn cost(&self) -> usize {
        self.disk_bytes() + self.tensors.iter().map(|t| copied_bytes(t.dtype, &t.shape, t.len, true)).sum::<usize>()
    }
}

/// Bytes a built tensor keeps besides its file bytes: a matrix whose kernel computes from the
/// file's bytes (Q4_0, MXFP4, F16) keeps them (`in_place`: in the read buffer itself, no copy);
/// the others are copied or converted (`Linear::new`, `RmsNorm::new`): f16 and bf16 vectors and
/// bf16 matrices become f32.
pub(crate) fn copied_bytes(dtype: WeightDType, shape: &[usize], len: usize, in_place: bool) -> usize {
    let blocks = shape.len() == 2 && shape[1].is_multiple_of(32);
    let kept_as_read = match dtype {
        WeightDType::Ggml(GgmlDType::Q4_0) | WeightDType::Mxfp4 => blocks,
        WeightDType::Ggml(GgmlDType::F16) => shape.len() == 2,
        WeightDType::LowBit(t) => shape.len() == 2 && nightmail_tensor::kernel::lowbit::has_kernel(t, shape[1]),
        _ => false,
    };
    match dtype {
        _ if kept_as_read => {
            if in_place {
                0
            } else {
                len
            }
        }
        WeightDType::Ggml(GgmlDType::BF16 | GgmlDType::F16) => 2 * len,
        // An i-quant without a kernel computes from its weights dequantized to f32.
        WeightDType::LowBit(_) => shape.iter().product::<usize>() * 4,
        _ => len,
    }
}

/// Counters since the store was made (or since [`StreamingLayers::reset_stats`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DenseStats {
    /// Layers the steps asked for.
    pub requests: u64,
    /// Of those, layers the step had to wait for or read itself.
    pub waits: u64,
    /// Layers read after a step asked for them (not read ahead).
    pub demand_reads: u64,
    pub layer_reads: u64,
    pub disk_bytes: u64,
    /// Seconds the steps spent waiting for layers.
    pub wait_s: f64,
    /// Seconds during which at least one layer read was in flight.
    pub disk_busy_s: f64,
    pub window_used_bytes: u64,
    pub window_budget_bytes: u64,
    pub streamed_layers: usize,
}

enum Slot {
    Reading,
    Ready(Arc<DecoderLayer>),
    Failed(String),
}

struct Entry {
    slot: Slot,
    cost: usize,
    /// Steps holding it; read-ahead ones are held by none.
    held: usize,
}

struct State {
    window: HashMap<usize, Entry>,
    used: usize,
    /// Position in `order` of the next layer to read ahead.
    next: usize,
    stats: DenseStats,
    reading: usize,
    busy_since: Option<Instant>,
    shutdown: bool,
}

struct Shared {
    /// Streamed layers, in layer order.
    order: Vec<usize>,
    extents: HashMap<usize, LayerExtent>,
    files: Vec<ExpertFile>,
    window_bytes: usize,
    build: LayerBuilder,
    state: Mutex<State>,
    changed: Condvar,
}

/// The layers a memory budget does not keep resident, read ahead in layer order through a window
/// of `window_bytes` (read buffers and built layers, held or waiting).
pub struct StreamingLayers {
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    /// The buffer lengths the pool keeps for this stream's released layers (one layer's reads).
    reserved: Vec<usize>,
}

impl StreamingLayers {
    pub(crate) fn new(
        extents: Vec<LayerExtent>,
        files: &[PathBuf],
        window_bytes: usize,
        readers: usize,
        build: LayerBuilder,
    ) -> Result<Self> {
        let files = files
            .iter()
            .map(|p| ExpertFile::open(p).map_err(|source| FormatError::Io { path: p.clone(), source }))
            .collect::<Result<Vec<_>, FormatError>>()?;
        for e in &extents {
            for t in &e.tensors {
                let file = &files[t.file];
                if t.offset + t.len as u64 > file.size() {
                    return Err(ModelError::from(FormatError::LayerRead {
                        path: file.path().to_path_buf(),
                        layer: e.layer,
                        reason: format!(
                            "{} ends at byte {} but the file has {} bytes (truncated?)",
                            t.name,
                            t.offset + t.len as u64,
                            file.size()
                        ),
                    }));
                }
            }
        }
        let mut order: Vec<usize> = extents.iter().map(|e| e.layer).collect();
        order.sort_unstable();
        let state = State {
            window: HashMap::new(),
            used: 0,
            next: 0,
            stats: DenseStats {
                window_budget_bytes: window_bytes as u64,
                streamed_layers: order.len(),
                ..DenseStats::default()
            },
            reading: 0,
            busy_since: None,
            shutdown: false,
        };
        let shared = Arc::new(Shared {
            order,
            extents: extents.into_iter().map(|e| (e.layer, e)).collect(),
            files,
            window_bytes,
            build,
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
        let reserved: Vec<usize> = shared
            .extents
            .values()
            .max_by_key(|e| e.disk_bytes())
            .map(|e| e.runs.iter().map(|r| aligned_span(r.offset, r.len)).collect())
            .unwrap_or_default();
        reserve_pool(&reserved);
        let readers = (0..readers.max(1))
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("layer-io-{i}"))
                    .spawn(move || shared.read_ahead())
                    .expect("spawn a layer I/O thread")
            })
            .collect();
        Ok(StreamingLayers { shared, readers, reserved })
    }

    pub fn stats(&self) -> DenseStats {
        let st = self.shared.state.lock().expect("layer stream lock");
        let mut s = st.stats.clone();
        s.window_used_bytes = st.used as u64;
        if let Some(since) = st.busy_since {
            s.disk_busy_s += since.elapsed().as_secs_f64();
        }
        s
    }

    pub fn reset_stats(&self) {
        let mut st = self.shared.state.lock().expect("layer stream lock");
        st.stats = DenseStats {
            window_budget_bytes: self.shared.window_bytes as u64,
            streamed_layers: self.shared.order.len(),
            ..DenseStats::default()
        };
        if st.busy_since.is_some() {
            st.busy_since = Some(Instant::now());
        }
    }

    /// The streamed layers, in layer order.
    pub fn layers(&self) -> &[usize] {
        &self.shared.order
    }

    /// Whether every file is read with direct I/O.
    pub fn is_direct(&self) -> bool {
        self.shared.files.iter().all(ExpertFile::is_direct)
    }
}

impl Drop for StreamingLayers {
    fn drop(&mut self) {
        self.shared.state.lock().expect("layer stream lock").shutdown = true;
        self.shared.changed.notify_all();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        unreserve_pool(&self.reserved);
    }
}

impl LayerStore for StreamingLayers {
    fn layer(&self, l: usize) -> Result<Arc<DecoderLayer>> {
        let shared = &self.shared;
        let mut st = shared.state.lock().expect("layer stream lock");
        st.stats.requests += 1;
        let mut waited: Option<Instant> = None;
        loop {
            match st.window.get_mut(&l) {
                Some(Entry { slot: Slot::Ready(layer), held, .. }) => {
                    *held += 1;
                    let layer = layer.clone();
                    if let Some(t0) = waited {
                        st.stats.wait_s += t0.elapsed().as_secs_f64();
                        timeline::record("dense_wait", l, None, 0, timeline::now().map(|_| t0));
                    }
                    return Ok(layer);
                }
                Some(Entry { slot: Slot::Reading, .. }) => {
                    if waited.is_none() {
                        waited = Some(Instant::now());
                        st.stats.waits += 1;
                    }
                    st = shared.changed.wait(st).expect("layer stream lock");
                }
                Some(Entry { slot: Slot::Failed(reason), .. }) => {
                    let reason = reason.clone();
                    shared.remove(&mut st, l);
                    return Err(shared.error(l, reason));
                }
                None => {
                    // Not read ahead (the first step, or after a failed one): read it here, drop
                    // what was read ahead of a step that went away if the window needs the room,
                    // and read on from the layer after it.
                    let t0 = Instant::now();
                    st.stats.waits += 1;
                    st.stats.demand_reads += 1;
                    let cost = shared.extent(l)?.cost();
                    let stale: Vec<usize> = st
                        .window
                        .iter()
                        .filter(|(_, e)| e.held == 0 && matches!(e.slot, Slot::Ready(_)))
                        .map(|(l, _)| *l)
                        .collect();
                    for old in stale {
                        if st.used + cost <= shared.window_bytes {
                            break;
                        }
                        shared.remove(&mut st, old);
                    }
                    st.window.insert(l, Entry { slot: Slot::Reading, cost, held: 1 });
                    st.used += cost;
                    st.next = shared.order.iter().position(|&x| x == l).map_or(0, |i| i + 1) % shared.order.len();
                    shared.start_read(&mut st);
                    drop(st);
                    let result = shared.read(l);
                    let mut st = shared.state.lock().expect("layer stream lock");
                    shared.finish_read(&mut st, l, &result);
                    st.stats.wait_s += t0.elapsed().as_secs_f64();
                    timeline::record("dense_wait", l, None, 0, timeline::now().map(|_| t0));
                    shared.changed.notify_all();
                    return match result {
                        Ok((layer, _)) => Ok(layer),
                        Err(e) => {
                            shared.remove(&mut st, l);
                            Err(e)
                        }
                    };
                }
            }
        }
    }

    fn peek(&self, l: usize) -> Option<Arc<DecoderLayer>> {
        let st = self.shared.state.lock().expect("layer stream lock");
        match st.window.get(&l) {
            Some(Entry { slot: Slot::Ready(layer), .. }) => Some(layer.clone()),
            _ => None,
        }
    }

    fn done(&self, l: usize) {
        let t = timeline::now();
        let mut st = self.shared.state.lock().expect("layer stream lock");
        let Some(e) = st.window.get_mut(&l) else { return };
        e.held = e.held.saturating_sub(1);
        if e.held == 0 {
            self.shared.remove(&mut st, l);
            self.shared.changed.notify_all();
        }
        drop(st);
        timeline::record("dense_release", l, None, 0, t);
    }
}

impl Shared {
    fn extent(&self, l: usize) -> Result<&LayerExtent> {
        Ok(self.extents.get(&l).ok_or_else(|| FormatError::MissingTensor { name: format!("streamed layer {l}") })?)
    }

    fn error(&self, l: usize, reason: String) -> ModelError {
        let path = self
            .extents
            .get(&l)
            .and_then(|e| e.tensors.first())
            .map_or_else(PathBuf::new, |t| self.files[t.file].path().to_path_buf());
        ModelError::from(FormatError::LayerRead { path, layer: l, reason })
    }

    fn remove(&self, st: &mut State, l: usize) {
        if let Some(e) = st.window.remove(&l) {
            st.used -= e.cost;
        }
    }

    fn start_read(&self, st: &mut State) {
        if st.reading == 0 {
            st.busy_since = Some(Instant::now());
        }
        st.reading += 1;
    }

    /// Count a finished read and put its layer (or its failure) in the window.
    fn finish_read(&self, st: &mut State, l: usize, result: &Result<(Arc<DecoderLayer>, usize)>) {
        st.reading -= 1;
        if st.reading == 0
            && let Some(since) = st.busy_since.take()
        {
            st.stats.disk_busy_s += since.elapsed().as_secs_f64();
        }
        let slot = match result {
            Ok((layer, disk)) => {
                st.stats.layer_reads += 1;
                st.stats.disk_bytes += *disk as u64;
                Slot::Ready(layer.clone())
            }
            Err(e) => Slot::Failed(e.to_string()),
        };
        if let Some(e) = st.window.get_mut(&l) {
            e.slot = slot;
        }
    }

    /// A reader thread: read the next layer in order while the window has room for it.
    fn read_ahead(&self) {
        let mut st = self.state.lock().expect("layer stream lock");
        loop {
            if st.shutdown {
                return;
            }
            let Some(l) = self.next_to_read(&st) else {
                st = self.changed.wait(st).expect("layer stream lock");
                continue;
            };
            let cost = self.extents[&l].cost();
            st.window.insert(l, Entry { slot: Slot::Reading, cost, held: 0 });
            st.used += cost;
            st.next = (st.next + 1) % self.order.len();
            self.start_read(&mut st);
            drop(st);
            let result = self.read(l);
            st = self.state.lock().expect("layer stream lock");
            self.finish_read(&mut st, l, &result);
            self.changed.notify_all();
        }
    }

    /// The layer at the read-ahead position, if it is not in the window yet and fits in it
    /// (the window is never so small that nothing fits: the plan gives it the largest layer).
    fn next_to_read(&self, st: &State) -> Option<usize> {
        let l = *self.order.get(st.next)?;
        if st.window.contains_key(&l) {
            return None;
        }
        let cost = self.extents[&l].cost();
        (st.used + cost <= self.window_bytes || st.window.is_empty()).then_some(l)
    }

    /// Read layer `l`'s runs and build it over the buffers; the bytes the disk delivered.
    fn read(&self, l: usize) -> Result<(Arc<DecoderLayer>, usize)> {
        let extent = self.extent(l)?;
        let mut disk = 0;
        let io = timeline::now();
        let mut bytes: Vec<Option<WeightBytes>> = vec![None; extent.tensors.len()];
        let ranges: Vec<_> = extent.runs.iter().map(|r| (&self.files[r.file], r.offset, r.len)).collect();
        let reads = read_ranges(&ranges, PARALLEL_READS).map_err(|e| self.error(l, e.to_string()))?;
        for (run, ReadRange { buf, skip, disk_bytes }) in extent.runs.iter().zip(reads) {
            disk += disk_bytes;
            for &t in &run.matrices {
                let start = skip + (extent.tensors[t].offset - run.offset) as usize;
                bytes[t] = Some(WeightBytes::Shared(buf.clone(), start..start + extent.tensors[t].len));
            }
        }
        timeline::record("dense_io", l, None, disk as u64, io);
        let built = timeline::now();
        let source =
            LayerBuffers { extent, bytes: bytes.into_iter().map(|b| b.expect("every tensor is in a run")).collect() };
        let layer = (self.build)(&source, l)?;
        timeline::record("dense_build", l, None, 0, built);
        Ok((Arc::new(layer), disk))
    }
}

/// A streamed layer's tensors, over the buffers they were read into.
struct LayerBuffers<'a> {
    extent: &'a LayerExtent,
    bytes: Vec<WeightBytes>,
}

impl WeightSource for LayerBuffers<'_> {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        Ok(self.extent.tensors.iter().zip(&self.bytes).find(|(t, _)| t.name == name).map(|(t, b)| TensorView {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            bytes: b.as_slice(),
            scale: t.scale,
        }))
    }

    fn linear(&self, weight: &TensorView<'_>, bias: Option<&TensorView<'_>>) -> Result<Linear> {
        let own = self.bytes.iter().find(|b| std::ptr::eq(b.as_slice(), weight.bytes));
        match own {
            Some(b) => Ok(Linear::from_bytes(weight, b.clone(), bias)?),
            None => Ok(Linear::new(weight, bias)?),
        }
    }
}
