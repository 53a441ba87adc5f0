//! Many tasks in one process: one per partition of a Kafka input topic,
//! each with its own store (`<store>-<partition>`, in its own directory
//! under the state directory), its own guest instance and its own
//! changelog partition, run on `task.threads` worker threads that share
//! the wasm engine.
//!
//! Partitions reach the process from the input's consumer group (or a
//! static list). A partition is opened (recovered, its changelog tail
//! replayed) before the consumer reads it, from the input position
//! committed in its changelog transaction (which is also the group's
//! offset for that partition, so the group's lag shows in Kafka's tools),
//! so input, state and output move together. A group's partition is
//! assigned paused and restores on its worker outside the rebalance
//! callback, while the poll loop goes on polling (so a restore longer
//! than `max.poll.interval.ms` does not evict the member); once open, the
//! consumer seeks to its position and resumes it. A revoked partition
//! commits and closes before the consumer lets it go; a lost one (this
//! process missed its session) is dropped without a commit, since another
//! process may already own it. A process that keeps writing after its
//! partition moved is fenced by the new owner's `init_transactions` and
//! stops with that one error line.
//!
//! Standby replicas (`task.input.standby_partitions`): a worker keeps a
//! warm copy of each listed partition the process does not own
//! ([`crate::task::Standby`]); an open of that partition promotes it.
//!
//! Threads: the consumer is polled on the calling thread, which also runs
//! the rebalance callbacks; records go to the worker that owns their
//! partition (partition mod threads) over a bounded channel. A worker
//! whose queue is full (busy restoring, or slow) has its partitions
//! paused until it catches up, so it neither fills memory nor stops the
//! polling. The workers are in `worker.rs`, that flow control in
//! `flow.rs`.

mod flow;
mod placement;
mod worker;

use super::{RecoveryReport, TaskStats};
use crate::config::{Assignment, Config, KafkaInput};
use crate::runtime::Runtime;
use anyhow::{anyhow, bail, Context, Result};
use flow::{resume_offset, Flow, Opening};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::{work, Command};

/// Records queued per worker before the poll loop waits for it.
const QUEUE_RECORDS: usize = 4096;
/// How often the poll loop logs where each partition's input stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How often a group member with `task.standby_replicas` reads the
/// group's description and moves its standbys where they now belong.
const PLACE_STANDBYS_EVERY: Duration = Duration::from_secs(2);
/// How often an idle worker looks for commits that are due.
const TICK: Duration = Duration::from_millis(20);
/// librdkafka settings the input's guarantees rest on.
const PROTECTED: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "partition.assignment.strategy",
];

/// What a run of many tasks did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    /// Every open, in order: (partition, its recovery).
    pub opened: Vec<(i32, RecoveryReport)>,
    /// Partitions closed after a revoke or at the end.
    pub closed: u64,
    /// Partitions dropped uncommitted because the group had moved them.
    pub lost: u64,
    /// Standby replicas opened: (partition, its recovery).
    pub standbys: Vec<(i32, RecoveryReport)>,
    /// Partitions opened on a standby replica kept here.
    pub promoted: Vec<i32>,
    pub stats: TaskStats,
    /// "cooperative", "eager" or "static".
    pub assignment: Assignment,
}

/// What the workers report back to the poll loop.
#[derive(Default)]
struct Shared {
    /// The first failure of any task: the run stops with it.
    failure: Mutex<Option<anyhow::Error>>,
    summary: Mutex<Summary>,
}

impl Shared {
    fn fail(&self, e: anyhow::Error) {
        self.failure.lock().unwrap().get_or_insert(e);
    }
    fn failed(&self) -> bool {
        self.failure.lock().unwrap().is_some()
    }
}

/// The consumer's context: routes rebalances to the workers.
struct Rebalancer {
    topic: String,
    /// The job's store name: partition p's task is `<store>-<p>`.
    store: String,
    workers: Vec<SyncSender<Command>>,
    shared: std::sync::Arc<Shared>,
    /// What the rebalance callbacks and the poll loop share (both run on
    /// the polling thread; the lock is for the context's `Sync`).
    flow: Mutex<Flow>,
    /// The standby replicas asked of the workers.
    standbys: Mutex<BTreeSet<i32>>,
}

