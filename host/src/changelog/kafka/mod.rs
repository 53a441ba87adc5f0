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
//! - Each transaction with records ends with a marker record of its own
//!   (key [`marker::MARKER_KEY`], header [`END_HEADER`]; never applied to
//!   the store), so a replay knows where transactions end (Kafka hides its
//!   own commit markers from consumers) and can prove it read every one
//!   of them up to the committed end ([`marker`]). A replay that cannot
//!   prove it stops with one line instead of leaving the store behind.
//! - The task's input position is committed with the transaction as the
//!   consumer-group offset of (topic, partition) in `group_id`
//!   (`send_offsets_to_transaction`), with the changelog's committed end
//!   and the last marker's sequence number and time in the offset's
//!   metadata: all become visible exactly when the transaction commits,
//!   and they are what `last_commit` reads at open.
//! - Offsets are Kafka offsets; a transaction ends at (offset of its last
//!   record) + 1. A `read_committed` consumer replays from there.

mod marker;
mod metadata;
mod open;
mod replay;
use replay::Replay;
mod topic;

use super::{Changelog, CommitInfo, Record, Replayed};
use anyhow::{anyhow, bail, ensure, Context, Result};
use marker::{Marker, MARKER_KEY};
use metadata::{metadata, parse_metadata};
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
use topic::create_topic;

/// Header on a transaction's marker record (before markers, on its last
/// record); its value is the input position committed with it (8 bytes,
/// big-endian).
pub const END_HEADER: &str = "txstore.txn-end";
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
    /// `min.compaction.lag.ms` of a created topic: a replay of what is
    /// younger is proven record by record ([`marker`]).
    pub min_compaction_lag_ms: i64,
    /// The (topic, partition) whose offset in `group_id` is the task's
    /// input position: the input's own for a Kafka input (so the group's
    /// lag shows in Kafka's tools), else the changelog's.
    pub offsets_topic: String,
    pub offsets_partition: i32,
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
    /// The first failed delivery, if any, and the topic that refused it.
    error: Option<(KafkaError, String)>,
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
            Err((e, m)) => {
                s.error
                    .get_or_insert_with(|| (e.clone(), m.topic().to_string()));
            }
        }
    }
}

/// A transactional changelog in one Kafka topic partition.
pub struct KafkaLog {
    s: KafkaSettings,
    /// None for a reader (a standby replica): it never writes, so it
    /// never takes the transactional id over from the partition's owner.
    producer: Option<BaseProducer<Deliveries>>,
    consumer: BaseConsumer<Quiet>,
    in_transaction: bool,
    /// An operation of the open transaction failed: only `abort` may follow
    /// (retrying could commit the transaction without what failed).
    failed: bool,
    /// The producer's `transaction.timeout.ms`, for the fencing message.
    transaction_timeout_ms: String,
    /// Changelog records sent in the open transaction (its marker counts them).
    txn_records: u64,
    /// Output records sent in the open transaction.
    txn_output: u64,
    last: Option<CommitInfo>,
    /// The last marker: its sequence number (0: none yet) and when it was
    /// written (ms since the epoch). None: the group's offset was written
    /// by a txstore without markers.
    last_marker: Option<(u64, i64)>,
    /// The topic's `delete.retention.ms` and when it was read: a standby
    /// asks at every catch-up, the broker is asked once a minute.
    retention: Option<(Instant, Option<i64>)>,
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

/// How long a topic's `delete.retention.ms` is taken as read.
const RETENTION_CACHE: Duration = Duration::from_secs(60);

impl KafkaLog {
    /// [`KafkaLog::delete_retention_ms`], read again after a minute.
    fn cached_delete_retention_ms(&mut self) -> Result<Option<i64>> {
        match self.retention {
            Some((at, ms)) if at.elapsed() < RETENTION_CACHE => Ok(ms),
            _ => {
                let ms = self.delete_retention_ms()?;
                self.retention = Some((Instant::now(), ms));
                Ok(ms)
            }
        }
    }

    /// The transactional producer. Only the write paths use it, and
    /// `begin` refuses them on a reader.
    fn writer(&self) -> &BaseProducer<Deliveries> {
        self.producer
            .as_ref()
            .expect("a changelog reader never reaches a write")
    }

    /// The producer's fatal error (fencing, usually), if any.
    fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.producer.as_ref()?.client().fatal_error()
    }

