//! Writes as a call brings them (`Writes`), the four write calls as one
//! (`write_calls!`), and writes held in guest memory until a flush
//! (`Pending`).

use crate::{storage, Entry, Error, Keyspace, KeyspaceOps, Op, Packed};

/// Uncommitted writes held in guest memory until there are enough to hand
/// to storage in one call: a host call per write is most of what a guest
/// store costs over plain RocksDB. Lost in a crash, as unsynced writes are.
/// Held as the calls brought them (a `put-many` stays one packed buffer).
#[derive(Default)]
pub struct Pending {
    calls: Vec<Writes>,
    writes: usize,
    bytes: usize,
}

impl Pending {
    /// Writes held before a flush...
    pub const MAX_WRITES: usize = 256;
    /// ...or bytes of keys and values, whichever comes first.
    pub const MAX_BYTES: usize = 256 << 10;

    /// Adds one call's `writes` (after those held); true when the buffer
    /// should be flushed.
    pub fn push(&mut self, writes: Writes) -> bool {
        self.bytes += writes.bytes() as usize;
        self.writes += writes.len();
        self.calls.push(writes);
        self.writes >= Self::MAX_WRITES || self.bytes >= Self::MAX_BYTES
    }

    /// Everything held, in write order, leaving the buffer empty.
    pub fn take(&mut self) -> Vec<Writes> {
        self.bytes = 0;
        self.writes = 0;
        std::mem::take(&mut self.calls)
    }

    pub fn is_empty(&self) -> bool {
        self.calls.iter().all(Writes::is_empty)
    }

    /// The latest held write of `key`: `Some(Some(value))`, `Some(None)`
    /// for a delete, `None` when no held write touches it. A read answered
    /// here needs no flush, so a get between writes leaves the batch whole
    /// (at most `MAX_WRITES` plus one call's writes are searched).
    pub fn latest(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.calls.iter().rev().find_map(|call| call.iter().filter(|(k, _)| *k == key).last().map(|(_, v)| v))
    }
}

/// One uncommitted write: a key and its new value, or `None` for a delete.
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// The writes of one write call, as the host sent them: a batch stays one
/// packed buffer, so a strategy that hands it on to storage touches no
/// entry of it.
#[derive(Clone, Debug)]
pub enum Writes {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Checked `entries`.
    PutMany(Packed),
    /// Checked `keys`.
    DeleteMany(Packed),
}

impl Writes {
    /// A `put-many`'s entries, refused when malformed.
    pub fn put_many(entries: Packed) -> Result<Self, Error> {
        entries.check(2, "put-many")?;
        Ok(Writes::PutMany(entries))
    }

    /// A `delete-many`'s keys, refused when malformed.
    pub fn delete_many(keys: Packed) -> Result<Self, Error> {
        keys.check(1, "delete-many")?;
        Ok(Writes::DeleteMany(keys))
    }

