//! The task driver: the exactly-once commit protocol around a guest.
//!
//! Processing: input record -> store writes + changelog appends. Commit:
//! changelog commit (offset o, input position) -> `store.commit(o)` ->
//! checkpoint (after every commit under at-least-once, at clean close only
//! under exactly-once). Start-up: read the checkpoint (and remove it under
//! exactly-once) -> `store.recover(checkpoint)` -> replay the committed
//! changelog after the returned offset -> resume the input at the committed
//! input position.

mod apply;
pub mod builder;
pub(crate) mod cache;
pub mod feed;
pub mod manifest;
pub mod migrate;
pub mod output;
pub mod partitions;
pub mod processor;
mod recovery;
pub mod serve;
mod standby;
pub mod wasm_processor;

use crate::changelog::{Changelog, CleanStats, Record};
use crate::checkpoint::Checkpoint;
use crate::config::{Config, ProcessorSpec};
use crate::crash;
use crate::error::Error;
use crate::runtime::{Isolation, Runtime, StoreInstance};
use crate::storage::Backend;
use anyhow::Result;
pub use apply::WriteCalls;
pub use builder::TaskBuilder;
pub use processor::{Context, Input, Processor};
pub use recovery::{open_backend_at, RecoveryReport};
pub use standby::Standby;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counters of a run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TaskStats {
    pub records: u64,
    pub writes: u64,
    pub commits: u64,
    pub early_commits: u64,
    /// Records the guest refused with `uncommitted-limit` (each followed
    /// by an early commit and a retry).
    pub limit_refusals: u64,
    pub input_bytes: u64,
    /// Output records emitted (`task.output`).
    pub output_records: u64,
    /// At a clean close: the checkpointed offset and the input position
    /// committed with it.
    pub closed_at: u64,
    pub committed_steps: u64,
}

impl TaskStats {
    #[doc(hidden)]
    /// Adds another run's counters (a run restarted after a guest failure).
    pub fn add(&mut self, other: &TaskStats) {
        self.records += other.records;
        self.writes += other.writes;
        self.commits += other.commits;
        self.early_commits += other.early_commits;
        self.limit_refusals += other.limit_refusals;
        self.input_bytes += other.input_bytes;
        self.output_records += other.output_records;
    }
}

/// A store with its guest, changelog and checkpoint, driven by the protocol.
pub struct Task {
    config: Config,
    instance: StoreInstance,
    changelog: Box<dyn Changelog>,
    checkpoint: Checkpoint,
    processor: Box<dyn Processor>,
    /// Input position after the last processed record.
    input_position: u64,
    /// CRC32C of the input before `input_position` (file input only), and
    /// the one the next `end_record` takes on.
    input_check: Option<u32>,
    next_input_check: Option<u32>,
    /// Records and time since the last commit.
    pending_records: u64,
    pending_writes: u64,
    /// Processed records' writes not yet handed to the guest.
    cache: cache::WriteCache,
    /// The guest's `approximate-uncommitted-bytes`, asked again only after
    /// writes reached it.
    guest_bytes: Option<u64>,
    last_commit: Instant,
    pub stats: TaskStats,
    /// Checkpoint after every commit (at-least-once, transactional guest).
    checkpoint_each_commit: bool,
    /// Where output records go (`task.output`), if anywhere.
    output: Option<Output>,
    /// The task's metrics (a no-op unless the process serves them).
    metrics: crate::metrics::TaskMetrics,
    // Keeps the storage (and its lock) alive as long as the task.
    _backend: Arc<dyn Backend>,
    // The state directory's lock, held as long as the task.
    _lock: std::fs::File,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("store", &self.config.store.name)
            .field("state_dir", &self.config.state_dir())
            .field("guest", &self.instance.label())
            .field("input_position", &self.input_position)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Task {
    /// Opens the store of `config` and brings it to the changelog's
    /// committed state, with the processor `config` names.
    ///
    /// ```
    /// use txstore::{Config, Runtime, Task};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let config = Config::parse(
    ///     "[store]\nguest = \"buffered\"\nstate_dir = \"state\"\n[task]\nprocessor = \"word-count\"\n",
    ///     "example.toml",
    ///     dir.path(),
    /// )?;
    /// let runtime = Runtime::new(None)?;
    /// let (mut task, report) = Task::open(&config, &runtime)?;
    /// assert_eq!(report.replayed_records, 0);
    /// task.process_line(b"to be or not to be", 19)?;
    /// task.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(config: &Config, runtime: &Runtime) -> Result<(Self, RecoveryReport), Error> {
        Self::open_with(config, runtime, None)
    }

