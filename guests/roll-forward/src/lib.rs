//! `roll-forward`: the KIP-844 two-store design. Uncommitted writes go to
//! the `temp` keyspace (a tag byte: 1 + value for a put, 0 for a delete).
//! Commit:
//!   1. write the marker (the offset being committed) to `meta`;
//!   2. copy `temp` into `main` in batches;
//!   3. in one synced batch: clear `temp` (one range deletion), record the
//!      offset and delete the marker.
//! Only step 3 syncs: storage keeps a prefix of the write history, so a
//! crash leaves no marker (nothing of steps 2-3 either: the commit never
//! happened), or the marker and part of the copy with `temp` intact, or
//! all of it. Recovery: a marker means a commit was interrupted after step
//! 1: redo steps 2-3 (the copy is idempotent: `temp` is intact until step
//! 3). No marker: clear `temp`.
//!
//! Where KIP-844's prototype lost (about 4% of RocksDB): a host round trip
//! per key on commit and a per-key delete to empty the temporary store.
//! Here the copy moves 1024 entries per call and the clear is one range
//! deletion; writes wait in guest memory and reach `temp` 256 at a time
//! (before any read-uncommitted read and before commit).

use txstore_guest_kit::{
    check_options, check_range, export_store, merge, put_u64, read_range, read_u64, storage, CursorIter, Entry, Error,
    Guest, Isolation, Keyspace, KeyspaceOps, Op, Pending, Recovery, RecoveryAction, Slot, write_bytes,
};

const OFFSET: &[u8] = b"committed-offset";
const MARKER: &[u8] = b"commit-marker";
const PUT: u8 = 1;
const DELETE: u8 = 0;

struct Store {
    main: Keyspace,
    temp: Keyspace,
    meta: Keyspace,
    /// Writes not yet in `temp`.
    pending: Pending,
    bytes: u64,
}

static STORE: Slot<Store> = Slot::new();

fn tagged(value: Option<Vec<u8>>) -> Vec<u8> {
    match value {
        Some(mut v) => {
            v.insert(0, PUT);
            v
        }
        None => vec![DELETE],
    }
}

fn untag(mut stored: Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
    match stored.first() {
        Some(&PUT) => {
            stored.remove(0);
            Ok(Some(stored))
        }
        Some(&DELETE) if stored.len() == 1 => Ok(None),
        _ => Err(Error::Corrupt("temp keyspace holds a value without a valid tag".into())),
    }
}

impl Store {
    fn stage(&mut self, writes: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<(), Error> {
        self.bytes += write_bytes(&writes);
        if self.pending.push(writes) {
            self.flush()?;
        }
        Ok(())
    }

    /// Moves the pending writes into `temp`, in one call.
    fn flush(&mut self) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let ops = self.pending.take().into_iter().map(|(key, v)| Op::Put(Entry { key, value: tagged(v) })).collect();
        storage::write(&[KeyspaceOps { keyspace: &self.temp, ops }], false)
    }

    /// Step 2: copies `temp` into `main`, 1024 entries per call, then syncs.
    fn copy_temp_to_main(&self) -> Result<(), Error> {
        let mut it = CursorIter::new(&self.temp, None, None)?;
        loop {
            let mut ops = Vec::with_capacity(1024);
            for e in it.by_ref().take(1024) {
                ops.push(match untag(e.value)? {
                    Some(value) => Op::Put(Entry { key: e.key, value }),
                    None => Op::Delete(e.key),
                });
            }
            if ops.is_empty() {
                break;
            }
            storage::write(&[KeyspaceOps { keyspace: &self.main, ops }], false)?;
        }
        it.finish()
    }

    /// Steps 2-3 for the commit at `offset` whose marker is written.
    fn finish_commit(&mut self, offset: u64) -> Result<(), Error> {
        self.copy_temp_to_main()?;
        storage::write(
            &[
                KeyspaceOps { keyspace: &self.temp, ops: vec![Op::Clear] },
                KeyspaceOps { keyspace: &self.meta, ops: vec![put_u64(OFFSET, offset), Op::Delete(MARKER.to_vec())] },
            ],
            true,
        )?;
        self.bytes = 0;
        Ok(())
    }
}

struct RollForward;

