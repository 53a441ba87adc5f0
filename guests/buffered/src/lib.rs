//! `buffered`: the design Kafka Streams shipped (KIP-892, offsets in the
//! store as KIP-1035). Uncommitted writes live in an ordered map in guest
//! memory; `commit` writes them and the offset as one atomic, synced batch.
//! A crash loses the map and nothing else, so recovery has nothing to undo.
//! Past `max_uncommitted_bytes` a write is refused with `uncommitted-limit`
//! and the host commits early.

use std::collections::{BTreeMap, HashMap};
use txstore_guest_kit::{
    bounds, check_options, check_range, export_store, merge, put_u64, read_range, read_u64, recovered, storage,
    write_calls, write_op, CursorIter, Error, Guest, Isolation, Keyspace, KeyspaceOps, MaybeValues, Op, Packed,
    Recovery, Slot, Write, Writes,
};

const OFFSET: &[u8] = b"committed-offset";
/// Bytes counted per buffered entry on top of key and value: the map node's
/// share and the two vectors' headers, so the count bounds real memory.
const ENTRY_OVERHEAD: u64 = 64;
const DEFAULT_LIMIT: u64 = 64 << 20;

struct Store {
    data: Keyspace,
    meta: Keyspace,
    buffer: Pending,
    /// Set when a commit failed after taking the buffer: the host must
    /// restart from recovery.
    poisoned: bool,
}

static STORE: Slot<Store> = Slot::new();

fn cost(key: &[u8], value: &Option<Vec<u8>>) -> u64 {
    (key.len() + value.as_ref().map_or(0, Vec::len)) as u64 + ENTRY_OVERHEAD
}

/// The uncommitted writes and what they cost, apart from any storage call
/// so that the accounting which bounds guest memory is tested natively.
struct Pending {
    /// Some(value) or None for a delete.
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// `cost` summed over `writes`.
    bytes: u64,
    limit: u64,
}

impl Pending {
    fn new(limit: u64) -> Self {
        Pending { writes: BTreeMap::new(), bytes: 0, limit }
    }

    /// Adds `batch` in order if the result costs at most the limit, or if
    /// nothing is pending (the WIT: an empty store takes any single write);
    /// otherwise adds none of it.
    fn add(&mut self, batch: Vec<Write>) -> Result<(), Error> {
        // The exact cost after the batch, a key repeated in it counted once.
        let mut next = self.bytes;
        let mut batch_cost: HashMap<&[u8], u64> = HashMap::new();
        for (k, v) in &batch {
            let old = match batch_cost.get(k.as_slice()) {
                Some(c) => *c,
                None => self.writes.get(k).map_or(0, |old| cost(k, old)),
            };
            next = next - old + cost(k, v);
            batch_cost.insert(k, cost(k, v));
        }
        if !self.writes.is_empty() && next > self.limit {
            return Err(Error::UncommittedLimit(self.limit));
        }
        for (k, v) in batch {
            self.bytes += cost(&k, &v);
            if let Some(old) = self.writes.get(&k) {
                self.bytes -= cost(&k, old);
            }
            self.writes.insert(k, v);
        }
        debug_assert_eq!(self.bytes, next);
        debug_assert_eq!(self.bytes, self.writes.iter().map(|(k, v)| cost(k, v)).sum::<u64>());
        Ok(())
    }

    /// Takes every pending write, leaving nothing pending.
    fn take(&mut self) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        self.bytes = 0;
        std::mem::take(&mut self.writes)
    }
}

impl Store {
    fn usable(&self) -> Result<(), Error> {
        if self.poisoned {
            return Err(Error::Other("a commit failed; recover before using this store".into()));
        }
        Ok(())
    }

    fn buffer(&mut self, writes: Writes) -> Result<(), Error> {
        self.usable()?;
        self.buffer.add(writes.into_vec())
    }
}

struct Buffered;

