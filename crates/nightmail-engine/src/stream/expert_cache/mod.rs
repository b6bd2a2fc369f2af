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
//! Each queued run reserves a map of its length in the buffer pool (nightmail-tensor's `bytes.rs`): the bytes the
//! cache counts for a read not begun are then the evicted experts' maps it will read into, not
//! fresh pages (which each read would fault in and clear, and drop again at eviction: with two
//! cores computing, that took a third of the CPU from a verify pass of 8 rows).

mod config;
mod io_pool;
mod prefetch;
mod slots;
mod stats;

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use nightmail_formats::FormatError;
use nightmail_model::expert_index::ExpertIndex;
use nightmail_model::{Expert, ExpertId, ExpertStore, ExpertWork, ModelError, Result, UseExpert, timeline};
use nightmail_tensor::{reserve_pool, unreserve_pool};

use super::io::ExpertFile;

pub use config::{CachePolicy, StreamConfig};
use io_pool::{Shared, run_lens};
use slots::{Entry, Slot, State};
pub use stats::{FileStats, StreamStats};

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
            queued: 0,
            capacity: config.cache_bytes,
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
        st.stats = StreamStats { cache_budget_bytes: st.capacity as u64, files, ..StreamStats::default() };
        st.seen.clear();
        if st.busy_since.is_some() {
            st.busy_since = Some(std::time::Instant::now());
        }
        for (_, since) in st.file_reading.iter_mut().filter(|(_, s)| s.is_some()) {
            *since = Some(std::time::Instant::now());
        }
    }

    /// Sets the cache's byte budget: smaller, it evicts down to it now (experts a step still
    /// holds go once released), their buffers unmapped beyond the buffer pool's few; larger, it
    /// fills as experts are read. A long prefill lends the cache's room to its activations and
    /// gives it back after (`crate::prefill::cache_bytes_for_pass`).
    pub fn set_capacity(&self, bytes: usize) {
        let mut st = self.shared.state.lock().expect("expert cache lock");
        if st.capacity == bytes {
            return;
        }
        st.capacity = bytes;
        st.stats.cache_budget_bytes = bytes as u64;
        self.shared.evict(&mut st, None);
    }

    /// The cache's byte budget now.
    pub fn capacity(&self) -> usize {
        self.shared.state.lock().expect("expert cache lock").capacity
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
    fn prefetch(&self, ids: &[ExpertId]) {
        self.queue_prefetch(ids);
    }

    fn routed(&self, layer: usize, chosen: &[ExpertId]) {
        self.settle_guesses(layer, chosen);
    }

    fn with_experts(&self, work: &ExpertWork<'_>, use_expert: &UseExpert<'_>) -> Result<()> {
        let ids = work.ids;
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
                let State { entries, demand, prefetch, stats, used, queued, .. } = &mut *st;
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
                        *queued += bytes;
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
        let timed = |i: usize, e: &Expert| {
            let t = timeline::now();
            use_expert(i, e)?;
            timeline::record("expert_compute", layer, Some(ids[i].expert), 0, t);
            Ok::<(), ModelError>(())
        };
        // The ready ones first, then each as its read completes.
        let held = |(i, e): (usize, Arc<Expert>)| (i, Held { expert: Some(e), shared: &self.shared });
        let arriving = (0..pending).map(|_| {
            let (i, e) = arrival(&rx);
            Ok(held((i, e?)))
        });
        work.run(ready.into_iter().map(|x| Ok(held(x))).chain(arriving), &timed)?;
        // The experts this step held may be evicted now.
        let mut st = self.shared.state.lock().expect("expert cache lock");
        self.shared.evict(&mut st, None);
        Ok(())
    }
}

/// The next expert read for a step. A step on the thread pool runs pool work while it waits:
/// its experts computing hold the room the reads wait for (`State::room`), so a step that only
/// slept here, with every pool thread a step waiting alike, would never get it back.
fn arrival<T>(rx: &mpsc::Receiver<T>) -> T {
    loop {
        match rx.try_recv() {
            Ok(x) => return x,
            Err(mpsc::TryRecvError::Disconnected) => panic!("the I/O threads answer every waiter"),
            Err(mpsc::TryRecvError::Empty) => match rayon::yield_now() {
                Some(rayon::Yield::Executed) => {}
                // Nothing to run: wait for the read a short while, then look for work again.
                Some(rayon::Yield::Idle) => {
                    if let Ok(x) = rx.recv_timeout(std::time::Duration::from_micros(200)) {
                        return x;
                    }
                }
                None => return rx.recv().expect("the I/O threads answer every waiter"),
            },
        }
    }
}

