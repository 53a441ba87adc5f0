//! The conformance suite accepts every built-in guest and rejects each
//! planted bug (tests/planted, one cargo feature per bug) with the property
//! it breaks and a reproducer line that shows it again.

use crate::common::{planted, stderr, stdout, txstore};

/// A bounded run for CI: a short workload, a few points per step, every
/// crash mode with one power seed, and the I/O error pass.
const QUICK: &[&str] = &[
    "--ops",
    "80",
    "--seeds",
    "1",
    "--max-points",
    "12",
    "--power-seeds",
    "1",
];

/// A planted bug is found by the default run, which a buggy guest's run
/// leaves at its first failure (docs/conformance.md says how soon).
const DEFAULT_UNTIL_FAILURE: &[&str] = &["--fail-fast"];

/// Runs the suite; returns (success, report JSON, text output).
fn conformance(guests: &[&str], extra: &[&str]) -> (bool, serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut args = vec!["conformance"];
    args.extend(guests);
    args.extend(extra);
    args.extend(["--json", json.to_str().unwrap()]);
    let out = txstore(&args);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    let report = std::fs::read_to_string(&json)
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or_default();
    (out.status.success(), report, text)
}

#[test]
fn every_builtin_guest_passes() {
    let guests = [
        "wipe-on-crash",
        "roll-forward",
        "roll-back",
        "roll-back-snapshot",
        "buffered",
        // Not a component: the wipe-on-crash strategy in the host, the
        // baseline of `bench --pipeline`, held to the same suite.
        "native",
    ];
    let (ok, report, text) = conformance(&guests, QUICK);
    assert!(ok, "{text}");
    for g in report.as_array().unwrap() {
        assert_eq!(g["failures"].as_array().unwrap().len(), 0, "{text}");
        // Every mode was explored, and the I/O error pass ran.
        for mode in ["lossy", "+flush", "power"] {
            assert!(
                g["crash_points_by_mode"][mode].as_u64().unwrap() > 0,
                "{mode}\n{text}"
            );
        }
        let rows = g["rows"].as_array().unwrap();
        let io = rows
            .iter()
            .find(|r| r["check"] == "injected I/O error")
            .expect("I/O error row");
        assert!(io["cases"].as_u64().unwrap() > 5, "{text}");
        assert!(
            rows.iter()
                .any(|r| r["mode"] == "power" && r["check"] == "crash after restart"),
            "{text}"
        );
        assert!(
            g["crash_points"].as_u64().unwrap() >= 20,
            "{}: too few crash points\n{text}",
            g["guest"]
        );
    }
}

/// The control guest passes what finds each planted bug: the quick pass
/// under both guarantees and the full workload's clean run.
#[test]
fn the_correct_planted_guest_passes() {
    let wasm = planted(None);
    let (ok, report, text) = conformance(&[wasm.to_str().unwrap()], &["--quick"]);
    assert!(ok, "the control guest (no bug) must pass:\n{text}");
    let rows = report[0]["rows"].as_array().unwrap();
    for guarantee in ["exactly-once", "at-least-once"] {
        for check in [
            "crash inside commit",
            "crash inside recovery",
            "injected I/O error",
        ] {
            assert!(
                rows.iter()
                    .any(|r| r["guarantee"] == guarantee && r["check"] == check),
                "no {check} under {guarantee} in the quick pass:\n{text}"
            );
        }
    }
}

/// Each bug is rejected with the property it breaks, and the first failure's
/// reproducer line fails again the same way.
fn rejected(feature: &str, property: &str) {
    rejected_in(feature, property, DEFAULT_UNTIL_FAILURE);
}

/// One seed, two points per step: a short run.
const NARROW: &[&str] = &["--ops", "80", "--seeds", "0", "--max-points", "2"];

/// As [`rejected`], with the suite's arguments given whole.
fn rejected_in(feature: &str, property: &str, args: &[&str]) {
    let wasm = planted(Some(feature));
    let (ok, report, text) = conformance(&[wasm.to_str().unwrap()], args);
    assert!(!ok, "{feature} was accepted:\n{text}");
    let failures = report[0]["failures"].as_array().unwrap();
    let hit = failures
        .iter()
        .find(|f| f["property"].as_str().unwrap().contains(property))
        .unwrap_or_else(|| panic!("{feature}: no failure names `{property}`:\n{text}"));
    let line = hit["reproducer"].as_str().unwrap();
    assert!(text.contains("reproduce: txstore conformance"), "{text}");
    // The case's directory is gone: advice must not name it.
    for f in failures {
        let detail = f["detail"].as_str().unwrap();
        assert!(
            !detail.contains("/.tmp"),
            "{feature}: a detail names a scratch path: {detail}"
        );
    }
    // `txstore conformance <wasm> --seed S [--crash-at P]`
    let args: Vec<&str> = line.split_whitespace().skip(1).collect();
    let (again, _, again_text) = conformance(&args[1..2], &args[2..]);
    assert!(
        !again,
        "{feature}: the reproducer `{line}` passed:\n{again_text}"
    );
    assert!(
        again_text.contains(property),
        "{feature}: `{line}` failed otherwise:\n{again_text}"
    );
}

