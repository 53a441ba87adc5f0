//! Applying writes: a record's to the guest in runs of puts and deletes,
//! or the write cache's in one call, then to the changelog's open
//! transaction; a guest's `uncommitted-limit` refusal answered by an early
//! commit at a record (or, in replay, a transaction) boundary.

use super::cache::{Batch, WriteCache};
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
        // What the cache holds came first.
        self.flush_cache()?;
        self.hand_over(writes, calls)?;
        self.stats.writes += writes.len() as u64;
        self.pending_writes += writes.len() as u64;
        crash::step("after-write");
        Ok(())
    }

    /// One record's writes to the guest, then to the changelog's open
    /// transaction; a refusal of its first call is answered by a commit at
    /// the task's input position (the record's start).
    fn hand_over(&mut self, writes: &[Record], calls: WriteCalls) -> Result<()> {
        let apply = |instance: &mut StoreInstance| match calls {
            WriteCalls::Batched => apply(instance, writes),
            WriteCalls::Single => apply_single(instance, writes),
        };
        self.guest_bytes = None;
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
        Ok(())
    }

    /// Hands the write cache to the guest in one call, then its records'
    /// changelog appends and output. A refusal (`uncommitted-limit`) is
    /// answered by a commit at the cache's first record, which carries
    /// nothing of the cache, and the call is made again; if the guest still
    /// refuses, the cached records go one by one, as without a cache.
    #[doc(hidden)]
    pub fn flush_cache(&mut self) -> Result<()> {
        if self.cache.is_empty() {
            return Ok(());
        }
        let mut result = apply_cache(&mut self.instance, &self.cache);
        if matches!(&result, Err(e) if e.is_uncommitted_limit()) {
            self.stats.limit_refusals += 1;
            if self.pending_records > self.cache.records() {
                self.commit_before_cache()?;
                self.stats.early_commits += 1;
                result = apply_cache(&mut self.instance, &self.cache);
            }
            if matches!(&result, Err(e) if e.is_uncommitted_limit()) {
                return self.flush_per_record();
            }
        }
        result?;
        self.guest_bytes = None;
        let (applied, output) = self.cache.take_applied();
        self.changelog.append(&applied)?;
        self.emit(&output)?;
        crash::step("after-flush");
        Ok(())
    }

    /// Commits the records before the cache's first, at its start: the
    /// guest and the changelog hold nothing of the cache yet.
    fn commit_before_cache(&mut self) -> Result<()> {
        let cached = (self.cache.records(), self.cache.writes());
        self.commit_at(self.cache.start())?;
        (self.pending_records, self.pending_writes) = cached;
        Ok(())
    }

    /// The cached records to the guest one at a time, each with its own
    /// boundary for an early commit.
    fn flush_per_record(&mut self) -> Result<()> {
        let records = self.cache.take_records();
        let at = (self.input_position, self.input_check);
        self.pending_records -= records.len() as u64;
        self.pending_writes -= records.iter().map(|r| r.writes.len() as u64).sum::<u64>();
        for r in records {
            (self.input_position, self.input_check) = r.start;
            if !r.writes.is_empty() {
                self.hand_over(&r.writes, WriteCalls::Batched)?;
            }
            self.emit(&r.outputs)?;
            self.pending_records += 1;
            self.pending_writes += r.writes.len() as u64;
        }
        (self.input_position, self.input_check) = at;
        self.guest_bytes = None;
        Ok(())
    }
}

