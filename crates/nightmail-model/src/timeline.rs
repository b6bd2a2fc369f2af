//! A timeline of a decode, for `model bench --timeline FILE`: when each dense layer and expert
//! read was in flight, and what the step was doing meanwhile (waiting for a layer, attention,
//! routing, waiting for or computing experts). It shows where the disk idles and why, which
//! counters of busy seconds cannot (the time a decode spends over its I/O floor). Off unless a bench
//! turns it on; then each span costs a lock and a push.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;

/// One interval of the timeline, in microseconds since [`start`].
#[derive(Debug, Clone, Serialize)]
pub struct Span {
    /// `dense_io`, `dense_build`, `dense_wait`, `dense_release` (a step handing a streamed
    /// layer back), `expert_io`, `prefetch_io`, `attention` (with the wait for its layer),
    /// `route`, `experts` (the whole wait-and-compute of a MoE block's routed experts),
    /// `expert_compute`, `head`, `step` (a decode step or a verify pass, with its `rows`).
    pub what: &'static str,
    pub layer: usize,
    /// The expert, for expert spans.
    pub expert: Option<usize>,
    /// The bytes read, for I/O spans.
    pub bytes: u64,
    /// The rows a `step` ran (a verify pass's width; 1 for a decode step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<usize>,
    pub start_us: u64,
    pub end_us: u64,
}

static ON: AtomicBool = AtomicBool::new(false);
static TIMELINE: Mutex<Option<(Instant, Vec<Span>)>> = Mutex::new(None);

/// Start recording (dropping anything recorded before).
pub fn start() {
    *TIMELINE.lock().expect("timeline lock") = Some((Instant::now(), Vec::new()));
    ON.store(true, Ordering::Release);
}

/// Stop recording and take the spans, in the order they ended.
pub fn stop() -> Vec<Span> {
    ON.store(false, Ordering::Release);
    TIMELINE.lock().expect("timeline lock").take().map(|(_, spans)| spans).unwrap_or_default()
}

/// The start of a span, when recording.
pub fn now() -> Option<Instant> {
    ON.load(Ordering::Acquire).then(Instant::now)
}

/// Record a span from `since` (from [`now`]) to this moment.
pub fn record(what: &'static str, layer: usize, expert: Option<usize>, bytes: u64, since: Option<Instant>) {
    push(what, layer, expert, bytes, None, since);
}

/// Record a `step` of `rows` rows from `since` to this moment.
pub fn record_step(rows: usize, since: Option<Instant>) {
    push("step", 0, None, 0, Some(rows), since);
}

fn push(
    what: &'static str,
    layer: usize,
    expert: Option<usize>,
    bytes: u64,
    rows: Option<usize>,
    since: Option<Instant>,
) {
    let Some(since) = since else { return };
    let end = Instant::now();
    if let Some((origin, spans)) = TIMELINE.lock().expect("timeline lock").as_mut() {
        let us = |t: Instant| t.saturating_duration_since(*origin).as_micros() as u64;
        spans.push(Span { what, layer, expert, bytes, rows, start_us: us(since), end_us: us(end) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_recorded_only_between_start_and_stop() {
        // Other tests' streams may record while this one runs: only this test's kind is counted.
        record("test_span", 1, None, 0, now());
        start();
        let t = now();
        assert!(t.is_some());
        record("test_span", 2, Some(5), 4096, t);
        let spans: Vec<Span> = stop().into_iter().filter(|s| s.what == "test_span").collect();
        assert_eq!(spans.len(), 1, "{spans:?}");
        let s = &spans[0];
        assert_eq!((s.layer, s.expert, s.bytes), (2, Some(5), 4096));
        assert!(s.start_us <= s.end_us);
        assert!(now().is_none());
    }
}
