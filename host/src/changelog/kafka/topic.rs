//! The changelog topic as the broker keeps it: creation and the configs
//! that say what its cleaner may remove.

use super::marker::Compaction;
use super::*;

pub(super) fn create_topic(s: &KafkaSettings) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(s, &[]).create()?;
    let topic = NewTopic::new(
        &s.topic,
        s.topic_partitions,
        TopicReplication::Fixed(s.replication_factor),
    )
    .set("cleanup.policy", "compact");
    // Younger records stay uncompacted, so a replay of them is proven
    // record by record (marker.rs).
    let lag = s.min_compaction_lag_ms.to_string();
    let topic = topic.set("min.compaction.lag.ms", &lag);
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

impl KafkaLog {
    /// What the topic's cleaner may remove, as its configs say.
    pub(super) fn compaction(&self) -> Result<Compaction> {
        let configs = self.topic_configs()?;
        let value = |name: &str| configs.get(name).cloned().flatten();
        Ok(Compaction {
            compacted: value("cleanup.policy").is_some_and(|p| p.contains("compact")),
            min_lag_ms: value("min.compaction.lag.ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        })
    }

    /// The topic's configs, as the broker describes them.
    fn topic_configs(&self) -> Result<BTreeMap<String, Option<String>>> {
        let admin: AdminClient<DefaultClientContext> = client_config(&self.s, &[]).create()?;
        let options = AdminOptions::new().request_timeout(Some(self.s.timeout));
        let topic = ResourceSpecifier::Topic(&self.s.topic);
        let results = futures_executor::block_on(admin.describe_configs([&topic], &options))
            .map_err(|e| self.error("describe the topic's configs", e))?;
        match results.into_iter().next() {
            Some(Ok(r)) => Ok(r.entries.into_iter().map(|e| (e.name, e.value)).collect()),
            Some(Err(code)) => bail!(
                "changelog: cannot describe topic `{}`: {code}",
                self.s.topic
            ),
            None => bail!(
                "changelog: the broker did not describe topic `{}`",
                self.s.topic
            ),
        }
    }

    /// The topic's `delete.retention.ms` if it is compacted (None if not).
    pub(super) fn delete_retention_ms(&self) -> Result<Option<i64>> {
        let configs = self.topic_configs()?;
        let value = |name: &str| configs.get(name).cloned().flatten();
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
    pub(super) fn first_timestamp(&mut self, from: u64, end: u64) -> Result<Option<i64>> {
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
