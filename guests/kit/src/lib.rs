//! What every Rust strategy needs besides its own algorithm: the bindings
//! of `wit/store.wit`, the four write calls as one, tagged values, the
//! recovery verdict, offset records, cursors and the ordered merge.

pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "store",
        pub_export_macro: true,
        export_macro_name: "export_store",
        default_bindings_module: "txstore_guest_kit::bindings",
    });
}

pub use bindings::export_store;
pub use bindings::exports::txstore::store::state_store::{Guest, Isolation, Recovery, RecoveryAction};
pub use bindings::txstore::store::storage::{self, Cursor, Keyspace, KeyspaceOps, Level, Op};
pub use bindings::txstore::store::types::{Entry, Error};

use std::collections::VecDeque;

/// Entries fetched per cursor call.
pub const CURSOR_BATCH: u32 = 1024;

/// Bytes of keys and values in `writes` (a delete counts its key).
pub fn write_bytes(writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> u64 {
    writes.iter().map(|(k, v)| (k.len() + v.as_ref().map_or(0, Vec::len)) as u64).sum()
}

/// Uncommitted writes held in guest memory until there are enough to hand
/// to storage in one call: a host call per write is most of what a guest
/// store costs over plain RocksDB. Lost in a crash, as unsynced writes are.
#[derive(Default)]
pub struct Pending {
    writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    bytes: usize,
}

impl Pending {
    /// Writes held before a flush...
    pub const MAX_WRITES: usize = 256;
    /// ...or bytes of keys and values, whichever comes first.
    pub const MAX_BYTES: usize = 256 << 10;

    /// Adds `writes` (in order); true when the buffer should be flushed.
    pub fn push(&mut self, writes: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> bool {
        self.bytes += write_bytes(&writes) as usize;
        self.writes.extend(writes);
        self.writes.len() >= Self::MAX_WRITES || self.bytes >= Self::MAX_BYTES
    }

    /// Everything held, in write order, leaving the buffer empty.
    pub fn take(&mut self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        self.bytes = 0;
        std::mem::take(&mut self.writes)
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

/// Reads a big-endian u64 stored under `key`.
pub fn read_u64(ks: &Keyspace, key: &[u8]) -> Result<Option<u64>, Error> {
    match ks.get(key)? {
        None => Ok(None),
        Some(bytes) => match <[u8; 8]>::try_from(bytes.as_slice()) {
            Ok(b) => Ok(Some(u64::from_be_bytes(b))),
            Err(_) => Err(Error::Corrupt(format!(
                "value under {:?} has {} bytes, expected 8",
                String::from_utf8_lossy(key),
                bytes.len()
            ))),
        },
    }
}

/// The put of a big-endian u64, as a batch operation.
pub fn put_u64(key: &[u8], value: u64) -> Op {
    Op::Put(Entry { key: key.to_vec(), value: value.to_be_bytes().to_vec() })
}

/// A storage cursor as an iterator. A storage error ends the iteration
/// and is kept in `error` for the caller to check.
pub struct CursorIter {
    cursor: Cursor,
    buf: VecDeque<Entry>,
    done: bool,
    /// Entries asked for by the next cursor call: small first (a read of
    /// one entry should not copy a thousand), doubling to `CURSOR_BATCH`.
    fetch: u32,
    pub error: Option<Error>,
}

impl CursorIter {
    pub fn new(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<Self, Error> {
        Self::expecting(ks, start, end, CURSOR_BATCH)
    }

    /// A cursor for a read that wants about `wanted` entries (a range's
    /// limit): its first call fetches that many, later ones more.
    pub fn expecting(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>, wanted: u32) -> Result<Self, Error> {
        Ok(Self {
            cursor: ks.scan(start, end)?,
            buf: VecDeque::new(),
            done: false,
            fetch: wanted.clamp(1, CURSOR_BATCH),
            error: None,
        })
    }

    /// The error that ended the iteration, if one did.
    pub fn finish(self) -> Result<(), Error> {
        self.error.map_or(Ok(()), Err)
    }
}

impl Iterator for CursorIter {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if self.buf.is_empty() && !self.done {
            match self.cursor.next(self.fetch) {
                Ok(batch) if batch.is_empty() => self.done = true,
                Ok(batch) => {
                    self.buf.extend(batch);
                    self.fetch = (self.fetch * 2).min(CURSOR_BATCH);
                }
                Err(e) => {
                    self.error = Some(e);
                    self.done = true;
                }
            }
        }
        self.buf.pop_front()
    }
}

/// Merges `overlay` (key, Some(value) or None for a delete) over `base`,
/// both in key order, into at most `limit` live entries.
pub fn merge(
    base: impl Iterator<Item = Entry>,
    overlay: impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
    limit: u32,
) -> Vec<Entry> {
    let mut base = base.peekable();
    let mut overlay = overlay.peekable();
    let mut out = Vec::new();
    while (out.len() as u32) < limit {
        let take_overlay = match (base.peek(), overlay.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(b), Some((k, _))) => {
                if *k <= b.key {
                    if *k == b.key {
                        base.next();
                    }
                    true
                } else {
                    false
                }
            }
        };
        if take_overlay {
            let (key, value) = overlay.next().unwrap();
            if let Some(value) = value {
                out.push(Entry { key, value });
            }
        } else {
            out.push(base.next().unwrap());
        }
    }
    out
}

/// Reads up to `limit` entries of [start, end) from `ks`.
pub fn read_range(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>, limit: u32) -> Result<Vec<Entry>, Error> {
    let mut it = CursorIter::expecting(ks, start, end, limit)?;
    let out: Vec<Entry> = it.by_ref().take(limit as usize).collect();
    it.finish()?;
    Ok(out)
}

/// `Some(start..end)` bounds as a `BTreeMap` range argument.
pub fn bounds(start: Option<Vec<u8>>, end: Option<Vec<u8>>) -> (std::ops::Bound<Vec<u8>>, std::ops::Bound<Vec<u8>>) {
    use std::ops::Bound::*;
    (start.map_or(Unbounded, Included), end.map_or(Unbounded, Excluded))
}

/// Checks a range's bounds the way the host does.
pub fn check_range(start: &Option<Vec<u8>>, end: &Option<Vec<u8>>) -> Result<(), Error> {
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(Error::InvalidArgument("range start is after its end".into()));
        }
    }
    Ok(())
}

/// Refuses every `init` option but those in `known`.
pub fn check_options(guest: &str, options: &[(String, String)], known: &[&str]) -> Result<(), Error> {
    for (name, _) in options {
        if !known.contains(&name.as_str()) {
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            return Err(Error::InvalidArgument(format!("{guest}: unknown option `{name}` (known: {known})")));
        }
    }
    Ok(())
}

/// The guest's single store, set by `init`.
pub struct Slot<T>(std::cell::RefCell<Option<T>>);

impl<T> Slot<T> {
    pub const fn new() -> Self {
        Self(std::cell::RefCell::new(None))
    }

    pub fn set(&self, value: T) {
        *self.0.borrow_mut() = Some(value);
    }

    /// Runs `f` on the store, or fails if `init` was not called.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> Result<R, Error>) -> Result<R, Error> {
        match self.0.borrow_mut().as_mut() {
            Some(t) => f(t),
            None => Err(Error::Other("init was not called".into())),
        }
    }

    /// `f` on the store, or `default` before `init`.
    pub fn peek<R>(&self, default: R, f: impl FnOnce(&T) -> R) -> R {
        self.0.borrow().as_ref().map_or(default, f)
    }
}

