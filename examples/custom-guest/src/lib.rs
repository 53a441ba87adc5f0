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
use txstore::store::types::{Entry, Error, MaybeValues, Packed};

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

/// String `i` of a packed buffer: `bytes[ends[i-1]..ends[i]]`.
fn string(p: &Packed, i: usize) -> &[u8] {
    let start = if i == 0 { 0 } else { p.ends[i - 1] as usize };
    &p.bytes[start..p.ends[i] as usize]
}

/// Appends one string to a packed buffer.
fn push(p: &mut Packed, s: &[u8]) {
    p.bytes.extend_from_slice(s);
    p.ends.push(p.bytes.len() as u32);
}

/// Refuses offsets that do not describe `bytes` (they would trap a read).
fn check(p: &Packed, per: usize) -> Result<(), Error> {
    let sorted = p.ends.windows(2).all(|w| w[0] <= w[1]);
    if p.ends.len() % per != 0 || !sorted || p.ends.last().map_or(0, |e| *e as usize) != p.bytes.len() {
        return Err(Error::InvalidArgument("malformed packed argument".into()));
    }
    Ok(())
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

    fn get_many(keys: Packed, isolation: Isolation) -> Result<MaybeValues, Error> {
        check(&keys, 1)?;
        with(|s| {
            let mut out = MaybeValues { values: Packed { bytes: Vec::new(), ends: Vec::new() }, found: Vec::new() };
            for i in 0..keys.ends.len() {
                let value = s.read(string(&keys, i), isolation)?;
                push(&mut out.values, value.as_deref().unwrap_or_default());
                out.found.push(value.is_some());
            }
            Ok(out)
        })
    }

    fn range(start: Option<Vec<u8>>, end: Option<Vec<u8>>, isolation: Isolation, limit: u32) -> Result<Packed, Error> {
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
                // A page of entries: key i is string 2i, its value 2i + 1.
                let page = cursor.next(1024)?;
                if page.ends.is_empty() {
                    break;
                }
                for i in 0..page.ends.len() / 2 {
                    view.insert(string(&page, 2 * i).to_vec(), string(&page, 2 * i + 1).to_vec());
                }
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
            let mut out = Packed { bytes: Vec::new(), ends: Vec::new() };
            for (key, value) in view.into_iter().take(limit as usize) {
                push(&mut out, &key);
                push(&mut out, &value);
            }
            Ok(out)
        })
    }

    fn put(key: Vec<u8>, value: Vec<u8>) -> Result<(), Error> {
        with(|s| Ok(s.write(key, Some(value))))
    }

    fn delete(key: Vec<u8>) -> Result<(), Error> {
        with(|s| Ok(s.write(key, None)))
    }

    fn put_many(entries: Packed) -> Result<(), Error> {
        check(&entries, 2)?;
        with(|s| {
            for i in 0..entries.ends.len() / 2 {
                s.write(string(&entries, 2 * i).to_vec(), Some(string(&entries, 2 * i + 1).to_vec()));
            }
            Ok(())
        })
    }

    fn delete_many(keys: Packed) -> Result<(), Error> {
        check(&keys, 1)?;
        with(|s| {
            for i in 0..keys.ends.len() {
                s.write(string(&keys, i).to_vec(), None);
            }
            Ok(())
        })
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
