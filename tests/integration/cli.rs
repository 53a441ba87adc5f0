//! The command line: inspect, put/get/scan round trips, and bad input.

use crate::common::{ok, stderr, txstore, txstore_env, write_config};

#[test]
fn inspect_builtin_prints_world_and_transactional() {
    let out = ok(&txstore(&["inspect", "wipe-on-crash"]));
    assert!(
        out.contains("world:          txstore:store/store@0.2.0"),
        "{out}"
    );
    assert!(out.contains("transactional:  false"), "{out}");
    assert!(out.contains("txstore:store/state-store@0.2.0"), "{out}");
}

/// `native` is no component: inspect says so rather than show a world,
/// a hash or a compilation it never had.
#[test]
fn inspect_native_says_it_is_built_into_the_host() {
    let out = ok(&txstore(&["inspect", "native"]));
    assert!(
        out.contains("built into the host, not a component"),
        "{out}"
    );
    assert!(out.contains("transactional:  false"), "{out}");
    assert!(!out.contains("sha256") && !out.contains("world:"), "{out}");
}

/// The first load compiles and writes the cache; the second must not compile.
#[test]
fn second_load_uses_the_compilation_cache() {
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    let first = ok(&txstore_env(&["inspect", "roll-back"], &env));
    assert!(first.contains("(compiled)"), "{first}");
    let second = ok(&txstore_env(&["inspect", "roll-back"], &env));
    assert!(second.contains("(cached compilation)"), "{second}");
}

#[test]
fn put_get_scan_round_trip_on_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "wipe-on-crash", "");
    let c = config.to_str().unwrap();
    ok(&txstore(&["put", "beta", "2", "--config", c]));
    ok(&txstore(&["put", "alpha", "1", "--config", c]));
    ok(&txstore(&["put", "gamma", "3", "--config", c]));
    ok(&txstore(&["delete", "gamma", "--config", c]));
    assert_eq!(ok(&txstore(&["get", "alpha", "--config", c])), "1\n");
    assert_eq!(
        ok(&txstore(&["scan", "--config", c])),
        "alpha\t1\nbeta\t2\n"
    );
    assert_eq!(
        ok(&txstore(&[
            "scan",
            "--from",
            "b",
            "--config",
            c,
            "--isolation",
            "uncommitted"
        ])),
        "beta\t2\n"
    );
    let json = ok(&txstore(&["scan", "--config", c, "--format", "json"]));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows[1]["key"], "beta");
    let missing = txstore(&["get", "gamma", "--config", c]);
    assert!(!missing.status.success());
    assert_eq!(stderr(&missing).trim(), "error: key gamma not found");
}

/// A component built against a version of the contract the host does not
/// link is refused with the versions named; so is one that mixes two.
#[test]
fn other_wit_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (import, export, said) in [
        ("0.3.0", "0.3.0", "built against txstore:store@0.3.0"),
        ("0.1.0", "0.2.0", "mixes txstore:store@"),
    ] {
        let wat = format!(
            r#"(component
                (type $store (instance))
                (import "txstore:store/storage@{import}" (instance (type $store)))
                (instance $api)
                (export "txstore:store/state-store@{export}" (instance $api)))"#
        );
        let path = dir.path().join("other.wasm");
        std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
        let out = txstore(&["inspect", path.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains(said), "{err}");
        if import == export {
            assert!(
                err.contains("provides txstore:store@0.1.0 and txstore:store@0.2.0"),
                "{err}"
            );
        }
        assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
    }
}

#[test]
fn core_module_and_garbage_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, wat::parse_str("(module)").unwrap()).unwrap();
    let err = stderr(&txstore(&["inspect", core.to_str().unwrap()]));
    assert!(
        err.contains("is a core WebAssembly module, not a component"),
        "{err}"
    );
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"hello world").unwrap();
    let err = stderr(&txstore(&["inspect", junk.to_str().unwrap()]));
    assert!(err.contains("is not a WebAssembly file"), "{err}");
    let err = stderr(&txstore(&["inspect", "/no/such/guest.wasm"]));
    assert!(
        err.contains("cannot read guest /no/such/guest.wasm"),
        "{err}"
    );
}

