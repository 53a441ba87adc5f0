//! Which cases to run: the crash points a clean run's summary says exist,
//! chosen for one depth of the exploration.
//!
//! The default run goes twice over a guest: a quick pass (every protocol
//! step, commit and kind of I/O call crashed once or twice, in every mode
//! and under both guarantees: most bugs show here, within a minute) and
//! then the full pass, which spreads more points over the same ground; a
//! case the quick pass ran is not run again.

use super::{child, CHECKS};

/// How deep one pass of the exploration goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Depth {
    /// Steps of the workload.
    pub ops: usize,
    /// Crash points per protocol step, evenly spread, first and last
    /// included.
    pub max_points: usize,
    /// Crash points among the storage calls of every `commit`.
    pub commit_points: usize,
    /// More `after-write` points where storage holds writes of the open
    /// transaction (an even spread can miss them).
    pub dirty_points: usize,
    /// Second crashes per crashed state, spread over the storage calls of
    /// its recovery (`None`: every one).
    pub recovery_points: Option<usize>,
    /// Seeded power losses per crash point that had a choice.
    pub power_seeds: u64,
    /// Further seeds, each crashed at `random_points` random points.
    pub random_seeds: u64,
    pub random_points: usize,
    /// Injected errors per kind of I/O call.
    pub io_points: usize,
}

impl Depth {
    /// The quick pass.
    pub const QUICK: Depth = Depth {
        // The prologue's shapes and a few commits, before the heavy
        // record: a guest that is slow with thousands of keys in one
        // transaction still gets its quick verdict in a minute.
        ops: 40,
        max_points: 2,
        // Enough to fall inside a commit, between its first write and its
        // last, where an atomicity or idempotence bug shows.
        commit_points: 8,
        dirty_points: 2,
        recovery_points: Some(4),
        power_seeds: 1,
        random_seeds: 0,
        random_points: 0,
        io_points: 2,
    };

    /// The most `after-write` points a full pass adds where storage holds
    /// writes of the open transaction.
    pub const DIRTY_POINTS: usize = 8;

    /// This depth, no deeper than `other` anywhere (the quick pass within
    /// a narrowed run: `--max-points 0` runs no crash in either pass).
    pub fn within(&self, other: &Depth) -> Depth {
        Depth {
            ops: self.ops.min(other.ops),
            max_points: self.max_points.min(other.max_points),
            commit_points: self.commit_points.min(other.commit_points),
            dirty_points: self.dirty_points.min(other.dirty_points),
            recovery_points: match (self.recovery_points, other.recovery_points) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            power_seeds: self.power_seeds.min(other.power_seeds),
            random_seeds: self.random_seeds.min(other.random_seeds),
            random_points: self.random_points.min(other.random_points),
            io_points: self.io_points.min(other.io_points),
        }
    }

    /// A full pass at `max_points` per step.
    pub fn full(
        ops: usize,
        max_points: usize,
        recovery_points: Option<usize>,
        power_seeds: u64,
        random_seeds: u64,
        random_points: usize,
    ) -> Depth {
        Depth {
            ops,
            max_points,
            commit_points: max_points,
            dirty_points: max_points.min(Self::DIRTY_POINTS),
            recovery_points,
            power_seeds,
            random_seeds,
            random_points,
            io_points: max_points.min(16),
        }
    }
}

/// The second crashes of a crashed state whose recovery reaches `points`
/// (`recover-call:N` in order, then `during-restore` if reached): the
/// storage calls spread to the depth, `during-restore` always.
pub(super) fn recovery_points(points: &[String], depth: &Depth) -> Vec<String> {
    let calls: Vec<&String> = points
        .iter()
        .filter(|p| p.starts_with("recover-call:"))
        .collect();
    let keep = depth.recovery_points.unwrap_or(calls.len());
    let mut chosen: Vec<String> = spread(calls.len() as u64, keep)
        .into_iter()
        .map(|i| calls[i as usize - 1].clone())
        .collect();
    chosen.extend(
        points
            .iter()
            .filter(|p| !p.starts_with("recover-call:"))
            .cloned(),
    );
    chosen
}

/// Up to `max` of `1..=n`, evenly spread, always with the first and last
/// (with room for two).
pub(super) fn spread(n: u64, max: usize) -> Vec<u64> {
    if n as usize <= max || max < 2 {
        return (1..=n).take(max).collect();
    }
    let mut v: Vec<u64> = (0..max)
        .map(|i| 1 + i as u64 * (n - 1) / (max as u64 - 1))
        .collect();
    v.dedup();
    v
}

/// The first crash points a clean run's summary says exist, each also as
/// `+flush` (the crash keeps every write, synced or not) and as `+power`
/// (a machine crash that keeps only what was synced).
pub(super) fn first_points(
    s: &child::Summary,
    depth: &Depth,
    modes: &[String],
) -> Vec<(String, &'static str)> {
    let lossy = lossy_points(s, depth);
    let mut points = Vec::new();
    for (mode, suffix) in [("lossy", ""), ("+flush", "+flush"), ("power", "+power")] {
        if modes.iter().any(|m| m == mode) {
            points.extend(
                lossy
                    .iter()
                    .map(|(p, check)| (format!("{p}{suffix}"), *check)),
            );
        }
    }
    points
}