    /// [`Task::open`] with the caller's `processor` instead of the one
    /// `config` names (when `Some`).
    ///
    /// ```
    /// use txstore::{Config, Kv, Runtime, Task};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let config = Config::new("roll-forward", dir.path());
    /// let runtime = Runtime::new(None)?;
    /// let (task, _) = Task::open_with(&config, &runtime, Some(Box::new(Kv)))?;
    /// task.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_with(
        config: &Config,
        runtime: &Runtime,
        processor: Option<Box<dyn Processor>>,
    ) -> Result<(Self, RecoveryReport), Error> {
        Self::open_inner(config, runtime, processor, false).map_err(Error::from)
    }

    /// The live guest instance (queries, tests).
    #[doc(hidden)]
    pub fn store(&mut self) -> &mut StoreInstance {
        &mut self.instance
    }

    /// Where input processing resumes: the `end_position` of the last
    /// record processed (committed or not; after open, the committed one).
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// task.close()?;
    /// let (task, report) = TaskBuilder::new(dir.path()).open()?;
    /// assert_eq!((task.input_position(), report.input_position), (4, 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn input_position(&self) -> u64 {
        self.input_position
    }

    #[doc(hidden)]
    /// Ends one input record whose writes went through [`Task::write`]:
    /// the input is consumed up to `position`, and the task commits when the
    /// interval or the uncommitted limit says so.
    pub fn end_record(&mut self, position: u64) -> Result<()> {
        self.advance(position);
        self.maybe_commit()
    }

    /// The input consumed up to `position`: one more record pending.
    fn advance(&mut self, position: u64) {
        self.input_position = position;
        self.input_check = self.next_input_check.take().or(self.input_check);
        self.stats.records += 1;
        self.pending_records += 1;
    }

    #[doc(hidden)]
    /// The CRC32C of the input up to the end of the record being
    /// processed (file input): committed with the position, so that a
    /// later run can tell whether it is given the same input.
    pub fn set_next_input_check(&mut self, check: u32) {
        self.next_input_check = Some(check);
    }

    #[doc(hidden)]
    /// The input checksum committed with the last transaction, if any.
    pub fn committed_input_check(&self) -> Option<u32> {
        self.changelog.last_commit().and_then(|c| c.input_check)
    }

    /// The changelog offset of the last committed transaction, if any.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// assert_eq!(task.committed_offset(), None);
    /// task.process_line(b"k\tv", 4)?;
    /// task.commit()?;
    /// assert!(task.committed_offset().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn committed_offset(&self) -> Option<u64> {
        self.changelog.last_commit().map(|c| c.offset)
    }

    /// The input position of the last committed transaction.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).manual_commits().open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// assert_eq!(task.committed_input_position(), 0);
    /// task.commit()?;
    /// assert_eq!(task.committed_input_position(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn committed_input_position(&self) -> u64 {
        self.changelog.last_commit().map_or(0, |c| c.input_position)
    }

    /// Lets txstore drive the loop over an input file: processes it from
    /// where the last run committed to its end, one record per
    /// newline-terminated line (a last line without a newline waits for
    /// the next run), committing on the task's policy. The first run
    /// records a checksum of what it consumed, so a rerun on another file
    /// is refused rather than resumed mid-way. Call [`Task::close`] after.
    ///
    /// ```
    /// use txstore::{Isolation, TaskBuilder, WordCount};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let input = dir.path().join("in.txt");
    /// std::fs::write(&input, "one two\ntwo\n")?;
    /// let (mut task, _) = TaskBuilder::new(dir.path().join("s")).processor(WordCount).open()?;
    /// task.run_file(&input)?;
    /// assert_eq!(task.input_position(), 12);
    /// assert_eq!(task.get(b"two", Isolation::ReadUncommitted)?.as_deref(), Some(&b"2"[..]));
    /// task.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_file(&mut self, input: &Path) -> Result<(), Error> {
        Ok(feed::feed(self, input, None, false)?)
    }

    /// Processes one input line (without its newline) that ends at input
    /// position `end_position`: [`Task::process`] of an [`Input::Line`].
    ///
    /// ```
    /// use txstore::{Isolation, TaskBuilder, WordCount};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).processor(WordCount).open()?;
    /// task.process_line(b"to be or not to be", 19)?;
    /// assert_eq!(task.get(b"be", Isolation::ReadUncommitted)?.as_deref(), Some(&b"2"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn process_line(&mut self, line: &[u8], end_position: u64) -> Result<(), Error> {
        self.process(Input::Line(line), end_position)
    }

    /// Processes one input record with the task's processor; the input is
    /// then consumed up to `end_position` (a file's byte offset, a Kafka
    /// partition's next offset: whatever the caller resumes from, see
    /// [`Task::input_position`]). The record's writes and output join the
    /// open transaction, which commits when the commit policy says so.
    ///
    /// ```
    /// use txstore::{Input, Isolation, Kv, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).processor(Kv).open()?;
    /// task.process(Input::Keyed { key: Some(b"k"), value: Some(b"v") }, 1)?;
    /// task.commit()?;
    /// assert_eq!(task.get(b"k", Isolation::ReadCommitted)?.as_deref(), Some(&b"v"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn process(&mut self, input: Input<'_>, end_position: u64) -> Result<(), Error> {
        let mut ctx = Context::new(&mut self.instance, &self.cache, self.output.is_some());
        self.processor.process(input, &mut ctx)?;
        let done = ctx.finish();
        self.finish_record(done, end_position)
    }

    /// Processes one record with the closure `f` instead of the task's
    /// processor: for a caller that drives its own loop and writes
    /// directly. Same rules as [`Task::process`]: `f`'s writes and output
    /// are applied when it returns `Ok`, not at all when it returns `Err`.
    ///
    /// ```
    /// use txstore::{Isolation, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).manual_commits().open()?;
    /// task.process_with(1, |ctx| {
    ///     ctx.put(b"a", b"1");
    ///     ctx.delete(b"b");
    ///     Ok(())
    /// })?;
    /// assert_eq!(task.get(b"a", Isolation::ReadCommitted)?, None); // not committed yet
    /// task.commit()?;
    /// assert_eq!(task.get(b"a", Isolation::ReadCommitted)?.as_deref(), Some(&b"1"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn process_with(
        &mut self,
        end_position: u64,
        f: impl FnOnce(&mut Context<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut ctx = Context::new(&mut self.instance, &self.cache, self.output.is_some());
        f(&mut ctx)?;
        let done = ctx.finish();
        self.finish_record(done, end_position)
    }

    /// Takes one record's writes and output into the write cache (a record
    /// with both puts and deletes goes to the guest on its own, after
    /// what the cache holds), then ends it.
    fn finish_record(
        &mut self,
        (writes, output): (Vec<Record>, Vec<Record>),
        end_position: u64,
    ) -> Result<(), Error> {
        let shape = cache::shape(&writes);
        if !self.cache.takes(shape) {
            self.flush_cache()?;
        }
        if shape == cache::Shape::Mixed {
            self.write(&writes)?;
            self.emit(&output)?;
            return Ok(self.end_record(end_position)?);
        }
        if !(self.cache.is_empty() && writes.is_empty() && output.is_empty()) {
            let start = (self.input_position, self.input_check);
            let end = (end_position, self.next_input_check.or(self.input_check));
            self.stats.writes += writes.len() as u64;
            self.pending_writes += writes.len() as u64;
            self.cache.push(writes, output, start, end);
            crash::step("after-write");
        }
        // Counted as pending before a flush: one the guest refuses commits
        // at the cache's start, whatever came before it.
        self.advance(end_position);
        if self.cache.full() {
            self.flush_cache()?;
        }
        Ok(self.maybe_commit()?)
    }

    /// Sends output records where the task's output goes.
    fn emit(&mut self, output: &[Record]) -> Result<()> {
        if !output.is_empty() {
            match &mut self.output {
                Some(Output::Changelog) => self.changelog.emit(output)?,
                Some(Output::File(f)) => f.emit(output)?,
                None => return Ok(()),
            }
            self.stats.output_records += output.len() as u64;
        }
        Ok(())
    }

    /// Commits if records are pending and the commit interval has passed:
    /// for a caller whose input is idle, so output is not held back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path())
    ///     .commit_every(1_000, Duration::ZERO)
    ///     .open()?;
    /// task.commit_if_due()?; // nothing pending: no commit
    /// assert_eq!(task.stats().commits, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn commit_if_due(&mut self) -> Result<(), Error> {
        if self.pending_records > 0
            && self.last_commit.elapsed()
                >= Duration::from_millis(self.config.task.commit_interval_ms)
        {
            self.commit_inner()?;
        }
        Ok(())
    }

    #[doc(hidden)]
    /// Commits what is pending, if anything: so that no transaction stays
    /// open while the caller's thread does something long.
    pub fn commit_pending(&mut self) -> Result<(), Error> {
        if self.pending_records > 0 || self.pending_writes > 0 {
            self.commit_inner()?;
        }
        Ok(())
    }

    fn maybe_commit(&mut self) -> Result<()> {
        let t = &self.config.task;
        if self.pending_records >= t.commit_interval_records
            || self.last_commit.elapsed() >= Duration::from_millis(t.commit_interval_ms)
        {
            return self.commit_inner();
        }
        let guest_bytes = match self.guest_bytes {
            Some(b) => b,
            None => *self
                .guest_bytes
                .insert(self.instance.approximate_uncommitted_bytes()?),
        };
        if guest_bytes + self.cache.bytes() > t.max_uncommitted_bytes {
            self.stats.early_commits += 1;
            return self.commit_inner();
        }
        Ok(())
    }

    /// Runs the commit protocol for everything processed so far: the
    /// changelog transaction (with the input position and any output)
    /// commits, then the store. Durable when it returns.
    ///
    /// ```
    /// use txstore::{Isolation, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).manual_commits().open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// task.commit()?;
    /// assert_eq!(task.stats().commits, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn commit(&mut self) -> Result<(), Error> {
        Ok(self.commit_inner()?)
    }

    fn commit_inner(&mut self) -> Result<()> {
        let started = Instant::now();
        self.flush_cache()?;
        self.commit_at((self.input_position, self.input_check))?;
        if self.metrics.is_on() {
            self.metrics.committed(started.elapsed());
            self.publish_metrics(false);
        }
        Ok(())
    }

    /// Hands the task's counters to the metrics registry; the changelog's
    /// size (a stat per segment) at most once a second unless `all`.
    fn publish_metrics(&mut self, all: bool) {
        if !self.metrics.is_on() {
            return;
        }
        let figures = crate::metrics::TaskFigures {
            records: self.stats.records,
            writes: self.stats.writes,
            output_records: self.stats.output_records,
            commits: self.stats.commits,
            early_commits: self.stats.early_commits,
            calls: self.instance.calls().figures(),
            guest_memory_bytes: self.instance.peak_memory_bytes(),
        };
        self.metrics.publish(&figures);
        if self.metrics.changelog_due(all) {
            if let Some(c) = self.changelog.figures() {
                self.metrics.publish_changelog(c);
            }
        }
    }

    /// The commit protocol at the input boundary `at`: everything the
    /// guest and the changelog hold must belong to records before it.
    fn commit_at(&mut self, (position, check): cache::Boundary) -> Result<()> {
        if let Some(Output::File(f)) = &mut self.output {
            f.prepare(position)?;
        }
        let offset = self.changelog.commit(position, check)?;
        crash::step("after-changelog-commit");
        if let Some(Output::File(f)) = &mut self.output {
            f.published()?;
        }
        self.instance.commit(offset)?;
        self.guest_bytes = None;
        crash::step("after-store-commit");
        if self.checkpoint_each_commit {
            self.checkpoint.write(offset)?;
            crash::step("after-checkpoint");
        }
        self.changelog.store_committed(offset)?;
        self.stats.commits += 1;
        self.pending_records = 0;
        self.pending_writes = 0;
        self.last_commit = Instant::now();
        Ok(())
    }

    #[doc(hidden)]
    /// Cleans the changelog now (everything committed, down to each key's
    /// latest record); the store, recovered at open, is durably at the
    /// log's end. None if there was nothing to clean.
    pub fn compact(&mut self) -> Result<Option<CleanStats>> {
        if self.pending_records > 0 || self.pending_writes > 0 {
            self.commit_inner()?;
        }
        let end = self.changelog.end_offset();
        self.changelog.clean_now(end)
    }

    /// Commits what is pending and writes the checkpoint: a clean stop
    /// (the next open needs no recovery work). Dropping a task without
    /// `close` is like a crash after its last commit: nothing committed
    /// is lost.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// let stats = task.close()?;
    /// assert_eq!((stats.records, stats.writes), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(mut self) -> Result<TaskStats, Error> {
        self.close_in_place()?;
        Ok(self.stats)
    }

    /// The counters of this run so far.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// assert_eq!(task.stats().records, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> &TaskStats {
        &self.stats
    }

    fn close_in_place(&mut self) -> Result<()> {
        if self.pending_records > 0 || self.pending_writes > 0 {
            self.commit_inner()?;
        }
        let end = self.changelog.end_offset();
        // A store that never committed has no offset to name: a checkpoint
        // at 0 would claim a commit its guest never saw.
        if self.changelog.last_commit().is_some() {
            self.checkpoint.write(end)?;
            crash::step("after-checkpoint");
        }
        self.stats.closed_at = end;
        self.stats.committed_steps = self.committed_input_position();
        self.publish_metrics(true);
        Ok(())
    }

    /// [`Task::close`], then the storage and changelog closed, with the
    /// state directory's lock handed to the caller (a migration switches
    /// stores before anyone else may open the directory).
    fn close_keeping_lock(mut self) -> Result<(TaskStats, std::fs::File)> {
        self.close_in_place()?;
        let Task {
            instance,
            changelog,
            _backend,
            _lock,
            stats,
            ..
        } = self;
        drop(instance);
        drop(changelog);
        drop(_backend);
        Ok((stats, _lock))
    }

    /// The most linear memory the strategy guest has held, in bytes.
    #[doc(hidden)]
    pub fn guest_peak_memory_bytes(&self) -> u64 {
        self.instance.peak_memory_bytes()
    }

    /// Reads `key` at `isolation`: [`Isolation::ReadCommitted`] sees what
    /// the last commit made durable, [`Isolation::ReadUncommitted`] also
    /// the open transaction's writes (interactive queries).
    ///
    /// ```
    /// use txstore::{Isolation, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).manual_commits().open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// assert_eq!(task.get(b"k", Isolation::ReadCommitted)?, None);
    /// assert_eq!(task.get(b"k", Isolation::ReadUncommitted)?.as_deref(), Some(&b"v"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&mut self, key: &[u8], isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        if matches!(isolation, Isolation::ReadUncommitted) {
            if let Some(cached) = self.cache.latest(key) {
                return Ok(cached.map(<[u8]>::to_vec));
            }
        }
        Ok(self.instance.get(key, isolation)?)
    }

    /// Every entry with a key in [`start`, `end`) at `isolation`, in key
    /// order (`None` bounds are open).
    ///
    /// ```
    /// use txstore::{Isolation, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_line(b"a\t1", 4)?;
    /// task.process_line(b"b\t2", 8)?;
    /// task.commit()?;
    /// let all = task.range(None, None, Isolation::ReadCommitted)?;
    /// assert_eq!(all, vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"2".to_vec())]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn range(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
        let stored = self.instance.range_all(start, end, isolation)?;
        if matches!(isolation, Isolation::ReadCommitted) || self.cache.is_empty() {
            return Ok(stored);
        }
        let mut entries = stored.into_iter().collect();
        self.cache.overlay(
            &mut entries,
            start.map_or(Bound::Unbounded, Bound::Included),
            end.map_or(Bound::Unbounded, Bound::Excluded),
        );
        Ok(entries.into_iter().collect())
    }
}

/// The processor `config` names: a built-in, or a component loaded,
/// instantiated under the task's limits and configured.
fn processor_for(config: &Config, runtime: &Runtime) -> Result<Box<dyn Processor>> {
    Ok(match &config.task.processor {
        ProcessorSpec::Kv => Box::new(processor::Kv),
        ProcessorSpec::WordCount => Box::new(processor::WordCount),
        ProcessorSpec::Wasm(_) => {
            let path = config
                .processor_path()
                .expect("a wasm processor has a path");
            let component = wasm_processor::ProcessorComponent::load(runtime, &path)?;
            Box::new(component.instantiate(&config.limits, &config.processor_options())?)
        }
    })
}

/// Where a task's output records go.
enum Output {
    /// Into the changelog's (Kafka) transaction, to the output topic.
    Changelog,
    File(output::FileOutput),
}
