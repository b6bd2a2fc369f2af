//! The streaming expert store: routed experts are read from the model file on demand by a pool
//! of I/O threads (many reads in flight, so a layer's top-k arrive in parallel) into a cache with
//! a byte budget. The MoE block gets each expert as soon as its bytes are in, resident ones
//! first, and computes it while the others are still being read.
//!
//! Reads asked for by the block (demand) always go before prefetches, and at most
//! `max_prefetch_in_flight` prefetches run at once, so a wrong guess costs little disk time; a
//! prefetch still queued when its layer's true routes are known is dropped.
//!
//! An expert whose matrices lie apart on disk (an unpacked GGUF: gate, up and down each a slice
//! of its own stacked tensor) is several runs: a queued expert stays at its place in the queue
//! until each of its runs has been taken, each by whichever I/O thread is free, so its pieces are
//! in flight together without a thread made per read, and the thread that finishes its last run
//! builds it.
//!
//! Each queued run reserves a map of its length in the buffer pool (`buf.rs`): the bytes the
//! cache counts for a read not begun are then the evicted experts' maps it will read into, not
//! fresh pages (which each read would fault in and clear, and drop again at eviction: with two
//! cores computing, that took a third of the CPU from a verify pass of 8 rows).

use nightmail_formats::FormatError;
use nightmail_model::ModelError;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use serde::Serialize;

use super::io::{ExpertFile, ReadRange};
use nightmail_model::Result;
use nightmail_model::expert_index::{ExpertExtent, ExpertIndex, aligned_span};
use nightmail_model::timeline;
use nightmail_model::{Expert, ExpertId, ExpertStore};
use nightmail_tensor::Linear;
use nightmail_tensor::TensorView;
use nightmail_tensor::{WeightBytes, reserve_pool, unreserve_pool};

/// Which cached expert to drop when the budget is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used (ties: least recently), with counts that halve as the cache turns
    /// over, so that an expert hot an hour ago does not stay forever.
    Lfu,
}

impl std::str::FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(CachePolicy::Lru),
            "lfu" => Ok(CachePolicy::Lfu),
            other => Err(format!("unknown cache policy `{other}`: use lru or lfu")),
        }
    }
}

/// How experts are streamed.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// The expert cache's budget in bytes (in-flight reads count against it).
    pub cache_bytes: usize,
    pub policy: CachePolicy,
    /// Reads in flight at once.
    pub io_threads: usize,
    /// Experts of the next layer to prefetch from the prediction (0: no prefetch).
    pub prefetch_depth: usize,
    pub max_prefetch_in_flight: usize,
}

impl StreamConfig {
    pub fn with_cache_mb(mb: usize) -> Self {
        StreamConfig {
            cache_bytes: mb << 20,
            policy: CachePolicy::Lru,
            io_threads: 16,
            prefetch_depth: 8,
            max_prefetch_in_flight: 2,
        }
    }
}

/// Counters since the store was made (or since [`StreamingExperts::reset_stats`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    /// Experts the MoE blocks asked for.
    pub requests: u64,
    /// Asked-for experts already in the cache from an earlier request.
    pub hits: u64,
    /// Asked-for experts that a prefetch had read or was reading.
    pub prefetch_hits: u64,
    /// Asked-for experts read on demand.
    pub misses: u64,
    pub disk_reads: u64,
    pub disk_bytes: u64,
    pub prefetch_reads: u64,
    pub prefetch_bytes: u64,
    /// Prefetched experts evicted before any use.
    pub prefetch_wasted: u64,
    pub evictions: u64,
    /// Seconds during which at least one read was in flight.
    pub disk_busy_s: f64,
    pub cache_used_bytes: u64,
    pub cache_budget_bytes: u64,
    /// Per MoE layer (in layer order), the distinct experts asked for.
    pub distinct_experts: Vec<(usize, usize)>,
    /// Per expert file (a striped model's parts, each on its own disk): what was read from it.
    pub files: Vec<FileStats>,
}

/// The reads of one expert file.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FileStats {
    pub path: std::path::PathBuf,
    pub disk_reads: u64,
    pub disk_bytes: u64,
    /// Seconds during which at least one read of this file was in flight.
    pub busy_s: f64,
}

impl FileStats {
    /// The rate its reads achieved while any was in flight.
    pub fn busy_gbps(&self) -> f64 {
        if self.busy_s > 0.0 { self.disk_bytes as f64 / self.busy_s / 1e9 } else { 0.0 }
    }
}

enum Slot {
    Queued { prefetch: bool },
    Reading { prefetch: bool },
    Ready(Arc<Expert>),
}

type Waiter = (mpsc::Sender<(usize, Result<Arc<Expert>>)>, usize);

