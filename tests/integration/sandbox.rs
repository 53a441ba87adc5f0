//! Untrusted guests and bad input: an infinite loop, a memory bomb, a trap
//! in the middle of commit, a guest probing for files, environment, clock
//! and network; damaged caches, checkpoints and changelogs, unusable state
//! directories, a full disk, two processes on one store. Each must end with
//! one clear error line and every committed write still readable.

use crate::common::{ok, planted, stderr, txstore, txstore_env, write_config};
use crate::protocol::{input, shell_count, store_counts, word_count_config};
use std::path::Path;
use std::time::{Duration, Instant};

fn hostile_config(dir: &Path, limits: &str) -> std::path::PathBuf {
    let wasm = planted(Some("hostile"));
    write_config(
        dir,
        wasm.to_str().unwrap(),
        &format!("[limits]\n{limits}\n"),
    )
}

fn last_line(out: &std::process::Output) -> String {
    stderr(out)
        .trim_end()
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

/// Committed data is intact: `get k` at both levels.
fn assert_intact(config: &Path, key: &str, value: &str) {
    for iso in ["committed", "uncommitted"] {
        let got = ok(&txstore(&[
            "get",
            key,
            "--config",
            config.to_str().unwrap(),
            "--isolation",
            iso,
        ]));
        assert_eq!(got.trim(), value, "{key} at {iso}");
    }
}

#[test]
fn an_infinite_loop_is_stopped_within_its_time_budget() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "call_timeout_ms = 200");
    let c = config.to_str().unwrap();
    ok(&txstore(&["put", "kept", "yes", "--config", c]));
    let started = Instant::now();
    let out = txstore(&["put", "loop", "x", "--config", c]);
    let took = started.elapsed();
    eprintln!("infinite loop stopped after {took:?} (budget 200 ms, whole process)");
    assert!(!out.status.success());
    let line = last_line(&out);
    assert!(line.contains("time limit of 200 ms"), "{line}");
    assert!(
        line.starts_with("error: ") && stderr(&out).lines().count() <= 2,
        "one clear line: {}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_intact(&config, "kept", "yes");
}

#[test]
fn a_memory_bomb_is_stopped_at_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "memory_mib = 32");
    let c = config.to_str().unwrap();
    ok(&txstore(&["put", "kept", "yes", "--config", c]));
    let out = txstore(&["put", "bomb", "x", "--config", c]);
    assert!(!out.status.success());
    let line = last_line(&out);
    assert!(line.contains("memory limit of 32 MiB"), "{line}");
    assert_intact(&config, "kept", "yes");
}

/// A trap between commit's copy and its clear: the task stops (or, when
/// configured, restarts from recovery); the changelog had committed the
/// transaction, so recovery rolls it forward and nothing is lost.
#[test]
fn a_trap_in_the_middle_of_commit_then_recovery_keeps_exact_data() {
    for restarts in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = (0..300)
            .map(|i| {
                if i == 150 {
                    "trap-commit\tboom".to_string()
                } else {
                    format!("k{:03}\tv{i}", i % 97)
                }
            })
            .collect();
        std::fs::write(dir.path().join("input.txt"), lines.join("\n") + "\n").unwrap();
        let wasm = planted(Some("hostile"));
        let extra = format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.txt\"\ncommit_interval_records = 40\ncommit_interval_ms = 600000\n\
             restarts_on_guest_failure = {restarts}\n"
        );
        let config = write_config(dir.path(), wasm.to_str().unwrap(), &extra);
        let c = config.to_str().unwrap();
        let out = txstore(&["run", "--config", c]);
        if restarts == 0 {
            assert!(!out.status.success());
            assert!(
                last_line(&out).contains("planted trap in the middle of commit")
                    || last_line(&out).contains("failed in commit"),
                "{}",
                stderr(&out)
            );
            let report = ok(&txstore(&["recover", "--config", c]));
            assert!(report.contains("rolled-forward"), "{report}");
            ok(&txstore(&["run", "--config", c]));
        } else {
            assert!(out.status.success(), "{}", stderr(&out));
            assert!(
                stderr(&out).contains("restarting from recovery (1 of 1)"),
                "{}",
                stderr(&out)
            );
        }
        // The oracle: the last value of each key in the input.
        let mut want = std::collections::BTreeMap::new();
        for l in &lines {
            let (k, v) = l.split_once('\t').unwrap();
            want.insert(k.to_string(), v.to_string());
        }
        let got: std::collections::BTreeMap<String, String> =
            ok(&txstore(&["scan", "--config", c]))
                .lines()
                .map(|l| {
                    l.split_once('\t')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .unwrap()
                })
                .collect();
        assert_eq!(got, want, "restarts = {restarts}");
    }
}