    /// Each write in call order: a key, and its value or `None`.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&[u8], Option<&[u8]>)> + '_> {
        match self {
            Writes::Put(k, v) => Box::new(std::iter::once((k.as_slice(), Some(v.as_slice())))),
            Writes::Delete(k) => Box::new(std::iter::once((k.as_slice(), None))),
            Writes::PutMany(p) => Box::new(p.entries().map(|(k, v)| (k, Some(v)))),
            Writes::DeleteMany(p) => Box::new(p.strings().map(|k| (k, None))),
        }
    }

    /// The number of writes.
    pub fn len(&self) -> usize {
        match self {
            Writes::Put(..) | Writes::Delete(_) => 1,
            Writes::PutMany(p) => p.entries_len(),
            Writes::DeleteMany(p) => p.strings_len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of keys and values (a delete counts its key).
    pub fn bytes(&self) -> u64 {
        (match self {
            Writes::Put(k, v) => k.len() + v.len(),
            Writes::Delete(k) => k.len(),
            Writes::PutMany(p) | Writes::DeleteMany(p) => p.bytes.len(),
        }) as u64
    }

    /// The storage operation that applies these writes.
    pub fn into_op(self) -> Op {
        match self {
            Writes::Put(key, value) => Op::Put(Entry { key, value }),
            Writes::Delete(key) => Op::Delete(key),
            Writes::PutMany(p) => Op::PutMany(p),
            Writes::DeleteMany(p) => Op::DeleteMany(p),
        }
    }

    /// Applies these writes to `ks` with the cheapest storage call for
    /// their shape: a single put or delete as itself (two byte strings
    /// lowered, no batch to build and lift), a batch as one `write`.
    pub fn apply_to(self, ks: &Keyspace) -> Result<(), Error> {
        match self {
            Writes::Put(key, value) => ks.put(&key, &value),
            Writes::Delete(key) => ks.delete(&key),
            many => storage::write(&[KeyspaceOps { keyspace: ks, ops: vec![many.into_op()] }], false),
        }
    }

    /// Each write as an owned pair, for a strategy that keeps them apart.
    pub fn into_vec(self) -> Vec<Write> {
        match self {
            Writes::Put(k, v) => vec![(k, Some(v))],
            Writes::Delete(k) => vec![(k, None)],
            other => other.iter().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect(),
        }
    }
}

/// Implements `put`, `delete`, `put-many` and `delete-many` inside
/// `impl Guest`: each hands its writes, in call order, to
/// `$write(&mut store, Writes)` on the store in the `Slot` `$slot`, so a
/// strategy handles one kind of call (a malformed batch is refused first).
/// `$write` applies all of a batch or, returning an error, none of it (the
/// WIT's rule for each of the four).
///
/// ```ignore
/// impl Guest for MyGuest {
///     write_calls!(STORE, Store::write);
///     // ...
/// }
/// ```
#[macro_export]
macro_rules! write_calls {
    ($slot:expr, $write:path) => {
        fn put(key: Vec<u8>, value: Vec<u8>) -> Result<(), $crate::Error> {
            $slot.with(|s| $write(s, $crate::Writes::Put(key, value)))
        }

        fn delete(key: Vec<u8>) -> Result<(), $crate::Error> {
            $slot.with(|s| $write(s, $crate::Writes::Delete(key)))
        }

        fn put_many(entries: $crate::Packed) -> Result<(), $crate::Error> {
            let writes = $crate::Writes::put_many(entries)?;
            $slot.with(|s| $write(s, writes))
        }

        fn delete_many(keys: $crate::Packed) -> Result<(), $crate::Error> {
            let writes = $crate::Writes::delete_many(keys)?;
            $slot.with(|s| $write(s, writes))
        }
    };
}

/// The storage operation that applies `write`.
pub fn write_op((key, value): Write) -> Op {
    match value {
        Some(value) => Op::Put(Entry { key, value }),
        None => Op::Delete(key),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;

    use crate::Slot;

    struct Calls;

    static CALLS: Slot<Vec<Vec<Write>>> = Slot::new();

    fn record(calls: &mut Vec<Vec<Write>>, writes: Writes) -> Result<(), Error> {
        if writes.iter().any(|(k, _)| k == b"refused") {
            return Err(Error::UncommittedLimit(7));
        }
        calls.push(writes.into_vec());
        Ok(())
    }

    impl Calls {
        write_calls!(CALLS, record);
    }

    #[test]
    fn each_write_call_hands_its_writes_over_in_order() {
        CALLS.set(Vec::new());
        Calls::put(b"a".to_vec(), b"1".to_vec()).unwrap();
        Calls::put(b"e".to_vec(), Vec::new()).unwrap();
        Calls::delete(b"b".to_vec()).unwrap();
        Calls::put_many(packed(&["d", "4", "c", "3", "d", "5"])).unwrap();
        Calls::put_many(Packed::new()).unwrap();
        Calls::delete_many(packed(&["z", ""])).unwrap();
        assert!(matches!(Calls::delete_many(packed(&["refused"])), Err(Error::UncommittedLimit(7))));
        assert!(matches!(Calls::put_many(packed(&["odd"])), Err(Error::InvalidArgument(_))));
        let calls = CALLS.peek(Vec::new(), Clone::clone);
        assert_eq!(
            calls,
            vec![
                vec![w("a", Some("1"))],
                vec![w("e", Some(""))],
                vec![w("b", None)],
                vec![w("d", Some("4")), w("c", Some("3")), w("d", Some("5"))],
                vec![],
                vec![w("z", None), w("", None)],
            ]
        );
    }

    #[test]
    fn the_latest_held_write_of_a_key_answers_a_read() {
        let mut p = Pending::default();
        assert_eq!(p.latest(b"a"), None);
        p.push(Writes::Put(b"a".to_vec(), b"1".to_vec()));
        p.push(Writes::put_many(packed(&["b", "2", "a", "3", "a", ""])).unwrap());
        p.push(Writes::Delete(b"b".to_vec()));
        p.push(Writes::delete_many(packed(&["c"])).unwrap());
        assert_eq!(p.latest(b"a"), Some(Some(&b""[..])));
        assert_eq!(p.latest(b"b"), Some(None));
        assert_eq!(p.latest(b"c"), Some(None));
        assert_eq!(p.latest(b"d"), None);
        p.push(Writes::Put(b"b".to_vec(), b"4".to_vec()));
        assert_eq!(p.latest(b"b"), Some(Some(&b"4"[..])));
        p.take();
        assert_eq!(p.latest(b"a"), None);
    }

    #[test]
    fn writes_count_and_become_one_storage_operation() {
        let many = Writes::put_many(packed(&["b", "22", "a", ""])).unwrap();
        assert_eq!((many.len(), many.bytes()), (2, 4));
        let want = packed(&["b", "22", "a", ""]);
        assert!(matches!(many.into_op(), Op::PutMany(p) if (&p.bytes, &p.ends) == (&want.bytes, &want.ends)));
        let gone = Writes::delete_many(packed(&["k", ""])).unwrap();
        assert_eq!((gone.len(), gone.bytes(), gone.is_empty()), (2, 1, false));
        let want = packed(&["k", ""]);
        assert!(matches!(gone.into_op(), Op::DeleteMany(p) if (&p.bytes, &p.ends) == (&want.bytes, &want.ends)));
        assert!(Writes::put_many(Packed::new()).unwrap().is_empty());
        assert_eq!(Writes::Put(b"k".to_vec(), b"vv".to_vec()).bytes(), 3);
        assert_eq!(Writes::Delete(b"kk".to_vec()).bytes(), 2);
    }

    #[test]
    fn a_write_becomes_a_put_or_a_delete() {
        assert!(matches!(write_op(w("k", Some("v"))), Op::Put(Entry { key, value }) if key == b"k" && value == b"v"));
        assert!(matches!(write_op(w("k", Some(""))), Op::Put(Entry { key, value }) if key == b"k" && value.is_empty()));
        assert!(matches!(write_op(w("k", None)), Op::Delete(key) if key == b"k"));
    }
}