struct Entry {
    slot: Slot,
    waiters: Vec<Waiter>,
    bytes: usize,
    last_use: u64,
    uses: u64,
    /// Read by a prefetch and not used yet.
    unused_prefetch: bool,
    /// A prefetch for a layer that has not routed yet: never evicted (a prefetch is older, in
    /// use order, than the experts the current layer then asks for, so plain LRU would drop
    /// the next layer's experts first and read them again), and only queued while the budget
    /// has room for it beside everything else that cannot be evicted (or that the layer
    /// computing now still holds).
    ahead: bool,
    /// Its runs' reads, once the first is taken.
    reads: RunReads,
}

/// The reads of one expert's runs (`ExpertExtent::runs`), each taken by some I/O thread.
#[derive(Default)]
struct RunReads {
    /// Runs taken so far (run `taken` is the next to go).
    taken: usize,
    /// Taken and not finished.
    in_flight: usize,
    /// Each run's bytes, by run.
    done: Vec<Option<ReadRange>>,
    disk_bytes: usize,
    /// The first failure; the runs not taken yet are then dropped.
    error: Option<ModelError>,
    /// Whether it counts against `prefetch_in_flight` (started as a prefetch).
    prefetch: bool,
    /// When its first run began (the timeline's span of the expert's read).
    since: Option<std::time::Instant>,
}

impl Entry {
    /// A read not started yet: asked for by `waiter`, or a prefetch when there is none.
    fn queued(bytes: usize, tick: u64, waiter: Option<Waiter>) -> Self {
        let prefetch = waiter.is_none();
        Entry {
            slot: Slot::Queued { prefetch },
            waiters: waiter.into_iter().collect(),
            bytes,
            last_use: tick,
            uses: u64::from(!prefetch),
            unused_prefetch: prefetch,
            ahead: prefetch,
            reads: RunReads::default(),
        }
    }
}

struct State {
    entries: HashMap<ExpertId, Entry>,
    demand: VecDeque<ExpertId>,
    prefetch: VecDeque<ExpertId>,
    prefetch_in_flight: usize,
    /// Prefetches in flight allowed now: `max_prefetch_in_flight` per `prefetch_depth` guesses
    /// the last [`ExpertStore::prefetch`] call made (a verify pass guesses the union of its rows'
    /// routes, which must be read while the layer before computes).
    prefetch_allowed: usize,
    /// The layer that routed last: its experts are being computed, alive whether or not the
    /// cache still counts them.
    routed_layer: Option<usize>,
    used: usize,
    tick: u64,
    stats: StreamStats,
    seen: HashMap<usize, HashSet<usize>>,
    /// Reads in flight, and since when the disk has been busy.
    reading: usize,
    busy_since: Option<std::time::Instant>,
    /// The same per expert file.
    file_reading: Vec<(usize, Option<std::time::Instant>)>,
    shutdown: bool,
}

struct Shared {
    index: ExpertIndex,
    files: Vec<ExpertFile>,
    config: StreamConfig,
    state: Mutex<State>,
    work: Condvar,
}

pub struct StreamingExperts {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl StreamingExperts {
    pub(crate) fn new(index: ExpertIndex, config: StreamConfig) -> Result<Self> {
        let files = index
            .files
            .iter()
            .map(|p| ExpertFile::open(p).map_err(|source| FormatError::Io { path: p.clone(), source }))
            .collect::<Result<Vec<_>, FormatError>>()?;
        // Every extent must lie inside its file: a truncated model fails at load, naming the
        // file and the expert, not at some token hours into a job.
        let mut ids: Vec<_> = index.iter().collect();
        ids.sort_by_key(|(id, _)| **id);
        for (id, extent) in ids {
            for (_, m) in extent.parts() {
                let file = &files[m.file];
                if m.offset + m.len as u64 > file.size() {
                    return Err(FormatError::ExpertRead {
                        path: file.path().to_path_buf(),
                        layer: id.layer,
                        expert: id.expert,
                        reason: format!(
                            "{} ends at byte {} but the file has {} bytes (truncated?)",
                            m.name,
                            m.offset + m.len as u64,
                            file.size()
                        ),
                    }
                    .into());
                }
            }
        }
        let mut state = State {
            entries: HashMap::new(),
            demand: VecDeque::new(),
            prefetch: VecDeque::new(),
            prefetch_in_flight: 0,
            prefetch_allowed: config.max_prefetch_in_flight,
            routed_layer: None,
            used: 0,
            tick: 0,
            stats: StreamStats { cache_budget_bytes: config.cache_bytes as u64, ..StreamStats::default() },
            seen: HashMap::new(),
            reading: 0,
            busy_since: None,
            file_reading: vec![(0, None); files.len()],
            shutdown: false,
        };
        state.stats.files =
            files.iter().map(|f| FileStats { path: f.path().to_path_buf(), ..FileStats::default() }).collect();
        let threads = config.io_threads.max(1);
        let shared = Arc::new(Shared { index, files, config, state: Mutex::new(state), work: Condvar::new() });
        let workers = (0..threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("expert-io-{i}"))
                    .spawn(move || shared.serve(i))
                    .expect("spawn an expert I/O thread")
            })
            .collect();
        Ok(StreamingExperts { shared, workers })
    }

    pub fn stats(&self) -> StreamStats {
        let st = self.shared.state.lock().expect("expert cache lock");
        let mut s = st.stats.clone();
        s.cache_used_bytes = st.used as u64;
        if let Some(since) = st.busy_since {
            s.disk_busy_s += since.elapsed().as_secs_f64();
        }
        for (f, (_, since)) in s.files.iter_mut().zip(&st.file_reading) {
            f.busy_s += since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        }
        let mut distinct: Vec<(usize, usize)> = st.seen.iter().map(|(l, e)| (*l, e.len())).collect();
        distinct.sort();
        s.distinct_experts = distinct;
        s
    }

    pub fn reset_stats(&self) {
        let mut st = self.shared.state.lock().expect("expert cache lock");
        let files = st.stats.files.iter().map(|f| FileStats { path: f.path.clone(), ..FileStats::default() }).collect();
        st.stats =
            StreamStats { cache_budget_bytes: self.shared.config.cache_bytes as u64, files, ..StreamStats::default() };
        st.seen.clear();
        if st.busy_since.is_some() {
            st.busy_since = Some(std::time::Instant::now());
        }
        for (_, since) in st.file_reading.iter_mut().filter(|(_, s)| s.is_some()) {
            *since = Some(std::time::Instant::now());
        }
    }

    /// Whether every expert file is read with direct I/O.
    pub fn is_direct(&self) -> bool {
        self.shared.files.iter().all(ExpertFile::is_direct)
    }
}

