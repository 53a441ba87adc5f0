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
//!
//! A point may end in a mode that says what the crash keeps:
//! - nothing (lossy): an abort. Storage loses every write not yet synced
//!   (RocksDB runs without a WAL), but the host's own files keep every byte
//!   written, since the page cache survives a process crash;
//! - `+flush`: storage first flushes every write it holds, then aborts: the
//!   other end of the durability model (a crash may keep any prefix of the
//!   write history, synced or not), which shows uncommitted writes a
//!   strategy failed to undo;
//! - `+power` / `+power:SEED`: a simulated machine crash (power cut, kernel
//!   panic). The host's files go back to what fsync made durable
//!   ([`crate::file`]); storage keeps only its synced writes. With a seed,
//!   a random choice among what the hardware may also keep: some of the
//!   4 KiB pages written since the last fsync (others zero or old), and a
//!   random prefix of the unsynced storage write batches;
//! - `+stall:MS`: no crash: the thread stops there for MS milliseconds and
//!   goes on, as on a slow disk or a stalled machine (a restore longer
//!   than the consumer group allows a member to be silent).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The protocol steps, in the order one commit reaches them.
pub const STEPS: &[&str] = &[
    "after-write",
    // The task's write cache reached the guest in one call, and its
    // records the changelog's open transaction.
    "after-flush",
    // A file output's index line is appended (in the page cache), not yet
    // fsynced: a power cut may leave it torn.
    "before-output-index-sync",
    // The commit frame is written (in the page cache), not yet fsynced.
    "before-changelog-sync",
    "after-changelog-commit",
    "after-store-commit",
    "after-checkpoint",
    "during-restore",
    // Recovery has returned and its caller acts on it (the conformance
    // child records the recovered position as acknowledged): whatever
    // recovery trusted must be durable by now.
    "after-recovery",
    // A clean shutdown has returned (checkpoint written): a crash here must
    // not turn it into an unclean one.
    "after-close",
    // `txstore migrate` (task::migrate): the new store is filled but not
    // yet checked; it is checked and its manifest written; the commit
    // point has passed; the old store is moved aside; the new one is in
    // place. Before the commit point the old store stays the store.
    "migrate-copied",
    "migrate-built",
    "migrate-committed",
    "migrate-old-moved",
    "migrate-new-moved",
    // The changelog cleaner (changelog::clean): a clean is built and
    // durable, nothing replaced yet; it is renamed over the first segment
    // (the commit point), the segments it covers not yet removed.
    "clean-built",
    "clean-installed",
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

/// What a crash keeps (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Lossy,
    Flush,
    /// A simulated machine crash; the seed picks what unsynced data the
    /// hardware kept (none: nothing unsynced is kept).
    Power(Option<u64>),
    /// No crash: a pause of this many milliseconds.
    Stall(u64),
}

/// A crash point as armed: where, and what the crash keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Armed {
    pub point: CrashPoint,
    pub mode: Mode,
}

impl std::str::FromStr for Armed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_suffix("+flush") {
            return Ok(Armed {
                point: p.parse()?,
                mode: Mode::Flush,
            });
        }
        if let Some((p, ms)) = s.split_once("+stall:") {
            let ms = ms.parse::<u64>().map_err(|_| {
                format!("crash point `{s}`: `{ms}` is not milliseconds (+stall:MS)")
            })?;
            return Ok(Armed {
                point: p.parse()?,
                mode: Mode::Stall(ms),
            });
        }
        if let Some((p, power)) = s.split_once("+power") {
            let seed = match power.strip_prefix(':') {
                None if power.is_empty() => None,
                Some(n) => Some(n.parse::<u64>().map_err(|_| {
                    format!("crash point `{s}`: `{n}` is not a seed (+power:SEED)")
                })?),
                None => return Err(format!("crash point `{s}`: expected +power or +power:SEED")),
            };
            return Ok(Armed {
                point: p.parse()?,
                mode: Mode::Power(seed),
            });
        }
        Ok(Armed {
            point: s.parse()?,
            mode: Mode::Lossy,
        })
    }
}

impl std::fmt::Display for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.point)?;
        match self.mode {
            Mode::Lossy => Ok(()),
            Mode::Flush => write!(f, "+flush"),
            Mode::Power(None) => write!(f, "+power"),
            Mode::Power(Some(seed)) => write!(f, "+power:{seed}"),
            Mode::Stall(ms) => write!(f, "+stall:{ms}"),
        }
    }
}

type FlushHook = Box<dyn Fn() + Send + Sync>;
/// Applies a power loss to one part of the state (given the seed, if any)
/// and says in a few words what it kept and dropped.
pub type PowerHook = Box<dyn Fn(Option<u64>) -> PowerReport + Send + Sync>;

