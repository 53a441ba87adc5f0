//! Output to a file under crashes and power loss: word count writes each
//! touched word's new count; whatever the crash, a reader who reads only
//! the committed length (`<path>.committed`) sees a prefix of the exact
//! output, and after the run finishes, all of it, each line once.

use crate::common::{ok, stderr, txstore, txstore_env, write_config};
use crate::protocol::input;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

/// The output word count must write for `input`, computed here: per line,
/// its distinct words (lowercased runs of ASCII letters and digits) in
/// byte order, each with its count so far.
fn expected(input: &Path) -> String {
    let text = std::fs::read(input).unwrap();
    let mut counts: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut out = String::new();
    for line in text.split(|b| *b == b'\n') {
        let mut touched: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for w in line
            .split(|b| !b.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            *touched.entry(w.to_ascii_lowercase()).or_default() += 1;
        }
        for (w, n) in touched {
            let c = counts.entry(w.clone()).or_default();
            *c += n;
            out.push_str(&format!("{}\t{c}\n", String::from_utf8(w).unwrap()));
        }
    }
    out
}

/// What a reader trusting `<path>.committed` reads.
pub fn committed(path: &Path) -> String {
    let mut c = path.as_os_str().to_owned();
    c.push(".committed");
    // Missing or empty (a power cut after its unsynced rename) means 0.
    let n: usize = std::fs::read_to_string(PathBuf::from(c))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let bytes = std::fs::read(path).unwrap_or_default();
    assert!(
        bytes.len() >= n,
        "{} has {} bytes, {n} committed",
        path.display(),
        bytes.len()
    );
    String::from_utf8(bytes[..n].to_vec()).unwrap()
}

fn config(dir: &Path, guest: &str) -> PathBuf {
    // Inside the state directory, so the power simulation covers it.
    let extra = "[task]\nprocessor = \"word-count\"\ninput = \"input.txt\"\n\
                 output = { kind = \"file\", path = \"state/out.txt\" }\n\
                 commit_interval_records = 64\ncommit_interval_ms = 60000\n";
    write_config(dir, guest, extra)
}

fn crash(config: &Path, point: &str) {
    let out = txstore_env(
        &["run", "--config", config.to_str().unwrap()],
        &[("TXSTORE_CRASH_AT", point), ("TXSTORE_POWER_SIM", "1")],
    );
    assert_eq!(
        out.status.signal(),
        Some(6),
        "expected an abort at {point}: {}",
        stderr(&out)
    );
}

const SCENARIOS: &[&[&str]] = &[
    &["after-write@700"],
    // Inside the changelog commit, after the output's lines were made
    // durable: the next open must cut them.
    &["before-changelog-sync@3"],
    &["before-changelog-sync@3+power"],
    &["after-changelog-commit@5"],
    &["after-store-commit@5"],
    &["after-checkpoint"],
    &["after-changelog-commit@5", "during-restore"],
    &["after-write@700+power"],
    &["after-changelog-commit@5+power"],
    &[
        "after-write@200+power",
        "after-changelog-commit@3+power",
        "during-restore",
    ],
];

#[test]
fn file_output_is_exact_after_every_crash_and_power_loss() {
    for guest in ["wipe-on-crash", "roll-forward", "roll-back", "buffered"] {
        for points in SCENARIOS {
            let dir = tempfile::tempdir().unwrap();
            let want = expected(&input(dir.path(), 1500));
            let config = config(dir.path(), guest);
            let out = dir.path().join("state/out.txt");
            for p in *points {
                crash(&config, p);
                let seen = committed(&out);
                assert!(
                    want.starts_with(&seen),
                    "{guest} {points:?}: after the crash at {p} a reader sees {} committed bytes that are not a \
                     prefix of the exact output",
                    seen.len()
                );
            }
            ok(&txstore_env(
                &["run", "--config", config.to_str().unwrap()],
                &[("TXSTORE_POWER_SIM", "1")],
            ));
            assert!(
                committed(&out) == want,
                "{guest} {points:?}: the finished output differs"
            );
            // The whole file is committed: nothing after the last commit.
            assert_eq!(
                std::fs::read_to_string(&out).unwrap(),
                want,
                "{guest} {points:?}"
            );
        }
    }
}

/// Another file where the output should be is refused, not appended to.
#[test]
fn an_output_that_belongs_to_another_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), 100);
    let config = config(dir.path(), "buffered");
    ok(&txstore(&["run", "--config", config.to_str().unwrap()]));
    let out = dir.path().join("state/out.txt");
    std::fs::remove_file(dir.path().join("state/out.txt.index")).unwrap();
    std::fs::write(&out, "stale\n").unwrap();
    let o = txstore(&["run", "--config", config.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no entry for the committed input position"),
        "{}",
        stderr(&o)
    );
}
