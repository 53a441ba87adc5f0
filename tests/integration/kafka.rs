//! The Kafka changelog against a real Kafka-protocol broker on loopback:
//! word count crashed at every protocol step with every guest, aborted
//! transactions hidden from the store, fencing of a second instance, and
//! the conformance suite on a Kafka changelog.
//!
//! The broker is `TXSTORE_KAFKA_BOOTSTRAP` when set, else a `noida-db`
//! (PyPI) started here. Without one the tests say so on stderr and return;
//! with `TXSTORE_REQUIRE_KAFKA=1` (CI) a missing broker fails them instead.

use crate::common::{ok, stderr, txstore, txstore_env, write_config};
use crate::protocol::{input, run_crashing, run_to_end, shell_count, store_counts};
use crate::strategies::{INTERVAL, LINES, SCENARIOS};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where to find `noida-db` when it is not on PATH: where `.ci/run` and
/// the README install it.
fn noida_db() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let installed = home.join(".cache/txstore-tools/broker/bin/noida-db");
    if installed.exists() {
        return Some(installed);
    }
    let on_path = Command::new("noida-db")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    on_path.then(|| PathBuf::from("noida-db"))
}

/// Starts a broker on a free loopback port; it stops when this process does.
fn start_broker() -> Result<String, String> {
    let exe = noida_db().ok_or(
        "noida-db not found (install it with scripts/install-tools.sh, or set TXSTORE_KAFKA_BOOTSTRAP to a broker)",
    )?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let data: &'static tempfile::TempDir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    // A watchdog shell ends the broker when the test process is gone. The
    // broker gets its own process group: the pip wrapper runs it as a child.
    let script = r#"setsid "$0" start --only kafka --kafka-port "$1" --data-dir "$2" >"$2/broker.log" 2>&1 &
b=$!
while kill -0 "$3" 2>/dev/null && kill -0 "$b" 2>/dev/null; do sleep 1; done
kill -- "-$b" 2>/dev/null"#;
    Command::new("sh")
        .args(["-c", script])
        .arg(&exe)
        .arg(port.to_string())
        .arg(data.path())
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(&addr).is_err() {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(data.path().join("broker.log")).unwrap_or_default();
            return Err(format!(
                "{} did not listen on {addr} within 30 s: {log}",
                exe.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(addr)
}

/// The bootstrap address of the test broker, or `None` after saying why
/// the calling test is skipped.
pub fn broker(test: &str) -> Option<&'static str> {
    static BROKER: OnceLock<Result<String, String>> = OnceLock::new();
    let b = BROKER.get_or_init(|| match std::env::var("TXSTORE_KAFKA_BOOTSTRAP") {
        Ok(addr) if !addr.is_empty() => Ok(addr),
        _ => start_broker(),
    });
    match b {
        Ok(addr) => Some(addr.as_str()),
        Err(why) => {
            if std::env::var_os("TXSTORE_REQUIRE_KAFKA").is_some_and(|v| v == "1") {
                panic!("TXSTORE_REQUIRE_KAFKA=1 but no Kafka broker: {why}");
            }
            eprintln!("SKIPPED {test}: no Kafka broker: {why}");
            None
        }
    }
}

/// A topic name no other test or run has used.
pub fn fresh_topic(label: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "txstore-test-{label}-{millis}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A word-count store in `dir` whose changelog is `topic` on `bootstrap`.
fn kafka_config(dir: &Path, guest: &str, bootstrap: &str, topic: &str, interval: u64) -> PathBuf {
    let extra = format!(
        "[task]\nguarantee = \"exactly-once\"\nprocessor = \"word-count\"\ninput = \"input.txt\"\n\
         commit_interval_records = {interval}\ncommit_interval_ms = 600000\n\
         [changelog]\nkind = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"\n"
    );
    write_config(dir, guest, &extra)
}

/// Crashes at `points` in turn on a fresh topic, finishes, compares.
fn crash_and_finish(guest: &str, bootstrap: &str, points: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), LINES);
    let topic = fresh_topic(guest);
    let config = kafka_config(dir.path(), guest, bootstrap, &topic, INTERVAL);
    for p in points {
        run_crashing(&config, p);
    }
    run_to_end(&config);
    assert_eq!(
        shell_count(&input),
        store_counts(&config),
        "{guest} on Kafka topic {topic}, crashed at {points:?}"
    );
}

/// Storage calls an uncrashed run makes inside `commit`.
fn commit_calls(guest: &str, bootstrap: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), LINES);
    let config = kafka_config(dir.path(), guest, bootstrap, &fresh_topic(guest), INTERVAL);
    let json = ok(&txstore(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["storage_calls"]["commit"].as_u64().unwrap()
}

/// Every named protocol step, as the embedded-changelog sweeps do, and
/// every storage call inside `commit` for the transactional guests.
#[test]
fn kafka_word_count_is_exact_after_a_crash_at_every_protocol_step() {
    let Some(bootstrap) = broker("kafka_word_count_is_exact_after_a_crash_at_every_protocol_step")
    else {
        return;
    };
    // The guests run side by side: each process mostly waits on the broker.
    std::thread::scope(|scope| {
        for guest in ["buffered", "roll-forward", "roll-back", "wipe-on-crash"] {
            scope.spawn(move || {
                let mut crashes = 0;
                for points in SCENARIOS {
                    let points: Vec<String> = points.iter().map(|p| p.to_string()).collect();
                    crash_and_finish(guest, bootstrap, &points);
                    crashes += points.len();
                }
                if guest != "wipe-on-crash" {
                    let calls = commit_calls(guest, bootstrap);
                    assert!(
                        calls >= LINES as u64 / INTERVAL,
                        "{guest}: {calls} commit calls"
                    );
                    for n in 1..=calls {
                        crash_and_finish(guest, bootstrap, &[format!("commit-call:{n}")]);
                        crashes += 1;
                    }
                }
                eprintln!("{guest} on Kafka: {crashes} crashes, exact counts after each");
            });
        }
    });
}

/// Records in the topic partition, read at `isolation`.
fn count_records(bootstrap: &str, topic: &str, isolation: &str) -> usize {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "txstore-test-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "reading {topic} timed out");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => n += 1,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return n,
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
}

/// A process that died inside a transaction leaves it open on the broker
/// with its records written. The next instance's start aborts it, and
/// neither the replay nor the store ever sees those records.
#[test]
fn aborted_transactions_never_reach_the_store() {
    let Some(bootstrap) = broker("aborted_transactions_never_reach_the_store") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path(), LINES);
    let topic = fresh_topic("aborted");
    let config = kafka_config(dir.path(), "buffered", bootstrap, &topic, INTERVAL);
    // Half the input committed, then a crash inside the next transaction.
    run_crashing(&config, "after-changelog-commit@2");
    // A dead predecessor's open transaction: poisoned counts, delivered to
    // the broker, never committed (the producer is leaked, not closed).
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", format!("txstore-{topic}-0"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    let words: Vec<String> = shell_count(&input).into_keys().take(50).collect();
    for w in &words {
        producer
            .send(BaseRecord::to(&topic).partition(0).key(w).payload("999999"))
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    std::mem::forget(producer);
    let before = count_records(bootstrap, &topic, "read_uncommitted");
    assert!(
        before >= words.len(),
        "the open transaction's records are in the topic"
    );

    let out = ok(&txstore(&["run", "--config", config.to_str().unwrap()]));
    assert!(out.contains("processed"), "{out}");
    assert_eq!(shell_count(&input), store_counts(&config));
    let committed = count_records(bootstrap, &topic, "read_committed");
    let all = count_records(bootstrap, &topic, "read_uncommitted");
    assert!(
        all >= committed + words.len(),
        "aborted records stay in the log ({all}) but not in the committed view ({committed})"
    );
}

/// A store that needs a replay from an offset after an aborted
/// transaction gets every committed record back. On a broker that lists
/// aborted transactions wrongly (noida-db 0.2 at a later fetch offset),
/// the first read drops the producer's later batches: the replay proof
/// sees it, and the log is read again from its start; it is never
/// accepted short (before the proof, the store silently kept its old
/// counts here).
#[test]
fn a_replay_after_an_aborted_transaction_is_exact() {
    let Some(bootstrap) = broker("a_replay_after_an_aborted_transaction_is_exact") else {
        return;
    };
    std::thread::scope(|scope| {
        for guest in ["buffered", "roll-forward", "roll-back-snapshot"] {
            scope.spawn(move || {
                let dir = tempfile::tempdir().unwrap();
                let input = input(dir.path(), LINES);
                let topic = fresh_topic("abort-replay");
                let config = kafka_config(dir.path(), guest, bootstrap, &topic, INTERVAL);
                // A transaction left open by a crash: the next start aborts it.
                run_crashing(&config, "after-write@60");
                // Two more commits, the third in the changelog only: the
                // store must replay it, from after the aborted transaction.
                run_crashing(&config, "after-changelog-commit@3");
                let out = txstore(&["run", "--config", config.to_str().unwrap(), "--json"]);
                let report: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
                if stderr(&out).contains("reading the partition again") {
                    eprintln!("{guest}: the first read of the replay was short; the second read was whole");
                }
                assert!(
                    report["recovery"]["replayed_records"].as_u64() > Some(0),
                    "{guest}: nothing was replayed: {report}"
                );
                assert_eq!(shell_count(&input), store_counts(&config), "{guest} on {topic}");
            });
        }
    });
}

/// A consumer that drops batches (planted: every read of the replay loses
/// its messages from the tenth on, or the ten at offsets 1100 to 1109, as a
/// segment deleted in the middle would): the start stops with one line naming the
/// partition and the offsets, instead of carrying on from the old state;
/// the next start, with nothing dropped, is exact.
#[test]
fn a_replay_that_cannot_prove_it_read_everything_stops() {
    let Some(bootstrap) = broker("a_replay_that_cannot_prove_it_read_everything_stops") else {
        return;
    };
    // The tail lost, and a hole in the middle (as a deleted segment leaves).
    for kind in ["changelog-drop", "changelog-hole"] {
        let dir = tempfile::tempdir().unwrap();
        let input = input(dir.path(), LINES);
        let topic = fresh_topic("dropped");
        let config = kafka_config(dir.path(), "buffered", bootstrap, &topic, INTERVAL);
        run_crashing(&config, "after-changelog-commit@3");
        let fault = if kind == "changelog-hole" {
            // Inside the last transaction, the one the replay must read
            // (its size depends on how the write cache merged its records).
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .create()
                .unwrap();
            let (_, high) = c
                .fetch_watermarks(&topic, 0, Duration::from_secs(10))
                .unwrap();
            format!("{kind}:{}", high - 20)
        } else {
            format!("{kind}:10")
        };
        let fault = fault.as_str();
        let out = txstore_env(
            &["run", "--config", config.to_str().unwrap()],
            &[("TXSTORE_IO_ERROR", fault)],
        );
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "{fault}: a short replay was accepted: {err}"
        );
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert!(
            errors.len() == 1
                && errors[0].contains(&format!("topic `{topic}` partition 0"))
                && errors[0].contains("is not complete"),
            "{fault}: one error line naming the partition expected: {err}"
        );
        run_to_end(&config);
        assert_eq!(shell_count(&input), store_counts(&config), "{fault}");
    }
}

