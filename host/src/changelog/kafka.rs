//! A changelog in one partition of a Kafka topic, for stores spread over
//! machines: one store per input partition, each restored from its own
//! changelog partition.
//!
//! Mapping onto Kafka:
//! - A txstore transaction is a Kafka transaction of a producer whose
//!   `transactional.id` belongs to this store. `init_transactions` at open
//!   aborts whatever a crashed predecessor left open and fences any older
//!   instance still running with the same id.
//! - A put is a record `key -> value`, a delete a tombstone (`key -> null`),
//!   so the topic can be compacted as Kafka Streams' changelogs are.
//! - The last record of each transaction carries the header
//!   [`END_HEADER`], so a replay knows where transactions end (Kafka hides its
//!   own commit markers from consumers). Compaction may remove a marked
//!   record once a later write of its key exists; a replay then sees two
//!   transactions as one, which is still correct, only less chunked.
//! - The task's input position is committed with the transaction as the
//!   consumer-group offset of (topic, partition) in `group_id`
//!   (`send_offsets_to_transaction`), with the changelog's committed end in
//!   the offset's metadata: both become visible exactly when the
//!   transaction commits, and they are what `last_commit` reads at open.
//! - Offsets are Kafka offsets; a transaction ends at (offset of its last
//!   record) + 1. A `read_committed` consumer replays from there.

use super::{Changelog, CommitInfo, Record, Replayed};
use anyhow::{anyhow, bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig,
};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Header on the last record of a transaction; its value is the input
/// position committed with it (8 bytes, big-endian).
pub const END_HEADER: &str = "txstore.txn-end";
/// Prefix of the offset metadata that holds the changelog's committed end.
const END_METADATA: &str = "txstore-changelog-end=";
/// Follows the end in the metadata when the input is a file: its CRC32C.
const CHECK_METADATA: &str = ";input-crc32c=";
/// librdkafka settings the guarantees rest on: `properties` may not change them.
const PROTECTED: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "transactional.id",
    "isolation.level",
    "enable.idempotence",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "auto.offset.reset",
    "acks",
];

/// Where the changelog lives and who writes it (see `[changelog]` in the config).
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    pub bootstrap_servers: String,
    pub topic: String,
    pub partition: i32,
    pub transactional_id: String,
    pub group_id: String,
    pub create_topic: bool,
    pub topic_partitions: i32,
    pub replication_factor: i32,
    pub timeout: Duration,
    pub properties: BTreeMap<String, String>,
    /// Where [`Changelog::emit`] writes, in the same transaction.
    pub output_topic: Option<String>,
    /// `min.insync.replicas` of a created topic.
    pub min_insync_replicas: Option<i32>,
}

/// librdkafka's own logs and errors go to `tracing` at debug level: it
/// retries on its own, and an operation that finally fails is reported
/// once, with its context, by the caller.
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!(?level, fac, "librdkafka: {message}");
    }
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka: {error}: {reason}");
    }
}

impl ConsumerContext for Quiet {}

/// The producer's delivery reports for the open transaction.
struct Deliveries {
    /// The changelog's topic and partition: only their offsets say where
    /// the transaction ends (output records go elsewhere).
    topic: String,
    partition: i32,
    state: Mutex<DeliveryState>,
}

#[derive(Default)]
struct DeliveryState {
    /// Highest offset acknowledged in the open transaction.
    last_offset: Option<i64>,
    /// The first failed delivery, if any.
    error: Option<KafkaError>,
}

impl ClientContext for Deliveries {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        Quiet.log(level, fac, message)
    }
    fn error(&self, error: KafkaError, reason: &str) {
        Quiet.error(error, reason)
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut s = self.state.lock().unwrap();
        match result {
            Ok(m) if m.topic() == self.topic && m.partition() == self.partition => {
                s.last_offset = s.last_offset.max(Some(m.offset()))
            }
            Ok(_) => {}
            Err((e, _)) => {
                s.error.get_or_insert_with(|| e.clone());
            }
        }
    }
}

