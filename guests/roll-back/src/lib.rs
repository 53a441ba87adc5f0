//! `roll-back`: writes go straight to `main`; before a key's first write in
//! a transaction, its prior value goes to the `undo` keyspace (a tag byte:
//! 1 + value if it existed, 0 if not), in the same atomic batch as the
//! write. Commit clears `undo` and records the offset in one synced batch.
//! Recovery puts every undo entry back into `main`, then clears `undo`:
//! the store returns to the last committed image, in time proportional to
//! the uncommitted writes, not to the state.
//!
//! Read-committed reads see through the undo log: a key written in the
//! open transaction reads its prior value from `undo`.
//!
//! Writes wait in guest memory and reach storage 256 at a time (before a
//! read-uncommitted `get-many` or `range` and before commit; a `get` of a
//! held key is answered from memory): one read of the prior values
//! and one atomic batch per flush, instead of two host calls per write.
//! Until then `main` holds the committed value, so read-committed reads of
//! a pending key are right without a flush.

use std::collections::HashSet;
use txstore_guest_kit::{
    apply_tagged, check_options, check_range, export_store, merge, put_u64, read_range, read_u64, recovered, storage,
    write_calls, CursorIter, Error, Guest, Isolation, Keyspace, KeyspaceOps, MaybeValues, Op, Packed, Pending,
    Recovery, RecoveryAction, Slot, Tagged, Writes,
};

const OFFSET: &[u8] = b"committed-offset";
/// Prior values in `undo`: the layout every earlier version wrote.
const PRIOR: Tagged = Tagged::First;

struct Store {
    main: Keyspace,
    undo: Keyspace,
    meta: Keyspace,
    /// Keys with an undo entry in the open transaction (so a second write
    /// of a key costs no extra read, and committed reads know where to look).
    touched: HashSet<Vec<u8>>,
    /// Writes not yet in `main`.
    pending: Pending,
    bytes: u64,
}

static STORE: Slot<Store> = Slot::new();

fn decode_prior(stored: Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
    PRIOR.decode(stored, "undo")
}

impl Store {
    fn write(&mut self, writes: Writes) -> Result<(), Error> {
        self.bytes += writes.bytes();
        if self.pending.push(writes) {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the pending writes to `main`, saving prior values of keys not
    /// yet touched.
    fn flush(&mut self) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let calls = self.pending.take();
        let mut fresh = Packed::new();
        let mut seen = HashSet::new();
        for (k, _) in calls.iter().flat_map(Writes::iter) {
            if !self.touched.contains(k) && seen.insert(k) {
                fresh.push(k);
            }
        }
        let mut undo = Packed::new();
        if !fresh.ends.is_empty() {
            let priors = self.main.get_many(&fresh)?;
            for (k, prior) in fresh.strings().zip(priors.iter()) {
                undo.push_entry(k, &PRIOR.encode(prior.map(<[u8]>::to_vec)));
            }
        }
        let main_ops = calls.into_iter().map(Writes::into_op);
        // One atomic batch: a write is never durable without its undo entry.
        storage::write(
            &[
                KeyspaceOps { keyspace: &self.undo, ops: vec![Op::PutMany(undo)] },
                KeyspaceOps { keyspace: &self.main, ops: main_ops.collect() },
            ],
            false,
        )?;
        self.touched.extend(fresh.strings().map(<[u8]>::to_vec));
        Ok(())
    }

    /// Puts every prior value back, a cursor page per call, then clears
    /// the log. Idempotent: the log is only cleared once everything is back.
    fn roll_back(&mut self) -> Result<(), Error> {
        apply_tagged(&self.undo, &self.main, PRIOR, "undo")?;
        storage::write(&[KeyspaceOps { keyspace: &self.undo, ops: vec![Op::Clear] }], true)
    }

    fn committed_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        if self.touched.contains(key) {
            if let Some(prior) = self.undo.get(key)? {
                return decode_prior(prior);
            }
        }
        self.main.get(key)
    }
}

struct RollBack;

impl Guest for RollBack {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        check_options("roll-back", &options, &[])?;
        STORE.set(Store {
            main: Keyspace::open("main")?,
            undo: Keyspace::open("undo")?,
            meta: Keyspace::open("meta")?,
            touched: HashSet::new(),
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
            let rolled = !s.undo.is_empty()?;
            if rolled {
                s.roll_back()?;
            }
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
            let mut out = MaybeValues::new();
            for k in keys.strings() {
                out.push(s.committed_get(k)?.as_deref());
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
            if s.touched.is_empty() {
                return read_range(&s.main, start.as_deref(), end.as_deref(), limit);
            }
            let mut base = CursorIter::expecting(&s.main, start.as_deref(), end.as_deref(), limit)?;
            let mut undo = CursorIter::expecting(&s.undo, start.as_deref(), end.as_deref(), limit)?;
            let mut bad = None;
            let overlay = undo.by_ref().map(|e| match decode_prior(e.value) {
                Ok(v) => (e.key, v),
                Err(err) => {
                    bad = Some(err);
                    (e.key, None)
                }
            });
            let out = merge(&mut base, overlay, limit);
            base.finish()?;
            undo.finish()?;
            bad.map_or(Ok(out), Err)
        })
    }

    write_calls!(STORE, Store::write);

    fn commit(offset: u64) -> Result<(), Error> {
        STORE.with(|s| {
            s.flush()?;
            storage::write(
                &[
                    KeyspaceOps { keyspace: &s.undo, ops: vec![Op::Clear] },
                    KeyspaceOps { keyspace: &s.meta, ops: vec![put_u64(OFFSET, offset)] },
                ],
                true,
            )?;
            s.touched.clear();
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

export_store!(RollBack);
