//! `txstore run`: feeds an input file through the task, one line a record,
//! resuming where the changelog says the last run committed. After a guest
//! trap or limit breach it can restart from recovery (config
//! `task.restarts_on_guest_failure`).

use crate::config::Config;
use crate::crash;
use crate::runtime::{CallError, Runtime};
use crate::task::{RecoveryReport, Task, TaskStats};
use anyhow::{Context, Result};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub fn run(config_path: &PathBuf, input: Option<PathBuf>, json: bool) -> Result<()> {
    let config = Config::load(config_path)?;
    let input = input
        .or_else(|| config.input())
        .context("no input: pass --input FILE or set task.input in the config")?;
    let runtime = Runtime::new(config.cache_dir())?;
    let started = Instant::now();
    let (mut task, first_report) = open(&config, &runtime, json)?;
    let mut done = TaskStats::default();
    let mut restarts = 0;
    loop {
        match feed(&mut task, &input) {
            Ok(()) => break,
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
    }
    let peak_memory = task.guest_peak_memory_bytes();
    let mut stats = task.close()?;
    stats.add(&done);
    let secs = started.elapsed().as_secs_f64();
    if json {
        let (commit_calls, recover_calls) = crash::call_counts();
        let calls = serde_json::json!({"commit": commit_calls, "recover": recover_calls});
        println!(
            "{}",
            serde_json::json!({"recovery": first_report, "stats": stats, "seconds": secs, "storage_calls": calls,
                "guest_peak_memory_bytes": peak_memory, "restarts": restarts})
        );
    } else {
        println!(
            "processed {} records ({} bytes) in {:.2} s: {} writes, {} commits ({} early){}",
            stats.records,
            stats.input_bytes,
            secs,
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
    Ok(())
}

fn open(config: &Config, runtime: &Runtime, quiet: bool) -> Result<(Task, RecoveryReport)> {
    let (task, report) = Task::open(config, runtime)?;
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
    e.chain().any(|c| {
        c.downcast_ref::<CallError>()
            .is_some_and(CallError::is_trap)
    })
}

/// Processes the input from the task's committed position to its end.
fn feed(task: &mut Task, input: &Path) -> Result<()> {
    let file = std::fs::File::open(input)
        .with_context(|| format!("cannot open input {}", input.display()))?;
    let total = file.metadata()?.len();
    let mut position = task.input_position();
    if position > total {
        anyhow::bail!(
            "input {} has {total} bytes but the changelog says {position} were already processed: wrong input file?",
            input.display()
        );
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    reader.seek(SeekFrom::Start(position))?;
    let bar = indicatif::ProgressBar::new(total).with_position(position);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap(),
    );
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        position += n as u64;
        let record = line.strip_suffix(b"\n").unwrap_or(&line);
        task.process(record, position)?;
        task.stats.input_bytes += n as u64;
        if task.stats.records % 4096 == 0 {
            bar.set_position(position);
        }
    }
    bar.finish_and_clear();
    Ok(())
}
