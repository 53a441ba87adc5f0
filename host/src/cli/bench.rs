//! `txstore bench`: every guest against plain RocksDB in one run (or, with
//! `--stores`, many stores in one process), and the child processes its
//! recovery and memory figures are measured in.

use super::args::{BenchArgs, BenchChildArgs, BenchFormat, BenchStoresChildArgs};
use crate::runtime::Runtime;
use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::Path;

pub(super) fn main(a: BenchArgs) -> Result<()> {
    let guests = if a.guests.is_empty() {
        txstore_artifacts::names().map(str::to_string).collect()
    } else {
        a.guests
    };
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    if let Some(stores) = a.stores {
        anyhow::ensure!(stores > 0, "--stores must be at least 1");
        let commit_every = match a.commit_every {
            Some(k) => k,
            None => crate::bench::default_commit_every(&runtime, a.keys)?,
        };
        let opts = crate::bench::stores::Options {
            stores,
            keys: a.keys,
            commit_every,
            threads: a.threads,
            guests,
            guest_options: a.options,
            runs: a.runs,
        };
        let figures = crate::bench::stores::run(&opts, std::io::stderr().is_terminal())?;
        let md = crate::bench::stores::markdown(&figures);
        return print_figures(a.format, &md, &figures, a.json.as_deref());
    }
    if let Some(lines) = a.pipeline {
        anyhow::ensure!(lines > 0, "--pipeline must be at least 1 line");
        let opts = crate::bench::pipeline::Options {
            lines,
            guests,
            guest_options: a.options,
            runs: a.runs,
            progress: std::io::stderr().is_terminal(),
        };
        let report = crate::bench::pipeline::run(&runtime, &opts)?;
        let md = crate::bench::pipeline::markdown(&report);
        return print_figures(a.format, &md, &report, a.json.as_deref());
    }
    let recovery_sizes = if a.recovery_sizes.is_empty() {
        crate::bench::recovery_sizes_for(a.keys)
    } else {
        a.recovery_sizes
    };
    let opts = crate::bench::Options {
        keys: a.keys,
        commit_every: a.commit_every,
        guests,
        reads: a.reads,
        recovery_sizes,
        runs: a.runs,
        progress: std::io::stderr().is_terminal(),
        guest_options: a.options,
    };
    let report = crate::bench::run(&runtime, &opts)?;
    let md = crate::bench::report::markdown(&report);
    print_figures(a.format, &md, &report, a.json.as_deref())?;
    if let Some(dir) = a.plot {
        crate::bench::report::plots(&report, &dir)?;
    }
    Ok(())
}

/// One recovery measurement's loader.
pub(super) fn child(a: BenchChildArgs) -> Result<()> {
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    crate::bench::recovery_child(&runtime, &a.guest, &a.options, &a.dir, a.keys, a.txn)
}

/// One `--stores` target in a process of its own.
pub(super) fn stores_child(a: BenchStoresChildArgs) -> Result<()> {
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    crate::bench::stores::child(&runtime, &a.spec)
}

/// A bench's figures on stdout (markdown or JSON) and, if asked, as JSON
/// in a file.
fn print_figures(
    format: BenchFormat,
    md: &str,
    figures: &impl serde::Serialize,
    json: Option<&Path>,
) -> Result<()> {
    match format {
        BenchFormat::Md => print!("{md}"),
        BenchFormat::Json => println!("{}", serde_json::to_string_pretty(figures)?),
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