#[test]
fn a_guest_gets_no_files_environment_clock_or_network() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "");
    let probe = ok(&txstore_env(
        &["get", "probe", "--config", config.to_str().unwrap()],
        &[("SECRET_TOKEN", "hunter2")],
    ));
    assert_eq!(
        probe.trim(),
        "fs:denied dir:denied env:0 clock:0 net:denied"
    );
}

#[test]
fn a_damaged_cached_compilation_is_recompiled() {
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    assert!(ok(&txstore_env(&["inspect", "buffered"], &env)).contains("(compiled)"));
    let dir = cache.path().join("txstore");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .unwrap();
    let bytes = std::fs::read(&file).unwrap();
    // Truncated, then one flipped bit in the code: both recompiled.
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let out = txstore_env(&["inspect", "buffered"], &env);
    assert!(ok(&out).contains("(compiled)"), "{}", stderr(&out));
    assert!(stderr(&out).contains("is unusable"), "{}", stderr(&out));
    let mut flipped = std::fs::read(&file).unwrap();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    std::fs::write(&file, &flipped).unwrap();
    let out = txstore_env(&["inspect", "buffered"], &env);
    assert!(ok(&out).contains("(compiled)"), "{}", stderr(&out));
    assert!(ok(&txstore_env(&["inspect", "buffered"], &env)).contains("(cached compilation)"));
}

#[test]
fn a_damaged_or_newer_checkpoint_is_ignored_with_a_warning() {
    for guest in ["roll-back", "wipe-on-crash"] {
        for damage in ["checksum", "version"] {
            let dir = tempfile::tempdir().unwrap();
            let config = write_config(dir.path(), guest, "[task]\nguarantee = \"at-least-once\"\n");
            let c = config.to_str().unwrap();
            ok(&txstore(&["put", "k", "v", "--config", c]));
            let path = dir.path().join("state/checkpoint");
            let mut bytes = std::fs::read(&path).unwrap();
            match damage {
                "checksum" => bytes[10] ^= 1,
                _ => {
                    bytes[4] = 9; // version 9, checksum recomputed: a newer writer
                    let crc = crc32c::crc32c(&bytes[..16]);
                    bytes[16..20].copy_from_slice(&crc.to_le_bytes());
                }
            }
            std::fs::write(&path, &bytes).unwrap();
            let out = txstore(&["get", "k", "--config", c]);
            assert_eq!(ok(&out).trim(), "v", "{guest} {damage}");
            assert!(
                stderr(&out).contains("ignoring it"),
                "{guest} {damage}: {}",
                stderr(&out)
            );
        }
    }
}

#[test]
fn a_state_directory_that_cannot_be_created_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-file"), "").unwrap();
    let config = dir.path().join("txstore.toml");
    std::fs::write(
        &config,
        "[store]\nguest = \"buffered\"\nstate_dir = \"a-file/state\"\n",
    )
    .unwrap();
    let out = txstore(&["get", "k", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot create state directory") && err.contains("a-file/state"),
        "{err}"
    );
}

#[test]
fn a_second_process_on_the_same_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "buffered", "");
    let c = config.to_str().unwrap();
    ok(&txstore(&["put", "k", "v", "--config", c]));
    // This process holds the store open, as a running `txstore run` would.
    let held = txstore::testing::RocksBackend::open(&dir.path().join("state/store")).unwrap();
    let out = txstore(&["get", "k", "--config", c]);
    assert!(!out.status.success());
    assert!(
        last_line(&out).contains("in use by another process"),
        "{}",
        stderr(&out)
    );
    drop(held);
    assert_intact(&config, "k", "v");
}

/// A full disk, simulated with a file-size limit (writes past it fail with
/// EFBIG): the run stops with an error, committed data stays readable, and
/// a later run without the limit finishes with exact counts.
#[test]
fn a_full_disk_on_commit_loses_nothing_committed() {
    let dir = tempfile::tempdir().unwrap();
    let text = input(dir.path(), 3000);
    let config = word_count_config(dir.path(), "roll-forward", "exactly-once");
    let script = format!(
        "trap '' XFSZ; exec prlimit --fsize=262144 '{}' run --config '{}'",
        crate::common::bin(),
        config.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .env("XDG_CACHE_HOME", crate::common::cache_dir())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the limit did not bite");
    let line = last_line(&out);
    assert!(
        line.starts_with("error: ") && line.to_lowercase().contains("file too large"),
        "{}",
        stderr(&out)
    );
    // What is committed is readable, and finishing gives the exact count.
    store_counts(&config);
    ok(&txstore(&["run", "--config", config.to_str().unwrap()]));
    assert_eq!(shell_count(&text), store_counts(&config));
}

#[test]
fn a_config_with_a_wrong_type_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "buffered",
        "[task]\ncommit_interval_ms = \"soon\"\n",
    );
    let out = txstore(&["get", "k", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("txstore.toml:5"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
