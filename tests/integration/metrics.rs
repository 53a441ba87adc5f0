//! `[metrics] listen`: the Prometheus endpoint of `txstore run`, scraped
//! while runs go on.

use crate::common::{bin, cache_dir, write_config};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

/// `txstore run` with its stderr piped, read up to the recovery line:
/// (the child, its stderr, the metrics address, the recovery line).
fn start(config: &std::path::Path) -> (Child, BufReader<ChildStderr>, String, String) {
    let mut run = Command::new(bin())
        .args(["run", "--config", config.to_str().unwrap()])
        .env("XDG_CACHE_HOME", cache_dir())
        .env_remove("TXSTORE_CRASH_AT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(run.stderr.take().unwrap());
    let (mut addr, mut text) = (None, String::new());
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "no recovery line: {text}"
        );
        text.push_str(&line);
        if let Some(rest) = line.strip_prefix("txstore: metrics at http://") {
            addr = Some(rest.trim().trim_end_matches("/metrics").to_string());
        }
        if line.starts_with("recovered:") {
            let addr = addr.unwrap_or_else(|| panic!("no metrics line before recovery: {text}"));
            return (run, err, addr, line);
        }
    }
}

/// One `GET` of `path`: (status line, body).
pub fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The value of the sample `name{labels}`, if present.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().unwrap())
}

fn must(text: &str, name: &str, labels: &str) -> f64 {
    sample(text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}} in:\n{text}"))
}

/// Counters move while a run goes on, and a restart's restore shows.
#[test]
fn a_scrape_during_a_run_sees_the_counters_move() {
    let dir = tempfile::tempdir().unwrap();
    // A commit per record: a run of minutes, scraped after a moment.
    let lines: Vec<String> = (0..200_000)
        .map(|i| format!("k{}\t{i}\n", i % 50))
        .collect();
    std::fs::write(dir.path().join("input.tsv"), lines.concat()).unwrap();
    let config = write_config(
        dir.path(),
        "wipe-on-crash",
        "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\ncommit_interval_records = 1\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n",
    );
    let (mut run, _err, addr, _) = start(&config);
    std::thread::sleep(Duration::from_millis(700));
    let (status, first) = get(&addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    std::thread::sleep(Duration::from_millis(700));
    let (_, second) = get(&addr, "/metrics");
    let store = r#"store="store""#;
    let records = |t: &str| must(t, "txstore_records_processed_total", store);
    assert!(records(&first) > 0.0, "{first}");
    assert!(
        records(&second) > records(&first),
        "no progress between scrapes:\n{second}"
    );
    let commits = must(&second, "txstore_commits_total", store);
    assert!(commits > 0.0);
    assert!(must(&second, "txstore_writes_total", store) >= commits);
    assert!(must(&second, "txstore_commit_latency_seconds_count", store) >= commits - 1.0);
    assert!(must(&second, "txstore_commit_latency_seconds_sum", store) > 0.0);
    let put = r#"store="store",function="put-many""#;
    assert!(
        must(&second, "txstore_store_calls_total", put) > 0.0,
        "{second}"
    );
    assert!(must(&second, "txstore_store_call_seconds_total", put) > 0.0);
    assert!(must(&second, "txstore_changelog_bytes", store) > 0.0);
    assert!(must(&second, "txstore_changelog_segments", store) >= 1.0);
    assert!(get(&addr, "/").0.contains(" 404 "));
    // A crash: the restart wipes and replays every committed record, and
    // the restore's figures say so.
    run.kill().unwrap();
    run.wait().unwrap();
    let (mut run, _err, addr, recovered) = start(&config);
    let replayed: f64 = recovered
        .split("replayed ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no replay count: {recovered}"));
    assert!(replayed > 0.0, "{recovered}");
    let (_, text) = get(&addr, "/metrics");
    assert_eq!(
        must(&text, "txstore_restore_records_total", store),
        replayed,
        "{text}"
    );
    assert_eq!(must(&text, "txstore_restore_remaining_offsets", store), 0.0);
    run.kill().unwrap();
    run.wait().unwrap();
}

/// A port already taken is one error line naming it, before anything opens.
#[test]
fn a_taken_metrics_port_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    std::fs::write(dir.path().join("input.tsv"), "k\tv\n").unwrap();
    let config = write_config(
        dir.path(),
        "buffered",
        &format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\n[metrics]\nlisten = \"{addr}\"\n"
        ),
    );
    let out = crate::common::txstore(&["run", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = crate::common::stderr(&out);
    assert!(
        err.contains(&addr) && err.contains("[metrics] listen"),
        "{err}"
    );
    assert!(
        !dir.path().join("state").exists(),
        "a store was created: {err}"
    );
}
