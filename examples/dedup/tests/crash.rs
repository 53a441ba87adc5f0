//! The example application crash-tested like txstore's own word count:
//! killed (abort, and a simulated power cut that drops what was never
//! fsynced) at every named point of the protocol, under every strategy,
//! then run to the end; the committed output and the store must equal an
//! independent computation from the input.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

const LINES: usize = 400;
const WINDOW: u64 = 150;
const COMMIT_EVERY: &str = "40";

/// Each scenario's points in turn, each followed by a restart.
const SCENARIOS: &[&[&str]] = &[
    &["after-write@80"],
    &["before-changelog-sync@3"],
    &["before-changelog-sync@3+power"],
    &["after-changelog-commit@3"],
    &["after-store-commit@3"],
    &["after-checkpoint"],
    &["after-changelog-commit@3", "during-restore"],
    &["after-write@80+power"],
    &["after-changelog-commit@3+power"],
    &[
        "after-write@40+power",
        "after-changelog-commit@2+power",
        "during-restore",
    ],
];

/// `id<TAB>time<TAB>payload` lines: few ids, times that mostly grow with
/// some jitter (so some records arrive late), a few malformed lines.
fn input(dir: &Path, seed: u64) -> std::path::PathBuf {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut text = String::new();
    for i in 0..LINES as u64 {
        let r = next();
        let time = (i * 7 + r % 20).saturating_sub(10);
        match r % 50 {
            0 => text.push_str("malformed\n"),
            1 => text.push_str(&format!("id{}\tsoon\tx\n", r % 9)),
            _ => text.push_str(&format!("id{}\t{time}\tevent {i}\n", r % 9)),
        }
    }
    let path = dir.join("input.tsv");
    std::fs::write(&path, text).unwrap();
    path
}

/// The oracle: the output (`id<TAB>payload` of each accepted record) and
/// the last accepted time per id, computed from the input alone.
fn expected(input: &Path) -> (String, BTreeMap<String, String>) {
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = String::new();
    for line in std::fs::read_to_string(input).unwrap().lines() {
        let f: Vec<&str> = line.splitn(3, '\t').collect();
        let [id, time, payload] = f[..] else { continue };
        let Ok(time) = time.parse::<u64>() else {
            continue;
        };
        if id.is_empty() || last.get(id).is_some_and(|&l| time < l + WINDOW) {
            continue;
        }
        last.insert(id.to_string(), time);
        out.push_str(&format!("{id}\t{payload}\n"));
    }
    (
        out,
        last.into_iter().map(|(k, v)| (k, v.to_string())).collect(),
    )
}

fn dedup(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .env_remove("TXSTORE_CRASH_AT")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "dedup failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// What a reader of the output may read: the committed bytes.
fn committed(out: &Path) -> String {
    let n: usize = std::fs::read_to_string(out.with_extension("tsv.committed"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let bytes = std::fs::read(out).unwrap_or_default();
    String::from_utf8(bytes[..n].to_vec()).unwrap()
}

#[test]
fn exact_after_every_crash_and_power_loss() {
    let mut crashes = 0;
    for guest in ["roll-forward", "roll-back", "buffered", "wipe-on-crash"] {
        for (i, points) in SCENARIOS.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let input = input(dir.path(), i as u64 + 1);
            let (want_out, want_state) = expected(&input);
            let state = dir.path().join("state");
            let out = state.join("out.tsv");
            let window = WINDOW.to_string();
            let run = [
                "run",
                "--state",
                state.to_str().unwrap(),
                "--input",
                input.to_str().unwrap(),
                "--window",
                &window,
                "--guest",
                guest,
                "--commit-every",
                COMMIT_EVERY,
            ];
            let context = format!("{guest}, crashed at {points:?}");
            for p in *points {
                let o = dedup(&run, &[("TXSTORE_CRASH_AT", p), ("TXSTORE_POWER_SIM", "1")]);
                assert_eq!(
                    o.status.signal(),
                    Some(6),
                    "{context}: no abort at {p}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                crashes += 1;
                assert!(
                    want_out.starts_with(&committed(&out)),
                    "{context}: after the crash at {p} the committed output is not a prefix of the exact one"
                );
            }
            ok(&dedup(&run, &[("TXSTORE_POWER_SIM", "1")]));
            assert!(
                committed(&out) == want_out,
                "{context}: the committed output differs"
            );
            assert!(
                std::fs::read_to_string(&out).unwrap() == want_out,
                "{context}: the output file differs"
            );
            let dumped = ok(&dedup(
                &["dump", "--state", state.to_str().unwrap(), "--guest", guest],
                &[],
            ));
            let state: BTreeMap<String, String> = dumped
                .lines()
                .map(|l| {
                    let (k, v) = l.split_once('\t').unwrap();
                    (k.to_string(), v.to_string())
                })
                .collect();
            assert_eq!(state, want_state, "{context}: the store differs");
        }
    }
    eprintln!("dedup: {crashes} crashes, exact after each");
}

/// The oracle is not trivially satisfied: the input has duplicates and
/// late records, so a run that skips deduplication would differ.
#[test]
fn the_input_has_duplicates_to_remove() {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), 1);
    let (out, _) = expected(&input);
    let kept = out.lines().count();
    assert!(kept > 20 && kept < LINES / 2, "{kept} of {LINES} kept");
    // And some records arrive after a later one (out of order).
    let times: Vec<u64> = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .filter_map(|l| l.split('\t').nth(1)?.parse().ok())
        .collect();
    assert!(times.windows(2).any(|w| w[1] < w[0]), "no late record");
}
