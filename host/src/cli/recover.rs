//! `txstore recover`: start-up recovery alone, and its report.

use super::args::RecoverArgs;
use super::open;
use crate::crash;
use crate::task::RecoveryReport;
use anyhow::Result;

pub(super) fn main(a: RecoverArgs) -> Result<()> {
    let (task, report) = open(&a.config)?;
    task.close()?;
    if a.json {
        let (_, recover_calls) = crash::call_counts();
        let mut value = serde_json::to_value(&report)?;
        value["recover_storage_calls"] = recover_calls.into();
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_recovery(&report);
    }
    Ok(())
}

fn print_recovery(r: &RecoveryReport) {
    let off = |o: Option<u64>| o.map_or("none".to_string(), |o| o.to_string());
    println!(
        "guest:             {} (transactional: {})",
        r.guest, r.transactional
    );
    println!("guarantee:         {}", r.guarantee);
    match r.checkpoint {
        Some(c) => println!("checkpoint:        found, offset {c}"),
        None => println!("checkpoint:        none (first start, or an unclean stop)"),
    }
    let what = match r.action.as_str() {
        "wiped" => "wiped the store",
        "rolled-forward" => "rolled an interrupted commit forward",
        "rolled-back" => "rolled back to the last committed image",
        "discarded" => "discarded uncommitted writes",
        _ => "nothing to undo",
    };
    println!(
        "recovered to:      offset {} ({}: {what})",
        off(r.recovered_offset),
        r.action
    );
    if r.changelog_truncated_bytes > 0 {
        println!(
            "changelog:         truncated {} bytes of an unfinished tail",
            r.changelog_truncated_bytes
        );
    }
    println!(
        "replayed:          {} records in {} transactions (changelog end {})",
        r.replayed_records, r.replayed_transactions, r.changelog_end
    );
    println!("input resumes at:  byte {}", r.input_position);
    println!("time:              {:.1} ms", r.elapsed.as_secs_f64() * 1e3);
}
