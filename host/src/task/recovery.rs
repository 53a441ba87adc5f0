//! Start-up: the store brought to the changelog's committed state. The
//! guest loaded and the state directory locked and checked, the
//! checkpoint read under its policy, the guest's `recover` checked against
//! the changelog, then the committed transactions after its offset
//! replayed (committing early at transaction ends when the guest holds too
//! much).

use super::apply::apply_with_early_commit;
use super::{manifest, migrate, output, processor_for, Output, Processor, Task, TaskStats};
use crate::changelog::{Record, Replayed};
use crate::checkpoint::Checkpoint;
use crate::config::{BackendKind, Config, Guarantee};
use crate::crash;
use crate::error::{marked, Kind};
use crate::file::lock_dir;
use crate::runtime::{GuestComponent, Recovery, RecoveryAction, Runtime};
use crate::storage::{Backend, MemoryBackend, PowerBackend, RocksBackend};
use anyhow::{bail, Context as _, Result};
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

pub(super) fn as_seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

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
fn open_backend(config: &Config) -> Result<Arc<dyn Backend>> {
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

use super::cache::WriteCache;

impl Task {
    /// Opens and recovers the task; a `standby` reads its changelog only
    /// (never taking its transactional id over) and has no output.
    pub(super) fn open_inner(
        config: &Config,
        runtime: &Runtime,
        processor: Option<Box<dyn Processor>>,
        standby: bool,
    ) -> Result<(Self, RecoveryReport)> {
        let started = Instant::now();
        refuse_job_of_partitions(config)?;
        // A guest or processor that does not load (a misspelt name)
        // creates nothing.
        let guest = runtime
            .load(&config.guest())
            .map_err(|e| marked(Kind::Config, format!("{e:#}")))?;
        let processor = match processor {
            Some(p) => p,
            None => processor_for(config, runtime)?,
        };
        let lock = claim_state_dir(config, &guest)?;
        let backend = open_backend(config)?;
        let storage = backend.open_store(&config.store.name)?;
        let mut instance = guest.instantiate(storage, &config.store.name, &config.limits)?;
        instance.init(&config.init_options())?;
        let transactional = instance.transactional()?;
        let opened = if standby {
            crate::changelog::open_reader(config)?
        } else {
            crate::changelog::open(config)?
        };
        let checkpoint = Checkpoint::new(&config.state_dir());
        // A checkpoint after every commit is only a lower bound on what the
        // store holds, which a transactional guest's recovery can use. A
        // store that cannot undo writes may also hold uncommitted ones, so
        // for it (and under exactly-once) a checkpoint must mean "closed
        // cleanly here": written at clean close only, removed at start.
        let checkpoint_each_commit =
            config.task.guarantee == Guarantee::AtLeastOnce && transactional;
        let checkpointed = take_checkpoint(&checkpoint, checkpoint_each_commit)?;
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
            cache: WriteCache::new(config.task.max_cache_bytes),
            guest_bytes: None,
            last_commit: Instant::now(),
            stats: TaskStats::default(),
            checkpoint_each_commit,
            output: None,
            metrics: crate::metrics::TaskMetrics::new(&config.store.name),
            _backend: backend,
            _lock: lock,
        };
        let recovery = task.recover(checkpointed, transactional)?;
        let (replayed_records, replayed_transactions) = task.replay(recovery.offset)?;
        task.input_position = task.changelog.last_commit().map_or(0, |c| c.input_position);
        task.input_check = task.changelog.last_commit().and_then(|c| c.input_check);
        if !standby {
            task.output = open_output(config, task.input_position)?;
        }
        let report = RecoveryReport {
            guest: task.instance.label().to_string(),
            transactional,
            guarantee: config.task.guarantee,
            checkpoint: checkpointed,
            recovered_offset: recovery.offset,
            action: action_name(recovery.action).to_string(),
            changelog_end: task.changelog.end_offset(),
            changelog_truncated_bytes: opened.truncated_bytes,
            replayed_records,
            replayed_transactions,
            input_position: task.input_position,
            elapsed: started.elapsed(),
        };
        tracing::info!(?report, "recovered");
        task.last_commit = Instant::now();
        Ok((task, report))
    }

    /// The guest's `recover`, checked against the changelog before any
    /// replay: the changelog must hold everything the replay will read.
    fn recover(&mut self, checkpointed: Option<u64>, transactional: bool) -> Result<Recovery> {
        if !transactional && checkpointed.is_none() {
            // Its recovery will wipe the store: make sure the replay that
            // must follow can read the whole changelog before anything changes.
            self.changelog.check_replayable(0)?;
        }
        let recovery = self.instance.recover(checkpointed)?;
        let label = self.instance.label().to_string();
        let end = self.changelog.end_offset();
        let changelog = self.config.changelog_name();
        check_recovered(
            &label,
            transactional,
            &recovery,
            checkpointed,
            end,
            &changelog,
        )?;
        // A store older than what the changelog's cleaning (or a Kafka
        // topic's compaction) kept deletes for could keep deleted keys.
        if let Some(k) = recovery.offset.filter(|&k| k > 0) {
            if let Some(why) = self.changelog.deletes_missing_after(k)? {
                bail!(
                    "guest {label} recovered to offset {k}, but {why}, so a replay from {k} could keep deleted keys; \
                     nothing was changed: move {} aside (and remove {}, if there) to rebuild the store from the \
                     changelog",
                    self.config.state_dir().join("store").display(),
                    self.checkpoint.path().display()
                );
            }
        }
        self.changelog
            .check_replayable(recovery.offset.unwrap_or(0))?;
        Ok(recovery)
    }

    /// Replays committed transactions after `from` into the store, then
    /// commits the store at the changelog's end. Returns (records, txns).
    pub(super) fn replay(&mut self, from: Option<u64>) -> Result<(u64, u64)> {
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
        let metrics = &self.metrics;
        metrics.restored(0, end - start.min(end));
        let mut progress = RestoreProgress::new(&self.config.store.name, start, end);
        let mut flush = |batch: &mut Vec<Replayed>, safe: &mut u64| -> Result<()> {
            let mut run: Vec<Record> = Vec::new();
            let mut applied = 0u64;
            let mut at = *safe;
            for item in batch.drain(..) {
                match item {
                    Replayed::Record(r) => {
                        applied += 1;
                        run.push(r)
                    }
                    Replayed::Commit(o) => {
                        apply_with_early_commit(instance, &run, *safe)?;
                        run.clear();
                        at = at.max(o);
                        if o >= kept_from {
                            *safe = o;
                        }
                    }
                }
            }
            apply_with_early_commit(instance, &run, *safe)?;
            metrics.restored(applied, end - at.min(end));
            progress.tick(at, applied);
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
        self.metrics.restored(0, 0);
        progress.done(records);
        Ok((records, txns))
    }
}

/// A long restore says where it is: one line on stderr (a terminal, a
/// service's journal) every `TXSTORE_PROGRESS_MS` (10 s), none for a
/// restore shorter than that.
struct RestoreProgress<'a> {
    store: &'a str,
    start: u64,
    end: u64,
    every: Duration,
    started: Instant,
    last: Instant,
    records: u64,
    printed: bool,
}

