//! `txstore run`: feeds an input file through the task, one line a record,
//! resuming where the changelog says the last run committed. After a guest
//! trap or limit breach it can restart from recovery (config
//! `task.restarts_on_guest_failure`). SIGTERM or SIGINT stops it cleanly
//! between records (commit, checkpoint, exit 0), as for a Kafka input: a
//! service stop is not a crash.

use crate::config::Config;
use crate::crash;
use crate::runtime::{CallError, Runtime};
use crate::task::serve::QueryServer;
use crate::task::{RecoveryReport, Task, TaskStats};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub(super) fn run(config_path: &PathBuf, input: Option<PathBuf>, json: bool) -> Result<()> {
    let config = Config::load(config_path)?;
    // Before any task opens, so a long restore shows in it.
    let _metrics = serve_metrics(&config)?;
    if config.kafka_input().is_some() {
        anyhow::ensure!(
            input.is_none(),
            "--input names a file, but {} reads a Kafka topic (task.input)",
            config_path.display()
        );
        return run_partitions(&config, json);
    }
    let input = input
        .or_else(|| config.input())
        .context("no input: pass --input FILE or set task.input in the config")?;
    if let Err(e) = std::fs::metadata(&input) {
        anyhow::bail!("cannot open input {}: {e}", input.display());
    }
    let runtime = Runtime::new(config.cache_dir())?;
    let started = Instant::now();
    // Before the open: a signal during recovery stops at the first record.
    let stop = stop_on_signals();
    let (mut task, first_report) = open(&config, &runtime, json)?;
    // Opened after the task, which holds the state directory's lock.
    let server = match QueryServer::bind(&config.state_dir()) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("warning: live queries are off for this run: {e:#}");
            None
        }
    };
    let mut done = TaskStats::default();
    let mut restarts = 0;
    let stopped = loop {
        match crate::task::feed::feed_until(&mut task, &input, server.as_ref(), true, Some(stop)) {
            Ok(stopped) => break stopped,
            Err(e) if is_guest_failure(&e) && restarts < config.task.restarts_on_guest_failure => {
                restarts += 1;
                eprintln!(
                    "guest failed: {e:#}; restarting from recovery ({restarts} of {})",
                    config.task.restarts_on_guest_failure
                );
                done.add(&task.stats);
                // Dropped without close: no checkpoint, so recovery treats
                // the stop as unclean, as after a crash.
                drop(task);
                task = open(&config, &runtime, json)?.0;
            }
            Err(e) => return Err(e),
        }
    };
    let peak_memory = task.guest_peak_memory_bytes();
    let position = task.input_position();
    let mut stats = task.close()?;
    crash::step("after-close");
    if stopped {
        eprintln!(
            "txstore: stopped on a signal at input position {position} (committed and checkpointed: a restart \
             resumes there)"
        );
    }
    stats.add(&done);
    let run = Finished {
        report: first_report,
        stats,
        seconds: started.elapsed().as_secs_f64(),
        peak_memory,
        restarts,
        stopped,
    };
    run.print(json);
    Ok(())
}

/// What a file run did, for its last line (or JSON).
struct Finished {
    report: RecoveryReport,
    stats: TaskStats,
    seconds: f64,
    peak_memory: u64,
    restarts: u32,
    stopped: bool,
}

impl Finished {
    fn print(&self, json: bool) {
        let (stats, restarts) = (&self.stats, self.restarts);
        if json {
            let (commit_calls, recover_calls) = crash::call_counts();
            let calls = serde_json::json!({"commit": commit_calls, "recover": recover_calls});
            println!(
                "{}",
                serde_json::json!({"recovery": self.report, "stats": stats, "seconds": self.seconds,
                    "storage_calls": calls, "guest_peak_memory_bytes": self.peak_memory, "restarts": restarts,
                    "stopped_on_signal": self.stopped})
            );
            return;
        }
        println!(
            "processed {} records ({} bytes) in {:.2} s: {} writes, {} commits ({} early){}",
            stats.records,
            stats.input_bytes,
            self.seconds,
            stats.writes,
            stats.commits,
            stats.early_commits,
            if restarts > 0 {
                format!(", {restarts} restarts")
            } else {
                String::new()
            }
        );
    }
}

/// A Kafka input: one task per assigned partition, until SIGTERM or
/// SIGINT (every open task then commits and closes) or a failure.
fn run_partitions(config: &Config, json: bool) -> Result<()> {
    let runtime = Runtime::new(config.cache_dir())?;
    let started = Instant::now();
    let stop = stop_on_signals();
    let summary = crate::task::partitions::run(config, &runtime, stop, None)?;
    crash::step("after-close");
    let secs = started.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({"partitions": summary, "seconds": secs})
        );
    } else {
        let s = &summary.stats;
        println!(
            "processed {} records in {secs:.2} s: {} writes, {} commits ({} early); {} partition opens, {} closes, \
             {} lost",
            s.records,
            s.writes,
            s.commits,
            s.early_commits,
            summary.opened.len(),
            summary.closed,
            summary.lost
        );
        if !summary.standbys.is_empty() {
            println!(
                "standby replicas: {} opened, {} promoted",
                summary.standbys.len(),
                summary.promoted.len()
            );
        }
    }
    Ok(())
}

/// The `[metrics]` endpoint, when the config asks for one.
fn serve_metrics(config: &Config) -> Result<Option<crate::metrics::Server>> {
    let Some(listen) = &config.metrics.listen else {
        return Ok(None);
    };
    let server = crate::metrics::serve(listen)?;
    eprintln!("txstore: metrics at http://{}/metrics", server.addr());
    Ok(Some(server))
}

/// Set once SIGTERM or SIGINT arrives: the run then stops cleanly.
fn stop_on_signals() -> &'static AtomicBool {
    static STOP: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_signal(_: libc::c_int) {
        // Async-signal-safe: one atomic store.
        STOP.store(true, Ordering::Relaxed);
    }
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
    &STOP
}

fn open(config: &Config, runtime: &Runtime, quiet: bool) -> Result<(Task, RecoveryReport)> {
    let (task, report) = Task::open(config, runtime)?;
    crash::step("after-recovery");
    if !quiet {
        eprintln!(
            "recovered: {} to offset {} ({}), replayed {} records",
            report.guest,
            report
                .recovered_offset
                .map_or("none".into(), |o| o.to_string()),
            report.action,
            report.replayed_records
        );
    }
    Ok((task, report))
}

/// A trap, timeout or limit breach: the instance is dead, the store is not.
fn is_guest_failure(e: &anyhow::Error) -> bool {
    crate::error::find::<CallError>(e).is_some_and(CallError::is_trap)
}
