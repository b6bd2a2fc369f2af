//! What an answer cost, as a reply states it: the energy the machine drew while writing it and
//! what the same tokens would have cost at a hosted API.
//!
//! Energy comes from Intel/AMD RAPL through Linux's powercap interface
//! (Documentation/power/powercap/powercap.rst: each package zone `intel-rapl:N` has a cumulative
//! `energy_uj` that wraps at `max_energy_range_uj`) when it is readable (root only on most
//! kernels since CVE-2020-8694); otherwise from the `[[model]]` key `watts` times the wall time.
//! RAPL counts the whole package: with other work running at the same time, the figure is an
//! upper bound, and the footer says which source it came from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nightmail_config::ApiPrice;

const POWERCAP: &str = "/sys/class/powercap";

/// The energy of one answer and where the figure came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Energy {
    pub watt_hours: f64,
    pub source: EnergySource,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EnergySource {
    /// Measured by the CPU packages' RAPL counters.
    Rapl,
    /// The configured draw times the wall time.
    Configured { watts: f64 },
}

impl std::fmt::Display for EnergySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnergySource::Rapl => write!(f, "measured by RAPL"),
            EnergySource::Configured { watts } => write!(f, "at the configured {watts} W"),
        }
    }
}

/// One package's counter, read at the start.
#[derive(Debug)]
struct Counter {
    energy: PathBuf,
    range_uj: u64,
    start_uj: u64,
}

/// RAPL readings taken when an answer starts.
#[derive(Debug)]
pub struct EnergyMeter {
    counters: Vec<Counter>,
}

impl EnergyMeter {
    /// RAPL is read through Linux's powercap; elsewhere (macOS has no RAPL interface) the
    /// configured draw is the only source, and the footer says so.
    pub fn start() -> EnergyMeter {
        if cfg!(target_os = "linux") {
            EnergyMeter::start_at(Path::new(POWERCAP))
        } else {
            EnergyMeter { counters: Vec::new() }
        }
    }

    /// The package zones (`intel-rapl:N`, not their `intel-rapl:N:M` sub-zones, which the package
    /// already counts) under `root` whose counters can be read.
    pub fn start_at(root: &Path) -> EnergyMeter {
        let mut counters = Vec::new();
        for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("intel-rapl:") || name.matches(':').count() != 1 {
                continue;
            }
            let zone = entry.path();
            if let (Some(start_uj), Some(range_uj)) =
                (read_u64(&zone.join("energy_uj")), read_u64(&zone.join("max_energy_range_uj")))
            {
                counters.push(Counter { energy: zone.join("energy_uj"), range_uj, start_uj });
            }
        }
        EnergyMeter { counters }
    }

    /// The energy since `start`: RAPL's if every counter still reads, else `watts × wall`.
    pub fn finish(&self, wall: Duration, watts: Option<f64>) -> Option<Energy> {
        let measured: Option<u64> = (!self.counters.is_empty())
            .then(|| {
                self.counters
                    .iter()
                    .map(|c| {
                        let now = read_u64(&c.energy)?;
                        // A counter below its start wrapped once. One that wrapped twice (its
                        // range is about an hour of a 65 W package's draw for 2^32 µJ) would be
                        // undercounted: an answer's attempt is read as one span.
                        Some(if now >= c.start_uj { now - c.start_uj } else { c.range_uj - c.start_uj + now })
                    })
                    .sum()
            })
            .flatten();
        match (measured, watts) {
            (Some(uj), _) => Some(Energy { watt_hours: uj as f64 / 3.6e9, source: EnergySource::Rapl }),
            (None, Some(watts)) => Some(Energy {
                watt_hours: watts * wall.as_secs_f64() / 3600.0,
                source: EnergySource::Configured { watts },
            }),
            (None, None) => None,
        }
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What a hosted API would charge for these tokens, in US dollars (reasoning billed as output).
pub fn api_equivalent(price: &ApiPrice, prompt_tokens: u64, output_tokens: u64) -> f64 {
    (prompt_tokens as f64 * price.input_per_mtok + output_tokens as f64 * price.output_per_mtok) / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(root: &Path, name: &str, energy: u64, range: u64) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("energy_uj"), format!("{energy}\n")).unwrap();
        std::fs::write(dir.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
    }

    #[test]
    fn package_counters_are_summed_and_sub_zones_left_out() {
        let root = tempfile::tempdir().unwrap();
        zone(root.path(), "intel-rapl:0", 1_000_000, u64::from(u32::MAX));
        zone(root.path(), "intel-rapl:0:0", 5, u64::from(u32::MAX));
        zone(root.path(), "intel-rapl:1", 2_000_000, u64::from(u32::MAX));
        let meter = EnergyMeter::start_at(root.path());
        zone(root.path(), "intel-rapl:0", 1_000_000 + 1_800_000_000, u64::from(u32::MAX));
        zone(root.path(), "intel-rapl:0:0", 999_999_999, u64::from(u32::MAX));
        zone(root.path(), "intel-rapl:1", 2_000_000 + 1_800_000_000, u64::from(u32::MAX));
        let energy = meter.finish(Duration::from_secs(60), Some(100.0)).unwrap();
        assert_eq!(energy, Energy { watt_hours: 1.0, source: EnergySource::Rapl }, "3.6 kJ is 1 Wh");
    }

    #[test]
    fn wrapped_counters_are_counted() {
        let root = tempfile::tempdir().unwrap();
        zone(root.path(), "intel-rapl:0", 900, 1000);
        let meter = EnergyMeter::start_at(root.path());
        zone(root.path(), "intel-rapl:0", 100, 1000);
        let wh = meter.finish(Duration::ZERO, None).unwrap().watt_hours;
        assert!((wh - 200.0 / 3.6e9).abs() < 1e-15, "{wh}");
    }

    #[test]
    fn without_rapl_the_configured_draw_is_used_or_nothing_is_said() {
        let root = tempfile::tempdir().unwrap();
        let meter = EnergyMeter::start_at(&root.path().join("absent"));
        let energy = meter.finish(Duration::from_secs(90), Some(40.0)).unwrap();
        assert_eq!(energy, Energy { watt_hours: 1.0, source: EnergySource::Configured { watts: 40.0 } });
        assert_eq!(meter.finish(Duration::from_secs(90), None), None);
    }

    #[test]
    fn the_api_equivalent_bills_prompt_and_output_at_their_prices() {
        let k3 = ApiPrice { input_per_mtok: 3.0, output_per_mtok: 15.0 };
        let usd = api_equivalent(&k3, 200_000, 10_000);
        assert!((usd - 0.75).abs() < 1e-12, "{usd}");
    }
}
