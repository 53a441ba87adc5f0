//! Processors brought as wasm components (the `processor` world): the Rust
//! example (guests/running-stats) and the Python one
//! (examples/python-processor, in polyglot.rs) run under every strategy,
//! crashed and power-cut at every named point of the protocol, and checked
//! exactly against an independent computation of the store and the output
//! file. Then the mistakes an operator makes with them.

use crate::common::{build_component, ok, scan, stderr, txstore, txstore_env, write_config};
use crate::output::committed;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Input lines and records per commit for the sweeps.
const LINES: usize = 300;
const INTERVAL: u64 = 40;

/// Crash scenarios on `LINES` lines (see `crash::STEPS`); each ends with
/// a run to the end.
const SCENARIOS: &[&[&str]] = &[
    &["after-write@150"],
    &["before-output-index-sync@3"],
    &["before-output-index-sync@3+power"],
    &["before-changelog-sync@3"],
    &["before-changelog-sync@3+power"],
    &["after-changelog-commit@3"],
    &["after-store-commit@3"],
    &["after-checkpoint"],
    &["after-changelog-commit@3", "during-restore"],
    &["after-write@150+power"],
    &["after-changelog-commit@3+power"],
    &[
        "after-write@60+power",
        "after-changelog-commit@2+power",
        "during-restore",
    ],
];

/// The test-only processor that misbehaves on request (tests/hostile-processor).
pub fn hostile_processor() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build_component("hostile-processor", None))
}

/// The Rust example processor, written out once for this test run.
pub fn rust_processor() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("running_stats.wasm");
        let bytes =
            txstore_artifacts::processor("running-stats").expect("built by artifacts/build.rs");
        std::fs::write(&path, bytes).unwrap();
        path
    })
}

/// `key<TAB>number` lines from a seeded generator, with some a processor
/// must skip (no tab, empty key, not a number, out of i64 range).
pub fn stats_input(dir: &Path, lines: usize, seed: u64) -> PathBuf {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut text = String::new();
    for _ in 0..lines {
        let r = next();
        let key = format!("k{}", r % 13);
        let n = (next() % 2001) as i64 - 1000;
        match r % 40 {
            0 => text.push_str("no tab here\n"),
            1 => text.push_str(&format!("\t{n}\n")),
            2 => text.push_str(&format!("{key}\t{n}x\n")),
            3 => text.push_str(&format!("{key}\t99999999999999999999\n")),
            4 => text.push_str(&format!("{key}\t{}\n", i64::MIN)),
            _ => text.push_str(&format!("{key}\t{n}\n")),
        }
    }
    let path = dir.join("input.txt");
    std::fs::write(&path, text).unwrap();
    path
}

/// The oracle, from the input alone: the store (`prefix` + key ->
/// `count sum min max`) and the output file (each accepted record's new
/// statistics, in input order).
pub fn expected(input: &Path, prefix: &str) -> (BTreeMap<String, String>, String) {
    let mut stats: BTreeMap<String, (u64, i128, i64, i64)> = BTreeMap::new();
    let mut out = String::new();
    for line in std::fs::read_to_string(input).unwrap().lines() {
        let Some((key, n)) = line.split_once('\t') else {
            continue;
        };
        let valid = !key.is_empty()
            && !n.is_empty()
            && n.strip_prefix('-')
                .unwrap_or(n)
                .bytes()
                .all(|b| b.is_ascii_digit());
        let Some(n) = valid.then(|| n.parse::<i64>().ok()).flatten() else {
            continue;
        };
        let s = stats.entry(key.to_string()).or_insert((0, 0, n, n));
        *s = (s.0 + 1, s.1 + n as i128, s.2.min(n), s.3.max(n));
        out.push_str(&format!("{key}\t{} {} {} {}\n", s.0, s.1, s.2, s.3));
    }
    let store = stats
        .into_iter()
        .map(|(k, s)| {
            (
                format!("{prefix}{k}"),
                format!("{} {} {} {}", s.0, s.1, s.2, s.3),
            )
        })
        .collect();
    (store, out)
}

