//! Kafka end to end: a partitioned input topic consumed by several
//! `txstore run` processes in one consumer group, output written to a
//! topic in the changelog's transactions. One process is killed (-9) or
//! stopped and woken (a zombie) mid-run; its partitions move to the
//! others, and the output, read with `read_committed`, must equal an
//! independent computation: every update exactly once.

use crate::common::bin;
use crate::kafka::{broker, fresh_topic};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PARTITIONS: i32 = 6;
pub const PROCESSES: usize = 3;
/// Input records per partition.
const PER_PARTITION: usize = 10_000;

/// One output record: key, and value (None: a tombstone).
pub type Out = (Vec<u8>, Option<Vec<u8>>);

pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in futures_executor::block_on(admin.create_topics([&new], &options)).unwrap() {
        r.unwrap();
    }
}

/// Produces `records` (partition, key, value) and waits for every ack.
pub fn produce(bootstrap: &str, topic: &str, records: &[(i32, Vec<u8>, Option<Vec<u8>>)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for (p, k, v) in records {
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(*p).key(&k[..]);
        if let Some(v) = v {
            r = r.payload(&v[..]);
        }
        let mut r = r;
        loop {
            match producer.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(Duration::from_millis(10));
                    r = back;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// Every committed record of `topic` (all partitions), read with
/// `read_committed` from the beginning to the end.
pub fn read_committed(bootstrap: &str, topic: &str, partitions: i32) -> Vec<Out> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "txstore-test-output-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut at_end = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while at_end.len() < partitions as usize {
        assert!(Instant::now() < deadline, "reading {topic} timed out");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                out.push((
                    m.key().unwrap_or_default().to_vec(),
                    m.payload().map(<[u8]>::to_vec),
                ))
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out
}

pub fn multiset(v: &[Out]) -> BTreeMap<&Out, usize> {
    let mut m = BTreeMap::new();
    for o in v {
        *m.entry(o).or_default() += 1;
    }
    m
}

/// The differences between two multisets, for a failure message.
pub fn differences(expected: &[Out], got: &[Out]) -> String {
    let (e, g) = (multiset(expected), multiset(got));
    let mut lines = Vec::new();
    for (k, n) in &e {
        let m = g.get(k).copied().unwrap_or(0);
        if m != *n {
            lines.push(format!("{:?}: expected {n}, got {m}", show(k)));
        }
    }
    for (k, m) in &g {
        if !e.contains_key(k) {
            lines.push(format!("{:?}: expected 0, got {m}", show(k)));
        }
    }
    let total = lines.len();
    lines.truncate(10);
    format!("{total} differences, first: {}", lines.join("; "))
}

fn show(o: &Out) -> String {
    format!(
        "{}={}",
        String::from_utf8_lossy(&o.0),
        o.1.as_ref()
            .map_or("<delete>".into(), |v| String::from_utf8_lossy(v)
                .into_owned())
    )
}

/// The input (partition, key, value) for `processor`, and the output an
/// exactly-once run must produce, computed here independently.
pub fn workload(
    processor: &str,
    per_partition: usize,
) -> (Vec<(i32, Vec<u8>, Option<Vec<u8>>)>, Vec<Out>) {
    let mut input = Vec::new();
    let mut expected = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for p in 0..PARTITIONS {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut stats: BTreeMap<String, (u64, i128, i64, i64)> = BTreeMap::new();
        for i in 0..per_partition {
            if processor.ends_with(".wasm") {
                // The running-stats processor component: a number per
                // keyed record, each partition's statistics its own.
                let key = format!("k{}", next() % 30);
                let n = (next() % 2001) as i64 - 1000;
                let s = stats.entry(key.clone()).or_insert((0, 0, n, n));
                *s = (s.0 + 1, s.1 + n as i128, s.2.min(n), s.3.max(n));
                let text = format!("{} {} {} {}", s.0, s.1, s.2, s.3);
                expected.push((key.clone().into_bytes(), Some(text.into_bytes())));
                input.push((p, key.into_bytes(), Some(n.to_string().into_bytes())));
            } else if processor == "word-count" {
                let words: Vec<String> = (0..1 + next() % 5)
                    .map(|_| format!("w{}", next() % 40))
                    .collect();
                let line = words.join(" ");
                let mut touched: BTreeMap<String, u64> = BTreeMap::new();
                for w in &words {
                    *touched.entry(w.clone()).or_default() += 1;
                }
                for (w, n) in touched {
                    let c = counts.entry(w.clone()).or_default();
                    *c += n;
                    expected.push((w.into_bytes(), Some(c.to_string().into_bytes())));
                }
                input.push((p, format!("line{i}").into_bytes(), Some(line.into_bytes())));
            } else {
                // kv: unique values, and some deletes, so a duplicate or a
                // lost update shows.
                let key = format!("k{}", next() % 50).into_bytes();
                let value = (next() % 7 != 0).then(|| format!("p{p}-{i}").into_bytes());
                expected.push((key.clone(), value.clone()));
                input.push((p, key, value));
            }
        }
    }
    (input, expected)
}

/// The pipeline's directory (configs, state, logs): kept after the test
/// when `TXSTORE_TEST_KEEP` is set, to read the processes' logs.
fn test_dir() -> tempfile::TempDir {
    let keep = std::env::var_os("TXSTORE_TEST_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .prefix("txstore-pipeline-")
        .disable_cleanup(keep)
        .tempdir()
        .unwrap();
    if keep {
        eprintln!("pipeline directory (kept): {}", dir.path().display());
    }
    dir
}

pub struct Pipeline {
    pub bootstrap: String,
    pub dir: tempfile::TempDir,
    pub input: String,
    pub output: String,
    pub changelog: String,
    pub guest: String,
    pub processor: String,
    /// `task.commit_interval_records` (tests commit often, figures as a
    /// deployment would).
    pub commit_records: usize,
    /// More `[task]` settings, one per line.
    pub task_extra: String,
}

impl Pipeline {
    pub fn new(bootstrap: &str, guest: &str, processor: &str) -> Self {
        let p = Pipeline {
            bootstrap: bootstrap.into(),
            dir: test_dir(),
            input: fresh_topic("in"),
            output: fresh_topic("out"),
            changelog: fresh_topic("changelog"),
            guest: guest.into(),
            processor: processor.into(),
            commit_records: 100,
            task_extra: String::new(),
        };
        create_topic(bootstrap, &p.input, PARTITIONS);
        p
    }

    /// The config of process `i` (its own state directory); `extra` goes
    /// into `[task.input]`.
    pub fn config(&self, i: usize, threads: usize, input_extra: &str) -> PathBuf {
        let path = self.dir.path().join(format!("p{i}.toml"));
        let text = format!(
            "[store]\nname = \"s\"\nguest = {guest:?}\nstate_dir = \"state-{i}\"\n\
             [task]\nprocessor = {processor:?}\nthreads = {threads}\n\
             commit_interval_records = {commit_records}\ncommit_interval_ms = 100\n{task_extra}\n\
             output = {{ kind = \"kafka\", topic = {output:?} }}\n\
             [task.input]\nkind = \"kafka\"\ntopic = {input:?}\ngroup_id = {group:?}\n\
             session_timeout_ms = 6000\n{input_extra}\n\
             [changelog]\nkind = \"kafka\"\nbootstrap_servers = {bootstrap:?}\ntopic = {changelog:?}\n\
             timeout_ms = 10000\n",
            guest = self.guest,
            processor = self.processor,
            output = self.output,
            input = self.input,
            group = format!("{}-group", self.input),
            bootstrap = self.bootstrap,
            changelog = self.changelog,
            commit_records = self.commit_records,
            task_extra = self.task_extra,
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn spawn(&self, config: &Path, label: &str) -> Process {
        self.spawn_with(config, label, &[])
    }

    pub fn spawn_with(&self, config: &Path, label: &str, args: &[&str]) -> Process {
        self.spawn_env(config, label, args, &[])
    }

    /// [`Pipeline::spawn_with`] with more environment variables.
    pub fn spawn_env(
        &self,
        config: &Path,
        label: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Process {
        let log = std::fs::File::create(self.dir.path().join(format!("{label}.log"))).unwrap();
        let child = Command::new(bin())
            .args(["run", "--config"])
            .arg(config)
            .args(args)
            .envs(env.iter().copied())
            // `TXSTORE_TEST_LOG` (a `TXSTORE_LOG` filter) to see more.
            .env(
                "TXSTORE_LOG",
                std::env::var("TXSTORE_TEST_LOG").unwrap_or_else(|_| "txstore=info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Process(child)
    }

    /// The JSON summary `label` printed when it stopped (`--json`).
    pub fn summary(&self, label: &str) -> serde_json::Value {
        let log = self.log(label);
        log.lines()
            .find(|l| l.starts_with('{'))
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("{label}: no JSON summary: {log}"))
    }

    pub fn log(&self, label: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{label}.log"))).unwrap_or_default()
    }

    /// Per output partition: (last stable offset, high watermark).
    fn output_ends(&self) -> Vec<(i64, i64)> {
        self.ends(&self.output)
    }

    /// Per partition of `topic`: (last stable offset, high watermark).
    fn ends(&self, topic: &str) -> Vec<(i64, i64)> {
        let ends = |isolation: &str| -> Vec<i64> {
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &self.bootstrap)
                .set("isolation.level", isolation)
                .create()
                .unwrap();
            (0..PARTITIONS)
                .map(|p| {
                    c.fetch_watermarks(topic, p, Duration::from_secs(10))
                        .map_or(-1, |w| w.1)
                })
                .collect()
        };
        ends("read_committed")
            .into_iter()
            .zip(ends("read_uncommitted"))
            .collect()
    }

    /// The last lines of every process's log.
    pub fn logs(&self) -> String {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".log").map(str::to_string))
            .collect();
        names.sort();
        names
            .iter()
            .map(|name| {
                let log = self.log(name);
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- {name}:\n{}",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn output_len(&self) -> usize {
        read_committed(&self.bootstrap, &self.output, PARTITIONS).len()
    }

    /// Waits until the output has at least `n` records (one consumer
    /// reading on, not a re-read per check).
    pub fn wait_for_output(&self, n: usize, within: Duration, what: &str) {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "txstore-test-output-counter")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(&self.output, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let deadline = Instant::now() + within;
        let mut len = 0;
        let mut quiet_since = Instant::now();
        while len < n {
            assert!(
                Instant::now() < deadline,
                "{what}: the output has {len} of {n} records after {within:?}; (stable end, end) per output \
                 partition: {:?}; logs:\n{}",
                self.output_ends(),
                self.logs()
            );
            if quiet_since.elapsed() > Duration::from_secs(2) {
                // A consumer that waited at a transaction the next owner
                // aborted can stay stuck on noida-db: count afresh.
                len = self.output_len();
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => {
                    len += 1;
                    quiet_since = Instant::now();
                }
                Some(Err(e)) => panic!("{what}: reading the output: {e}"),
                None => {}
            }
        }
    }
}

/// A `txstore run` child, killed if the test ends first (a failing test
/// must not leave processes spinning against a broker that is gone).
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Process {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} failed");
}

/// Sends SIGTERM and waits for a clean exit.
pub fn stop(child: &mut Child, label: &str, p: &Pipeline) {
    signal(child, "-TERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "{label} exited with {status}: {}",
                p.log(label)
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{label} did not stop: {}",
            p.log(label)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Static assignments: process `i` of three owns partitions `2i, 2i+1`.
fn owned(i: usize) -> Vec<i32> {
    vec![2 * i as i32, 2 * i as i32 + 1]
}

pub fn static_config(p: &Pipeline, label: usize, threads: usize, partitions: &[i32]) -> PathBuf {
    static_config_with(p, label, threads, partitions, &[])
}

/// [`static_config`] with standby replicas of `standbys`.
pub fn static_config_with(
    p: &Pipeline,
    label: usize,
    threads: usize,
    partitions: &[i32],
    standbys: &[i32],
) -> PathBuf {
    p.config(
        label,
        threads,
        &format!(
            "assignment = \"static\"\npartitions = {partitions:?}\nstandby_partitions = {standbys:?}"
        ),
    )
}

/// Moves the partitions of process 0 to processes 1 and 2, as an
/// operator (or a supervisor) does with static assignment: each survivor
/// stops cleanly and restarts owning one more partition, whose state it
/// rebuilds from the changelog in its own state directory.
fn move_partitions_of_process_0(p: &Pipeline, children: &mut [Option<Process>]) {
    for i in 1..PROCESSES {
        let mut c = children[i].take().unwrap();
        stop(&mut c, &format!("p{i}"), p);
        let mut partitions = owned(i);
        partitions.push(i as i32 - 1);
        let config = static_config(p, i, 1 + i % 2, &partitions);
        children[i] = Some(p.spawn(&config, &format!("p{i}-moved")));
    }
}

/// Stops the processes that took the moved partitions over, then checks
/// the whole output, read `read_committed`, against `expected`.
fn stop_moved_and_compare(
    p: &Pipeline,
    children: &mut [Option<Process>],
    expected: &[Out],
    what: &str,
) {
    for (i, c) in children.iter_mut().enumerate() {
        if let Some(c) = c {
            stop(c, &format!("p{i}-moved"), p);
        }
    }
    let got = read_committed(&p.bootstrap, &p.output, PARTITIONS);
    assert!(
        multiset(&got) == multiset(expected),
        "{what}: the output differs from the independent count: {}",
        differences(expected, &got)
    );
}

/// Three processes share six partitions; one is killed with SIGKILL when
/// a tenth of the output is out; its partitions move to the other two,
/// which finish them from the changelog.
fn kill_one_mid_run(guest: &str, processor: &str) {
    kill_one_mid_run_with(guest, processor, false);
}

/// [`kill_one_mid_run`]; with `standbys`, the process that takes each of
/// the victim's partitions keeps a standby replica of it from the start,
/// and the moved partitions open on those, replaying nothing. Returns the
/// moved partitions' open lines.
pub fn kill_one_mid_run_with(guest: &str, processor: &str, standbys: bool) -> Vec<String> {
    let Some(bootstrap) = broker("kill_one_mid_run") else {
        return Vec::new();
    };
    let p = Pipeline::new(bootstrap, guest, processor);
    let (input, expected) = workload(processor, PER_PARTITION);
    produce(bootstrap, &p.input, &input);
    // Process i (1, 2) takes the victim's partition i - 1 after the kill.
    let standby_of = |i: usize| -> Vec<i32> {
        match (standbys, i) {
            (true, 1..) => vec![i as i32 - 1],
            _ => Vec::new(),
        }
    };
    let mut children: Vec<Option<Process>> = (0..PROCESSES)
        .map(|i| {
            Some(p.spawn(
                &static_config_with(&p, i, 1 + i % 2, &owned(i), &standby_of(i)),
                &format!("p{i}"),
            ))
        })
        .collect();
    let what = format!("{guest}/{processor}");
    p.wait_for_output(expected.len() / 10, Duration::from_secs(120), &what);
    // The others' output can reach a tenth before the victim (one thread,
    // starting as they do) has committed at all: wait for its first
    // committed changelog transaction, so the move has state to restore.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !owned(0).iter().any(|&q| {
        p.ends(&p.changelog)
            .get(q as usize)
            .is_some_and(|e| e.0 > 0)
    }) {
        assert!(
            Instant::now() < deadline,
            "{what}: p0 committed nothing to the changelog in 120 s: {}",
            p.log("p0")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut victim = children[0].take().unwrap();
    victim.kill().unwrap();
    victim.wait().unwrap();
    let at_kill = p.output_len();
    assert!(
        at_kill < expected.len(),
        "{what}: the run was over before the kill; make the input larger"
    );
    if standbys {
        // Ten looks of each standby (every 200 ms) at the victim's last
        // commit before its partitions move.
        std::thread::sleep(Duration::from_secs(2));
    }
    move_partitions_of_process_0(&p, &mut children);
    p.wait_for_output(expected.len(), Duration::from_secs(180), &what);
    stop_moved_and_compare(
        &p,
        &mut children,
        &expected,
        &format!("{what} (killed at {at_kill})"),
    );
    // The moved partitions' state came from the changelog (the victim
    // may not have committed in both before it died: at least one).
    let moved: Vec<String> = (1..PROCESSES)
        .map(|i| {
            let log = p.log(&format!("p{i}-moved"));
            log.lines()
                .find(|l| {
                    l.contains("partition opened") && l.contains(&format!("partition={}", i - 1))
                })
                .unwrap_or_else(|| panic!("{what}: p{i} never opened partition {}: {log}", i - 1))
                .to_string()
        })
        .collect();
    assert!(
        moved.iter().any(|l| !l.contains("changelog_end: 0,")),
        "{what}: no partition moved with a changelog to restore: {moved:?}"
    );
    if standbys {
        // (A partition the victim never committed has nothing to keep.)
        for (i, line) in moved
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.contains("changelog_end: 0,"))
        {
            assert!(
                line.contains("checkpoint: Some(") && line.contains("replayed_records: 0,"),
                "{what}: partition {i} did not open on its standby (a checkpoint at what it applied, nothing left \
                 to replay): {line}\n{}",
                p.log(&format!("p{}", i + 1))
            );
        }
    }
    moved
}

#[test]
fn word_count_output_is_exact_after_a_kill_with_every_guest() {
    for guest in ["roll-forward", "roll-back", "buffered", "wipe-on-crash"] {
        kill_one_mid_run(guest, "word-count");
    }
}

/// A processor component (the Rust example) in the same pipeline: one
/// instance per partition task, killed and moved like the built-ins.
#[test]
fn a_wasm_processor_output_is_exact_after_a_kill() {
    kill_one_mid_run(
        "buffered",
        crate::processors::rust_processor().to_str().unwrap(),
    );
}

#[test]
fn kv_output_is_exact_after_a_kill() {
    kill_one_mid_run("roll-forward", "kv");
}

/// A process stopped (SIGSTOP) while its partitions move: the new owners'
/// `init_transactions` fence its producers, so when it wakes it stops
/// with one line that says so, and nothing it did reaches the output.
#[test]
fn a_zombie_is_fenced_and_loses_nothing() {
    let Some(bootstrap) = broker("a_zombie_is_fenced_and_loses_nothing") else {
        return;
    };
    let p = Pipeline::new(bootstrap, "buffered", "word-count");
    let (input, expected) = workload("word-count", PER_PARTITION);
    produce(bootstrap, &p.input, &input);
    let mut children: Vec<Option<Process>> = (0..PROCESSES)
        .map(|i| Some(p.spawn(&static_config(&p, i, 1, &owned(i)), &format!("p{i}"))))
        .collect();
    p.wait_for_output(expected.len() / 10, Duration::from_secs(120), "zombie");
    // A zombie is a process that was serving: stopped while it still opens
    // a partition, it would wake inside `init_transactions` (which fences
    // nobody yet) rather than inside a transaction.
    let deadline = Instant::now() + Duration::from_secs(120);
    while p.log("p0").matches("partition opened").count() < owned(0).len() {
        assert!(
            Instant::now() < deadline,
            "p0 never opened its partitions: {}",
            p.log("p0")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut zombie = children[0].take().unwrap();
    signal(&zombie, "-STOP");
    move_partitions_of_process_0(&p, &mut children);
    p.wait_for_output(expected.len(), Duration::from_secs(180), "zombie");
    signal(&zombie, "-CONT");
    // Awake, it writes (its queue held records) or, idle, is told to stop:
    // either way its next transaction meets the fence.
    let deadline = Instant::now() + Duration::from_secs(15);
    while zombie.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if zombie.try_wait().unwrap().is_none() {
        signal(&zombie, "-TERM");
    }
    let status = zombie.wait().unwrap();
    let log = p.log("p0");
    assert!(!status.success(), "the zombie exited cleanly: {log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error")).collect();
    assert!(
        errors.len() == 1 && errors[0].contains("fenced"),
        "the zombie should stop with one line about fencing: {log}"
    );
    stop_moved_and_compare(&p, &mut children, &expected, "zombie");
}

/// Three processes in one consumer group split six partitions between
/// them (cooperative-sticky) and together produce the exact output.
#[test]
fn a_consumer_group_splits_the_partitions() {
    let Some(bootstrap) = broker("a_consumer_group_splits_the_partitions") else {
        return;
    };
    let p = Pipeline::new(bootstrap, "roll-back", "word-count");
    let (input, expected) = workload("word-count", 2000);
    produce(bootstrap, &p.input, &input);
    let mut children: Vec<Process> = (0..PROCESSES)
        .map(|i| p.spawn(&p.config(i, 1, ""), &format!("p{i}")))
        .collect();
    p.wait_for_output(expected.len(), Duration::from_secs(120), "group");
    for (i, c) in children.iter_mut().enumerate() {
        stop(c, &format!("p{i}"), &p);
    }
    let got = read_committed(bootstrap, &p.output, PARTITIONS);
    assert!(
        multiset(&got) == multiset(&expected),
        "group: output differs from the independent count: {}",
        differences(&expected, &got)
    );
    let opens: Vec<usize> = (0..PROCESSES)
        .map(|i| p.log(&format!("p{i}")).matches("partition opened").count())
        .collect();
    // A process that joins first may take every partition, then hand
    // some over (closed, reopened by their new owner) as the others join.
    assert!(
        opens.iter().all(|n| *n > 0) && opens.iter().sum::<usize>() >= PARTITIONS as usize,
        "group: opens per process {opens:?}"
    );
}

/// Partition 0 alone, moved between two processes' state directories:
/// (state directory, records it must be serving after) in turn. Returns
/// each open's recovery report (JSON).
fn move_partition_0(p: &Pipeline, batches: &[(usize, usize)]) -> Vec<serde_json::Value> {
    let mut produced = 0;
    let mut reports = Vec::new();
    for (step, &(state, records)) in batches.iter().enumerate() {
        let input: Vec<_> = (produced..produced + records)
            .map(|i| {
                (
                    0,
                    format!("k{i}").into_bytes(),
                    Some(format!("v{i}").into_bytes()),
                )
            })
            .collect();
        produce(&p.bootstrap, &p.input, &input);
        produced += records;
        let label = format!("move{step}");
        let config = static_config(p, state, 1, &[0]);
        let mut child = p.spawn_with(&config, &label, &["--json"]);
        p.wait_for_output(produced, Duration::from_secs(300), &label);
        stop(&mut child, &label, p);
        let json = p.summary(&label);
        reports.push(json["partitions"]["opened"][0][1].clone());
    }
    reports
}

/// A partition that comes back to a process whose local store is one
/// commit old replays only the commit it missed; to an empty store, the
/// whole changelog.
#[test]
fn a_moved_partition_with_an_old_store_replays_only_the_tail() {
    let Some(bootstrap) = broker("a_moved_partition_with_an_old_store_replays_only_the_tail")
    else {
        return;
    };
    for guest in ["roll-forward", "wipe-on-crash"] {
        let p = Pipeline::new(bootstrap, guest, "kv");
        // A in state 0 takes 2,000 records; B (state 1, empty) 100 more;
        // A again, one commit (100 records) behind.
        let r = move_partition_0(&p, &[(0, 2000), (1, 100), (0, 100)]);
        assert_eq!(r[0]["replayed_records"], 0, "{guest}: first open {}", r[0]);
        assert_eq!(
            r[1]["replayed_records"], 2000,
            "{guest}: empty store {}",
            r[1]
        );
        assert_eq!(
            r[2]["replayed_records"], 100,
            "{guest}: one commit old {}",
            r[2]
        );
    }
}

/// The figures behind the README's table: time until a moved partition
/// serves again, against its state size, from an empty local store and
/// from one a commit old, for every built-in guest. Long: run with
/// `cargo test --release --test integration pipeline::move_figures -- --ignored --nocapture`.
#[test]
#[ignore]
fn move_figures() {
    let Some(bootstrap) = broker("move_figures") else {
        return;
    };
    println!("| guest | state (keys) | empty store: s (records replayed) | one commit old: s (records replayed) |");
    println!("|---|---|---|---|");
    for guest in ["wipe-on-crash", "roll-forward", "roll-back", "buffered"] {
        for keys in [10_000, 100_000] {
            let p = Pipeline::new(bootstrap, guest, "kv");
            let r = move_partition_0(&p, &[(0, keys), (1, 100), (0, 100)]);
            println!(
                "| {guest} | {keys} | {:.2} ({}) | {:.2} ({}) |",
                r[1]["seconds"].as_f64().unwrap(),
                r[1]["replayed_records"],
                r[2]["seconds"].as_f64().unwrap(),
                r[2]["replayed_records"]
            );
        }
    }
}

/// Records per second of one process over six partitions with 1 and 2
/// worker threads, committing every 100 ms (from start to the last output
/// record, so start-up is in it), median of 3. Long: run with
/// `cargo test --release --test integration pipeline::thread_figures -- --ignored --nocapture`.
#[test]
#[ignore]
fn thread_figures() {
    let Some(bootstrap) = broker("thread_figures") else {
        return;
    };
    let per_partition = 20_000;
    println!("| guest | processor | records | 1 thread: records/s | 2 threads: records/s |");
    println!("|---|---|---|---|---|");
    for guest in ["wipe-on-crash", "roll-forward", "roll-back", "buffered"] {
        for processor in ["kv", "word-count"] {
            let mut rates = Vec::new();
            for threads in [1, 2] {
                let mut runs = Vec::new();
                for _ in 0..3 {
                    let mut p = Pipeline::new(bootstrap, guest, processor);
                    p.commit_records = 10_000; // commits every 100 ms, as by default
                    let (input, expected) = workload(processor, per_partition);
                    produce(bootstrap, &p.input, &input);
                    let all: Vec<i32> = (0..PARTITIONS).collect();
                    let config = static_config(&p, 0, threads, &all);
                    let started = Instant::now();
                    let mut child = p.spawn(&config, "p0");
                    p.wait_for_output(expected.len(), Duration::from_secs(600), "threads");
                    runs.push(input.len() as f64 / started.elapsed().as_secs_f64());
                    stop(&mut child, "p0", &p);
                }
                runs.sort_by(f64::total_cmp);
                rates.push(runs[1]);
            }
            println!(
                "| {guest} | {processor} | {} | {:.0} | {:.0} |",
                per_partition * PARTITIONS as usize,
                rates[0],
                rates[1]
            );
        }
    }
}
