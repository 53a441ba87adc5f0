//! The transactional guests (roll-forward, roll-back, buffered) under the
//! exactly-once protocol: word count killed at every named point and at every
//! storage call the guest makes inside `commit` and `recover`, restarted until
//! it finishes, checked against `tr | sort | uniq -c`; isolation levels;
//! buffered's memory bound.

use crate::common::{ok, planted, recover_json, runtime, txstore, txstore_env, write_config};
use crate::kv::open;
use crate::protocol::{input, run_crashing, run_to_end, shell_count, store_counts};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use txstore::testing::copy_dir;
use txstore::testing::ProcessorSpec;
use txstore::testing::{Backend, RocksBackend};
use txstore::Config;
use txstore::Isolation;
use txstore::Task;

const RC: Isolation = Isolation::ReadCommitted;
const RU: Isolation = Isolation::ReadUncommitted;

/// Lines of input and records per commit for the sweeps: small enough to
/// run hundreds of processes, large enough for several commits.
pub const LINES: usize = 200;
pub const INTERVAL: u64 = 50;

/// Named-point scenarios for a transactional guest on `LINES` lines. Each
/// `during-restore` follows a crash that leaves a transaction to replay.
pub const SCENARIOS: &[&[&str]] = &[
    &["after-write@60"],
    &["after-changelog-commit@2"],
    &["after-store-commit@2"],
    &["after-checkpoint"],
    &["after-changelog-commit@2", "during-restore"],
    // The task's write cache just reached the guest, uncommitted.
    &["after-flush@3"],
    &[
        "after-changelog-commit",
        "after-store-commit@2",
        "after-write@30",
        "after-changelog-commit",
        "during-restore",
    ],
];

/// A word-count store for `guest` in a fresh directory.
fn setup(guest: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), LINES);
    let extra = format!(
        "[task]\nguarantee = \"exactly-once\"\nprocessor = \"word-count\"\ninput = \"input.txt\"\n\
         commit_interval_records = {INTERVAL}\ncommit_interval_ms = 600000\n"
    );
    let config = write_config(dir.path(), guest, &extra);
    (dir, config)
}

/// Runs `txstore recover --json` on a copy of the crashed store and checks
/// that a transactional guest neither wiped nor replayed more than the one
/// transaction a crash can leave between changelog and store. Returns the
/// storage calls recovery made (the `recover-call:N` points it reaches).
fn check_recovery_of_copy(dir: &Path, context: &str) -> u64 {
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir, copy.path()).unwrap();
    let config = copy.path().join("txstore.toml");
    let report = recover_json(&config);
    let json = report.to_string();
    assert_ne!(report["action"], "wiped", "{context}: {json}");
    assert!(
        report["replayed_transactions"].as_u64().unwrap() <= 1,
        "{context}: replayed more than one transaction: {json}"
    );
    report["recover_storage_calls"].as_u64().unwrap()
}