// A guest is single-threaded; calls never overlap.
unsafe impl<T> Sync for Slot<T> {}

/// One uncommitted write: a key and its new value, or `None` for a delete.
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// The writes of a `put-many`, in call order.
pub fn puts(entries: Vec<Entry>) -> Vec<Write> {
    entries.into_iter().map(|e| (e.key, Some(e.value))).collect()
}

/// The writes of a `delete-many`, in call order.
pub fn deletes(keys: Vec<Vec<u8>>) -> Vec<Write> {
    keys.into_iter().map(|k| (k, None)).collect()
}

/// Implements `put`, `delete`, `put-many` and `delete-many` inside
/// `impl Guest`: each hands its writes, in call order, to
/// `$write(&mut store, Vec<Write>)` on the store in the `Slot` `$slot`, so a
/// strategy handles one kind of call. `$write` applies all of a batch or,
/// returning an error, none of it (the WIT's rule for each of the four).
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
            $slot.with(|s| $write(s, vec![(key, Some(value))]))
        }

        fn delete(key: Vec<u8>) -> Result<(), $crate::Error> {
            $slot.with(|s| $write(s, vec![(key, None)]))
        }

        fn put_many(entries: Vec<$crate::Entry>) -> Result<(), $crate::Error> {
            $slot.with(|s| $write(s, $crate::puts(entries)))
        }

        fn delete_many(keys: Vec<Vec<u8>>) -> Result<(), $crate::Error> {
            $slot.with(|s| $write(s, $crate::deletes(keys)))
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

/// Tag byte of a value that is there...
pub const PRESENT: u8 = 1;
/// ...and of one that is not: the whole stored value.
pub const ABSENT: u8 = 0;

/// A value or its absence as one stored value, for a keyspace that must
/// record both (a staged delete, a key that did not exist): `PRESENT` with
/// the value, or `ABSENT` alone. The variant says where the tag byte goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tagged {
    /// Before the value: adding or removing it shifts every byte of the value.
    First,
    /// After the value: adding or removing it shifts nothing.
    Last,
}