/// A component that exports some other world is refused, naming what it exports.
#[test]
fn other_world_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wat = r#"(component (instance $i) (export "example:other/api@1.0.0" (instance $i)))"#;
    let path = dir.path().join("other.wasm");
    std::fs::write(&path, wat::parse_str(wat).unwrap()).unwrap();
    let err = stderr(&txstore(&["inspect", path.to_str().unwrap()]));
    assert!(
        err.contains("does not export txstore:store/state-store@0.2.0")
            && err.contains("example:other/api@1.0.0"),
        "{err}"
    );
}

/// A guest that imports an interface the host does not link (here
/// wasi:http, and a WASI release the host does not have) is refused before
/// it runs, with one line naming the import.
#[test]
fn unprovided_import_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for import in [
        "wasi:http/outgoing-handler@0.2.0",
        "wasi:cli/environment@0.3.0",
    ] {
        let wat = format!(
            r#"(component
                (import "{import}" (instance (export "f" (func))))
                (instance $api)
                (export "txstore:store/state-store@0.1.0" (instance $api)))"#
        );
        let path = dir.path().join("imports.wasm");
        std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
        let out = txstore(&["inspect", path.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
        assert!(
            line.contains(&format!(
                "imports `{import}`, which this host does not provide"
            )),
            "{err}"
        );
    }
}

#[test]
fn config_typo_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "wipe-on-crash",
        "[task]\nguarantee = \"exactly-once\"\ncommit_intervl_ms = 5\n",
    );
    let out = txstore(&["get", "x", "--config", config.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        err.contains("txstore.toml:6: unknown field `commit_intervl_ms`"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let out = txstore(&[
        "get",
        "x",
        "--config",
        dir.path().join("nope.toml").to_str().unwrap(),
    ]);
    assert!(
        stderr(&out).contains("cannot read config"),
        "{}",
        stderr(&out)
    );
}

/// Output feeds other tools: UTF-8 comes back as written, bytes that are
/// not UTF-8 round-trip through base64 (JSON) or the TSV escapes, and a
/// reader that closes the pipe early ends the scan quietly.
#[test]
fn output_is_faithful_utf8_base64_and_pipe_safe() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    // kv input: `key<TAB>value` lines; one key is not valid UTF-8.
    let mut input = Vec::new();
    input.extend_from_slice(b"bin\xff\x00key\tv\\1\n");
    // Far more than a pipe buffer holds, so `| head` closes it mid-scan.
    for i in 0..20000 {
        input.extend_from_slice(format!("k{i:05}\tvalue {i}\n").as_bytes());
    }
    std::fs::write(dir.path().join("input.txt"), &input).unwrap();
    let config = write_config(
        dir.path(),
        "buffered",
        "[task]\nprocessor = \"kv\"\ninput = \"input.txt\"\n",
    );
    let c = config.to_str().unwrap();
    ok(&txstore(&["run", "--config", c]));
    ok(&txstore(&["put", "café", "naïve", "--config", c]));
    assert_eq!(ok(&txstore(&["get", "café", "--config", c])), "naïve\n");

    let json = ok(&txstore(&[
        "scan", "--config", c, "--format", "json", "--to", "d",
    ]));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let key = base64::engine::general_purpose::STANDARD
        .decode(
            rows[0]["key_base64"]
                .as_str()
                .expect("binary key as base64"),
        )
        .unwrap();
    assert_eq!(key, b"bin\xff\x00key");
    assert_eq!(rows[0]["value"], "v\\1");
    assert_eq!(rows[1]["key"], "café");

    let tsv = ok(&txstore(&["scan", "--config", c, "--to", "d"]));
    assert_eq!(tsv, "bin\\xff\0key\tv\\\\1\ncafé\tnaïve\n");
    let count = ok(&txstore(&["scan", "--config", c, "--count"]));
    assert_eq!(count, "20002\n");
    let keys = ok(&txstore(&[
        "scan",
        "--config",
        c,
        "--from",
        "k",
        "--limit",
        "2",
        "--keys-only",
    ]));
    assert_eq!(keys, "k00000\nk00001\n");

    let piped = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' scan --config '{c}' | head -n 1",
            crate::common::bin()
        ))
        .env("XDG_CACHE_HOME", crate::common::cache_dir())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&piped.stdout),
        "bin\\xff\0key\tv\\\\1\n"
    );
    assert!(
        piped.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
}