impl Drop for StreamingExperts {
    fn drop(&mut self) {
        self.shared.state.lock().expect("expert cache lock").shutdown = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // The runs never taken give their pool reservations back.
        let st = self.shared.state.lock().expect("expert cache lock");
        let untaken = st
            .entries
            .iter()
            .filter(|(_, e)| !matches!(e.slot, Slot::Ready(_)))
            .flat_map(|(id, e)| self.shared.extent(*id).map(|x| run_lens(x, e.reads.taken)).unwrap_or_default())
            .collect::<Vec<_>>();
        drop(st);
        unreserve_pool(&untaken);
    }
}

impl ExpertStore for StreamingExperts {
    fn with_experts(&self, ids: &[ExpertId], use_expert: &mut dyn FnMut(usize, &Expert) -> Result<()>) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        let mut ready = Vec::new();
        let mut pending = 0;
        {
            let mut st = self.shared.state.lock().expect("expert cache lock");
            for (i, &id) in ids.iter().enumerate() {
                st.stats.requests += 1;
                st.seen.entry(id.layer).or_default().insert(id.expert);
                st.tick += 1;
                let tick = st.tick;
                let State { entries, demand, prefetch, stats, used, .. } = &mut *st;
                match entries.get_mut(&id) {
                    Some(e) => {
                        e.last_use = tick;
                        e.uses += 1;
                        e.ahead = false;
                        match &e.slot {
                            Slot::Ready(x) => {
                                if std::mem::take(&mut e.unused_prefetch) {
                                    stats.prefetch_hits += 1;
                                } else {
                                    stats.hits += 1;
                                }
                                ready.push((i, x.clone()));
                            }
                            Slot::Reading { prefetch: was_prefetch } => {
                                if *was_prefetch {
                                    stats.prefetch_hits += 1;
                                    e.unused_prefetch = false;
                                    // Runs of it not taken yet: read them ahead of the guesses.
                                    if let Some(at) = prefetch.iter().position(|p| *p == id) {
                                        prefetch.remove(at);
                                        demand.push_back(id);
                                    }
                                } else {
                                    stats.misses += 1;
                                }
                                e.waiters.push((tx.clone(), i));
                                pending += 1;
                            }
                            Slot::Queued { prefetch: true } => {
                                // Not started: read it now, ahead of the other guesses.
                                prefetch.retain(|p| *p != id);
                                demand.push_back(id);
                                e.slot = Slot::Queued { prefetch: false };
                                e.unused_prefetch = false;
                                stats.misses += 1;
                                e.waiters.push((tx.clone(), i));
                                pending += 1;
                            }
                            Slot::Queued { prefetch: false } => {
                                stats.misses += 1;
                                e.waiters.push((tx.clone(), i));
                                pending += 1;
                            }
                        }
                    }
                    None => {
                        let extent = self.shared.extent(id)?;
                        let bytes = extent.buffer_bytes();
                        reserve_pool(&run_lens(extent, 0));
                        *used += bytes;
                        stats.misses += 1;
                        entries.insert(id, Entry::queued(bytes, tick, Some((tx.clone(), i))));
                        demand.push_back(id);
                        pending += 1;
                    }
                }
            }
        }
        self.shared.work.notify_all();
        let layer = ids.first().map_or(0, |id| id.layer);
        let mut run = |i: usize, e: &Expert| {
            let t = timeline::now();
            use_expert(i, e)?;
            timeline::record("expert_compute", layer, Some(ids[i].expert), 0, t);
            Ok::<(), ModelError>(())
        };
        for (i, e) in ready {
            run(i, &e)?;
        }
        for _ in 0..pending {
            let (i, e) = rx.recv().expect("the I/O threads answer every waiter");
            let e = e?;
            run(i, &e)?;
        }
        // The experts this step held may be evicted now.
        let mut st = self.shared.state.lock().expect("expert cache lock");
        self.shared.evict(&mut st, None);
        Ok(())
    }

    fn prefetch(&self, ids: &[ExpertId]) {
        let mut queued = false;
        {
            let mut st = self.shared.state.lock().expect("expert cache lock");
            // A batch's sequences each guess the next layer: keep one call's worth of guesses
            // queued, not one per sequence (they would crowd out the demand reads). One call
            // may name more: a verify pass's union over its rows, all needed by its next layer.
            let depth = self.shared.config.prefetch_depth.max(1);
            let cap = depth.max(ids.len());
            st.prefetch_allowed = self.shared.config.max_prefetch_in_flight * cap.div_ceil(depth);
            // What the budget must hold besides a new guess: reads queued or in flight, other
            // unrouted guesses, and the experts of the layer computing now.
            let mut pinned: usize = st
                .entries
                .iter()
                .filter(|(id, e)| e.ahead || !matches!(e.slot, Slot::Ready(_)) || st.routed_layer == Some(id.layer))
                .map(|(_, e)| e.bytes)
                .sum();
            for &id in ids {
                if st.prefetch.len() >= cap {
                    break;
                }
                if st.entries.contains_key(&id) {
                    continue;
                }
                let Ok(extent) = self.shared.extent(id) else { continue };
                let bytes = extent.buffer_bytes();
                if pinned + bytes > self.shared.config.cache_bytes {
                    break;
                }
                pinned += bytes;
                reserve_pool(&run_lens(extent, 0));
                st.used += bytes;
                let tick = st.tick;
                st.entries.insert(id, Entry::queued(bytes, tick, None));
                st.prefetch.push_back(id);
                queued = true;
            }
        }
        if queued {
            self.shared.work.notify_all();
        }
    }

    fn routed(&self, layer: usize, chosen: &[ExpertId]) {
        let mut unreserve = Vec::new();
        let mut st = self.shared.state.lock().expect("expert cache lock");
        st.routed_layer = Some(layer);
        let State { entries, prefetch, used, .. } = &mut *st;
        // The layer's guesses are settled: the right ones are about to be used, the wrong ones
        // are cached experts like any other.
        entries.iter_mut().filter(|(id, _)| id.layer == layer).for_each(|(_, e)| e.ahead = false);
        prefetch.retain(|id| {
            // A guess whose first runs are being read is let finish (its buffers are in use).
            let started = entries.get(id).is_some_and(|e| matches!(e.slot, Slot::Reading { .. }));
            let keep = id.layer != layer || chosen.contains(id) || started;
            if !keep && let Some(e) = entries.remove(id) {
                *used -= e.bytes;
                unreserve.extend(self.shared.extent(*id).map(|x| run_lens(x, 0)).unwrap_or_default());
            }
            keep
        });
        drop(st);
        unreserve_pool(&unreserve);
    }
}

