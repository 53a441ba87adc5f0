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

pub mod child;
pub mod contract;
pub mod workload;

use crate::runtime::{GuestSource, Runtime};
use anyhow::{bail, Context, Result};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Bootstrap servers: each case's changelog is a fresh Kafka topic.
    pub kafka: Option<String>,
    pub progress: bool,
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
            max_points: 64,
            workers: 2,
            only: None,
            kafka: None,
            progress: true,
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
    "random seeds",
];

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
    pub rows: Vec<Row>,
    pub failures: Vec<Failure>,
}

impl GuestReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// How one child process ended.
enum Outcome {
    Finished(child::Summary),
    Crashed,
    Violation { property: String, detail: String },
}

/// Runs `txstore conformance-child` for `guest` on `dir`, crashing at `at`.
fn spawn(
    guest: &str,
    dir: &Path,
    seed: u64,
    ops: usize,
    at: Option<&str>,
    kafka: Option<&KafkaTarget>,
) -> Result<Outcome> {
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
    .env_remove(crate::crash::ENV);
    if let Some(k) = kafka {
        cmd.args(["--kafka", &k.bootstrap, "--topic", &k.topic]);
    }
    if let Some(p) = at {
        cmd.env(crate::crash::ENV, p);
    }
    let out = cmd.output().context("cannot start a conformance child")?;
    if out.status.signal() == Some(SIGABRT) {
        return Ok(Outcome::Crashed);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
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
    let stderr = String::from_utf8_lossy(&out.stderr);
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

/// Copies a state directory, so one crashed state can be recovered in
/// several ways.
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
        s
    }
}

/// What running a case found.
struct CaseResult {
    case: Case,
    /// Crashes that really happened (a point may lie past the workload's end).
    reached: usize,
    failure: Option<Failure>,
    /// After a first crash: the recovery-crash points its recovery reaches.
    second_points: Vec<String>,
    summary: Option<child::Summary>,
    elapsed: Duration,
}

