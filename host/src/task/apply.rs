//! Applying a record's writes: to the guest in runs of puts and deletes,
//! then to the changelog's open transaction; a guest's `uncommitted-limit`
//! refusal answered by an early commit at a record (or, in replay, a
//! transaction) boundary.

use super::Task;
use crate::changelog::Record;
use crate::crash;
use crate::runtime::{CallError, EntryRef, StoreInstance};
use anyhow::{bail, Context as _, Result};

impl Task {
    /// Applies `writes` to the store and the changelog's open transaction.
    #[doc(hidden)]
    pub fn write(&mut self, writes: &[Record]) -> Result<()> {
        self.write_with(writes, WriteCalls::Batched)
    }

    /// [`Task::write`] through the guest calls `calls` names (the
    /// conformance workload exercises both).
    #[doc(hidden)]
    pub fn write_with(&mut self, writes: &[Record], calls: WriteCalls) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let apply = |instance: &mut StoreInstance| match calls {
            WriteCalls::Batched => apply(instance, writes),
            WriteCalls::Single => apply_single(instance, writes),
        };
        match apply(&mut self.instance) {
            Err(Refusal { applied: true, .. }) => {
                // Part of the record is in the store and none of it in the
                // changelog: committing now would label those writes as
                // committed. Stop; recovery will discard them.
                bail!(
                    "guest {} refused part of a record's writes with uncommitted-limit after accepting the first \
                     part; a guest must refuse a record's first write call or none",
                    self.instance.label()
                );
            }
            Err(Refusal { error: e, .. }) if e.is_uncommitted_limit() => {
                // The guest holds as much as it may: commit what came before
                // this record (a record boundary), then it must accept.
                self.commit_inner()?;
                self.stats.early_commits += 1;
                self.stats.limit_refusals += 1;
                apply(&mut self.instance).map_err(|r| r.error).context(
                    "the guest refused a write right after a commit (it must accept when empty)",
                )?;
            }
            Err(r) => return Err(r.error.into()),
            Ok(()) => {}
        }
        self.changelog.append(writes)?;
        self.stats.writes += writes.len() as u64;
        self.pending_writes += writes.len() as u64;
        crash::step("after-write");
        Ok(())
    }
}

/// How a record's writes reach the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteCalls {
    /// Runs of puts and of deletes, one `put-many`/`delete-many` call each:
    /// what the task does with every record.
    Batched,
    /// One `put` or `delete` call per write.
    Single,
}

/// A write call the guest refused, and whether earlier calls for the same
/// writes had already been applied.
struct Refusal {
    error: CallError,
    applied: bool,
}

/// Applies writes in runs of puts and deletes (one guest call per run).
fn apply(instance: &mut StoreInstance, writes: &[Record]) -> Result<(), Refusal> {
    let mut i = 0;
    while i < writes.len() {
        let put = matches!(writes[i], Record::Put(..));
        let run = writes[i..]
            .iter()
            .take_while(|w| matches!(w, Record::Put(..)) == put)
            .count();
        let chunk = &writes[i..i + run];
        let result = if put {
            let entries: Vec<EntryRef> = chunk
                .iter()
                .map(|w| match w {
                    Record::Put(key, value) => EntryRef { key, value },
                    Record::Delete(_) => unreachable!("a run of puts"),
                })
                .collect();
            instance.put_entries(&entries)
        } else {
            let keys: Vec<&[u8]> = chunk.iter().map(Record::key).collect();
            instance.delete_keys(&keys)
        };
        result.map_err(|error| Refusal {
            error,
            applied: i > 0,
        })?;
        i += run;
    }
    Ok(())
}

/// Applies writes one `put` or `delete` call each.
fn apply_single(instance: &mut StoreInstance, writes: &[Record]) -> Result<(), Refusal> {
    for (i, w) in writes.iter().enumerate() {
        match w {
            Record::Put(k, v) => instance.put(k, v),
            Record::Delete(k) => instance.delete(k),
        }
        .map_err(|error| Refusal {
            error,
            applied: i > 0,
        })?;
    }
    Ok(())
}