impl Guest for RollForward {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        check_options("roll-forward", &options, &[])?;
        STORE.set(Store {
            main: Keyspace::open("main")?,
            temp: Keyspace::open("temp")?,
            meta: Keyspace::open("meta")?,
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
            if let Some(marker) = read_u64(&s.meta, MARKER)? {
                s.finish_commit(marker)?;
                return Ok(Recovery { offset: Some(marker), action: RecoveryAction::RolledForward });
            }
            let had_temp = !s.temp.is_empty()?;
            if had_temp {
                storage::write(&[KeyspaceOps { keyspace: &s.temp, ops: vec![Op::Clear] }], true)?;
            }
            s.bytes = 0;
            let stored = read_u64(&s.meta, OFFSET)?;
            if checkpointed > stored {
                return Err(Error::Corrupt(format!(
                    "the checkpoint says offset {checkpointed:?} but the store committed only {stored:?}"
                )));
            }
            let action =
                if had_temp || checkpointed != stored { RecoveryAction::Discarded } else { RecoveryAction::Clean };
            Ok(Recovery { offset: stored, action })
        })
    }

    fn get(key: Vec<u8>, isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        STORE.with(|s| {
            if isolation == Isolation::ReadUncommitted {
                s.flush()?;
                if let Some(t) = s.temp.get(&key)? {
                    return untag(t);
                }
            }
            s.main.get(&key)
        })
    }

    fn get_many(keys: Vec<Vec<u8>>, isolation: Isolation) -> Result<Vec<Option<Vec<u8>>>, Error> {
        STORE.with(|s| {
            if isolation == Isolation::ReadCommitted {
                return s.main.get_many(&keys);
            }
            s.flush()?;
            let staged = s.temp.get_many(&keys)?;
            let misses: Vec<Vec<u8>> =
                keys.iter().zip(&staged).filter(|(_, t)| t.is_none()).map(|(k, _)| k.clone()).collect();
            let mut committed = s.main.get_many(&misses)?.into_iter();
            staged
                .into_iter()
                .map(|t| match t {
                    Some(t) => untag(t),
                    None => Ok(committed.next().flatten()),
                })
                .collect()
        })
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, isolation: Isolation, limit: u32) -> Result<Vec<Entry>, Error> {
        check_range(&start, &end)?;
        STORE.with(|s| {
            if isolation == Isolation::ReadCommitted {
                return read_range(&s.main, start.as_deref(), end.as_deref(), limit);
            }
            s.flush()?;
            let mut base = CursorIter::expecting(&s.main, start.as_deref(), end.as_deref(), limit)?;
            let mut staged = CursorIter::expecting(&s.temp, start.as_deref(), end.as_deref(), limit)?;
            let mut bad = None;
            let overlay = staged.by_ref().map(|e| match untag(e.value) {
                Ok(v) => (e.key, v),
                Err(err) => {
                    bad = Some(err);
                    (e.key, None)
                }
            });
            let out = merge(&mut base, overlay, limit);
            base.finish()?;
            staged.finish()?;
            bad.map_or(Ok(out), Err)
        })
    }

    fn put(key: Vec<u8>, value: Vec<u8>) -> Result<(), Error> {
        STORE.with(|s| s.stage(vec![(key, Some(value))]))
    }

    fn delete(key: Vec<u8>) -> Result<(), Error> {
        STORE.with(|s| s.stage(vec![(key, None)]))
    }

    fn put_many(entries: Vec<Entry>) -> Result<(), Error> {
        STORE.with(|s| s.stage(entries.into_iter().map(|e| (e.key, Some(e.value))).collect()))
    }

    fn delete_many(keys: Vec<Vec<u8>>) -> Result<(), Error> {
        STORE.with(|s| s.stage(keys.into_iter().map(|k| (k, None)).collect()))
    }

    fn commit(offset: u64) -> Result<(), Error> {
        STORE.with(|s| {
            s.flush()?;
            if s.bytes == 0 && s.temp.is_empty()? {
                // Nothing staged: no copy to protect, just the offset.
                let ops = vec![put_u64(OFFSET, offset)];
                return storage::write(&[KeyspaceOps { keyspace: &s.meta, ops }], true);
            }
            storage::write(&[KeyspaceOps { keyspace: &s.meta, ops: vec![put_u64(MARKER, offset)] }], false)?;
            s.finish_commit(offset)
        })
    }

    fn committed_offset() -> Result<Option<u64>, Error> {
        STORE.with(|s| read_u64(&s.meta, OFFSET))
    }

    fn approximate_uncommitted_bytes() -> u64 {
        STORE.peek(0, |s| s.bytes)
    }
}

export_store!(RollForward);
