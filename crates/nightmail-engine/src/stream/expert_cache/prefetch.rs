//! Prefetch: guesses of the next layer's experts queued behind demand reads, at most
//! `max_prefetch_in_flight` at once, and dropped when the layer's true routes are known.

use nightmail_model::ExpertId;
use nightmail_tensor::{reserve_pool, unreserve_pool};

use super::StreamingExperts;
use super::io_pool::run_lens;
use super::slots::{Entry, Slot, State};

impl StreamingExperts {
    /// Queue reads of guessed experts, as far as the budget holds them beside what is pinned.
    pub(super) fn queue_prefetch(&self, ids: &[ExpertId]) {
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
                if pinned + bytes > st.capacity {
                    break;
                }
                pinned += bytes;
                reserve_pool(&run_lens(extent, 0));
                st.used += bytes;
                st.queued += bytes;
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

    /// A layer routed: its right guesses are about to be used, its wrong queued ones dropped.
    pub(super) fn settle_guesses(&self, layer: usize, chosen: &[ExpertId]) {
        let mut unreserve = Vec::new();
        let mut st = self.shared.state.lock().expect("expert cache lock");
        st.routed_layer = Some(layer);
        st.tick += 1;
        // The layer's guesses are settled: the wrong ones are cached experts like any other, the
        // right ones the most recently used (the layer asks for them next, and an eviction
        // meanwhile, making room for a read, takes older experts first).
        let tick = st.tick;
        let State { entries, prefetch, used, queued, .. } = &mut *st;
        for (id, e) in entries.iter_mut().filter(|(id, _)| id.layer == layer) {
            e.ahead = false;
            if chosen.contains(id) {
                e.last_use = tick;
            }
        }
        prefetch.retain(|id| {
            // A guess whose first runs are being read is let finish (its buffers are in use).
            let started = entries.get(id).is_some_and(|e| matches!(e.slot, Slot::Reading { .. }));
            let keep = id.layer != layer || chosen.contains(id) || started;
            if !keep && let Some(e) = entries.remove(id) {
                *used -= e.bytes;
                if matches!(e.slot, Slot::Queued { .. }) {
                    *queued -= e.bytes;
                }
                unreserve.extend(self.shared.extent(*id).map(|x| run_lens(x, 0)).unwrap_or_default());
            }
            keep
        });
        drop(st);
        unreserve_pool(&unreserve);
    }
}
