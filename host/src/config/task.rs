//! `[task]`: the guarantee, the processor, the input and output, the
//! commit policy, and the checks across its settings.

use super::{ChangelogConfig, ChangelogKind};
use anyhow::{bail, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

impl std::fmt::Display for Guarantee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Guarantee::ExactlyOnce => "exactly-once",
            Guarantee::AtLeastOnce => "at-least-once",
        })
    }
}

/// `task.processor`: a built-in name or a processor component's path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProcessorSpec {
    /// `key<TAB>value` puts, `key` alone deletes.
    #[default]
    Kv,
    /// Counts words (runs of ASCII letters and digits, lowercased).
    WordCount,
    /// A component of the `processor` world (a path ending in `.wasm`,
    /// relative to the config file).
    Wasm(PathBuf),
}

impl<'de> Deserialize<'de> for ProcessorSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "kv" => Ok(ProcessorSpec::Kv),
            "word-count" => Ok(ProcessorSpec::WordCount),
            path if path.ends_with(".wasm") => Ok(ProcessorSpec::Wasm(PathBuf::from(path))),
            other => Err(serde::de::Error::custom(format!(
                "unknown processor `{other}`: a built-in (`kv`, `word-count`) or a processor component's path \
                 ending in `.wasm`"
            ))),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    pub guarantee: Guarantee,
    pub processor: ProcessorSpec,
    /// Passed to a wasm processor's `init` as strings.
    pub processor_options: BTreeMap<String, toml::Value>,
    /// What `txstore run` consumes: a file path (overridden by `--input`),
    /// or `{ kind = "kafka", topic = "..." }`.
    pub input: Option<InputSpec>,
    /// Where the processor's output records go (none when unset).
    pub output: Option<OutputSpec>,
    /// Worker threads for the tasks of a Kafka input (one task per
    /// assigned partition).
    pub threads: usize,
    /// A Kafka input with a consumer group: each partition's store is
    /// also kept warm, as a standby replica, by this many other members
    /// (Kafka Streams' `num.standby.replicas`).
    pub standby_replicas: usize,
    /// Commit after this many input records...
    pub commit_interval_records: u64,
    /// ...or after this much time, whichever comes first.
    pub commit_interval_ms: u64,
    /// Commit early when the guest holds more uncommitted bytes than this
    /// (Kafka's `statestore.uncommitted.max.bytes`). Once spelled
    /// `uncommitted_max_bytes`, still accepted with a warning.
    #[serde(alias = "uncommitted_max_bytes")]
    pub max_uncommitted_bytes: u64,
    /// The host's write cache in front of the guest (Kafka Streams'
    /// `statestore.cache.max.bytes`): records' writes wait there, each
    /// key's latest only, and reach the guest in one call when it fills,
    /// at a commit, or when a record needs the other kind of write. 0
    /// hands each record's writes over at once.
    pub max_cache_bytes: u64,
    /// After a guest trap or limit breach, `txstore run` discards the
    /// instance and restarts from recovery up to this many times; 0 stops
    /// with the error.
    pub restarts_on_guest_failure: u32,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            guarantee: Guarantee::ExactlyOnce,
            processor: ProcessorSpec::Kv,
            processor_options: BTreeMap::new(),
            input: None,
            output: None,
            threads: 1,
            standby_replicas: 0,
            commit_interval_records: 10_000,
            commit_interval_ms: 100,
            max_uncommitted_bytes: 64 << 20,
            max_cache_bytes: 1 << 20,
            restarts_on_guest_failure: 0,
        }
    }
}

/// `task.input`: a file path, or a table with `kind`.
#[derive(Clone, Debug, PartialEq)]
pub enum InputSpec {
    /// One record per newline-terminated line.
    File(PathBuf),
    /// The partitions of a Kafka topic, shared by the processes of a group.
    Kafka(KafkaInput),
}

/// `task.input = { kind = "kafka", ... }`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaInput {
    /// Always "kafka" (the tag the table was told apart by).
    #[serde(default, rename = "kind")]
    _kind: String,
    pub topic: String,
    /// Defaults to `changelog.bootstrap_servers`.
    pub bootstrap_servers: Option<String>,
    /// The consumer group the processes share; defaults to
    /// `txstore-<store.name>`. Each task commits its input position to it
    /// (the input partition's offset) inside the changelog transaction, so
    /// Kafka's own tools show the group's lag; a task resumes from the
    /// position its changelog transaction committed.
    pub group_id: Option<String>,
    /// How partitions are spread over the group's processes.
    #[serde(default)]
    pub assignment: Assignment,
    /// `assignment = "static"`: the partitions this process owns.
    #[serde(default)]
    pub partitions: Vec<i32>,
    /// Partitions this process keeps standby replicas of while it does
    /// not own them (warm copies of their stores, fed from their
    /// changelogs), so that taking one over replays only a tail. Listing
    /// every partition keeps a warm copy of all the others.
    #[serde(default)]
    pub standby_partitions: Vec<i32>,
    /// A process that misses heartbeats this long loses its partitions.
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u64,
    /// Further librdkafka settings for the input consumer, passed as is.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_session_timeout_ms() -> u64 {
    10_000
}

