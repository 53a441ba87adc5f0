//! Durable storage for store instances: the host side of the `storage` WIT
//! interface. A [`Backend`] holds many stores; each [`StoreStorage`] sees
//! only its own keyspaces and snapshots, because every name it is given is
//! checked by [`check_name`] and resolved inside the store's namespace.
//!
//! Durability model (both backends state it the same way, see
//! `wit/store.wit`): writes become durable in the order they were made; a
//! crash keeps a prefix of the write history that includes everything up to
//! the last `sync` or `write` batch; a `write` batch is all or nothing.
//!
//! Failed syncs follow the fsyncgate rule (see [`crate::fault`]): after one,
//! every call on the backend fails until the process restarts.

mod memory;
pub mod power;
mod rocks;
mod sst;

pub use memory::MemoryBackend;
pub use power::PowerBackend;
pub use rocks::RocksBackend;

use crate::fault::{self, Class};
use std::fmt;
use std::sync::OnceLock;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
}

/// The storage of one store instance.
pub trait StoreStorage: Send {
    /// Opens (creating if needed) keyspace `name` of this store.
    fn open_keyspace(&mut self, name: &str) -> Result<KeyspaceId>;
    /// Opens keyspace `name` as it is in snapshot `snapshot`, read-only:
    /// reads see the snapshot's current contents (empty if the snapshot
    /// lacks the keyspace) and fail with `NoSuchSnapshot` once it is
    /// dropped; writes fail with `Denied`.
    fn open_snapshot_keyspace(&mut self, snapshot: &str, name: &str) -> Result<KeyspaceId>;
    /// The names of every keyspace this store has ever created.
    fn keyspaces(&self) -> Result<Vec<String>>;
    fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn get_many(&self, ks: KeyspaceId, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
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

/// Whether a backend can still be trusted, shared by all its stores (a
/// RocksDB flush covers every column family, so one failure taints them
/// all). Also where storage faults are injected.
#[derive(Default)]
pub(crate) struct Health {
    /// The first failed sync. Once set, every call fails: a failed flush
    /// may have left any part of the unsynced writes on disk or none, and
    /// a `write(sync)` whose flush failed has already applied its batch in
    /// memory although the caller is told it failed. Only a restart (which
    /// drops the memtable; RocksDB runs without a WAL) gets back to a
    /// state that is known.
    failed: OnceLock<String>,
    /// Test seam: the next sync fails (`fault` can be armed only once per
    /// process, so unit tests cannot use it).
    #[cfg(test)]
    fail_next_sync: std::sync::atomic::AtomicBool,
}

impl Health {
    /// Fails if a sync failed earlier.
    pub(crate) fn check(&self) -> Result<()> {
        match self.failed.get() {
            None => Ok(()),
            Some(first) => Err(StorageError::Io(format!(
                "storage failed earlier ({first}): nothing after it is trusted; restart to recover"
            ))),
        }
    }

    /// Checks health and counts one mutating call, which fails before it
    /// applies anything if it is the injected one.
    pub(crate) fn before_write(&self) -> Result<()> {
        self.check()?;
        match fault::hit(Class::StorageWrite) {
            Some(f) => Err(StorageError::Io(f.io_error("storage write").to_string())),
            None => Ok(()),
        }
    }

    /// Checks health and counts one read, which fails (without poisoning
    /// anything: nothing durable changed) if it is the injected one.
    pub(crate) fn before_read(&self) -> Result<()> {
        self.check()?;
        match fault::hit(Class::StorageRead) {
            Some(f) => Err(StorageError::Io(f.io_error("storage read").to_string())),
            None => Ok(()),
        }
    }

    /// Runs `flush`, poisoning the backend if it fails. `inject`: this is a
    /// `sync` or the sync of a `write(sync)`, counted for `storage-sync`.
    pub(crate) fn sync(&self, inject: bool, flush: impl FnOnce() -> Result<()>) -> Result<()> {
        self.check()?;
        let injected = if inject {
            fault::hit(Class::StorageSync)
                .map(|f| StorageError::Io(f.io_error("storage sync").to_string()))
        } else {
            None
        };
        #[cfg(test)]
        let injected = injected.or_else(|| {
            self.fail_next_sync
                .swap(false, std::sync::atomic::Ordering::SeqCst)
                .then(|| StorageError::Io("storage sync: failure forced by a test".into()))
        });
        let result = match injected {
            Some(e) => Err(e),
            None => flush(),
        };
        if let Err(e) = &result {
            let first = match e {
                StorageError::Io(m) => m.clone(),
                other => other.to_string(),
            };
            let _ = self.failed.set(first);
        }
        result
    }

    #[cfg(test)]
    pub(crate) fn fail_next_sync(&self) {
        self.fail_next_sync
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
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

/// Checks every range of a `write` batch before any of it applies.
pub(crate) fn check_batch(batch: &[(KeyspaceId, Vec<Op>)]) -> Result<()> {
    for (_, ops) in batch {
        for op in ops {
            if let Op::DeleteRange(s, e) = op {
                check_range(s, e)?;
            }
        }
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

/// Random storage calls for tests that compare backends or check models.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::rng::Rng;

    /// One call on a store with two keyspaces (`ks` is 0 or 1).
    #[derive(Clone, Debug)]
    pub enum Call {
        Put(u32, Vec<u8>, Vec<u8>),
        Delete(u32, Vec<u8>),
        DeleteRange(u32, Vec<u8>, Vec<u8>),
        Clear(u32),
        Write(Vec<(u32, Vec<Op>)>, bool),
        Sync,
        /// Create, or restore, snapshot `s0` or `s1`.
        Snapshot(u8),
        Restore(u8),
    }

    /// Few keys, so calls collide; with the empty key, zero and 0xff bytes,
    /// and keys past any other (a clear must reach them).
    const KEYS: &[&[u8]] = &[
        b"",
        b"\0",
        b"a",
        b"a\0",
        b"b",
        b"m",
        b"z",
        b"\xff",
        b"\xff\xff",
    ];

    fn key(rng: &mut Rng) -> Vec<u8> {
        KEYS[rng.below(KEYS.len() as u64) as usize].to_vec()
    }

    fn range(rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
        let (a, b) = (key(rng), key(rng));
        if a <= b {
            (a, b)
        } else {
            (b, a)
        }
    }

    fn op(rng: &mut Rng, n: u64) -> Op {
        match rng.below(10) {
            0..=4 => Op::Put(key(rng), format!("v{n}").into_bytes()),
            5 | 6 => Op::Delete(key(rng)),
            7 | 8 => {
                let (a, b) = range(rng);
                Op::DeleteRange(a, b)
            }
            _ => Op::Clear,
        }
    }

    /// A batch: random ops, or one of the shapes where order inside a
    /// batch matters.
    fn batch(rng: &mut Rng, n: u64) -> Vec<(u32, Vec<Op>)> {
        let ks = rng.below(2) as u32;
        let v = format!("b{n}").into_bytes();
        match rng.below(6) {
            0 => vec![(ks, vec![Op::Put(key(rng), v), Op::Clear])],
            1 => vec![(ks, vec![Op::Clear, Op::Put(key(rng), v)])],
            2 => {
                let (a, b) = range(rng);
                let inside = if a < b { a.clone() } else { key(rng) };
                vec![(ks, vec![Op::DeleteRange(a, b), Op::Put(inside, v)])]
            }
            _ => (0..1 + rng.below(3))
                .map(|_| {
                    let ks = rng.below(2) as u32;
                    (ks, (0..1 + rng.below(4)).map(|_| op(rng, n)).collect())
                })
                .collect(),
        }
    }

    /// `len` random calls from `seed`; `syncs`: whether to include syncs.
    pub fn calls(seed: u64, len: usize, syncs: bool) -> Vec<Call> {
        let mut rng = Rng::new(seed);
        (0..len as u64)
            .map(|n| match rng.below(if syncs { 12 } else { 11 }) {
                0..=2 => Call::Put(
                    rng.below(2) as u32,
                    key(&mut rng),
                    format!("p{n}").into_bytes(),
                ),
                3 => Call::Delete(rng.below(2) as u32, key(&mut rng)),
                4 => {
                    let (a, b) = range(&mut rng);
                    Call::DeleteRange(rng.below(2) as u32, a, b)
                }
                5 => Call::Clear(rng.below(2) as u32),
                6..=10 => Call::Write(batch(&mut rng, n), syncs && rng.chance(10)),
                _ => Call::Sync,
            })
            .collect()
    }

    /// `calls` with syncs, and snapshots `s0`/`s1` created and restored
    /// between them (a restore of one never created fails on any backend).
    pub fn calls_with_snapshots(seed: u64, len: usize) -> Vec<Call> {
        let mut rng = Rng::new(seed ^ 0x5a9_5407);
        calls(seed, len, true)
            .into_iter()
            .map(|c| match rng.below(8) {
                0 => Call::Snapshot(rng.below(2) as u8),
                1 => Call::Restore(rng.below(2) as u8),
                _ => c,
            })
            .collect()
    }

    /// Opens keyspaces `k0` and `k1` of `s`.
    pub fn open(s: &mut dyn StoreStorage) -> [KeyspaceId; 2] {
        [
            s.open_keyspace("k0").unwrap(),
            s.open_keyspace("k1").unwrap(),
        ]
    }

    pub fn apply(s: &mut dyn StoreStorage, ks: [KeyspaceId; 2], call: &Call) -> Result<()> {
        let k = |i: &u32| ks[*i as usize];
        match call {
            Call::Put(i, key, v) => s.put(k(i), key, v),
            Call::Delete(i, key) => s.delete(k(i), key),
            Call::DeleteRange(i, a, b) => s.delete_range(k(i), a, b),
            Call::Clear(i) => s.clear(k(i)),
            Call::Write(batch, sync) => {
                let batch = batch.iter().map(|(i, ops)| (k(i), ops.clone())).collect();
                s.write(batch, *sync)
            }
            Call::Sync => s.sync(),
            Call::Snapshot(n) => s.create_snapshot(&format!("s{n}")),
            Call::Restore(n) => s.restore_snapshot(&format!("s{n}")),
        }
    }

    /// Every entry of both keyspaces.
    pub fn dump(s: &dyn StoreStorage, ks: [KeyspaceId; 2]) -> [Vec<Entry>; 2] {
        ks.map(|ks| {
            let mut c = s.scan(ks, None, None).unwrap();
            let mut out = Vec::new();
            loop {
                let b = c.next(MAX_CURSOR_BATCH).unwrap();
                if b.is_empty() {
                    return out;
                }
                out.extend(b);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    /// A `clear` in a batch removes keys put earlier in the same batch, on
    /// both backends (RocksDB once computed its range from the database
    /// before the batch, and left them).
    #[test]
    fn clear_in_a_batch_removes_keys_put_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let memory = MemoryBackend::new();
        for (kind, backend) in [("rocksdb", &rocks as &dyn Backend), ("memory", &memory)] {
            let mut s = backend.open_store("s").unwrap();
            let ks = open(&mut *s);
            s.put(ks[0], b"a", b"1").unwrap();
            s.write(
                vec![(
                    ks[0],
                    vec![Op::Put(b"z".to_vec(), b"2".to_vec()), Op::Clear],
                )],
                false,
            )
            .unwrap();
            assert_eq!(dump(&*s, ks)[0], Vec::<Entry>::new(), "{kind}");
        }
    }

    /// The same random calls on both backends give the same contents
    /// after every call.
    #[test]
    fn backends_agree_on_random_calls() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let memory = MemoryBackend::new();
        for seed in 0..40 {
            let store = format!("s{seed}");
            let mut r = rocks.open_store(&store).unwrap();
            let mut m = memory.open_store(&store).unwrap();
            let (rk, mk) = (open(&mut *r), open(&mut *m));
            for (n, call) in calls(seed, 60, true).iter().enumerate() {
                apply(&mut *r, rk, call).unwrap();
                apply(&mut *m, mk, call).unwrap();
                assert_eq!(
                    dump(&*r, rk),
                    dump(&*m, mk),
                    "seed {seed}, after call {n}: {call:?}"
                );
            }
        }
    }

    fn poisoned(r: Result<impl fmt::Debug>) {
        match r {
            Err(StorageError::Io(m)) => assert!(
                m.starts_with("storage failed earlier (")
                    && m.ends_with("nothing after it is trusted; restart to recover"),
                "{m}"
            ),
            other => panic!("not refused: {other:?}"),
        }
    }

    /// After a failed flush every call fails, reads too, and a restart
    /// has nothing of the batch whose synced write failed. A clean close
    /// without the failure still keeps unsynced writes.
    #[test]
    fn a_failed_sync_poisons_the_store_and_its_batch_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        {
            let rocks = RocksBackend::open(dir.path()).unwrap();
            let mut s = rocks.open_store("s").unwrap();
            let ks = open(&mut *s);
            s.put(ks[0], b"a", b"1").unwrap();
            s.sync().unwrap();
            s.put(ks[0], b"c", b"3").unwrap();
            rocks.fail_next_sync();
            let batch = vec![(ks[0], vec![Op::Put(b"b".to_vec(), b"2".to_vec())])];
            assert!(matches!(s.write(batch, true), Err(StorageError::Io(_))));
            poisoned(s.get(ks[0], b"a"));
            poisoned(s.scan(ks[0], None, None).map(|_| ()));
            poisoned(s.is_empty(ks[0]));
            poisoned(s.put(ks[0], b"d", b"4"));
            poisoned(s.write(vec![], false));
            poisoned(s.sync());
            poisoned(s.open_keyspace("k2"));
            poisoned(rocks.open_store("t").unwrap().keyspaces());
        }
        {
            let rocks = RocksBackend::open(dir.path()).unwrap();
            let mut s = rocks.open_store("s").unwrap();
            let ks = open(&mut *s);
            assert_eq!(dump(&*s, ks)[0], vec![(b"a".to_vec(), b"1".to_vec())]);
            // Unsynced, but a clean close keeps it.
            s.put(ks[0], b"e", b"5").unwrap();
        }
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let mut s = rocks.open_store("s").unwrap();
        let ks = open(&mut *s);
        assert_eq!(s.get(ks[0], b"e").unwrap(), Some(b"5".to_vec()));
    }

    /// The memory backend refuses every call after a failed sync too.
    #[test]
    fn a_failed_sync_poisons_the_memory_backend() {
        let memory = MemoryBackend::new();
        let mut s = memory.open_store("s").unwrap();
        let ks = open(&mut *s);
        memory.fail_next_sync();
        assert!(s.sync().is_err());
        poisoned(s.get(ks[0], b"a"));
        poisoned(s.put(ks[0], b"a", b"1"));
    }

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
