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
    let state = dir.path().join("state");
    while !txstore::testing::is_served(&state) {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before it served"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no live-query socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The state directory holds only files and directories: crash tests
    // and operators copy it (the socket is an abstract one, in no directory).
    assert_only_files(&state);

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
    assert!(
        !txstore::testing::is_served(&state),
        "the run's socket outlived it"
    );
    // After the run the store answers offline, with the whole input.
    assert_eq!(prefix_of(&scan(config, "committed")), Ok(RECORDS));
    eprintln!(
        "{round} rounds of queries; {} read-committed and {} read-uncommitted scans mid-run",
        committed.mid_run, uncommitted.mid_run
    );
}

/// Starts `txstore run` on `input` with the kv processor and waits until
/// it serves live queries.
fn start_run(
    dir: &std::path::Path,
    input: &std::path::Path,
    env: &[(&str, &str)],
) -> std::process::Child {
    let config = write_config(
        dir,
        "buffered",
        "[task]\nprocessor = \"kv\"\ncommit_interval_records = 1000\ncommit_interval_ms = 3600000\n",
    );
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "--config",
        config.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ])
    .env("XDG_CACHE_HOME", cache_dir())
    .env_remove("TXSTORE_CRASH_AT")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut run = cmd.spawn().unwrap();
    let started = Instant::now();
    while !txstore::testing::is_served(&dir.join("state")) {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before it served"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no live-query socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    run
}

fn finish(mut run: std::process::Child) {
    let status = run.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the run failed: {err}");
}

/// A client finds the running task whatever its environment (another
/// TMPDIR or XDG_RUNTIME_DIR, one too long for a socket path): the name
/// comes from the state directory alone.
#[test]
fn live_queries_do_not_depend_on_the_clients_environment() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.tsv");
    let text: String = (0..600_000)
        .map(|i| format!("k{}\t{i}\n", i % KEYS))
        .collect();
    std::fs::write(&input, text).unwrap();
    let run = start_run(dir.path(), &input, &[("TMPDIR", "/tmp")]);
    let long = dir.path().join("x".repeat(120));
    std::fs::create_dir(&long).unwrap();
    let config = dir.path().join("txstore.toml");
    let env = [
        ("TMPDIR", long.to_str().unwrap()),
        ("XDG_RUNTIME_DIR", long.to_str().unwrap()),
    ];
    let out = txstore_env(&["get", "k1", "--config", config.to_str().unwrap()], &env);
    // Answered by the task (offline, the store's lock would refuse it).
    let v: u64 = ok(&out).trim().parse().unwrap();
    assert_eq!(v % KEYS, 1);
    finish(run);
}

/// A hostile client: a bad range, a scan of more than a page, a client
/// that sends one byte at a time, more idle connections than the task
/// serves. None stops the task, and it keeps committing meanwhile.
#[test]
fn a_hostile_client_cannot_stop_or_stall_the_task() {
    use std::io::Write as _;
    use std::os::linux::net::SocketAddrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.tsv");
    // 10,000 distinct keys first (a scan of more than two pages), then
    // long enough a run to query it.
    let mut text: String = (0..10_000).map(|i| format!("d{i:05}\t{i}\n")).collect();
    text.extend((0..1_500_000).map(|i| format!("k{}\t{i}\n", i % KEYS)));
    std::fs::write(&input, text).unwrap();
    let run = start_run(dir.path(), &input, &[]);
    let config = dir.path().join("txstore.toml");
    let c = config.to_str().unwrap();
    let state = dir.path().join("state");

    // A range whose start is after its end: the client's error, not the task's.
    let out = txstore(&["scan", "--config", c, "--from", "z", "--to", "a"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("start is after its end"),
        "{}",
        stderr(&out)
    );

    // Idle and slow clients, more than the task serves at once.
    let name = txstore::testing::socket_name(&state).unwrap();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let idle: Vec<_> = (0..40)
        .map(|_| std::os::unix::net::UnixStream::connect_addr(&addr).unwrap())
        .collect();
    let slow = std::thread::spawn(move || {
        let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        for b in br#"{"op":"get","key":"azE=","committed":true}"# {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    // The task keeps committing meanwhile: read-committed moves on.
    let first = ok(&txstore(&[
        "scan",
        "--config",
        c,
        "--isolation",
        "committed",
        "--count",
    ]));
    let at = |key: &str| -> u64 {
        ok(&txstore(&[
            "get",
            key,
            "--config",
            c,
            "--isolation",
            "committed",
        ]))
        .trim()
        .parse()
        .unwrap_or(0)
    };
    let before = at("k0");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let asked = Instant::now();
    let after = at("k0");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "a query took {:?} with hostile clients connected",
        asked.elapsed()
    );
    assert!(
        after > before,
        "no commit in {:?} with hostile clients connected (k0 = {before}, then {after})",
        started.elapsed()
    );
    drop(idle);
    let _ = slow.join();

    // A scan of more pages than one answer holds: every key once, in order.
    let keys = ok(&txstore(&[
        "scan",
        "--config",
        c,
        "--isolation",
        "committed",
        "--from",
        "d",
        "--to",
        "e",
    ]));
    let keys: Vec<&str> = keys
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(keys.len(), 10_000, "{first}");
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "the pages overlap or go back"
    );
    finish(run);
}