/// The map lengths of an expert's runs from run `from` on.
fn run_lens(extent: &ExpertExtent, from: usize) -> Vec<usize> {
    extent.runs[from.min(extent.runs.len())..].iter().map(|r| aligned_span(r.offset, r.len)).collect()
}

impl Shared {
    fn extent(&self, id: ExpertId) -> Result<&ExpertExtent> {
        Ok(self.index.get(id).ok_or_else(|| FormatError::MissingTensor {
            name: format!("expert {} of layer {}", id.expert, id.layer),
        })?)
    }

    fn expert_file(&self, id: ExpertId) -> std::path::PathBuf {
        let file = self.index.get(id).map_or(0, |x| x.matrices[0].file);
        self.index.files[file].clone()
    }

    /// The file an expert is read from (its first matrix's).
    fn file_of(&self, id: ExpertId) -> usize {
        self.index.get(id).map_or(0, |x| x.matrices[0].file)
    }

    /// The next run to read, taken: the first queued expert that lives in file `home`, else the
    /// first of any, from the demand queue, else from the guesses (a new one only while fewer
    /// than `prefetch_allowed` are being read; the rest of one begun may always go). An expert
    /// leaves its queue with its last run. The expert, the run taken and how many it has.
    fn take(&self, st: &mut State, home: usize) -> Option<(ExpertId, usize, usize)> {
        let pick = |queue: &VecDeque<ExpertId>, ok: &dyn Fn(&ExpertId) -> bool| {
            let mine = queue.iter().position(|id| ok(id) && self.file_of(*id) == home);
            mine.or_else(|| queue.iter().position(ok))
        };
        let (demand, at) = match pick(&st.demand, &|_| true) {
            Some(at) => (true, at),
            None => {
                let room = st.prefetch_in_flight < st.prefetch_allowed;
                let begun = |id: &ExpertId| st.entries.get(id).is_some_and(|e| e.reads.taken > 0);
                (false, pick(&st.prefetch, &|id| room || begun(id))?)
            }
        };
        let queue = if demand { &mut st.demand } else { &mut st.prefetch };
        let id = queue[at];
        let Some(entry) = st.entries.get_mut(&id) else {
            queue.remove(at);
            return self.take(st, home);
        };
        let runs = self.extent(id).map_or(1, |x| x.runs.len());
        let run = entry.reads.taken;
        entry.reads.taken += 1;
        entry.reads.in_flight += 1;
        if entry.reads.taken >= runs {
            queue.remove(at);
        }
        if run == 0 {
            let prefetch = matches!(entry.slot, Slot::Queued { prefetch: true });
            entry.slot = Slot::Reading { prefetch };
            entry.reads.prefetch = prefetch;
            entry.reads.done = (0..runs).map(|_| None).collect();
            entry.reads.since = timeline::now();
            if prefetch {
                st.prefetch_in_flight += 1;
            }
        }
        Some((id, run, runs))
    }

