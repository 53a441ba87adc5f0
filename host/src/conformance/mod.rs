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
//!
//! The exploration goes in passes ([`plan::Depth`]): a quick pass over
//! every kind of point first, under both guarantees, then the full one.
//! Each failure is printed as it is found ([`report::Live`]).
//!
//! Here: the options and the explorer. [`case`] runs one case, [`plan`]
//! chooses the cases, [`report`] keeps and prints the results.

mod case;
pub mod child;
pub mod contract;
pub mod coverage;
mod plan;
mod report;
pub mod workload;

pub use case::{Failure, KafkaTarget};
pub use report::{render, GuestReport};

use crate::config::Guarantee;
use crate::runtime::{GuestSource, Runtime};
use anyhow::Result;
use case::{Case, CaseResult};
use plan::Depth;
use report::Live;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

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
    /// Second crashes per crashed state in the full pass, spread over its
    /// recovery's storage calls (`None`: every one).
    pub recovery_points: Option<usize>,
    /// Crash modes explored (of `lossy`, `+flush`, `power`).
    pub modes: Vec<String>,
    /// The guarantees the task runs under, each explored in full.
    pub guarantees: Vec<Guarantee>,
    /// Run the quick pass first ([`Depth::QUICK`]), under these guarantees.
    pub quick: Vec<Guarantee>,
    /// Run the quick pass only.
    pub quick_only: bool,
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