/// Runs a case: the crashes in order, then recovery and the rest of the
/// workload, then a clean restart.
fn run_case(case: &Case, probe_second: bool) -> Result<CaseResult> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let kafka = case.kafka.as_deref().map(KafkaTarget::fresh);
    let kafka = kafka.as_ref();
    let mut result = CaseResult {
        case: case.clone(),
        reached: 0,
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
    let when = if case.points.is_empty() {
        String::new()
    } else {
        format!(" (after a crash at {})", case.points.join(", then "))
    };
    for p in &case.points {
        match spawn(&case.guest, &state, case.seed, case.ops, Some(p), kafka)? {
            Outcome::Crashed => result.reached += 1,
            Outcome::Finished(_) => {}
            Outcome::Violation { property, detail } => {
                result.failure = Some(fail(property, detail, &when));
                result.elapsed = started.elapsed();
                return Ok(result);
            }
        }
    }
    if probe_second && result.reached > 0 {
        // Learn which crash points this state's recovery reaches.
        let probe = tempfile::tempdir()?;
        copy_dir(&state, &probe.path().join("state"))?;
        if let Outcome::Finished(s) = spawn(
            &case.guest,
            &probe.path().join("state"),
            case.seed,
            case.ops,
            None,
            kafka,
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
        match spawn(&case.guest, &state, case.seed, case.ops, None, kafka)? {
            Outcome::Finished(s) => {
                if round == 0 {
                    result.summary = Some(s);
                }
            }
            Outcome::Crashed => bail!("a child crashed with no crash point armed"),
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
    let results = Mutex::new(Vec::new());
    let error = Mutex::new(None);
    bar.inc_length(cases.len() as u64);
    std::thread::scope(|scope| {
        for _ in 0..opts.workers.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((case, probe)) = cases.get(i) else {
                    break;
                };
                match run_case(case, *probe) {
                    Ok(r) => results.lock().unwrap().push(r),
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

/// Up to `max` of `1..=n`, evenly spread, always with the first and last.
fn spread(n: u64, max: usize) -> Vec<u64> {
    if n as usize <= max {
        return (1..=n).collect();
    }
    let mut v: Vec<u64> = (0..max)
        .map(|i| 1 + i as u64 * (n - 1) / (max as u64 - 1))
        .collect();
    v.dedup();
    v
}

/// The first crash points a clean run's summary says exist, each also as
/// `+flush` (the crash keeps every write, synced or not).
fn first_points(s: &child::Summary, max: usize) -> Vec<(String, &'static str)> {
    let mut points = lossy_points(s, max);
    let flushed: Vec<_> = points
        .iter()
        .map(|(p, check)| (format!("{p}+flush"), *check))
        .collect();
    points.extend(flushed);
    points
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
    for n in spread(s.commit_calls, max) {
        points.push((format!("commit-call:{n}"), CHECKS[3]));
    }
    points
}

/// Runs the suite on one guest.
pub fn check_guest(
    runtime: &Runtime,
    guest: &str,
    opts: &Options,
    bar: &indicatif::ProgressBar,
) -> Result<GuestReport> {
    let mut rows: Vec<Row> = CHECKS
        .iter()
        .map(|c| Row {
            check: c,
            ..Row::default()
        })
        .collect();
    let mut failures = Vec::new();
    bar.set_message(guest.to_string());

    if let Some(only) = &opts.only {
        let points: Vec<String> = only.split(',').map(str::to_string).collect();
        let check = match points.as_slice() {
            [p] if p.starts_with("commit-call:") => CHECKS[3],
            [_] => CHECKS[2],
            _ => CHECKS[4],
        };
        let case = Case {
            guest: guest.into(),
            check,
            seed: opts.seed,
            ops: opts.ops,
            points,
            kafka: opts.kafka.clone(),
        };
        let mut results = run_all(vec![(case, false)], opts, bar)?;
        let r = results.pop().expect("one case");
        record(&mut rows, &mut failures, &r);
        return Ok(GuestReport {
            guest: guest.into(),
            crash_points: r.reached as u64,
            rows,
            failures,
        });
    }

    // Contract checks, in process.
    let started = Instant::now();
    let component = runtime.load(&GuestSource::parse(guest))?;
    for (property, check) in contract::CHECKS {
        rows[0].cases += 1;
        let outcome = contract::Fixture::new(&component).and_then(|mut f| check(&mut f));
        match outcome {
            Ok(()) => rows[0].passed += 1,
            Err(detail) => {
                rows[0].failed += 1;
                failures.push(Failure {
                    check: CHECKS[0],
                    property: property.to_string(),
                    detail,
                    reproducer: format!(
                        "txstore conformance {guest} --seed {} --ops {}",
                        opts.seed, opts.ops
                    ),
                });
            }
        }
    }
    rows[0].seconds = started.elapsed().as_secs_f64();

    // Clean runs: the main seed and the random ones; they also count points.
    let seeds: Vec<u64> = (0..=opts.random_seeds).map(|i| opts.seed + i).collect();
    let clean: Vec<(Case, bool)> = seeds
        .iter()
        .map(|&seed| {
            (
                Case {
                    guest: guest.into(),
                    check: CHECKS[1],
                    seed,
                    ops: opts.ops,
                    points: vec![],
                    kafka: opts.kafka.clone(),
                },
                false,
            )
        })
        .collect();
    let clean = run_all(clean, opts, bar)?;
    let mut crash_points = 0u64;
    let mut cases = Vec::new();
    for r in &clean {
        record(&mut rows, &mut failures, r);
        let Some(summary) = &r.summary else { continue };
        let points = first_points(summary, opts.max_points);
        if r.case.seed == opts.seed {
            cases.extend(points.into_iter().map(|(p, check)| {
                (
                    Case {
                        guest: guest.into(),
                        check,
                        seed: r.case.seed,
                        ops: opts.ops,
                        points: vec![p],
                        kafka: opts.kafka.clone(),
                    },
                    // Crashes inside recovery start from copies of the
                    // crashed state; a Kafka changelog cannot be copied.
                    opts.kafka.is_none(),
                )
            }));
        } else {
            let mut rng = workload::Rng::new(r.case.seed);
            for _ in 0..opts.random_points.min(points.len()) {
                let (p, _) = &points[rng.below(points.len() as u64) as usize];
                cases.push((
                    Case {
                        guest: guest.into(),
                        check: CHECKS[5],
                        seed: r.case.seed,
                        ops: opts.ops,
                        points: vec![p.clone()],
                        kafka: opts.kafka.clone(),
                    },
                    false,
                ));
            }
        }
    }

    // First crashes; each crashed state also yields its recovery's points.
    let firsts = run_all(cases, opts, bar)?;
    let mut seconds = Vec::new();
    for r in &firsts {
        record(&mut rows, &mut failures, r);
        crash_points += r.reached as u64;
        for q in &r.second_points {
            let points = vec![r.case.points[0].clone(), q.clone()];
            seconds.push((
                Case {
                    guest: guest.into(),
                    check: CHECKS[4],
                    seed: r.case.seed,
                    ops: opts.ops,
                    points,
                    kafka: opts.kafka.clone(),
                },
                false,
            ));
        }
    }
    for r in &run_all(seconds, opts, bar)? {
        record(&mut rows, &mut failures, r);
        crash_points += r.reached.saturating_sub(1) as u64;
    }
    Ok(GuestReport {
        guest: guest.into(),
        crash_points,
        rows,
        failures,
    })
}

fn record(rows: &mut [Row], failures: &mut Vec<Failure>, r: &CaseResult) {
    let row = rows
        .iter_mut()
        .find(|row| row.check == r.case.check)
        .expect("known check");
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
        out.push_str(&format!(
            "\n{}: {} ({} crash points explored)\n",
            r.guest,
            if r.passed() { "PASS" } else { "FAIL" },
            r.crash_points
        ));
        out.push_str(&format!(
            "  {:<28} {:>7} {:>7} {:>7} {:>9}\n",
            "check", "cases", "passed", "failed", "time"
        ));
        for row in &r.rows {
            out.push_str(&format!(
                "  {:<28} {:>7} {:>7} {:>7} {:>8.1}s\n",
                row.check, row.cases, row.passed, row.failed, row.seconds
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
) -> i32 {
    let steps = workload::generate(seed, ops);
    match child::run(runtime, guest, dir, &steps, kafka) {
        Ok(summary) => {
            println!("{}", serde_json::json!({ "summary": summary }));
            0
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
    use super::spread;

    #[test]
    fn spread_keeps_ends_and_bound() {
        assert_eq!(spread(3, 10), vec![1, 2, 3]);
        let s = spread(1000, 10);
        assert_eq!(s.len(), 10);
        assert_eq!((s[0], s[9]), (1, 1000));
        assert!(spread(0, 5).is_empty());
    }
}
