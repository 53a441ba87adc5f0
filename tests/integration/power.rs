//! Machine crashes, not only process crashes: the power-loss simulation of
//! the host's files and of storage, injected I/O errors, and the host
//! mutants the power mode must catch while the lossy mode cannot. Word
//! counts are checked against `tr | sort | uniq -c`.

use crate::common::{ok, recover_json, stderr, txstore_env};
use crate::protocol::{input, shell_count, store_counts, word_count_config};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

/// Every process of a power scenario keeps the journal of what is durable.
const SIM: (&str, &str) = ("TXSTORE_POWER_SIM", "1");

fn run(config: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut all = vec![SIM];
    all.extend_from_slice(env);
    txstore_env(&["run", "--config", config.to_str().unwrap()], &all)
}

#[track_caller]
fn crash(config: &Path, point: &str) {
    let out = run(config, &[("TXSTORE_CRASH_AT", point)]);
    assert_eq!(
        out.status.signal(),
        Some(6),
        "expected an abort at {point}: {}",
        stderr(&out)
    );
}

/// A process that dies inside the changelog's fsync leaves its commit
/// frame in the page cache only. The next start must make it durable
/// before the store commits from it or the input resumes after it: once
/// a power cut dropped the frame, the store would be ahead of its
/// changelog for good ("recovered to offset o but the changelog ends at").
#[test]
fn a_commit_frame_only_in_the_page_cache_is_made_durable_before_use() {
    for guest in ["roll-forward", "buffered"] {
        let dir = tempfile::tempdir().unwrap();
        let input = input(dir.path(), 600);
        let config = word_count_config(dir.path(), guest, "exactly-once");
        crash(&config, "before-changelog-sync@3");
        crash(&config, "after-write@50+power");
        ok(&run(&config, &[]));
        assert_eq!(shell_count(&input), store_counts(&config), "{guest}");
    }
}

/// A state directory whose entry in its parent was never fsynced vanishes
/// whole in a power cut, changelog and all.
#[test]
fn a_new_state_directory_survives_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), 300);
    let config = word_count_config(dir.path(), "wipe-on-crash", "exactly-once");
    crash(&config, "after-changelog-commit@2+power");
    let report = recover_json(&config);
    assert!(report["changelog_end"].as_u64().unwrap() > 0, "{report}");
}

/// Every crash mode, a power cut with seeds among them, ends exact.
#[test]
fn word_count_is_exact_after_power_cuts_at_every_step() {
    for guest in ["wipe-on-crash", "roll-back", "roll-back-snapshot"] {
        for points in [
            &["after-write@300+power:1"][..],
            // The write cache just handed over, its changelog records unsynced.
            &["after-flush@3+power:5"],
            &["before-changelog-sync@2+power:2"],
            &["after-changelog-commit@2+power:3", "during-restore+power:4"],
            &["after-store-commit@3+power"],
            &["after-close+power"],
        ] {
            let dir = tempfile::tempdir().unwrap();
            let input = input(dir.path(), 600);
            let config = word_count_config(dir.path(), guest, "exactly-once");
            for p in points {
                let out = run(&config, &[("TXSTORE_CRASH_AT", p)]);
                // `after-close` is reached only by a run that finishes.
                assert!(
                    out.status.signal() == Some(6),
                    "{guest} {p}: {}",
                    stderr(&out)
                );
            }
            ok(&run(&config, &[]));
            assert_eq!(
                shell_count(&input),
                store_counts(&config),
                "{guest} {points:?}"
            );
        }
    }
}

/// Under at-least-once a store that cannot undo writes must not keep the
/// flushed writes of a transaction that never committed: its checkpoint
/// means "closed cleanly", not "committed here".
#[test]
fn at_least_once_wipe_on_crash_drops_uncommitted_flushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), 600);
    let config = word_count_config(dir.path(), "wipe-on-crash", "at-least-once");
    crash(&config, "after-write@400+flush");
    ok(&run(&config, &[]));
    assert_eq!(shell_count(&input), store_counts(&config));
}

/// An injected I/O error stops the run with one error line that says
/// what failed; nothing is retried as if it had worked, and the next start
/// recovers exactly.
#[test]
fn io_errors_stop_with_one_line_and_the_next_start_recovers() {
    for (guest, spec, says) in [
        ("roll-forward", "fsync:7", "fsync"),
        ("buffered", "fsync:2", "fsync"),
        ("wipe-on-crash", "write-enospc:3", "no space left"),
        ("roll-back", "write-short:6", "input/output error"),
        ("roll-forward", "rename:1", "rename"),
        ("buffered", "storage-sync:3", "storage"),
        ("roll-back", "storage-write:20", "storage"),
        ("roll-forward", "storage-read:50", "storage read"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let input = input(dir.path(), 600);
        let config = word_count_config(dir.path(), guest, "exactly-once");
        let out = run(&config, &[("TXSTORE_IO_ERROR", spec)]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{guest} {spec}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(
            lines.len(),
            1,
            "{guest} {spec}: one error line expected:\n{err}"
        );
        assert!(lines[0].contains(says), "{guest} {spec}: {}", lines[0]);
        ok(&run(&config, &[]));
        assert_eq!(shell_count(&input), store_counts(&config), "{guest} {spec}");
    }
}

/// The host mutants (cargo feature `mutants`): each durability bug passes
/// the lossy mode, which keeps the page cache, and is rejected by the
/// power mode.
#[cfg(feature = "mutants")]
#[test]
fn host_mutants_are_caught_by_power_loss_only() {
    use crate::common::stdout;
    for (mutant, property) in [
        ("changelog-no-sync", "nothing committed is lost"),
        ("checkpoint-no-dirsync", "a clean shutdown survives a crash"),
        ("truncate-no-sync", "nothing committed is lost"),
    ] {
        let run = |modes: &str| {
            let out = txstore_env(
                &[
                    "conformance",
                    "wipe-on-crash",
                    "--ops",
                    "60",
                    "--seeds",
                    "0",
                    "--max-points",
                    "6",
                    "--power-seeds",
                    "0",
                    "--no-io-errors",
                    "--modes",
                    modes,
                ],
                &[("TXSTORE_MUTANT", mutant)],
            );
            (
                out.status.success(),
                format!("{}{}", stdout(&out), stderr(&out)),
            )
        };
        let (ok_lossy, text) = run("lossy");
        assert!(
            ok_lossy,
            "{mutant}: the lossy mode must not see it:\n{text}"
        );
        let (ok_power, text) = run("power");
        assert!(!ok_power, "{mutant}: the power mode accepted it:\n{text}");
        assert!(
            text.contains(property),
            "{mutant}: no failure names `{property}`:\n{text}"
        );
    }
}

#[cfg(not(feature = "mutants"))]
#[test]
fn host_mutants_are_caught_by_power_loss_only() {
    assert!(
        std::env::var("CI").is_err(),
        "CI must run the tests with --features mutants (see README)"
    );
    eprintln!("SKIPPED host mutants: build with `cargo test --release --features mutants`");
}