/// A store remembers which guest and store name made it: another guest
/// (whose keyspaces differ) or another name is refused with one line,
/// before anything changes; the data is still there with the right guest.
#[test]
fn another_guest_or_store_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "buffered", "");
    let c = config.to_str().unwrap();
    ok(&txstore(&["put", "k", "v", "--config", c]));
    std::fs::write(
        &config,
        "[store]\nguest = \"roll-back\"\nstate_dir = \"state\"\n",
    )
    .unwrap();
    let out = txstore(&["get", "k", "--config", c]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("made by guest `buffered`, not `roll-back`"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
    std::fs::write(
        &config,
        "[store]\nguest = \"buffered\"\nname = \"other\"\nstate_dir = \"state\"\n",
    )
    .unwrap();
    let err = stderr(&txstore(&["get", "k", "--config", c]));
    assert!(err.contains("holds store `store`, not `other`"), "{err}");
    std::fs::write(
        &config,
        "[store]\nguest = \"buffered\"\nstate_dir = \"state\"\n",
    )
    .unwrap();
    assert_eq!(ok(&txstore(&["get", "k", "--config", c])), "v\n");
}

/// A misspelt built-in guest names the built-ins and creates nothing.
#[test]
fn a_misspelt_guest_lists_the_builtins_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "bufferd", "");
    let out = txstore(&["get", "k", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("buffered, ") || err.contains(", buffered"),
        "{err}"
    );
    assert!(
        !dir.path().join("state").exists(),
        "a state directory was created"
    );
}

/// The committed input position carries a checksum of the input before
/// it: another file is refused with one line, the same file grown resumes
/// exactly, and a last line without a newline waits until it is complete.
#[test]
fn another_input_is_refused_and_a_grown_one_resumes_exactly() {
    use crate::protocol::{shell_count, store_counts, word_count_config};
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/word-count/input.txt"
    ))
    .unwrap();
    let lines: Vec<&str> = text.lines().take(2000).collect();
    let input = dir.path().join("input.txt");
    // 1000 lines and half of the next one, without its newline.
    let mut first = lines[..1000].join("\n");
    first.push('\n');
    let (head, tail) = lines[1000].split_at(lines[1000].len() / 2);
    first.push_str(head);
    std::fs::write(&input, &first).unwrap();
    let config = word_count_config(dir.path(), "buffered", "exactly-once");
    let c = config.to_str().unwrap();
    let out = txstore(&["run", "--config", c]);
    assert!(
        stderr(&out).contains("without a newline"),
        "{}",
        stderr(&out)
    );
    ok(&out);

    let other = dir.path().join("other.txt");
    let mut shuffled: Vec<&str> = lines.clone();
    shuffled.reverse();
    std::fs::write(&other, shuffled.join("\n") + "\n").unwrap();
    let out = txstore(&["run", "--config", c, "--input", other.to_str().unwrap()]);
    assert!(!out.status.success(), "another input was accepted");
    let err = stderr(&out);
    assert!(
        err.contains("is not the input this store consumed"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );

    // The same file grown: the half line completed, 999 more lines.
    let mut grown = first.clone();
    grown.push_str(tail);
    grown.push('\n');
    grown.push_str(&(lines[1001..].join("\n") + "\n"));
    std::fs::write(&input, &grown).unwrap();
    ok(&txstore(&["run", "--config", c]));
    assert_eq!(shell_count(&input), store_counts(&config));
}

