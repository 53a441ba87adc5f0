//! One case: a child process per run (`txstore conformance-child`), the
//! crashes in order, recovery, the rest of the workload and a clean
//! restart, each judged from how its child ended.

use super::{child, CHECKS};
use anyhow::{bail, Context, Result};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
    if let Some(k) = env.kafka {
        cmd.args(["--kafka", &k.bootstrap, "--topic", &k.topic]);
    }
    if let Some(p) = at {
        cmd.env(crate::crash::ENV, p);
    }
    let out = cmd.output().context("cannot start a conformance child")?;
    outcome(&out, env.io_error)
}

/// How a child ended: crashed at its point, stopped on an error, finished
/// with its summary, or a violation it (or its end) shows.
fn outcome(out: &std::process::Output, io_error: Option<&str>) -> Result<Outcome> {
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
    if io_error.is_some() && out.status.success() && stderr.contains("txstore: injecting") {
        return Ok(Outcome::Violation {
            property: "an I/O error stops the process".into(),
            detail: format!(
                "the run went on to a clean finish after the injected {} error",
                io_error.unwrap_or("?")
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

/// One broken promise with the command that shows it again.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    pub check: &'static str,
    pub property: String,
    pub detail: String,
    /// The usual cause of this property breaking in this mode, as a
    /// question (the guide's "Every rule the suite checks" lists them).
    pub cause: Option<String>,
    pub reproducer: String,
}

/// One case to run: a seed and the crash points in order (none: clean).
#[derive(Clone, Debug)]
pub(super) struct Case {
    pub guest: String,
    pub check: &'static str,
    pub seed: u64,
    pub ops: usize,
    pub points: Vec<String>,
    /// Bootstrap servers when the changelog is in Kafka.
    pub kafka: Option<String>,
    /// An injected I/O error for the first child (`KIND:N`).
    pub io_error: Option<String>,
    pub guarantee: crate::config::Guarantee,
    pub guest_options: Vec<(String, String)>,
}

impl Case {
    pub fn reproducer(&self) -> String {
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
        // Always named: the default run's quick pass covers both.
        s.push_str(&format!(" --guarantees {}", self.guarantee));
        for (k, v) in &self.guest_options {
            s.push_str(&format!(" --option {k}={v}"));
        }
        if self.check == CHECKS[1] {
            // A clean run: that seed's run alone, no exploration after it.
            s.push_str(" --seeds 0 --max-points 0");
        }
        s
    }

    pub fn mode(&self) -> &'static str {
        mode_of(&self.points, self.io_error.is_some())
    }

    /// Power and I/O error cases keep a power journal in every child.
    fn power_sim(&self) -> bool {
        self.io_error.is_some() || self.points.iter().any(|p| p.contains("+power"))
    }
}

/// What running a case found.
pub(super) struct CaseResult {
    pub case: Case,
    /// Crashes that really happened (a point may lie past the workload's end).
    pub reached: usize,
    /// The power-loss choices of the first crash (see [`Outcome::Crashed`]).
    pub choices: u64,
    pub failure: Option<Failure>,
    /// After a first crash: the recovery-crash points its recovery reaches.
    pub second_points: Vec<String>,
    pub summary: Option<child::Summary>,
    pub elapsed: Duration,
}

/// Runs a case: the injected error or the crashes in order, then
/// recovery and the rest of the workload, then a clean restart.
pub(super) fn run_case(case: &Case, learn_recovery: bool, scratch: &Path) -> Result<CaseResult> {
    let started = Instant::now();
    let dir = tempfile::tempdir_in(scratch)
        .with_context(|| format!("cannot make a case directory in {}", scratch.display()))?;
    let kafka = case.kafka.as_deref().map(KafkaTarget::fresh);
    let run = CaseRun {
        case,
        state: dir.path().join("state"),
        env: Env {
            kafka: kafka.as_ref(),
            power_sim: case.power_sim(),
            io_error: None,
            guarantee: case.guarantee,
            guest_options: &case.guest_options,
        },
        scratch_path: dir.path().display().to_string(),
        when: when(case),
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
    if let Some(spec) = &case.io_error {
        run.inject(spec, &mut result)?;
    }
    if result.failure.is_none() {
        let kept_open_writes = run.crash(&mut result)?;
        if result.failure.is_none() {
            run.restart(&mut result, learn_recovery, kept_open_writes)?;
        }
    }
    result.elapsed = started.elapsed();
    Ok(result)
}

/// When a case's failure happened, for its property: after which crash or
/// injected error, under which guarantee.
fn when(case: &Case) -> String {
    // Under at-least-once the start-up differs: say so.
    let guarantee = match case.guarantee {
        crate::config::Guarantee::ExactlyOnce => String::new(),
        g => format!(", under {g}"),
    };
    if let Some(spec) = &case.io_error {
        return format!(" (after an injected {spec} error{guarantee})");
    }
    match (case.points.is_empty(), guarantee.is_empty()) {
        (true, true) => String::new(),
        (true, false) => format!(" ({})", &guarantee[2..]),
        (false, _) => format!(
            " (after a crash at {}{guarantee})",
            case.points.join(", then ")
        ),
    }
}

/// One case's children, run one after another on one state directory.
struct CaseRun<'a> {
    case: &'a Case,
    state: std::path::PathBuf,
    env: Env<'a>,
    /// The case's directory is gone when the report is read: advice that
    /// names it ("move .../state/store aside") must not send anyone there.
    scratch_path: String,
    when: String,
}

impl CaseRun<'_> {
    fn fail(&self, property: String, detail: String, label: &str) -> Failure {
        Failure {
            check: self.case.check,
            cause: None,
            property: format!("{property}{}{label}", self.when),
            detail: detail.replace(&self.scratch_path, "<case dir>"),
            reproducer: self.case.reproducer(),
        }
    }

    fn spawn(&self, at: Option<&str>, env: Env) -> Result<Outcome> {
        let case = self.case;
        spawn(&case.guest, &self.state, case.seed, case.ops, at, env)
    }

    /// The run with an I/O error injected: it may stop, in one line.
    fn inject(&self, spec: &str, result: &mut CaseResult) -> Result<()> {
        let env = Env {
            io_error: Some(spec),
            ..self.env
        };
        match self.spawn(None, env)? {
            Outcome::Stopped(line) if line.contains('\n') => {
                let property = "an I/O error is reported in one line".into();
                result.failure = Some(self.fail(property, line, ""));
            }
            Outcome::Stopped(_) | Outcome::Finished(_) => result.reached += 1,
            Outcome::Crashed { .. } => bail!("a child crashed with no crash point armed"),
            Outcome::Violation { property, detail } => {
                result.failure = Some(self.fail(property, detail, ""));
            }
        }
        Ok(())
    }

    /// The runs crashed at the case's points in turn. Returns whether the
    /// first crash left writes of the open transaction in storage.
    fn crash(&self, result: &mut CaseResult) -> Result<bool> {
        let mut first_kept_open_writes = false;
        for p in &self.case.points {
            match self.spawn(Some(p), self.env)? {
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
                    result.failure = Some(self.fail(property, detail, ""));
                    break;
                }
            }
        }
        Ok(first_kept_open_writes)
    }

    /// Two runs to the end without a crash: the recovery of the crashed
    /// state, then a clean restart.
    fn restart(
        &self,
        result: &mut CaseResult,
        learn_recovery: bool,
        kept_open_writes: bool,
    ) -> Result<()> {
        for (round, label) in ["", " (clean restart)"].iter().enumerate() {
            let s = match self.spawn(None, self.env)? {
                Outcome::Finished(s) => s,
                Outcome::Crashed { .. } => bail!("a child crashed with no crash point armed"),
                Outcome::Stopped(line) => bail!("a child stopped with no error injected: {line}"),
                Outcome::Violation { property, detail } => {
                    result.failure = Some(self.fail(property, detail, label));
                    return Ok(());
                }
            };
            if round > 0 {
                continue;
            }
            // Only a first crash that kept open writes and had no second
            // crash (whose recovery may have removed them).
            if kept_open_writes && self.case.points.len() == 1 && s.recovery_action == "clean" {
                result.failure = Some(self.fail(
                    "recovery after a crash with open writes in storage does not say clean".into(),
                    format!(
                        "storage kept writes of the open transaction, but recover reported `clean` (nothing to \
                         undo), resuming at step {}",
                        s.resumed_at
                    ),
                    "",
                ));
                return Ok(());
            }
            if learn_recovery && result.reached > 0 {
                // The recovery of this crashed state reached these points:
                // each is a place to crash it again.
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
            result.summary = Some(s);
        }
        Ok(())
    }
}
