//! The conformance suite: proves a strategy exactly-once by crashing it at
//! every instant, or shows how it fails.
//!
//! For each guest and seed, a first uncrashed run of the seeded workload
//! ([`workload`]) counts the crash points it reaches: every protocol step
//! and every storage call inside `commit`. Each point then gets a case: a
//! child process runs the workload and aborts there; a new child recovers,
//! checks the store against the model at the changelog's committed position
//! and finishes the workload, checking every read ([`child`]); a last child
//! checks a clean restart. Each crashed state is also crashed again inside
//! its own recovery (every `recover-call:N`, and `during-restore`) before it
//! is recovered: the double crash. Checks that need no crash are in
//! [`contract`]. Every failure names the property and prints a reproducer.
//!
//! Each crash point is tried in three modes: `lossy` (abort: storage loses
//! its unsynced writes, the host's files keep the page cache), `+flush`
//! (storage keeps every write) and `power` (a simulated machine crash:
//! [`crate::file::power`] and [`crate::storage::power`]), the last once
//! without a seed (nothing unsynced kept) and, where the crash had choices
//! to make, with `--power-seeds N` seeds (torn pages, a prefix of the
//! unsynced storage writes). The `--io-errors` pass makes the N-th call of
//! each kind of I/O fail ([`crate::fault`]): the child must stop with one
//! error line, and the next start must recover exactly. Besides the model,
//! every child checks what earlier children acknowledged ([`child::Acked`]):
//! a commit that returned, and a clean shutdown, survive any crash.

pub mod child;
pub mod contract;
pub mod coverage;
pub mod workload;

use crate::runtime::{GuestSource, Runtime};
use anyhow::{bail, Context, Result};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub guests: Vec<String>,
    /// The seed explored exhaustively.
    pub seed: u64,
    /// Further seeds, each with a few random crash points.
    pub random_seeds: u64,
    /// Crash points per random seed.
    pub random_points: usize,
    /// Steps per workload.
    pub ops: usize,
    /// Most crash points explored per protocol step and for commit calls
    /// (evenly spread when there are more).
    pub max_points: usize,
    pub workers: usize,
    /// Run one case only: `P` or `P,Q` (a crash at P, then at Q during
    /// recovery), as printed in a reproducer line.
    pub only: Option<String>,
    /// Run one injected I/O error case only (`KIND:N`), as printed in a
    /// reproducer line.
    pub only_io_error: Option<String>,
    /// Bootstrap servers: each case's changelog is a fresh Kafka topic.
    pub kafka: Option<String>,
    /// Seeded power losses per crash point (besides the seedless one).
    pub power_seeds: u64,
    /// Crash modes explored (of `lossy`, `+flush`, `power`).
    pub modes: Vec<String>,
    /// The guarantees the task runs under, each explored in full.
    pub guarantees: Vec<crate::config::Guarantee>,
    /// Options passed to the guest's `init` (`--option k=v`), so it is
    /// tested with the settings it will run with.
    pub guest_options: Vec<(String, String)>,
    /// Run the injected I/O error pass.
    pub io_errors: bool,
    /// Stop a guest's exploration at its first failure.
    pub fail_fast: bool,
    pub progress: bool,
    /// Where each case's state directory is made (default: see
    /// [`Options::scratch_dir`]).
    pub scratch: Option<PathBuf>,
}

impl Options {
    /// `scratch`, else `/dev/shm` when it is a writable tmpfs, else the
    /// system's temp directory. Crashes and power losses are simulated
    /// (an abort keeps the page cache, the power journal decides what a
    /// machine crash keeps), so a disk under the cases adds only the time
    /// of real fsyncs: about 40% of a case's time on this machine's disk.
    pub fn scratch_dir(&self) -> PathBuf {
        if let Some(dir) = &self.scratch {
            return dir.clone();
        }
        let shm = Path::new("/dev/shm");
        if tempfile::tempdir_in(shm).is_ok() {
            return shm.to_path_buf();
        }
        std::env::temp_dir()
    }
}

