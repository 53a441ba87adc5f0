//! Live queries: `get` and `scan` against a running `txstore run`, at both
//! isolation levels, each answer checked against the states the input
//! passes through.

use crate::common::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Record `i` puts key `k{i % KEYS}` = `i`, so a state tells how many
/// records made it: one more than the largest value.
const KEYS: u64 = 97;
const RECORDS: u64 = 400_000;
/// Commits only every this many records (no time-based commits).
const COMMIT_EVERY: u64 = 1_000;

/// The state after the first `p` records.
fn oracle(p: u64) -> BTreeMap<String, u64> {
    (0..KEYS.min(p))
        .map(|j| (format!("k{j}"), j + KEYS * ((p - 1 - j) / KEYS)))
        .collect()
}

/// How many records `state` holds, if it is exactly the state after some
/// prefix of the input.
fn prefix_of(state: &BTreeMap<String, u64>) -> Result<u64, String> {
    let p = state.values().max().map_or(0, |m| m + 1);
    if *state == oracle(p) {
        Ok(p)
    } else {
        Err(format!(
            "not the state after any prefix of the input (largest value {})",
            p as i64 - 1
        ))
    }
}

fn scan(config: &str, isolation: &str) -> BTreeMap<String, u64> {
    let out = ok(&txstore(&[
        "scan",
        "--config",
        config,
        "--isolation",
        isolation,
    ]));
    out.lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').expect("key<TAB>value");
            (k.to_string(), v.parse().expect("a record number"))
        })
        .collect()
}

#[track_caller]
fn assert_only_files(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            assert_only_files(&entry.path());
        } else {
            assert!(kind.is_file(), "{} is not a file", entry.path().display());
        }
    }
}

/// What one isolation level's scans showed so far.
struct Level {
    name: &'static str,
    last: u64,
    /// Answers that were neither the empty store nor the whole input.
    mid_run: u64,
}

impl Level {
    fn new(name: &'static str) -> Self {
        Level {
            name,
            last: 0,
            mid_run: 0,
        }
    }

    /// Checks a scan's state is a prefix's and no older than the last one;
    /// returns the prefix's length.
    fn saw(&mut self, state: &BTreeMap<String, u64>, round: u64) -> u64 {
        let p = prefix_of(state).unwrap_or_else(|e| panic!("{} scan {round}: {e}", self.name));
        assert!(
            p >= self.last,
            "{} went back from {} to {p} records",
            self.name,
            self.last
        );
        self.last = p;
        if 0 < p && p < RECORDS {
            self.mid_run += 1;
        }
        p
    }
}

#[test]
fn a_running_task_answers_both_isolation_levels_with_states_it_had() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.tsv");
    let mut text = String::with_capacity(RECORDS as usize * 14);
    for i in 0..RECORDS {
        text.push_str(&format!("k{}\t{i}\n", i % KEYS));
    }
    std::fs::write(&input, text).unwrap();
    let config = write_config(
        dir.path(),
        "roll-forward",
        &format!(
            "[task]\nprocessor = \"kv\"\ncommit_interval_records = {COMMIT_EVERY}\ncommit_interval_ms = 3600000\n"
        ),
    );
    let config = config.to_str().unwrap();
    let mut run = Command::new(bin())
        .args([
            "run",
            "--config",
            config,
            "--input",
            input.to_str().unwrap(),
        ])
        .env("XDG_CACHE_HOME", cache_dir())
        .env_remove("TXSTORE_CRASH_AT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let socket = loop {
        let state = dir.path().join("state");
        if let Some(socket) = txstore::task::serve::socket_path(&state).unwrap() {
            if socket.exists() {
                break socket;
            }
        }
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before it served"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no live-query socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // The state directory holds only files and directories: crash tests
    // and operators copy it, and a socket cannot be copied.
    assert_only_files(&dir.path().join("state"));

    // Queries while the run goes: every committed answer is a state the
    // task had at a commit, every uncommitted one a state it had between
    // records; neither goes back in time, and uncommitted never trails
    // the committed state seen before it.
    let mut committed = Level::new("read-committed");
    let mut uncommitted = Level::new("read-uncommitted");
    let mut round = 0u64;
    while run.try_wait().unwrap().is_none() {
        round += 1;
        let c = committed.saw(&scan(config, "committed"), round);
        assert!(
            c % COMMIT_EVERY == 0 || c == RECORDS,
            "read-committed scan {round} shows the state after {c} records, not a commit's"
        );
        let u = uncommitted.saw(&scan(config, "uncommitted"), round);
        assert!(
            u >= c,
            "read-uncommitted shows {u} records, fewer than the {c} committed before"
        );

        // A point read and a limited scan go through the same socket.
        if c == 0 {
            continue;
        }
        let v: u64 = ok(&txstore(&["get", "k0", "--config", config]))
            .trim()
            .parse()
            .unwrap();
        assert_eq!(v % KEYS, 0, "k0 holds a value of another key: {v}");
        let next_commit = (v + 1).div_ceil(COMMIT_EVERY) * COMMIT_EVERY;
        assert!(
            next_commit <= v + KEYS || v + KEYS >= RECORDS,
            "read-committed get k0 = {v}: no commit falls after record {v} and before k0's next write"
        );
        let page = ok(&txstore(&[
            "scan",
            "--config",
            config,
            "--limit",
            "3",
            "--isolation",
            "uncommitted",
        ]));
        if u > 2 {
            assert_eq!(page.lines().count(), 3, "scan --limit 3 answered:\n{page}");
        }
    }
    let status = run.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "run failed: {err}");
    assert!(
        committed.mid_run > 0 && uncommitted.mid_run > 0,
        "no query was answered mid-run in {round} rounds ({} committed, {} uncommitted)",
        committed.mid_run,
        uncommitted.mid_run
    );
    assert!(!socket.exists(), "the run left its socket behind");
    // After the run the store answers offline, with the whole input.
    assert_eq!(prefix_of(&scan(config, "committed")), Ok(RECORDS));
    eprintln!(
        "{round} rounds of queries; {} read-committed and {} read-uncommitted scans mid-run",
        committed.mid_run, uncommitted.mid_run
    );
}

/// A socket directory that cannot be used turns live queries off with one
/// warning line; the run and the queries of a stopped store go on.
#[test]
fn an_unusable_socket_directory_turns_only_live_queries_off() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let probe = runtime.join("probe");
    std::fs::write(&probe, "").unwrap();
    let uid = std::fs::metadata(&probe).unwrap().uid();
    // A file where this user's socket directory should be.
    std::fs::write(runtime.join(format!("txstore-{uid}")), "").unwrap();
    let input = dir.path().join("input.tsv");
    std::fs::write(&input, "a\t1\nb\t2\n").unwrap();
    let config = write_config(dir.path(), "buffered", "[task]\nprocessor = \"kv\"\n");
    let config = config.to_str().unwrap();
    let env = [("XDG_RUNTIME_DIR", runtime.to_str().unwrap())];
    let out = txstore_env(
        &[
            "run",
            "--config",
            config,
            "--input",
            input.to_str().unwrap(),
        ],
        &env,
    );
    ok(&out);
    let err = stderr(&out);
    assert_eq!(
        err.matches("live queries are off").count(),
        1,
        "one warning line expected:\n{err}"
    );
    let out = txstore_env(&["get", "b", "--config", config], &env);
    assert_eq!(ok(&out), "2\n");
}