/// A transactional changelog in one Kafka topic partition.
pub struct KafkaLog {
    s: KafkaSettings,
    producer: BaseProducer<Deliveries>,
    consumer: BaseConsumer<Quiet>,
    in_transaction: bool,
    /// An operation of the open transaction failed: only `abort` may follow
    /// (retrying could commit the transaction without what failed).
    failed: bool,
    /// The producer's `transaction.timeout.ms`, for the fencing message.
    transaction_timeout_ms: String,
    /// The last appended record, sent at the next append, or at commit with
    /// the end header (the header must go on the transaction's last record).
    held: Option<Record>,
    last: Option<CommitInfo>,
}

/// A client config: our settings, then the user's `properties` (which may
/// override tuning such as `linger.ms`, never a [`PROTECTED`] key).
fn client_config(s: &KafkaSettings, settings: &[(&str, String)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.bootstrap_servers);
    for (k, v) in settings {
        c.set(*k, v);
    }
    for (k, v) in &s.properties {
        c.set(k, v);
    }
    c
}

fn error_code(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        KafkaError::Transaction(t) => Some(t.code()),
        other => other.rdkafka_error_code(),
    }
}

fn is_fenced(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::TransactionCoordinatorFenced
        )
    )
}

impl KafkaLog {
    /// Connects, creates the topic if asked, takes over the transactional
    /// id (aborting a predecessor's open transaction) and reads the last
    /// committed transaction from the group's offset.
    pub fn open(s: &KafkaSettings) -> Result<Self> {
        let where_ = format!(
            "topic `{}` partition {} at {}",
            s.topic, s.partition, s.bootstrap_servers
        );
        if let Some(k) = s
            .properties
            .keys()
            .find(|k| PROTECTED.contains(&k.as_str()))
        {
            bail!("changelog.properties may not set `{k}`: txstore's exactly-once depends on its value");
        }
        let consumer: BaseConsumer<Quiet> = client_config(
            s,
            &[
                ("group.id", s.group_id.clone()),
                ("enable.auto.commit", "false".into()),
                ("enable.auto.offset.store", "false".into()),
                ("isolation.level", "read_committed".into()),
                ("enable.partition.eof", "true".into()),
                // A replay must never skip records silently.
                ("auto.offset.reset", "error".into()),
            ],
        )
        .create_with_context(Quiet)
        .with_context(|| format!("changelog: bad Kafka settings for {where_}"))?;
        // (partitions, replicas of the first) as the metadata says.
        let count_partitions = || -> Result<(usize, usize)> {
            let metadata = consumer
                .fetch_metadata(Some(&s.topic), s.timeout)
                .map_err(|e| anyhow!("changelog: cannot reach Kafka for {where_}: {e}"))?;
            Ok(metadata
                .topics()
                .iter()
                .find(|t| t.name() == s.topic)
                .filter(|t| t.error().is_none())
                .map_or((0, 0), |t| {
                    let replicas = t.partitions().first().map_or(0, |p| p.replicas().len());
                    (t.partitions().len(), replicas)
                }))
        };
        let (mut partitions, mut replicas) = count_partitions()?;
        if partitions == 0 && s.create_topic {
            create_topic(s).with_context(|| format!("changelog: cannot create {where_}"))?;
            let deadline = Instant::now() + s.timeout;
            while partitions == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20)); // creation propagates to metadata
                (partitions, replicas) = count_partitions()?;
            }
        }
        if replicas == 1 {
            // Said once per process: every task of a topic would repeat it.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "changelog topic `{}` has one replica: a committed transaction is lost with that broker's disk \
                     (set changelog.replication_factor, and min_insync_replicas, for production)",
                    s.topic
                )
            });
        }
        if partitions == 0 {
            bail!(
                "changelog: topic `{}` does not exist at {} (set changelog.create_topic = true to create it)",
                s.topic,
                s.bootstrap_servers
            );
        }
        if s.partition as usize >= partitions {
            bail!(
                "changelog: topic `{}` has {partitions} partition(s); partition {} does not exist",
                s.topic,
                s.partition
            );
        }
        let producer_config = client_config(
            s,
            &[
                ("transactional.id", s.transactional_id.clone()),
                ("enable.idempotence", "true".into()),
                ("acks", "all".into()),
                ("linger.ms", "2".into()),
                (
                    "transaction.timeout.ms",
                    (s.timeout.as_millis().max(1000) * 2).to_string(),
                ),
            ],
        );
        let transaction_timeout_ms = producer_config
            .get("transaction.timeout.ms")
            .unwrap_or("?")
            .to_string();
        let producer: BaseProducer<Deliveries> = producer_config
            .create_with_context(Deliveries {
                topic: s.topic.clone(),
                partition: s.partition,
                state: Mutex::default(),
            })
            .with_context(|| format!("changelog: bad Kafka settings for {where_}"))?;
        let mut log = KafkaLog {
            s: s.clone(),
            producer,
            consumer,
            in_transaction: false,
            failed: false,
            transaction_timeout_ms,
            held: None,
            last: None,
        };
        log.producer
            .init_transactions(s.timeout)
            .map_err(|e| log.error("init_transactions", e))?;
        log.last = log.read_last_commit()?;
        Ok(log)
    }

    /// The committed offset of (topic, partition) in the group: the input
    /// position, with the changelog end in its metadata.
    fn read_last_commit(&self) -> Result<Option<CommitInfo>> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.s.topic, self.s.partition);
        let committed = self
            .consumer
            .committed_offsets(tpl, self.s.timeout)
            .map_err(|e| self.error("read the committed offset", e))?;
        let Some(elem) = committed.find_partition(&self.s.topic, self.s.partition) else {
            return Ok(None);
        };
        elem.error()
            .map_err(|e| self.error("read the committed offset", e))?;
        let input_position = match elem.offset() {
            Offset::Offset(n) if n >= 0 => n as u64,
            _ => return Ok(None),
        };
        let metadata = elem.metadata().strip_prefix(END_METADATA);
        let (end, check) = match metadata.map(|m| m.split_once(CHECK_METADATA)) {
            Some(Some((end, check))) => (Some(end), u32::from_str_radix(check, 16).ok()),
            Some(None) => (metadata, None),
            None => (None, None),
        };
        let offset = end
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| {
                anyhow!(
                    "changelog: group `{}` has an offset for topic `{}` partition {} without txstore's metadata \
                     (`{}`): the group is used by something else; set changelog.group_id",
                    self.s.group_id,
                    self.s.topic,
                    self.s.partition,
                    elem.metadata()
                )
            })?;
        Ok(Some(CommitInfo {
            offset,
            input_position,
            input_check: check,
        }))
    }

    /// One error line naming the operation and the partition; fencing is
    /// told apart because it means another instance has taken over.
    fn error(&self, op: &str, e: KafkaError) -> anyhow::Error {
        // After a fatal error librdkafka reports `Fatal` or purged messages
        // everywhere; the cause (fencing, usually) is kept on the client.
        let (code, detail) = match self.producer.client().fatal_error() {
            Some((c, text)) => (Some(c), text),
            None => (error_code(&e), e.to_string()),
        };
        if is_fenced(code) {
            self.fenced()
        } else {
            anyhow!(
                "changelog: Kafka {op} failed for topic `{}` partition {} at {}: {detail}",
                self.s.topic,
                self.s.partition,
                self.s.bootstrap_servers
            )
        }
    }

    fn fenced(&self) -> anyhow::Error {
        crate::error::marked(crate::error::Kind::Fenced, format!(
            "changelog: fenced: another instance with transactional id `{}` took over topic `{}` partition {} \
             (or a transaction stayed open past transaction.timeout.ms = {}); this one stops (everything it \
             committed is in the changelog, its open transaction is aborted)",
            self.s.transactional_id,
            self.s.topic,
            self.s.partition,
            self.transaction_timeout_ms
        ))
    }

    /// An operation of the open transaction failed (`e`): abort the
    /// transaction now rather than leave it open until it times out
    /// (read_committed readers wait on it). The abort also asks the
    /// coordinator whether another instance took over, the usual cause
    /// when a process wakes from a pause longer than its timeouts: its
    /// first error is then a local timeout, and fencing is the true one.
    /// The transaction stays failed: only `abort` may follow.
    fn fail(&mut self, e: anyhow::Error) -> anyhow::Error {
        self.failed = true;
        if self.in_transaction && self.producer.client().fatal_error().is_none() {
            self.producer
                .purge(PurgeConfig::default().queue().inflight());
            let aborted = self.flush().is_ok()
                && self
                    .retrying("abort_transaction", || {
                        self.producer.abort_transaction(self.s.timeout)
                    })
                    .is_ok();
            if aborted {
                *self.producer.context().state.lock().unwrap() = DeliveryState::default();
                self.in_transaction = false;
            }
        }
        match self.producer.client().fatal_error() {
            Some((code, _)) if is_fenced(Some(code)) => self.fenced(),
            _ => e,
        }
    }

    fn begin(&mut self) -> Result<()> {
        if self.failed {
            bail!("changelog: an operation of the open transaction failed; it can only be aborted");
        }
        if !self.in_transaction {
            *self.producer.context().state.lock().unwrap() = DeliveryState::default();
            self.producer
                .begin_transaction()
                .map_err(|e| self.error("begin_transaction", e))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    fn send(&self, record: &Record, end: Option<u64>) -> Result<()> {
        self.send_to(&self.s.topic, Some(self.s.partition), record, end)
    }

    /// Produces `record` to `topic` (`partition`, else by its key).
    fn send_to(
        &self,
        topic: &str,
        partition: Option<i32>,
        record: &Record,
        end: Option<u64>,
    ) -> Result<()> {
        let (key, value) = match record {
            Record::Put(k, v) => (k, Some(v)),
            Record::Delete(k) => (k, None),
        };
        let end_bytes = end.map(u64::to_be_bytes);
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).key(&key[..]);
        if let Some(p) = partition {
            r = r.partition(p);
        }
        if let Some(v) = value {
            r = r.payload(&v[..]);
        }
        if let Some(b) = &end_bytes {
            r = r.headers(OwnedHeaders::new().insert(Header {
                key: END_HEADER,
                value: Some(&b[..]),
            }));
        }
        let deadline = Instant::now() + self.s.timeout;
        loop {
            match self.producer.send(r) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    // The local queue is full: serve delivery reports, retry.
                    self.producer.poll(Duration::from_millis(10));
                    r = back;
                }
                Err((e, _)) => return Err(self.error("produce", e)),
            }
        }
    }

    /// The partition's low watermark and stable end (this consumer reads
    /// committed data), waiting up to the timeout for the stable end to
    /// reach `end`: the broker writes commit markers after the commit
    /// returns, so the stable end can briefly lag.
    fn watermarks(&self, end: u64) -> Result<(i64, i64)> {
        let deadline = Instant::now() + self.s.timeout;
        loop {
            let (low, high) = self
                .consumer
                .fetch_watermarks(&self.s.topic, self.s.partition, self.s.timeout)
                .map_err(|e| self.error("fetch_watermarks", e))?;
            if high as u64 >= end || Instant::now() >= deadline {
                return Ok((low, high));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The commit of the open transaction; the caller records the outcome.
    fn commit_open(&mut self, input_position: u64, input_check: Option<u32>) -> Result<u64> {
        if let Some(last) = &self.held {
            self.send(last, Some(input_position))?;
        }
        self.flush()?;
        let (last_offset, error) = {
            let state = self.producer.context().state.lock().unwrap();
            (state.last_offset, state.error.clone())
        };
        if let Some(e) = error {
            return Err(self.error("deliver", e));
        }
        let offset = match last_offset {
            Some(last) => last as u64 + 1,
            None => self.end_offset(), // offsets only: the log does not move
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            &self.s.topic,
            self.s.partition,
            Offset::Offset(input_position as i64),
        )?;
        if let Some(mut elem) = tpl.find_partition(&self.s.topic, self.s.partition) {
            let check = input_check.map_or(String::new(), |c| format!("{CHECK_METADATA}{c:08x}"));
            elem.set_metadata(format!("{END_METADATA}{offset}{check}"));
        }
        let group = self
            .consumer
            .group_metadata()
            .context("changelog: the consumer has no group metadata")?;
        self.retrying("send_offsets_to_transaction", || {
            self.producer
                .send_offsets_to_transaction(&tpl, &group, self.s.timeout)
        })?;
        self.retrying("commit_transaction", || {
            self.producer.commit_transaction(self.s.timeout)
        })?;
        Ok(offset)
    }

    /// Runs a transactional call, calling it again while librdkafka says
    /// the error is retriable ("retry call to resume": a timeout, for
    /// example after the process was stopped past its deadline). The retry
    /// learns the real outcome (committed, or fenced) instead of reporting
    /// a timeout. Bounded: `COMMIT_ATTEMPTS` calls in all.
    fn retrying(&self, op: &str, mut call: impl FnMut() -> KafkaResult<()>) -> Result<()> {
        const COMMIT_ATTEMPTS: u32 = 3;
        let mut attempt = 1;
        loop {
            match call() {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(e))
                    if e.is_retriable() && attempt < COMMIT_ATTEMPTS =>
                {
                    tracing::debug!("changelog: {op} attempt {attempt}: {e}; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(self.error(op, e)),
            }
        }
    }

    /// Waits until every sent record is acknowledged. rdkafka's own
    /// `flush` polls in 100 ms slices whether or not reports arrive, which
    /// would put 100 ms into every commit; this polls in 1 ms slices.
    fn flush(&self) -> Result<()> {
        let deadline = Instant::now() + self.s.timeout;
        while self.producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return Err(self.error(
                    "flush",
                    KafkaError::Flush(RDKafkaErrorCode::MessageTimedOut),
                ));
            }
            self.producer.poll(Duration::from_millis(1));
        }
        Ok(())
    }

    fn end_header(m: &BorrowedMessage<'_>) -> bool {
        m.headers()
            .is_some_and(|h| h.iter().any(|h| h.key == END_HEADER))
    }
}

fn create_topic(s: &KafkaSettings) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(s, &[]).create()?;
    let topic = NewTopic::new(
        &s.topic,
        s.topic_partitions,
        TopicReplication::Fixed(s.replication_factor),
    )
    .set("cleanup.policy", "compact");
    let min_insync = s.min_insync_replicas.map(|n| n.to_string());
    let topic = match &min_insync {
        Some(n) => topic.set("min.insync.replicas", n),
        None => topic,
    };
    let options = AdminOptions::new().operation_timeout(Some(s.timeout));
    let results = futures_executor::block_on(admin.create_topics([&topic], &options))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => bail!("topic `{name}`: {code}"),
        }
    }
    Ok(())
}