/// Storage calls an uncrashed run makes inside `commit`.
fn commit_calls(guest: &str) -> u64 {
    let (_dir, config) = setup(guest);
    let json = ok(&txstore(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["storage_calls"]["commit"].as_u64().unwrap()
}

/// Crashes at `points` in turn (each followed by a recovery check on a
/// copy), then at `recover-call:M` for every call the last recovery makes,
/// finishing each and comparing with the shell's count. Returns the number
/// of crashes made.
fn crash_everywhere(guest: &str, points: &[String], recover_sweep: bool) -> u64 {
    let (dir, config) = setup(guest);
    let expected = shell_count(&dir.path().join("input.txt"));
    let mut crashes = 0;
    for p in points {
        run_crashing(&config, p);
        crashes += 1;
    }
    let context = format!("{guest} crashed at {points:?}");
    let recover_calls = check_recovery_of_copy(dir.path(), &context);
    if recover_sweep {
        for m in 1..=recover_calls {
            let copy = tempfile::tempdir().unwrap();
            copy_dir(dir.path(), copy.path()).unwrap();
            let config = copy.path().join("txstore.toml");
            let point = format!("recover-call:{m}");
            run_crashing(&config, &point);
            crashes += 1;
            let context = format!("{context} then at {point}");
            check_recovery_of_copy(copy.path(), &context);
            run_to_end(&config);
            assert_eq!(expected, store_counts(&config), "{context}");
        }
    }
    run_to_end(&config);
    assert_eq!(expected, store_counts(&config), "{context}");
    crashes
}

/// The whole sweep for one guest (a built-in name or a `.wasm` path).
pub fn sweep(guest: &str) {
    sweep_in(guest, SCENARIOS);
}

/// [`sweep`] over `scenarios`.
fn sweep_in(guest: &str, scenarios: &[&[&str]]) {
    let mut crashes = 0;
    for points in scenarios {
        let points: Vec<String> = points.iter().map(|p| p.to_string()).collect();
        crashes += crash_everywhere(guest, &points, true);
    }
    let calls = commit_calls(guest);
    assert!(
        calls >= LINES as u64 / INTERVAL,
        "{guest}: only {calls} storage calls in commit"
    );
    for n in 1..=calls {
        crashes += crash_everywhere(guest, &[format!("commit-call:{n}")], true);
    }
    eprintln!("{guest}: {crashes} crashes, {calls} commit-call points, exact counts after each");
}

/// A guest may refuse the task's write cache as one batch (the contract
/// asks only that it take any single write when it holds nothing): the
/// cached records then go one by one, each with its own boundary for an
/// early commit, exact under every crash. Without that path the run stops
/// at its first commit. (No batch reaches it whole, so no `after-flush`.)
#[test]
fn a_guest_that_refuses_batches_gets_the_cache_record_by_record() {
    let wasm = planted(Some("small-batches"));
    let scenarios: Vec<&[&str]> = SCENARIOS
        .iter()
        .copied()
        .filter(|s| !s.iter().any(|p| p.starts_with("after-flush")))
        .collect();
    sweep_in(wasm.to_str().unwrap(), &scenarios);
}

#[test]
fn roll_forward_survives_every_crash_point() {
    sweep("roll-forward");
}

#[test]
fn roll_back_survives_every_crash_point() {
    sweep("roll-back");
}

#[test]
fn roll_back_snapshot_survives_every_crash_point() {
    sweep("roll-back-snapshot");
}

#[test]
fn buffered_survives_every_crash_point() {
    sweep("buffered");
}

/// Read-committed never sees an uncommitted put, overwrite or delete, in
/// point reads, batched reads or ranges; read-uncommitted sees all three.
#[test]
fn isolation_levels_for_every_transactional_guest() {
    for guest in [
        "roll-forward",
        "roll-back",
        "roll-back-snapshot",
        "buffered",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn Backend> = Arc::new(RocksBackend::open(dir.path()).unwrap());
        let mut s = open(guest, &backend);
        for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
            s.put(k.as_bytes(), v.as_bytes()).unwrap();
        }
        s.commit(1).unwrap();
        s.put(b"b", b"20").unwrap(); // overwrite
        s.delete(b"c").unwrap(); // delete in the open transaction
        s.put(b"d", b"4").unwrap(); // new key
        let keys: Vec<Vec<u8>> = ["a", "b", "c", "d"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        let view = |pairs: &[(&str, &str)]| -> Vec<(Vec<u8>, Vec<u8>)> {
            pairs
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect()
        };
        let committed = view(&[("a", "1"), ("b", "2"), ("c", "3")]);
        let uncommitted = view(&[("a", "1"), ("b", "20"), ("d", "4")]);
        let point = |s: &mut txstore::testing::StoreInstance, iso| -> Vec<Option<Vec<u8>>> {
            keys.iter().map(|k| s.get(k, iso).unwrap()).collect()
        };
        let as_opts = |pairs: &[(Vec<u8>, Vec<u8>)]| -> Vec<Option<Vec<u8>>> {
            keys.iter()
                .map(|k| pairs.iter().find(|(pk, _)| pk == k).map(|(_, v)| v.clone()))
                .collect()
        };
        assert_eq!(
            point(&mut s, RC),
            as_opts(&committed),
            "{guest}: read-committed get"
        );
        assert_eq!(
            s.get_many(&keys, RC).unwrap(),
            as_opts(&committed),
            "{guest}: read-committed get-many"
        );
        assert_eq!(
            s.range_all(None, None, RC).unwrap(),
            committed,
            "{guest}: read-committed range"
        );
        assert_eq!(
            point(&mut s, RU),
            as_opts(&uncommitted),
            "{guest}: read-uncommitted get"
        );
        assert_eq!(
            s.get_many(&keys, RU).unwrap(),
            as_opts(&uncommitted),
            "{guest}: read-uncommitted get-many"
        );
        assert_eq!(
            s.range_all(None, None, RU).unwrap(),
            uncommitted,
            "{guest}: read-uncommitted range"
        );
        // Bounded ranges cut through the merge correctly.
        assert_eq!(
            s.range_all(Some(b"b"), Some(b"d"), RC).unwrap(),
            committed[1..],
            "{guest}"
        );
        assert_eq!(
            s.range_all(Some(b"b"), Some(b"e"), RU).unwrap(),
            uncommitted[1..],
            "{guest}"
        );
        assert!(s.approximate_uncommitted_bytes().unwrap() > 0, "{guest}");
        s.commit(2).unwrap();
        assert_eq!(
            s.range_all(None, None, RC).unwrap(),
            uncommitted,
            "{guest}: after commit"
        );
        assert_eq!(s.approximate_uncommitted_bytes().unwrap(), 0, "{guest}");
        assert_eq!(s.committed_offset().unwrap(), Some(2), "{guest}");
    }
}

/// The same through the command line: a crash leaves writes of an open
/// transaction in the state directory, and `get`/`scan` recover first, so
/// both isolation levels show only committed data afterwards.
#[test]
fn cli_queries_after_a_crash_show_only_committed_data() {
    for guest in ["roll-forward", "roll-back", "buffered"] {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), guest, "");
        let c = config.to_str().unwrap();
        ok(&txstore(&["put", "k", "committed", "--config", c]));
        // `put` commits after its write: crash between write and commit.
        let out = txstore_env(
            &["put", "k", "open", "--config", c],
            &[("TXSTORE_CRASH_AT", "after-write")],
        );
        assert!(
            !out.status.success(),
            "{guest}: the crash point was not reached"
        );
        for iso in ["committed", "uncommitted"] {
            let got = ok(&txstore(&["get", "k", "--config", c, "--isolation", iso]));
            assert_eq!(got.trim(), "committed", "{guest} at {iso}");
            let scan = ok(&txstore(&["scan", "--config", c, "--isolation", iso]));
            assert_eq!(scan.trim(), "k\tcommitted", "{guest} at {iso}");
        }
    }
}

