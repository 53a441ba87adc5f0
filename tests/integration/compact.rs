//! The embedded changelog's cleaner, end to end: a long kv run keeps the
//! changelog bounded by the live state, and crashes and power cuts inside
//! a clean leave the store equal to an oracle computed from the input.

use crate::common::{ok, recover_json, scan, stderr, txstore, txstore_env, write_config};
use crate::protocol::run_crashing;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const SEGMENT: u64 = 16 << 10;

/// `lines` kv lines over `keys` keys, one in five a delete (seeded).
fn kv_input(dir: &Path, lines: usize, keys: u64) -> PathBuf {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut text = String::new();
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = x % keys;
        if x % 5 == 0 {
            text.push_str(&format!("key{key:05}\n"));
        } else {
            text.push_str(&format!(
                "key{key:05}\tvalue-{i}-{}\n",
                "x".repeat((x % 40) as usize)
            ));
        }
    }
    let path = dir.join("input.tsv");
    std::fs::write(&path, text).unwrap();
    path
}

/// The oracle: the input applied to a map, line by line.
fn oracle(input: &Path) -> BTreeMap<String, String> {
    let mut state = BTreeMap::new();
    for line in std::fs::read_to_string(input).unwrap().lines() {
        match line.split_once('\t') {
            Some((k, v)) => state.insert(k.to_string(), v.to_string()),
            None => state.remove(line),
        };
    }
    state
}

fn config(dir: &Path, guest: &str) -> PathBuf {
    config_cleaning(dir, guest, "background")
}

fn config_cleaning(dir: &Path, guest: &str, clean: &str) -> PathBuf {
    write_config(
        dir,
        guest,
        &format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\ncommit_interval_records = 50\n\
             commit_interval_ms = 60000\n[changelog]\nsegment_bytes = {SEGMENT}\nclean = {clean:?}\n"
        ),
    )
}

/// Bytes of the changelog's segment files.
fn changelog_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("state/changelog"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// What the live state takes in changelog frames (header, key, value).
fn live_bytes(state: &BTreeMap<String, String>) -> u64 {
    state
        .iter()
        .map(|(k, v)| (26 + k.len() + v.len()) as u64)
        .sum()
}

/// History is 40 times the live state; the changelog stays within twice
/// the live state and a few segments, `compact` brings it to about the
/// live state, and a wipe-on-crash store replays the live state, not the
/// history.
#[test]
fn a_long_run_keeps_the_changelog_bounded_by_the_live_state() {
    let dir = tempfile::tempdir().unwrap();
    let input = kv_input(dir.path(), 40_000, 1000);
    let want = oracle(&input);
    let live = live_bytes(&want);
    let config = config(dir.path(), "wipe-on-crash");
    let out = txstore_env(&["run", "--config", config.to_str().unwrap()], &[]);
    ok(&out);
    assert_eq!(scan(&config), want);
    // On its thread the cleaner may lag the writer by a few segments.
    let after_run = changelog_bytes(dir.path());
    assert!(
        after_run <= 4 * live + 8 * SEGMENT,
        "changelog {after_run} bytes after the run, live state {live}"
    );
    // Inline, the bound is exact: 1.5x live and three segments at most.
    let inline = tempfile::tempdir().unwrap();
    kv_input(inline.path(), 40_000, 1000);
    let inline_config = config_cleaning(inline.path(), "wipe-on-crash", "inline");
    ok(&txstore(&[
        "run",
        "--config",
        inline_config.to_str().unwrap(),
    ]));
    let after_inline = changelog_bytes(inline.path());
    assert!(
        after_inline <= 2 * live + 4 * SEGMENT,
        "changelog {after_inline} bytes after an inline-cleaned run, live state {live}"
    );
    assert_eq!(scan(&inline_config), want);
    let out = ok(&txstore(&["compact", "--config", config.to_str().unwrap()]));
    assert!(out.contains("segments"), "{out}");
    let compacted = changelog_bytes(dir.path());
    assert!(
        compacted <= live + live / 4 + 4096,
        "changelog {compacted} bytes after compact, live state {live}"
    );
    assert_eq!(scan(&config), want);

    // An unclean stop: the wiped store replays about one record per key.
    let more = kv_input(dir.path(), 44_000, 1000);
    run_crashing(&config, "after-write@3000");
    let report = recover_json(&config);
    assert_eq!(report["action"], "wiped", "{report}");
    let replayed = report["replayed_records"].as_u64().unwrap();
    assert!(
        replayed < 2 * 1000 + 3000,
        "replayed {replayed} records: {report}"
    );
    let out = txstore_env(&["run", "--config", config.to_str().unwrap()], &[]);
    ok(&out);
    assert_eq!(scan(&config), oracle(&more));
}

/// A crash or a power cut at each step of a clean's install, for a
/// strategy that wipes and ones that recover in place: the store ends
/// equal to the oracle, and no `.clean` file or covered segment stays.
#[test]
fn crashes_and_power_cuts_inside_a_clean_keep_the_store_exact() {
    for guest in ["wipe-on-crash", "roll-forward", "buffered"] {
        let dir = tempfile::tempdir().unwrap();
        let input = kv_input(dir.path(), 6_000, 150);
        let config = config(dir.path(), guest);
        for point in [
            "clean-built",
            "clean-installed+power",
            "clean-built@2+power:7",
            "clean-installed@2",
            "after-store-commit@20+power:3",
        ] {
            let out = txstore_env(
                &["run", "--config", config.to_str().unwrap()],
                &[("TXSTORE_CRASH_AT", point), ("TXSTORE_POWER_SIM", "1")],
            );
            assert!(
                stderr(&out).contains(&format!("crash point {point} reached")),
                "{guest}: {point} not reached: {}",
                stderr(&out)
            );
        }
        let out = txstore_env(
            &["run", "--config", config.to_str().unwrap()],
            &[("TXSTORE_POWER_SIM", "1")],
        );
        ok(&out);
        assert_eq!(scan(&config), oracle(&input), "{guest}");
        for entry in std::fs::read_dir(dir.path().join("state/changelog"))
            .unwrap()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().to_string();
            assert!(!name.ends_with(".clean"), "{guest}: {name} left behind");
        }
    }
}