impl Changelog for KafkaLog {
    fn append(&mut self, records: &[Record]) -> Result<()> {
        let Some((last, rest)) = records.split_last() else {
            return Ok(());
        };
        self.begin()?;
        // Everything but the last record goes out now; the last is held
        // (one copy per input record, not per write) in case it ends the
        // transaction.
        let sent = self
            .held
            .iter()
            .chain(rest)
            .try_for_each(|r| self.send(r, None));
        if let Err(e) = sent {
            return Err(self.fail(e));
        }
        self.held = Some(last.clone());
        Ok(())
    }

    fn emit(&mut self, records: &[Record]) -> Result<()> {
        let Some(topic) = self.s.output_topic.clone() else {
            bail!("changelog: no output topic is configured (task.output)");
        };
        self.begin()?;
        for record in records {
            if let Err(e) = self.send_to(&topic, None, record, None) {
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    fn commit(&mut self, input_position: u64, input_check: Option<u32>) -> Result<u64> {
        self.begin()?;
        match self.commit_open(input_position, input_check) {
            Ok(offset) => {
                self.held = None;
                self.in_transaction = false;
                assert!(
                    offset >= self.end_offset(),
                    "the changelog end moved backwards"
                );
                self.last = Some(CommitInfo {
                    offset,
                    input_position,
                    input_check,
                });
                Ok(offset)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn abort(&mut self) -> Result<()> {
        self.held = None;
        if self.in_transaction {
            // librdkafka's abort waits for every delivery report to be
            // served; this producer serves them only when polled.
            self.producer
                .purge(PurgeConfig::default().queue().inflight());
            self.flush()?;
            self.producer
                .abort_transaction(self.s.timeout)
                .map_err(|e| self.error("abort_transaction", e))?;
            *self.producer.context().state.lock().unwrap() = DeliveryState::default();
            self.in_transaction = false;
        }
        self.failed = false;
        Ok(())
    }

    fn read_committed(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(Replayed) -> Result<()>,
    ) -> Result<()> {
        let end = self.end_offset();
        if from >= end {
            return Ok(());
        }
        // Once the stable end has reached `end`, the consumer's end of
        // partition can only come at or past `end`: everything committed
        // before it has been delivered (or compacted away).
        let (_, stable) = self.watermarks(end)?;
        if (stable as u64) < end {
            bail!(
                "changelog: topic `{}` partition {} has committed data only up to offset {stable}, below the \
                 committed end {end}",
                self.s.topic,
                self.s.partition
            );
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.s.topic, self.s.partition, Offset::Offset(from as i64))?;
        self.consumer
            .assign(&tpl)
            .map_err(|e| self.error("assign", e))?;
        let mut position = from;
        let mut last_progress = Instant::now();
        let result = (|| -> Result<()> {
            while position < end {
                match self.consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let offset = m.offset() as u64;
                        if offset >= end {
                            break;
                        }
                        let key = m.key().ok_or_else(|| {
                            anyhow!(
                                "changelog: record at offset {offset} of topic `{}` partition {} has no key: \
                                 not a txstore changelog",
                                self.s.topic,
                                self.s.partition
                            )
                        })?;
                        let record = match m.payload() {
                            Some(v) => Record::Put(key.to_vec(), v.to_vec()),
                            None => Record::Delete(key.to_vec()),
                        };
                        f(Replayed::Record(record))?;
                        if Self::end_header(&m) || offset + 1 == end {
                            f(Replayed::Commit(offset + 1))?;
                        }
                        position = offset + 1;
                        last_progress = Instant::now();
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => {
                        // Past `end` (see above): compaction removed the
                        // last records before it.
                        if position < end {
                            f(Replayed::Commit(end))?;
                        }
                        position = end;
                    }
                    Some(Err(e)) => return Err(self.error("consume", e)),
                    None => {}
                }
                if last_progress.elapsed() > self.s.timeout {
                    bail!(
                        "changelog: reading topic `{}` partition {} stalled at offset {position}, before the committed \
                         end {end}",
                        self.s.topic,
                        self.s.partition
                    );
                }
            }
            Ok(())
        })();
        let _ = self.consumer.unassign();
        result
    }

    fn check_replayable(&mut self, from: u64) -> Result<()> {
        let end = self.end_offset();
        if from >= end {
            return Ok(());
        }
        let (low, high) = self.watermarks(end)?;
        if (from as i64) < low {
            bail!(
                "changelog: topic `{}` partition {} starts at offset {low} but the store needs its records from offset \
                 {from} (deleted by retention?); nothing was changed",
                self.s.topic,
                self.s.partition
            );
        }
        if (high as u64) < end {
            bail!(
                "changelog: topic `{}` partition {} ends at offset {high} but group `{}` committed up to {end} \
                 (topic deleted and recreated?); nothing was changed",
                self.s.topic,
                self.s.partition,
                self.s.group_id
            );
        }
        Ok(())
    }

    fn last_commit(&self) -> Option<CommitInfo> {
        self.last
    }

    /// A compacted topic keeps a tombstone at least `delete.retention.ms`
    /// after it was written (after the first clean of its segment, which
    /// comes later still). So a replay from `from` sees every delete after
    /// it while the first record after `from` is younger than that, with
    /// the timeout to spare for the replay itself.
    fn deletes_missing_after(&mut self, from: u64) -> Result<Option<String>> {
        let end = self.end_offset();
        if from >= end {
            return Ok(None);
        }
        let Some(retention_ms) = self.delete_retention_ms()? else {
            return Ok(None);
        };
        let Some(written_ms) = self.first_timestamp(from, end)? else {
            return Ok(None);
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let age_ms = now_ms - written_ms;
        let spare_ms = (self.s.timeout.as_millis() as i64).min(retention_ms / 10);
        Ok((age_ms + spare_ms > retention_ms).then(|| {
            format!(
                "the changelog's first record after offset {from} was written {:.1} s ago, past topic `{}`'s \
                 delete.retention.ms of {retention_ms} ms: compaction may have removed deletes after it",
                age_ms as f64 / 1000.0,
                self.s.topic
            )
        }))
    }
}

impl KafkaLog {
    /// The topic's `delete.retention.ms` if it is compacted (None if not).
    fn delete_retention_ms(&self) -> Result<Option<i64>> {
        let admin: AdminClient<DefaultClientContext> = client_config(&self.s, &[]).create()?;
        let options = AdminOptions::new().request_timeout(Some(self.s.timeout));
        let topic = ResourceSpecifier::Topic(&self.s.topic);
        let results = futures_executor::block_on(admin.describe_configs([&topic], &options))
            .map_err(|e| self.error("describe the topic's configs", e))?;
        let resource = match results.into_iter().next() {
            Some(Ok(r)) => r,
            Some(Err(code)) => bail!(
                "changelog: cannot describe topic `{}`: {code}",
                self.s.topic
            ),
            None => bail!(
                "changelog: the broker did not describe topic `{}`",
                self.s.topic
            ),
        };
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        if !value("cleanup.policy").is_some_and(|p| p.contains("compact")) {
            return Ok(None);
        }
        // Kafka's default: one day.
        Ok(Some(
            value("delete.retention.ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(86_400_000),
        ))
    }

    /// The timestamp (ms) of the first committed record at or after
    /// `from`, before `end`.
    fn first_timestamp(&mut self, from: u64, end: u64) -> Result<Option<i64>> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.s.topic, self.s.partition, Offset::Offset(from as i64))?;
        self.consumer
            .assign(&tpl)
            .map_err(|e| self.error("assign", e))?;
        let deadline = Instant::now() + self.s.timeout;
        let found = loop {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if (m.offset() as u64) < end => break Ok(m.timestamp().to_millis()),
                Some(Ok(_)) | Some(Err(KafkaError::PartitionEOF(_))) => break Ok(None),
                Some(Err(e)) => break Err(self.error("consume", e)),
                None if Instant::now() >= deadline => {
                    break Err(anyhow!(
                        "changelog: reading topic `{}` partition {} at offset {from} timed out",
                        self.s.topic,
                        self.s.partition
                    ))
                }
                None => {}
            }
        };
        let _ = self.consumer.unassign();
        found
    }
}