/// After an abort inside the changelog's fsync, the page cache still holds
/// a commit frame that is not durable. The next start must make what it
/// trusts durable before a store commit or the resumed input depends on
/// it: a power loss right after recovery returns tells. (Not at the next
/// write: a workload step that commits first would sync the frame and hide
/// a recovery that never did.)
pub(super) fn after_restart_points(s: &child::Summary, max: usize) -> Vec<Vec<String>> {
    let count = s
        .steps
        .iter()
        .find(|(n, _)| n == "before-changelog-sync")
        .map_or(0, |(_, c)| *c);
    spread(count, max)
        .into_iter()
        .map(|k| {
            let first = if k == 1 {
                "before-changelog-sync".to_string()
            } else {
                format!("before-changelog-sync@{k}")
            };
            vec![first, "after-recovery+power".to_string()]
        })
        .collect()
}

fn lossy_points(s: &child::Summary, depth: &Depth) -> Vec<(String, &'static str)> {
    let max = depth.max_points;
    let mut points = Vec::new();
    for (name, count) in &s.steps {
        for k in spread(*count, max) {
            let p = if k == 1 {
                name.clone()
            } else {
                format!("{name}@{k}")
            };
            points.push((p, CHECKS[2]));
        }
    }
    // Where storage holds writes of the open transaction, which an even
    // spread can miss: up to `dirty_points` more, spread over those.
    let dirty = &s.dirty_after_writes;
    for i in spread(dirty.len() as u64, depth.dirty_points) {
        let k = dirty[i as usize - 1];
        let p = if k == 1 {
            "after-write".to_string()
        } else {
            format!("after-write@{k}")
        };
        if !points.iter().any(|(q, _)| *q == p) {
            points.push((p, CHECKS[2]));
        }
    }
    for n in spread(s.commit_calls, depth.commit_points) {
        points.push((format!("commit-call:{n}"), CHECKS[3]));
    }
    points
}

/// The injected errors a clean run's summary says can happen: the N-th
/// call of every kind, spread over up to `max` calls per kind.
pub(super) fn io_error_specs(s: &child::Summary, max: usize) -> Vec<String> {
    let count = |class: &str| {
        s.io_calls
            .iter()
            .find(|(c, _)| c == class)
            .map_or(0, |(_, n)| *n)
    };
    let mut specs = Vec::new();
    for kind in crate::fault::KINDS {
        let class = match *kind {
            "write-enospc" | "write-short" => "write",
            k => k,
        };
        for n in spread(count(class), max) {
            specs.push(format!("{kind}:{n}"));
        }
    }
    specs
}

#[cfg(test)]
mod tests {
    use super::{child, lossy_points, recovery_points, spread, Depth};

    #[test]
    fn crash_points_reach_writes_of_the_open_transaction() {
        // 1,000 after-writes, storage holding open writes at only 500..=520:
        // an even spread of three misses them all; the dirty points do not.
        let s = child::Summary {
            steps: vec![("after-write".into(), 1000)],
            dirty_after_writes: (500..=520).collect(),
            ..Default::default()
        };
        let depth = Depth::full(200, 3, None, 0, 0, 0);
        let points: Vec<String> = lossy_points(&s, &depth)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            points,
            [
                "after-write",
                "after-write@500",
                "after-write@1000",
                "after-write@510",
                "after-write@520"
            ]
        );
        // At most DIRTY_POINTS more (fewer where the two spreads meet).
        let many = lossy_points(&s, &Depth::full(200, 64, None, 0, 0, 0)).len();
        assert!(many > 64 && many <= 64 + Depth::DIRTY_POINTS, "{many}");
    }

    #[test]
    fn spread_keeps_ends_and_bound() {
        assert_eq!(spread(3, 10), vec![1, 2, 3]);
        let s = spread(1000, 10);
        assert_eq!(s.len(), 10);
        assert_eq!((s[0], s[9]), (1, 1000));
        assert!(spread(0, 5).is_empty());
        // `--max-points 1` or 0.
        assert_eq!(spread(1000, 1), vec![1]);
        assert!(spread(1000, 0).is_empty());
    }

    #[test]
    fn recovery_points_spread_the_calls_and_keep_the_restore() {
        let points: Vec<String> = (1..=10)
            .map(|n| format!("recover-call:{n}"))
            .chain(["during-restore".to_string()])
            .collect();
        assert_eq!(
            recovery_points(&points, &Depth::QUICK),
            [
                "recover-call:1",
                "recover-call:4",
                "recover-call:7",
                "recover-call:10",
                "during-restore"
            ]
        );
        assert_eq!(
            recovery_points(&points, &Depth::full(200, 16, None, 0, 0, 0)),
            points
        );
    }
}