#[test]
fn rejects_a_store_that_commits_before_the_changelog() {
    rejected("eager-store", "committed");
}

/// The temporary keyspace is never cleared: a recovery finds its entries
/// after a clean stop (and says it discarded them, which the clean-stop
/// rule rejects first), or after a crash leaves them visible.
#[test]
fn rejects_a_temporary_keyspace_left_behind() {
    rejected("keeps-temp", "recovery after a clean shutdown says clean");
}

#[test]
fn rejects_a_wipe_that_returns_the_checkpoint() {
    // The in-process contract check reopens a store after a clean stop and
    // finds it empty; the exploration (not run after a first failure) would
    // report "committed state after recovery".
    rejected(
        "wipe-keeps-checkpoint",
        "committed-offset survives a reopen",
    );
}

#[test]
fn rejects_read_committed_that_sees_uncommitted_writes() {
    // The contract checks see it first ("read-committed hides the open
    // transaction"), the workload's reads too ("... sees only committed data").
    rejected("leaky-read-committed", "read-committed");
}

#[test]
fn rejects_recovery_that_is_not_idempotent() {
    rejected(
        "non-idempotent-recovery",
        "committed state after recovery (after a crash at commit-call",
    );
}

// Bugs in the less-travelled parts of the contract: call shapes, key and
// value classes, big transactions. Each is caught by the workload's reads
// or by the contract checks, without a crash.

#[test]
fn rejects_an_empty_value_stored_as_a_delete() {
    rejected("empty-value-deletes", "key-value semantics");
}

#[test]
fn rejects_get_many_that_answers_in_another_order() {
    rejected("get-many-sorted", "sees");
}

#[test]
fn rejects_keys_cut_to_255_bytes() {
    rejected("long-keys-cut", "sees");
}

#[test]
fn rejects_keys_through_a_lossy_utf8_conversion() {
    rejected("lossy-keys", "key-value semantics");
}

#[test]
fn rejects_a_page_limited_before_the_merge() {
    rejected(
        "range-limit-before-merge",
        "read-uncommitted sees the open transaction",
    );
}

#[test]
fn rejects_a_commit_that_copies_one_batch() {
    rejected("copy-first-batch", "sees");
}

#[test]
fn rejects_a_single_delete_without_a_tombstone() {
    rejected("single-delete-forgets", "hides the open transaction");
}

#[test]
fn rejects_range_limit_zero_as_no_limit() {
    rejected("range-limit-zero-unbounded", "calls with empty lists");
}

// Bugs only some crashes or some transactions show, each reached by a part
// of the suite placed for it.

/// A recovery that discards the open transaction and says `clean`: only
/// the rule for a crash that kept open writes in storage rejects it.
#[test]
fn rejects_clean_after_discarding_open_writes() {
    rejected(
        "clean-after-discard",
        "recovery after a crash with open writes in storage does not say clean",
    );
}

/// A commit that takes the empty-transaction shortcut for a transaction of
/// no key or value bytes: the prologue commits one and reads it back.
#[test]
fn rejects_a_zero_byte_transaction_left_uncommitted() {
    rejected("zero-bytes-skip-copy", "read-committed");
}

/// Writes held in memory and flushed now and then, and a recovery that
/// leaves flushed ones behind: only a crash where storage holds writes of
/// the open transaction shows it. At two points per step the even spread
/// (the first and last of each) misses every such crash; the points the
/// explorer places where storage holds open writes find it.
#[test]
fn rejects_flushed_open_writes_left_by_recovery() {
    rejected(
        "lazy-temp-kept",
        "nothing uncommitted visible after recovery",
    );
    rejected_in(
        "lazy-temp-kept",
        "nothing uncommitted visible after recovery",
        &[
            NARROW,
            &["--fail-fast", "--modes", "+flush", "--no-io-errors"],
        ]
        .concat(),
    );
}

