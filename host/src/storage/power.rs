//! A simulated machine crash for storage: the storage half of a `+power`
//! crash ([`crate::file`] does the host's files).
//!
//! What is simulated: [`PowerBackend`] logs every mutating call (`put`,
//! `delete`, `delete_range`, `clear`, unsynced `write`) made since the
//! backend's last sync point, with the values it may have changed. At a
//! power crash its hook undoes a suffix of that log through the real
//! storage and syncs, so the abort that follows leaves exactly a prefix of
//! the unsynced calls: none without a seed, a seeded uniform prefix with
//! one. A `write` batch is one call, so it survives whole or not at all.
//!
//! Sync points (the log restarts empty): a successful `sync` or
//! `write(sync)`, `create_snapshot` and `restore_snapshot` (both flush
//! every column family on RocksDB). `drop_snapshot` is not one: it flushes
//! nothing, so the writes before it are still unsynced. The log is per
//! backend, not per store, because a sync of one store flushes every
//! column family of the database.
//!
//! What is assumed: a RocksDB flush is durable once it returns and the
//! memtable is lost at abort (no WAL), so undoing a call and then flushing
//! is the same as the call never having reached disk. Keyspace creation
//! is not logged (RocksDB syncs its MANIFEST). If the undo cannot be done
//! (the backend failed a sync earlier and refuses every call, or a
//! snapshot operation failed halfway, unlogged) nothing is undone and the
//! abort decides: what was flushed survives, the memtable does not.
//!
//! Only used when a power crash is armed ([`crate::crash::power_armed`]),
//! for every backend opened then: the store's, and the new store a
//! migration builds in its own directory. The files themselves stay as
//! RocksDB left them; the host's directory operations around them (a
//! migration's or a snapshot's rename undone by the cut) are
//! [`crate::file::power`]'s, which moves them along with their directory.

use super::{Backend, Cursor, KeyspaceId, Op, Result, StorageError, StoreStorage};
use crate::crash::PowerReport;
use crate::rng::Rng;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// The value a key had before a call: `None` when absent.
type Before = (KeyspaceId, Vec<u8>, Option<Vec<u8>>);

/// One logged call: which store, and the prior value of every key it may
/// have changed (taken before the call applied).
struct Call {
    store: usize,
    before: Vec<Before>,
}

#[derive(Default)]
struct Shared {
    /// The wrapped storage of every store opened, by index. Kept after its
    /// `PowerStorage` is dropped: its unsynced writes are still unsynced.
    stores: Vec<Box<dyn StoreStorage>>,
    /// Calls since the last sync point, oldest first.
    log: Vec<Call>,
    /// Set when storage changed in a way the log does not describe.
    untracked: Option<String>,
}

impl Shared {
    fn synced(&mut self) {
        self.log.clear();
    }