fn worker_of(partition: i32, workers: usize) -> usize {
    partition as usize % workers
}

impl Rebalancer {
    /// Starts opening `partitions` on their workers (in parallel across
    /// workers): one answer per partition, its input position.
    fn start_opens(&self, partitions: &[i32]) -> Result<Vec<(i32, Opening)>> {
        let mut replies = Vec::new();
        for &p in partitions {
            let (reply, rx) = mpsc::channel();
            let cancel = Arc::new(AtomicBool::new(false));
            self.workers[worker_of(p, self.workers.len())]
                .send(Command::Open {
                    partition: p,
                    reply,
                    cancel: cancel.clone(),
                })
                .map_err(|_| anyhow!("a worker thread has stopped"))?;
            replies.push((p, (rx, cancel)));
        }
        Ok(replies)
    }

    /// Asks the workers to keep standby replicas of `wanted` (and no
    /// others): each partition's worker opens or drops its own.
    fn keep_standbys(&self, wanted: &BTreeSet<i32>) -> Result<()> {
        let mut kept = self.standbys.lock().unwrap();
        for &partition in wanted.symmetric_difference(&kept) {
            let command = if wanted.contains(&partition) {
                Command::Standby { partition }
            } else {
                Command::DropStandby { partition }
            };
            self.workers[worker_of(partition, self.workers.len())]
                .send(command)
                .map_err(|_| anyhow!("a worker thread has stopped"))?;
        }
        *kept = wanted.clone();
        Ok(())
    }

    /// `task.standby_replicas`: the standbys this member keeps, from the
    /// group's description (when it is stable), with `manual` ones.
    fn place_standbys(
        &self,
        consumer: &BaseConsumer<Self>,
        group: &str,
        replicas: usize,
        manual: &BTreeSet<i32>,
    ) -> Result<()> {
        let Some(me) = member_id(consumer) else {
            return Ok(()); // not in the group yet
        };
        let list = consumer
            .fetch_group_list(Some(group), Duration::from_secs(5))
            .with_context(|| format!("standbys: cannot describe group `{group}`"))?;
        let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
            return Ok(());
        };
        if info.state() != "Stable" {
            return Ok(()); // placed again once the rebalance is over
        }
        let mut members = BTreeMap::new();
        for m in info.members() {
            let owned = m
                .assignment()
                .and_then(|a| placement::assigned_partitions(a, &self.topic))
                .unwrap_or_default();
            members.insert(m.id().to_string(), owned);
        }
        let mut wanted = placement::standbys_of(&me, &members, replicas);
        wanted.extend(manual);
        self.keep_standbys(&wanted)
    }

    /// Opens `partitions` and waits for them: where each resumes (the
    /// static assignment, which no group can evict).
    fn open(&self, partitions: &[i32]) -> Result<Vec<(i32, Offset)>> {
        self.start_opens(partitions)?
            .into_iter()
            .map(|(p, (rx, _))| {
                let position = rx
                    .recv()
                    .map_err(|_| anyhow!("a worker thread has stopped"))??;
                Ok((p, resume_offset(position)))
            })
            .collect()
    }

    fn close(&self, partitions: &[i32], lost: bool) -> Result<()> {
        let mut closes = Vec::new();
        let mut drops = Vec::new();
        for &p in partitions {
            let to = &self.workers[worker_of(p, self.workers.len())];
            let sent = if lost {
                let (reply, rx) = mpsc::channel();
                drops.push(rx);
                to.send(Command::Lose {
                    partition: p,
                    reply,
                })
            } else {
                let (reply, rx) = mpsc::channel();
                closes.push(rx);
                to.send(Command::Close {
                    partition: p,
                    reply,
                })
            };
            sent.map_err(|_| anyhow!("a worker thread has stopped"))?;
        }
        for rx in drops {
            rx.recv()
                .map_err(|_| anyhow!("a worker thread has stopped"))?;
        }
        for rx in closes {
            rx.recv()
                .map_err(|_| anyhow!("a worker thread has stopped"))??;
        }
        Ok(())
    }

    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect()
    }
}