/// What a simulated power loss did to one part of the state.
#[derive(Clone, Debug, Default)]
pub struct PowerReport {
    /// What was lost or kept, for the crash message.
    pub summary: String,
    /// How many independent choices a seed could make here (unsynced
    /// write batches, pages written since their file's fsync): zero means
    /// every seed gives the same result.
    pub choices: u64,
}

/// What a `+flush` crash runs before aborting (the open storage's flush).
static FLUSH_HOOKS: Mutex<Vec<FlushHook>> = Mutex::new(Vec::new());
/// What a `+power` crash runs before aborting (storage; files last).
static POWER_HOOKS: Mutex<Vec<PowerHook>> = Mutex::new(Vec::new());

/// The armed crash's mode, if a point is armed.
pub fn armed_mode() -> Option<Mode> {
    ARMED.get().and_then(Option::as_ref).map(|a| a.mode)
}

/// Registers `flush` to run before a `+flush` crash. Only kept when such a
/// point is armed, so normal runs pay nothing.
pub fn on_flush_crash(flush: FlushHook) {
    if armed_mode() == Some(Mode::Flush) {
        FLUSH_HOOKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(flush);
    }
}

/// The file layer's power loss, run after every other hook: storage writes
/// reach files, so what files keep is decided last. Set when the file
/// layer starts tracking a state directory ([`on_power_crash_last`]).
static FILES_HOOK: std::sync::OnceLock<PowerHook> = std::sync::OnceLock::new();

/// Registers the hook that runs last in a `+power` crash (the file layer;
/// the first registration stays).
pub fn on_power_crash_last(hook: PowerHook) {
    let _ = FILES_HOOK.set(hook);
}

/// Registers `hook` to run before a `+power` crash (in registration order).
pub fn on_power_crash(hook: PowerHook) {
    POWER_HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(hook);
}

