//! The report: a row per check, mode and guarantee, each failure with its
//! likely cause and reproducer, and what the run prints while it goes
//! (failures as they are found, progress on a terminal or as plain lines).

use super::case::{CaseResult, Failure};
use super::{coverage, CHECKS, MODES};
use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    pub(super) fn new(guest: &str) -> Self {
        GuestReport {
            guest: guest.into(),
            crash_points: 0,
            crash_points_by_mode: Default::default(),
            rows: Vec::new(),
            failures: Vec::new(),
            coverage: Default::default(),
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// Adds a case's result to its row, its failure to the list, its run
    /// to the coverage and the crash points it really reached to the count.
    pub(super) fn record(&mut self, r: &CaseResult) {
        let (check, mode, guarantee) = (r.case.check, r.case.mode(), r.case.guarantee);
        if let Some(s) = &r.summary {
            self.coverage.add_run(r.case.seed, s);
        }
        if mode != "-" {
            self.coverage.modes.insert(mode);
        }
        self.coverage.guarantees.insert(guarantee.to_string());
        if r.case.io_error.is_none() && mode != "-" {
            let n = r.reached as u64;
            self.crash_points += n;
            *self.crash_points_by_mode.entry(mode).or_default() += n;
        }
        let row = self.row(check, mode, guarantee);
        row.cases += 1;
        row.seconds += r.elapsed.as_secs_f64();
        match &r.failure {
            None => row.passed += 1,
            Some(f) => {
                row.failed += 1;
                self.failures.push(f.clone());
            }
        }
    }

    /// The row of a check, mode and guarantee, made where missing; the
    /// table stays in guarantee order, then CHECKS, then modes.
    pub(super) fn row(
        &mut self,
        check: &'static str,
        mode: &'static str,
        guarantee: crate::config::Guarantee,
    ) -> &mut Row {
        let same = |row: &Row| row.check == check && row.mode == mode && row.guarantee == guarantee;
        if !self.rows.iter().any(same) {
            self.rows.push(Row {
                check,
                mode,
                guarantee,
                ..Row::default()
            });
            self.rows.sort_by_key(|row| {
                (
                    row.guarantee != crate::config::Guarantee::ExactlyOnce,
                    CHECKS.iter().position(|c| *c == row.check),
                    MODES.iter().position(|m| *m == row.mode),
                )
            });
        }
        let i = self
            .rows
            .iter()
            .position(same)
            .expect("the row was just made");
        &mut self.rows[i]
    }
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
            out.push_str(&failure_text(f));
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

/// A failure as the report prints it: what broke, what was seen, the
/// likely cause, and the line that shows it again.
pub(super) fn failure_text(f: &Failure) -> String {
    let mut out = format!("  FAILED {}: {}\n    {}\n", f.check, f.property, f.detail);
    if let Some(cause) = &f.cause {
        out.push_str(&format!("    likely cause: {cause}\n"));
    }
    out.push_str(&format!("    reproduce: {}\n", f.reproducer));
    out
}

/// The usual causes of a property breaking, by property and crash mode
/// (`*`: any mode), first match wins. A power loss keeps only what was
/// synced, so the same broken property points at a missing sync there and
/// at the commit or recovery logic after an abort.
const CAUSES: &[(&str, &str, &str)] = &[
    ("committed state after recovery", "power",
     "a commit's storage write was not synced (`sync: true` on its last write), or recovery trusted something only the page cache held?"),
    ("committed state after recovery", "*",
     "the commit is not atomic (a crash inside it leaves part of the transaction), or recovery does not finish or undo it the same way when it is itself interrupted (recovery not idempotent)?"),
    ("nothing uncommitted visible after recovery", "*",
     "writes of the interrupted transaction stayed in storage: a temporary keyspace not cleared by recovery, or writes made to the main keyspace before commit?"),
    ("nothing committed is lost", "power",
     "a commit's write was not synced before `commit` returned?"),
    ("nothing committed is lost", "*",
     "recovery undid a transaction whose `commit` had returned?"),
    ("a clean shutdown survives a crash", "*",
     "the last commit before the clean stop was not synced, so the checkpoint names an offset the store lost?"),
    ("recovery after a clean shutdown says clean", "*",
     "the committed offset not stored with the commit's data, or leftovers (a temporary keyspace) found and discarded at every start?"),
    ("recovery after a crash with open writes in storage does not say clean", "*",
     "`clean` decided from the checkpoint alone (under at-least-once it always matches), though writes of the open transaction were removed?"),
    ("recovery follows the contract", "*",
     "`recover` returned an offset the changelog does not hold or below the checkpoint it was given (a wipe that returns the checkpoint, or a committed offset written before the data it covers)?"),
    ("committed-offset is the last commit", "*",
     "the committed offset is not written in the same atomic batch as the commit's data?"),
    ("read-committed sees only committed data", "*",
     "read-committed reads see the open transaction (they must read the committed keyspace only)?"),
    ("read-uncommitted sees the open transaction", "*",
     "a page cut to `limit` before the open transaction is merged over it, deletes that do not hide keys, or keys changed on the way in (cut, converted to UTF-8)?"),
    ("calls with empty lists", "*",
     "`limit` 0 taken for \"no limit\"?"),
    ("approximate-uncommitted-bytes", "*",
     "the count is not reset by `commit`, or does not count each distinct key's last value?"),
    ("an I/O error", "*",
     "a failed storage call retried, ignored, or (a failed cursor read) taken for the end of the data: pass every storage error up as `error`?"),
    ("no guest errors", "*",
     "a key or value class not handled (empty, not UTF-8, over 64 KiB), or a limit refused in the middle of a record?"),
    ("the host survives the guest", "*",
     "the guest trapped or reached a limit (memory, time) on this input?"),
];

/// The likely cause of `property` breaking in `mode` (see [`CAUSES`]).
pub(super) fn likely_cause(property: &str, mode: &str, io_error: bool) -> Option<String> {
    let mode = if io_error { "-" } else { mode };
    CAUSES
        .iter()
        .find(|(p, m, _)| property.starts_with(p) && (*m == "*" || *m == mode))
        .map(|(_, _, cause)| cause.to_string())
}

/// What a run says while it goes: each failure on stdout as it is found
/// (a run piped to a file shows it at once); progress as a bar on a
/// terminal, else as a plain line on stderr every `TXSTORE_PROGRESS_MS`
/// (10 s) for a log.
pub(super) struct Live {
    bar: indicatif::ProgressBar,
    lines: Option<Duration>,
    state: Mutex<LiveState>,
}

struct LiveState {
    guest: String,
    started: Instant,
    last_line: Instant,
    planned: u64,
    run: u64,
    failed: u64,
}

impl Live {
    pub(super) fn new(progress: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = if progress && terminal {
            indicatif::ProgressBar::new(0)
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:24} {bar:30} {pos}/{len} cases, {elapsed}",
            )
            .expect("a valid template"),
        );
        let every = crate::task::feed::progress_every();
        Live {
            bar,
            lines: (progress && !terminal).then_some(every),
            state: Mutex::new(LiveState {
                guest: String::new(),
                started: Instant::now(),
                last_line: Instant::now(),
                planned: 0,
                run: 0,
                failed: 0,
            }),
        }
    }

    /// A new guest's exploration starts.
    pub(super) fn guest(&self, guest: &str) {
        let mut s = self.state.lock().unwrap();
        *s = LiveState {
            guest: guest.to_string(),
            started: Instant::now(),
            last_line: Instant::now(),
            planned: 0,
            run: 0,
            failed: 0,
        };
        self.bar.set_length(0);
        self.bar.set_position(0);
        self.bar.set_message(format!("{guest}: 0 failed"));
    }

    /// More cases are planned.
    pub(super) fn planned(&self, n: usize) {
        self.state.lock().unwrap().planned += n as u64;
        self.bar.inc_length(n as u64);
    }

    /// A case ended: its failure is printed now.
    pub(super) fn done(&self, failure: Option<&super::Failure>) {
        let mut s = self.state.lock().unwrap();
        s.run += 1;
        if let Some(f) = failure {
            s.failed += 1;
            let text = format!(
                "{} FAILED after {} s: {}",
                s.guest,
                s.started.elapsed().as_secs(),
                failure_text(f).trim_start().trim_start_matches("FAILED ")
            );
            self.bar.suspend(|| print!("{text}"));
            self.bar
                .set_message(format!("{}: {} failed", s.guest, s.failed));
        }
        self.bar.inc(1);
        if let Some(every) = self.lines {
            if s.last_line.elapsed() >= every {
                s.last_line = Instant::now();
                eprintln!(
                    "conformance {}: {}/{} cases run, {} failed, {} s",
                    s.guest,
                    s.run,
                    s.planned,
                    s.failed,
                    s.started.elapsed().as_secs()
                );
            }
        }
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::likely_cause;

    #[test]
    fn the_cause_depends_on_the_crash_mode() {
        let power = likely_cause("committed state after recovery", "power", false).unwrap();
        let abort = likely_cause("committed state after recovery", "lossy", false).unwrap();
        assert!(power.contains("not synced"), "{power}");
        assert!(abort.contains("not atomic"), "{abort}");
        let lost = likely_cause("nothing committed is lost", "power", false).unwrap();
        assert!(lost.contains("not synced"), "{lost}");
        // An injected error's case has no crash mode.
        let io = likely_cause("an I/O error is reported in one line", "-", true).unwrap();
        assert!(io.contains("error"), "{io}");
        assert_eq!(
            likely_cause("a property nobody named", "lossy", false),
            None
        );
    }
}
