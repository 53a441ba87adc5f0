//! `roll-back-snapshot`: writes go straight to `main`; `commit` records the
//! offset and takes the storage snapshot `committed` of the whole store,
//! which is the commit point. The first write of a transaction puts the
//! marker `dirty` in `meta` in the same atomic batch, so after a crash the
//! marker is on disk whenever any write of the open transaction is, and
//! `recover` then restores the snapshot. On RocksDB a snapshot and a
//! restore link the store's files instead of copying them, so both cost in
//! proportion to the file count, not to the state or to the transaction.
//!
//! Read-committed reads of a key written in the open transaction read the
//! snapshot (the keyspace `main` as it is in `committed`); other keys read
//! `main`, which still holds their committed value.

use std::collections::HashSet;
use txstore_guest_kit::{
    check_options, check_range, export_store, put_u64, read_range, read_u64, recovered, storage, write_calls, Entry,
    Error, Guest, Isolation, Keyspace, KeyspaceOps, MaybeValues, Op, Packed, Pending, Recovery, RecoveryAction, Slot,
    Writes,
};

const OFFSET: &[u8] = b"committed-offset";
const DIRTY: &[u8] = b"dirty";
const SNAPSHOT: &str = "committed";

struct Store {
    main: Keyspace,
    meta: Keyspace,
    /// `main` as it is in the snapshot: the committed state. Opened by
    /// `recover`, once the snapshot exists.
    committed: Option<Keyspace>,
    /// Keys written in the open transaction (read-committed reads of them
    /// go to the snapshot).
    touched: HashSet<Vec<u8>>,
    /// Whether the marker `dirty` was written in the open transaction.
    dirty: bool,
    /// Writes not yet in `main`.
    pending: Pending,
    bytes: u64,
}

static STORE: Slot<Store> = Slot::new();

impl Store {
    fn write(&mut self, writes: Writes) -> Result<(), Error> {
        self.bytes += writes.bytes();
        self.touched.extend(writes.iter().map(|(k, _)| k.to_vec()));
        if self.pending.push(writes) {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the pending writes to `main`; the first batch of a
    /// transaction carries the marker.
    fn flush(&mut self) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let main_ops = self.pending.take().into_iter().map(Writes::into_op);
        let mut batch = vec![KeyspaceOps { keyspace: &self.main, ops: main_ops.collect() }];
        if !self.dirty {
            let marker = Op::Put(Entry { key: DIRTY.to_vec(), value: Vec::new() });
            batch.push(KeyspaceOps { keyspace: &self.meta, ops: vec![marker] });
        }
        storage::write(&batch, false)?;
        self.dirty = true;
        Ok(())
    }

    fn committed(&self) -> Result<&Keyspace, Error> {
        self.committed.as_ref().ok_or_else(|| Error::Other("roll-back-snapshot: read before recover".into()))
    }

    fn committed_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        if self.touched.contains(key) {
            return self.committed()?.get(key);
        }
        self.main.get(key)
    }

    /// Whether the snapshot holds the store as it is now (same offset):
    /// false after a crash between a commit's offset write reaching disk
    /// and its snapshot replacing the previous one.
    fn snapshot_is_current(&self) -> Result<bool, Error> {
        if !storage::list_snapshots()?.iter().any(|n| n == SNAPSHOT) {
            return Ok(false);
        }
        let snapshot_meta = Keyspace::open_snapshot(SNAPSHOT, "meta")?;
        Ok(read_u64(&snapshot_meta, OFFSET)? == read_u64(&self.meta, OFFSET)?)
    }
}

struct RollBackSnapshot;

