//! Replaying a changelog partition: the read itself, fed through the
//! proof of [`super::marker`], and the last marker read back from the
//! partition's tail when the group's offsets are gone.

use super::marker::{Compaction, ReplayProof};
use super::*;

/// Why a replay failed: it could not be proven complete, or it could not run.
pub(super) enum Replay {
    Unproven(anyhow::Error),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Replay {
    fn from(e: anyhow::Error) -> Self {
        Replay::Failed(e)
    }
}

impl From<KafkaError> for Replay {
    fn from(e: KafkaError) -> Self {
        Replay::Failed(e.into())
    }
}

impl KafkaLog {
    /// Reads the partition with `consumer` from `fetch_from`, handing `f`
    /// what lies at or after `from`, until the committed end, and proves
    /// the read complete.
    pub(super) fn replay(
        &self,
        consumer: &BaseConsumer<Quiet>,
        fetch_from: i64,
        from: u64,
        f: &mut dyn FnMut(Replayed) -> Result<()>,
    ) -> std::result::Result<(), Replay> {
        let end = self.end_offset();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.s.topic, self.s.partition, Offset::Offset(fetch_from))?;
        consumer.assign(&tpl).map_err(|e| self.error("assign", e))?;
        let mut proof = ReplayProof::new(from, end, self.last_marker.map(|(seq, _)| seq));
        let mut compaction: Option<Compaction> = None;
        let mut last_progress = Instant::now();
        // A test's planted fault: this read loses messages (from its N-th
        // on, or those at offsets N to N+9).
        let drop_from = crate::fault::armed(crate::fault::Class::ChangelogRead);
        let mut read = 0u64;
        let result = (|| -> std::result::Result<(), Replay> {
            loop {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let offset = m.offset() as u64;
                        if offset >= end {
                            break;
                        }
                        read += 1;
                        let lost = match drop_from {
                            Some((crate::fault::Fault::Hole, n)) => (n..n + 10).contains(&offset),
                            Some((_, n)) => read >= n,
                            None => false,
                        };
                        if lost {
                            continue;
                        }
                        if offset >= from {
                            self.replay_one(&m, &mut proof, &mut compaction, f)?;
                        }
                        last_progress = Instant::now();
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => break,
                    Some(Err(e)) => return Err(self.error("consume", e).into()),
                    None => {}
                }
                if last_progress.elapsed() > self.s.timeout {
                    return Err(anyhow!(
                        "changelog: reading topic `{}` partition {} stalled after offset {}, before the committed \
                         end {end}",
                        self.s.topic,
                        self.s.partition,
                        proof.proven()
                    )
                    .into());
                }
            }
            proof
                .finish()
                .map_err(|why| Replay::Unproven(self.unproven(&proof, why)))
        })();
        let _ = consumer.unassign();
        result
    }

    /// A read_committed consumer that takes up to 256 MiB of a partition
    /// in one fetch (for the second read of [`Changelog::read_committed`]).
    pub(super) fn whole_partition_consumer(&self) -> Result<BaseConsumer<Quiet>> {
        const WHOLE: u32 = 256 << 20;
        client_config(
            &self.s,
            &[
                ("group.id", self.s.group_id.clone()),
                ("enable.auto.commit", "false".into()),
                ("enable.auto.offset.store", "false".into()),
                ("isolation.level", "read_committed".into()),
                ("enable.partition.eof", "true".into()),
                ("auto.offset.reset", "error".into()),
                ("fetch.max.bytes", WHOLE.to_string()),
                ("max.partition.fetch.bytes", WHOLE.to_string()),
                ("receive.message.max.bytes", (WHOLE + (1 << 20)).to_string()),
            ],
        )
        .create_with_context(Quiet)
        .context("changelog: cannot make a consumer for the second read")
    }

    /// The last committed marker of the partition: (offset, marker, time
    /// written); None if the partition holds none. Reads back from the
    /// stable end in growing steps (aborted records and commit records
    /// take offsets too).
    pub(super) fn read_last_marker(&self) -> Result<Option<(u64, Marker, i64)>> {
        let (low, high) = self
            .consumer
            .fetch_watermarks(&self.s.topic, self.s.partition, self.s.timeout)
            .map_err(|e| self.error("fetch_watermarks", e))?;
        let mut step = 64i64;
        let mut start = high;
        while start > low {
            start = (high - step).max(low);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&self.s.topic, self.s.partition, Offset::Offset(start))?;
            self.consumer
                .assign(&tpl)
                .map_err(|e| self.error("assign", e))?;
            let mut last = None;
            let deadline = Instant::now() + self.s.timeout;
            let read = loop {
                match self.consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) if m.offset() >= high => break Ok(()),
                    Some(Ok(m)) => {
                        if m.key() == Some(MARKER_KEY) {
                            if let Some(marker) = m.payload().and_then(Marker::decode) {
                                let written = m.timestamp().to_millis().unwrap_or(0);
                                last = Some((m.offset() as u64, marker, written));
                            }
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => break Ok(()),
                    Some(Err(e)) => break Err(self.error("consume", e)),
                    None if Instant::now() >= deadline => {
                        break Err(anyhow!(
                            "changelog: reading the tail of topic `{}` partition {} timed out",
                            self.s.topic,
                            self.s.partition
                        ))
                    }
                    None => {}
                }
            };
            let _ = self.consumer.unassign();
            read?;
            if last.is_some() {
                return Ok(last);
            }
            step *= 4;
        }
        Ok(None)
    }

    /// One message of a replay: a store record goes to `f`, a marker ends
    /// its transaction once `proof` accepts it.
    fn replay_one(
        &self,
        m: &BorrowedMessage<'_>,
        proof: &mut ReplayProof,
        compaction: &mut Option<Compaction>,
        f: &mut dyn FnMut(Replayed) -> Result<()>,
    ) -> std::result::Result<(), Replay> {
        let offset = m.offset() as u64;
        let key = m.key().ok_or_else(|| {
            anyhow!(
                "changelog: record at offset {offset} of topic `{}` partition {} has no key: not a txstore changelog",
                self.s.topic,
                self.s.partition
            )
        })?;
        if key == MARKER_KEY {
            let marker = m.payload().and_then(Marker::decode).ok_or_else(|| {
                anyhow!(
                    "changelog: the record at offset {offset} of topic `{}` partition {} has the marker key but is \
                     not a marker this txstore reads",
                    self.s.topic,
                    self.s.partition
                )
            })?;
            let written = m.timestamp().to_millis();
            let mut ask = || -> std::result::Result<Compaction, String> {
                if compaction.is_none() {
                    *compaction = Some(self.compaction().map_err(|e| format!("{e:#}"))?);
                }
                Ok(compaction.unwrap())
            };
            let commit = proof
                .marker(offset, &marker, written, now_ms(), &mut ask)
                .map_err(|why| Replay::Unproven(self.unproven(proof, why)))?;
            return Ok(f(Replayed::Commit(commit))?);
        }
        let legacy_end = Self::end_header(m);
        let checked = if legacy_end {
            proof.legacy_end(offset)
        } else {
            proof.record(offset)
        };
        checked.map_err(|why| Replay::Unproven(self.unproven(proof, why)))?;
        f(Replayed::Record(match m.payload() {
            Some(v) => Record::Put(key.to_vec(), v.to_vec()),
            None => Record::Delete(key.to_vec()),
        }))?;
        if legacy_end {
            f(Replayed::Commit(offset + 1))?;
        }
        Ok(())
    }

    /// The one line for a replay that cannot show it read what was committed.
    fn unproven(&self, proof: &ReplayProof, why: String) -> anyhow::Error {
        let (from, end) = (proof.from(), proof.end());
        anyhow!(
            "changelog: the replay of topic `{}` partition {} from offset {from} to the committed end {end} is not \
             complete: {why}; the store was committed no further than offset {}; check the broker (a fetch that \
             skips committed batches) and the topic's retention, then start again",
            self.s.topic,
            self.s.partition,
            proof.proven()
        )
    }

    fn end_header(m: &BorrowedMessage<'_>) -> bool {
        m.headers()
            .is_some_and(|h| h.iter().any(|h| h.key == END_HEADER))
    }
}