impl Guest for Buffered {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        check_options("buffered", &options, &["max_uncommitted_bytes"])?;
        let mut limit = DEFAULT_LIMIT;
        for (name, value) in &options {
            if name == "max_uncommitted_bytes" {
                limit = value.parse().map_err(|_| {
                    Error::InvalidArgument(format!("buffered: max_uncommitted_bytes `{value}` is not a byte count"))
                })?;
            }
        }
        STORE.set(Store {
            data: Keyspace::open("data")?,
            meta: Keyspace::open("meta")?,
            buffer: Pending::new(limit),
            poisoned: false,
        });
        Ok(())
    }

    fn transactional() -> bool {
        true
    }

    fn recover(checkpointed: Option<u64>) -> Result<Recovery, Error> {
        STORE.with(|s| {
            s.buffer.take();
            s.poisoned = false;
            // Nothing uncommitted ever reaches storage: nothing to undo.
            recovered(checkpointed, read_u64(&s.meta, OFFSET)?, None)
        })
    }

    fn get(key: Vec<u8>, isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        STORE.with(|s| {
            s.usable()?;
            if isolation == Isolation::ReadUncommitted {
                if let Some(v) = s.buffer.writes.get(&key) {
                    return Ok(v.clone());
                }
            }
            s.data.get(&key)
        })
    }

    fn get_many(keys: Packed, isolation: Isolation) -> Result<MaybeValues, Error> {
        keys.check(1, "get-many")?;
        STORE.with(|s| {
            s.usable()?;
            if isolation == Isolation::ReadCommitted || s.buffer.writes.is_empty() {
                return s.data.get_many(&keys);
            }
            let mut misses = Packed::new();
            for k in keys.strings().filter(|k| !s.buffer.writes.contains_key(*k)) {
                misses.push(k);
            }
            let stored = s.data.get_many(&misses)?;
            let mut stored = stored.iter();
            let mut out = MaybeValues::new();
            for k in keys.strings() {
                match s.buffer.writes.get(k) {
                    Some(v) => out.push(v.as_deref()),
                    None => out.push(stored.next().flatten()),
                }
            }
            Ok(out)
        })
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, isolation: Isolation, limit: u32) -> Result<Packed, Error> {
        check_range(&start, &end)?;
        STORE.with(|s| {
            s.usable()?;
            if isolation == Isolation::ReadCommitted {
                return read_range(&s.data, start.as_deref(), end.as_deref(), limit);
            }
            let mut base = CursorIter::expecting(&s.data, start.as_deref(), end.as_deref(), limit)?;
            let overlay = s.buffer.writes.range(bounds(start, end)).map(|(k, v)| (k, v.as_ref()));
            let out = merge(&mut base, overlay, limit);
            base.finish()?;
            Ok(out)
        })
    }

    write_calls!(STORE, Store::buffer);

    fn commit(offset: u64) -> Result<(), Error> {
        STORE.with(|s| {
            s.usable()?;
            // Move, not copy, the buffer into the batch: memory stays ~1x.
            let ops: Vec<Op> = s.buffer.take().into_iter().map(write_op).collect();
            let result = storage::write(
                &[
                    KeyspaceOps { keyspace: &s.data, ops },
                    KeyspaceOps { keyspace: &s.meta, ops: vec![put_u64(OFFSET, offset)] },
                ],
                true,
            );
            s.poisoned = result.is_err();
            result
        })
    }

    fn committed_offset() -> Result<Option<u64>, Error> {
        STORE.with(|s| read_u64(&s.meta, OFFSET))
    }

    fn approximate_uncommitted_bytes() -> u64 {
        STORE.peek(0, |s| s.buffer.bytes)
    }
}

export_store!(Buffered);

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &[u8], len: usize) -> (Vec<u8>, Option<Vec<u8>>) {
        (k.to_vec(), Some(vec![7; len]))
    }

    #[test]
    fn an_overwrite_costs_its_last_value_only() {
        let mut p = Pending::new(u64::MAX);
        p.add(vec![put(b"a", 100)]).unwrap();
        p.add(vec![put(b"a", 10)]).unwrap();
        p.add(vec![(b"a".to_vec(), None), put(b"b", 5)]).unwrap();
        assert_eq!(p.bytes, 1 + ENTRY_OVERHEAD + 1 + 5 + ENTRY_OVERHEAD);
    }

    #[test]
    fn the_limit_is_the_cost_after_the_batch() {
        // Exactly at the limit after an overwrite that shrinks a value: taken.
        let mut p = Pending::new(0);
        p.add(vec![put(b"a", 1000)]).unwrap();
        p.limit = cost(b"a", &Some(vec![0; 10])) + cost(b"b", &Some(vec![0; 20]));
        p.add(vec![put(b"a", 500), put(b"b", 20), put(b"a", 10)]).unwrap();
        assert_eq!(p.bytes, p.limit);
        // One byte more: refused, and nothing of the batch applied.
        let before = (p.writes.clone(), p.bytes);
        let refused = p.add(vec![put(b"c", 0), put(b"a", 11)]);
        assert!(matches!(refused, Err(Error::UncommittedLimit(l)) if l == p.limit));
        assert_eq!((p.writes.clone(), p.bytes), before);
    }

    #[test]
    fn an_empty_buffer_takes_a_batch_over_the_limit() {
        let mut p = Pending::new(100);
        p.add(vec![put(b"a", 1000)]).unwrap();
        assert!(matches!(p.add(vec![put(b"b", 1)]), Err(Error::UncommittedLimit(100))));
        assert_eq!(p.take().len(), 1);
        assert_eq!(p.bytes, 0);
        p.add(vec![put(b"b", 1000)]).unwrap();
    }
}
