//! A worker thread: the tasks of the partitions it owns, driven by the
//! commands of the poll loop (open, record, close, lose), with their live
//! queries and due commits served between commands.

use super::{ProcessorFactory, Shared, TICK};
use crate::config::Config;
use crate::runtime::Runtime;
use crate::task::serve::QueryServer;
use crate::task::{Input, Task};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

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
    };
    let mut last_sweep = Instant::now();
    let result = (|| -> Result<()> {
        loop {
            match rx.recv_timeout(TICK) {
                Ok(command) => worker.handle(command)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
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
                Command::Record { .. } => {}
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
        Ok(())
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
