//! The commit marker that ends each transaction in a Kafka changelog
//! partition, and the proof, built from the markers a replay reads, that
//! the replay saw every committed transaction up to the committed end.
//!
//! Why a proof: a `read_committed` consumer that reaches the end of the
//! partition cannot tell "everything was read" from "the broker or client
//! dropped batches" (a broker that lists aborted transactions wrongly makes
//! clients drop every later batch of the producer; a wrong topic or a
//! retention that deleted segments looks the same). Accepting such a short
//! replay leaves the store at an old state that the task then builds on,
//! silently wrong. So a replay is accepted only when the markers show it
//! read what was committed:
//!
//! - every transaction with records ends with one marker record (key
//!   [`MARKER_KEY`], never applied to the store) carrying its sequence
//!   number, the committed end it started from, the time the previous
//!   marker was written and its own record count;
//! - the consumer group's committed offset carries the last sequence number
//!   next to the committed end, in the same transaction;
//! - a replay from `from` follows the chain of markers: each must start
//!   where the previous ended, with the next sequence number and exactly
//!   the records it counted, and the last must end at the committed end
//!   with the committed sequence number.
//!
//! The one thing allowed to break the chain is compaction, and only where
//! the topic lets it act: on a compacted topic, records (markers included,
//! since every marker shares one key) older than `min.compaction.lag.ms`
//! may be gone. A gap or a short count is accepted only when everything
//! missing is older than that. The last marker is never compacted away:
//! it is the newest record of its key and a put, not a tombstone.

/// The key of every marker record: one key, so compaction keeps only the
/// newest marker (and a changelog holds one marker whatever its history).
/// A store key equal to it is refused at append.
pub const MARKER_KEY: &[u8] = b"\xfftxstore\x00txn-end";
const VERSION: u8 = 1;
const ENCODED_LEN: usize = 1 + 8 * 5;

/// What the marker of one transaction says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marker {
    /// 1 for the first transaction with records, then one more each.
    pub seq: u64,
    /// The committed end before this transaction: its records come after.
    pub prev_end: u64,
    /// When the previous transaction's marker was written (ms since the
    /// epoch, the producer's clock); 0 if there was none.
    pub prev_time_ms: i64,
    /// Records of the transaction in this partition, the marker excluded.
    pub records: u64,
    /// The task's input position committed with the transaction.
    pub input_position: u64,
}

impl Marker {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(VERSION);
        for n in [
            self.seq,
            self.prev_end,
            self.prev_time_ms as u64,
            self.records,
            self.input_position,
        ] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Marker> {
        if bytes.len() != ENCODED_LEN || bytes[0] != VERSION {
            return None;
        }
        let n = |i: usize| u64::from_be_bytes(bytes[1 + 8 * i..9 + 8 * i].try_into().unwrap());
        Some(Marker {
            seq: n(0),
            prev_end: n(1),
            prev_time_ms: n(2) as i64,
            records: n(3),
            input_position: n(4),
        })
    }
}

/// What the topic lets its cleaner remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// `cleanup.policy` includes `compact`.
    pub compacted: bool,
    /// `min.compaction.lag.ms`: records younger than this are never compacted.
    pub min_lag_ms: i64,
}

impl Compaction {
    /// Whether records written at `written_ms` (or earlier) may have been
    /// compacted away by `now_ms`.
    fn may_have_removed(&self, written_ms: i64, now_ms: i64) -> bool {
        self.compacted && now_ms.saturating_sub(written_ms) >= self.min_lag_ms
    }
}

/// Follows a replay's records and markers from `from` and tells whether
/// it read every committed transaction up to `end`. Errors are the reason,
/// in words, for the caller's one error line.
#[derive(Debug)]
pub struct ReplayProof {
    from: u64,
    end: u64,
    /// The committed sequence number (None: the group's offset was written
    /// by a txstore that wrote no markers; only the tail can be checked).
    end_seq: Option<u64>,
    /// Every committed transaction that ends at or before `chain` was read.
    chain: u64,
    /// The sequence number of the transaction that ends at `chain`, when known.
    chain_seq: Option<u64>,
    /// Records read after `chain`.
    records: u64,
    /// The last offset read.
    last_offset: Option<u64>,
}

