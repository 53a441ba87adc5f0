//! The changelog: a durable, transactional log of store writes. The task
//! appends each write inside a transaction and commits it before the store
//! commits; after a crash, the store is brought forward by replaying the
//! committed transactions after the offset its recovery returned.
//!
//! [`embedded`] is the local default (segment files in the state
//! directory); [`kafka`] keeps the log in a Kafka topic partition
//! (transactional producer, `read_committed` consumer).

pub mod clean;
pub mod embedded;
mod frame;
pub mod kafka;

pub use clean::CleanStats;
pub use embedded::EmbeddedLog;
pub use kafka::{KafkaLog, KafkaSettings};

use crate::config::{ChangelogKind, Config, OutputSpec};
use anyhow::{bail, Result};

/// A changelog as a config names it, with what opening it had to repair.
pub struct Opened {
    pub log: Box<dyn Changelog>,
    /// Bytes of an unfinished tail cut at open (embedded only).
    pub truncated_bytes: u64,
}

/// Opens the changelog `config` names.
pub fn open(config: &Config) -> Result<Opened> {
    Ok(match config.changelog.kind {
        ChangelogKind::Embedded => {
            let mut log =
                EmbeddedLog::open(&config.changelog_dir(), config.changelog.segment_bytes)?;
            log.set_cleaning(embedded::CleanSettings {
                mode: config.changelog.clean,
                memory_bytes: config.changelog.clean_memory_bytes,
            });
            Opened {
                truncated_bytes: log.report.truncated_bytes,
                log: Box::new(log),
            }
        }
        ChangelogKind::Kafka => Opened {
            log: Box::new(KafkaLog::open(&kafka_settings(config)?)?),
            truncated_bytes: 0,
        },
    })
}

/// Opens the changelog `config` names for reading only, as a standby
/// replica does (a Kafka changelog: an embedded one has no other reader).
pub fn open_reader(config: &Config) -> Result<Opened> {
    if config.changelog.kind != ChangelogKind::Kafka {
        bail!("a standby replica needs a Kafka changelog (changelog.kind = \"kafka\")");
    }
    Ok(Opened {
        log: Box::new(KafkaLog::open_reader(&kafka_settings(config)?)?),
        truncated_bytes: 0,
    })
}

/// The Kafka changelog's settings `config` names, with defaults filled in.
pub fn kafka_settings(config: &Config) -> Result<KafkaSettings> {
    let c = &config.changelog;
    let Some(bootstrap) = c.bootstrap_servers.clone() else {
        bail!("changelog.kind = \"kafka\" needs changelog.bootstrap_servers");
    };
    let topic = config.kafka_topic();
    let transactional_id = c
        .transactional_id
        .clone()
        .unwrap_or_else(|| format!("txstore-{topic}-{}", c.partition));
    // A Kafka input's positions are committed as Kafka Streams does:
    // the input partition's offset in the input's group, so the group's
    // lag shows in Kafka's own tools.
    let (group_id, offsets) = match (config.kafka_input(), config.partition_task) {
        (Some(input), Some(p)) => (
            input
                .group_id
                .clone()
                .unwrap_or_else(|| format!("txstore-{}", config.store.name)),
            (input.topic.clone(), p),
        ),
        _ => (
            c.group_id
                .clone()
                .unwrap_or_else(|| transactional_id.clone()),
            (topic.clone(), c.partition),
        ),
    };
    Ok(KafkaSettings {
        bootstrap_servers: bootstrap,
        group_id,
        partition: c.partition,
        transactional_id,
        create_topic: c.create_topic,
        topic_partitions: c.topic_partitions.unwrap_or(c.partition + 1),
        replication_factor: c.replication_factor,
        timeout: std::time::Duration::from_millis(c.timeout_ms),
        properties: c.properties.clone(),
        output_topic: match &config.task.output {
            Some(OutputSpec::Kafka { topic }) => Some(topic.clone()),
            _ => None,
        },
        min_insync_replicas: c.min_insync_replicas,
        min_compaction_lag_ms: c.min_compaction_lag_ms,
        offsets_topic: offsets.0,
        offsets_partition: offsets.1,
        topic,
    })
}

/// One write, as the changelog carries it: absolute values, never deltas,
/// so replaying a transaction twice gives the same state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

impl Record {
    pub fn key(&self) -> &[u8] {
        match self {
            Record::Put(k, _) | Record::Delete(k) => k,
        }
    }
}

/// What a replay sees, in log order.
#[derive(Debug)]
pub enum Replayed {
    Record(Record),
    /// The end of a committed transaction; the offset is its commit offset.
    Commit(u64),
}

/// The last committed transaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitInfo {
    /// Offset just after the transaction (what `commit` returned).
    pub offset: u64,
    /// The task's input position committed with it.
    pub input_position: u64,
    /// CRC32C of the input bytes before `input_position`, when the input
    /// is a file: tells another file, or an edited one, from the same file
    /// grown.
    pub input_check: Option<u32>,
}

