//! The task driver: the exactly-once commit protocol around a guest.
//!
//! Processing: input record -> store writes + changelog appends. Commit:
//! changelog commit (offset o, input position) -> `store.commit(o)` ->
//! checkpoint (after every commit under at-least-once, at clean close only
//! under exactly-once). Start-up: read the checkpoint (and remove it under
//! exactly-once) -> `store.recover(checkpoint)` -> replay the committed
//! changelog after the returned offset -> resume the input at the committed
//! input position.

pub mod builder;
pub mod feed;
pub mod manifest;
pub mod migrate;
pub mod output;
pub mod partitions;
pub mod processor;
pub mod serve;
pub mod wasm_processor;

use crate::changelog::{Changelog, CleanStats, Record, Replayed};
use crate::checkpoint::Checkpoint;
use crate::config::{BackendKind, Config, Guarantee, ProcessorSpec};
use crate::crash;
use crate::error::{marked, Error, Kind};
use crate::runtime::{CallError, Isolation, RecoveryAction, Runtime, StoreInstance, WitEntry};
use crate::storage::{Backend, MemoryBackend, PowerBackend, RocksBackend};
use anyhow::{bail, Context as _, Result};
pub use builder::TaskBuilder;
pub use processor::{Context, Input, Processor};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records replayed per guest call during restore.
const REPLAY_BATCH: usize = 1024;

/// What start-up recovery found and did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RecoveryReport {
    pub guest: String,
    pub transactional: bool,
    pub guarantee: Guarantee,
    /// The checkpoint file's offset, if one was found.
    pub checkpoint: Option<u64>,
    /// The offset the guest's `recover` returned.
    pub recovered_offset: Option<u64>,
    /// What the guest did: clean, discarded, rolled-forward, rolled-back, wiped.
    pub action: String,
    /// The changelog's committed end.
    pub changelog_end: u64,
    /// Bytes cut from the changelog's tail at open.
    pub changelog_truncated_bytes: u64,
    pub replayed_records: u64,
    pub replayed_transactions: u64,
    /// Where input processing resumes.
    pub input_position: u64,
    /// Seconds, in JSON.
    #[serde(rename = "seconds", serialize_with = "as_seconds")]
    pub elapsed: Duration,
}

fn as_seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

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
    last_commit: Instant,
    pub stats: TaskStats,
    /// Checkpoint after every commit (at-least-once, transactional guest).
    checkpoint_each_commit: bool,
    /// Where output records go (`task.output`), if anywhere.
    output: Option<Output>,
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

pub use crate::file::lock_dir;

fn action_name(a: RecoveryAction) -> &'static str {
    match a {
        RecoveryAction::Clean => "clean",
        RecoveryAction::Discarded => "discarded",
        RecoveryAction::RolledForward => "rolled-forward",
        RecoveryAction::RolledBack => "rolled-back",
        RecoveryAction::Wiped => "wiped",
    }
}

/// Opens the storage backend a config names.
pub fn open_backend(config: &Config) -> Result<Arc<dyn Backend>> {
    open_backend_at(config.store.backend, &config.state_dir().join("store"))
}