    /// I/O thread `i`: take the next run (demand first) and read it; the thread that reads an
    /// expert's last run builds it and hands it to its waiters and the cache. With several
    /// files (a striped model's disks) the threads are dealt out among them, each reading its
    /// own file's experts first, so every disk has its own reads in flight; an idle one helps
    /// with the others'.
    fn serve(&self, i: usize) {
        let home = i % self.files.len().max(1);
        let mut st = self.state.lock().expect("expert cache lock");
        loop {
            if st.shutdown {
                return;
            }
            let Some((id, run, runs)) = self.take(&mut st, home) else {
                st = self.work.wait(st).expect("expert cache lock");
                continue;
            };
            // Its runs after this one are still queued: wake a thread for each at once (a chain
            // of wake-ups would start each a scheduling delay after the one before on a loaded
            // machine).
            for _ in run + 1..runs {
                self.work.notify_one();
            }
            if st.reading == 0 {
                st.busy_since = Some(std::time::Instant::now());
            }
            st.reading += 1;
            let file = self.file_of(id);
            if let Some((reading, since)) = st.file_reading.get_mut(file) {
                if *reading == 0 {
                    *since = Some(std::time::Instant::now());
                }
                *reading += 1;
            }
            drop(st);
            // Its map is in the pool if an eviction left one: the reservation is spent.
            unreserve_pool(&self.extent(id).map(|x| run_lens(x, run)[..1].to_vec()).unwrap_or_default());
            let result = self.read_run(id, run);
            st = self.state.lock().expect("expert cache lock");
            if let Some((reading, since)) = st.file_reading.get_mut(file) {
                *reading -= 1;
                let ended = if *reading == 0 { since.take() } else { None };
                if let (Some(t), Some(f)) = (ended, st.stats.files.get_mut(file)) {
                    f.busy_s += t.elapsed().as_secs_f64();
                }
            }
            st.reading -= 1;
            if st.reading == 0
                && let Some(since) = st.busy_since.take()
            {
                st.stats.disk_busy_s += since.elapsed().as_secs_f64();
            }
            let reads = &mut st.entries.get_mut(&id).expect("an entry being read is never removed").reads;
            reads.in_flight -= 1;
            let mut dropped = false;
            match result {
                Ok(range) => {
                    reads.disk_bytes += range.disk_bytes;
                    reads.done[run] = Some(range);
                }
                Err(e) => {
                    reads.error.get_or_insert(e);
                    // Its other runs need not be read: the expert fails with this one.
                    dropped = reads.taken < runs;
                    if dropped {
                        unreserve_pool(&self.extent(id).map(|x| run_lens(x, reads.taken)).unwrap_or_default());
                    }
                    reads.taken = runs;
                }
            }
            let finished = reads.in_flight == 0 && reads.taken >= runs;
            let reads = finished.then(|| std::mem::take(reads));
            if dropped {
                st.demand.retain(|x| *x != id);
                st.prefetch.retain(|x| *x != id);
            }
            let Some(reads) = reads else { continue };
            drop(st);
            let prefetch = reads.prefetch;
            let disk_bytes = reads.disk_bytes;
            let since = reads.since;
            let result = match reads.error {
                Some(e) => Err(e),
                None => self.build(id, reads.done),
            };
            let what = if prefetch { "prefetch_io" } else { "expert_io" };
            timeline::record(what, id.layer, Some(id.expert), disk_bytes as u64, since);
            st = self.state.lock().expect("expert cache lock");
            if prefetch {
                st.prefetch_in_flight -= 1;
            }
            let entry = st.entries.get_mut(&id).expect("an entry being read is never removed");
            let waiters = std::mem::take(&mut entry.waiters);
            match result {
                Ok(expert) => {
                    let expert = Arc::new(expert);
                    for (tx, i) in waiters {
                        let _ = tx.send((i, Ok(expert.clone())));
                    }
                    entry.slot = Slot::Ready(expert);
                    st.stats.disk_reads += 1;
                    st.stats.disk_bytes += disk_bytes as u64;
                    if let Some(f) = st.stats.files.get_mut(file) {
                        f.disk_reads += 1;
                        f.disk_bytes += disk_bytes as u64;
                    }
                    if prefetch {
                        st.stats.prefetch_reads += 1;
                        st.stats.prefetch_bytes += disk_bytes as u64;
                    }
                    self.evict(&mut st, Some(id));
                }
                Err(e) => {
                    // Each waiter gets its own copy of the error (io::Error is not Clone), naming
                    // the file the expert lives in.
                    let (path, reason) = match &e {
                        ModelError::Format(FormatError::ExpertRead { path, reason, .. }) => {
                            (path.clone(), reason.clone())
                        }
                        other => (self.expert_file(id), other.to_string()),
                    };
                    for (tx, i) in waiters {
                        let err = FormatError::ExpertRead {
                            path: path.clone(),
                            layer: id.layer,
                            expert: id.expert,
                            reason: reason.clone(),
                        };
                        let _ = tx.send((i, Err(ModelError::from(err))));
                    }
                    if let Some(e) = st.entries.remove(&id) {
                        st.used -= e.bytes;
                    }
                }
            }
        }
    }