    /// Undoes a suffix of the log and syncs. Returns the report and how
    /// many calls were kept (`None` when nothing could be undone).
    fn power_loss(&mut self, seed: Option<u64>) -> (PowerReport, Option<usize>) {
        let n = self.log.len();
        // `choices` counts what a seed decides: nothing when the undo
        // cannot be done, since the abort then gives the same result.
        let report = |summary: String, done: bool| PowerReport {
            summary,
            choices: if done { n as u64 } else { 0 },
        };
        if let Some(why) = &self.untracked {
            return (
                report(
                    format!("storage: {why}; {n} logged write calls left to the abort"),
                    false,
                ),
                None,
            );
        }
        let kept = match seed {
            None => 0,
            Some(seed) => Rng::new(seed).below(n as u64 + 1) as usize,
        };
        // Newest first, so each key ends with its value before the oldest
        // undone call that touched it: its value after the kept prefix.
        let mut undo: BTreeMap<(usize, KeyspaceId, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
        for call in self.log.drain(kept..).rev() {
            for (ks, key, value) in call.before {
                undo.insert((call.store, ks, key), value);
            }
        }
        let mut batches: BTreeMap<usize, BTreeMap<KeyspaceId, Vec<Op>>> = BTreeMap::new();
        for ((store, ks, key), value) in undo {
            let op = match value {
                Some(v) => Op::Put(key, v),
                None => Op::Delete(key),
            };
            batches
                .entry(store)
                .or_default()
                .entry(ks)
                .or_default()
                .push(op);
        }
        // One batch per store, then a sync of every store, so a crash
        // inside the hook itself (or an injected fault) cannot leave half
        // an undo durable: the abort would drop it with the memtable.
        let mut result = Ok(());
        for (store, batch) in batches {
            let batch = batch.into_iter().collect();
            result = result.and_then(|()| self.stores[store].write(batch, false));
        }
        for store in &mut self.stores {
            result = result.and_then(|()| store.sync());
        }
        self.log.clear();
        match result {
            Ok(()) => (
                report(
                    format!("storage: kept {kept} of {n} unsynced write calls"),
                    true,
                ),
                Some(kept),
            ),
            Err(e) => {
                let e = match e {
                    StorageError::Io(m) => m,
                    other => other.to_string(),
                };
                let summary = format!(
                    "storage: undo or sync failed ({e}); \
                     {n} unsynced write calls left to the abort"
                );
                (report(summary, false), None)
            }
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// A [`Backend`] whose stores can lose their unsynced writes on demand.
pub struct PowerBackend {
    inner: Box<dyn Backend>,
    shared: Arc<Mutex<Shared>>,
}

impl PowerBackend {
    /// Wraps `inner` and registers the power-crash hook.
    pub fn new(inner: Box<dyn Backend>) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        // Weak: a backend dropped before the crash was closed, and RocksDB
        // flushes at close, so there is nothing left to lose.
        let weak = Arc::downgrade(&shared);
        crate::crash::on_power_crash(Box::new(move |seed| {
            let Some(shared) = weak.upgrade() else {
                return PowerReport {
                    summary: "storage: closed before the crash, nothing unsynced".into(),
                    choices: 0,
                };
            };
            // try_lock: the crash may come from a thread inside a storage
            // call; waiting for it would never end.
            let mut guard = match shared.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    return PowerReport {
                        summary: "storage: busy, nothing kept".into(),
                        choices: 0,
                    };
                }
            };
            guard.power_loss(seed).0
        }));
        Self { inner, shared }
    }

    /// What the hook does, callable without a crash.
    #[cfg(test)]
    fn power_loss(&self, seed: Option<u64>) -> (PowerReport, Option<usize>) {
        lock(&self.shared).power_loss(seed)
    }
}

impl Backend for PowerBackend {
    fn open_store(&self, store: &str) -> Result<Box<dyn StoreStorage>> {
        let storage = self.inner.open_store(store)?;
        let mut shared = lock(&self.shared);
        shared.stores.push(storage);
        Ok(Box::new(PowerStorage {
            shared: self.shared.clone(),
            index: shared.stores.len() - 1,
        }))
    }
}

/// One store's storage, logged for [`PowerBackend`].
struct PowerStorage {
    shared: Arc<Mutex<Shared>>,
    index: usize,
}

/// Every entry of `ks` in [start, end), as it is now.
fn entries(
    s: &dyn StoreStorage,
    ks: KeyspaceId,
    start: Option<&[u8]>,
    end: Option<&[u8]>,
) -> Result<Vec<Before>> {
    let mut cursor = s.scan(ks, start, end)?;
    let mut out = Vec::new();
    loop {
        let batch = cursor.next(super::MAX_CURSOR_BATCH)?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch.into_iter().map(|(k, v)| (ks, k, Some(v))));
    }
}

/// The prior value of every key `ops` on `ks` may change, read before any
/// of them applies. `seen` skips keys already recorded for this call.
fn before_ops(
    s: &dyn StoreStorage,
    ks: KeyspaceId,
    ops: &[Op],
    seen: &mut std::collections::BTreeSet<(KeyspaceId, Vec<u8>)>,
    out: &mut Vec<Before>,
) -> Result<()> {
    for op in ops {
        let found = match op {
            Op::Put(k, _) | Op::Delete(k) => vec![(ks, k.clone(), s.get(ks, k)?)],
            Op::DeleteRange(a, b) => entries(s, ks, Some(a), Some(b))?,
            Op::Clear => entries(s, ks, None, None)?,
        };
        for b in found {
            if seen.insert((b.0, b.1.clone())) {
                out.push(b);
            }
        }
    }
    Ok(())
}

