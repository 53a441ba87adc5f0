//! What every Rust strategy needs besides its own algorithm: the bindings
//! of `wit/store.wit`, the committed-offset record, cursors as iterators,
//! and the ordered merge of an overlay of uncommitted writes over a base.

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
