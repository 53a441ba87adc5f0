//! Crash points: named instants at which a test can end the process
//! abruptly (abort: no destructors, no flush), to prove that recovery copes
//! with a crash at exactly that instant.
//!
//! A point is selected with `--crash-at POINT` or `TXSTORE_CRASH_AT=POINT`:
//! - a protocol step, `NAME` or `NAME@K` (the K-th time it is reached,
//!   default 1): see [`STEPS`];
//! - `commit-call:N` / `recover-call:N`: just before the N-th storage call
//!   the guest makes inside `commit` / `recover` (counted over the whole
//!   process, from 1).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The protocol steps, in the order one commit reaches them.
pub const STEPS: &[&str] = &[
    "after-write",
    "after-changelog-commit",
    "after-store-commit",
    "after-checkpoint",
    "during-restore",
];

/// Name of the environment variable that selects a crash point.
pub const ENV: &str = "TXSTORE_CRASH_AT";

/// A parsed crash point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    Step { name: String, occurrence: u64 },
    CommitCall(u64),
    RecoverCall(u64),
}

impl std::str::FromStr for CrashPoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let count = |n: &str| -> Result<u64, String> {
            match n.parse::<u64>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!("crash point `{s}`: `{n}` is not a count from 1")),
            }
        };
        if let Some(n) = s.strip_prefix("commit-call:") {
            return Ok(CrashPoint::CommitCall(count(n)?));
        }
        if let Some(n) = s.strip_prefix("recover-call:") {
            return Ok(CrashPoint::RecoverCall(count(n)?));
        }
        let (name, occurrence) = match s.split_once('@') {
            Some((name, k)) => (name, count(k)?),
            None => (s, 1),
        };
        if !STEPS.contains(&name) {
            return Err(format!(
                "unknown crash point `{s}`: expected one of {}, commit-call:N or recover-call:N (a step may end in @K)",
                STEPS.join(", ")
            ));
        }
        Ok(CrashPoint::Step {
            name: name.to_string(),
            occurrence,
        })
    }
}

impl std::fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CrashPoint::Step {
                name,
                occurrence: 1,
            } => write!(f, "{name}"),
            CrashPoint::Step { name, occurrence } => write!(f, "{name}@{occurrence}"),
            CrashPoint::CommitCall(n) => write!(f, "commit-call:{n}"),
            CrashPoint::RecoverCall(n) => write!(f, "recover-call:{n}"),
        }
    }
}

static ARMED: OnceLock<Option<CrashPoint>> = OnceLock::new();
static STEP_HITS: AtomicU64 = AtomicU64::new(0);
static COMMIT_CALLS: AtomicU64 = AtomicU64::new(0);
static RECOVER_CALLS: AtomicU64 = AtomicU64::new(0);

/// Arms `point` for this process (first call wins). `None` reads the
/// environment variable.
pub fn arm(point: Option<CrashPoint>) -> Result<(), String> {
    let point = match point {
        Some(p) => Some(p),
        None => match std::env::var(ENV) {
            Ok(s) if !s.is_empty() => Some(s.parse()?),
            _ => None,
        },
    };
    let _ = ARMED.set(point);
    Ok(())
}

fn armed() -> Option<&'static CrashPoint> {
    ARMED.get().and_then(Option::as_ref)
}

fn crash(point: &CrashPoint) -> ! {
    eprintln!("txstore: crash point {point} reached: aborting");
    std::process::abort()
}

/// Marks protocol step `name`; aborts if it is the armed point.
pub fn step(name: &'static str) {
    debug_assert!(STEPS.contains(&name), "unknown step {name}");
    if let Some(
        p @ CrashPoint::Step {
            name: armed,
            occurrence,
        },
    ) = armed()
    {
        if armed == name && STEP_HITS.fetch_add(1, Ordering::Relaxed) + 1 == *occurrence {
            crash(p);
        }
    }
}

/// Which guest call a storage call happens inside, for call counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Commit,
    Recover,
    Other,
}

/// Counts one storage call made in `phase`; aborts before it if it is the
/// armed one. Returns the call's number within its phase (0 for `Other`).
pub fn storage_call(phase: Phase) -> u64 {
    let n = match phase {
        Phase::Commit => COMMIT_CALLS.fetch_add(1, Ordering::Relaxed) + 1,
        Phase::Recover => RECOVER_CALLS.fetch_add(1, Ordering::Relaxed) + 1,
        Phase::Other => return 0,
    };
    match (armed(), phase) {
        (Some(p @ CrashPoint::CommitCall(k)), Phase::Commit) if *k == n => crash(p),
        (Some(p @ CrashPoint::RecoverCall(k)), Phase::Recover) if *k == n => crash(p),
        _ => n,
    }
}

/// Storage calls counted so far inside `commit` and inside `recover`.
pub fn call_counts() -> (u64, u64) {
    (
        COMMIT_CALLS.load(Ordering::Relaxed),
        RECOVER_CALLS.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse_and_print_back() {
        for s in [
            "after-write",
            "after-store-commit@3",
            "commit-call:7",
            "recover-call:1",
        ] {
            assert_eq!(s.parse::<CrashPoint>().unwrap().to_string(), s);
        }
        for bad in [
            "after-nothing",
            "commit-call:0",
            "commit-call:x",
            "after-write@0",
        ] {
            assert!(bad.parse::<CrashPoint>().is_err(), "{bad} accepted");
        }
    }
}