fn config(dir: &Path, guest: &str, processor: &Path) -> PathBuf {
    let extra = format!(
        "[task]\nprocessor = {:?}\nprocessor_options = {{ prefix = \"s/\" }}\ninput = \"input.txt\"\n\
         output = {{ kind = \"file\", path = \"state/out.tsv\" }}\ncommit_interval_records = {INTERVAL}\n\
         commit_interval_ms = 600000\n",
        processor.display().to_string()
    );
    write_config(dir, guest, &extra)
}

fn run(config: &Path, point: Option<&str>) -> std::process::Output {
    let mut env = vec![("TXSTORE_POWER_SIM", "1")];
    if let Some(p) = point {
        env.push(("TXSTORE_CRASH_AT", p));
    }
    txstore_env(&["run", "--config", config.to_str().unwrap()], &env)
}

/// Crashes `processor` under every strategy at every scenario's points;
/// after each crash a reader of the output sees a prefix of the exact
/// output, and after the run to the end the store and the output are
/// exact. Returns the number of crashes.
pub fn sweep(processor: &Path) -> usize {
    let mut crashes = 0;
    for guest in ["roll-forward", "roll-back", "buffered", "wipe-on-crash"] {
        for (i, points) in SCENARIOS.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let input = stats_input(dir.path(), LINES, i as u64 + 1);
            let (want_store, want_out) = expected(&input, "s/");
            let config = config(dir.path(), guest, processor);
            // In the state directory, where the power simulation covers it.
            let out = dir.path().join("state/out.tsv");
            let context = format!(
                "{} under {guest}, crashed at {points:?}",
                processor.display()
            );
            for p in *points {
                crash_at(&config, &out, p, &want_out, &context);
                crashes += 1;
            }
            finish(&config, &out, &want_store, &want_out, &context);
            let whole = std::fs::read_to_string(&out).unwrap();
            assert!(
                whole == want_out,
                "{context}: the output file differs: {}",
                first_difference(&whole, &want_out)
            );
        }
    }
    crashes
}

/// A run that aborts at crash point `p`; a reader of the output then sees
/// a prefix of the exact output `want_out`.
fn crash_at(config: &Path, out: &Path, p: &str, want_out: &str, context: &str) {
    let o = run(config, Some(p));
    assert_eq!(
        o.status.signal(),
        Some(6),
        "{context}: no abort at {p}: {}",
        stderr(&o)
    );
    assert!(
        want_out.starts_with(&committed(out)),
        "{context}: after the crash at {p} the committed output is not a prefix of the exact one"
    );
}

/// A run to the end; the store and the committed output are then exact.
fn finish(
    config: &Path,
    out: &Path,
    want_store: &BTreeMap<String, String>,
    want_out: &str,
    context: &str,
) {
    ok(&run(config, None));
    assert_eq!(&scan(config), want_store, "{context}: the store differs");
    let seen = committed(out);
    assert!(
        seen == want_out,
        "{context}: the committed output differs: {}",
        first_difference(&seen, want_out)
    );
}

/// Where two outputs part, in one line.
fn first_difference(got: &str, want: &str) -> String {
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    match (0..g.len().max(w.len())).find(|&i| g.get(i) != w.get(i)) {
        Some(i) => format!(
            "line {}: got {:?}, want {:?} ({} lines, want {})",
            i + 1,
            g.get(i),
            w.get(i),
            g.len(),
            w.len()
        ),
        None => "identical lines".into(),
    }
}

#[test]
fn rust_processor_is_exact_after_every_crash_and_power_loss() {
    let crashes = sweep(rust_processor());
    eprintln!("running-stats: {crashes} crashes, exact after each");
}

/// The 0.2.0 test processor that uses every batched `state` call
/// (tests/batch-processor).
fn batch_processor() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build_component("batch-processor", None))
}

/// Lines of words for the batch processor: counts (repeated words in a
/// line too), deletes `-w`, prefix queries `?p` and `!bad`.
fn batch_input(lines: usize, seed: u64) -> Vec<String> {
    const WORDS: &[&str] = &[
        "a",
        "ab",
        "abc",
        "b",
        "ba",
        "bab",
        "c",
        "cab",
        "\u{e9}t\u{e9}",
    ];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    (0..lines)
        .map(|_| {
            let words: Vec<String> = (0..1 + next(6))
                .map(|_| {
                    let w = WORDS[next(WORDS.len() as u64) as usize];
                    match next(20) {
                        0..=2 => format!("-{w}"),
                        3 => format!(
                            "?{}",
                            w.chars().take(1 + next(2) as usize).collect::<String>()
                        ),
                        4 => "?".to_string(),
                        5 if next(10) == 0 => "!bad".to_string(),
                        _ => w.to_string(),
                    }
                })
                .collect();
            words.join(" ")
        })
        .collect()
}