/// The cache's one guest call (none when it holds only output).
fn apply_cache(instance: &mut StoreInstance, cache: &WriteCache) -> Result<(), CallError> {
    match cache.batch() {
        Batch::Puts(entries) if entries.is_empty() => Ok(()),
        Batch::Puts(entries) => instance.put_entries(&entries),
        Batch::Deletes(keys) => instance.delete_keys(&keys),
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

    fn cache_bytes(builder: TaskBuilder, bytes: u64) -> TaskBuilder {
        let mut config = builder.config().clone();
        config.task.max_cache_bytes = bytes;
        TaskBuilder::from_config(config)
    }

    fn put(task: &mut crate::task::Task, key: &str, at: u64) {
        task.process_line(format!("{key}\t{}", "v".repeat(100)).as_bytes(), at)
            .unwrap();
    }

    fn counts(task: &crate::task::Task) -> (u64, u64, u64) {
        let s = task.stats();
        (s.limit_refusals, s.early_commits, s.commits)
    }

    /// A guest's `uncommitted-limit` on a record's first call commits what
    /// came before the record (a record boundary), then the record goes in.
    #[test]
    fn a_refused_record_commits_what_came_before_it_and_retries() {
        let dir = tempfile::tempdir().unwrap();
        // Each entry counts key + value + 64: a and b fit in 400, c does not.
        // No cache: each record reaches the guest when it ends.
        let (mut task, _) = cache_bytes(buffered(dir.path(), "400"), 0).open().unwrap();
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

    /// The cache's batch refused: a commit at the cache's first record
    /// (nothing of the cache in it), then the same batch again.
    #[test]
    fn a_refused_cache_commits_at_its_first_record_and_goes_again() {
        let dir = tempfile::tempdir().unwrap();
        // 165 counted per record: the cache fills at two records (330);
        // the guest takes two (330 <= 400) but not four.
        let open = || {
            cache_bytes(buffered(dir.path(), "400"), 330)
                .open()
                .unwrap()
                .0
        };
        let mut task = open();
        put(&mut task, "a", 1);
        put(&mut task, "b", 2);
        assert_eq!(counts(&task), (0, 0, 0));
        put(&mut task, "c", 3);
        // Cached only: read-uncommitted sees it, read-committed not.
        assert!(task
            .get(b"c", Isolation::ReadUncommitted)
            .unwrap()
            .is_some());
        assert_eq!(task.get(b"c", Isolation::ReadCommitted).unwrap(), None);
        put(&mut task, "d", 4);
        assert_eq!(counts(&task), (1, 1, 1));
        assert_eq!(task.committed_input_position(), 2);
        assert_eq!(
            task.get(b"b", Isolation::ReadCommitted)
                .unwrap()
                .map(|v| v.len()),
            Some(100)
        );
        assert_eq!(task.get(b"c", Isolation::ReadCommitted).unwrap(), None);
        task.close().unwrap();
        let mut task = open();
        assert_eq!(
            task.range(None, None, Isolation::ReadCommitted)
                .unwrap()
                .len(),
            4
        );
    }

    /// A cache the guest takes whole when it holds nothing (buffered
    /// accepts any call then): one call, its records' changelog appends
    /// after it, and the store exact after a reopen.
    #[test]
    fn a_cache_bigger_than_the_guests_limit_goes_in_when_it_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let open = || buffered(dir.path(), "400").open().unwrap().0;
        let mut task = open();
        for (i, key) in ["a", "b", "c"].iter().enumerate() {
            put(&mut task, key, i as u64 + 1);
        }
        task.commit().unwrap();
        assert_eq!(counts(&task), (0, 0, 1));
        assert_eq!(task.committed_input_position(), 3);
        drop(task); // a crash after the commit: the changelog has all three
        let mut task = open();
        assert_eq!(
            task.range(None, None, Isolation::ReadCommitted)
                .unwrap()
                .len(),
            3
        );
    }

    /// Reads see the cache at read-uncommitted: a record's get, get-many
    /// and range over earlier records' cached puts and deletes.
    #[test]
    fn a_processor_reads_through_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (mut task, _) = TaskBuilder::new(dir.path())
            .manual_commits()
            .open()
            .unwrap();
        for (i, line) in ["a\t1", "b\t2", "c\t3"].iter().enumerate() {
            task.process_line(line.as_bytes(), i as u64 + 1).unwrap();
        }
        task.commit().unwrap();
        task.process_line(b"b\t22", 4).unwrap();
        task.process_line(b"d\t4", 5).unwrap();
        task.process_line(b"a", 6).unwrap(); // a delete: the puts go to the guest first
        task.process_line(b"c", 7).unwrap(); // cached with the delete of a
        assert!(!task.cache.is_empty());
        task.process_with(8, |ctx| {
            assert_eq!(ctx.get(b"c")?, None);
            assert_eq!(ctx.get(b"b")?.as_deref(), Some(&b"22"[..]));
            let many = ctx.get_many(&[b"a".to_vec(), b"d".to_vec(), b"e".to_vec()])?;
            assert_eq!(many, vec![None, Some(b"4".to_vec()), None]);
            let keys: Vec<_> = ctx
                .range(None, None, 10)?
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            assert_eq!(keys, vec![b"b".to_vec(), b"d".to_vec()]);
            Ok(())
        })
        .unwrap();
        let all = task.range(None, None, Isolation::ReadUncommitted).unwrap();
        assert_eq!(
            all,
            vec![
                (b"b".to_vec(), b"22".to_vec()),
                (b"d".to_vec(), b"4".to_vec())
            ]
        );
        assert_eq!(task.get(b"a", Isolation::ReadUncommitted).unwrap(), None);
        assert_eq!(
            task.get(b"a", Isolation::ReadCommitted).unwrap().as_deref(),
            Some(&b"1"[..])
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
