//! `wipe-on-crash`: the non-transactional baseline.
//!
//! Writes go straight to the `data` keyspace; `commit` records the offset and
//! makes everything durable. The store cannot tell committed from uncommitted
//! writes, so both isolation levels read the same thing, and after an unclean
//! stop (no checkpoint) recovery wipes the store and the host replays the
//! whole changelog. This is what Kafka Streams does today under exactly-once.

use txstore_guest_kit::{
    check_options, check_range, export_store, put_u64, read_range, read_u64, storage, write_calls, Error, Guest,
    Isolation, Keyspace, KeyspaceOps, Level, MaybeValues, Op, Packed, Recovery, RecoveryAction, Slot, Writes,
};

const OFFSET: &[u8] = b"committed-offset";

struct Store {
    data: Keyspace,
    meta: Keyspace,
    uncommitted_bytes: u64,
}

static STORE: Slot<Store> = Slot::new();

impl Store {
    fn write(&mut self, writes: Writes) -> Result<(), Error> {
        let bytes = writes.bytes();
        writes.apply_to(&self.data)?;
        self.uncommitted_bytes += bytes;
        Ok(())
    }
}

struct WipeOnCrash;

impl Guest for WipeOnCrash {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        check_options("wipe-on-crash", &options, &[])?;
        STORE.set(Store { data: Keyspace::open("data")?, meta: Keyspace::open("meta")?, uncommitted_bytes: 0 });
        Ok(())
    }

    fn transactional() -> bool {
        false
    }

    fn recover(checkpointed: Option<u64>) -> Result<Recovery, Error> {
        STORE.with(|s| {
            let stored = read_offset(s)?;
            match (checkpointed, stored) {
                // A checkpoint means the last stop was clean (under exactly-once
                // the host removes it at start-up): the store holds that state.
                (Some(c), Some(o)) if o >= c => Ok(Recovery { offset: Some(c), action: RecoveryAction::Clean }),
                (None, None) if s.data.is_empty()? => Ok(Recovery { offset: None, action: RecoveryAction::Clean }),
                _ => {
                    storage::log(Level::Warn, "no usable checkpoint: wiping the store for a full replay");
                    storage::write(
                        &[
                            KeyspaceOps { keyspace: &s.data, ops: vec![Op::Clear] },
                            KeyspaceOps { keyspace: &s.meta, ops: vec![Op::Clear] },
                        ],
                        true,
                    )?;
                    s.uncommitted_bytes = 0;
                    Ok(Recovery { offset: None, action: RecoveryAction::Wiped })
                }
            }
        })
    }

    fn get(key: Vec<u8>, _: Isolation) -> Result<Option<Vec<u8>>, Error> {
        STORE.with(|s| s.data.get(&key))
    }

    fn get_many(keys: Packed, _: Isolation) -> Result<MaybeValues, Error> {
        keys.check(1, "get-many")?;
        STORE.with(|s| s.data.get_many(&keys))
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, _: Isolation, limit: u32) -> Result<Packed, Error> {
        check_range(&start, &end)?;
        STORE.with(|s| read_range(&s.data, start.as_deref(), end.as_deref(), limit))
    }

    write_calls!(STORE, Store::write);

    fn commit(offset: u64) -> Result<(), Error> {
        STORE.with(|s| {
            // The offset and every write before it become durable together.
            storage::write(&[KeyspaceOps { keyspace: &s.meta, ops: vec![put_u64(OFFSET, offset)] }], true)?;
            s.uncommitted_bytes = 0;
            Ok(())
        })
    }

    fn committed_offset() -> Result<Option<u64>, Error> {
        STORE.with(read_offset)
    }

    fn approximate_uncommitted_bytes() -> u64 {
        STORE.peek(0, |s| s.uncommitted_bytes)
    }
}

fn read_offset(s: &mut Store) -> Result<Option<u64>, Error> {
    read_u64(&s.meta, OFFSET)
}

export_store!(WipeOnCrash);