/// The batch processor's oracle: the store (word -> count) and the output.
fn batch_expected(lines: &[String]) -> (BTreeMap<String, String>, String) {
    let mut store: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = String::new();
    for line in lines {
        let words: Vec<&str> = line.split(' ').filter(|w| !w.is_empty()).collect();
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for w in words.iter().filter(|w| !w.starts_with(['-', '?', '!'])) {
            *counts.entry(w).or_default() += 1;
        }
        for (w, n) in counts {
            let c = store.entry(w.to_string()).or_default();
            *c += n;
            out.push_str(&format!("{w}\t{c}\n"));
        }
        let deletes: std::collections::BTreeSet<&str> =
            words.iter().filter_map(|w| w.strip_prefix('-')).collect();
        for w in deletes {
            store.remove(w);
            out.push_str(&format!("{w}\n"));
        }
        for w in words.iter().filter(|w| w.starts_with(['?', '!'])) {
            let answer = match w.strip_prefix('?') {
                Some(p) => store
                    .keys()
                    .filter(|k| k.starts_with(p))
                    .count()
                    .to_string(),
                None => "refused".into(),
            };
            out.push_str(&format!("{w}\t{answer}\n"));
        }
    }
    let store = store.into_iter().map(|(k, n)| (k, n.to_string())).collect();
    (store, out)
}

/// A processor built against 0.2.0 reads with `get-many` and pages of
/// `range` and writes with `put-many` and `delete-many` (all packed), and
/// is exact under every strategy, crashed and power-cut mid-run; a
/// malformed packed batch is refused, not applied.
#[test]
fn a_processor_using_the_batched_calls_is_exact_after_crashes() {
    let processor = batch_processor();
    let inspected = ok(&txstore(&["inspect", processor.to_str().unwrap()]));
    assert!(inspected.contains("processor@0.2.0"), "{inspected}");
    for guest in ["roll-forward", "roll-back", "buffered", "wipe-on-crash"] {
        for (i, point) in ["after-write@150", "after-changelog-commit@3+power"]
            .iter()
            .enumerate()
        {
            let dir = tempfile::tempdir().unwrap();
            let lines = batch_input(LINES, i as u64 + 7);
            std::fs::write(dir.path().join("input.txt"), lines.join("\n") + "\n").unwrap();
            let (want_store, want_out) = batch_expected(&lines);
            let extra = format!(
                "[task]\nprocessor = {:?}\ninput = \"input.txt\"\n\
                 output = {{ kind = \"file\", path = \"state/out.tsv\" }}\n\
                 commit_interval_records = {INTERVAL}\ncommit_interval_ms = 600000\n",
                processor.display().to_string()
            );
            let config = write_config(dir.path(), guest, &extra);
            let out = dir.path().join("state/out.tsv");
            let context = format!("batch-processor under {guest}");
            crash_at(&config, &out, point, &want_out, &context);
            finish(&config, &out, &want_store, &want_out, &context);
        }
    }
}