impl Guest for RollBackSnapshot {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        check_options("roll-back-snapshot", &options, &[])?;
        STORE.set(Store {
            main: Keyspace::open("main")?,
            meta: Keyspace::open("meta")?,
            committed: None,
            touched: HashSet::new(),
            dirty: false,
            pending: Pending::default(),
            bytes: 0,
        });
        Ok(())
    }

    fn transactional() -> bool {
        true
    }

    fn recover(checkpointed: Option<u64>) -> Result<Recovery, Error> {
        STORE.with(|s| {
            s.pending.take();
            s.touched.clear();
            s.bytes = 0;
            s.dirty = false;
            let rolled = s.meta.get(DIRTY)?.is_some();
            if rolled {
                if !storage::list_snapshots()?.iter().any(|n| n == SNAPSHOT) {
                    return Err(Error::Corrupt(format!(
                        "the store holds uncommitted writes (marker `dirty`) but no snapshot `{SNAPSHOT}` to roll back to"
                    )));
                }
                storage::restore_snapshot(SNAPSHOT)?;
            } else if !s.snapshot_is_current()? {
                // The store is committed as it is (no marker): a crash came
                // between its commit's writes and its snapshot, or it is new.
                storage::create_snapshot(SNAPSHOT)?;
            }
            s.committed = Some(Keyspace::open_snapshot(SNAPSHOT, "main")?);
            recovered(checkpointed, read_u64(&s.meta, OFFSET)?, rolled.then_some(RecoveryAction::RolledBack))
        })
    }

    fn get(key: Vec<u8>, isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        STORE.with(|s| match isolation {
            // A held write answers without a flush; the rest is in `main`.
            Isolation::ReadUncommitted => match s.pending.latest(&key) {
                Some(held) => Ok(held.map(<[u8]>::to_vec)),
                None => s.main.get(&key),
            },
            Isolation::ReadCommitted => s.committed_get(&key),
        })
    }

    fn get_many(keys: Packed, isolation: Isolation) -> Result<MaybeValues, Error> {
        keys.check(1, "get-many")?;
        STORE.with(|s| {
            if isolation == Isolation::ReadUncommitted {
                s.flush()?;
                return s.main.get_many(&keys);
            }
            if s.touched.is_empty() {
                return s.main.get_many(&keys);
            }
            // Two batched reads: touched keys from the snapshot, the rest
            // from `main`; then back into the order asked.
            let (mut old, mut fresh) = (Packed::new(), Packed::new());
            for k in keys.strings() {
                if s.touched.contains(k) {
                    old.push(k)
                } else {
                    fresh.push(k)
                }
            }
            let old_values = s.committed()?.get_many(&old)?;
            let fresh_values = s.main.get_many(&fresh)?;
            let (mut old_values, mut fresh_values) = (old_values.iter(), fresh_values.iter());
            let mut out = MaybeValues::new();
            for k in keys.strings() {
                let value = if s.touched.contains(k) { old_values.next() } else { fresh_values.next() };
                out.push(value.flatten());
            }
            Ok(out)
        })
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, isolation: Isolation, limit: u32) -> Result<Packed, Error> {
        check_range(&start, &end)?;
        STORE.with(|s| {
            if isolation == Isolation::ReadUncommitted {
                s.flush()?;
                return read_range(&s.main, start.as_deref(), end.as_deref(), limit);
            }
            let source = if s.touched.is_empty() { &s.main } else { s.committed()? };
            read_range(source, start.as_deref(), end.as_deref(), limit)
        })
    }

    write_calls!(STORE, Store::write);

    fn commit(offset: u64) -> Result<(), Error> {
        STORE.with(|s| {
            s.flush()?;
            let ops = vec![put_u64(OFFSET, offset), Op::Delete(DIRTY.to_vec())];
            storage::write(&[KeyspaceOps { keyspace: &s.meta, ops }], false)?;
            // The commit point: the snapshot replaces the previous one
            // atomically and durably (it flushes everything before it).
            storage::create_snapshot(SNAPSHOT)?;
            s.touched.clear();
            s.dirty = false;
            s.bytes = 0;
            Ok(())
        })
    }

    fn committed_offset() -> Result<Option<u64>, Error> {
        STORE.with(|s| read_u64(&s.meta, OFFSET))
    }

    fn approximate_uncommitted_bytes() -> u64 {
        STORE.peek(0, |s| s.bytes)
    }
}

export_store!(RollBackSnapshot);
