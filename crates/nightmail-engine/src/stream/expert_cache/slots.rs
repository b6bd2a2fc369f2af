//! The cache's slots and its byte budget: each expert's state (queued, being read, ready), who
//! waits for it, and what is evicted when the budget is full.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::mpsc;

use nightmail_model::{Expert, ExpertId, ModelError, Result};

use super::stats::StreamStats;
use crate::stream::io::ReadRange;

pub(super) enum Slot {
    Queued { prefetch: bool },
    Reading { prefetch: bool },
    Ready(Arc<Expert>),
}

pub(super) type Waiter = (mpsc::Sender<(usize, Result<Arc<Expert>>)>, usize);

pub(super) struct Entry {
    pub(super) slot: Slot,
    pub(super) waiters: Vec<Waiter>,
    pub(super) bytes: usize,
    pub(super) last_use: u64,
    pub(super) uses: u64,
    /// Read by a prefetch and not used yet.
    pub(super) unused_prefetch: bool,
    /// A prefetch for a layer that has not routed yet: never evicted (a prefetch is older, in
    /// use order, than the experts the current layer then asks for, so plain LRU would drop
    /// the next layer's experts first and read them again), and only queued while the budget
    /// has room for it beside everything else that cannot be evicted (or that the layer
    /// computing now still holds).
    pub(super) ahead: bool,
    /// Its runs' reads, once the first is taken.
    pub(super) reads: RunReads,
}

/// The reads of one expert's runs (`ExpertExtent::runs`), each taken by some I/O thread.
#[derive(Default)]
pub(super) struct RunReads {
    /// Runs taken so far (run `taken` is the next to go).
    pub(super) taken: usize,
    /// Taken and not finished.
    pub(super) in_flight: usize,
    /// Each run's bytes, by run.
    pub(super) done: Vec<Option<ReadRange>>,
    pub(super) disk_bytes: usize,
    /// The first failure; the runs not taken yet are then dropped.
    pub(super) error: Option<ModelError>,
    /// Whether it counts against `prefetch_in_flight` (started as a prefetch).
    pub(super) prefetch: bool,
    /// When its first run began (the timeline's span of the expert's read).
    pub(super) since: Option<std::time::Instant>,
}

impl State {
    /// Bytes a new read may take now: a budget's worth of experts in memory (being read, or
    /// ready and held or cached), the rest of the budget. A layer whose experts outgrow the
    /// cache then streams through it, each read as room frees, instead of reading its whole
    /// union into memory.
    pub(super) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.used - self.queued)
    }

    /// Whether nothing in memory is an expert a step waits for (only guesses for the next
    /// layer, which wait for this one): a step's own read then begins whatever its size, so an
    /// expert larger than the budget still runs, alone.
    pub(super) fn waits_on_nothing(&self) -> bool {
        !self.entries.values().any(|e| !e.ahead && !matches!(e.slot, Slot::Queued { .. }))
    }
}

impl Entry {
    /// A read not started yet: asked for by `waiter`, or a prefetch when there is none.
    pub(super) fn queued(bytes: usize, tick: u64, waiter: Option<Waiter>) -> Self {
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

pub(super) struct State {
    pub(super) entries: HashMap<ExpertId, Entry>,
    pub(super) demand: VecDeque<ExpertId>,
    pub(super) prefetch: VecDeque<ExpertId>,
    pub(super) prefetch_in_flight: usize,
    /// Prefetches in flight allowed now: `max_prefetch_in_flight` per `prefetch_depth` guesses
    /// the last [`ExpertStore::prefetch`] call made (a verify pass guesses the union of its rows'
    /// routes, which must be read while the layer before computes).
    pub(super) prefetch_allowed: usize,
    /// The layer that routed last: its experts are being computed, alive whether or not the
    /// cache still counts them.
    pub(super) routed_layer: Option<usize>,
    pub(super) used: usize,
    /// Of `used`, the entries queued and not begun: counted against the budget, not in memory.
    pub(super) queued: usize,
    /// The byte budget now: `StreamConfig::cache_bytes`, or what
    /// [`super::StreamingExperts::set_capacity`] set since.
    pub(super) capacity: usize,
    pub(super) tick: u64,
    pub(super) stats: StreamStats,
    pub(super) seen: HashMap<usize, HashSet<usize>>,
    /// Reads in flight, and since when the disk has been busy.
    pub(super) reading: usize,
    pub(super) busy_since: Option<std::time::Instant>,
    /// The same per expert file.
    pub(super) file_reading: Vec<(usize, Option<std::time::Instant>)>,
    pub(super) shutdown: bool,
}