impl Default for Options {
    fn default() -> Self {
        Options {
            guests: Vec::new(),
            seed: 1,
            random_seeds: 4,
            random_points: 6,
            ops: 200,
            max_points: 10,
            workers: 2,
            only: None,
            only_io_error: None,
            kafka: None,
            power_seeds: 2,
            recovery_points: Some(4),
            modes: MODES[1..].iter().map(|m| m.to_string()).collect(),
            guarantees: vec![Guarantee::ExactlyOnce],
            quick: vec![Guarantee::ExactlyOnce, Guarantee::AtLeastOnce],
            quick_only: false,
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

/// Runs the suite on every guest in `opts`; failures are printed as they
/// are found, the tables by [`render`].
pub fn run(runtime: &Runtime, opts: &Options) -> Result<Vec<GuestReport>> {
    let live = Live::new(opts.progress);
    let mut reports = Vec::new();
    for guest in &opts.guests {
        reports.push(check_guest(runtime, guest, opts, &live)?);
    }
    live.finish();
    Ok(reports)
}

/// Runs the suite on one guest.
fn check_guest(runtime: &Runtime, guest: &str, opts: &Options, live: &Live) -> Result<GuestReport> {
    live.guest(guest);
    let mut x = Explorer {
        guest,
        opts,
        live,
        report: GuestReport::new(guest),
        learned: HashMap::new(),
        clean: HashMap::new(),
    };
    if opts.only.is_some() || opts.only_io_error.is_some() {
        x.reproduce()?;
        return Ok(x.report);
    }
    x.contract(runtime)?;
    let full = Depth::full(
        opts.ops,
        opts.max_points,
        opts.recovery_points,
        opts.power_seeds,
        opts.random_seeds,
        opts.random_points,
    );
    let quick = Depth::QUICK.within(&full);
    // Clean runs first, the full workload's too: the cheapest check, and
    // the one a wrong read shows in.
    x.clean_runs(&quick, &opts.quick)?;
    if opts.quick_only {
        x.clean_runs(
            &Depth {
                random_seeds: 0,
                ..full
            },
            &opts.quick,
        )?;
    } else {
        x.clean_runs(&full, &opts.guarantees)?;
    }
    if !opts.quick.is_empty() {
        x.explore(&quick, &opts.quick)?;
    }
    if !opts.quick_only {
        x.explore(&full, &opts.guarantees)?;
    }
    Ok(x.report)
}

/// One guest's exploration: what ran, and what it learned.
struct Explorer<'a> {
    guest: &'a str,
    opts: &'a Options,
    live: &'a Live,
    report: GuestReport,
    /// Cases run, by reproducer line: what a first crash learned (the
    /// points its recovery reaches, the power loss's choices).
    learned: HashMap<String, (Vec<String>, u64)>,
    /// Clean runs' summaries, by guarantee, seed and workload length.
    clean: HashMap<(Guarantee, u64, usize), child::Summary>,
}

impl Explorer<'_> {
    fn case(
        &self,
        ops: usize,
        guarantee: Guarantee,
        check: &'static str,
        seed: u64,
        points: Vec<String>,
    ) -> Case {
        Case {
            guest: self.guest.into(),
            check,
            seed,
            ops,
            points,
            kafka: self.opts.kafka.clone(),
            io_error: None,
            guarantee,
            guest_options: self.opts.guest_options.clone(),
        }
    }

    fn stopped(&self) -> bool {
        self.opts.fail_fast && !self.report.failures.is_empty()
    }

    /// The contract checks, in this process.
    fn contract(&mut self, runtime: &Runtime) -> Result<()> {
        let started = Instant::now();
        let component = runtime.load(&GuestSource::parse(self.guest))?;
        let (mut cases, mut passed) = (0, 0);
        for (property, check) in contract::CHECKS {
            cases += 1;
            let outcome = contract::Fixture::new(&component).and_then(|mut f| check(&mut f));
            let Err(detail) = outcome else {
                passed += 1;
                continue;
            };
            let failure = Failure {
                check: CHECKS[0],
                property: property.to_string(),
                cause: report::likely_cause(property, "-", false),
                detail,
                // The contract checks run first in every run: no
                // exploration is needed to see the failure again.
                reproducer: format!(
                    "txstore conformance {} --seed {} --ops {} --fail-fast",
                    self.guest, self.opts.seed, self.opts.ops
                ),
            };
            self.live.planned(1);
            self.live.done(Some(&failure));
            self.report.failures.push(failure);
        }
        let row = self.report.row(CHECKS[0], "-", Guarantee::ExactlyOnce);
        row.cases = cases;
        row.passed = passed;
        row.failed = cases - passed;
        row.seconds = started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Reruns the one case a reproducer line names.
    fn reproduce(&mut self) -> Result<()> {
        let opts = self.opts;
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
        let guarantee = opts.guarantees.first().copied().unwrap_or_default();
        let mut c = self.case(opts.ops, guarantee, check, opts.seed, points);
        c.io_error = opts.only_io_error.clone();
        self.run(vec![(c, false)])
    }

    /// One pass at `depth` under each of `guarantees`: clean runs, then
    /// first crashes and injected errors, then crashes inside recovery and
    /// seeded power losses. Cases an earlier pass ran are not run again.
    fn explore(&mut self, depth: &Depth, guarantees: &[Guarantee]) -> Result<()> {
        self.clean_runs(depth, guarantees)?;
        if self.stopped() {
            return Ok(());
        }
        let firsts = self.first_cases(depth, guarantees);
        self.run(firsts.clone())?;
        if self.stopped() {
            return Ok(());
        }
        let mut seconds = Vec::new();
        for (first, _) in &firsts {
            let Some((recovery, choices)) = self.learned.get(&first.reproducer()) else {
                continue;
            };
            if first.points.is_empty() {
                continue;
            }
            let p = &first.points[0];
            let power = p.ends_with("+power") && first.points.len() == 1;
            for q in plan::recovery_points(recovery, depth) {
                // A power case's second crash is a power loss too.
                let q = if power { format!("{q}+power") } else { q };
                seconds.push((
                    self.case(
                        first.ops,
                        first.guarantee,
                        CHECKS[4],
                        first.seed,
                        vec![p.clone(), q],
                    ),
                    false,
                ));
            }
            // (random-seed cases are sampled, not expanded)
            if power && *choices > 0 && first.check != CHECKS[6] {
                for seed in 1..=depth.power_seeds {
                    let points = vec![format!("{p}:{seed}")];
                    seconds.push((
                        self.case(first.ops, first.guarantee, first.check, first.seed, points),
                        false,
                    ));
                }
            }
        }
        self.run(seconds)
    }

    /// The clean runs of a pass: its main seed and random ones.
    fn clean_runs(&mut self, depth: &Depth, guarantees: &[Guarantee]) -> Result<()> {
        if self.stopped() {
            return Ok(());
        }
        let mut clean = Vec::new();
        for &g in guarantees {
            for seed in (0..=depth.random_seeds).map(|i| self.opts.seed + i) {
                clean.push((self.case(depth.ops, g, CHECKS[1], seed, vec![]), false));
            }
        }
        self.run(clean)
    }

    /// The first crashes and injected errors of a pass, from its clean runs.
    fn first_cases(&self, depth: &Depth, guarantees: &[Guarantee]) -> Vec<(Case, bool)> {
        let opts = self.opts;
        let mut cases = Vec::new();
        for &g in guarantees {
            let Some(summary) = self.clean.get(&(g, opts.seed, depth.ops)) else {
                continue;
            };
            // Crashes inside recovery: not with a Kafka changelog, where a
            // recovery's storage calls also depend on the broker's state.
            let probe = opts.kafka.is_none();
            for (p, check) in plan::first_points(summary, depth, &opts.modes) {
                cases.push((self.case(depth.ops, g, check, opts.seed, vec![p]), probe));
            }
            if opts.modes.iter().any(|m| m == "power") && opts.kafka.is_none() {
                for points in plan::after_restart_points(summary, depth.max_points) {
                    cases.push((self.case(depth.ops, g, CHECKS[5], opts.seed, points), false));
                }
            }
            if opts.io_errors && opts.kafka.is_none() {
                for spec in plan::io_error_specs(summary, depth.io_points) {
                    let mut c = self.case(depth.ops, g, CHECKS[7], opts.seed, vec![]);
                    c.io_error = Some(spec);
                    cases.push((c, false));
                }
            }
            for seed in (1..=depth.random_seeds).map(|i| opts.seed + i) {
                let Some(summary) = self.clean.get(&(g, seed, depth.ops)) else {
                    continue;
                };
                let points = plan::first_points(summary, depth, &opts.modes);
                let mut rng = crate::rng::Rng::new(seed);
                for _ in 0..depth.random_points.min(points.len()) {
                    let (p, _) = &points[rng.below(points.len() as u64) as usize];
                    cases.push((
                        self.case(depth.ops, g, CHECKS[6], seed, vec![p.clone()]),
                        false,
                    ));
                }
            }
        }
        cases
    }

    /// Runs the cases not run before, on `workers` threads; each failure
    /// is printed as it is found. With `--fail-fast`, the first failure
    /// stops the rest.
    fn run(&mut self, cases: Vec<(Case, bool)>) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        let cases: Vec<(Case, bool)> = cases
            .into_iter()
            .filter(|(c, _)| {
                let key = c.reproducer();
                !self.learned.contains_key(&key) && seen.insert(key)
            })
            .collect();
        self.live.planned(cases.len());
        let (opts, live) = (self.opts, self.live);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(self.stopped());
        let results = Mutex::new(Vec::new());
        let error = Mutex::new(None);
        let scratch = opts.scratch_dir();
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
                    match case::run_case(case, *probe, &scratch) {
                        Ok(mut r) => {
                            if let Some(f) = &mut r.failure {
                                f.cause = report::likely_cause(
                                    &f.property,
                                    case.mode(),
                                    case.io_error.is_some(),
                                );
                            }
                            if r.failure.is_some() {
                                failed.store(true, Ordering::Relaxed);
                            }
                            live.done(r.failure.as_ref());
                            results.lock().unwrap().push(r);
                        }
                        Err(e) => {
                            *error.lock().unwrap() = Some(e);
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = error.into_inner().unwrap() {
            return Err(e);
        }
        let mut results: Vec<CaseResult> = results.into_inner().unwrap();
        // Record in plan order, so a report does not depend on timing.
        let order: HashMap<String, usize> = cases
            .iter()
            .enumerate()
            .map(|(i, (c, _))| (c.reproducer(), i))
            .collect();
        results.sort_by_key(|r| order[&r.case.reproducer()]);
        for r in results {
            self.report.record(&r);
            let key = r.case.reproducer();
            if let (Some(s), true) = (r.summary, r.case.check == CHECKS[1]) {
                let seed = r.case.seed;
                let ops = r.case.ops;
                if !self.clean.keys().any(|k| (k.1, k.2) == (seed, ops)) {
                    self.report
                        .coverage
                        .add_workload(&workload::generate(seed, ops));
                }
                self.clean.insert((r.case.guarantee, seed, ops), s);
            }
            self.learned.insert(key, (r.second_points, r.choices));
        }
        Ok(())
    }
}

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
