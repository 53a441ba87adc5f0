//! A worker thread: the tasks of the partitions it owns, driven by the
//! commands of the poll loop (open, record, close, lose), with their live
//! queries and due commits served between commands, and the standby
//! replicas it keeps warm.

use super::{ProcessorFactory, Shared, TICK};
use crate::config::Config;
use crate::runtime::Runtime;
use crate::task::serve::QueryServer;
use crate::task::{Input, Standby, Task};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a standby that failed (its changelog not there yet, Kafka
/// away) waits before it opens again.
const STANDBY_RETRY: Duration = Duration::from_secs(5);

/// What the poll loop asks of a worker.
pub(super) enum Command {
    Open {
        partition: i32,
        reply: mpsc::Sender<Result<u64>>,
        /// Set when the partition is revoked before its task is handed
        /// over: not opened, or closed at once if already opening.
        cancel: Arc<AtomicBool>,
    },
    Record {
        partition: i32,
        offset: i64,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
    },
    /// Commit and close (revoked, or the end of the run).
    Close {
        partition: i32,
        reply: mpsc::Sender<Result<()>>,
    },
    /// Keep a standby replica of the partition while it is not owned here.
    Standby { partition: i32 },
    /// No longer keep one (closed at what it applied).
    DropStandby { partition: i32 },
    /// Drop without committing (lost: another process may own it now).
    Lose {
        partition: i32,
        reply: mpsc::Sender<()>,
    },
}

/// One worker thread: the tasks of its partitions. A failure is reported
/// to `shared` at once (the poll loop stops on it), then the worker keeps
/// answering commands until the poll loop drops its queue, so neither
/// waits on the other.
pub(super) fn work(
    rx: Receiver<Command>,
    config: &Config,
    runtime: &Runtime,
    partitions: i32,
    shared: &Shared,
    processors: ProcessorFactory<'_>,
) {
    let mut worker = Worker {
        config,
        runtime,
        partitions,
        shared,
        processors,
        servers: BTreeMap::new(),
        tasks: BTreeMap::new(),
        standbys: BTreeMap::new(),
        standby_wanted: BTreeSet::new(),
        standby_retry: BTreeMap::new(),
    };
    let mut last_sweep = Instant::now();
    let result = (|| -> Result<()> {
        loop {
            match rx.recv_timeout(TICK) {
                Ok(command) => worker.handle(command)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    worker.close_standbys();
                    return Ok(());
                }
            }
            if last_sweep.elapsed() >= TICK {
                worker.sweep()?;
                last_sweep = Instant::now();
            }
        }
    })();
    if let Err(e) = result {
        // Reported before anything else: the poll loop stops on it.
        shared.fail(e);
        // Dropped without commit: the next owner recovers them as after a
        // crash. Keep answering so the poll loop never waits on us.
        drop(worker);
        for command in rx {
            match command {
                Command::Open { reply, .. } => {
                    let _ = reply.send(Err(anyhow!("a worker failed")));
                }
                Command::Close { reply, .. } => {
                    let _ = reply.send(Ok(()));
                }
                Command::Lose { reply, .. } => {
                    let _ = reply.send(());
                }
                Command::Record { .. } | Command::Standby { .. } | Command::DropStandby { .. } => {}
            }
        }
    }
}

/// A worker's tasks, one per partition it owns.
struct Worker<'a> {
    config: &'a Config,
    runtime: &'a Runtime,
    partitions: i32,
    shared: &'a Shared,
    processors: ProcessorFactory<'a>,
    /// Each task answers live queries on its own state directory's socket.
    /// (Declared first: dropped before the tasks, as a close does.)
    servers: BTreeMap<i32, QueryServer>,
    tasks: BTreeMap<i32, Task>,
    /// Standby replicas kept here, and those to (re)open: when one
    /// failed, not before its retry time.
    standbys: BTreeMap<i32, Standby>,
    standby_wanted: BTreeSet<i32>,
    standby_retry: BTreeMap<i32, Instant>,
}

