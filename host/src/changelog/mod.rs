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
pub mod kafka;

pub use clean::CleanStats;
pub use embedded::EmbeddedLog;
pub use kafka::KafkaLog;

use crate::config::{ChangelogKind, Config};
use anyhow::Result;

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
            log: Box::new(KafkaLog::open(&config.kafka()?)?),
            truncated_bytes: 0,
        },
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
    /// Discards the open transaction.
    fn abort(&mut self) -> Result<()>;
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
    /// The committed end offset (0 for an empty log).
    fn end_offset(&self) -> u64 {
        self.last_commit().map_or(0, |c| c.offset)
    }
}