/// True when the armed crash is a simulated power loss.
pub fn power_armed() -> bool {
    matches!(armed_mode(), Some(Mode::Power(_)))
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
static STEP_HITS: AtomicU64 = AtomicU64::new(0);
/// Times each step in [`STEPS`] was reached, armed or not.
static STEP_COUNTS: [AtomicU64; STEPS.len()] = [const { AtomicU64::new(0) }; STEPS.len()];
static COMMIT_CALLS: AtomicU64 = AtomicU64::new(0);
static RECOVER_CALLS: AtomicU64 = AtomicU64::new(0);
/// Storage writes a guest made outside `commit` and `recover` (so in the
/// open transaction), and their number when the last store commit returned.
static OPEN_WRITES: AtomicU64 = AtomicU64::new(0);
static OPEN_WRITES_AT_COMMIT: AtomicU64 = AtomicU64::new(0);
/// The `after-write` occurrences reached while storage held writes of the
/// open transaction: the crash points where recovery has something to undo
/// or finish, which an even spread over all occurrences can miss (a guest
/// that keeps writes in memory until a read or a batch fills reaches
/// storage at only some of them). At most [`DIRTY_MAX`] kept.
static DIRTY_AFTER_WRITES: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
const DIRTY_MAX: usize = 1 << 16;
/// Set by the conformance child only: `txstore run` keeps no open-write
/// bookkeeping on its per-record path.
static TRACK_OPEN_WRITES: AtomicBool = AtomicBool::new(false);

/// Arms `point` for this process (first call wins). `None` reads the
/// environment variable.
pub fn arm(point: Option<Armed>) -> Result<(), String> {
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
    ARMED.get().and_then(Option::as_ref).map(|a| &a.point)
}

/// The armed point is reached: crash, or stall and go on.
fn hit(point: &CrashPoint) {
    if let Some(Mode::Stall(ms)) = armed_mode() {
        eprintln!("txstore: crash point {point} reached: stalling {ms} ms, then going on");
        std::thread::sleep(std::time::Duration::from_millis(ms));
        return;
    }
    crash(point)
}

fn crash(point: &CrashPoint) -> ! {
    if let Some(
        armed @ Armed {
            mode: Mode::Power(seed),
            ..
        },
    ) = ARMED.get().and_then(Option::as_ref)
    {
        power_loss(&armed.to_string(), *seed);
    }
    let hooks = FLUSH_HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    if !hooks.is_empty() {
        // The conformance explorer reads OPEN_WRITES_KEPT: recovery has
        // writes of the open transaction to remove, so it cannot be clean.
        let open =
            OPEN_WRITES.load(Ordering::Relaxed) > OPEN_WRITES_AT_COMMIT.load(Ordering::Relaxed);
        eprintln!(
            "txstore: crash point {point} reached: flushing every write{}, then aborting",
            if open { OPEN_WRITES_KEPT } else { "" }
        );
        for flush in hooks.iter() {
            flush();
        }
    } else {
        eprintln!("txstore: crash point {point} reached: aborting");
    }
    std::process::abort()
}

/// Simulates a machine crash now: every power hook (storage), then the
/// file layer, then abort. Also used when an I/O error is injected in a
/// power run. Prints one line the conformance explorer reads (`choices`).
pub fn power_loss(at: &str, seed: Option<u64>) -> ! {
    let mut parts = Vec::new();
    let mut choices = 0;
    // try_lock: a hook that crashed while registering cannot deadlock us.
    if let Ok(hooks) = POWER_HOOKS.try_lock() {
        for hook in hooks.iter() {
            let r = hook(seed);
            choices += r.choices;
            parts.push(r.summary);
        }
    }
    let files = FILES_HOOK.get().map_or_else(
        || PowerReport {
            summary: "files: not simulated".into(),
            choices: 0,
        },
        |hook| hook(seed),
    );
    choices += files.choices;
    parts.push(files.summary);
    eprintln!(
        "txstore: crash point {at} reached: power loss{} ({}; choices={choices}), aborting",
        seed.map_or(String::new(), |s| format!(" with seed {s}")),
        parts.join("; ")
    );
    std::process::abort()
}

/// Marks protocol step `name`; aborts if it is the armed point.
pub fn step(name: &'static str) {
    let index = STEPS.iter().position(|s| *s == name).expect("unknown step");
    let occurrence = STEP_COUNTS[index].fetch_add(1, Ordering::Relaxed) + 1;
    if TRACK_OPEN_WRITES.load(Ordering::Relaxed) {
        track_open_writes(name, occurrence);
    }
    if let Some(
        p @ CrashPoint::Step {
            name: armed,
            occurrence,
        },
    ) = armed()
    {
        if armed == name && STEP_HITS.fetch_add(1, Ordering::Relaxed) + 1 == *occurrence {
            hit(p);
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
        (Some(p @ CrashPoint::CommitCall(k)), Phase::Commit) if *k == n => hit(p),
        (Some(p @ CrashPoint::RecoverCall(k)), Phase::Recover) if *k == n => hit(p),
        _ => {}
    }
    n
}

/// Times each protocol step was reached so far, in [`STEPS`] order.
pub fn step_counts() -> Vec<(&'static str, u64)> {
    STEPS
        .iter()
        .zip(&STEP_COUNTS)
        .map(|(s, c)| (*s, c.load(Ordering::Relaxed)))
        .collect()
}

/// What a `+flush` crash prints when storage keeps writes of the open
/// transaction.
pub const OPEN_WRITES_KEPT: &str = " (open-transaction writes kept)";

/// Turns on the open-write bookkeeping below (conformance children).
pub fn track_open_writes_from_now() {
    TRACK_OPEN_WRITES.store(true, Ordering::Relaxed);
}

fn track_open_writes(step: &str, occurrence: u64) {
    let open = OPEN_WRITES.load(Ordering::Relaxed);
    match step {
        "after-store-commit" => OPEN_WRITES_AT_COMMIT.store(open, Ordering::Relaxed),
        "after-write" if open > OPEN_WRITES_AT_COMMIT.load(Ordering::Relaxed) => {
            let mut dirty = DIRTY_AFTER_WRITES.lock().unwrap_or_else(|e| e.into_inner());
            if dirty.len() < DIRTY_MAX {
                dirty.push(occurrence);
            }
        }
        _ => {}
    }
}

/// Counts one storage write a guest made in `phase` (when tracking).
pub fn guest_write(phase: Phase) {
    if phase == Phase::Other && TRACK_OPEN_WRITES.load(Ordering::Relaxed) {
        OPEN_WRITES.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `after-write` occurrences reached with writes of the open
/// transaction in storage (see `DIRTY_AFTER_WRITES`).
pub fn dirty_after_writes() -> Vec<u64> {
    DIRTY_AFTER_WRITES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
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
        for s in [
            "after-write+flush",
            "commit-call:3+power",
            "during-restore@2+power:17",
            "during-restore+stall:8000",
        ] {
            assert_eq!(s.parse::<Armed>().unwrap().to_string(), s);
        }
        for bad in [
            "after-write+power:",
            "after-write+power:x",
            "after-write+powerx",
            "after-write+stall:",
            "after-write+stall:soon",
        ] {
            assert!(bad.parse::<Armed>().is_err(), "{bad} accepted");
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
