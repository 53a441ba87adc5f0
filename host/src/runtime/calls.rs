//! Export calls made to one store instance, by function: the conformance
//! suite's coverage and, when metrics are on, the time spent in each.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Counts every call; times them only when the process serves metrics
/// (two clock reads per call are a few percent of a put).
#[derive(Debug)]
pub struct CallStats {
    counts: BTreeMap<&'static str, u64>,
    times: BTreeMap<&'static str, Duration>,
    timed: bool,
}

impl Default for CallStats {
    fn default() -> Self {
        CallStats {
            counts: BTreeMap::new(),
            times: BTreeMap::new(),
            timed: crate::metrics::enabled(),
        }
    }
}

impl CallStats {
    /// A call to `func` begins: counted; its start if timed.
    pub(super) fn begin(&mut self, func: &'static str) -> Option<Instant> {
        *self.counts.entry(func).or_default() += 1;
        self.timed.then(Instant::now)
    }

    /// The call to `func` that [`CallStats::begin`] started has returned.
    pub(super) fn end(&mut self, func: &'static str, started: Option<Instant>) {
        if let Some(t) = started {
            *self.times.entry(func).or_default() += t.elapsed();
        }
    }

    pub fn counts(&self) -> &BTreeMap<&'static str, u64> {
        &self.counts
    }

    /// (function, calls, time in them; zero when untimed).
    pub fn figures(&self) -> Vec<(&'static str, u64, Duration)> {
        self.counts
            .iter()
            .map(|(&f, &n)| (f, n, self.times.get(f).copied().unwrap_or_default()))
            .collect()
    }
}