impl ClientContext for Rebalancer {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!(?level, fac, "librdkafka (input): {message}");
    }
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka (input): {error}: {reason}");
    }
    /// Each assigned partition's lag: its last stable offset less the
    /// next offset the consumer hands over (librdkafka's own
    /// `consumer_lag` counts from the group's committed offset, which
    /// only the changelog's transactions move). Served by the poll;
    /// statistics are on only when metrics are.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else {
            return;
        };
        for (&p, partition) in &topic.partitions {
            let (end, next) = (partition.ls_offset, partition.app_offset);
            if p >= 0 && end >= 0 && next >= 0 {
                let store = format!("{}-{p}", self.store);
                crate::metrics::input_lag(&store, Some((end - next).max(0)));
            }
        }
    }
}

impl ConsumerContext for Rebalancer {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let partitions = self.partitions(tpl);
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                tracing::info!(?partitions, "assigned");
                self.assign(consumer, tpl, &partitions, cooperative)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let lost = consumer.assignment_lost();
                tracing::info!(?partitions, lost, "revoked");
                let open = self.forget(&partitions);
                for p in &partitions {
                    crate::metrics::input_lag(&format!("{}-{p}", self.store), None);
                }
                let closed = self.close(&open, lost);
                let released = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                closed.and(released.map_err(Into::into))
            }
            other => Err(anyhow!(
                "input: rebalance failed: {}",
                rdkafka::error::RDKafkaErrorCode::from(other)
            )),
        };
        if let Err(e) = result {
            self.shared.fail(e);
        }
    }
}

/// Makes the processor of a partition's task (one per task; `None`: the
/// one the config names).
pub type ProcessorFactory<'a> = Option<&'a (dyn Fn(i32) -> Box<dyn super::Processor> + Sync)>;

/// The Kafka input, its bootstrap servers and its consumer group, checked.
fn input_settings(config: &Config) -> Result<(&KafkaInput, String, String)> {
    let input = config
        .kafka_input()
        .context("task.input is not a Kafka topic")?;
    let bootstrap = input
        .bootstrap_servers
        .clone()
        .or_else(|| config.changelog.bootstrap_servers.clone())
        .context("task.input needs bootstrap_servers (or changelog.bootstrap_servers)")?;
    if let Some(k) = input
        .properties
        .keys()
        .find(|k| PROTECTED.contains(&k.as_str()))
    {
        bail!(
            "task.input.properties may not set `{k}`: txstore's exactly-once depends on its value"
        );
    }
    let group = input
        .group_id
        .clone()
        .unwrap_or_else(|| format!("txstore-{}", config.store.name));
    Ok((input, bootstrap, group))
}