/// An expert a step holds. Released, it may be evicted, and a read waiting for the room it took
/// may begin (`State::room_for`).
struct Held<'a> {
    expert: Option<Arc<Expert>>,
    shared: &'a Shared,
}

impl std::ops::Deref for Held<'_> {
    type Target = Expert;
    fn deref(&self) -> &Expert {
        self.expert.as_ref().expect("held until dropped")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        drop(self.expert.take());
        let mut st = self.shared.state.lock().expect("expert cache lock");
        self.shared.evict(&mut st, None);
        drop(st);
        self.shared.work.notify_all();
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
            s.with_experts(&ExpertWork::one_row_each(&[ExpertId { layer: 0, expert }]), &|_, _| Ok(())).unwrap();
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
        s.with_experts(&ExpertWork::one_row_each(&[id]), &|_, _| Ok(())).unwrap();
        s.with_experts(&ExpertWork::one_row_each(&[id]), &|_, _| Ok(())).unwrap();
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
        s.with_experts(&ExpertWork::one_row_each(&this), &|_, _| Ok(())).unwrap();
        s.routed(1, &next);
        s.with_experts(&ExpertWork::one_row_each(&next), &|_, _| Ok(())).unwrap();
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
        s.with_experts(&ExpertWork::one_row_each(&[ExpertId { layer: 2, expert: 0 }]), &|_, _| Ok(())).unwrap();
        let st = s.stats();
        assert_eq!((st.prefetch_reads, st.evictions, st.prefetch_wasted), (2, 1, 1), "{st:?}");
    }

    #[test]
    fn experts_arrive_each_exactly_once_even_when_the_cache_holds_one() {
        let s = store(1, CachePolicy::Lru);
        let ids: Vec<ExpertId> = (0..4).map(|expert| ExpertId { layer: 2, expert }).collect();
        let seen = Mutex::new(vec![0; ids.len()]);
        s.with_experts(&ExpertWork::one_row_each(&ids), &|i, _| {
            seen.lock().unwrap()[i] += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.into_inner().unwrap(), vec![1; 4]);
        assert!(s.stats().cache_used_bytes <= s.stats().cache_budget_bytes);
    }

    /// A step whose experts outgrow the cache streams them through it: a read begins only
    /// where memory has room, experts the step holds counting until released, so memory never
    /// holds more than the budget; each expert is still read once and delivered once.
    #[test]
    fn a_step_larger_than_the_cache_streams_through_it() {
        let s = store(2, CachePolicy::Lru);
        let ids: Vec<ExpertId> = (0..6).map(|expert| ExpertId { layer: 1, expert }).collect();
        let one = s.shared.extent(ids[0]).unwrap().buffer_bytes();
        let seen = Mutex::new(vec![0; ids.len()]);
        let in_memory = || {
            let st = s.shared.state.lock().unwrap();
            (st.used - st.queued, st.reading)
        };
        s.with_experts(&ExpertWork::one_row_each(&ids), &|i, _| {
            // Once the reads settle (a deadline, not a sleep), memory holds the budget at most.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while in_memory().1 > 0 {
                assert!(std::time::Instant::now() < deadline, "the reads never settled");
                std::thread::yield_now();
            }
            let (bytes, _) = in_memory();
            assert!(bytes <= 2 * one, "{bytes} bytes of experts in memory, budget {}", 2 * one);
            seen.lock().unwrap()[i] += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.into_inner().unwrap(), vec![1; ids.len()]);
        let st = s.stats();
        assert_eq!(st.disk_reads, 6, "{st:?}");
        assert!(st.cache_used_bytes <= st.cache_budget_bytes, "{st:?}");
    }

    /// Two steps at once on a pool of two threads, each streaming more experts than its cache
    /// holds: each step's thread runs pool work while it waits for a read, so the experts it
    /// handed out get computed and give back the room the reads wait for. (Steps that only slept
    /// waiting would hold both threads, their experts never computed: a deadlock.)
    #[test]
    fn two_steps_streaming_through_small_caches_share_a_pool_of_two() {
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            let stores = [store(2, CachePolicy::Lru), store(2, CachePolicy::Lru)];
            let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
            let step = |s: &StreamingExperts| {
                let ids: Vec<ExpertId> = (0..8).map(|expert| ExpertId { layer: 1, expert }).collect();
                let ran = std::sync::atomic::AtomicUsize::new(0);
                s.with_experts(&ExpertWork::one_row_each(&ids), &|_, _| {
                    ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                })
                .unwrap();
                ran.into_inner()
            };
            let ran = pool.install(|| rayon::join(|| step(&stores[0]), || step(&stores[1])));
            done.send(ran).unwrap();
        });
        let ran = finished.recv_timeout(std::time::Duration::from_secs(60)).expect("the two steps finish");
        assert_eq!(ran, (8, 8));
    }

    /// An expert larger than the whole budget still runs: alone, when nothing else is in memory.
    #[test]
    fn an_expert_larger_than_the_budget_is_read_when_nothing_else_is_in_memory() {
        let s = store(0, CachePolicy::Lru);
        let ids: Vec<ExpertId> = (0..3).map(|expert| ExpertId { layer: 0, expert }).collect();
        let seen = Mutex::new(vec![0; ids.len()]);
        s.with_experts(&ExpertWork::one_row_each(&ids), &|i, _| {
            seen.lock().unwrap()[i] += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.into_inner().unwrap(), vec![1; ids.len()]);
        assert_eq!(s.stats().disk_reads, 3);
    }

    #[test]
    fn a_smaller_capacity_evicts_down_to_it_and_a_larger_one_keeps_more() {
        let s = store(4, CachePolicy::Lru);
        let one = s.shared.extent(ExpertId { layer: 0, expert: 0 }).unwrap().buffer_bytes() as u64;
        ask(&s, &[0, 1, 2, 3]);
        s.set_capacity(2 * one as usize);
        let st = s.stats();
        assert_eq!((st.cache_used_bytes, st.cache_budget_bytes, st.evictions), (2 * one, 2 * one, 2), "{st:?}");
        // The two most recent stayed.
        s.reset_stats();
        ask(&s, &[2, 3]);
        assert_eq!(s.stats().hits, 2);
        s.set_capacity(4 * one as usize);
        ask(&s, &[0, 1, 2, 3]);
        let st = s.stats();
        assert_eq!((st.hits, st.misses, st.evictions, st.cache_used_bytes), (4, 2, 0, 4 * one), "{st:?}");
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
        let streamed = Mutex::new(vec![Vec::new(); ids.len()]);
        s.with_experts(&ExpertWork::one_row_each(&ids), &|i, e| {
            streamed.lock().unwrap()[i] = out(e);
            Ok(())
        })
        .unwrap();
        let want = Mutex::new(vec![Vec::new(); ids.len()]);
        resident
            .with_experts(&ExpertWork::one_row_each(&ids), &|i, e| {
                want.lock().unwrap()[i] = out(e);
                Ok(())
            })
            .unwrap();
        assert_eq!(streamed.into_inner().unwrap(), want.into_inner().unwrap());
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
            let err = s
                .with_experts(&ExpertWork::one_row_each(&[id]), &|_, _| Ok(()))
                .expect_err("a cut run fails its expert");
            match err {
                ModelError::Format(FormatError::ExpertRead { path: p, layer, expert, reason }) => {
                    assert_eq!((p, layer, expert), (path.clone(), 1, 7), "{reason}");
                    assert!(reason.contains("ends at byte"), "{reason}");
                }
                other => panic!("expected an expert read error, got {other}"),
            }
            assert_eq!(s.stats().cache_used_bytes, 0, "the failed expert is not counted");
        }
        s.with_experts(&ExpertWork::one_row_each(&[ExpertId { layer: 0, expert: 0 }]), &|_, _| Ok(())).unwrap();
    }
}
