//! `txstore compact`: cleans the embedded changelog now and reports the
//! segments and bytes before and after.

use super::{load_store, open};
use anyhow::Result;
use std::path::Path;

/// Segment files and bytes of an embedded changelog directory.
fn changelog_size(dir: &Path) -> (u64, u64) {
    let mut out = (0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            out.0 += 1;
            out.1 += entry.metadata().map_or(0, |m| m.len());
        }
    }
    out
}

pub(super) fn main(config_path: &Path, json: bool) -> Result<()> {
    let config = load_store(config_path)?;
    let dir = config.changelog_dir();
    let started = std::time::Instant::now();
    let (mut task, _) = open(config_path)?;
    let before = changelog_size(&dir);
    let stats = task.compact()?;
    task.close()?;
    let after = changelog_size(&dir);
    let seconds = started.elapsed().as_secs_f64();
    if json {
        let value = serde_json::json!({
            "changelog": dir,
            "segments_before": before.0, "bytes_before": before.1,
            "segments_after": after.0, "bytes_after": after.1,
            "clean": stats, "seconds": seconds,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        if stats.is_some_and(|s| s.clean_to < s.log_end) {
            anyhow::bail!(
                "changelog.clean_memory_bytes = {} could not cover the whole log",
                config.changelog.clean_memory_bytes
            );
        }
        return Ok(());
    }
    let Some(s) = stats else {
        println!(
            "changelog {}: nothing to clean ({} bytes)",
            dir.display(),
            before.1
        );
        return Ok(());
    };
    println!(
        "changelog {}: {} segments, {} bytes -> {} segments, {} bytes; kept {} of {} records, dropped {} \
         deletes, {} pass{}, in {seconds:.2} s",
        dir.display(),
        before.0,
        before.1,
        after.0,
        after.1,
        s.records_kept,
        s.records_in,
        s.deletes_dropped,
        s.passes,
        if s.passes == 1 { "" } else { "es" }
    );
    // The key index is bounded: say when one pass could not hold the log.
    let memory = config.changelog.clean_memory_bytes;
    if s.clean_to < s.log_end {
        anyhow::bail!(
            "changelog.clean_memory_bytes = {memory} (an index of {} keys) could not cover the whole log: \
             offsets {}..{} are not cleaned",
            s.index_capacity,
            s.clean_to,
            s.log_end
        );
    }
    if s.passes > 1 {
        println!(
            "changelog.clean_memory_bytes = {memory} holds {} keys, fewer than the log's: one pass could not \
             cover the whole log, {} passes did",
            s.index_capacity, s.passes
        );
    }
    Ok(())
}