/// Opens a storage backend of `kind` in `dir` (RocksDB only).
pub fn open_backend_at(kind: BackendKind, dir: &Path) -> Result<Arc<dyn Backend>> {
    Ok(match kind {
        BackendKind::Rocksdb => {
            let rocks = RocksBackend::open(dir)?;
            // Logging undo information costs a read per write: only when a
            // simulated power loss may need it.
            if crate::crash::power_armed() {
                Arc::new(PowerBackend::new(Box::new(rocks)))
            } else {
                Arc::new(rocks)
            }
        }
        BackendKind::Memory => Arc::new(MemoryBackend::new()),
    })
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
        Self::open_inner(config, runtime, processor).map_err(Error::from)
    }

    fn open_inner(
        config: &Config,
        runtime: &Runtime,
        processor: Option<Box<dyn Processor>>,
    ) -> Result<(Self, RecoveryReport)> {
        let started = Instant::now();
        let state_dir = config.state_dir();
        // A Kafka input's stores are one per partition, each under its own
        // lock and transactional id: the job's own directory holds none.
        if config.kafka_input().is_some() && config.partition_task.is_none() {
            return Err(marked(
                Kind::Config,
                format!(
                    "store `{}` reads a Kafka topic (task.input): its state is one store per input partition, in \
                     {}/{}-<P>; name the partition (--partition P)",
                    config.store.name,
                    state_dir.display(),
                    config.store.name
                ),
            ));
        }
        // A guest or processor that does not load (a misspelt name)
        // creates nothing.
        let guest = runtime
            .load(&config.guest())
            .map_err(|e| marked(Kind::Config, format!("{e:#}")))?;
        let processor = match processor {
            Some(p) => p,
            None => processor_for(config, runtime)?,
        };
        let existing = state_dir.join("store").exists() || config.changelog_dir().exists();
        crate::file::attach(&state_dir);
        crate::file::create_dir_all(&state_dir)
            .with_context(|| format!("cannot create state directory {}", state_dir.display()))?;
        let lock = lock_dir(&state_dir, "state directory")?;
        if migrate::settle(&state_dir)? {
            tracing::warn!(
                "finished a migration of the store in {} that a crash interrupted after its commit point",
                state_dir.display()
            );
        }
        // Another guest or store name would find the data missing or wrong
        // and recover as if clean: refuse before anything changes.
        match manifest::check(config, &guest.load.hash, existing)? {
            manifest::Checked::NewBuild { from, to } => tracing::warn!(
                "guest {} changed since the store was last opened (sha256 {}.. -> {}..): same strategy, opening",
                config.store.guest,
                &from[..12.min(from.len())],
                &to[..12.min(to.len())]
            ),
            manifest::Checked::Adopted => tracing::warn!(
                "store in {} has no manifest (made by an older txstore): recorded guest {} as its guest",
                state_dir.display(),
                config.store.guest
            ),
            manifest::Checked::Same | manifest::Checked::Created => {}
        }
        let backend = open_backend(config)?;
        let storage = backend.open_store(&config.store.name)?;
        let mut instance = guest.instantiate(storage, &config.store.name, &config.limits)?;
        instance.init(&config.init_options())?;
        let transactional = instance.transactional()?;
        let opened = crate::changelog::open(config)?;
        let truncated = opened.truncated_bytes;
        let checkpoint = Checkpoint::new(&state_dir);
        // The checkpoint only saves work: without it a transactional guest
        // recovers from its own offset and any other is wiped and replayed.
        // So a damaged one is reported and ignored, never trusted.
        let checkpointed = checkpoint.read().unwrap_or_else(|e| {
            tracing::warn!("{e:#}: ignoring it; recovery treats the stop as unclean");
            None
        });
        // A checkpoint after every commit is only a lower bound on what the
        // store holds, which a transactional guest's recovery can use. A
        // store that cannot undo writes may also hold uncommitted ones, so
        // for it (and under exactly-once) a checkpoint must mean "closed
        // cleanly here": written at clean close only, removed at start.
        let checkpoint_each_commit =
            config.task.guarantee == Guarantee::AtLeastOnce && transactional;
        if !checkpoint_each_commit {
            // From here on, a crash leaves no checkpoint: the next start-up
            // knows the stop was unclean.
            checkpoint.remove()?;
        } else if checkpointed.is_none() {
            checkpoint.remove()?; // a damaged file must not be read again
        }
        let mut task = Task {
            processor,
            config: config.clone(),
            instance,
            changelog: opened.log,
            checkpoint,
            input_position: 0,
            input_check: None,
            next_input_check: None,
            pending_records: 0,
            pending_writes: 0,
            last_commit: Instant::now(),
            stats: TaskStats::default(),
            checkpoint_each_commit,
            output: None,
            _backend: backend,
            _lock: lock,
        };
        if !transactional && checkpointed.is_none() {
            // Its recovery will wipe the store: make sure the replay that
            // must follow can read the whole changelog before anything changes.
            task.changelog.check_replayable(0)?;
        }
        let recovery = task.instance.recover(checkpointed)?;
        let end = task.changelog.end_offset();
        let label = task.instance.label().to_string();
        if let Some(k) = recovery.offset {
            if k > end {
                bail!(
                    "guest {label} recovered to offset {k} but the changelog ends at {end}: the changelog ({}) was \
                     truncated or belongs to another store",
                    config.changelog_name()
                );
            }
        }
        if transactional {
            if recovery.action == RecoveryAction::Wiped {
                bail!("guest {label} says it is transactional but wiped its store in recover");
            }
            if recovery.offset < checkpointed {
                bail!(
                    "guest {label} says it is transactional but recovered to offset {:?}, below the checkpoint {:?}",
                    recovery.offset,
                    checkpointed
                );
            }
        }
        // A store older than what the changelog's cleaning (or a Kafka
        // topic's compaction) kept deletes for could keep deleted keys.
        if let Some(k) = recovery.offset.filter(|&k| k > 0) {
            if let Some(why) = task.changelog.deletes_missing_after(k)? {
                bail!(
                    "guest {label} recovered to offset {k}, but {why}, so a replay from {k} could keep deleted keys; \
                     nothing was changed: move {} aside (and remove {}, if there) to rebuild the store from the \
                     changelog",
                    state_dir.join("store").display(),
                    task.checkpoint.path().display()
                );
            }
        }
        task.changelog
            .check_replayable(recovery.offset.unwrap_or(0))?;
        let (replayed_records, replayed_transactions) = task.replay(recovery.offset)?;
        task.input_position = task.changelog.last_commit().map_or(0, |c| c.input_position);
        task.input_check = task.changelog.last_commit().and_then(|c| c.input_check);
        task.output = match &config.task.output {
            None => None,
            Some(crate::config::OutputSpec::Kafka { .. }) => Some(Output::Changelog),
            Some(crate::config::OutputSpec::File { .. }) => {
                let path = config.output_file().expect("a file output has a path");
                Some(Output::File(output::FileOutput::open(
                    &path,
                    task.input_position,
                )?))
            }
        };
        let report = RecoveryReport {
            guest: label,
            transactional,
            guarantee: config.task.guarantee,
            checkpoint: checkpointed,
            recovered_offset: recovery.offset,
            action: action_name(recovery.action).to_string(),
            changelog_end: end,
            changelog_truncated_bytes: truncated,
            replayed_records,
            replayed_transactions,
            input_position: task.input_position,
            elapsed: started.elapsed(),
        };
        tracing::info!(?report, "recovered");
        task.last_commit = Instant::now();
        Ok((task, report))
    }

    /// Replays committed transactions after `from` into the store, then
    /// commits the store at the changelog's end. Returns (records, txns).
    fn replay(&mut self, from: Option<u64>) -> Result<(u64, u64)> {
        let end = self.changelog.end_offset();
        let start = from.unwrap_or(0);
        if start >= end && from.is_some() {
            return Ok((0, 0));
        }
        // Records with their commit markers, applied in batches.
        let mut batch: Vec<Replayed> = Vec::new();
        let mut pending = 0usize;
        let (mut records, mut txns) = (0u64, 0u64);
        // The end of the last transaction whose records are all applied:
        // the only offset an early commit may claim. Records applied past it
        // are harmless (replay writes absolute values and repeats them).
        let mut safe = start;
        let instance = &mut self.instance;
        // Below the bound of a clean's dropped deletes, a commit offset
        // does not name a state the store had (a cleaned log skips values
        // and deletes), so an early commit there claims the start.
        let kept_from = self.changelog.deletes_kept_from();
        let mut flushes = 0u64;
        let mut flush = |batch: &mut Vec<Replayed>, safe: &mut u64| -> Result<()> {
            let mut run: Vec<Record> = Vec::new();
            for item in batch.drain(..) {
                match item {
                    Replayed::Record(r) => run.push(r),
                    Replayed::Commit(o) => {
                        apply_with_early_commit(instance, &run, *safe)?;
                        run.clear();
                        if o >= kept_from {
                            *safe = o;
                        }
                    }
                }
            }
            apply_with_early_commit(instance, &run, *safe)?;
            flushes += 1;
            if flushes == 1 {
                crash::step("during-restore");
            }
            Ok(())
        };
        self.changelog.read_committed(start, &mut |item| {
            match item {
                Replayed::Record(_) => {
                    records += 1;
                    pending += 1;
                }
                Replayed::Commit(_) => txns += 1,
            }
            batch.push(item);
            if pending >= REPLAY_BATCH {
                flush(&mut batch, &mut safe)?;
                pending = 0;
            }
            Ok(())
        })?;
        if !batch.is_empty() {
            flush(&mut batch, &mut safe)?;
        }
        if end > 0 {
            self.instance.commit(end)?;
            self.changelog.store_committed(end)?;
        }
        Ok((records, txns))
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
        self.input_position = position;
        self.input_check = self.next_input_check.take().or(self.input_check);
        self.stats.records += 1;
        self.pending_records += 1;
        self.maybe_commit()
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
        let mut ctx = Context::new(&mut self.instance, self.output.is_some());
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
        let mut ctx = Context::new(&mut self.instance, self.output.is_some());
        f(&mut ctx)?;
        let done = ctx.finish();
        self.finish_record(done, end_position)
    }

    /// Applies one record's writes and output, then ends it.
    fn finish_record(
        &mut self,
        (writes, output): (Vec<Record>, Vec<Record>),
        end_position: u64,
    ) -> Result<(), Error> {
        self.write(&writes)?;
        if !output.is_empty() {
            match &mut self.output {
                Some(Output::Changelog) => self.changelog.emit(&output)?,
                Some(Output::File(f)) => f.emit(&output)?,
                None => {}
            }
        }
        Ok(self.end_record(end_position)?)
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

    fn maybe_commit(&mut self) -> Result<()> {
        let t = &self.config.task;
        if self.pending_records >= t.commit_interval_records
            || self.last_commit.elapsed() >= Duration::from_millis(t.commit_interval_ms)
        {
            return self.commit_inner();
        }
        if self.instance.approximate_uncommitted_bytes()? > t.max_uncommitted_bytes {
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
        if let Some(Output::File(f)) = &mut self.output {
            f.prepare(self.input_position)?;
        }
        let offset = self
            .changelog
            .commit(self.input_position, self.input_check)?;
        crash::step("after-changelog-commit");
        if let Some(Output::File(f)) = &mut self.output {
            f.published()?;
        }
        self.instance.commit(offset)?;
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
        Ok(self.instance.range_all(start, end, isolation)?)
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
            // One copy per write, straight into the WIT form.
            let entries: Vec<WitEntry> = chunk
                .iter()
                .map(|w| match w {
                    Record::Put(k, v) => WitEntry {
                        key: k.clone(),
                        value: v.clone(),
                    },
                    Record::Delete(_) => unreachable!(),
                })
                .collect();
            instance.put_entries(&entries)
        } else {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|w| w.key().to_vec()).collect();
            instance.delete_many(&keys)
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
fn apply_with_early_commit(instance: &mut StoreInstance, run: &[Record], safe: u64) -> Result<()> {
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