impl PowerStorage {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// Runs the mutating call `f` after recording what `ops` may change;
    /// logs it only if it succeeded (a failed call applied nothing, or
    /// failed a sync and left the backend refusing every call).
    fn logged(
        &mut self,
        ops: &[(KeyspaceId, Vec<Op>)],
        f: impl FnOnce(&mut dyn StoreStorage) -> Result<()>,
    ) -> Result<()> {
        let index = self.index;
        let mut shared = self.lock();
        let s = &mut shared.stores[index];
        let mut before = Vec::new();
        let mut seen = Default::default();
        for (ks, ops) in ops {
            before_ops(&**s, *ks, ops, &mut seen, &mut before)?;
        }
        f(&mut **s)?;
        shared.log.push(Call {
            store: index,
            before,
        });
        Ok(())
    }

    /// Runs a sync point `f`: the log restarts empty if it succeeds. If it
    /// fails with an I/O error it may have changed or flushed part of the
    /// storage, which the log cannot describe.
    fn sync_point(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut dyn StoreStorage) -> Result<()>,
    ) -> Result<()> {
        let index = self.index;
        let mut shared = self.lock();
        match f(&mut *shared.stores[index]) {
            Ok(()) => {
                shared.synced();
                Ok(())
            }
            Err(e) => {
                if let StorageError::Io(m) = &e {
                    shared
                        .untracked
                        .get_or_insert_with(|| format!("{what} failed ({m})"));
                }
                Err(e)
            }
        }
    }
}

impl StoreStorage for PowerStorage {
    fn open_keyspace(&mut self, name: &str) -> Result<KeyspaceId> {
        let index = self.index;
        self.lock().stores[index].open_keyspace(name)
    }

    fn open_snapshot_keyspace(&mut self, snapshot: &str, name: &str) -> Result<KeyspaceId> {
        let index = self.index;
        self.lock().stores[index].open_snapshot_keyspace(snapshot, name)
    }

    fn keyspaces(&self) -> Result<Vec<String>> {
        self.lock().stores[self.index].keyspaces()
    }

    fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.lock().stores[self.index].get(ks, key)
    }

    fn get_many(&self, ks: KeyspaceId, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.lock().stores[self.index].get_many(ks, keys)
    }

    fn put(&mut self, ks: KeyspaceId, key: &[u8], value: &[u8]) -> Result<()> {
        let op = Op::Put(key.to_vec(), value.to_vec());
        self.logged(&[(ks, vec![op])], |s| s.put(ks, key, value))
    }

    fn delete(&mut self, ks: KeyspaceId, key: &[u8]) -> Result<()> {
        self.logged(&[(ks, vec![Op::Delete(key.to_vec())])], |s| {
            s.delete(ks, key)
        })
    }

    fn scan(
        &self,
        ks: KeyspaceId,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
    ) -> Result<Box<dyn Cursor>> {
        self.lock().stores[self.index].scan(ks, start, end)
    }

    fn delete_range(&mut self, ks: KeyspaceId, start: &[u8], end: &[u8]) -> Result<()> {
        let op = Op::DeleteRange(start.to_vec(), end.to_vec());
        self.logged(&[(ks, vec![op])], |s| s.delete_range(ks, start, end))
    }

    fn clear(&mut self, ks: KeyspaceId) -> Result<()> {
        self.logged(&[(ks, vec![Op::Clear])], |s| s.clear(ks))
    }

    fn is_empty(&self, ks: KeyspaceId) -> Result<bool> {
        self.lock().stores[self.index].is_empty(ks)
    }

    fn write(&mut self, batch: Vec<(KeyspaceId, Vec<Op>)>, sync: bool) -> Result<()> {
        if sync {
            // No undo needed: success is a sync point, and a failure either
            // applied nothing or failed the sync (the backend then refuses
            // every call, the undo included).
            let index = self.index;
            let mut shared = self.lock();
            shared.stores[index].write(batch, true)?;
            shared.synced();
            return Ok(());
        }
        // The batch is needed after the priors are read; cloning it only
        // costs in power-crash runs.
        let ops = batch.clone();
        self.logged(&ops, |s| s.write(batch, false))
    }

    fn sync(&mut self) -> Result<()> {
        let index = self.index;
        let mut shared = self.lock();
        shared.stores[index].sync()?;
        shared.synced();
        Ok(())
    }

    fn create_snapshot(&mut self, name: &str) -> Result<()> {
        self.sync_point("a snapshot create", |s| s.create_snapshot(name))
    }

    fn restore_snapshot(&mut self, name: &str) -> Result<()> {
        self.sync_point("a snapshot restore", |s| s.restore_snapshot(name))
    }

    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        let index = self.index;
        self.lock().stores[index].drop_snapshot(name)
    }

    fn list_snapshots(&self) -> Result<Vec<String>> {
        self.lock().stores[self.index].list_snapshots()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{apply, calls, dump, open, Call};
    use super::super::{MemoryBackend, RocksBackend};
    use super::*;

    /// The contents after the first `upto` calls, by the memory backend.
    fn model(calls: &[Call], upto: usize) -> [Vec<super::super::Entry>; 2] {
        let memory = MemoryBackend::new();
        let mut s = memory.open_store("model").unwrap();
        let ks = open(&mut *s);
        for call in &calls[..upto] {
            apply(&mut *s, ks, call).unwrap();
        }
        dump(&*s, ks)
    }

    /// After a power loss the store holds exactly the synced calls plus
    /// the prefix of the unsynced ones the seed chose (none without one).
    #[test]
    fn power_loss_keeps_exactly_a_prefix_of_unsynced_calls() {
        let dir = tempfile::tempdir().unwrap();
        let backend = PowerBackend::new(Box::new(RocksBackend::open(dir.path()).unwrap()));
        let mut kept_some = false;
        for seed in 0..40u64 {
            let calls = calls(seed, 40, true);
            let mut s = backend.open_store(&format!("s{seed}")).unwrap();
            let ks = open(&mut *s);
            let mut synced = 0;
            for (i, call) in calls.iter().enumerate() {
                apply(&mut *s, ks, call).unwrap();
                if matches!(call, Call::Sync | Call::Write(_, true)) {
                    synced = i + 1;
                }
            }
            let n = calls.len() - synced;
            let hook_seed = (seed % 4 != 0).then_some(seed * 7919);
            let (report, kept) = backend.power_loss(hook_seed);
            let kept = kept.expect("undo done");
            assert_eq!(report.choices, n as u64);
            assert_eq!(
                report.summary,
                format!("storage: kept {kept} of {n} unsynced write calls")
            );
            if hook_seed.is_none() {
                assert_eq!(kept, 0);
            }
            kept_some |= kept > 0 && kept < n;
            assert_eq!(
                dump(&*s, ks),
                model(&calls, synced + kept),
                "seed {seed}: kept {kept} of {n} after {synced} synced"
            );
            // The loss was a sync point.
            assert_eq!(backend.power_loss(Some(1)).0.choices, 0);
        }
        assert!(kept_some, "no seed kept a proper prefix");
    }

    /// After a failed sync the backend refuses the undo too: nothing is
    /// undone, the abort decides, and no seed makes a difference.
    #[test]
    fn after_a_failed_sync_nothing_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksBackend::open(dir.path()).unwrap();
        rocks.fail_next_sync();
        let backend = PowerBackend::new(Box::new(rocks));
        let mut s = backend.open_store("s").unwrap();
        let ks = open(&mut *s);
        s.put(ks[0], b"x", b"1").unwrap();
        assert!(s.sync().is_err());
        let (report, kept) = backend.power_loss(Some(3));
        assert_eq!((report.choices, kept), (0, None));
        assert!(
            report
                .summary
                .starts_with("storage: undo or sync failed (storage failed earlier"),
            "{}",
            report.summary
        );
    }

    /// A sync of one store is a sync of all (RocksDB flushes every column
    /// family); dropping a snapshot is not a sync, creating one is.
    #[test]
    fn sync_points_are_per_backend() {
        let dir = tempfile::tempdir().unwrap();
        let backend = PowerBackend::new(Box::new(RocksBackend::open(dir.path()).unwrap()));
        let mut a = backend.open_store("a").unwrap();
        let mut b = backend.open_store("b").unwrap();
        let (ka, kb) = (open(&mut *a), open(&mut *b));
        a.put(ka[0], b"x", b"1").unwrap();
        b.sync().unwrap();
        b.put(kb[0], b"y", b"2").unwrap();
        a.drop_snapshot("none").unwrap();
        let (report, kept) = backend.power_loss(None);
        assert_eq!((report.choices, kept), (1, Some(0)));
        assert_eq!(a.get(ka[0], b"x").unwrap(), Some(b"1".to_vec()));
        assert_eq!(b.get(kb[0], b"y").unwrap(), None);

        b.put(kb[0], b"y", b"2").unwrap();
        a.create_snapshot("snap").unwrap();
        assert_eq!(backend.power_loss(None).0.choices, 0);
        assert_eq!(b.get(kb[0], b"y").unwrap(), Some(b"2".to_vec()));
    }
}