/// A case's changelog in Kafka: the cluster and the case's own topic.
#[derive(Clone, Debug)]
pub struct KafkaTarget {
    pub bootstrap: String,
    pub topic: String,
}

impl KafkaTarget {
    /// A topic no other case, run or process has used.
    fn fresh(bootstrap: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        KafkaTarget {
            bootstrap: bootstrap.to_string(),
            topic: format!(
                "txstore-conformance-{}-{}-{}",
                since_epoch.as_millis(),
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            guests: Vec::new(),
            seed: 1,
            random_seeds: 4,
            random_points: 6,
            ops: 200,
            max_points: 16,
            workers: 2,
            only: None,
            only_io_error: None,
            kafka: None,
            power_seeds: 2,
            modes: MODES[1..].iter().map(|m| m.to_string()).collect(),
            guarantees: vec![crate::config::Guarantee::ExactlyOnce],
            guest_options: Vec::new(),
            io_errors: true,
            fail_fast: false,
            progress: true,
            scratch: None,
        }
    }
}

/// The rows of the report, in order.
pub const CHECKS: &[&str] = &[
    "contract (no crash)",
    "clean run and restart",
    "crash at a protocol step",
    "crash inside commit",
    "crash inside recovery",
    "crash after restart",
    "random seeds",
    "injected I/O error",
];

/// The crash modes, as the table names them.
pub const MODES: &[&str] = &["-", "lossy", "+flush", "power"];

/// The mode a case's crash points say (its last point's suffix).
fn mode_of(points: &[String], io_error: bool) -> &'static str {
    if io_error {
        return "-";
    }
    match points.last() {
        None => "-",
        Some(p) if p.contains("+power") => "power",
        Some(p) if p.ends_with("+flush") => "+flush",
        Some(_) => "lossy",
    }
}

/// One broken promise with the command that shows it again.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    pub check: &'static str,
    pub property: String,
    pub detail: String,
    pub reproducer: String,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Row {
    pub check: &'static str,
    /// The guarantee the task ran under.
    pub guarantee: crate::config::Guarantee,
    /// Crash mode: `lossy`, `+flush`, `power`, or `-` (no crash).
    pub mode: &'static str,
    pub cases: u64,
    pub passed: u64,
    pub failed: u64,
    pub seconds: f64,
}

/// The result for one guest.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GuestReport {
    pub guest: String,
    /// Distinct crash points (first and second crashes) that were reached.
    pub crash_points: u64,
    /// The same, per crash mode (`lossy`, `+flush`, `power`).
    pub crash_points_by_mode: std::collections::BTreeMap<&'static str, u64>,
    pub rows: Vec<Row>,
    pub failures: Vec<Failure>,
    /// What the run exercised.
    pub coverage: coverage::Coverage,
}

impl GuestReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// How one child process ended.
enum Outcome {
    Finished(child::Summary),
    /// Aborted at its crash point; `choices` is how many things a power
    /// loss there could have kept (0: every seed gives the same state).
    /// `open_writes`: the crash kept writes the guest made in storage in
    /// the open transaction (a `+flush` crash after them).
    Crashed {
        choices: u64,
        open_writes: bool,
    },
    /// Stopped on the injected I/O error, with its error line.
    Stopped(String),
    Violation {
        property: String,
        detail: String,
    },
}

/// How a child is run.
#[derive(Clone, Copy)]
struct Env<'a> {
    guarantee: crate::config::Guarantee,
    guest_options: &'a [(String, String)],
    kafka: Option<&'a KafkaTarget>,
    /// Keep a power journal (every child of a power or I/O error case).
    power_sim: bool,
    io_error: Option<&'a str>,
}