/// A storage read error taken for the end of a scan: only the I/O error
/// pass's failing storage read (`storage-read`) shows it, as a read that
/// returns part of the data or a run that goes on as if nothing failed.
#[test]
fn rejects_a_read_error_taken_for_the_end_of_a_scan() {
    rejected("read-error-ends-scan", "storage-read");
}

/// An `init` that ignores an option it does not know (a misspelt setting
/// would run on its default): the contract checks give it an unknown one.
#[test]
fn rejects_an_unknown_option_ignored() {
    rejected("options-ignored", "bad arguments are errors, not traps");
}

/// A bug on at-least-once's start-up path (recover given a checkpoint after
/// a crash): exactly-once never takes that path, at-least-once rejects it.
#[test]
fn rejects_recovery_that_trusts_the_checkpoint_under_at_least_once() {
    let wasm = planted(Some("checkpoint-trusted"));
    let (ok, _, text) = conformance(
        &[wasm.to_str().unwrap()],
        &["--quick", "--guarantees", "exactly-once"],
    );
    assert!(
        ok,
        "exactly-once never hands recover a checkpoint after a crash:\n{text}"
    );
    // The default run's quick pass goes under both guarantees.
    rejected(
        "checkpoint-trusted",
        "nothing uncommitted visible after recovery (after a crash at",
    );
}

/// Both guarantees with a guest option: buffered with a 1 MiB uncommitted
/// limit passed to its `init`.
#[test]
fn both_guarantees_with_a_guest_option() {
    let (ok, report, text) = conformance(
        &["buffered"],
        &[
            NARROW,
            &[
                "--guarantees",
                "exactly-once,at-least-once",
                "--option",
                "max_uncommitted_bytes=1048576",
                "--power-seeds",
                "0",
                "--no-io-errors",
            ],
        ]
        .concat(),
    );
    assert!(ok, "{text}");
    let g = &report[0];
    for guarantee in ["exactly-once", "at-least-once"] {
        assert!(
            g["rows"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["guarantee"] == guarantee
                    && r["check"] == "crash at a protocol step"
                    && r["cases"].as_u64().unwrap() > 0),
            "{guarantee}\n{text}"
        );
    }
    // The option takes effect: the workload's heavy record (one call of
    // more than 1 MiB) meets a buffer holding something and is refused,
    // then taken after the early commit.
    assert!(
        g["coverage"]["limit_refusals"].as_u64().unwrap() > 0,
        "{text}"
    );
    // An option the guest does not know is refused, not ignored.
    let (ok, _, text) = conformance(
        &["buffered"],
        &["--option", "no_such_option=1", "--ops", "10"],
    );
    assert!(!ok && text.contains("no_such_option"), "{text}");
}

/// A run whose output goes to files (a CI log, `> log 2>&1`) shows each
/// failure while it is still running, and plain progress lines: the
/// failure is in the file before the process ends.
#[test]
fn a_run_piped_to_a_file_shows_failures_and_progress_as_they_happen() {
    let wasm = planted(Some("clean-after-discard"));
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out.txt"), dir.path().join("err.txt"));
    let mut child = std::process::Command::new(crate::common::bin())
        .args(["conformance", wasm.to_str().unwrap(), "--quick"])
        .env("XDG_CACHE_HOME", crate::common::cache_dir())
        .env("TXSTORE_PROGRESS_MS", "200")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let seen_while_running = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let running = child.try_wait().unwrap().is_none();
        if text.contains("FAILED after") {
            break running;
        }
        assert!(running, "the run ended without a failure:\n{text}");
        assert!(
            started.elapsed().as_secs() < 600,
            "no failure in 10 minutes:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let status = child.wait().unwrap();
    let (text, progress) = (
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(&err).unwrap(),
    );
    assert!(
        seen_while_running,
        "the failure came only at the end:\n{text}"
    );
    assert!(!status.success(), "{text}");
    // The streamed failure names its cause and reproducer, and the table
    // still comes at the end.
    assert!(
        text.contains("likely cause:") && text.contains("reproduce: txstore conformance"),
        "{text}"
    );
    assert!(
        text.find("FAILED after").unwrap() < text.find(": FAIL (").unwrap(),
        "{text}"
    );
    assert!(
        progress.contains("cases run"),
        "no progress lines:\n{progress}"
    );
    assert!(
        !progress.contains('\u{1b}'),
        "colour codes in a file:\n{progress}"
    );
}