impl Worker<'_> {
    fn handle(&mut self, command: Command) -> Result<()> {
        match command {
            Command::Open {
                partition,
                reply,
                cancel,
            } => {
                if cancel.load(Ordering::Relaxed) {
                    // Revoked while queued: opening it now would fence
                    // its new owner's producer.
                    return Ok(());
                }
                let answer = self.open(partition)?;
                if cancel.load(Ordering::Relaxed) && answer.is_ok() {
                    // Revoked while it restored: nothing was processed,
                    // so the close commits nothing.
                    self.close(partition)?;
                    return Ok(());
                }
                let _ = reply.send(answer);
            }
            Command::Record {
                partition,
                offset,
                key,
                value,
            } => self.record(partition, offset, key.as_deref(), value.as_deref())?,
            Command::Close { partition, reply } => {
                let closed = self.close(partition);
                let failed = closed.is_err();
                let _ = reply.send(closed);
                if failed {
                    bail!("closing partition {partition} failed");
                }
            }
            Command::Standby { partition } => {
                self.standby_wanted.insert(partition);
            }
            Command::DropStandby { partition } => {
                self.standby_wanted.remove(&partition);
                self.standby_retry.remove(&partition);
                if let Some(standby) = self.standbys.remove(&partition) {
                    if let Err(e) = standby.close() {
                        tracing::warn!(partition, "standby close: {e:#}");
                    }
                }
            }
            Command::Lose { partition, reply } => {
                self.servers.remove(&partition);
                if let Some(task) = self.tasks.remove(&partition) {
                    let mut summary = self.shared.summary.lock().unwrap();
                    summary.stats.add(&task.stats);
                    summary.lost += 1;
                    drop(task); // no commit, no checkpoint: as after a crash
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    /// Commits and closes `partition`'s task, if open.
    fn close(&mut self, partition: i32) -> Result<()> {
        self.servers.remove(&partition);
        let closed = match self.tasks.remove(&partition) {
            Some(task) => task.close().map(|stats| {
                let mut s = self.shared.summary.lock().unwrap();
                s.stats.add(&stats);
                s.closed += 1;
            }),
            None => Ok(()),
        };
        closed.with_context(|| format!("closing partition {partition}"))
    }

    /// Opens `partition`'s task: the answer for the poll loop (its input
    /// position, or why it did not open), or the worker's own failure.
    fn open(&mut self, partition: i32) -> Result<Result<u64>> {
        // Assigned twice: the old task closes first (it holds the
        // partition's directory lock).
        self.servers.remove(&partition);
        if let Some(old) = self.tasks.remove(&partition) {
            old.close()
                .with_context(|| format!("closing partition {partition}"))?;
        }
        // Owned now: its standby (if kept here) closes at what it applied,
        // and the task opens on it, replaying only the tail. (Still
        // wanted: it opens again on the closed task's store if the
        // partition moves away.)
        self.standby_retry.remove(&partition);
        if let Some(standby) = self.standbys.remove(&partition) {
            match standby.close() {
                Ok(applied) => {
                    tracing::info!(partition, applied, "standby promoted");
                    self.shared.summary.lock().unwrap().promoted.push(partition);
                }
                Err(e) => tracing::warn!(
                    partition,
                    "standby close failed, the task recovers without it: {e:#}"
                ),
            }
        }
        let opened = open(
            self.config,
            self.runtime,
            partition,
            self.partitions,
            self.shared,
            self.processors,
        );
        Ok(opened.map(|(task, server)| {
            let position = task.input_position();
            self.tasks.insert(partition, task);
            if let Some(server) = server {
                self.servers.insert(partition, server);
            }
            position
        }))
    }

    fn record(
        &mut self,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<()> {
        // Records of a partition closed meanwhile were fetched before its
        // revoke: its next owner reads them again. One below the task's
        // position was processed already (offsets may skip: transaction
        // markers take some).
        let task = self
            .tasks
            .get_mut(&partition)
            .filter(|t| offset >= 0 && offset as u64 >= t.input_position());
        if let Some(task) = task {
            let input = Input::Keyed { key, value };
            task.process(input, offset as u64 + 1)
                .with_context(|| format!("partition {partition} at input offset {offset}"))?;
        }
        Ok(())
    }

    /// Live queries answered, and commits that are due made.
    fn sweep(&mut self) -> Result<()> {
        for (p, task) in &mut self.tasks {
            if let Some(server) = self.servers.get(p) {
                server
                    .poll(task)
                    .with_context(|| format!("partition {p}"))?;
            }
            task.commit_if_due()
                .with_context(|| format!("partition {p}"))?;
        }
        self.keep_standbys()
    }

    /// Opens the standbys wanted and not yet open, and brings each up to
    /// its changelog's committed end. A standby's failure is not the
    /// process's: it is reported, dropped without a checkpoint (as after
    /// a crash) and opened again later.
    fn keep_standbys(&mut self) -> Result<()> {
        let now = Instant::now();
        let to_open: Vec<i32> = self
            .standby_wanted
            .iter()
            .copied()
            .filter(|p| !self.standbys.contains_key(p) && !self.tasks.contains_key(p))
            .filter(|p| self.standby_retry.get(p).is_none_or(|&at| now >= at))
            .collect();
        // Look first (cheap): only a standby with commits to apply, or one
        // to open, costs this worker's tasks anything.
        let mut failed = Vec::new();
        let mut to_apply = Vec::new();
        for (&p, standby) in self.standbys.iter_mut().filter(|(_, s)| s.due()) {
            match standby.look() {
                Ok(true) => to_apply.push(p),
                Ok(false) => {}
                Err(e) => failed.push((p, e)),
            }
        }
        if !to_open.is_empty() || !to_apply.is_empty() {
            // A standby's replay may take a while, and it runs on this
            // thread: no transaction of this worker's tasks stays open
            // across it (the broker aborts one open past
            // transaction.timeout.ms).
            for (p, task) in &mut self.tasks {
                task.commit_pending()
                    .with_context(|| format!("partition {p}"))?;
            }
        }
        for p in to_open {
            let config = self.config.for_partition(p, self.partitions);
            match Standby::open(&config, self.runtime) {
                Ok((standby, report)) => {
                    tracing::info!(partition = p, ?report, "standby opened");
                    self.shared
                        .summary
                        .lock()
                        .unwrap()
                        .standbys
                        .push((p, report));
                    self.standbys.insert(p, standby);
                }
                Err(e) => {
                    tracing::warn!(
                        partition = p,
                        "standby: {e:#} (trying again in {STANDBY_RETRY:?})"
                    );
                    self.standby_retry.insert(p, now + STANDBY_RETRY);
                }
            }
        }
        for p in to_apply {
            if let Some(Err(e)) = self.standbys.get_mut(&p).map(Standby::apply) {
                failed.push((p, e));
            }
        }
        for (p, e) in failed {
            tracing::warn!(
                partition = p,
                "standby: {e:#} (opening it again in {STANDBY_RETRY:?})"
            );
            // No checkpoint: its store recovers from its own commit.
            drop(self.standbys.remove(&p));
            crate::metrics::standby_lag(&format!("{}-{p}", self.config.store.name), None);
            self.standby_retry.insert(p, now + STANDBY_RETRY);
        }
        Ok(())
    }

    /// Closes every standby at what it applied (the end of the run).
    fn close_standbys(&mut self) {
        for (p, standby) in std::mem::take(&mut self.standbys) {
            if let Err(e) = standby.close() {
                tracing::warn!(partition = p, "standby close: {e:#}");
            }
        }
    }
}

fn open(
    config: &Config,
    runtime: &Runtime,
    partition: i32,
    partitions: i32,
    shared: &Shared,
    processors: ProcessorFactory<'_>,
) -> Result<(Task, Option<QueryServer>)> {
    let config = config.for_partition(partition, partitions);
    let processor = processors.map(|make| make(partition));
    let (task, report) = Task::open_with(&config, runtime, processor)
        .with_context(|| format!("opening partition {partition}"))?;
    crate::crash::step("after-recovery");
    tracing::info!(partition, ?report, "partition opened");
    shared
        .summary
        .lock()
        .unwrap()
        .opened
        .push((partition, report));
    // Bound after the task, which holds the partition directory's lock.
    let server = QueryServer::bind(&config.state_dir())
        .map_err(|e| tracing::warn!(partition, "live queries are off for this partition: {e:#}"))
        .ok();
    Ok((task, server))
}