/// `apply` for replay: on the uncommitted limit, commit at `safe` (the
/// last transaction fully applied) and go on one record at a time.
pub(super) fn apply_with_early_commit(
    instance: &mut StoreInstance,
    run: &[Record],
    safe: u64,
) -> Result<()> {
    let mut rest = run;
    while !rest.is_empty() {
        match apply(instance, rest) {
            Ok(()) => return Ok(()),
            Err(r) if r.error.is_uncommitted_limit() => {
                instance.commit(safe)?;
                let (first, tail) = rest.split_at(1);
                apply(instance, first).map_err(|r| r.error)?;
                rest = tail;
            }
            Err(r) => return Err(r.error.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::runtime::Isolation;
    use crate::task::TaskBuilder;
    use std::time::Duration;

    fn buffered(dir: &std::path::Path, limit: &str) -> TaskBuilder {
        TaskBuilder::new(dir)
            .guest("buffered")
            .option("max_uncommitted_bytes", limit)
            .commit_every(1_000, Duration::from_secs(3600))
    }

    /// A guest's `uncommitted-limit` on a record's first call commits what
    /// came before the record (a record boundary), then the record goes in.
    #[test]
    fn a_refused_record_commits_what_came_before_it_and_retries() {
        let dir = tempfile::tempdir().unwrap();
        // Each entry counts key + value + 64: a and b fit in 400, c does not.
        let (mut task, _) = buffered(dir.path(), "400").open().unwrap();
        let value = "v".repeat(100);
        task.process_line(format!("a\t{value}").as_bytes(), 1)
            .unwrap();
        task.process_line(format!("b\t{value}").as_bytes(), 2)
            .unwrap();
        assert_eq!(task.stats().commits, 0);
        task.process_line(format!("c\t{value}").as_bytes(), 3)
            .unwrap();
        let stats = task.stats().clone();
        assert_eq!(
            (stats.limit_refusals, stats.early_commits, stats.commits),
            (1, 1, 1)
        );
        // The early commit ended before record c, which is pending.
        assert_eq!(task.committed_input_position(), 2);
        assert_eq!(task.get(b"c", Isolation::ReadCommitted).unwrap(), None);
        assert!(task
            .get(b"c", Isolation::ReadUncommitted)
            .unwrap()
            .is_some());
        task.close().unwrap();
        let (mut task, _) = buffered(dir.path(), "400").open().unwrap();
        assert_eq!(
            task.range(None, None, Isolation::ReadCommitted)
                .unwrap()
                .len(),
            3
        );
    }

    /// A refusal after part of a record is in the store stops the task:
    /// committing would label that part committed.
    #[test]
    fn a_refusal_after_part_of_a_record_stops_the_task() {
        let dir = tempfile::tempdir().unwrap();
        // a (215 counted), b (70) and the delete (65) fit in 400; c does not.
        let (mut task, _) = buffered(dir.path(), "400").open().unwrap();
        task.process_line(format!("a\t{}", "v".repeat(150)).as_bytes(), 1)
            .unwrap();
        let err = task
            .process_with(2, |ctx| {
                ctx.put(b"b", b"small");
                ctx.delete(b"x");
                ctx.put(b"c", &[b'v'; 150]);
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("refused part of a record's writes"), "{err}");
        assert_eq!(task.stats().commits, 0);
    }

    /// The host's own limit commits early after the record that passed it.
    #[test]
    fn the_hosts_limit_commits_after_the_record_that_passes_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut builder = TaskBuilder::new(dir.path())
            .guest("roll-forward")
            .commit_every(1_000, Duration::from_secs(3600));
        let mut config = builder.config().clone();
        config.task.max_uncommitted_bytes = 300;
        builder = TaskBuilder::from_config(config);
        let (mut task, _) = builder.open().unwrap();
        for i in 0..10u64 {
            task.process_line(format!("k{i}\t{}", "v".repeat(100)).as_bytes(), i + 1)
                .unwrap();
        }
        let stats = task.stats().clone();
        assert!(stats.early_commits >= 2, "{stats:?}");
        assert_eq!(stats.limit_refusals, 0);
        assert_eq!(stats.commits, stats.early_commits);
    }
}