/// A processor's options reach its `init`; one it does not know stops the
/// run before anything is created, naming the option.
#[test]
fn processor_options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    stats_input(dir.path(), 10, 1);
    let path = write_config(
        dir.path(),
        "buffered",
        &format!(
            "[task]\nprocessor = {:?}\nprocessor_options = {{ prefx = \"s/\" }}\ninput = \"input.txt\"\n",
            rust_processor().display().to_string()
        ),
    );
    let o = txstore(&["run", "--config", path.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("unknown option `prefx`"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !dir.path().join("state").exists(),
        "a refused processor created the state directory"
    );
}

/// Operator mistakes with `task.processor`: one error line each, saying
/// what to do.
#[test]
fn a_wrong_processor_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    stats_input(dir.path(), 10, 1);
    let strategy = dir.path().join("strategy.wasm");
    std::fs::write(&strategy, txstore_artifacts::builtin("buffered").unwrap()).unwrap();
    for (processor, says) in [
        ("word_count", "unknown processor `word_count`"),
        ("missing.wasm", "cannot read processor"),
        (
            "strategy.wasm",
            "it is a store component: name it in store.guest",
        ),
    ] {
        let path = write_config(
            dir.path(),
            "buffered",
            &format!("[task]\nprocessor = {processor:?}\ninput = \"input.txt\"\n"),
        );
        let o = txstore(&["run", "--config", path.to_str().unwrap()]);
        let err = stderr(&o);
        assert!(
            !o.status.success() && err.contains(says),
            "{processor}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{processor}: {err}");
    }
    // And the other way round: a processor named as the store's guest.
    let path = write_config(
        dir.path(),
        rust_processor().to_str().unwrap(),
        "[task]\ninput = \"input.txt\"\n",
    );
    let err = stderr(&txstore(&["run", "--config", path.to_str().unwrap()]));
    assert!(
        err.contains("it is a processor component: name it in task.processor"),
        "{err}"
    );
    // Options for a built-in processor are a mistake, not ignored.
    let path = write_config(
        dir.path(),
        "buffered",
        "[task]\nprocessor = \"kv\"\nprocessor_options = { a = \"1\" }\ninput = \"input.txt\"\n",
    );
    let err = stderr(&txstore(&["run", "--config", path.to_str().unwrap()]));
    assert!(
        err.contains("task.processor_options are for a processor component"),
        "{err}"
    );
}

/// A processor is untrusted code: one that spins, hoards memory or traps
/// is stopped by the task's limits with one line that says which limit,
/// nothing of its record is applied, and what committed before it stays.
#[test]
fn a_misbehaving_processor_is_stopped_by_the_sandbox() {
    let wasm = hostile_processor();
    for (bad, says) in [
        ("spin", "exceeded its time limit of 300 ms"),
        ("grow", "exceeded its memory limit of 32 MiB"),
        ("trap", "planted trap on key k3"),
        ("refuse", "refused a record: refused key k3"),
        (
            "put-flood",
            "bytes of writes for one record (limits.record_write_bytes)",
        ),
        ("output-flood", "more than limits.record_outputs = 100000"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let lines = format!("k1\tv1\nk2\tv2\nk3\t{bad}\nk4\tv4\n");
        std::fs::write(dir.path().join("input.txt"), lines).unwrap();
        let config = write_config(
            dir.path(),
            "roll-forward",
            &format!(
                "[task]\nprocessor = {:?}\ninput = \"input.txt\"\ncommit_interval_records = 2\n\
                 commit_interval_ms = 600000\n[limits]\nmemory_mib = 32\ncall_timeout_ms = 300\n\
                 record_write_bytes = 67108864\n",
                wasm.display().to_string()
            ),
        );
        let c = config.to_str().unwrap();
        let started = std::time::Instant::now();
        let o = txstore(&["run", "--config", c]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{bad}: the run succeeded");
        assert!(err.contains(says), "{bad}: {err}");
        assert!(
            err.lines().last().is_some_and(|l| l.starts_with("error: ")),
            "{bad}: {err}"
        );
        assert!(
            started.elapsed().as_secs() < 60,
            "{bad}: took {:?}",
            started.elapsed()
        );
        // The first commit (k1, k2) stands; k3 and after were never applied.
        let store = scan(&config);
        let want: BTreeMap<String, String> = [("k1", "v1"), ("k2", "v2")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        assert_eq!(store, want, "{bad}");
    }
}

/// `state` belongs to `process`: a processor that calls it from `init`
/// gets a trap with a message, not the host's memory.
#[test]
fn state_outside_process_is_refused() {
    let wasm = hostile_processor();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input.txt"), "k\tv\n").unwrap();
    let config = write_config(
        dir.path(),
        "buffered",
        &format!(
            "[task]\nprocessor = {:?}\nprocessor_options = {{ state-in-init = \"1\" }}\ninput = \"input.txt\"\n",
            wasm.display().to_string()
        ),
    );
    let err = stderr(&txstore(&["run", "--config", config.to_str().unwrap()]));
    assert!(err.contains("failed in init"), "{err}");
    assert!(err.contains("outside `process`"), "{err}");
}
