//! The exactly-once protocol under crashes: word count killed at every named
//! point (abort, not a clean return) and restarted until it finishes, checked
//! against a count made by ordinary shell tools; changelog damage; recovery
//! reports.

use crate::common::{ok, recover_json, stderr, txstore, txstore_env, write_config};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The first `lines` lines of the word-count example's input.
pub fn input(dir: &Path, lines: usize) -> PathBuf {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/word-count/input.txt"
    ))
    .unwrap();
    let mut part: String = text.lines().take(lines).collect::<Vec<_>>().join("\n");
    part.push('\n');
    let path = dir.join("input.txt");
    std::fs::write(&path, part).unwrap();
    path
}

/// The oracle: `tr | tr | sort | uniq -c`, independent of txstore.
pub fn shell_count(input: &Path) -> BTreeMap<String, u64> {
    let script = format!(
        "tr -cs 'A-Za-z0-9' '\\n' < '{}' | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c",
        input.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (n, w) = l.trim().split_once(' ').unwrap();
            (w.to_string(), n.parse().unwrap())
        })
        .collect()
}

/// What the store holds, read back through `txstore scan`.
pub fn store_counts(config: &Path) -> BTreeMap<String, u64> {
    ok(&txstore(&["scan", "--config", config.to_str().unwrap()]))
        .lines()
        .map(|l| {
            let (w, n) = l.split_once('\t').unwrap();
            (w.to_string(), n.parse().unwrap())
        })
        .collect()
}

pub fn word_count_config(dir: &Path, guest: &str, guarantee: &str) -> PathBuf {
    let extra = format!(
        "[task]\nguarantee = \"{guarantee}\"\nprocessor = \"word-count\"\ninput = \"input.txt\"\n\
         commit_interval_records = 64\ncommit_interval_ms = 60000\n"
    );
    write_config(dir, guest, &extra)
}

/// Runs `txstore run` crashing at `point`; asserts it really aborted there.
pub fn run_crashing(config: &Path, point: &str) {
    let out = txstore_env(
        &["run", "--config", config.to_str().unwrap()],
        &[("TXSTORE_CRASH_AT", point)],
    );
    assert_eq!(
        out.status.signal(),
        Some(6),
        "expected an abort at {point}: {}\n{}",
        out.status,
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(&format!("crash point {point} reached")),
        "{}",
        stderr(&out)
    );
}

pub fn run_to_end(config: &Path) -> String {
    ok(&txstore(&["run", "--config", config.to_str().unwrap()]))
}

/// Crashes a word count at `points` in turn, restarting after each, then
/// lets it finish; returns (expected, actual).
pub fn crash_and_finish(
    guest: &str,
    guarantee: &str,
    points: &[&str],
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), 1500);
    let config = word_count_config(dir.path(), guest, guarantee);
    for p in points {
        run_crashing(&config, p);
    }
    run_to_end(&config);
    (shell_count(&input), store_counts(&config))
}

/// Every named point, each as its own crash-and-restart scenario. Points
/// that need state to act on are preceded by a crash that makes some.
pub const SCENARIOS: &[&[&str]] = &[
    &["after-write@700"],
    &["after-flush@5"],
    &["after-changelog-commit@5"],
    &["after-store-commit@5"],
    &["after-checkpoint"],
    &["after-write@700", "during-restore"],
    &[
        "after-changelog-commit@3",
        "after-store-commit@4",
        "after-write@200",
        "during-restore",
    ],
];

fn assert_exact(guest: &str, guarantee: &str) {
    for points in SCENARIOS {
        let (expected, actual) = crash_and_finish(guest, guarantee, points);
        assert_eq!(
            expected, actual,
            "{guest} under {guarantee}, crashed at {points:?}"
        );
    }
}

#[test]
fn wipe_on_crash_exactly_once_survives_every_crash_point() {
    assert_exact("wipe-on-crash", "exactly-once");
}

/// The native store (wipe-on-crash in the host, no component) under the
/// same crashes: the baseline is held to what it is compared with.
#[test]
fn the_native_store_survives_every_crash_point() {
    assert_exact("native", "exactly-once");
}

/// At-least-once promises no loss: every count at least the true count.
/// Its checkpoint is written after every commit, so a restart keeps the
/// store and replays nothing: `during-restore` is never reached.
#[test]
fn wipe_on_crash_at_least_once_loses_nothing() {
    for points in SCENARIOS {
        let points: Vec<&str> = points
            .iter()
            .copied()
            .filter(|p| *p != "during-restore")
            .collect();
        let (expected, actual) = crash_and_finish("wipe-on-crash", "at-least-once", &points);
        for (word, n) in &expected {
            let got = actual.get(word).copied().unwrap_or(0);
            assert!(got >= *n, "{word}: {got} < {n} after crashes at {points:?}");
        }
        assert_eq!(expected.len(), actual.len(), "no invented words");
    }
}

