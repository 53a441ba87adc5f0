//! `txstore migrate`: a store moved to another strategy keeps exactly its
//! committed data (checked against a map built from the input by the test
//! itself), goes on running from where it was, and a crash at any step of
//! the migration leaves a usable store.

use crate::common::{ok, stderr, txstore, txstore_env, write_config};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

const GUESTS: &[&str] = &[
    "buffered",
    "roll-back",
    "roll-back-snapshot",
    "roll-forward",
    "wipe-on-crash",
];

/// The store's size: (lines of input, keys, longest value). With
/// `TXSTORE_LONG_TESTS=1`, a store of 10^6 keys (every key is written once
/// first, then the random updates and deletes follow).
fn size() -> (usize, u64, usize) {
    if std::env::var_os("TXSTORE_LONG_TESTS").is_some_and(|v| v == "1") {
        (1_600_000, 1_000_000, 100)
    } else {
        (2400, 700, 3000)
    }
}

/// `lines` kv records over `keys` keys, from `seed`: puts of values of
/// every length class up to `longest` (empty included), keys that are not
/// UTF-8 or not ASCII, and deletes (a line without a tab).
fn kv_lines(seed: u64, lines: usize, keys: u64, longest: usize) -> Vec<Vec<u8>> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..lines)
        .map(|i| {
            let k = if (i as u64) < keys {
                i as u64
            } else {
                next() % keys
            };
            let mut key = match k % 5 {
                0 => vec![b'b', 0xff, (k >> 8) as u8 | 0x80, k as u8 | 0x80],
                1 => format!("café-{k}").into_bytes(),
                _ => format!("k{k:06}").into_bytes(),
            };
            // Neither a tab nor a newline may be part of a kv key.
            key.retain(|&b| b != b'\t' && b != b'\n');
            let mut line = key;
            if (i as u64) < keys || next() % 8 != 0 {
                line.push(b'\t');
                let len = [0usize, 1, 7, 100, longest][(next() % 5) as usize];
                line.extend(
                    (0..len).map(|i| b"abcdefghij\xc3\xa9\x00\x01\xfe"[(i + k as usize) % 15]),
                );
            }
            line
        })
        .collect()
}

/// The oracle: the kv processor's meaning, applied line by line.
fn apply(state: &mut BTreeMap<Vec<u8>, Vec<u8>>, lines: &[Vec<u8>]) {
    for line in lines {
        match line.iter().position(|&b| b == b'\t') {
            Some(i) => state.insert(line[..i].to_vec(), line[i + 1..].to_vec()),
            None => state.remove(line),
        };
    }
}

fn write_input(path: &Path, lines: &[Vec<u8>]) {
    let mut bytes = Vec::new();
    for l in lines {
        bytes.extend_from_slice(l);
        bytes.push(b'\n');
    }
    std::fs::write(path, bytes).unwrap();
}

/// A kv task on `input.txt`, committing about 16 times over the first run
/// (every commit syncs storage, so a commit per hundred records would make
/// the 10^6-key store a matter of hours).
fn kv_config(dir: &Path, guest: &str) -> std::path::PathBuf {
    let every = (size().0 / 16).max(97);
    write_config(
        dir,
        guest,
        &format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.txt\"\ncommit_interval_records = {every}\n\
             commit_interval_ms = 60000\n"
        ),
    )
}

/// The store's committed entries, through `scan --format hex`.
fn scan(config: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    ok(&txstore(&[
        "scan",
        "--config",
        config.to_str().unwrap(),
        "--format",
        "hex",
    ]))
    .lines()
    .map(|l| {
        let (k, v) = l.split_once('\t').unwrap();
        (hex(k), hex(v))
    })
    .collect()
}

fn migrate(config: &Path, to: &str, env: &[(&str, &str)]) -> std::process::Output {
    txstore_env(
        &["migrate", "--config", config.to_str().unwrap(), "--to", to],
        env,
    )
}

/// A kv store run by `from` on the first part of an input.
fn store_of(dir: &Path, from: &str, seed: u64) -> (Vec<Vec<u8>>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let (n, keys, longest) = size();
    let lines = kv_lines(seed, n, keys, longest);
    let first = &lines[..n * 2 / 3];
    write_input(&dir.join("input.txt"), first);
    let config = kv_config(dir, from);
    ok(&txstore(&["run", "--config", config.to_str().unwrap()]));
    let mut want = BTreeMap::new();
    apply(&mut want, first);
    (lines, want)
}

/// After a migration to `to`: the old guest is refused, the new one reads
/// exactly `want`, and a run on the grown input resumes where the old store
/// stopped and ends equal to the whole input's state.
fn check_migrated(
    dir: &Path,
    from: &str,
    to: &str,
    lines: &[Vec<u8>],
    want: &BTreeMap<Vec<u8>, Vec<u8>>,
) {
    let config = kv_config(dir, from);
    let err = stderr(&txstore(&[
        "get",
        "k000001",
        "--config",
        config.to_str().unwrap(),
    ]));
    assert!(
        err.contains(&format!("made by guest `{to}`, not `{from}`")),
        "{from} -> {to}: the old guest was not refused: {err}"
    );
    let config = kv_config(dir, to);
    assert!(
        scan(&config) == *want,
        "{from} -> {to}: the migrated store differs from the input's state"
    );
    write_input(&dir.join("input.txt"), lines);
    ok(&txstore(&["run", "--config", config.to_str().unwrap()]));
    let mut all = BTreeMap::new();
    apply(&mut all, lines);
    assert!(
        scan(&config) == all,
        "{from} -> {to}: the run after the migration did not resume exactly"
    );
}