/// A transactional log. A transaction opens implicitly with the first
/// `append` after a commit or abort.
pub trait Changelog: Send {
    /// Appends `records` (one input record's writes, in order) to the open
    /// transaction (not visible to readers).
    fn append(&mut self, records: &[Record]) -> Result<()>;
    /// Adds `records` to the task's output in the open transaction: they
    /// become visible to `read_committed` readers exactly when it commits.
    fn emit(&mut self, _records: &[Record]) -> Result<()> {
        anyhow::bail!(
            "this changelog cannot carry output records (task.output needs a Kafka changelog)"
        )
    }
    /// Durably commits the open transaction (possibly empty) together with
    /// the task's input position (and the checksum of the input before
    /// it); returns the new committed offset.
    fn commit(&mut self, input_position: u64, input_check: Option<u32>) -> Result<u64>;
    /// Calls `f` with every committed record whose transaction ends after
    /// `from`, and with each transaction's end, in order.
    fn read_committed(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(Replayed) -> Result<()>,
    ) -> Result<()>;
    /// Fails, before anything changes, if a replay from `from` could not
    /// read every committed record after it (damage in the log).
    fn check_replayable(&mut self, from: u64) -> Result<()>;
    /// The last committed transaction, if any.
    fn last_commit(&self) -> Option<CommitInfo>;
    /// A log opened for reading only (a standby replica's) learns of the
    /// transactions its writer committed since; a writer knows already.
    fn refresh(&mut self) -> Result<()> {
        Ok(())
    }
    /// The store is durably committed at `offset` (its recovery never
    /// returns less, or it wipes): the log may drop what only an older
    /// store would need. The embedded log cleans itself here.
    fn store_committed(&mut self, _offset: u64) -> Result<()> {
        Ok(())
    }
    /// Deletes at offsets below this may have been cleaned away (the
    /// embedded log's own cleaner); 0 when the log cannot say.
    fn deletes_kept_from(&self) -> u64 {
        0
    }
    /// Why a replay from `from` (a store recovered there, not empty) may
    /// miss deletes committed after it, if it may: they were cleaned away.
    /// The task then refuses the store rather than keep deleted keys.
    fn deletes_missing_after(&mut self, from: u64) -> Result<Option<String>> {
        let kept_from = self.deletes_kept_from();
        Ok((from > 0 && from < kept_from)
            .then(|| format!("the changelog's deletes below offset {kept_from} were cleaned away")))
    }
    /// Cleans the whole committed log now, the store being durably at
    /// `store_offset`; None if there was nothing to clean.
    fn clean_now(&mut self, _store_offset: u64) -> Result<Option<CleanStats>> {
        anyhow::bail!(
            "this changelog is compacted by its broker (a compacted topic), not by txstore"
        )
    }
    /// The log's size on disk and cleaning runs, for metrics; None when
    /// the log lives elsewhere (a Kafka topic: the broker's metrics).
    fn figures(&self) -> Option<crate::metrics::ChangelogFigures> {
        None
    }
    /// The committed end offset (0 for an empty log).
    fn end_offset(&self) -> u64 {
        self.last_commit().map_or(0, |c| c.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    #[test]
    fn kafka_settings_fill_in_defaults() {
        let base = "[store]\nname = \"wc\"\nguest = \"g\"\nstate_dir = \"s\"\n";
        let kafka = "[changelog]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\n";
        let parse = |extra: &str| {
            Config::parse(&format!("{base}{extra}"), "c.toml", Path::new("/etc")).unwrap()
        };
        let c = parse(&format!("{kafka}partition = 3\n"));
        let k = kafka_settings(&c).unwrap();
        assert_eq!(k.topic, "wc-changelog");
        assert_eq!(k.transactional_id, "txstore-wc-changelog-3");
        assert_eq!(k.group_id, k.transactional_id);
        assert_eq!(k.topic_partitions, 4);
        assert_eq!(
            (k.offsets_topic.as_str(), k.offsets_partition),
            ("wc-changelog", 3)
        );
        // A Kafka input's partition task: positions go to the input's group.
        let c = parse(&format!(
            "[task]\nthreads = 2\noutput = {{ kind = \"kafka\", topic = \"out\" }}\n\
             input = {{ kind = \"kafka\", topic = \"in\" }}\n{kafka}"
        ));
        let p3 = c.for_partition(3, 6);
        assert_eq!(p3.state_dir(), PathBuf::from("/etc/s/wc-3"));
        let k = kafka_settings(&p3).unwrap();
        assert_eq!(
            (k.topic.as_str(), k.partition, k.topic_partitions),
            ("wc-changelog", 3, 6)
        );
        assert_eq!(k.transactional_id, "txstore-wc-changelog-3");
        assert_eq!(k.output_topic.as_deref(), Some("out"));
        assert_eq!(k.group_id, "txstore-wc");
        assert_eq!((k.offsets_topic.as_str(), k.offsets_partition), ("in", 3));
    }
}