/// Runs the tasks of `config`'s Kafka input until `stop` is set (then
/// every open task commits and closes) or a task fails.
pub fn run(
    config: &Config,
    runtime: &Runtime,
    stop: &AtomicBool,
    processors: ProcessorFactory<'_>,
) -> Result<Summary> {
    let (input, bootstrap, group) = input_settings(config)?;
    let consumer_config = consumer_config(input, &bootstrap, &group);
    let threads = config.task.threads;
    let shared = std::sync::Arc::new(Shared::default());
    shared.summary.lock().unwrap().assignment = input.assignment;
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..threads {
        let (tx, rx) = mpsc::sync_channel(QUEUE_RECORDS);
        senders.push(tx);
        receivers.push(rx);
    }
    let consumer: BaseConsumer<Rebalancer> = consumer_config
        .create_with_context(Rebalancer {
            topic: input.topic.clone(),
            store: config.store.name.clone(),
            workers: senders.clone(),
            shared: shared.clone(),
            flow: Mutex::new(Flow {
                backlog: (0..threads).map(|_| VecDeque::new()).collect(),
                ..Flow::default()
            }),
            standbys: Mutex::default(),
        })
        .with_context(|| format!("input: bad Kafka settings for topic `{}`", input.topic))?;
    let partitions = input_partitions(&consumer, input, &bootstrap)?;
    if let Some(crate::config::OutputSpec::Kafka { topic }) = &config.task.output {
        create_output_topic(config, &bootstrap, topic, partitions)?;
    }
    std::thread::scope(|scope| -> Result<()> {
        for (i, rx) in receivers.into_iter().enumerate() {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("txstore-worker-{i}"))
                .spawn_scoped(scope, move || {
                    work(rx, config, runtime, partitions, &shared, processors)
                })
                .context("cannot start a worker thread")?;
        }
        let polled = poll(
            &consumer,
            input,
            (&group, config.task.standby_replicas),
            stop,
            &shared,
        );
        // The end (or a failure): every open task commits and closes, and
        // only then does the consumer leave the group, so the next owner
        // of a partition starts from this process's last commit.
        // (Queued opens are cancelled; one under way finishes first.)
        let owned = consumer
            .context()
            .forget(&owned_partitions(&consumer, &input.topic));
        let closing = consumer.context().close(&owned, false);
        if input.assignment == Assignment::Static {
            let _ = consumer.unassign();
        } else {
            consumer.unsubscribe();
        }
        // Its context holds the workers' queues: the workers end when
        // every queue is gone.
        drop(consumer);
        drop(senders);
        polled.and(closing)
    })?;
    if let Some(e) = shared.failure.lock().unwrap().take() {
        return Err(e);
    }
    let mut summary = std::mem::take(&mut *shared.summary.lock().unwrap());
    summary.assignment = input.assignment;
    Ok(summary)
}

fn consumer_config(input: &KafkaInput, bootstrap: &str, group: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Records of aborted transactions never reach a processor.
        .set("isolation.level", "read_committed")
        // A committed position below the topic's start (retention) is an
        // error to report, not a jump to skip records silently.
        .set("auto.offset.reset", "error")
        .set(
            "partition.assignment.strategy",
            match input.assignment {
                Assignment::Eager => "range",
                _ => "cooperative-sticky",
            },
        )
        .set("session.timeout.ms", input.session_timeout_ms.to_string())
        .set(
            "heartbeat.interval.ms",
            (input.session_timeout_ms / 3).clamp(1, 3000).to_string(),
        );
    if crate::metrics::enabled() {
        // Per-partition lag for `txstore_input_lag_records`.
        c.set("statistics.interval.ms", "1000");
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        // librdkafka filters its own logs by this level: its `debug`
        // contexts (a property) reach the log only when it is debug.
        c.set_log_level(RDKafkaLogLevel::Debug);
    }
    for (k, v) in &input.properties {
        c.set(k, v);
    }
    c
}

/// The input topic's partition count (it must exist), checking a static
/// assignment against it.
fn input_partitions(
    consumer: &BaseConsumer<Rebalancer>,
    input: &KafkaInput,
    bootstrap: &str,
) -> Result<i32> {
    let timeout = Duration::from_secs(30);
    let metadata = consumer
        .fetch_metadata(Some(&input.topic), timeout)
        .map_err(|e| anyhow!("input: cannot reach Kafka at {bootstrap}: {e}"))?;
    let count = metadata
        .topics()
        .iter()
        .find(|t| t.name() == input.topic)
        .filter(|t| t.error().is_none())
        .map_or(0, |t| t.partitions().len()) as i32;
    if count == 0 {
        bail!(
            "input: topic `{}` does not exist at {bootstrap}",
            input.topic
        );
    }
    for (key, list) in [
        ("partitions", &input.partitions),
        ("standby_partitions", &input.standby_partitions),
    ] {
        if let Some(p) = list.iter().find(|p| **p >= count) {
            bail!(
                "task.input.{key}: topic `{}` has {count} partition(s); partition {p} does not exist",
                input.topic
            );
        }
    }
    Ok(count)
}