/// Every ordered pair of built-in strategies: the data is exactly kept.
#[test]
fn migrate_keeps_the_data_between_every_pair_of_builtins() {
    for (i, from) in GUESTS.iter().enumerate() {
        for (j, to) in GUESTS.iter().enumerate() {
            if i == j {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let (lines, want) = store_of(dir.path(), from, (i * 4 + j) as u64 + 1);
            let out = ok(&migrate(&kv_config(dir.path(), from), to, &[]));
            assert!(
                out.contains(&format!("{} entries", want.len())),
                "{from} -> {to}: {out}"
            );
            check_migrated(dir.path(), from, to, &lines, &want);
        }
    }
}

/// A crash at each step of a migration (and inside the new store's
/// commits), as an abort, with every write flushed, and as a power cut
/// (with and without a seed choosing what unsynced data survives): before
/// the commit point the old store is intact and a second migration
/// succeeds; after it, the next open finishes the switch. Either way
/// nothing committed is lost.
#[test]
fn a_crash_at_every_migration_step_leaves_a_usable_store() {
    let before = ["commit-call:1", "migrate-copied", "migrate-built"];
    let after = [
        "migrate-committed",
        "migrate-old-moved",
        "migrate-new-moved",
    ];
    for (from, to) in [
        ("buffered", "roll-forward"),
        ("wipe-on-crash", "roll-back"),
        // The old store's snapshot directories go to `migrate-old/` with it.
        ("roll-back-snapshot", "buffered"),
    ] {
        for (n, point) in before.iter().chain(&after).enumerate() {
            let seeded = format!("+power:{n}");
            for mode in ["", "+flush", "+power", &seeded] {
                let dir = tempfile::tempdir().unwrap();
                let (lines, want) = store_of(dir.path(), from, 100 + n as u64);
                let config = kv_config(dir.path(), from);
                let at = format!("{point}{mode}");
                let out = migrate(&config, to, &[("TXSTORE_CRASH_AT", &at)]);
                assert_eq!(
                    out.status.signal(),
                    Some(6),
                    "{from} -> {to} at {at}: expected an abort: {}",
                    stderr(&out)
                );
                if before.contains(point) {
                    assert!(
                        scan(&config) == want,
                        "{from} -> {to}, crash at {at}: the old store lost data"
                    );
                    ok(&migrate(&config, to, &[]));
                } else {
                    // Rerunning the command finishes the switch and says so.
                    let out = ok(&migrate(&config, to, &[]));
                    assert!(out.contains("already"), "{at}: {out}");
                }
                check_migrated(dir.path(), from, to, &lines, &want);
                let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("state"))
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                    .filter(|n| n.starts_with("migrate-"))
                    .collect();
                assert!(leftovers.is_empty(), "{at}: left {leftovers:?}");
            }
        }
    }
}

/// Mistakes are one line each and change nothing.
#[test]
fn migrate_refuses_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let (_, want) = store_of(dir.path(), "roll-back", 7);
    let config = kv_config(dir.path(), "roll-back");
    let c = config.to_str().unwrap();
    for (to, says) in [
        ("roll-back", "already kept by `roll-back`"),
        ("rollback", "nor a readable .wasm file"),
    ] {
        let out = txstore(&["migrate", "--config", c, "--to", to]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains(says), "{err}");
        assert_eq!(
            err.lines().filter(|l| l.starts_with("error:")).count(),
            1,
            "{err}"
        );
    }
    assert!(scan(&config) == want);
    // A failure after the old store was opened (the new guest refuses an
    // option): the partial new store is removed and the old one closed
    // cleanly, so the next start finds its checkpoint and replays nothing.
    let out = txstore(&[
        "migrate", "--config", c, "--to", "buffered", "--option", "bogus=1",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("unknown option `bogus`"), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
    assert!(!dir.path().join("state/migrate-new").exists());
    let report = crate::common::recover_json(&config);
    assert!(report["checkpoint"].is_u64(), "{report}");
    assert!(scan(&config) == want);
    let empty = tempfile::tempdir().unwrap();
    let config = kv_config(empty.path(), "buffered");
    let err = stderr(&migrate(&config, "roll-back", &[]));
    assert!(err.contains("no store in"), "{err}");
}

/// A new guest that refuses writes at its uncommitted limit gets the store
/// in several commits, all at the same offset, and still all of it.
#[test]
fn migrate_into_a_guest_with_a_small_uncommitted_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, want) = store_of(dir.path(), "roll-forward", 11);
    let config = kv_config(dir.path(), "roll-forward");
    let out = ok(&txstore(&[
        "migrate",
        "--config",
        config.to_str().unwrap(),
        "--to",
        "buffered",
        "--option",
        "max_uncommitted_bytes=65536",
    ]));
    assert!(out.contains(&format!("{} entries", want.len())), "{out}");
    check_migrated(dir.path(), "roll-forward", "buffered", &lines, &want);
}
