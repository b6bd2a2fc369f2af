//! What a model's passes cost by their width, measured as the model runs: the price drafting pays
//! for each guess's row (`draft/schedule.rs`), kept with the model because every stream of it
//! shares one machine.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// Widest pass kept apart; wider ones are counted at this width.
const WIDTHS: usize = 32;

/// Passes of each width whose times are kept: the width's figure is the fastest of them. Another
/// process only ever adds to a pass's wall time (on a loaded machine a pass is preempted, and
/// takes several times as long as its neighbours), so the fastest recent pass is the one nearest
/// to what the pass costs; a median still moves with the load once most passes are preempted
/// (the quote job under load 13-25 measured a row at 0.15 to 0.72 of a pass with medians, at
/// 0.48 in CPU time).
pub(crate) const SAMPLES: usize = 8;

/// A time older than this many passes (of any width) no longer counts: the machine's load when
/// it was taken may be gone, and a width the schedule stopped running must not keep the figure
/// of its last pass for the rest of the answer.
const RECENT: u64 = 128;

/// Passes after the last one of more than one row at which a pass of one guess re-times a row
/// ([`PassCosts::probe_due`]): while the schedule decodes plainly, no wider pass is timed, and a
/// row's cost measured under a passing load would keep guessing off for good.
const PROBE_AFTER: u64 = 32;

/// A width with at least this many recent passes is priced at its own figure where that is below
/// the line ([`PassCosts::guess_costs`]).
pub(crate) const OWN_FIGURE: usize = 3;

/// The wall time of a model's decode and verify passes, by the rows they ran (the fastest of the
/// last [`SAMPLES`] recent passes per width), and the line through them: the time of a one-row
/// pass and of each extra row.
#[derive(Debug, Default)]
pub struct PassCosts {
    timed: Mutex<Timed>,
}

#[derive(Debug, Default)]
struct Timed {
    /// Per width − 1: the last passes' (seconds, number of the pass).
    by_width: Vec<VecDeque<(f64, u64)>>,
    /// Passes timed so far, and the number of the last one of more than one row.
    passes: u64,
    last_wide: Option<u64>,
}

impl Timed {
    /// The fastest of a width's recent times, and how many there are (`None`: none recent).
    fn figure(&self, width: usize) -> Option<(f64, usize)> {
        let recent: Vec<f64> = self
            .by_width
            .get(width)?
            .iter()
            .filter(|&&(_, at)| self.passes - at < RECENT)
            .map(|&(secs, _)| secs)
            .collect();
        let fastest = recent.iter().copied().reduce(f64::min)?;
        Some((fastest, recent.len()))
    }
}

/// A pass's cost as `base_s + per_row_s · (rows − 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostLine {
    pub base_s: f64,
    pub per_row_s: f64,
}

impl CostLine {
    /// An extra row's cost over a one-row pass's.
    pub fn row_cost(&self) -> f64 {
        if self.base_s > 0.0 { self.per_row_s / self.base_s } else { 0.0 }
    }
}

impl PassCosts {
    /// A pass over `rows` rows (after the prompt: decode steps and verify passes) took `secs`.
    pub fn record(&self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() {
            return;
        }
        let mut timed = self.timed.lock().expect("pass costs lock");
        if timed.by_width.is_empty() {
            timed.by_width.resize(WIDTHS, VecDeque::new());
        }
        timed.passes += 1;
        let at = timed.passes;
        if rows > 1 {
            timed.last_wide = Some(at);
        }
        let samples = &mut timed.by_width[rows.min(WIDTHS) - 1];
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back((secs, at));
    }

    /// The fastest of the recent one-row passes, once one was timed (a draft model's guess).
    pub fn one_row_s(&self) -> Option<f64> {
        self.timed.lock().expect("pass costs lock").figure(0).map(|(secs, _)| secs)
    }

    /// Whether a pass of more than one row was timed once but not in the last [`PROBE_AFTER`]
    /// passes: the schedule then runs one guess where it would run none, so that the cost of a
    /// row is measured under the machine's load now.
    pub fn probe_due(&self) -> bool {
        let timed = self.timed.lock().expect("pass costs lock");
        timed.last_wide.is_some_and(|at| timed.passes - at >= PROBE_AFTER)
    }

    /// The least-squares line through the widths with recent passes (each at its figure, weighted
    /// by its recent passes), with a per-row cost of at least zero; `None` until passes of two
    /// widths, one of them a one-row pass, have been timed recently.
    pub fn line(&self) -> Option<CostLine> {
        let timed = self.timed.lock().expect("pass costs lock");
        let points: Vec<(f64, f64, f64)> = (0..timed.by_width.len())
            .filter_map(|w| timed.figure(w).map(|(secs, n)| (w as f64, secs, n as f64)))
            .collect();
        if points.len() < 2 || points[0].0 != 0.0 {
            return None;
        }
        let total: f64 = points.iter().map(|p| p.2).sum();
        let mx = points.iter().map(|p| p.0 * p.2).sum::<f64>() / total;
        let my = points.iter().map(|p| p.1 * p.2).sum::<f64>() / total;
        let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
        let per_row_s = (sxy / sxx).max(0.0);
        Some(CostLine { base_s: (my - per_row_s * mx).max(f64::MIN_POSITIVE), per_row_s })
    }