/// A store rebuilt from a cleaned changelog (its directory moved aside, as
/// the refusal line advises) by a guest that commits early during the
/// replay, crashed before the replay ends. Below the bound of dropped
/// deletes a commit offset names no state the store had, so an early
/// commit there claims the start: the next start recovers (it is not
/// refused as older than the bound) and ends equal to the oracle.
#[test]
fn a_rebuild_from_a_cleaned_log_survives_a_crash_mid_replay() {
    let dir = tempfile::tempdir().unwrap();
    let input = kv_input(dir.path(), 6_000, 150);
    let config = write_config(
        dir.path(),
        "buffered",
        &format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\ncommit_interval_records = 50\n\
             commit_interval_ms = 60000\n[changelog]\nsegment_bytes = {SEGMENT}\nclean = \"inline\"\n\
             [store.options]\nmax_uncommitted_bytes = 512\n"
        ),
    );
    let config_arg = config.to_str().unwrap();
    ok(&txstore(&["run", "--config", config_arg]));
    ok(&txstore(&["compact", "--config", config_arg]));
    let state = dir.path().join("state");
    std::fs::rename(state.join("store"), state.join("store.old")).unwrap();
    std::fs::remove_file(state.join("checkpoint")).unwrap();
    run_crashing_recover(&config, "during-restore");
    let report = recover_json(&config);
    assert_eq!(
        report["recovered_offset"].as_u64().unwrap_or(0),
        0,
        "{report}"
    );
    assert_eq!(scan(&config), oracle(&input));
}

/// `txstore recover` crashing at `point`; asserts it aborted there.
fn run_crashing_recover(config: &Path, point: &str) {
    let out = txstore_env(
        &["recover", "--config", config.to_str().unwrap()],
        &[("TXSTORE_CRASH_AT", point)],
    );
    assert!(
        stderr(&out).contains(&format!("crash point {point} reached")),
        "{point} not reached: {}",
        stderr(&out)
    );
}

/// Issue 31: with `clean_memory_bytes` too small for the log's keys (an
/// index of 112 keys, 1,000 live keys), `compact` still brings the log to
/// about its live size, in several passes, and says so in one line naming
/// the setting; the store is unchanged.
#[test]
fn compact_with_a_small_index_takes_several_passes_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let input = kv_input(dir.path(), 20_000, 1000);
    let want = oracle(&input);
    let config = write_config(
        dir.path(),
        "buffered",
        &format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\ncommit_interval_records = 500\n\
             commit_interval_ms = 60000\n[changelog]\nsegment_bytes = {SEGMENT}\nclean = \"off\"\n\
             clean_memory_bytes = 4096\n"
        ),
    );
    ok(&txstore(&["run", "--config", config.to_str().unwrap()]));
    let history = changelog_bytes(dir.path());
    let out = ok(&txstore(&["compact", "--config", config.to_str().unwrap()]));
    let live = live_bytes(&want);
    let compacted = changelog_bytes(dir.path());
    assert!(
        compacted < 2 * live && compacted * 4 < history,
        "{history} -> {compacted} bytes, live state {live}: {out}"
    );
    let note = out
        .lines()
        .find(|l| l.contains("clean_memory_bytes = 4096"))
        .unwrap_or_else(|| panic!("no line names clean_memory_bytes: {out}"));
    assert!(
        note.contains("112 keys") && note.contains("passes"),
        "{out}"
    );
    assert_eq!(scan(&config), want);
}
