//! A standby replica: a partition's store kept warm from its changelog by
//! a process that does not own the partition, as Kafka Streams'
//! `num.standby.replicas` does. It opens the store in the partition's own
//! state directory with the changelog open for reading only (its
//! transactional id stays with the owner, who is never fenced by it) and
//! applies each transaction the owner commits, committing the store at
//! the transaction's end. Under exactly-once a committed offset is exact,
//! so promotion needs no wipe: the standby closes (a checkpoint at what
//! it applied) and the task opens in the same directory, replaying only
//! the tail the standby had not yet read.

use super::{RecoveryReport, Task};
use crate::config::Config;
use crate::runtime::Runtime;
use anyhow::Result;
use std::time::{Duration, Instant};

/// How often a standby asks for its changelog's committed end: the tail
/// a promotion replays is at most what the owner committed meanwhile.
pub const STANDBY_POLL: Duration = Duration::from_millis(200);

/// A partition's store, replay-only.
#[derive(Debug)]
pub struct Standby {
    task: Task,
    /// The changelog offset its store is committed at (the task's
    /// changelog may know a later end, learned by a look).
    applied: u64,
    last_look: Instant,
    /// Changelog records applied since it opened (the open's replay too).
    pub applied_records: u64,
}

impl Standby {
    /// Opens the store of `config` (a partition's task config) for
    /// replay only and brings it to its changelog's committed end.
    pub fn open(config: &Config, runtime: &Runtime) -> Result<(Self, RecoveryReport)> {
        let processor: Box<dyn super::Processor> = Box::new(super::processor::Kv);
        let (task, report) = Task::open_inner(config, runtime, Some(processor), true)?;
        let standby = Standby {
            applied_records: report.replayed_records,
            applied: task.changelog.end_offset(),
            task,
            last_look: Instant::now(),
        };
        standby.publish(0);
        Ok((standby, report))
    }

    /// Whether it is time to look for new commits again.
    pub fn due(&self) -> bool {
        self.last_look.elapsed() >= STANDBY_POLL
    }

    /// Learns the owner's latest commit: true when there is something to
    /// [`Standby::apply`].
    pub fn look(&mut self) -> Result<bool> {
        self.last_look = Instant::now();
        self.task.changelog.refresh()?;
        let end = self.task.changelog.end_offset();
        self.publish(end - self.applied);
        Ok(end > self.applied)
    }

    /// Applies every transaction committed up to the end the last look
    /// learned; returns the records applied.
    pub fn apply(&mut self) -> Result<u64> {
        let (applied, end) = (self.applied, self.task.changelog.end_offset());
        if end == applied {
            return Ok(0);
        }
        // As at open: a replay from here must see every delete after it
        // (a standby that fell behind a compacted topic's delete
        // retention cannot catch up; it stops with why).
        if let Some(why) = self.task.changelog.deletes_missing_after(applied)? {
            anyhow::bail!(
                "standby {}: {why}; it stops (the partition's owner is not affected)",
                self.task.config.store.name
            );
        }
        self.task.changelog.check_replayable(applied)?;
        let (records, _) = self.task.replay(Some(applied))?;
        self.applied = end;
        self.applied_records += records;
        self.publish(0);
        Ok(records)
    }

    fn publish(&self, lag: u64) {
        crate::metrics::standby_lag(&self.task.config.store.name, Some(lag));
    }

    /// Applies what its last look found, then closes the store with a
    /// checkpoint there, so the task that opens next in its directory (a
    /// promotion) replays only what was committed after.
    /// Returns the offset it closed at.
    pub fn close(mut self) -> Result<u64> {
        crate::metrics::standby_lag(&self.task.config.store.name, None);
        self.apply()?;
        self.task.close_in_place()?;
        Ok(self.applied)
    }
}
