//! Durable storage for store instances: the host side of the `storage` WIT
//! interface. A [`Backend`] holds many stores; each [`StoreStorage`] sees
//! only its own keyspaces and snapshots, because every name it is given is
//! checked by [`check_name`] and resolved inside the store's namespace.
//!
//! Durability model (both backends state it the same way, see
//! `wit/store.wit`): writes become durable in the order they were made; a
//! crash keeps a prefix of the write history that includes everything up to
//! the last `sync` or `write` batch; a `write` batch is all or nothing.

mod memory;
mod rocks;

pub use memory::MemoryBackend;
pub use rocks::RocksBackend;

use std::fmt;

/// Longest keyspace or snapshot name a guest may use, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Most entries one cursor `next` call returns.
pub const MAX_CURSOR_BATCH: usize = 4096;

/// A key-value pair.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Errors from storage. `Denied` and `NoSuchSnapshot` are the caller's
/// fault; `Io` is the backend's.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("name refused: {0}")]
    Denied(String),
    #[error("no snapshot named `{0}`")]
    NoSuchSnapshot(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("storage failed: {0}")]
    Io(String),
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

impl From<rocksdb::Error> for StorageError {
    fn from(e: rocksdb::Error) -> Self {
        StorageError::Io(e.into_string())
    }
}

impl From<std::io::Error> for StorageError {
    fn from(e: std::io::Error) -> Self {
        StorageError::Io(e.to_string())
    }
}

/// A keyspace opened by a store: an index into the store's keyspace list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyspaceId(pub u32);

/// One operation of an atomic batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    DeleteRange(Vec<u8>, Vec<u8>),
    Clear,
}

/// An ordered read cursor over a consistent view of one keyspace.
pub trait Cursor: Send {
    /// Up to `max` next entries; empty when exhausted.
    fn next(&mut self, max: usize) -> Result<Vec<Entry>>;
}

/// Where stores live: one per state directory (RocksDB) or per test (memory).
pub trait Backend: Send + Sync {
    /// The storage of store `store` (created on first use).
    fn open_store(&self, store: &str) -> Result<Box<dyn StoreStorage>>;
    /// Human-readable kind, for reports.
    fn kind(&self) -> &'static str;
}

/// The storage of one store instance.
pub trait StoreStorage: Send {
    /// Opens (creating if needed) keyspace `name` of this store.
    fn open_keyspace(&mut self, name: &str) -> Result<KeyspaceId>;
    /// The names of every keyspace this store has ever created.
    fn keyspaces(&self) -> Result<Vec<String>>;
    fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn get_many(&self, ks: KeyspaceId, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(ks, k)).collect()
    }
    fn put(&mut self, ks: KeyspaceId, key: &[u8], value: &[u8]) -> Result<()>;
    fn delete(&mut self, ks: KeyspaceId, key: &[u8]) -> Result<()>;
    /// A cursor over [start, end) as the keyspace is now.
    fn scan(
        &self,
        ks: KeyspaceId,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
    ) -> Result<Box<dyn Cursor>>;
    fn delete_range(&mut self, ks: KeyspaceId, start: &[u8], end: &[u8]) -> Result<()>;
    fn clear(&mut self, ks: KeyspaceId) -> Result<()>;
    fn is_empty(&self, ks: KeyspaceId) -> Result<bool>;
    /// Applies `batch` atomically; with `sync`, durably (with all before it).
    fn write(&mut self, batch: Vec<(KeyspaceId, Vec<Op>)>, sync: bool) -> Result<()>;
    /// Makes every write so far durable.
    fn sync(&mut self) -> Result<()>;
    fn create_snapshot(&mut self, name: &str) -> Result<()>;
    fn restore_snapshot(&mut self, name: &str) -> Result<()>;
    fn drop_snapshot(&mut self, name: &str) -> Result<()>;
    fn list_snapshots(&self) -> Result<Vec<String>>;
}

/// What a name is for, in error messages.
#[derive(Clone, Copy, Debug)]
pub enum NameKind {
    Store,
    Keyspace,
    Snapshot,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Store => "store",
            NameKind::Keyspace => "keyspace",
            NameKind::Snapshot => "snapshot",
        })
    }
}

/// Refuses names that could escape a namespace or a directory: empty, too
/// long, `.`/`..`, path separators, the namespace separator `:`, control
/// characters. Everything else (letters, digits, `-`, `_`, `.`, spaces,
/// unicode) is allowed.
pub fn check_name(kind: NameKind, name: &str) -> Result<()> {
    let bad = |why: &str| Err(StorageError::Denied(format!("{kind} name {name:?} {why}")));
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad(&format!("is longer than {MAX_NAME_LEN} bytes"));
    }
    if name == "." || name == ".." || name.contains("..") {
        return bad("contains `..`");
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '/' | '\\' | ':') || c.is_control())
    {
        return bad(&format!("contains {c:?}"));
    }
    Ok(())
}

/// Checks a half-open range's bounds.
pub(crate) fn check_range(start: &[u8], end: &[u8]) -> Result<()> {
    if start > end {
        return Err(StorageError::Invalid("range start is after its end".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_are_refused() {
        for bad in [
            "",
            "..",
            "a/../b",
            "a/b",
            "a\\b",
            "a:b",
            "a\nb",
            &"x".repeat(129),
        ] {
            assert!(
                check_name(NameKind::Keyspace, bad).is_err(),
                "{bad:?} accepted"
            );
        }
        for good in ["data", "temp-1", "snap.offset_7", "ключ", &"x".repeat(128)] {
            check_name(NameKind::Keyspace, good).unwrap();
        }
    }
}
