//! When this process's leases expire, timed on a clock that stops while the machine sleeps.
//!
//! A lease's expiry is also written into the job (for `status`), on the wall clock. But a laptop
//! suspended for longer than a lease wakes with the wall clock past every expiry, and a sweep that
//! judged by it would requeue a job whose worker is alive and about to renew: two attempts would
//! then write the same checkpoint. So the sweep judges the leases this process granted by their
//! deadline on `CLOCK_MONOTONIC` (Linux: "does not count time that the system is suspended",
//! clock_gettime(2)) or `CLOCK_UPTIME_RAW` (macOS, which stops while asleep), where a suspend
//! takes no time: a lease expires only after `lease_for` of the holder's own running time without
//! a renewal. Leases of an earlier process are all requeued at start-up (sled admits one process),
//! so the wall-clock expiry matters only for a job this process did not lease.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::JobId;

/// Time the machine has been awake (not suspended), from an arbitrary start.
pub(crate) fn awake() -> Duration {
    #[cfg(target_os = "macos")]
    const CLOCK: libc::clockid_t = libc::CLOCK_UPTIME_RAW;
    #[cfg(not(target_os = "macos"))]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill; both clocks exist on their systems.
    let rc = unsafe { libc::clock_gettime(CLOCK, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed: {}", std::io::Error::last_os_error());
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The awake-time deadline of each lease this process holds, by job and lease token.
#[derive(Default)]
pub(crate) struct LeaseClock {
    deadlines: Mutex<HashMap<JobId, (u64, Duration)>>,
}

impl LeaseClock {
    fn deadlines(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, (u64, Duration)>> {
        self.deadlines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A lease granted or renewed now for `lease_for`.
    pub(crate) fn hold(&self, job: JobId, token: u64, lease_for: Duration) {
        self.deadlines().insert(job, (token, awake().saturating_add(lease_for)));
    }

    /// The lease ended (finished, failed, cancelled or requeued).
    pub(crate) fn release(&self, job: JobId) {
        self.deadlines().remove(&job);
    }

    /// Whether the lease `token` on `job` has run out of awake time; `None` when this process did
    /// not grant it.
    pub(crate) fn expired(&self, job: JobId, token: u64) -> Option<bool> {
        match self.deadlines().get(&job) {
            Some(&(held, deadline)) if held == token => Some(awake() >= deadline),
            _ => None,
        }
    }
}