impl<'a> RestoreProgress<'a> {
    fn new(store: &'a str, start: u64, end: u64) -> Self {
        RestoreProgress {
            store,
            start,
            end,
            every: super::feed::progress_every(),
            started: Instant::now(),
            last: Instant::now(),
            records: 0,
            printed: false,
        }
    }

    /// `records` more replayed; the changelog is applied up to `at`.
    fn tick(&mut self, at: u64, records: u64) {
        self.records += records;
        if self.last.elapsed() < self.every {
            return;
        }
        let secs = self.started.elapsed().as_secs_f64();
        let done = at.saturating_sub(self.start);
        let rate = done as f64 / secs.max(1e-3);
        let left = self.end.saturating_sub(at);
        eprintln!(
            "restoring {}: changelog offset {at} of {} ({:.1}%), {} records replayed, {:.0} offsets/s, eta {:.0} s",
            self.store,
            self.end,
            100.0 * done as f64 / (self.end - self.start).max(1) as f64,
            self.records,
            rate,
            left as f64 / rate.max(1.0)
        );
        self.last = Instant::now();
        self.printed = true;
    }

    fn done(&self, records: u64) {
        if self.printed {
            eprintln!(
                "restored {}: {records} records replayed in {:.1} s",
                self.store,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// A Kafka input's stores are one per partition, each under its own lock
/// and transactional id: the job's own directory holds none.
fn refuse_job_of_partitions(config: &Config) -> Result<()> {
    if config.kafka_input().is_some() && config.partition_task.is_none() {
        return Err(marked(
            Kind::Config,
            format!(
                "store `{}` reads a Kafka topic (task.input): its state is one store per input partition, in \
                 {}/{}-<P>; name the partition (--partition P)",
                config.store.name,
                config.state_dir().display(),
                config.store.name
            ),
        ));
    }
    Ok(())
}

/// Creates and locks the state directory, finishes a migration a crash
/// interrupted, and checks the manifest against the guest (`hash`): another
/// guest or store name would find the data missing or wrong and recover as
/// if clean, so it is refused before anything changes.
fn claim_state_dir(config: &Config, guest: &GuestComponent) -> Result<std::fs::File> {
    let state_dir = config.state_dir();
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
    match manifest::check(config, &guest.load.hash, guest.version, existing)? {
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
    Ok(lock)
}

/// The checkpoint's offset for `recover`, and the file removed unless it is
/// kept after every commit: from here on a crash leaves no checkpoint, so
/// the next start-up knows the stop was unclean.
fn take_checkpoint(checkpoint: &Checkpoint, each_commit: bool) -> Result<Option<u64>> {
    // The checkpoint only saves work: without it a transactional guest
    // recovers from its own offset and any other is wiped and replayed.
    // So a damaged one is reported and ignored, never trusted.
    let checkpointed = checkpoint.read().unwrap_or_else(|e| {
        tracing::warn!("{e:#}: ignoring it; recovery treats the stop as unclean");
        None
    });
    if !each_commit || checkpointed.is_none() {
        checkpoint.remove()?; // (a damaged file must not be read again)
    }
    Ok(checkpointed)
}

/// What a guest's `recover` may answer: never past the changelog's end,
/// and a transactional guest neither wipes nor falls below the checkpoint
/// (which it wrote after a commit it made durable).
fn check_recovered(
    label: &str,
    transactional: bool,
    recovery: &Recovery,
    checkpointed: Option<u64>,
    end: u64,
    changelog: &str,
) -> Result<()> {
    if let Some(k) = recovery.offset.filter(|&k| k > end) {
        bail!(
            "guest {label} recovered to offset {k} but the changelog ends at {end}: the changelog ({changelog}) was \
             truncated or belongs to another store"
        );
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
    Ok(())
}

/// The task's output, opened at the committed input position (a file
/// output cuts what a crash left past its committed length).
fn open_output(config: &Config, input_position: u64) -> Result<Option<Output>> {
    Ok(match &config.task.output {
        None => None,
        Some(crate::config::OutputSpec::Kafka { .. }) => Some(Output::Changelog),
        Some(crate::config::OutputSpec::File { .. }) => {
            let path = config.output_file().expect("a file output has a path");
            Some(Output::File(output::FileOutput::open(
                &path,
                input_position,
            )?))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Isolation;
    use crate::task::TaskBuilder;

    fn recovery(offset: Option<u64>, action: RecoveryAction) -> Recovery {
        Recovery { offset, action }
    }

    /// What `recover` may answer, for either kind of guest.
    #[test]
    fn a_recovery_is_checked_against_the_changelog_and_checkpoint() {
        let check = |transactional, r: Recovery, checkpoint, end| {
            check_recovered("g", transactional, &r, checkpoint, end, "in log")
                .map_err(|e| e.to_string())
        };
        use RecoveryAction::*;
        for transactional in [false, true] {
            let err = check(transactional, recovery(Some(11), Clean), None, 10).unwrap_err();
            assert!(
                err.contains("changelog ends at 10") && err.contains("(in log)"),
                "{err}"
            );
            check(transactional, recovery(Some(10), Clean), None, 10).unwrap();
        }
        check(false, recovery(None, Wiped), Some(7), 10).unwrap();
        let err = check(true, recovery(None, Wiped), None, 10).unwrap_err();
        assert!(err.contains("transactional but wiped"), "{err}");
        let err = check(true, recovery(Some(6), RolledBack), Some(7), 10).unwrap_err();
        assert!(err.contains("below the checkpoint Some(7)"), "{err}");
        let err = check(true, recovery(None, Discarded), Some(7), 10).unwrap_err();
        assert!(err.contains("below the checkpoint"), "{err}");
        check(true, recovery(Some(7), RolledForward), Some(7), 10).unwrap();
    }

    /// A store that cannot undo is wiped and replayed from the changelog's
    /// start to its committed end: every committed record, nothing after
    /// the last commit; a clean close replays nothing.
    #[test]
    fn replay_reads_the_committed_changelog_from_the_recovered_offset() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            TaskBuilder::new(dir.path())
                .guest("wipe-on-crash")
                .manual_commits()
                .open()
                .unwrap()
        };
        let (mut task, _) = open();
        for i in 0..30u64 {
            task.process_line(format!("k{i}\tv{i}").as_bytes(), i + 1)
                .unwrap();
            if i % 10 == 9 {
                task.commit().unwrap();
            }
        }
        task.process_line(b"uncommitted\tx", 31).unwrap();
        drop(task); // a crash after the third commit
        let (mut task, report) = open();
        assert_eq!(report.action, "wiped");
        assert_eq!(
            (report.replayed_records, report.replayed_transactions),
            (30, 3)
        );
        assert_eq!(report.input_position, 30);
        assert_eq!(
            task.get(b"uncommitted", Isolation::ReadCommitted).unwrap(),
            None
        );
        assert_eq!(
            task.range(None, None, Isolation::ReadCommitted)
                .unwrap()
                .len(),
            30
        );
        task.close().unwrap();
        let (_task, report) = open();
        assert_eq!(
            (report.replayed_records, report.recovered_offset),
            (0, Some(report.changelog_end))
        );
    }

    /// A replay into a guest that holds little commits early, at the end of
    /// a transaction it has applied whole, and loses nothing.
    #[test]
    fn replay_commits_early_when_the_guest_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let (mut task, _) = TaskBuilder::new(dir.path())
            .guest("buffered")
            .commit_every(5, Duration::from_secs(3600))
            .open()
            .unwrap();
        for i in 0..100u64 {
            task.process_line(format!("key{i:03}\t{}", "v".repeat(40)).as_bytes(), i + 1)
                .unwrap();
        }
        task.close().unwrap();
        // The store rebuilt from the changelog, as the operator is told to.
        std::fs::remove_dir_all(dir.path().join("store")).unwrap();
        let _ = std::fs::remove_file(task_checkpoint(dir.path()));
        let (mut task, report) = TaskBuilder::new(dir.path())
            .guest("buffered")
            .option("max_uncommitted_bytes", "512")
            .open()
            .unwrap();
        assert_eq!(report.replayed_records, 100);
        let all = task.range(None, None, Isolation::ReadCommitted).unwrap();
        assert_eq!(all.len(), 100);
        assert!(all.iter().all(|(_, v)| v.len() == 40));
    }

    fn task_checkpoint(state_dir: &Path) -> std::path::PathBuf {
        Checkpoint::new(state_dir).path().to_path_buf()
    }
}