/// Records the store needs deleted from the changelog (an operator's
/// `kafka-delete-records`, or a retention that removed segments): the
/// start refuses with one line naming the partition and the offsets, and
/// changes nothing; the store is never opened at its old state.
#[test]
fn a_replay_whose_records_were_deleted_stops_with_one_line() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let Some(bootstrap) = broker("a_replay_whose_records_were_deleted_stops_with_one_line") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), LINES);
    let topic = fresh_topic("deleted");
    let config = kafka_config(dir.path(), "roll-forward", bootstrap, &topic, INTERVAL);
    // The changelog commits its third transaction; the store is still at the second.
    run_crashing(&config, "after-changelog-commit@3");
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::End).unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let deleted = futures_executor::block_on(admin.delete_records(&tpl, &options));
    let low = {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .unwrap();
        c.fetch_watermarks(&topic, 0, Duration::from_secs(10))
            .unwrap()
            .0
    };
    if deleted.is_err() || low == 0 {
        // noida-db 0.2.3 answers DeleteRecords without deleting anything.
        eprintln!(
            "SKIPPED a_replay_whose_records_were_deleted_stops_with_one_line: the broker did not delete records \
             ({deleted:?}, low watermark {low})"
        );
        return;
    }
    let before = std::fs::read_dir(dir.path().join("state")).unwrap().count();
    let out = txstore(&["run", "--config", config.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "the run accepted a changelog without its records: {err}"
    );
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert!(
        errors.len() == 1 && errors[0].contains(&format!("topic `{topic}` partition 0")),
        "one error line naming the partition expected: {err}"
    );
    assert_eq!(
        before,
        std::fs::read_dir(dir.path().join("state")).unwrap().count()
    );
}