    /// The cost of a pass with 0 to `max` guesses in one-row passes: the line's, or a width's
    /// own figure over the one-row pass's where it was timed at least [`OWN_FIGURE`] times
    /// recently and costs less, and never less than a narrower pass. A row's cost is not one
    /// figure (the first extra rows share a weight block's decoding), so a line through every
    /// width prices a narrow pass above its cost. A width's own figure only lowers the line's:
    /// a few passes on a loaded machine can be preempted ones, and a narrow width priced too high
    /// would price every wider one as high and stop all guessing (docs/ENGINE.md has the
    /// figures). `None` as [`Self::line`].
    pub fn guess_costs(&self, max: usize) -> Option<Vec<f64>> {
        let line = self.line()?;
        let timed = self.timed.lock().expect("pass costs lock");
        let (one, _) = timed.figure(0)?;
        let mut costs: Vec<f64> = vec![1.0];
        for k in 1..=max {
            let own = timed.figure(k.min(WIDTHS - 1)).filter(|&(_, n)| n >= OWN_FIGURE);
            let on_line = 1.0 + line.row_cost() * k as f64;
            let cost = own.map_or(on_line, |(secs, _)| (secs / one).min(on_line));
            costs.push(cost.max(costs[k - 1]));
        }
        Some(costs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_line_is_fit_through_the_timed_widths() {
        let costs = PassCosts::default();
        assert_eq!(costs.line(), None);
        for _ in 0..4 {
            costs.record(1, 1.0);
        }
        assert_eq!(costs.line(), None, "one width gives no slope");
        for (rows, secs) in [(3, 1.5), (5, 2.0), (9, 3.0)] {
            costs.record(rows, secs);
        }
        let line = costs.line().unwrap();
        assert!((line.base_s - 1.0).abs() < 1e-9 && (line.per_row_s - 0.25).abs() < 1e-9, "{line:?}");
        assert!((line.row_cost() - 0.25).abs() < 1e-9);
        assert_eq!(costs.one_row_s(), Some(1.0));
        assert_eq!(PassCosts::default().one_row_s(), None);
        // A width's figure is the fastest of its recent passes: a slower pass of nine rows does
        // not move it, a faster one does.
        costs.record(9, 8.0);
        assert!((costs.line().unwrap().per_row_s - 0.25).abs() < 1e-9);
        costs.record(9, 2.0);
        assert!(costs.line().unwrap().per_row_s < 0.25);
    }

    #[test]
    fn a_preempted_pass_does_not_move_the_cost_of_a_row() {
        let costs = PassCosts::default();
        for _ in 0..SAMPLES {
            costs.record(1, 1.0);
            costs.record(3, 1.5);
        }
        let before = costs.line().unwrap();
        assert!((before.row_cost() - 0.25).abs() < 1e-9, "{before:?}");
        // Another process held the core: a pass of each width took many times as long.
        costs.record(3, 20.0);
        costs.record(1, 30.0);
        assert_eq!(costs.line(), Some(before));
        // A dearer row that lasts (a longer context) moves the figure once no faster pass is
        // kept (the preempted one took one of the eight places).
        for _ in 0..SAMPLES - 2 {
            costs.record(3, 3.0);
        }
        assert_eq!(costs.line(), Some(before));
        costs.record(3, 3.0);
        assert!((costs.line().unwrap().row_cost() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_width_not_timed_recently_is_probed_then_forgotten() {
        let costs = PassCosts::default();
        assert!(!costs.probe_due(), "nothing wide timed yet: the first guesses time one");
        costs.record(1, 1.0);
        costs.record(3, 3.0);
        assert!((costs.line().unwrap().row_cost() - 1.0).abs() < 1e-9);
        // The schedule stops guessing (a row as dear as a pass): only one-row passes are timed.
        for _ in 0..PROBE_AFTER - 1 {
            costs.record(1, 1.0);
        }
        assert!(!costs.probe_due());
        costs.record(1, 1.0);
        assert!(costs.probe_due(), "{PROBE_AFTER} plain passes since the last wide one");
        // Unprobed, the wide pass's time expires and no row cost is known.
        for _ in 0..RECENT {
            costs.record(1, 1.0);
        }
        assert_eq!(costs.line(), None);
        // A probe of one guess times a row under the load of now.
        costs.record(2, 1.25);
        assert!(!costs.probe_due());
        assert!((costs.line().unwrap().row_cost() - 0.25).abs() < 1e-9);
    }
}