/// How a Kafka input's partitions reach the processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// Consumer group, `cooperative-sticky`: a rebalance moves only the
    /// partitions that change owner.
    #[default]
    Cooperative,
    /// Consumer group, `range` (eager): every rebalance revokes everything.
    Eager,
    /// No group: `partitions` names what this process owns.
    Static,
}

/// `task.output`: a table with `kind`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "kebab-case")]
pub enum OutputSpec {
    /// A topic written in the changelog's Kafka transaction: a
    /// `read_committed` reader sees each update once.
    Kafka { topic: String },
    /// A file whose committed length is in `<path>.committed`.
    File { path: PathBuf },
}

impl<'de> Deserialize<'de> for InputSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::String(path) => Ok(InputSpec::File(path.into())),
            toml::Value::Table(t) => match t.get("kind").and_then(|k| k.as_str()) {
                Some("kafka") => KafkaInput::deserialize(toml::Value::Table(t))
                    .map(InputSpec::Kafka)
                    .map_err(|e| D::Error::custom(format!("task.input: {}", e.message()))),
                Some("file") => match (t.get("path").and_then(|p| p.as_str()), t.len()) {
                    (Some(path), 2) => Ok(InputSpec::File(path.into())),
                    _ => Err(D::Error::custom(
                        "task.input of kind \"file\" takes exactly one more key: path",
                    )),
                },
                _ => Err(D::Error::custom(
                    "task.input.kind must be \"file\" or \"kafka\"",
                )),
            },
            _ => Err(D::Error::custom(
                "task.input must be a file path or a table with kind = \"file\" or \"kafka\"",
            )),
        }
    }
}

impl TaskConfig {
    pub(super) fn check(&self, changelog: &ChangelogConfig, origin: &str) -> Result<()> {
        if !(1..=MAX_THREADS).contains(&self.threads) {
            bail!("{origin}: task.threads must be between 1 and {MAX_THREADS}");
        }
        if !self.processor_options.is_empty() && !matches!(self.processor, ProcessorSpec::Wasm(_)) {
            bail!("{origin}: task.processor_options are for a processor component (task.processor = \"PATH.wasm\")");
        }
        let kafka_changelog = changelog.kind == ChangelogKind::Kafka;
        if let Some(InputSpec::Kafka(k)) = &self.input {
            // A partition's state must follow it to whichever process
            // takes it over: only a Kafka changelog does.
            if !kafka_changelog {
                bail!("{origin}: task.input of kind \"kafka\" needs changelog.kind = \"kafka\"");
            }
            if k.topic.is_empty() {
                bail!("{origin}: task.input.topic must not be empty");
            }
            if k.session_timeout_ms == 0 {
                bail!("{origin}: task.input.session_timeout_ms must be at least 1");
            }
            match k.assignment {
                Assignment::Static if k.partitions.is_empty() => {
                    bail!("{origin}: task.input.assignment = \"static\" needs task.input.partitions")
                }
                Assignment::Static => {
                    if let Some(p) = k.partitions.iter().find(|p| **p < 0) {
                        bail!("{origin}: task.input.partitions: {p} is negative");
                    }
                }
                _ if !k.partitions.is_empty() => bail!(
                    "{origin}: task.input.partitions is only for assignment = \"static\" (a group assigns them)"
                ),
                _ => {}
            }
            if let Some(p) = k.standby_partitions.iter().find(|p| **p < 0) {
                bail!("{origin}: task.input.standby_partitions: {p} is negative");
            }
            if self.standby_replicas > 0 && k.assignment == Assignment::Static {
                bail!(
                    "{origin}: task.standby_replicas places standbys by the consumer group; with assignment = \
                     \"static\" list them in task.input.standby_partitions"
                );
            }
        } else if self.standby_replicas > 0 {
            bail!("{origin}: task.standby_replicas is for a Kafka input (task.input of kind \"kafka\")");
        }
        if self.standby_replicas > MAX_STANDBY_REPLICAS {
            bail!("{origin}: task.standby_replicas must be at most {MAX_STANDBY_REPLICAS}");
        }
        if let (Some(OutputSpec::File { .. }), Some(InputSpec::Kafka(_))) =
            (&self.output, &self.input)
        {
            bail!(
                "{origin}: task.output of kind \"file\" is for a file input; a Kafka input's tasks write to a topic \
                 (kind = \"kafka\")"
            );
        }
        if let Some(OutputSpec::Kafka { topic }) = &self.output {
            if !kafka_changelog {
                bail!(
                    "{origin}: task.output of kind \"kafka\" is written in the changelog's transaction: it needs \
                     changelog.kind = \"kafka\""
                );
            }
            if topic.is_empty() {
                bail!("{origin}: task.output.topic must not be empty");
            }
        }
        Ok(())
    }
}

/// The most standby replicas per partition.
pub const MAX_STANDBY_REPLICAS: usize = 16;

/// The most worker threads a process runs tasks on.
pub const MAX_THREADS: usize = 256;
