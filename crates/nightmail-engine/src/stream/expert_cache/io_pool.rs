//! The I/O pool: threads that take queued runs (demand before prefetch), read them into pooled
//! buffers, and build an expert when its last run is in.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use nightmail_formats::FormatError;
use nightmail_model::expert_index::{ExpertExtent, ExpertIndex, aligned_span};
use nightmail_model::{Expert, ExpertId, ModelError, Result, timeline};
use nightmail_tensor::{Linear, TensorView, WeightBytes, unreserve_pool};

use super::config::{CachePolicy, StreamConfig};
use super::slots::{Slot, State};
use crate::stream::io::{ExpertFile, ReadRange};

pub(super) struct Shared {
    pub(super) index: ExpertIndex,
    pub(super) files: Vec<ExpertFile>,
    pub(super) config: StreamConfig,
    pub(super) state: Mutex<State>,
    pub(super) work: Condvar,
}

/// The map lengths of an expert's runs from run `from` on.
pub(super) fn run_lens(extent: &ExpertExtent, from: usize) -> Vec<usize> {
    extent.runs[from.min(extent.runs.len())..].iter().map(|r| aligned_span(r.offset, r.len)).collect()
}

impl Shared {
    /// Drop cached experts until the budget holds, sparing `keep` (just read) while others can go.
    /// An expert a step still holds (waiting for its turn to compute, or computing) is not
    /// dropped: its buffers would stay alive outside the count, and a batch step holds up to
    /// the union of its routes at once (the plan's experts in flight), so the cache would hold
    /// its budget besides them. Its bytes stay counted until it is released and evicted.
    pub(super) fn evict(&self, st: &mut State, keep: Option<ExpertId>) {
        while st.used > st.capacity {
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

    pub(super) fn extent(&self, id: ExpertId) -> Result<&ExpertExtent> {
        Ok(self.index.get(id).ok_or_else(|| FormatError::MissingTensor {
            name: format!("expert {} of layer {}", id.expert, id.layer),
        })?)
    }

    pub(super) fn expert_file(&self, id: ExpertId) -> std::path::PathBuf {
        let file = self.index.get(id).map_or(0, |x| x.matrices[0].file);
        self.index.files[file].clone()
    }

    /// The file an expert is read from (its first matrix's).
    pub(super) fn file_of(&self, id: ExpertId) -> usize {
        self.index.get(id).map_or(0, |x| x.matrices[0].file)
    }

    /// The next run to read, taken: the first queued expert that lives in file `home`, else the
    /// first of any, from the demand queue, else from the guesses (a new one only while fewer
    /// than `prefetch_allowed` are being read; the rest of one begun may always go). An expert
    /// leaves its queue with its last run. The expert, the run taken and how many it has.
    pub(super) fn take(&self, st: &mut State, home: usize) -> Option<(ExpertId, usize, usize)> {
        let pick = |queue: &VecDeque<ExpertId>, ok: &dyn Fn(&ExpertId) -> bool| {
            let mine = queue.iter().position(|id| ok(id) && self.file_of(*id) == home);
            mine.or_else(|| queue.iter().position(ok))
        };
        // An expert begun may always go on; a new one only where memory has room for it, after
        // the cached experts no step holds made what room they can.
        self.evict(st, None);
        let (room, forced) = (st.room(), std::cell::OnceCell::new());
        let begun = |id: &ExpertId| st.entries.get(id).is_some_and(|e| e.reads.taken > 0);
        let fits = |id: &ExpertId, demand: bool| {
            begun(id)
                || st.entries.get(id).is_none_or(|e| e.bytes <= room)
                || (demand && *forced.get_or_init(|| st.waits_on_nothing()))
        };
        let (demand, at) = match pick(&st.demand, &|id| fits(id, true)) {
            Some(at) => (true, at),
            None => {
                let allowed = st.prefetch_in_flight < st.prefetch_allowed;
                (false, pick(&st.prefetch, &|id| begun(id) || (allowed && fits(id, false)))?)
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
            st.queued -= entry.bytes;
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
    pub(super) fn serve(&self, i: usize) {
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

    /// Read run `run` of an expert (an error names the expert and its file).
    pub(super) fn read_run(&self, id: ExpertId, run: usize) -> Result<ReadRange> {
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
    pub(super) fn build(&self, id: ExpertId, reads: Vec<Option<ReadRange>>) -> Result<Expert> {
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
            Some((
                TensorView {
                    name: x.name.clone(),
                    dtype: x.dtype,
                    shape: x.shape.clone(),
                    bytes: b.as_slice(),
                    scale: x.scale,
                },
                b,
            ))
        };
        let linear = |m: usize| -> Result<Linear> {
            let (w, b) = view(m).expect("every expert has its three matrices");
            Ok(Linear::from_bytes(&w, b.clone(), view(m + 3).map(|(v, _)| v).as_ref())?)
        };
        Ok(Expert::new(linear(0)?, linear(1)?, linear(2)?).with_activation(self.index.activation))
    }
}