/// With a 64 KiB limit, buffered commits early and its linear memory stays
/// within the limit plus a constant, however long the input.
#[test]
fn buffered_commits_early_and_bounds_its_memory() {
    const LIMIT: u64 = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let text = input(dir.path(), 6000);
    let mut config = Config::new("buffered", dir.path());
    config.store.options.insert(
        "max_uncommitted_bytes".into(),
        toml::Value::Integer(LIMIT as i64),
    );
    config.task.processor = ProcessorSpec::WordCount;
    config.task.commit_interval_records = u64::MAX;
    config.task.commit_interval_ms = u64::MAX;
    config.task.max_uncommitted_bytes = u64::MAX; // only the guest's own limit
                                                  // buffered takes any one call when it holds nothing: a cache flush
                                                  // bigger than its limit would go in whole (docs/configuration.md).
    config.task.max_cache_bytes = LIMIT / 4;
    let (mut task, _) = Task::open(&config, runtime()).unwrap();
    let at_open = task.guest_peak_memory_bytes();
    let bytes = std::fs::read(&text).unwrap();
    let mut position = 0u64;
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        position += line.len() as u64;
        task.process_line(line.strip_suffix(b"\n").unwrap_or(line), position)
            .unwrap();
        assert!(
            task.store().approximate_uncommitted_bytes().unwrap() <= LIMIT,
            "buffer past the limit"
        );
    }
    task.commit().unwrap();
    let peak = task.guest_peak_memory_bytes();
    let stored: std::collections::BTreeMap<String, u64> = task
        .store()
        .range_all(None, None, RC)
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k).unwrap(),
                String::from_utf8(v).unwrap().parse().unwrap(),
            )
        })
        .collect();
    let stats = task.close().unwrap();
    eprintln!(
        "buffered at 64 KiB: {} early commits of {}, peak memory {peak} bytes (at open {at_open})",
        stats.early_commits, stats.commits
    );
    assert!(stats.early_commits >= 10, "{stats:?}");
    // The map, the batch it moves into at commit and the copy the host
    // lowers into: a few times the limit, plus allocator slack.
    const CONSTANT: u64 = 256 << 10;
    assert!(
        peak <= at_open + 4 * LIMIT + CONSTANT,
        "peak {peak} > {at_open} + 4 x {LIMIT} + {CONSTANT}"
    );
    let expected = shell_count(&text);
    let wrong: Vec<_> = expected
        .iter()
        .filter(|(w, n)| stored.get(*w) != Some(n))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty() && expected.len() == stored.len(),
        "counts differ: {wrong:?} ({} vs {} words)",
        expected.len(),
        stored.len()
    );
}
