//! `txstore conformance`: the options of a run from its flags (what
//! `--all` widens), the report, and the child process each case runs in.

use super::args::{ConformanceArgs, ConformanceChildArgs, RecoveryPoints};
use crate::config::Guarantee;
use crate::runtime::Runtime;
use anyhow::{Context, Result};
use std::time::Instant;

/// `crash_at` and `io_error` (the global flags) name one case to rerun.
pub(super) fn main(
    a: ConformanceArgs,
    crash_at: Option<String>,
    io_error: Option<String>,
) -> Result<()> {
    let mut guests = a.guests;
    if a.all {
        guests.extend(txstore_artifacts::names().map(str::to_string));
    }
    if guests.is_empty() {
        anyhow::bail!("name at least one guest (a built-in name or a .wasm path), or pass --all");
    }
    let both = vec![Guarantee::ExactlyOnce, Guarantee::AtLeastOnce];
    let (quick, guarantees) = match (a.guarantees.is_empty(), a.all) {
        (false, _) => (a.guarantees.clone(), a.guarantees),
        (true, true) => (both.clone(), both),
        (true, false) => (both, vec![Guarantee::ExactlyOnce]),
    };
    let opts = crate::conformance::Options {
        guests,
        seed: a.seed,
        random_seeds: if a.all { a.seeds.max(16) } else { a.seeds },
        ops: a.ops,
        max_points: a.max_points.unwrap_or(if a.all { 64 } else { 10 }),
        workers: a.workers,
        only: crash_at,
        only_io_error: io_error,
        kafka: a.kafka,
        power_seeds: a.power_seeds,
        recovery_points: match a.recovery_points {
            Some(RecoveryPoints(n)) => n,
            None if a.all => None,
            None => Some(4),
        },
        modes: a.modes,
        io_errors: !a.no_io_errors,
        guarantees,
        quick,
        quick_only: a.quick,
        guest_options: a.options,
        fail_fast: a.fail_fast,
        progress: true,
        scratch: a.scratch,
        ..Default::default()
    };
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    let started = Instant::now();
    let reports = crate::conformance::run(&runtime, &opts)?;
    print!("{}", crate::conformance::render(&reports));
    println!(
        "\n{} guests in {:.1} s",
        reports.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = a.json {
        std::fs::write(&path, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.guest.as_str())
        .collect();
    if !failed.is_empty() {
        anyhow::bail!("conformance failed for {}", failed.join(", "));
    }
    Ok(())
}

/// One case's workload in this process; exits with the case's status.
pub(super) fn child(a: ConformanceChildArgs) -> Result<()> {
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    let kafka = a
        .kafka
        .zip(a.topic)
        .map(|(bootstrap, topic)| crate::conformance::KafkaTarget { bootstrap, topic });
    std::process::exit(crate::conformance::child_main(
        &runtime,
        &a.guest,
        &a.dir,
        a.seed,
        a.ops,
        kafka.as_ref(),
        a.expect_errors,
        a.guarantee,
        &a.options,
    ));
}