    /// One error line naming the operation and the partition; fencing is
    /// told apart because it means another instance has taken over.
    fn error(&self, op: &str, e: KafkaError) -> anyhow::Error {
        // After a fatal error librdkafka reports `Fatal` or purged messages
        // everywhere; the cause (fencing, usually) is kept on the client.
        let (code, detail) = match self.fatal_error() {
            Some((c, text)) => (Some(c), text),
            None => (error_code(&e), e.to_string()),
        };
        if is_fenced(code) {
            self.fenced()
        } else {
            anyhow!(
                "changelog: Kafka {op} failed in the transaction of changelog topic `{}` partition {} at {}: {detail}",
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
        if self.in_transaction && self.fatal_error().is_none() {
            self.writer()
                .purge(PurgeConfig::default().queue().inflight());
            let aborted = self.flush().is_ok()
                && self
                    .retrying("abort_transaction", || {
                        self.writer().abort_transaction(self.s.timeout)
                    })
                    .is_ok();
            if aborted {
                *self.writer().context().state.lock().unwrap() = DeliveryState::default();
                self.in_transaction = false;
                self.txn_records = 0;
                self.txn_output = 0;
            }
        }
        match self.fatal_error() {
            Some((code, _)) if is_fenced(Some(code)) => self.fenced(),
            _ => e,
        }
    }

    fn begin(&mut self) -> Result<()> {
        if self.producer.is_none() {
            bail!(
                "changelog: topic `{}` partition {} is open for reading only (a standby replica); it does not write",
                self.s.topic,
                self.s.partition
            );
        }
        if self.failed {
            bail!("changelog: an operation of the open transaction failed; it can only be aborted");
        }
        if !self.in_transaction {
            *self.writer().context().state.lock().unwrap() = DeliveryState::default();
            self.writer()
                .begin_transaction()
                .map_err(|e| self.error("begin_transaction", e))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    fn send(&self, record: &Record) -> Result<()> {
        self.send_to(&self.s.topic, Some(self.s.partition), record)
    }

    /// Produces `record` to `topic` (`partition`, else by its key).
    fn send_to(&self, topic: &str, partition: Option<i32>, record: &Record) -> Result<()> {
        let (key, value) = match record {
            Record::Put(k, v) => (k, Some(v)),
            Record::Delete(k) => (k, None),
        };
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).key(&key[..]);
        if let Some(p) = partition {
            r = r.partition(p);
        }
        if let Some(v) = value {
            r = r.payload(&v[..]);
        }
        self.produce(r, &format!("produce to topic `{topic}`"))
    }

    /// Sends `r`, waiting while the local queue is full (serving delivery
    /// reports) up to the timeout; `op` names the operation in an error.
    fn produce(&self, mut r: BaseRecord<'_, [u8], [u8]>, op: &str) -> Result<()> {
        let deadline = Instant::now() + self.s.timeout;
        loop {
            match self.writer().send(r) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    self.writer().poll(Duration::from_millis(10));
                    r = back;
                }
                Err((e, _)) => return Err(self.error(op, e)),
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
        // The marker ends a transaction that wrote records or output, so
        // the last marker always tells the input position of the last
        // output (when the group's offsets are gone). One that only moves
        // the input position leaves the log where it is.
        let marker = match (self.txn_records + self.txn_output, self.last_marker) {
            (0, _) => None,
            (_, last) => {
                let records = self.txn_records;
                let (seq, prev_time_ms) = last.unwrap_or((0, 0));
                let m = Marker {
                    seq: seq + 1,
                    prev_end: self.end_offset(),
                    prev_time_ms,
                    records,
                    input_position,
                };
                let now_ms = now_ms();
                self.send_marker(&m, now_ms)?;
                Some((m.seq, now_ms))
            }
        };
        self.flush()?;
        let (last_offset, error) = {
            let state = self.writer().context().state.lock().unwrap();
            (state.last_offset, state.error.clone())
        };
        if let Some((e, topic)) = error {
            return Err(self.error(&format!("delivery to topic `{topic}`"), e));
        }
        let offset = match last_offset {
            Some(last) => last as u64 + 1,
            None => self.end_offset(), // offsets only: the log does not move
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            &self.s.offsets_topic,
            self.s.offsets_partition,
            Offset::Offset(input_position as i64),
        )?;
        let marker = marker.or(self.last_marker);
        if let Some(mut elem) = tpl.find_partition(&self.s.offsets_topic, self.s.offsets_partition)
        {
            elem.set_metadata(metadata(offset, marker, input_check));
        }
        let group = self
            .consumer
            .group_metadata()
            .context("changelog: the consumer has no group metadata")?;
        self.retrying("send_offsets_to_transaction", || {
            self.writer()
                .send_offsets_to_transaction(&tpl, &group, self.s.timeout)
        })?;
        self.retrying("commit_transaction", || {
            self.writer().commit_transaction(self.s.timeout)
        })?;
        self.last_marker = marker;
        Ok(offset)
    }

    /// Sends the marker `m` that ends the open transaction, timestamped
    /// `now_ms` (the time the next marker repeats).
    fn send_marker(&self, m: &Marker, now_ms: i64) -> Result<()> {
        let value = m.encode();
        let position = m.input_position.to_be_bytes();
        let r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.s.topic)
            .partition(self.s.partition)
            .key(MARKER_KEY)
            .payload(&value[..])
            .timestamp(now_ms)
            .headers(OwnedHeaders::new().insert(Header {
                key: END_HEADER,
                value: Some(&position[..]),
            }));
        self.produce(r, "produce the transaction marker")
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
        while self.writer().in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return Err(self.error(
                    "flush",
                    KafkaError::Flush(RDKafkaErrorCode::MessageTimedOut),
                ));
            }
            self.writer().poll(Duration::from_millis(1));
        }
        Ok(())
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Changelog for KafkaLog {
    fn append(&mut self, records: &[Record]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        if records.iter().any(|r| r.key() == MARKER_KEY) {
            bail!(
                "changelog: the key {:?} is reserved for the Kafka changelog's transaction markers",
                String::from_utf8_lossy(MARKER_KEY)
            );
        }
        self.begin()?;
        if let Err(e) = records.iter().try_for_each(|r| self.send(r)) {
            return Err(self.fail(e));
        }
        self.txn_records += records.len() as u64;
        Ok(())
    }

    fn emit(&mut self, records: &[Record]) -> Result<()> {
        let Some(topic) = self.s.output_topic.clone() else {
            bail!("changelog: no output topic is configured (task.output)");
        };
        self.begin()?;
        for record in records {
            if let Err(e) = self.send_to(&topic, None, record) {
                return Err(self.fail(e));
            }
        }
        self.txn_output += records.len() as u64;
        Ok(())
    }

    fn commit(&mut self, input_position: u64, input_check: Option<u32>) -> Result<u64> {
        self.begin()?;
        match self.commit_open(input_position, input_check) {
            Ok(offset) => {
                self.txn_records = 0;
                self.txn_output = 0;
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
        // partition can only come at or past `end`.
        let (low, stable) = self.watermarks(end)?;
        if (stable as u64) < end {
            bail!(
                "changelog: topic `{}` partition {} has committed data only up to offset {stable}, below the \
                 committed end {end}",
                self.s.topic,
                self.s.partition
            );
        }
        match self.replay(&self.consumer, from as i64, from, f) {
            Err(Replay::Unproven(first)) => {
                // Some brokers (noida-db 0.2) list aborted transactions that
                // ended before the fetch offset, and clients then drop the
                // producer's later batches. Read once more from the start,
                // where every abort marker comes in order, in one fetch.
                tracing::warn!(
                    "{first:#}; reading the partition again from its start, offset {low}"
                );
                let whole = self.whole_partition_consumer()?;
                match self.replay(&whole, low, from, f) {
                    Ok(()) => Ok(()),
                    Err(Replay::Unproven(e) | Replay::Failed(e)) => Err(e),
                }
            }
            Ok(()) => Ok(()),
            Err(Replay::Failed(e)) => Err(e),
        }
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

    fn refresh(&mut self) -> Result<()> {
        if self.producer.is_none() {
            let before = self.last;
            self.read_last()?;
            // The group's offset only moves forward; one that went back
            // (the group deleted and its offsets written again) is not
            // this log's history.
            if let (Some(b), Some(now)) = (before, self.last) {
                ensure!(
                    now.offset >= b.offset,
                    "changelog: topic `{}` partition {}: the committed end went back from {} to {} (group `{}` \
                     reset?)",
                    self.s.topic,
                    self.s.partition,
                    b.offset,
                    now.offset,
                    self.s.group_id
                );
            }
        }
        Ok(())
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
        let Some(retention_ms) = self.cached_delete_retention_ms()? else {
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