impl ReplayProof {
    pub fn new(from: u64, end: u64, end_seq: Option<u64>) -> Self {
        ReplayProof {
            from,
            end,
            end_seq,
            chain: from,
            chain_seq: (from == 0).then_some(0),
            records: 0,
            last_offset: None,
        }
    }

    pub fn from(&self) -> u64 {
        self.from
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Where every committed transaction is known to have been read.
    pub fn proven(&self) -> u64 {
        self.chain
    }

    /// A store record at `offset`.
    pub fn record(&mut self, offset: u64) -> Result<(), String> {
        self.advance(offset)?;
        self.records += 1;
        Ok(())
    }

    /// A store record at `offset` that ends its transaction the way
    /// txstore wrote changelogs before markers (a header on the last
    /// record): the chain moves on unchecked.
    pub fn legacy_end(&mut self, offset: u64) -> Result<(), String> {
        self.advance(offset)?;
        self.chain = offset + 1;
        self.chain_seq = None;
        self.records = 0;
        Ok(())
    }

    /// The marker `m` at `offset`, written at `written_ms`. Returns the
    /// transaction's commit offset. `compaction` is asked only when
    /// something is missing.
    pub fn marker(
        &mut self,
        offset: u64,
        m: &Marker,
        written_ms: Option<i64>,
        now_ms: i64,
        compaction: &mut dyn FnMut() -> Result<Compaction, String>,
    ) -> Result<u64, String> {
        self.advance(offset)?;
        if m.prev_end < self.chain || m.prev_end > offset {
            return Err(format!(
                "the marker at offset {offset} (transaction {}) says it starts at offset {}, but the replay is at {}: \
                 not this store's changelog",
                m.seq, m.prev_end, self.chain
            ));
        }
        if let Some(seq) = self.chain_seq {
            let expected = seq + 1;
            let gap = m.prev_end > self.chain;
            if (!gap && m.seq != expected) || (gap && m.seq <= expected) {
                return Err(format!(
                    "the marker at offset {offset} is transaction {} where transaction {expected} was due",
                    m.seq
                ));
            }
        }
        if m.prev_end > self.chain {
            // Whole transactions are missing: the newest of their markers
            // was written at `prev_time_ms`.
            let c = compaction()?;
            if !c.may_have_removed(m.prev_time_ms, now_ms) {
                return Err(self.missing(
                    format!(
                        "the transactions between offsets {} and {} were not read (the next marker, at offset \
                         {offset}, is transaction {})",
                        self.chain, m.prev_end, m.seq
                    ),
                    &c,
                ));
            }
        } else if self.records != m.records {
            let c = compaction()?;
            let written = written_ms.unwrap_or(now_ms);
            if self.records > m.records || !c.may_have_removed(written, now_ms) {
                return Err(self.missing(
                    format!(
                        "transaction {} (offsets {} to {offset}) has {} records but {} were read",
                        m.seq, m.prev_end, m.records, self.records
                    ),
                    &c,
                ));
            }
        }
        self.chain = offset + 1;
        self.chain_seq = Some(m.seq);
        self.records = 0;
        Ok(self.chain)
    }

    /// The replay stopped (end of partition, or the committed end): was
    /// everything up to the committed end read?
    pub fn finish(&self) -> Result<(), String> {
        match self.end_seq {
            Some(seq) => {
                if self.chain != self.end {
                    return Err(format!(
                        "the replay read transaction markers only up to offset {}{}, below the committed end {} \
                         (transaction {seq})",
                        self.chain,
                        self.chain_seq
                            .map_or(String::new(), |s| format!(" (transaction {s})")),
                        self.end
                    ));
                }
                if self.chain_seq.is_some_and(|s| s != seq) {
                    return Err(format!(
                        "the last marker read is transaction {} but the committed one is {seq}",
                        self.chain_seq.unwrap()
                    ));
                }
            }
            // Without markers only the committed end's own record proves
            // the tail was read.
            None if self.end > 0 && self.last_offset != Some(self.end - 1) => {
                return Err(format!(
                    "the replay read up to offset {}, but the committed end is {}",
                    self.last_offset.map_or(self.chain, |o| o + 1),
                    self.end
                ));
            }
            None => {}
        }
        Ok(())
    }

    fn advance(&mut self, offset: u64) -> Result<(), String> {
        if self.last_offset.is_some_and(|last| offset <= last) || offset < self.chain {
            return Err(format!(
                "the consumer went back to offset {offset} after {:?}",
                self.last_offset
            ));
        }
        if offset >= self.end {
            return Err(format!(
                "offset {offset} is past the committed end {}",
                self.end
            ));
        }
        self.last_offset = Some(offset);
        Ok(())
    }

    fn missing(&self, what: String, c: &Compaction) -> String {
        let why = if c.compacted {
            format!(
                "the topic's min.compaction.lag.ms ({} ms) says compaction cannot have removed them",
                c.min_lag_ms
            )
        } else {
            "the topic is not compacted".to_string()
        };
        format!("{what}, and {why}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// One item of a changelog partition as a consumer reads it.
    #[derive(Clone, Debug)]
    enum Item {
        Record(u64),
        Marker(u64, Marker, i64),
    }

    /// A changelog of `txns` transactions of 1-4 records each, written
    /// one second apart ending at `now`, with a commit control record (an
    /// offset no consumer sees) after each, and sometimes an aborted
    /// transaction's records in between. Returns the items and the
    /// committed end and sequence.
    fn changelog(rng: &mut Rng, txns: u64, now: i64) -> (Vec<Item>, u64, u64) {
        let mut items = Vec::new();
        let mut offset = 0;
        let mut prev_end = 0;
        let mut prev_time = 0;
        for seq in 1..=txns {
            if rng.below(4) == 0 {
                offset += 1 + rng.below(3) + 1; // aborted records and their marker
            }
            let records = 1 + rng.below(4);
            for _ in 0..records {
                items.push(Item::Record(offset));
                offset += 1;
            }
            let time = now - 1000 * (txns - seq) as i64;
            let m = Marker {
                seq,
                prev_end,
                prev_time_ms: prev_time,
                records,
                input_position: seq * 10,
            };
            items.push(Item::Marker(offset, m, time));
            prev_end = offset + 1;
            prev_time = time;
            offset += 2; // the marker, then the commit control record
        }
        (items, prev_end, txns)
    }

    fn replay(
        items: &[Item],
        from: u64,
        end: u64,
        seq: u64,
        now: i64,
        c: Compaction,
    ) -> Result<u64, String> {
        let mut proof = ReplayProof::new(from, end, Some(seq));
        for item in items {
            match item {
                Item::Record(o) if *o >= from => proof.record(*o)?,
                Item::Marker(o, m, t) if *o >= from => {
                    proof.marker(*o, m, Some(*t), now, &mut || Ok(c))?;
                }
                _ => {}
            }
        }
        proof.finish()?;
        Ok(proof.proven())
    }

    const NOW: i64 = 1_800_000_000_000;
    const NOT_COMPACTED: Compaction = Compaction {
        compacted: false,
        min_lag_ms: 0,
    };

    #[test]
    fn a_marker_round_trips_and_a_foreign_value_is_not_one() {
        let m = Marker {
            seq: 7,
            prev_end: 1 << 40,
            prev_time_ms: NOW,
            records: 3,
            input_position: u64::MAX,
        };
        assert_eq!(Marker::decode(&m.encode()), Some(m));
        assert_eq!(Marker::decode(&m.encode()[1..]), None);
        assert_eq!(Marker::decode(&42u64.to_be_bytes()), None);
    }

    #[test]
    fn a_whole_replay_is_proven_from_every_transaction_end() {
        let mut rng = Rng::new(1);
        let (items, end, seq) = changelog(&mut rng, 40, NOW);
        assert_eq!(replay(&items, 0, end, seq, NOW, NOT_COMPACTED), Ok(end));
        for item in &items {
            if let Item::Marker(o, ..) = item {
                assert_eq!(replay(&items, o + 1, end, seq, NOW, NOT_COMPACTED), Ok(end));
            }
        }
    }

    /// A consumer that drops batches (any run of consecutive items, at
    /// the tail, in the middle, one record) is always caught when nothing
    /// can have been compacted, from every start.
    #[test]
    fn a_consumer_that_drops_batches_is_caught() {
        for seed in 0..200 {
            let mut rng = Rng::new(seed);
            let txns = 1 + rng.below(30);
            let (items, end, seq) = changelog(&mut rng, txns, NOW);
            let from_marker = rng.below(items.len() as u64) as usize;
            let from = match items[..from_marker].iter().rev().find_map(|i| match i {
                Item::Marker(o, ..) => Some(o + 1),
                _ => None,
            }) {
                Some(o) => o,
                None => 0,
            };
            let first = items
                .iter()
                .position(|i| matches!(i, Item::Record(o) | Item::Marker(o, ..) if *o >= from))
                .unwrap();
            let start = first + rng.below((items.len() - first) as u64) as usize;
            let len = 1 + rng.below((items.len() - start) as u64) as usize;
            let mut dropped = items.clone();
            dropped.drain(start..start + len);
            let c = Compaction {
                compacted: true,
                min_lag_ms: 3_600_000, // an hour: the whole history is younger
            };
            assert!(
                replay(&dropped, from, end, seq, NOW, c).is_err(),
                "seed {seed}: dropping items {start}..{} from offset {from} went unnoticed",
                start + len
            );
            assert!(replay(&dropped, from, end, seq, NOW, NOT_COMPACTED).is_err());
        }
    }

    /// On a compacted topic, what is older than min.compaction.lag.ms may
    /// be gone: a replay missing only such records is accepted, one missing
    /// anything younger is not.
    #[test]
    fn gaps_are_accepted_only_where_compaction_can_have_made_them() {
        let mut rng = Rng::new(7);
        let (items, end, seq) = changelog(&mut rng, 20, NOW);
        let c = Compaction {
            compacted: true,
            min_lag_ms: 10_500, // the last ten transactions are too young
        };
        // Transactions 1-5 compacted down to nothing but their last record.
        let old: Vec<Item> = items
            .iter()
            .filter(|i| match i {
                Item::Marker(_, m, _) => m.seq > 5,
                Item::Record(o) => {
                    let owner = items.iter().find_map(|j| match j {
                        Item::Marker(mo, m, _) if mo > o => Some(m.seq),
                        _ => None,
                    });
                    owner.unwrap() > 5 || rng.below(3) == 0
                }
            })
            .cloned()
            .collect();
        assert_eq!(replay(&old, 0, end, seq, NOW, c), Ok(end));
        // The same records missing from transaction 15: too young.
        let young: Vec<Item> = items
            .iter()
            .filter(|i| !matches!(i, Item::Marker(_, m, _) if m.seq == 15))
            .cloned()
            .collect();
        let err = replay(&young, 0, end, seq, NOW, c).unwrap_err();
        assert!(err.contains("were not read"), "{err}");
        assert!(replay(&old, 0, end, seq, NOW, NOT_COMPACTED).is_err());
    }

    /// A replay that reads nothing where transactions were committed, the
    /// case a broker's wrong aborted-transaction list produces.
    #[test]
    fn a_replay_that_reads_nothing_is_refused() {
        let proof = ReplayProof::new(8_619, 33_653, Some(412));
        let err = proof.finish().unwrap_err();
        assert!(err.contains("only up to offset 8619"), "{err}");
        // Without markers (an older changelog), the tail record decides.
        assert!(ReplayProof::new(10, 20, None).finish().is_err());
        let mut legacy = ReplayProof::new(10, 20, None);
        legacy.record(12).unwrap();
        legacy.legacy_end(19).unwrap();
        assert_eq!(legacy.finish(), Ok(()));
    }

    #[test]
    fn records_of_another_log_or_in_the_wrong_order_are_refused() {
        let m = Marker {
            seq: 3,
            prev_end: 5,
            records: 1,
            ..Marker::default()
        };
        let mut proof = ReplayProof::new(10, 30, Some(3));
        let err = proof
            .marker(12, &m, None, NOW, &mut || Ok(NOT_COMPACTED))
            .unwrap_err();
        assert!(err.contains("not this store's changelog"), "{err}");
        let mut proof = ReplayProof::new(10, 30, Some(3));
        proof.record(15).unwrap();
        assert!(proof.record(14).is_err());
        assert!(proof.record(30).is_err());
        // Too many records for the marker's count.
        let mut proof = ReplayProof::new(0, 30, Some(1));
        proof.record(1).unwrap();
        proof.record(2).unwrap();
        let one = Marker {
            seq: 1,
            records: 1,
            ..Marker::default()
        };
        let compacted = Compaction {
            compacted: true,
            min_lag_ms: 0,
        };
        assert!(proof
            .marker(3, &one, Some(0), NOW, &mut || Ok(compacted))
            .is_err());
    }
}