/// Two instances with one transactional id: the second fences the first,
/// which stops with one clear error line; nothing it committed is lost,
/// and both stores end exact.
#[test]
fn a_second_instance_fences_the_first() {
    let Some(bootstrap) = broker("a_second_instance_fences_the_first") else {
        return;
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let input_a = input(a.path(), 1000);
    input(b.path(), 1000);
    let topic = fresh_topic("fence");
    // A commits after every record, so it is still running when B starts.
    let config_a = kafka_config(a.path(), "roll-forward", bootstrap, &topic, 1);
    let config_b = kafka_config(b.path(), "roll-forward", bootstrap, &topic, 64);
    let first = Command::new(crate::common::bin())
        .args(["run", "--config", config_a.to_str().unwrap()])
        .env("XDG_CACHE_HOME", crate::common::cache_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let A commit some transactions first.
    std::thread::sleep(Duration::from_millis(2500));
    let second = txstore(&["run", "--config", config_b.to_str().unwrap()]);
    let first = first.wait_with_output().unwrap();
    ok(&second);
    let err = stderr(&first);
    assert_eq!(
        first.status.code(),
        Some(1),
        "A must stop with an error: {err}"
    );
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    assert!(
        line.contains("fenced") && line.contains(&format!("txstore-{topic}-0")),
        "one clear line naming the fencing: {err}"
    );
    let expected = shell_count(&input_a);
    assert_eq!(expected, store_counts(&config_b), "B's store");
    // A restarts later (B has stopped) and catches up from the changelog.
    run_to_end(&config_a);
    assert_eq!(expected, store_counts(&config_a), "A's store after restart");
}

/// The conformance suite's crash exploration on a Kafka changelog (each
/// case on its own topic; crashes inside recovery are left out, they need
/// copies of the changelog).
#[test]
fn conformance_passes_on_a_kafka_changelog() {
    let Some(bootstrap) = broker("conformance_passes_on_a_kafka_changelog") else {
        return;
    };
    let out = txstore(&[
        "conformance",
        "buffered",
        "roll-back",
        "--kafka",
        bootstrap,
        "--ops",
        "60",
        "--seeds",
        "1",
        "--max-points",
        "8",
        // The power mode simulates local files and storage; the Kafka log
        // lives on the broker, so the process-crash modes are what differ.
        "--modes",
        "lossy,+flush",
    ]);
    let text = ok(&out);
    assert!(
        text.contains("buffered: PASS") && text.contains("roll-back: PASS"),
        "{text}"
    );
}

/// `properties` tune librdkafka but cannot change what exactly-once rests
/// on (no broker needed: the check comes before any connection).
#[test]
fn properties_may_not_weaken_the_guarantees() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "buffered",
        "[changelog]\nkind = \"kafka\"\nbootstrap_servers = \"127.0.0.1:1\"\n\
         properties = { \"isolation.level\" = \"read_uncommitted\" }\n",
    );
    let out = txstore(&["put", "k", "v", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("changelog.properties may not set `isolation.level`"),
        "{}",
        stderr(&out)
    );
}

/// A compacted topic keeps a delete only `delete.retention.ms` after it
/// was written. A store that comes back from an offset before a delete
/// later than that could keep the deleted key, so it is refused with the
/// reason; one that comes back in time replays the delete.
#[test]
fn a_store_older_than_the_topics_delete_retention_is_refused() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let Some(bootstrap) = broker("a_store_older_than_the_topics_delete_retention_is_refused")
    else {
        return;
    };
    let topic = fresh_topic("retention");
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("delete.retention.ms", "8000")
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("min.compaction.lag.ms", "0");
    let created =
        futures_executor::block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");

    let config = |dir: &Path| {
        let extra = format!(
            "[task]\nprocessor = \"kv\"\ninput = \"input.tsv\"\n\
             [changelog]\nkind = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"\n"
        );
        write_config(dir, "roll-forward", &extra)
    };
    let dir = tempfile::tempdir().unwrap();
    let live = config(dir.path());
    std::fs::write(dir.path().join("input.tsv"), "a\t1\nb\t2\nc\t3\n").unwrap();
    ok(&txstore(&["run", "--config", live.to_str().unwrap()]));
    // Two copies of the store at this offset, before the delete of `a`.
    let copies: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for c in &copies {
        let out = Command::new("cp")
            .args([
                "-a",
                dir.path().join("state").to_str().unwrap(),
                c.path().to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    std::fs::write(dir.path().join("input.tsv"), "a\t1\nb\t2\nc\t3\na\nd\t4\n").unwrap();
    ok(&txstore(&["run", "--config", live.to_str().unwrap()]));
    let deleted_at = Instant::now();

    let in_time = config(copies[0].path());
    let got = ok(&txstore(&["scan", "--config", in_time.to_str().unwrap()]));
    assert_eq!(
        got, "b\t2\nc\t3\nd\t4\n",
        "a copy in time replays the delete"
    );

    std::thread::sleep(Duration::from_millis(9000).saturating_sub(deleted_at.elapsed()));
    let late = config(copies[1].path());
    let out = txstore(&["recover", "--config", late.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "a store older than the retention was opened"
    );
    let err = stderr(&out);
    assert!(
        err.contains("delete.retention.ms of 8000 ms") && err.contains("move"),
        "{err}"
    );
}
