//! The flow of a Kafka input's partitions between the consumer and the
//! workers, outside the rebalance callbacks: a newly assigned partition
//! waits paused while its task opens (restores) on its worker, then
//! resumes at the task's position; a worker whose queue is full has its
//! partitions paused and its records held in order until it catches up.
//! Both keep the poll loop polling, so the member stays in its group.

use super::{owned_partitions, worker_of, Command, Rebalancer};
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// Partitions held back from their workers.
#[derive(Default)]
pub(super) struct Flow {
    /// Assigned, paused, opening on their worker: its answer to come (the
    /// input position to resume at), and the flag that cancels the open.
    pub(super) restoring: BTreeMap<i32, Opening>,
    /// Per worker: records polled while its queue was full, in order.
    pub(super) backlog: Vec<VecDeque<Command>>,
    /// Workers whose partitions are paused because of their backlog.
    pub(super) stalled: BTreeSet<usize>,
}

/// An open under way on a worker.
pub(super) type Opening = (Receiver<Result<u64>>, Arc<AtomicBool>);

/// Where to read a partition from: its task's input position (offset 0
/// is the beginning, even after retention moved it).
pub(super) fn resume_offset(position: u64) -> Offset {
    match position {
        0 => Offset::Beginning,
        n => Offset::Offset(n as i64),
    }
}

impl Rebalancer {
    /// A group's partitions are assigned: paused at once, then opened on
    /// their workers while the poll loop goes on ([`Rebalancer::resume_ready`]).
    pub(super) fn assign(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &mut TopicPartitionList,
        partitions: &[i32],
        cooperative: bool,
    ) -> Result<()> {
        // A placeholder start: nothing is fetched while paused, and the
        // consumer seeks to the task's position before it resumes.
        for &p in partitions {
            tpl.set_partition_offset(&self.topic, p, Offset::Beginning)?;
        }
        if cooperative {
            consumer.incremental_assign(tpl)?
        } else {
            consumer.assign(tpl)?
        }
        if partitions.is_empty() {
            return Ok(());
        }
        consumer.pause(tpl)?;
        // After a failure nothing more opens: the run is stopping.
        if self.shared.failed() {
            return Ok(());
        }
        let opening = self.start_opens(partitions)?;
        self.flow.lock().unwrap().restoring.extend(opening);
        Ok(())
    }

    /// Resumes every partition whose task has opened, at its position.
    pub(super) fn resume_ready(&self, consumer: &BaseConsumer<Self>) -> Result<()> {
        let mut flow = self.flow.lock().unwrap();
        let mut ready = Vec::new();
        for (&p, (rx, _)) in &flow.restoring {
            match rx.try_recv() {
                Ok(answer) => ready.push((p, answer?)),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => bail!("a worker thread has stopped"),
            }
        }
        for (p, position) in ready {
            flow.restoring.remove(&p);
            consumer
                .seek(
                    &self.topic,
                    p,
                    resume_offset(position),
                    Duration::from_secs(30),
                )
                .with_context(|| {
                    format!("input: cannot seek partition {p} to offset {position}")
                })?;
            if !flow.stalled.contains(&worker_of(p, self.workers.len())) {
                consumer.resume(&self.one(p)?)?;
            }
            tracing::info!(
                partition = p,
                position,
                "partition restored, reading from its position"
            );
        }
        Ok(())
    }

    /// Hands a polled record to its worker without blocking: behind a
    /// full queue it waits in the worker's backlog, and the worker's
    /// partitions pause until the backlog drains ([`Rebalancer::drain`]).
    /// False when the worker has stopped (its error is in `shared`).
    pub(super) fn dispatch(
        &self,
        consumer: &BaseConsumer<Self>,
        partition: i32,
        record: Command,
    ) -> Result<bool> {
        let mut flow = self.flow.lock().unwrap();
        if flow.restoring.contains_key(&partition) {
            // Fetched before the pause took hold: the seek at its
            // resumption reads it again.
            return Ok(true);
        }
        let w = worker_of(partition, self.workers.len());
        if !flow.backlog[w].is_empty() {
            flow.backlog[w].push_back(record);
            return Ok(true);
        }
        match self.workers[w].try_send(record) {
            Ok(()) => Ok(true),
            Err(TrySendError::Disconnected(_)) => Ok(false),
            Err(TrySendError::Full(record)) => {
                flow.backlog[w].push_back(record);
                if flow.stalled.insert(w) {
                    let held = self.active_of(consumer, &flow, w)?;
                    if held.count() > 0 {
                        consumer.pause(&held)?;
                    }
                }
                Ok(true)
            }
        }
    }

    /// Moves backlogged records to workers whose queues have room, and
    /// resumes a worker's partitions once its backlog is empty.
    pub(super) fn drain(&self, consumer: &BaseConsumer<Self>) -> Result<bool> {
        let mut flow = self.flow.lock().unwrap();
        let stalled: Vec<usize> = flow.stalled.iter().copied().collect();
        for w in stalled {
            while let Some(record) = flow.backlog[w].pop_front() {
                match self.workers[w].try_send(record) {
                    Ok(()) => {}
                    Err(TrySendError::Disconnected(_)) => return Ok(false),
                    Err(TrySendError::Full(record)) => {
                        flow.backlog[w].push_front(record);
                        break;
                    }
                }
            }
            if flow.backlog[w].is_empty() {
                let held = self.active_of(consumer, &flow, w)?;
                flow.stalled.remove(&w);
                if held.count() > 0 {
                    consumer.resume(&held)?;
                }
            }
        }
        Ok(true)
    }

    /// Worker `w`'s assigned partitions that are not restoring.
    fn active_of(
        &self,
        consumer: &BaseConsumer<Self>,
        flow: &Flow,
        w: usize,
    ) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for p in owned_partitions(consumer, &self.topic) {
            if worker_of(p, self.workers.len()) == w && !flow.restoring.contains_key(&p) {
                tpl.add_partition(&self.topic, p);
            }
        }
        Ok(tpl)
    }

    fn one(&self, p: i32) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, p);
        Ok(tpl)
    }

    /// Revoked partitions leave the flow: an open under way is cancelled
    /// (its worker skips it, or closes the task as soon as it has
    /// opened, so the callback does not wait for a restore), and records
    /// held back are dropped (the next owner reads them again). Returns
    /// the partitions whose tasks are open, to close.
    pub(super) fn forget(&self, partitions: &[i32]) -> Vec<i32> {
        let mut flow = self.flow.lock().unwrap();
        let mut open = Vec::new();
        for &p in partitions {
            match flow.restoring.remove(&p) {
                Some((_, cancel)) => cancel.store(true, Ordering::Relaxed),
                None => open.push(p),
            }
        }
        for backlog in &mut flow.backlog {
            backlog.retain(|c| !matches!(c, Command::Record { partition, .. } if partitions.contains(partition)));
        }
        open
    }
}
