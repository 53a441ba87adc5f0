//! A minimal transactional strategy to start from: uncommitted writes wait
//! in an ordered map; `commit` writes them and the offset in one atomic,
//! synced batch; a crash loses the map and nothing else, so `recover` only
//! reads the stored offset. (The built-in `buffered` guest is this design
//! with a memory limit.)

// Point `path` at your copy of txstore's wit/ directory.
wit_bindgen::generate!({ path: "../../wit", world: "store" });

use exports::txstore::store::state_store::{Guest, Isolation, Recovery, RecoveryAction};
use std::cell::RefCell;
use std::collections::BTreeMap;
use txstore::store::storage::{self, Keyspace, KeyspaceOps, Op};
use txstore::store::types::{Entry, Error};

const OFFSET: &[u8] = b"offset";

struct Store {
    data: Keyspace,
    meta: Keyspace,
    /// key -> Some(value) for a put, None for a delete.
    open: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    bytes: u64,
}

thread_local! {
    static STORE: RefCell<Option<Store>> = const { RefCell::new(None) };
}

fn with<R>(f: impl FnOnce(&mut Store) -> Result<R, Error>) -> Result<R, Error> {
    STORE.with(|s| match s.borrow_mut().as_mut() {
        Some(s) => f(s),
        None => Err(Error::Other("init was not called".into())),
    })
}

fn stored_offset(meta: &Keyspace) -> Result<Option<u64>, Error> {
    match meta.get(OFFSET)? {
        None => Ok(None),
        Some(v) => v
            .try_into()
            .map(|b| Some(u64::from_be_bytes(b)))
            .map_err(|_| Error::Corrupt("stored offset is not 8 bytes".into())),
    }
}

impl Store {
    fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.bytes += (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
        self.open.insert(key, value);
    }

    fn read(&self, key: &[u8], isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        if isolation == Isolation::ReadUncommitted {
            if let Some(v) = self.open.get(key) {
                return Ok(v.clone());
            }
        }
        self.data.get(key)
    }
}

struct Custom;

impl Guest for Custom {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        if let Some((name, _)) = options.first() {
            return Err(Error::InvalidArgument(format!("custom-guest: unknown option `{name}`")));
        }
        let store = Store { data: Keyspace::open("data")?, meta: Keyspace::open("meta")?, open: BTreeMap::new(), bytes: 0 };
        STORE.with(|s| *s.borrow_mut() = Some(store));
        Ok(())
    }

    fn transactional() -> bool {
        true
    }

    fn recover(checkpointed: Option<u64>) -> Result<Recovery, Error> {
        with(|s| {
            s.open.clear();
            s.bytes = 0;
            let stored = stored_offset(&s.meta)?;
            if checkpointed > stored {
                return Err(Error::Corrupt(format!("checkpoint {checkpointed:?} is ahead of the store ({stored:?})")));
            }
            let action = if checkpointed == stored { RecoveryAction::Clean } else { RecoveryAction::Discarded };
            Ok(Recovery { offset: stored, action })
        })
    }

    fn get(key: Vec<u8>, isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        with(|s| s.read(&key, isolation))
    }

    fn get_many(keys: Vec<Vec<u8>>, isolation: Isolation) -> Result<Vec<Option<Vec<u8>>>, Error> {
        with(|s| keys.iter().map(|k| s.read(k, isolation)).collect())
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, isolation: Isolation, limit: u32) -> Result<Vec<Entry>, Error> {
        if let (Some(a), Some(b)) = (&start, &end) {
            if a > b {
                return Err(Error::InvalidArgument("range start is after its end".into()));
            }
        }
        with(|s| {
            // Committed entries, then the open transaction over them.
            let cursor = s.data.scan(start.as_deref(), end.as_deref())?;
            let mut view = BTreeMap::new();
            loop {
                let batch = cursor.next(1024)?;
                if batch.is_empty() {
                    break;
                }
                view.extend(batch.into_iter().map(|e| (e.key, e.value)));
            }
            if isolation == Isolation::ReadUncommitted {
                let inside = |k: &Vec<u8>| start.as_ref().is_none_or(|a| k >= a) && end.as_ref().is_none_or(|b| k < b);
                for (k, v) in s.open.iter().filter(|(k, _)| inside(k)) {
                    match v {
                        Some(v) => view.insert(k.clone(), v.clone()),
                        None => view.remove(k),
                    };
                }
            }
            Ok(view.into_iter().take(limit as usize).map(|(key, value)| Entry { key, value }).collect())
        })
    }

    fn put(key: Vec<u8>, value: Vec<u8>) -> Result<(), Error> {
        with(|s| Ok(s.write(key, Some(value))))
    }

    fn delete(key: Vec<u8>) -> Result<(), Error> {
        with(|s| Ok(s.write(key, None)))
    }

    fn put_many(entries: Vec<Entry>) -> Result<(), Error> {
        with(|s| Ok(entries.into_iter().for_each(|e| s.write(e.key, Some(e.value)))))
    }

    fn delete_many(keys: Vec<Vec<u8>>) -> Result<(), Error> {
        with(|s| Ok(keys.into_iter().for_each(|k| s.write(k, None))))
    }

    fn commit(offset: u64) -> Result<(), Error> {
        with(|s| {
            let ops = std::mem::take(&mut s.open)
                .into_iter()
                .map(|(key, v)| match v {
                    Some(value) => Op::Put(Entry { key, value }),
                    None => Op::Delete(key),
                })
                .collect();
            let offset_op = Op::Put(Entry { key: OFFSET.to_vec(), value: offset.to_be_bytes().to_vec() });
            s.bytes = 0;
            // One atomic, synced batch: data and offset together or neither.
            storage::write(
                &[KeyspaceOps { keyspace: &s.data, ops }, KeyspaceOps { keyspace: &s.meta, ops: vec![offset_op] }],
                true,
            )
        })
    }

    fn committed_offset() -> Result<Option<u64>, Error> {
        with(|s| stored_offset(&s.meta))
    }

    fn approximate_uncommitted_bytes() -> u64 {
        STORE.with(|s| s.borrow().as_ref().map_or(0, |s| s.bytes))
    }
}

export!(Custom);