/// `bench --option` reaches every measured guest's `init` (an option the
/// guest does not know stops the run with one line naming it), and the
/// report records what the guests were given.
#[test]
fn bench_passes_guest_options() {
    let base = [
        "bench",
        "--keys",
        "3000",
        "--reads",
        "200",
        "--recovery-sizes",
        "1000",
        "--runs",
        "1",
        "--guests",
        "buffered",
        "--format",
        "json",
    ];
    let with = |option: &str| {
        let mut args = base.to_vec();
        args.extend(["--option", option]);
        txstore(&args)
    };
    let report: serde_json::Value =
        serde_json::from_str(&ok(&with("max_uncommitted_bytes=65536"))).unwrap();
    assert_eq!(
        report["guest_options"],
        serde_json::json!([["max_uncommitted_bytes", "65536"]]),
        "{report}"
    );
    let out = with("no_such_option=1");
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("no_such_option"), "{err}");
}

/// `bench --stores N` opens N stores (each its own database and guest
/// instance) per target, writes through all of them, and reports every
/// figure; `--recovery-sizes` follows `--keys` when not given.
/// `bench --pipeline`: `txstore run` end to end per guest, with the
/// native store first and every ratio to it.
#[test]
fn bench_pipeline_measures_each_guest_against_the_native_store() {
    let out = ok(&txstore(&[
        "bench",
        "--pipeline",
        "3000",
        "--runs",
        "1",
        "--guests",
        "buffered,wipe-on-crash",
        "--format",
        "json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["native"]["target"], "native", "{out}");
    let targets: Vec<&str> = report["guests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["buffered", "wipe-on-crash"], "{out}");
    for f in std::iter::once(&report["native"]).chain(report["guests"].as_array().unwrap()) {
        for rate in ["word_count_per_s", "kv_per_s"] {
            assert!(f[rate].as_f64().unwrap() > 0.0, "{rate}: {out}");
        }
    }
    let md = ok(&txstore(&[
        "bench",
        "--pipeline",
        "500",
        "--runs",
        "1",
        "--guests",
        "roll-back",
    ]));
    assert!(
        md.contains("| native | ") && md.contains("| roll-back | "),
        "{md}"
    );
}

#[test]
fn bench_opens_many_stores_and_sizes_follow_keys() {
    let out = ok(&txstore(&[
        "bench",
        "--stores",
        "20",
        "--threads",
        "2",
        "--keys",
        "4000",
        "--runs",
        "1",
        "--guests",
        "roll-forward,wipe-on-crash",
        "--format",
        "json",
    ]));
    let figures: serde_json::Value = serde_json::from_str(&out).unwrap();
    let targets: Vec<&str> = figures
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["target"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        ["native rocksdb", "roll-forward", "wipe-on-crash"],
        "{out}"
    );
    for f in figures.as_array().unwrap() {
        assert_eq!(f["stores"], 20, "{f}");
        assert_eq!(f["threads"], 2, "{f}");
        for k in ["open_s", "reopen_s", "rss_per_store_bytes", "write_per_s"] {
            assert!(f[k].as_f64().unwrap() > 0.0, "{k} in {f}");
        }
    }
    let report: serde_json::Value = serde_json::from_str(&ok(&txstore(&[
        "bench", "--keys", "20000", "--reads", "100", "--runs", "1", "--guests", "buffered",
        "--format", "json",
    ])))
    .unwrap();
    let sizes: Vec<u64> = report["guests"][0]["recovery"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [10_000, 20_000], "{report}");
}

/// A key that is not text goes in and comes out with `--hex`; a bad hex
/// argument is one error line, before anything is opened.
#[test]
fn binary_keys_and_values_round_trip_with_hex() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "roll-forward", "");
    let c = config.to_str().unwrap();
    ok(&txstore(&[
        "put", "--hex", "00ff0a", "e282ac", "--config", c,
    ]));
    assert_eq!(
        ok(&txstore(&["get", "--hex", "00ff0a", "--config", c])),
        "€\n"
    );
    assert_eq!(
        ok(&txstore(&[
            "get", "--hex", "00FF0A", "--config", c, "--format", "hex"
        ])),
        "e282ac\n"
    );
    // The same key typed as text is another key.
    assert!(!txstore(&["get", "00ff0a", "--config", c]).status.success());
    let bad = txstore(&["get", "--hex", "0g", "--config", c]);
    assert!(stderr(&bad).contains("is not hex"), "{}", stderr(&bad));
    ok(&txstore(&["delete", "--hex", "00ff0a", "--config", c]));
    assert!(!txstore(&["get", "--hex", "00ff0a", "--config", c])
        .status
        .success());
}

/// SIGTERM (a service stop) ends a file-input run cleanly: it commits,
/// writes the checkpoint and exits 0 with one line naming the input
/// position; the next start finds a clean shutdown (no replay, even for
/// wipe-on-crash) and resumes exactly there.
#[test]
fn sigterm_stops_a_file_run_cleanly_and_the_next_start_resumes_there() {
    use crate::common::{bin, cache_dir, recover_json, scan};
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    // A commit per record: minutes of fsyncs, stopped after a moment.
    let lines: Vec<String> = (0..200_000).map(|i| format!("k{}\t{i}\n", i % 7)).collect();
    let input = dir.path().join("input.tsv");
    std::fs::write(&input, lines.concat()).unwrap();
    let config = write_config(
        dir.path(),
        "wipe-on-crash",
        "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\ncommit_interval_records = 1\n",
    );
    let c = config.to_str().unwrap();
    let mut run = Command::new(bin())
        .args(["run", "--config", c])
        .env("XDG_CACHE_HOME", cache_dir())
        .env_remove("TXSTORE_CRASH_AT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The task is open once it reports its recovery; let records flow.
    let mut err = std::io::BufReader::new(run.stderr.take().unwrap());
    let mut text = String::new();
    while !text.contains("recovered:") {
        assert!(
            err.read_line(&mut text).unwrap() > 0,
            "no recovery line: {text}"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: a signal to the child we spawned.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGTERM) }, 0);
    std::io::Read::read_to_string(&mut err, &mut text).unwrap();
    let status = run.wait().unwrap();
    assert!(status.success(), "{status}: {text}");
    let position: u64 = text
        .split_once("stopped on a signal at input position ")
        .unwrap_or_else(|| panic!("no stop line: {text}"))
        .1
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        dir.path().join("state/checkpoint").exists(),
        "no checkpoint"
    );

    let report = recover_json(&config);
    assert_eq!(report["action"], "clean", "{report}");
    assert_eq!(report["replayed_records"], 0, "{report}");
    assert_eq!(report["input_position"], position, "{report}");
    // The store holds exactly the records before that position.
    let (mut end, mut want) = (0u64, std::collections::BTreeMap::new());
    for line in &lines {
        end += line.len() as u64;
        if end > position {
            break;
        }
        let (k, v) = line.trim_end().split_once('\t').unwrap();
        want.insert(k.to_string(), v.to_string());
    }
    assert!(
        !want.is_empty() && end > position,
        "stopped at {position}: mid-run expected"
    );
    assert_eq!(scan(&config), want);
}

/// A run whose stderr is a file (a log, CI) gets plain progress lines and
/// no terminal colour codes.
#[test]
fn a_logged_run_shows_plain_progress_without_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let input = crate::protocol::input(dir.path(), 20_000);
    let config = crate::protocol::word_count_config(dir.path(), "buffered", "exactly-once");
    let out = txstore_env(
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ],
        &[
            ("TXSTORE_PROGRESS_MS", "1"),
            ("TXSTORE_LOG", "txstore=info"),
        ],
    );
    ok(&out);
    let err = stderr(&out);
    assert!(err.contains("progress: byte "), "no progress line: {err}");
    assert!(!err.contains('\u{1b}'), "colour codes in a log: {err:?}");
}