/// Runs `txstore conformance-child` for `guest` on `dir`, crashing at `at`.
fn spawn(
    guest: &str,
    dir: &Path,
    seed: u64,
    ops: usize,
    at: Option<&str>,
    env: Env,
) -> Result<Outcome> {
    let kafka = env.kafka;
    let exe = std::env::current_exe().context("cannot find the txstore executable")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "conformance-child",
        "--guest",
        guest,
        "--seed",
        &seed.to_string(),
        "--ops",
        &ops.to_string(),
        "--dir",
    ])
    .arg(dir)
    .args(["--guarantee", &env.guarantee.to_string()])
    .args(crate::config::option_args(env.guest_options))
    .env_remove(crate::crash::ENV)
    .env_remove(crate::fault::ENV)
    .env_remove(crate::file::power::ENV);
    if env.power_sim {
        cmd.env(crate::file::power::ENV, "1");
    }
    if let Some(spec) = env.io_error {
        cmd.env(crate::fault::ENV, spec).arg("--expect-errors");
    }
    if let Some(k) = kafka {
        cmd.args(["--kafka", &k.bootstrap, "--topic", &k.topic]);
    }
    if let Some(p) = at {
        cmd.env(crate::crash::ENV, p);
    }
    let out = cmd.output().context("cannot start a conformance child")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.signal() == Some(SIGABRT) {
        let choices = stderr
            .split("choices=")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let open_writes = stderr.contains(crate::crash::OPEN_WRITES_KEPT);
        return Ok(Outcome::Crashed {
            choices,
            open_writes,
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(child::STOPPED_EXIT) {
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_default();
        return Ok(Outcome::Stopped(
            v["stopped"].as_str().unwrap_or("?").to_string(),
        ));
    }
    if env.io_error.is_some() && out.status.success() && stderr.contains("txstore: injecting") {
        return Ok(Outcome::Violation {
            property: "an I/O error stops the process".into(),
            detail: format!(
                "the run went on to a clean finish after the injected {} error",
                env.io_error.unwrap_or("?")
            ),
        });
    }
    if out.status.success() || out.status.code() == Some(child::VIOLATION_EXIT) {
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).with_context(|| {
            format!(
                "conformance child printed no report: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        if let Some(s) = v.get("summary") {
            return Ok(Outcome::Finished(serde_json::from_value(s.clone())?));
        }
        return Ok(Outcome::Violation {
            property: v["violation"]["property"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            detail: v["violation"]["detail"].as_str().unwrap_or("?").to_string(),
        });
    }
    Ok(Outcome::Violation {
        property: "the host survives the guest".into(),
        detail: format!(
            "child ended with {}: {}",
            out.status,
            stderr.lines().last().unwrap_or("")
        ),
    })
}

/// The signal `abort()` ends a process with: a crash point was reached.
const SIGABRT: i32 = 6;

/// Copies a case's state directory with what lives beside it (the power
/// journal, the acknowledgements), so one crashed state can be recovered
/// in several ways.
fn copy_state(from: &Path, to: &Path) -> std::io::Result<()> {
    copy_dir(from, to)?;
    let journal = crate::file::power::journal_dir(from);
    if journal.exists() {
        copy_dir(&journal, &crate::file::power::journal_dir(to))?;
    }
    let acked = child::acked_path(from);
    if acked.exists() {
        std::fs::copy(&acked, child::acked_path(to))?;
    }
    Ok(())
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// One case to run: a seed and the crash points in order (none: clean).
#[derive(Clone, Debug)]
struct Case {
    guest: String,
    check: &'static str,
    seed: u64,
    ops: usize,
    points: Vec<String>,
    /// Bootstrap servers when the changelog is in Kafka.
    kafka: Option<String>,
    /// An injected I/O error for the first child (`KIND:N`).
    io_error: Option<String>,
    guarantee: crate::config::Guarantee,
    guest_options: Vec<(String, String)>,
}

impl Case {
    fn reproducer(&self) -> String {
        let mut s = format!(
            "txstore conformance {} --seed {} --ops {}",
            self.guest, self.seed, self.ops
        );
        if let Some(k) = &self.kafka {
            s.push_str(&format!(" --kafka {k}"));
        }
        if !self.points.is_empty() {
            s.push_str(&format!(" --crash-at {}", self.points.join(",")));
        }
        if let Some(e) = &self.io_error {
            s.push_str(&format!(" --io-error {e}"));
        }
        if self.guarantee != crate::config::Guarantee::ExactlyOnce {
            s.push_str(&format!(" --guarantees {}", self.guarantee));
        }
        for (k, v) in &self.guest_options {
            s.push_str(&format!(" --option {k}={v}"));
        }
        if self.check == CHECKS[1] {
            // A clean run: that seed's run alone, no exploration after it.
            s.push_str(" --seeds 0 --max-points 0");
        }
        s
    }

    fn mode(&self) -> &'static str {
        mode_of(&self.points, self.io_error.is_some())
    }

    /// Power and I/O error cases keep a power journal in every child.
    fn power_sim(&self) -> bool {
        self.io_error.is_some() || self.points.iter().any(|p| p.contains("+power"))
    }
}

/// What running a case found.
struct CaseResult {
    case: Case,
    /// Crashes that really happened (a point may lie past the workload's end).
    reached: usize,
    /// The power-loss choices of the first crash (see [`Outcome::Crashed`]).
    choices: u64,
    failure: Option<Failure>,
    /// After a first crash: the recovery-crash points its recovery reaches.
    second_points: Vec<String>,
    summary: Option<child::Summary>,
    elapsed: Duration,
}

/// Runs a case: the injected error or the crashes in order, then
/// recovery and the rest of the workload, then a clean restart.
fn run_case(case: &Case, probe_second: bool, scratch: &Path) -> Result<CaseResult> {
    let started = Instant::now();
    let dir = tempfile::tempdir_in(scratch)
        .with_context(|| format!("cannot make a case directory in {}", scratch.display()))?;
    let state = dir.path().join("state");
    let kafka = case.kafka.as_deref().map(KafkaTarget::fresh);
    let env = Env {
        kafka: kafka.as_ref(),
        power_sim: case.power_sim(),
        io_error: None,
        guarantee: case.guarantee,
        guest_options: &case.guest_options,
    };
    let mut result = CaseResult {
        case: case.clone(),
        reached: 0,
        choices: 0,
        failure: None,
        second_points: Vec::new(),
        summary: None,
        elapsed: Duration::ZERO,
    };
    let fail = |property: String, detail: String, when: &str| Failure {
        check: case.check,
        property: format!("{property}{when}"),
        detail,
        reproducer: case.reproducer(),
    };
    let mut when = if case.points.is_empty() {
        String::new()
    } else {
        format!(" (after a crash at {})", case.points.join(", then "))
    };
    if let Some(spec) = &case.io_error {
        when = format!(" (after an injected {spec} error)");
        let io_env = Env {
            io_error: Some(spec.as_str()),
            ..env
        };
        match spawn(&case.guest, &state, case.seed, case.ops, None, io_env)? {
            Outcome::Stopped(line) if line.contains('\n') => {
                result.failure = Some(fail(
                    "an I/O error is reported in one line".into(),
                    line,
                    &when,
                ));
            }
            Outcome::Stopped(_) | Outcome::Finished(_) => result.reached += 1,
            Outcome::Crashed { .. } => bail!("a child crashed with no crash point armed"),
            Outcome::Violation { property, detail } => {
                result.failure = Some(fail(property, detail, &when));
            }
        }
        if result.failure.is_some() {
            result.elapsed = started.elapsed();
            return Ok(result);
        }
    }
    let mut first_kept_open_writes = false;
    for p in &case.points {
        match spawn(&case.guest, &state, case.seed, case.ops, Some(p), env)? {
            Outcome::Crashed {
                choices,
                open_writes,
            } => {
                if result.reached == 0 {
                    result.choices = choices;
                    first_kept_open_writes = open_writes;
                }
                result.reached += 1;
            }
            Outcome::Finished(_) => {}
            Outcome::Stopped(line) => bail!("a child stopped with no error injected: {line}"),
            Outcome::Violation { property, detail } => {
                result.failure = Some(fail(property, detail, &when));
                result.elapsed = started.elapsed();
                return Ok(result);
            }
        }
    }
    if probe_second && result.reached > 0 {
        // Learn which crash points this state's recovery reaches.
        let probe = tempfile::tempdir_in(scratch)?;
        copy_state(&state, &probe.path().join("state"))?;
        if let Outcome::Finished(s) = spawn(
            &case.guest,
            &probe.path().join("state"),
            case.seed,
            case.ops,
            None,
            env,
        )? {
            result.second_points = (1..=s.recover_calls)
                .map(|m| format!("recover-call:{m}"))
                .collect();
            if s.steps
                .iter()
                .any(|(name, n)| name == "during-restore" && *n > 0)
            {
                result.second_points.push("during-restore".into());
            }
        }
    }
    for (round, label) in ["", " (clean restart)"].iter().enumerate() {
        match spawn(&case.guest, &state, case.seed, case.ops, None, env)? {
            Outcome::Finished(s) => {
                // Only a first crash that kept open writes and had no
                // second crash (whose recovery may have removed them).
                if round == 0
                    && first_kept_open_writes
                    && case.points.len() == 1
                    && s.recovery_action == "clean"
                {
                    result.failure = Some(fail(
                        "recovery after a crash with open writes in storage does not say clean".into(),
                        format!(
                            "storage kept writes of the open transaction, but recover reported `clean` (nothing to \
                             undo), resuming at step {}",
                            s.resumed_at
                        ),
                        &when,
                    ));
                    break;
                }
                if round == 0 {
                    result.summary = Some(s);
                }
            }
            Outcome::Crashed { .. } => bail!("a child crashed with no crash point armed"),
            Outcome::Stopped(line) => bail!("a child stopped with no error injected: {line}"),
            Outcome::Violation { property, detail } => {
                result.failure = Some(fail(property, detail, &format!("{when}{label}")));
                break;
            }
        }
    }
    result.elapsed = started.elapsed();
    Ok(result)
}

/// Runs `cases` on `workers` threads, with a progress bar.
fn run_all(
    cases: Vec<(Case, bool)>,
    opts: &Options,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<CaseResult>> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results = Mutex::new(Vec::new());
    let error = Mutex::new(None);
    let scratch = opts.scratch_dir();
    bar.inc_length(cases.len() as u64);
    std::thread::scope(|scope| {
        for _ in 0..opts.workers.max(1) {
            scope.spawn(|| loop {
                if opts.fail_fast && failed.load(Ordering::Relaxed) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((case, probe)) = cases.get(i) else {
                    break;
                };
                match run_case(case, *probe, &scratch) {
                    Ok(r) => {
                        if r.failure.is_some() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        results.lock().unwrap().push(r)
                    }
                    Err(e) => {
                        *error.lock().unwrap() = Some(e);
                        break;
                    }
                }
                bar.inc(1);
            });
        }
    });
    if let Some(e) = error.into_inner().unwrap() {
        return Err(e);
    }
    Ok(results.into_inner().unwrap())
}

/// Up to `max` of `1..=n`, evenly spread, always with the first and last
/// (with room for two).
fn spread(n: u64, max: usize) -> Vec<u64> {
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
fn first_points(s: &child::Summary, max: usize, modes: &[String]) -> Vec<(String, &'static str)> {
    let lossy = lossy_points(s, max);
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
fn after_restart_points(s: &child::Summary, max: usize) -> Vec<Vec<String>> {
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

fn lossy_points(s: &child::Summary, max: usize) -> Vec<(String, &'static str)> {
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
    // spread can miss: up to DIRTY_POINTS more, spread over those.
    let dirty = &s.dirty_after_writes;
    for i in spread(dirty.len() as u64, max.min(DIRTY_POINTS)) {
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
    for n in spread(s.commit_calls, max) {
        points.push((format!("commit-call:{n}"), CHECKS[3]));
    }
    points
}

/// The most `after-write` points added where storage holds writes of the
/// open transaction (each run in every crash mode).
const DIRTY_POINTS: usize = 8;

/// The injected errors a clean run's summary says can happen: the N-th
/// call of every kind, spread over up to `max` calls per kind.
fn io_error_specs(s: &child::Summary, max: usize) -> Vec<String> {
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

/// Runs the suite on one guest.
pub fn check_guest(
    runtime: &Runtime,
    guest: &str,
    opts: &Options,
    bar: &indicatif::ProgressBar,
) -> Result<GuestReport> {
    let mut rows: Vec<Row> = Vec::new();
    let mut failures = Vec::new();
    let mut report = GuestReport {
        guest: guest.into(),
        crash_points: 0,
        crash_points_by_mode: Default::default(),
        rows: Vec::new(),
        failures: Vec::new(),
        coverage: Default::default(),
    };
    bar.set_message(guest.to_string());
    let case = |guarantee, check: &'static str, seed: u64, points: Vec<String>| Case {
        guest: guest.into(),
        check,
        seed,
        ops: opts.ops,
        points,
        kafka: opts.kafka.clone(),
        io_error: None,
        guarantee,
        guest_options: opts.guest_options.clone(),
    };
    let first_guarantee = opts.guarantees.first().copied().unwrap_or_default();

    if opts.only.is_some() || opts.only_io_error.is_some() {
        let points: Vec<String> = opts
            .only
            .iter()
            .flat_map(|o| o.split(','))
            .map(str::to_string)
            .collect();
        let check = match points.as_slice() {
            [] => CHECKS[7],
            [p] if p.starts_with("commit-call:") => CHECKS[3],
            [_] => CHECKS[2],
            [_, q] if q.starts_with("after-write") => CHECKS[5],
            _ => CHECKS[4],
        };
        let mut c = case(first_guarantee, check, opts.seed, points);
        c.io_error = opts.only_io_error.clone();
        let mut results = run_all(vec![(c, false)], opts, bar)?;
        let r = results.pop().expect("one case");
        record(&mut rows, &mut failures, &mut report.coverage, &r);
        report.count_reached(&r);
        report.rows = rows;
        report.failures = failures;
        return Ok(report);
    }

    // Contract checks, in process.
    let started = Instant::now();
    let component = runtime.load(&GuestSource::parse(guest))?;
    let mut contract_row = Row {
        check: CHECKS[0],
        mode: "-",
        ..Row::default()
    };
    for (property, check) in contract::CHECKS {
        contract_row.cases += 1;
        let outcome = contract::Fixture::new(&component).and_then(|mut f| check(&mut f));
        match outcome {
            Ok(()) => contract_row.passed += 1,
            Err(detail) => {
                contract_row.failed += 1;
                failures.push(Failure {
                    check: CHECKS[0],
                    property: property.to_string(),
                    detail,
                    // The contract checks run first in every run: no
                    // exploration is needed to see the failure again.
                    reproducer: format!(
                        "txstore conformance {guest} --seed {} --ops {} --seeds 0 --max-points 0 --no-io-errors --fail-fast",
                        opts.seed, opts.ops
                    ),
                });
            }
        }
    }
    contract_row.seconds = started.elapsed().as_secs_f64();
    rows.push(contract_row);
    let stop = |failures: &[Failure]| opts.fail_fast && !failures.is_empty();

    // The exploration, once per guarantee: the start-up path differs
    // (under at-least-once a transactional guest recovers from a
    // checkpoint that survives the crash).
    for &guarantee in &opts.guarantees {
        if stop(&failures) {
            break;
        }
        // Clean runs: the main seed and the random ones; they also count points.
        let seeds: Vec<u64> = (0..=opts.random_seeds).map(|i| opts.seed + i).collect();
        let clean: Vec<(Case, bool)> = seeds
            .iter()
            .map(|&seed| (case(guarantee, CHECKS[1], seed, vec![]), false))
            .collect();
        let clean = run_all(clean, opts, bar)?;
        for seed in &seeds {
            report
                .coverage
                .add_workload(&workload::generate(*seed, opts.ops));
        }
        let mut cases = Vec::new();
        let mut io_cases = Vec::new();
        for r in &clean {
            record(&mut rows, &mut failures, &mut report.coverage, r);
            let Some(summary) = &r.summary else { continue };
            let points = first_points(summary, opts.max_points, &opts.modes);
            if r.case.seed == opts.seed {
                // Crashes inside recovery start from copies of the crashed
                // state; a Kafka changelog cannot be copied.
                let probe = opts.kafka.is_none();
                cases.extend(
                    points
                        .into_iter()
                        .map(|(p, check)| (case(guarantee, check, r.case.seed, vec![p]), probe)),
                );
                if opts.modes.iter().any(|m| m == "power") && opts.kafka.is_none() {
                    cases.extend(
                        after_restart_points(summary, opts.max_points)
                            .into_iter()
                            .map(|points| (case(guarantee, CHECKS[5], r.case.seed, points), false)),
                    );
                }
                if opts.io_errors && opts.kafka.is_none() {
                    for spec in io_error_specs(summary, opts.max_points.min(16)) {
                        let mut c = case(guarantee, CHECKS[7], r.case.seed, vec![]);
                        c.io_error = Some(spec);
                        io_cases.push((c, false));
                    }
                }
            } else {
                let mut rng = crate::rng::Rng::new(r.case.seed);
                for _ in 0..opts.random_points.min(points.len()) {
                    let (p, _) = &points[rng.below(points.len() as u64) as usize];
                    cases.push((
                        case(guarantee, CHECKS[6], r.case.seed, vec![p.clone()]),
                        false,
                    ));
                }
            }
        }

        if stop(&failures) {
            break;
        }
        // First crashes; each crashed state also yields its recovery's points,
        // and each power loss that had choices to make, its seeded variants.
        let firsts = run_all(cases, opts, bar)?;
        let mut more = Vec::new();
        for r in &firsts {
            record(&mut rows, &mut failures, &mut report.coverage, r);
            report.count_reached(r);
            let first = &r.case.points[0];
            let power = first.ends_with("+power") && r.case.points.len() == 1;
            for q in &r.second_points {
                // A power case's second crash is a power loss too.
                let q = if power {
                    format!("{q}+power")
                } else {
                    q.clone()
                };
                more.push((
                    case(guarantee, CHECKS[4], r.case.seed, vec![first.clone(), q]),
                    false,
                ));
            }
            if power && r.choices > 0 && r.case.check != CHECKS[6] {
                // (random-seed cases are sampled, not expanded)
                for seed in 1..=opts.power_seeds {
                    let p = format!("{first}:{seed}");
                    more.push((case(guarantee, r.case.check, r.case.seed, vec![p]), false));
                }
            }
        }
        if stop(&failures) {
            break;
        }
        more.extend(io_cases);
        for r in &run_all(more, opts, bar)? {
            record(&mut rows, &mut failures, &mut report.coverage, r);
            report.count_reached(r);
        }
    }
    report.rows = rows;
    report.failures = failures;
    Ok(report)
}

impl GuestReport {
    /// Counts the crash points a case really reached.
    fn count_reached(&mut self, r: &CaseResult) {
        if r.case.io_error.is_some() {
            return;
        }
        let n = r.reached as u64;
        self.crash_points += n;
        *self.crash_points_by_mode.entry(r.case.mode()).or_default() += n;
    }
}

fn record(
    rows: &mut Vec<Row>,
    failures: &mut Vec<Failure>,
    coverage: &mut coverage::Coverage,
    r: &CaseResult,
) {
    let (check, mode, guarantee) = (r.case.check, r.case.mode(), r.case.guarantee);
    if let Some(s) = &r.summary {
        coverage.add_run(r.case.seed, s);
    }
    if mode != "-" {
        coverage.modes.insert(mode);
    }
    coverage.guarantees.insert(guarantee.to_string());
    let same = |row: &Row| row.check == check && row.mode == mode && row.guarantee == guarantee;
    let i = match rows.iter().position(same) {
        Some(i) => i,
        None => {
            rows.push(Row {
                check,
                mode,
                guarantee,
                ..Row::default()
            });
            // Keep the table in guarantee order, then CHECKS, then modes.
            let key = |row: &Row| {
                (
                    row.guarantee != crate::config::Guarantee::ExactlyOnce,
                    CHECKS.iter().position(|c| *c == row.check),
                    MODES.iter().position(|m| *m == row.mode),
                )
            };
            rows.sort_by_key(key);
            rows.iter().position(same).unwrap()
        }
    };
    let row = &mut rows[i];
    row.cases += 1;
    row.seconds += r.elapsed.as_secs_f64();
    match &r.failure {
        None => row.passed += 1,
        Some(f) => {
            row.failed += 1;
            failures.push(f.clone());
        }
    }
}

/// Runs the suite on every guest in `opts`, printing a table per guest.
pub fn run(runtime: &Runtime, opts: &Options) -> Result<Vec<GuestReport>> {
    let bar = if opts.progress {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:14} {bar:40} {pos}/{len} cases, {elapsed}")
            .unwrap(),
    );
    let mut reports = Vec::new();
    for guest in &opts.guests {
        reports.push(check_guest(runtime, guest, opts, &bar)?);
    }
    bar.finish_and_clear();
    Ok(reports)
}

/// The report as text: a table per guest, then each failure.
pub fn render(reports: &[GuestReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let by_mode: Vec<String> = r
            .crash_points_by_mode
            .iter()
            .map(|(m, n)| format!("{m} {n}"))
            .collect();
        out.push_str(&format!(
            "\n{}: {} ({} crash points explored: {})\n",
            r.guest,
            if r.passed() { "PASS" } else { "FAIL" },
            r.crash_points,
            by_mode.join(", ")
        ));
        out.push_str(&format!(
            "  {:<28} {:<6} {:<13} {:>7} {:>7} {:>7} {:>9}\n",
            "check", "mode", "guarantee", "cases", "passed", "failed", "time"
        ));
        for row in &r.rows {
            let guarantee = if row.check == CHECKS[0] {
                "-".to_string()
            } else {
                row.guarantee.to_string()
            };
            out.push_str(&format!(
                "  {:<28} {:<6} {:<13} {:>7} {:>7} {:>7} {:>8.1}s\n",
                row.check, row.mode, guarantee, row.cases, row.passed, row.failed, row.seconds
            ));
        }
        for f in r.failures.iter().take(10) {
            out.push_str(&format!(
                "  FAILED {}: {}\n    {}\n    reproduce: {}\n",
                f.check, f.property, f.detail, f.reproducer
            ));
        }
        if r.failures.len() > 10 {
            out.push_str(&format!(
                "  ... and {} more failures (see --json)\n",
                r.failures.len() - 10
            ));
        }
        out.push_str(&r.coverage.render());
    }
    out
}

/// The child side: runs the workload once in this process and prints a
/// JSON summary or violation. Returns the process exit code.
pub fn child_main(
    runtime: &Runtime,
    guest: &str,
    dir: &PathBuf,
    seed: u64,
    ops: usize,
    kafka: Option<&KafkaTarget>,
    expect_errors: bool,
    guarantee: crate::config::Guarantee,
    options: &[(String, String)],
) -> i32 {
    let steps = workload::generate(seed, ops);
    let mut config = child::config(guest, dir, kafka);
    config.task.guarantee = guarantee;
    config.add_init_options(options);
    match child::run(runtime, &config, &steps) {
        Ok(summary) => {
            println!("{}", serde_json::json!({ "summary": summary }));
            0
        }
        // An error (not a broken promise) after an injected I/O error: the
        // process stops, as it must.
        Err(v) if expect_errors && child::is_error(&v) => {
            println!("{}", serde_json::json!({ "stopped": v.detail }));
            child::STOPPED_EXIT
        }
        Err(v) => {
            println!(
                "{}",
                serde_json::json!({ "violation": { "property": v.property, "detail": v.detail } })
            );
            child::VIOLATION_EXIT
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{child, lossy_points, spread, DIRTY_POINTS};

    #[test]
    fn crash_points_reach_writes_of_the_open_transaction() {
        // 1,000 after-writes, storage holding open writes at only 500..=520:
        // an even spread of three misses them all; the dirty points do not.
        let s = child::Summary {
            steps: vec![("after-write".into(), 1000)],
            dirty_after_writes: (500..=520).collect(),
            ..Default::default()
        };
        let points: Vec<String> = lossy_points(&s, 3).into_iter().map(|(p, _)| p).collect();
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
        let many = lossy_points(&s, 64).len();
        assert!(many > 64 && many <= 64 + DIRTY_POINTS, "{many}");
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
}