    /// Drop cached experts until the budget holds, sparing `keep` (just read) while others can go.
    /// An expert a step still holds (waiting for its turn to compute, or computing) is not
    /// dropped: its buffers would stay alive outside the count, and a batch step holds up to
    /// the union of its routes at once (the plan's experts in flight), so the cache would hold
    /// its budget besides them. Its bytes stay counted until it is released and evicted.
    fn evict(&self, st: &mut State, keep: Option<ExpertId>) {
        while st.used > self.config.cache_bytes {
            let victim = st
                .entries
                .iter()
                .filter(|(id, e)| {
                    Some(**id) != keep && !e.ahead && matches!(&e.slot, Slot::Ready(x) if Arc::strong_count(x) == 1)
                })
                .min_by_key(|(_, e)| match self.config.policy {
                    CachePolicy::Lru => (0, e.last_use),
                    CachePolicy::Lfu => (e.uses, e.last_use),
                })
                .map(|(id, _)| *id);
            let Some(victim) = victim else { break };
            let e = st.entries.remove(&victim).expect("victim is cached");
            st.used -= e.bytes;
            st.stats.evictions += 1;
            if e.unused_prefetch {
                st.stats.prefetch_wasted += 1;
            }
        }
        if self.config.policy == CachePolicy::Lfu && st.stats.evictions > 0 && st.stats.evictions.is_multiple_of(1024) {
            st.entries.values_mut().for_each(|e| e.uses /= 2);
        }
    }

    /// Read run `run` of an expert (an error names the expert and its file).
    fn read_run(&self, id: ExpertId, run: usize) -> Result<ReadRange> {
        let run = &self.extent(id)?.runs[run];
        let file = &self.files[run.file];
        Ok(file.read(run.offset, run.len).map_err(|e| FormatError::ExpertRead {
            path: file.path().to_path_buf(),
            layer: id.layer,
            expert: id.expert,
            reason: e.to_string(),
        })?)
    }