impl Tagged {
    pub fn encode(self, value: Option<Vec<u8>>) -> Vec<u8> {
        match value {
            Some(mut v) => {
                // Room for the tag alone, not twice the value (a full vector doubles).
                v.reserve_exact(1);
                match self {
                    Tagged::First => v.insert(0, PRESENT),
                    Tagged::Last => v.push(PRESENT),
                }
                v
            }
            None => vec![ABSENT],
        }
    }

    /// The value `encode` was given; anything it cannot have written is
    /// `corrupt`, naming `keyspace`.
    pub fn decode(self, mut stored: Vec<u8>, keyspace: &str) -> Result<Option<Vec<u8>>, Error> {
        let tag = match self {
            Tagged::First => stored.first(),
            Tagged::Last => stored.last(),
        };
        match tag {
            Some(&PRESENT) => {
                match self {
                    Tagged::First => {
                        stored.remove(0);
                    }
                    Tagged::Last => stored.truncate(stored.len() - 1),
                }
                Ok(Some(stored))
            }
            Some(&ABSENT) if stored.len() == 1 => Ok(None),
            _ => Err(Error::Corrupt(format!("{keyspace} keyspace holds a value without a valid tag"))),
        }
    }
}

/// What a transactional store's `recover` returns once storage holds its
/// committed state at offset `stored`. `found` is what it did with writes
/// of the open transaction it found in storage (`None`: there were none);
/// with none, `clean` means the host's checkpoint is this very state.
/// A checkpoint ahead of `stored` means a commit the host saw return is
/// missing: corrupt, never papered over by a replay.
pub fn recovered(
    checkpointed: Option<u64>,
    stored: Option<u64>,
    found: Option<RecoveryAction>,
) -> Result<Recovery, Error> {
    if checkpointed > stored {
        return Err(Error::Corrupt(format!(
            "the checkpoint says offset {checkpointed:?} but the store committed only {stored:?}"
        )));
    }
    let action = match found {
        Some(action) => action,
        None if checkpointed == stored => RecoveryAction::Clean,
        None => RecoveryAction::Discarded,
    };
    Ok(Recovery { offset: stored, action })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(key: &str, value: Option<&str>) -> Write {
        (key.as_bytes().to_vec(), value.map(|v| v.as_bytes().to_vec()))
    }

    fn entry(key: &str, value: &str) -> Entry {
        Entry { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec() }
    }

    struct Calls;

    static CALLS: Slot<Vec<Vec<Write>>> = Slot::new();

    fn record(calls: &mut Vec<Vec<Write>>, writes: Vec<Write>) -> Result<(), Error> {
        if writes.iter().any(|(k, _)| k == b"refused") {
            return Err(Error::UncommittedLimit(7));
        }
        calls.push(writes);
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
        Calls::put_many(vec![entry("d", "4"), entry("c", "3"), entry("d", "5")]).unwrap();
        Calls::put_many(Vec::new()).unwrap();
        Calls::delete_many(vec![b"z".to_vec(), b"".to_vec()]).unwrap();
        assert!(matches!(Calls::delete_many(vec![b"refused".to_vec()]), Err(Error::UncommittedLimit(7))));
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
    fn puts_and_deletes_keep_call_order() {
        assert_eq!(puts(vec![entry("b", "2"), entry("a", "")]), vec![w("b", Some("2")), w("a", Some(""))]);
        assert_eq!(deletes(vec![b"b".to_vec(), b"a".to_vec()]), vec![w("b", None), w("a", None)]);
        assert!(puts(Vec::new()).is_empty() && deletes(Vec::new()).is_empty());
    }

    #[test]
    fn a_write_becomes_a_put_or_a_delete() {
        assert!(matches!(write_op(w("k", Some("v"))), Op::Put(Entry { key, value }) if key == b"k" && value == b"v"));
        assert!(matches!(write_op(w("k", Some(""))), Op::Put(Entry { key, value }) if key == b"k" && value.is_empty()));
        assert!(matches!(write_op(w("k", None)), Op::Delete(key) if key == b"k"));
    }

    #[test]
    fn tagged_values_round_trip_with_the_tag_where_it_is_asked() {
        for (tagged, put) in [(Tagged::First, vec![PRESENT, 0, 7]), (Tagged::Last, vec![0, 7, PRESENT])] {
            assert_eq!(tagged.encode(Some(vec![0, 7])), put);
            assert_eq!(tagged.encode(Some(Vec::new())), vec![PRESENT]);
            assert_eq!(tagged.encode(None), vec![ABSENT]);
            for value in [None, Some(vec![]), Some(vec![ABSENT]), Some(vec![PRESENT]), Some(vec![1, 0, 0, 1])] {
                assert_eq!(tagged.decode(tagged.encode(value.clone()), "temp").unwrap(), value);
            }
        }
        assert_eq!(PRESENT, 1, "stored by earlier versions");
        assert_eq!(ABSENT, 0, "stored by earlier versions");
    }

    #[test]
    fn a_value_without_a_valid_tag_is_corrupt() {
        for tagged in [Tagged::First, Tagged::Last] {
            // Empty, an unknown tag, and bytes with an `absent` tag.
            for stored in [vec![], vec![2], vec![ABSENT, ABSENT], vec![ABSENT, 5], vec![5, ABSENT]] {
                let err = tagged.decode(stored.clone(), "undo").unwrap_err();
                assert!(
                    matches!(&err, Error::Corrupt(m) if m == "undo keyspace holds a value without a valid tag"),
                    "{tagged:?} {stored:?}: {err:?}"
                );
            }
        }
        // One layout read as the other is refused when its tag is not where
        // the other expects it (here the value ends in neither tag).
        assert!(Tagged::Last.decode(Tagged::First.encode(Some(vec![9])), "temp").is_err());
        assert!(Tagged::First.decode(Tagged::Last.encode(Some(vec![9])), "temp").is_err());
    }

    #[test]
    fn recovery_reports_what_it_found_and_refuses_a_checkpoint_ahead() {
        let r = |c, s, found| recovered(c, s, found).map(|r| (r.offset, r.action));
        use RecoveryAction::*;
        assert_eq!(r(Some(5), Some(5), None).unwrap(), (Some(5), Clean));
        assert_eq!(r(None, None, None).unwrap(), (None, Clean));
        assert_eq!(r(None, Some(5), None).unwrap(), (Some(5), Discarded));
        assert_eq!(r(Some(4), Some(5), None).unwrap(), (Some(5), Discarded));
        assert_eq!(r(Some(5), Some(5), Some(RolledBack)).unwrap(), (Some(5), RolledBack));
        assert_eq!(r(None, Some(5), Some(Discarded)).unwrap(), (Some(5), Discarded));
        assert_eq!(r(Some(5), Some(5), Some(Discarded)).unwrap(), (Some(5), Discarded));
        for (c, s) in [(Some(6), Some(5)), (Some(0), None)] {
            let err = recovered(c, s, Some(RolledBack)).unwrap_err();
            let expected = format!("the checkpoint says offset {c:?} but the store committed only {s:?}");
            assert!(matches!(&err, Error::Corrupt(m) if *m == expected), "{err:?}");
        }
    }
}
