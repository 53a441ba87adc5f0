//! `roll-forward`: the KIP-844 two-store design. Uncommitted writes go to
//! the `temp` keyspace (a put as its value then the byte 1, a delete as the
//! byte 0). Commit:
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
//! (before a read-uncommitted `get-many` or `range` and before commit; a
//! `get` of a held key is answered from memory).

use txstore_guest_kit::{
    apply_tagged, check_options, check_range, export_store, merge, put_u64, read_range, read_u64, recovered, storage,
    write_calls, CursorIter, Entry, Error, Guest, Isolation, Keyspace, KeyspaceOps, MaybeValues, Op, Packed, Pending,
    Recovery, RecoveryAction, Slot, Tagged, Writes,
};

const OFFSET: &[u8] = b"committed-offset";
const MARKER: &[u8] = b"commit-marker";
/// Staged values in `temp`: the tag after the value, so staging and copying
/// a value never shifts its bytes.
const STAGED: Tagged = Tagged::Last;
/// Ends the marker, after the offset: the `temp` it guards is in the second
/// layout, `STAGED`. The first (the tag before the value) had the offset alone.
const STAGED_LAYOUT: u8 = 2;

struct Store {
    main: Keyspace,
    temp: Keyspace,
    meta: Keyspace,
    /// Writes not yet in `temp`.
    pending: Pending,
    bytes: u64,
}

static STORE: Slot<Store> = Slot::new();

fn untag(stored: Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
    STAGED.decode(stored, "temp")
}

fn marker(offset: u64) -> Op {
    let mut value = offset.to_be_bytes().to_vec();
    value.push(STAGED_LAYOUT);
    Op::Put(Entry { key: MARKER.to_vec(), value })
}

/// The offset of the commit a marker guards. Refuses a marker of an earlier
/// version: a copy of its `temp` read in this layout would be silently wrong.
fn marker_offset(value: &[u8]) -> Result<u64, Error> {
    if let Some((&STAGED_LAYOUT, offset)) = value.split_last() {
        if let Ok(offset) = <[u8; 8]>::try_from(offset) {
            return Ok(u64::from_be_bytes(offset));
        }
    }
    Err(Error::Corrupt(match <[u8; 8]>::try_from(value) {
        Ok(offset) => format!(
            "roll-forward: the commit of offset {} was interrupted under an earlier roll-forward, which staged values \
             in `temp` with their tag byte first; this version would misread them. Finish that commit with the txstore \
             that wrote it (`txstore recover`), then upgrade",
            u64::from_be_bytes(offset)
        ),
        Err(_) => format!(
            "roll-forward: the commit marker ({} bytes) is not an 8-byte offset followed by the byte {STAGED_LAYOUT}",
            value.len()
        ),
    }))
}

impl Store {
    fn stage(&mut self, writes: Writes) -> Result<(), Error> {
        self.bytes += writes.bytes();
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
        let mut staged = Packed::new();
        for (key, value) in self.pending.take().iter().flat_map(Writes::iter) {
            staged.push(key);
            STAGED.encode_into(value, &mut staged);
        }
        storage::write(&[KeyspaceOps { keyspace: &self.temp, ops: vec![Op::PutMany(staged)] }], false)
    }

    /// Step 2: copies `temp` into `main`, a cursor page per call.
    fn copy_temp_to_main(&self) -> Result<(), Error> {
        apply_tagged(&self.temp, &self.main, STAGED, "temp")
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
            if let Some(marker) = s.meta.get(MARKER)? {
                let offset = marker_offset(&marker)?;
                s.finish_commit(offset)?;
                return Ok(Recovery { offset: Some(offset), action: RecoveryAction::RolledForward });
            }
            let had_temp = !s.temp.is_empty()?;
            if had_temp {
                storage::write(&[KeyspaceOps { keyspace: &s.temp, ops: vec![Op::Clear] }], true)?;
            }
            s.bytes = 0;
            recovered(checkpointed, read_u64(&s.meta, OFFSET)?, had_temp.then_some(RecoveryAction::Discarded))
        })
    }

    fn get(key: Vec<u8>, isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        STORE.with(|s| {
            if isolation == Isolation::ReadUncommitted {
                // A held write answers without a flush; then `temp`.
                if let Some(held) = s.pending.latest(&key) {
                    return Ok(held.map(<[u8]>::to_vec));
                }
                if let Some(t) = s.temp.get(&key)? {
                    return untag(t);
                }
            }
            s.main.get(&key)
        })
    }

    fn get_many(keys: Packed, isolation: Isolation) -> Result<MaybeValues, Error> {
        keys.check(1, "get-many")?;
        STORE.with(|s| {
            if isolation == Isolation::ReadCommitted {
                return s.main.get_many(&keys);
            }
            s.flush()?;
            let staged = s.temp.get_many(&keys)?;
            let mut misses = Packed::new();
            for (k, t) in keys.strings().zip(staged.iter()) {
                if t.is_none() {
                    misses.push(k);
                }
            }
            let committed = s.main.get_many(&misses)?;
            let mut committed = committed.iter();
            let mut out = MaybeValues::new();
            for t in staged.iter() {
                match t {
                    Some(t) => out.push(STAGED.decode_slice(t, "temp")?),
                    None => out.push(committed.next().flatten()),
                }
            }
            Ok(out)
        })
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, isolation: Isolation, limit: u32) -> Result<Packed, Error> {
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

    write_calls!(STORE, Store::stage);

    fn commit(offset: u64) -> Result<(), Error> {
        STORE.with(|s| {
            s.flush()?;
            if s.bytes == 0 && s.temp.is_empty()? {
                // Nothing staged: no copy to protect, just the offset.
                let ops = vec![put_u64(OFFSET, offset)];
                return storage::write(&[KeyspaceOps { keyspace: &s.meta, ops }], true);
            }
            storage::write(&[KeyspaceOps { keyspace: &s.meta, ops: vec![marker(offset)] }], false)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_holds_its_offset_and_the_layout_of_temp() {
        for offset in [0, 1, 0x0102_0304_0506_0708, u64::MAX] {
            let Op::Put(Entry { key, value }) = marker(offset) else { panic!("not a put") };
            assert_eq!(key, MARKER);
            assert_eq!(value.len(), 9);
            assert_eq!(marker_offset(&value).unwrap(), offset);
        }
    }

    #[test]
    fn a_marker_of_an_earlier_version_is_refused() {
        // 8 bytes, the offset alone, whatever its last byte.
        for offset in [7u64, 2, 0x0102] {
            let err = marker_offset(&offset.to_be_bytes()).unwrap_err();
            let expected = format!("the commit of offset {offset} was interrupted under an earlier roll-forward");
            assert!(matches!(&err, Error::Corrupt(m) if m.contains(&expected)), "{err:?}");
        }
        for value in [vec![], vec![STAGED_LAYOUT], vec![0; 9], [&[0u8; 9][..], &[STAGED_LAYOUT]].concat()] {
            let err = marker_offset(&value).unwrap_err();
            let expected = format!(
                "roll-forward: the commit marker ({} bytes) is not an 8-byte offset followed by the byte 2",
                value.len()
            );
            assert!(matches!(&err, Error::Corrupt(m) if *m == expected), "{value:?}: {err:?}");
        }
    }
}