    /// Build an expert's matrices over its runs' read buffers (no copy for Q4_0).
    fn build(&self, id: ExpertId, reads: Vec<Option<ReadRange>>) -> Result<Expert> {
        let extent = self.extent(id)?;
        let mut bytes: [Option<WeightBytes>; 6] = Default::default();
        for (run, read) in extent.runs.iter().zip(reads) {
            let ReadRange { buf, skip, .. } = read.expect("every run of a built expert was read");
            for &m in &run.matrices {
                let part = extent.part(m).expect("a run covers parts the expert has");
                let start = skip + (part.offset - run.offset) as usize;
                bytes[m] = Some(WeightBytes::Shared(buf.clone(), start..start + part.len));
            }
        }
        let view = |m: usize| -> Option<(TensorView<'_>, &WeightBytes)> {
            let x = extent.part(m)?;
            let b = bytes[m].as_ref().expect("every part is in a run");
            Some((TensorView { name: x.name.clone(), dtype: x.dtype, shape: x.shape.clone(), bytes: b.as_slice() }, b))
        };
        let linear = |m: usize| -> Result<Linear> {
            let (w, b) = view(m).expect("every expert has its three matrices");
            Ok(Linear::from_bytes(&w, b.clone(), view(m + 3).map(|(v, _)| v).as_ref())?)
        };
        Ok(Expert::new(linear(0)?, linear(1)?, linear(2)?).with_activation(self.index.activation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightmail_formats::ModelFile;
    use nightmail_model::spec::ModelSpec;

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe/model.gguf")
    }

    /// The qwen3_moe fixture's experts, streamed with room for `experts` of them.
    fn store(experts: usize, policy: CachePolicy) -> StreamingExperts {
        store_of(&fixture(), experts, policy)
    }

    fn store_of(path: &std::path::Path, experts: usize, policy: CachePolicy) -> StreamingExperts {
        let ck = ModelFile::open(path).unwrap();
        let spec = ModelSpec::read(&ck).unwrap();
        let index = ExpertIndex::build(&ck, &spec).unwrap();
        let one = index.get(ExpertId { layer: 0, expert: 0 }).unwrap().buffer_bytes();
        let config = StreamConfig {
            cache_bytes: experts * one,
            policy,
            io_threads: 2,
            prefetch_depth: 0,
            max_prefetch_in_flight: 2,
        };
        StreamingExperts::new(index, config).unwrap()
    }

    fn ask(s: &StreamingExperts, experts: &[usize]) {
        for &expert in experts {
            s.with_experts(&[ExpertId { layer: 0, expert }], &mut |_, _| Ok(())).unwrap();
        }
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let s = store(2, CachePolicy::Lru);
        ask(&s, &[0, 1, 0, 2]); // 2 evicts 1, the least recent
        s.reset_stats();
        ask(&s, &[0, 2, 1]);
        let st = s.stats();
        assert_eq!((st.hits, st.misses, st.evictions), (2, 1, 1), "{st:?}");
    }

    #[test]
    fn lfu_keeps_the_frequently_used() {
        let s = store(2, CachePolicy::Lfu);
        ask(&s, &[0, 0, 0, 1, 2]); // 2 evicts 1 (one use) rather than 0 (three)
        s.reset_stats();
        ask(&s, &[0]);
        assert_eq!(s.stats().hits, 1);
        ask(&s, &[1]);
        assert_eq!(s.stats().misses, 1);
    }

    #[test]
    fn a_prefetched_expert_is_a_prefetch_hit_and_read_once() {
        let s = store(8, CachePolicy::Lru);
        let id = ExpertId { layer: 1, expert: 3 };
        s.prefetch(&[id]);
        // Wait (with a deadline) for the prefetch to land: asked for before an I/O thread took
        // it, it would be promoted to a demand read and counted a miss.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while s.stats().prefetch_reads == 0 {
            assert!(std::time::Instant::now() < deadline, "the prefetch never completed");
            std::thread::yield_now();
        }
        s.with_experts(&[id], &mut |_, _| Ok(())).unwrap();
        s.with_experts(&[id], &mut |_, _| Ok(())).unwrap();
        let st = s.stats();
        assert_eq!((st.prefetch_hits, st.hits, st.misses, st.disk_reads), (1, 1, 0, 1), "{st:?}");
        assert_eq!(st.prefetch_reads, 1);
    }

    fn wait_for_prefetch_reads(s: &StreamingExperts, n: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while s.stats().prefetch_reads < n {
            assert!(std::time::Instant::now() < deadline, "the prefetches never completed");
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_next_layers_prefetch_outlives_this_layers_experts_overflowing_the_cache() {
        // A verify pass: the current layer's union fills the cache while the next layer's
        // guesses, read ahead, wait for their layer.
        let s = store(4, CachePolicy::Lru);
        let next: Vec<ExpertId> = (0..2).map(|expert| ExpertId { layer: 1, expert }).collect();
        s.prefetch(&next);
        wait_for_prefetch_reads(&s, 2);
        let this: Vec<ExpertId> = (0..4).map(|expert| ExpertId { layer: 0, expert }).collect();
        s.routed(0, &this);
        s.with_experts(&this, &mut |_, _| Ok(())).unwrap();
        s.routed(1, &next);
        s.with_experts(&next, &mut |_, _| Ok(())).unwrap();
        let st = s.stats();
        assert_eq!((st.prefetch_hits, st.disk_reads, st.prefetch_wasted), (2, 6, 0), "{st:?}");
    }

    #[test]
    fn prefetches_are_queued_only_while_the_budget_holds_them() {
        let s = store(2, CachePolicy::Lru);
        let guesses: Vec<ExpertId> = (0..4).map(|expert| ExpertId { layer: 1, expert }).collect();
        s.prefetch(&guesses);
        let st = s.stats();
        assert!(st.cache_used_bytes <= st.cache_budget_bytes, "{st:?}");
        wait_for_prefetch_reads(&s, 2);
        // Settled wrong, the guesses are cached experts like any other: a new one evicts them.
        s.routed(1, &[]);
        s.with_experts(&[ExpertId { layer: 2, expert: 0 }], &mut |_, _| Ok(())).unwrap();
        let st = s.stats();
        assert_eq!((st.prefetch_reads, st.evictions, st.prefetch_wasted), (2, 1, 1), "{st:?}");
    }

    #[test]
    fn experts_arrive_each_exactly_once_even_when_the_cache_holds_one() {
        let s = store(1, CachePolicy::Lru);
        let ids: Vec<ExpertId> = (0..4).map(|expert| ExpertId { layer: 2, expert }).collect();
        let mut seen = vec![0; ids.len()];
        s.with_experts(&ids, &mut |i, _| {
            seen[i] += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![1; 4]);
        assert!(s.stats().cache_used_bytes <= s.stats().cache_budget_bytes);
    }

    /// A step's experts that arrived while it computes another are alive until it runs them:
    /// the cache counts them (it does not evict a held expert and forget its bytes), and
    /// returns to its budget once the step let them go.
    #[test]
    fn experts_a_step_still_holds_stay_counted_until_released() {
        let s = store(1, CachePolicy::Lru);
        let ids: Vec<ExpertId> = (0..4).map(|expert| ExpertId { layer: 1, expert }).collect();
        let one = s.shared.extent(ids[0]).unwrap().buffer_bytes() as u64;
        let mut first = true;
        s.with_experts(&ids, &mut |_, _| {
            if std::mem::take(&mut first) {
                // Hold the first until the other three are read (a deadline, not a sleep).
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while s.stats().disk_reads < 4 {
                    assert!(std::time::Instant::now() < deadline, "the reads never completed");
                    std::thread::yield_now();
                }
                let st = s.stats();
                assert_eq!(st.cache_used_bytes, 4 * one, "four experts alive, {st:?}");
            }
            Ok(())
        })
        .unwrap();
        let st = s.stats();
        assert!(st.cache_used_bytes <= st.cache_budget_bytes, "{st:?}");
    }

    /// The fixture is an unpacked GGUF: each expert's gate, up and down lie in three stacked
    /// tensors, three runs that two I/O threads take in turns, several experts at once. Each is
    /// built over its buffers exactly as the resident expert is from the mapped file.
    #[test]
    fn experts_of_three_runs_are_built_bit_identical_to_resident_ones() {
        use nightmail_model::ResidentExperts;
        use nightmail_tensor::Numerics;
        let s = store(8, CachePolicy::Lru);
        let ck = ModelFile::open(&fixture()).unwrap();
        let spec = ModelSpec::read(&ck).unwrap();
        let resident = ResidentExperts::load(&ck, &spec).unwrap();
        let x = candle_core::Tensor::randn(0f32, 1.0, (3, spec.hidden_size), &candle_core::Device::Cpu).unwrap();
        let ids: Vec<ExpertId> = (0..8).map(|expert| ExpertId { layer: 1, expert }).collect();
        assert_eq!(s.shared.extent(ids[0]).unwrap().runs.len(), 3, "the fixture's experts lie apart");
        let out = |e: &Expert| -> Vec<u32> {
            let y = e.forward(&x, Numerics::Reference).unwrap();
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        let mut streamed = vec![Vec::new(); ids.len()];
        s.with_experts(&ids, &mut |i, e| {
            streamed[i] = out(e);
            Ok(())
        })
        .unwrap();
        let mut want = vec![Vec::new(); ids.len()];
        resident
            .with_experts(&ids, &mut |i, e| {
                want[i] = out(e);
                Ok(())
            })
            .unwrap();
        assert_eq!(streamed, want);
        let st = s.stats();
        assert_eq!((st.disk_reads, st.misses), (8, 8), "{st:?}");
    }

    /// A run the disk cannot deliver fails its expert, naming the expert and the file, and only
    /// it: the cache forgets it, and the other experts are still read.
    #[test]
    fn a_failed_run_names_its_expert_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::copy(fixture(), &path).unwrap();
        let s = store_of(&path, 8, CachePolicy::Lru);
        let id = ExpertId { layer: 1, expert: 7 };
        let runs = &s.shared.extent(id).unwrap().runs;
        let last = runs.iter().map(|r| r.offset).max().unwrap();
        // Cut the file inside the expert's last run (a disk that fails past a point).
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(last + 1).unwrap();
        for _ in 0..2 {
            let err = s.with_experts(&[id], &mut |_, _| Ok(())).expect_err("a cut run fails its expert");
            match err {
                ModelError::Format(FormatError::ExpertRead { path: p, layer, expert, reason }) => {
                    assert_eq!((p, layer, expert), (path.clone(), 1, 7), "{reason}");
                    assert!(reason.contains("ends at byte"), "{reason}");
                }
                other => panic!("expected an expert read error, got {other}"),
            }
            assert_eq!(s.stats().cache_used_bytes, 0, "the failed expert is not counted");
        }
        s.with_experts(&[ExpertId { layer: 0, expert: 0 }], &mut |_, _| Ok(())).unwrap();
    }
}
