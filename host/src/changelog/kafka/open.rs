//! Opening a Kafka changelog: the settings checked, the topics there (or
//! created), the producer taking over the transactional id, and the last
//! committed transaction read back.

use super::*;

impl KafkaLog {
    /// Connects, creates the topic if asked, takes over the transactional
    /// id (aborting a predecessor's open transaction) and reads the last
    /// committed transaction from the group's offset.
    pub fn open(s: &KafkaSettings) -> Result<Self> {
        let mut log = Self::connect(s, true)?;
        log.writer()
            .init_transactions(s.timeout)
            .map_err(|e| log.error("init_transactions", e))?;
        log.read_last()?;
        Ok(log)
    }

    /// Opens the changelog for reading only, as a standby replica does:
    /// no producer, so the partition's owner is not fenced, and no topic
    /// is created (its owner creates it). [`Changelog::refresh`] learns
    /// of later commits.
    pub fn open_reader(s: &KafkaSettings) -> Result<Self> {
        let s = KafkaSettings {
            create_topic: false,
            output_topic: None,
            ..s.clone()
        };
        let mut log = Self::connect(&s, false)?;
        log.read_last()?;
        Ok(log)
    }

    fn connect(s: &KafkaSettings, writer: bool) -> Result<Self> {
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
        ensure_topic(s, &consumer, &where_)?;
        if let Some(output) = &s.output_topic {
            ensure_output_topic(s, &consumer, output, &where_)?;
        }
        let (producer, transaction_timeout_ms) = if writer {
            let (p, timeout) = producer(s, &where_)?;
            (Some(p), timeout)
        } else {
            (None, String::new())
        };
        Ok(KafkaLog {
            s: s.clone(),
            producer,
            consumer,
            in_transaction: false,
            failed: false,
            transaction_timeout_ms,
            txn_records: 0,
            txn_output: 0,
            last: None,
            last_marker: Some((0, 0)),
            retention: None,
        })
    }
}

/// Checks the changelog topic (creating it if asked) and its partition.
fn ensure_topic(s: &KafkaSettings, consumer: &BaseConsumer<Quiet>, where_: &str) -> Result<()> {
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
    Ok(())
}

/// The output topic must exist (a created one may take a while to show).
fn ensure_output_topic(
    s: &KafkaSettings,
    consumer: &BaseConsumer<Quiet>,
    output: &str,
    where_: &str,
) -> Result<()> {
    {
        let deadline = Instant::now() + s.timeout.min(Duration::from_secs(5));
        let exists = loop {
            let found = consumer
                .fetch_metadata(Some(output), s.timeout)
                .map_err(|e| anyhow!("changelog: cannot reach Kafka for {where_}: {e}"))?
                .topics()
                .iter()
                .any(|t| t.name() == output && t.error().is_none() && !t.partitions().is_empty());
            if found || Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !exists {
            bail!(
                    "output: topic `{output}` does not exist at {} (create it, or set changelog.create_topic = true)",
                    s.bootstrap_servers
                );
        }
    }
    Ok(())
}

/// The transactional producer of the changelog, and its transaction timeout.
fn producer(s: &KafkaSettings, where_: &str) -> Result<(BaseProducer<Deliveries>, String)> {
    let producer_config = client_config(
        s,
        &[
            ("transactional.id", s.transactional_id.clone()),
            ("enable.idempotence", "true".into()),
            ("acks", "all".into()),
            // A missing output topic is an error to report, not one to
            // create with the broker's defaults.
            ("allow.auto.create.topics", "false".into()),
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
    Ok((producer, transaction_timeout_ms))
}

impl KafkaLog {
    /// The last committed transaction: from the group's offset, else from
    /// the changelog's last marker.
    pub(super) fn read_last(&mut self) -> Result<()> {
        let s = &self.s;
        match self.read_last_commit()? {
            Some((last, marker)) => {
                self.last = Some(last);
                self.last_marker = marker;
            }
            // No offset in the group: a new store, or offsets that Kafka
            // expired (offsets.retention.minutes after the last commit).
            // The changelog's last marker says the same, durably.
            None => {
                if let Some((offset, m, written_ms)) = self.read_last_marker()? {
                    tracing::warn!(
                        "changelog: group `{}` has no committed offset for topic `{}` partition {} (expired?); the \
                         committed end {} and input position {} come from the changelog's last transaction marker",
                        s.group_id,
                        s.offsets_topic,
                        s.offsets_partition,
                        offset + 1,
                        m.input_position
                    );
                    self.last = Some(CommitInfo {
                        offset: offset + 1,
                        input_position: m.input_position,
                        input_check: None,
                    });
                    self.last_marker = Some((m.seq, written_ms));
                }
            }
        }
        Ok(())
    }

    /// The committed offset of (topic, partition) in the group: the input
    /// position, with the changelog end and the last marker in its metadata.
    #[allow(clippy::type_complexity)]
    fn read_last_commit(&self) -> Result<Option<(CommitInfo, Option<(u64, i64)>)>> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.s.offsets_topic, self.s.offsets_partition);
        let committed = self
            .consumer
            .committed_offsets(tpl, self.s.timeout)
            .map_err(|e| self.error("read the committed offset", e))?;
        let Some(elem) = committed.find_partition(&self.s.offsets_topic, self.s.offsets_partition)
        else {
            return Ok(None);
        };
        elem.error()
            .map_err(|e| self.error("read the committed offset", e))?;
        let input_position = match elem.offset() {
            Offset::Offset(n) if n >= 0 => n as u64,
            _ => return Ok(None),
        };
        let parsed = parse_metadata(elem.metadata());
        let (offset, marker, check) = parsed.ok_or_else(|| {
                anyhow!(
                    "changelog: group `{}` has an offset for topic `{}` partition {} without txstore's metadata \
                     (`{}`): the group is used by something else; set changelog.group_id",
                    self.s.group_id,
                    self.s.topic,
                    self.s.partition,
                    elem.metadata()
                )
            })?;
        let info = CommitInfo {
            offset,
            input_position,
            input_check: check,
        };
        Ok(Some((info, marker)))
    }
}
