//! `[changelog]`: where the changelog lives (embedded segments or a Kafka
//! topic), how it is cleaned, and the Kafka producer's settings.

use anyhow::{bail, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangelogKind {
    /// Segment files under the state directory: one machine.
    #[default]
    Embedded,
    /// A partition of a Kafka topic, written by a transactional producer.
    Kafka,
}

/// How the embedded changelog cleans itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanMode {
    /// On a thread beside the task, installed at a later commit.
    #[default]
    Background,
    /// Inside the commit that finds it due (deterministic: crash tests).
    Inline,
    /// Never: the changelog keeps all history.
    Off,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChangelogConfig {
    pub kind: ChangelogKind,
    /// Embedded: defaults to `<state_dir>/changelog`.
    pub dir: Option<PathBuf>,
    /// Embedded: a segment is rolled at the first commit past this size.
    pub segment_bytes: u64,
    /// Embedded: how sealed segments are cleaned (latest record per key).
    pub clean: CleanMode,
    /// Embedded: the most a clean's key index may hold; past it a clean
    /// covers fewer segments.
    pub clean_memory_bytes: usize,
    /// Kafka: `host:port[,host:port...]`.
    pub bootstrap_servers: Option<String>,
    /// Kafka: the changelog topic; defaults to `<store.name>-changelog`.
    pub topic: Option<String>,
    /// Kafka: this store's partition of the topic (one store per input partition).
    pub partition: i32,
    /// Kafka: defaults to `txstore-<topic>-<partition>`. Two instances with
    /// the same id fence each other: the older one stops.
    pub transactional_id: Option<String>,
    /// Kafka, file input: the consumer group the input position is
    /// committed to, in the same transaction; defaults to the transactional
    /// id. (A Kafka input's positions go to `task.input.group_id`.)
    pub group_id: Option<String>,
    /// Kafka: create the topic (compacted) when it does not exist.
    pub create_topic: bool,
    /// Kafka: partitions and replication of a created topic.
    pub topic_partitions: Option<i32>,
    pub replication_factor: i32,
    /// Kafka: `min.insync.replicas` of a created topic (the broker's
    /// default when unset): with `acks=all`, a commit needs this many
    /// replicas to have it.
    pub min_insync_replicas: Option<i32>,
    /// Kafka: `min.compaction.lag.ms` of a created topic. A replay of
    /// transactions younger than this is proven record by record; older
    /// ones may have been compacted, so gaps there are accepted.
    pub min_compaction_lag_ms: i64,
    /// Kafka: the most any broker operation may take.
    pub timeout_ms: u64,
    /// Kafka: further librdkafka settings (security, tuning), passed as is.
    pub properties: BTreeMap<String, String>,
}

impl Default for ChangelogConfig {
    fn default() -> Self {
        Self {
            kind: ChangelogKind::Embedded,
            dir: None,
            segment_bytes: 64 << 20,
            clean: CleanMode::Background,
            clean_memory_bytes: 256 << 20,
            bootstrap_servers: None,
            topic: None,
            partition: 0,
            transactional_id: None,
            group_id: None,
            create_topic: true,
            topic_partitions: None,
            replication_factor: 1,
            min_insync_replicas: None,
            min_compaction_lag_ms: 3_600_000,
            timeout_ms: 30_000,
            properties: BTreeMap::new(),
        }
    }
}

impl ChangelogConfig {
    /// Settings of one kind given for the other are mistakes worth naming.
    pub(super) fn check(&self, origin: &str) -> Result<()> {
        let kafka_keys = [
            ("bootstrap_servers", self.bootstrap_servers.is_some()),
            ("topic", self.topic.is_some()),
            ("transactional_id", self.transactional_id.is_some()),
            ("group_id", self.group_id.is_some()),
            ("properties", !self.properties.is_empty()),
        ];
        match self.kind {
            ChangelogKind::Embedded => {
                if let Some((key, _)) = kafka_keys.iter().find(|(_, set)| *set) {
                    bail!("{origin}: changelog.{key} is only for kind = \"kafka\"");
                }
            }
            ChangelogKind::Kafka => {
                if self.bootstrap_servers.is_none() {
                    bail!("{origin}: changelog.kind = \"kafka\" needs changelog.bootstrap_servers");
                }
                if self.dir.is_some() {
                    bail!("{origin}: changelog.dir is only for kind = \"embedded\"");
                }
                if self.partition < 0 {
                    bail!("{origin}: changelog.partition must not be negative");
                }
                if self.timeout_ms == 0 {
                    bail!("{origin}: changelog.timeout_ms must be at least 1");
                }
            }
        }
        Ok(())
    }
}