#[test]
fn recover_reports_wipe_and_replay_after_unclean_stop() {
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), 1000);
    let config = word_count_config(dir.path(), "wipe-on-crash", "exactly-once");
    run_crashing(&config, "after-store-commit@4");
    let out = ok(&txstore(&["recover", "--config", config.to_str().unwrap()]));
    assert!(out.contains("checkpoint:        none"), "{out}");
    assert!(out.contains("(wiped: wiped the store)"), "{out}");
    let report = recover_json(&config);
    let json = report.to_string();
    // The second recovery follows a clean close: nothing to replay.
    assert_eq!(report["action"], "clean", "{json}");
    assert_eq!(report["replayed_records"], 0);
    // The first one replayed every committed write: 4 commits of 64 lines.
    let replayed: u64 = out
        .lines()
        .find(|l| l.starts_with("replayed:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(replayed > 0, "{out}");
}

fn segment(config: &Path) -> PathBuf {
    let dir = config.parent().unwrap().join("state/changelog");
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

/// A torn last record is cut at open with a warning naming the bytes, and
/// the finished run is still exact.
#[test]
fn torn_changelog_tail_is_truncated_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), 1000);
    let config = word_count_config(dir.path(), "wipe-on-crash", "exactly-once");
    run_crashing(&config, "after-store-commit@6");
    let seg = segment(&config);
    let len = std::fs::metadata(&seg).unwrap().len();
    // Half a frame: a magic number and a length, no body.
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes.extend_from_slice(&[0x54, 0x58, 0x54, 0x47, 40, 0, 0, 0, 1, 2]);
    std::fs::write(&seg, &bytes).unwrap();
    let out = txstore(&["run", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("truncated 10 bytes after the last commit"),
        "{err}"
    );
    assert!(err.contains(&format!("byte {len} onwards")), "{err}");
    assert_eq!(shell_count(&input), store_counts(&config));
}

/// A flipped byte in an old committed record: a start that needs no replay
/// across it goes on and keeps every count; a start that would have to
/// replay across it (wipe-on-crash after a crash) refuses with one clear
/// line and changes nothing.
#[test]
fn flipped_byte_in_old_record_is_reported_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), 1000);
    let config = word_count_config(dir.path(), "wipe-on-crash", "exactly-once");
    run_to_end(&config);
    let expected = shell_count(&input);
    let seg = segment(&config);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[200] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();

    // Clean stop: the checkpoint covers the damage; the data is all there.
    assert_eq!(store_counts(&config), expected);

    // Unclean stop: no checkpoint, so recovery would wipe and replay.
    std::fs::remove_file(config.parent().unwrap().join("state/checkpoint")).unwrap();
    let out = txstore(&["recover", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .expect("an error line");
    assert!(
        line.contains("is damaged at byte") && line.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        bytes,
        "the segment is left as it was"
    );
    // Restoring the byte (the operator's fix) brings everything back.
    bytes[200] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();
    assert_eq!(store_counts(&config), expected);
}

/// With many segments, open reads only the active one (the others are
/// sealed); damage in a sealed segment is still found before a replay that
/// needs it changes anything, and ignored by one that does not.
#[test]
fn damage_in_a_sealed_segment_is_found_before_anything_changes() {
    for guest in ["wipe-on-crash", "roll-forward"] {
        let dir = tempfile::tempdir().unwrap();
        let input = input(dir.path(), 1000);
        let config = word_count_config(dir.path(), guest, "exactly-once");
        // Sealed segments as they were written: no cleaner merging them.
        let text = std::fs::read_to_string(&config).unwrap()
            + "[changelog]\nsegment_bytes = 65536\nclean = \"off\"\n";
        std::fs::write(&config, text).unwrap();
        run_to_end(&config);
        let expected = shell_count(&input);
        let log_dir = dir.path().join("state/changelog");
        let mut segs: Vec<_> = std::fs::read_dir(&log_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        segs.sort();
        assert!(
            segs.iter()
                .filter(|p| p.extension().is_some_and(|e| e == "seal"))
                .count()
                >= 2,
            "{segs:?}"
        );
        let first = segs
            .iter()
            .find(|p| p.extension().is_some_and(|e| e == "log"))
            .unwrap()
            .clone();
        let mut bytes = std::fs::read(&first).unwrap();
        bytes[200] ^= 0x01;
        std::fs::write(&first, &bytes).unwrap();
        // An unclean stop: no checkpoint.
        std::fs::remove_file(dir.path().join("state/checkpoint")).unwrap();
        let out = txstore(&["recover", "--config", config.to_str().unwrap()]);
        if guest == "wipe-on-crash" {
            // It would wipe and replay everything: refused, nothing changed.
            assert!(!out.status.success(), "{guest}");
            assert!(
                stderr(&out).contains("is damaged at byte")
                    && stderr(&out).contains("nothing was changed"),
                "{}",
                stderr(&out)
            );
            bytes[200] ^= 0x01;
            std::fs::write(&first, &bytes).unwrap();
        } else {
            // Its replay starts past the damaged segment, which is never read.
            assert!(out.status.success(), "{guest}: {}", stderr(&out));
        }
        assert_eq!(store_counts(&config), expected, "{guest}");
    }
}

/// A run over an empty input commits nothing; the next run must open the
/// store all the same (a checkpoint at 0 once claimed a commit the guest
/// never saw, and the transactional guests refused it as corrupt).
#[test]
fn a_store_that_never_committed_reopens() {
    for guest in ["wipe-on-crash", "roll-forward", "roll-back", "buffered"] {
        for guarantee in ["exactly-once", "at-least-once"] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("input.txt"), "").unwrap();
            let config = word_count_config(dir.path(), guest, guarantee);
            run_to_end(&config);
            run_to_end(&config);
            std::fs::write(dir.path().join("input.txt"), "a b a\n").unwrap();
            run_to_end(&config);
            let counts = store_counts(&config);
            assert_eq!(
                counts,
                BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 1)]),
                "{guest} {guarantee}"
            );
        }
    }
}