/// Creates the output topic (not compacted: every update is an event) when
/// it does not exist and the changelog may create topics.
fn create_output_topic(
    config: &Config,
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<()> {
    if !config.changelog.create_topic {
        return Ok(());
    }
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let replication = TopicReplication::Fixed(config.changelog.replication_factor);
    let new = NewTopic::new(topic, partitions, replication);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in futures_executor::block_on(admin.create_topics([&new], &options))? {
        match r {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => bail!("output: cannot create topic `{name}`: {code}"),
        }
    }
    Ok(())
}

/// Polls the input and hands records to their workers until `stop` or a
/// failure; resumes partitions as they finish restoring.
fn poll(
    consumer: &BaseConsumer<Rebalancer>,
    input: &KafkaInput,
    (group, standby_replicas): (&str, usize),
    stop: &AtomicBool,
    shared: &Shared,
) -> Result<()> {
    let flow = consumer.context();
    let manual: BTreeSet<i32> = input.standby_partitions.iter().copied().collect();
    let mut last_placement = Instant::now();
    if input.assignment == Assignment::Static {
        let mut tpl = TopicPartitionList::new();
        for (p, offset) in consumer.context().open(&input.partitions)? {
            tpl.add_partition_offset(&input.topic, p, offset)?;
        }
        consumer.assign(&tpl).context("input: assign")?;
        // After the owned partitions opened: those serve first.
        flow.keep_standbys(&manual)?;
    } else {
        flow.keep_standbys(&manual)?;
        consumer
            .subscribe(&[&input.topic])
            .with_context(|| format!("input: cannot subscribe to topic `{}`", input.topic))?;
    }
    let mut polled = 0u64;
    let mut last_report = Instant::now();
    while !stop.load(Ordering::Relaxed) && !shared.failed() {
        flow.resume_ready(consumer)?;
        if !flow.drain(consumer)? {
            break; // a worker failed: its error is in `shared`
        }
        if standby_replicas > 0 && last_placement.elapsed() >= PLACE_STANDBYS_EVERY {
            // A standby out of place costs warmth, not correctness: a
            // failure here is reported and tried again.
            if let Err(e) = flow.place_standbys(consumer, group, standby_replicas, &manual) {
                tracing::warn!("{e:#}");
            }
            last_placement = Instant::now();
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            // Where the consumer is, per partition: a stalled partition shows.
            let positions = consumer.position().map(|tpl| {
                tpl.elements_for_topic(&input.topic)
                    .iter()
                    .map(|e| (e.partition(), e.offset().to_raw().unwrap_or(-1)))
                    .collect::<Vec<_>>()
            });
            tracing::info!(records = polled, ?positions, "input progress");
            last_report = Instant::now();
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                polled += 1;
                let partition = m.partition();
                let record = Command::Record {
                    partition,
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                };
                if !flow.dispatch(consumer, partition, record)? {
                    break; // that worker failed: its error is in `shared`
                }
            }
            Some(Err(e)) if is_fatal(&e) => bail!("input: consuming topic `{}`: {e}", input.topic),
            Some(Err(e)) => tracing::warn!("input: topic `{}`: {e} (retrying)", input.topic),
            None => {}
        }
    }
    Ok(())
}

/// Errors the consumer does not recover from by itself.
fn is_fatal(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::OffsetOutOfRange
                | C::Fatal
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
        )
    )
}

/// This process's member id in its consumer group, once it has joined.
fn member_id(consumer: &BaseConsumer<Rebalancer>) -> Option<String> {
    use rdkafka::bindings::{rd_kafka_mem_free, rd_kafka_memberid};
    let client = consumer.client().native_ptr();
    // SAFETY: the client is alive for the call; librdkafka returns a
    // NUL-terminated copy (or null) that the caller frees with
    // rd_kafka_mem_free.
    unsafe {
        let id = rd_kafka_memberid(client);
        if id.is_null() {
            return None;
        }
        let owned = std::ffi::CStr::from_ptr(id).to_string_lossy().into_owned();
        rd_kafka_mem_free(client, id.cast());
        (!owned.is_empty()).then_some(owned)
    }
}

fn owned_partitions(consumer: &BaseConsumer<Rebalancer>, topic: &str) -> Vec<i32> {
    consumer
        .assignment()
        .map(|tpl| {
            tpl.elements_for_topic(topic)
                .iter()
                .map(|e| e.partition())
                .collect()
        })
        .unwrap_or_default()
}
