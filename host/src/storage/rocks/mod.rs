//! RocksDB backend: one database per state directory, one column family per
//! keyspace named `{store}:{keyspace}` (`:` is refused in names, so no store
//! can spell another's column family).
//!
//! Durability: like Kafka Streams, writes skip the WAL, so an abrupt end
//! loses every write still in a memtable, as a machine crash would lose
//! unsynced data. `atomic_flush` makes every flush (ours in `sync`/`write`
//! and RocksDB's own when a memtable fills) cut all column families at one
//! sequence number, which gives the prefix guarantee stated in `mod.rs`.
//! A clean close flushes (as RocksDB would), except after a failed sync:
//! then the memtable is dropped, so a `write(sync)` reported as failed
//! leaves nothing behind.
//!
//! This module holds the database and a store's keyspaces; `snapshots.rs`
//! a store's snapshots and their views, `options.rs` the RocksDB options.

mod options;
mod snapshots;

use super::{
    check_batch, check_name, check_range, Backend, Cursor, Entry, Health, KeyspaceId, NameKind, Op,
    Result, StorageError, StoreStorage,
};
use crate::file;
use options::{cf_options, no_wal, open_options};
use rocksdb::{BoundColumnFamily, ColumnFamilyDescriptor, FlushOptions, ReadOptions, WriteBatch};
use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

type Db = rocksdb::DBWithThreadMode<rocksdb::MultiThreaded>;
type RawIter = rocksdb::DBRawIteratorWithThreadMode<'static, Db>;

/// The open database; closing it flushes unless a sync failed.
struct DbHandle {
    db: Db,
    health: Arc<Health>,
    /// Every column family's name, kept here because asking RocksDB
    /// (`list_cf`) reads the MANIFEST from disk, and every commit's flush
    /// needs them. Families are created, never dropped.
    cfs: Mutex<Vec<String>>,
    /// Snapshot views (see `RocksStore::view`) built by this process and
    /// still current: a view found at open may be stale, so it is dropped.
    views: Mutex<HashSet<String>>,
}

impl DbHandle {
    fn cf_names(&self) -> Vec<String> {
        self.cfs.lock().unwrap().clone()
    }
}

impl Deref for DbHandle {
    type Target = Db;
    fn deref(&self) -> &Db {
        &self.db
    }
}

impl Drop for DbHandle {
    fn drop(&mut self) {
        // RocksDB's own close flush is off (`db_options`): it would make
        // durable the batch of a `write(sync)` whose flush failed, which
        // the caller was told applied nothing.
        if self.health.check().is_ok() {
            let _ = flush_db(self);
        }
    }
}

/// How many bytes a restore of a snapshot of the earlier format (a

/// A RocksDB database in a state directory, shared by the stores in it.
pub struct RocksBackend {
    db: Arc<DbHandle>,
    dir: PathBuf,
    health: Arc<Health>,
}

impl RocksBackend {
    /// Opens (creating) the database under `dir/db`. A second process on
    /// the same directory is refused by RocksDB's lock file.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StorageError::Io(format!(
                "cannot create state directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join("db");
        let opts = open_options()?;
        let cfs = if path.join("CURRENT").exists() {
            Db::list_cf(&opts, &path)?
        } else {
            vec!["default".into()]
        };
        let descriptors = cfs
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, cf_options()));
        let db = Db::open_cf_descriptors(&opts, &path, descriptors).map_err(|e| {
            let msg = e.into_string();
            if msg.contains("lock") || msg.contains("LOCK") {
                StorageError::Io(format!(
                    "state directory {} is in use by another process ({msg})",
                    dir.display()
                ))
            } else {
                StorageError::Io(format!("cannot open RocksDB in {}: {msg}", path.display()))
            }
        })?;
        let (views, cfs): (Vec<String>, Vec<String>) = cfs.into_iter().partition(|n| is_view(n));
        for view in &views {
            db.drop_cf(view)?;
        }
        let health = Arc::<Health>::default();
        let db = Arc::new(DbHandle {
            db,
            health: health.clone(),
            cfs: Mutex::new(cfs),
            views: Mutex::default(),
        });
        let weak = Arc::downgrade(&db);
        crate::crash::on_flush_crash(Box::new(move || {
            if let Some(db) = weak.upgrade() {
                let _ = flush_db(&db);
            }
        }));
        Ok(Self {
            db,
            dir: dir.to_path_buf(),
            health,
        })
    }

    /// Test seam: the next sync of any store here fails.
    #[cfg(test)]
    pub(crate) fn fail_next_sync(&self) {
        self.health.fail_next_sync();
    }
}

/// Whether column family `name` is a snapshot view, `{store}::{snapshot}:{keyspace}`
/// (a keyspace's is `{store}:{keyspace}`, and names never hold `:`).
fn is_view(name: &str) -> bool {
    name.split_once(':')
        .is_some_and(|(_, rest)| rest.contains(':'))
}

/// Flushes every column family of `db` at one point (atomic flush).
fn flush_db(db: &DbHandle) -> Result<()> {
    let names = db.cf_names();
    let handles: Vec<_> = names.iter().filter_map(|n| db.cf_handle(n)).collect();
    let mut fo = FlushOptions::default();
    fo.set_wait(true);
    db.flush_cfs_opt(&handles.iter().collect::<Vec<_>>(), &fo)?;
    Ok(())
}

impl RocksBackend {
    fn store(&self, store: &str) -> Result<RocksStore> {
        check_name(NameKind::Store, store)?;
        let store = RocksStore {
            db: self.db.clone(),
            prefix: format!("{store}:"),
            cfs: Vec::new(),
            snapshots: self.dir.join("snapshots").join(store),
            partial: self.dir.join("staging").join(store).join("partial"),
            ready: self.dir.join("staging").join(store).join("ready"),
            restoring: self.dir.join("restoring").join(store),
            health: self.health.clone(),
            #[cfg(test)]
            restore_stops_after: None,
        };
        store.finish_restore()?;
        Ok(store)
    }
}

impl Backend for RocksBackend {
    fn open_store(&self, store: &str) -> Result<Box<dyn StoreStorage>> {
        Ok(Box::new(self.store(store)?))
    }
}

struct RocksStore {
    db: Arc<DbHandle>,
    /// `{store}:`, the start of every column family name of this store.
    prefix: String,
    /// What each `KeyspaceId` names.
    cfs: Vec<Family>,
    /// Finished snapshots, one directory each.
    snapshots: PathBuf,
    /// Snapshots being built, and built ones not yet moved into place.
    partial: PathBuf,
    ready: PathBuf,
    /// Present while a restore is under way; holds the snapshot's name.
    restoring: PathBuf,
    health: Arc<Health>,
    /// Test seam: a restore fails after replacing this many keyspaces.
    #[cfg(test)]
    restore_stops_after: Option<usize>,
}

/// A keyspace's column family, or a snapshot's keyspace (read-only),
/// read through a view: a column family `{store}::{snapshot}:{keyspace}`
/// the snapshot's files are linked into at the first read.
#[derive(Clone, PartialEq)]
enum Family {
    Live(String),
    View {
        snapshot: String,
        keyspace: String,
        cf: String,
    },
}

impl RocksStore {
    fn cf(&self, ks: KeyspaceId) -> Result<Arc<BoundColumnFamily<'_>>> {
        let name = match &self.cfs[ks.0 as usize] {
            Family::Live(name) => name,
            Family::View {
                snapshot,
                keyspace,
                cf,
            } => {
                self.view(snapshot, keyspace, cf)?;
                cf
            }
        };
        Ok(self
            .db
            .cf_handle(name)
            .expect("an opened keyspace's column family exists"))
    }

    /// The column family of a keyspace that may be written.
    fn writable(&self, ks: KeyspaceId) -> Result<Arc<BoundColumnFamily<'_>>> {
        match &self.cfs[ks.0 as usize] {
            Family::Live(_) => self.cf(ks),
            Family::View {
                snapshot, keyspace, ..
            } => Err(super::memory::read_only(snapshot, keyspace)),
        }
    }

    fn id(&mut self, family: Family) -> KeyspaceId {
        let id = match self.cfs.iter().position(|f| *f == family) {
            Some(i) => i,
            None => {
                self.cfs.push(family);
                self.cfs.len() - 1
            }
        };
        KeyspaceId(id as u32)
    }

    /// Every column family of the database (flushes must cut them all).
    /// `inject`: see [`Health::sync`].
    fn flush_all(&self, inject: bool) -> Result<()> {
        self.health.sync(inject, || flush_db(&self.db))
    }

    /// Removes every key of `cf` without knowing the key space: one range
    /// deletion from the empty key to just past the last key, where the
    /// last key is the database's or `pending`, the largest key put earlier
    /// in the same batch (not in the database yet, but the clear must
    /// remove it: a batch applies in order).
    fn clear_cf(
        &self,
        batch: &mut WriteBatch,
        cf: &Arc<BoundColumnFamily<'_>>,
        pending: Option<&[u8]>,
    ) {
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek_to_last();
        let last = match (it.key(), pending) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if let Some(last) = last {
            let mut end = last.to_vec();
            end.push(0);
            batch.delete_range_cf(cf, Vec::new(), end);
        }
    }

    fn ensure_cf(&self, full: &str) -> Result<()> {
        if self.db.cf_handle(full).is_none() {
            self.db.create_cf(full, &cf_options())?;
            self.db.cfs.lock().unwrap().push(full.to_string());
        }
        Ok(())
    }

    /// This store's keyspaces: (keyspace name, column family name).
    fn own_families(&self) -> Vec<(String, String)> {
        self.db
            .cf_names()
            .into_iter()
            .filter_map(|full| {
                let ks = full.strip_prefix(&self.prefix)?.to_string();
                (!ks.contains(':')).then_some((ks, full))
            })
            .collect()
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    Ok(file::sync_dir(dir)?)
}

/// Adds `op` to `batch`. `max_put` is the largest key put so far in this
/// batch on `cf`, which a later clear must cover.
fn add_op(
    batch: &mut WriteBatch,
    store: &RocksStore,
    cf: &Arc<BoundColumnFamily<'_>>,
    max_put: &mut Option<Vec<u8>>,
    op: Op,
) {
    match op {
        Op::Put(k, v) => {
            if max_put.as_ref().is_none_or(|m| *m < k) {
                *max_put = Some(k.clone());
            }
            batch.put_cf(cf, k, v)
        }
        Op::Delete(k) => batch.delete_cf(cf, k),
        Op::DeleteRange(s, e) => batch.delete_range_cf(cf, s, e),
        Op::Clear => store.clear_cf(batch, cf, max_put.as_deref()),
    }
}

impl StoreStorage for RocksStore {
    fn open_keyspace(&mut self, name: &str) -> Result<KeyspaceId> {
        self.health.check()?;
        check_name(NameKind::Keyspace, name)?;
        let full = format!("{}{name}", self.prefix);
        self.ensure_cf(&full)?;
        Ok(self.id(Family::Live(full)))
    }

    fn open_snapshot_keyspace(&mut self, snapshot: &str, name: &str) -> Result<KeyspaceId> {
        self.snapshot_keyspace(snapshot, name)
    }

    fn keyspaces(&self) -> Result<Vec<String>> {
        self.health.check()?;
        let names = self.db.cf_names();
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix(&self.prefix))
            .filter(|ks| !ks.contains(':'))
            .map(str::to_string)
            .collect())
    }

    fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.health.before_read()?;
        Ok(self.db.get_cf(&self.cf(ks)?, key)?)
    }

    fn get_many(&self, ks: KeyspaceId, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.health.before_read()?;
        let cf = self.cf(ks)?;
        self.db
            .batched_multi_get_cf(&cf, keys, false)
            .into_iter()
            .map(|r| r.map(|v| v.map(|p| p.to_vec())).map_err(StorageError::from))
            .collect()
    }

    fn put(&mut self, ks: KeyspaceId, key: &[u8], value: &[u8]) -> Result<()> {
        self.health.before_write()?;
        let cf = self.writable(ks)?;
        Ok(self.db.put_cf_opt(&cf, key, value, &no_wal())?)
    }

    fn delete(&mut self, ks: KeyspaceId, key: &[u8]) -> Result<()> {
        self.health.before_write()?;
        let cf = self.writable(ks)?;
        Ok(self.db.delete_cf_opt(&cf, key, &no_wal())?)
    }

    fn scan(
        &self,
        ks: KeyspaceId,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
    ) -> Result<Box<dyn Cursor>> {
        self.health.check()?;
        if let (Some(s), Some(e)) = (start, end) {
            check_range(s, e)?;
        }
        let mut ro = ReadOptions::default();
        if let Some(e) = end {
            ro.set_iterate_upper_bound(e.to_vec());
        }
        let mut iter = self.db.raw_iterator_cf_opt(&self.cf(ks)?, ro);
        match start {
            Some(s) => iter.seek(s),
            None => iter.seek_to_first(),
        }
        // SAFETY: the iterator borrows the database, which `RocksCursor`
        // keeps alive through `_db`; fields drop in order, iterator first.
        let iter: RawIter = unsafe { std::mem::transmute(iter) };
        Ok(Box::new(RocksCursor {
            iter,
            _db: self.db.clone(),
            health: self.health.clone(),
        }))
    }

    fn delete_range(&mut self, ks: KeyspaceId, start: &[u8], end: &[u8]) -> Result<()> {
        self.health.check()?;
        check_range(start, end)?;
        self.health.before_write()?;
        Ok(self
            .db
            .delete_range_cf_opt(&self.writable(ks)?, start, end, &no_wal())?)
    }

    fn clear(&mut self, ks: KeyspaceId) -> Result<()> {
        self.health.before_write()?;
        let mut batch = WriteBatch::default();
        self.clear_cf(&mut batch, &self.writable(ks)?, None);
        Ok(self.db.write_opt(batch, &no_wal())?)
    }

    fn is_empty(&self, ks: KeyspaceId) -> Result<bool> {
        self.health.check()?;
        let mut it = self.db.raw_iterator_cf(&self.cf(ks)?);
        it.seek_to_first();
        it.status()?;
        Ok(!it.valid())
    }

    fn write(&mut self, batch: Vec<(KeyspaceId, Vec<Op>)>, sync: bool) -> Result<()> {
        self.health.check()?;
        check_batch(&batch)?;
        self.health.before_write()?;
        let mut wb = WriteBatch::default();
        // A keyspace may appear more than once in a batch.
        let mut max_put: HashMap<KeyspaceId, Option<Vec<u8>>> = HashMap::new();
        for (ks, ops) in batch {
            let cf = self.writable(ks)?;
            let max_put = max_put.entry(ks).or_default();
            for op in ops {
                add_op(&mut wb, self, &cf, max_put, op);
            }
        }
        self.db.write_opt(wb, &no_wal())?;
        if sync {
            // If this fails the batch is in the memtable but the caller is
            // told the write failed: `flush_all` poisons the backend, so
            // nothing reads it and a restart drops it.
            self.flush_all(true)?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.flush_all(true)
    }
    fn create_snapshot(&mut self, name: &str) -> Result<()> {
        self.snapshot_create(name)
    }

    fn restore_snapshot(&mut self, name: &str) -> Result<()> {
        self.snapshot_restore(name)
    }

    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.snapshot_drop(name)
    }

    fn list_snapshots(&self) -> Result<Vec<String>> {
        self.snapshot_list()
    }
}

struct RocksCursor {
    iter: RawIter,
    _db: Arc<DbHandle>,
    health: Arc<Health>,
}

impl Cursor for RocksCursor {
    fn next(&mut self, max: usize) -> Result<Vec<Entry>> {
        self.health.before_read()?;
        let mut out = Vec::new();
        while out.len() < max.min(super::MAX_CURSOR_BATCH) {
            match (self.iter.key(), self.iter.value()) {
                (Some(k), Some(v)) => out.push((k.to_vec(), v.to_vec())),
                _ => break,
            }
            self.iter.next();
        }
        self.iter.status()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options that keep an open cheap (see `db_options`) are the ones
    /// the open database runs with, read back from the OPTIONS file RocksDB
    /// writes at every open, and no `LOG` file is written.
    #[test]
    fn a_database_opens_with_the_cheap_open_options() {
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..2 {
            let rocks = RocksBackend::open(dir.path()).unwrap();
            let mut s = rocks.open_store("s").unwrap();
            let ks = s.open_keyspace("data").unwrap();
            s.put(ks, b"k", b"v").unwrap();
            s.sync().unwrap();
        }
        let db = dir.path().join("db");
        let names: Vec<String> = std::fs::read_dir(&db)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with("LOG")),
            "RocksDB wrote an info log: {names:?}"
        );
        let latest = names
            .iter()
            .filter(|n| n.starts_with("OPTIONS-"))
            .max_by_key(|n| n["OPTIONS-".len()..].parse::<u64>().unwrap())
            .expect("an OPTIONS file");
        let options = std::fs::read_to_string(db.join(latest)).unwrap();
        for line in [
            "max_file_opening_threads=1",
            "skip_stats_update_on_db_open=true",
            "atomic_flush=true",
            "avoid_flush_during_shutdown=true",
        ] {
            assert!(
                options.lines().any(|l| l.trim() == line),
                "{latest} lacks {line}"
            );
        }
    }
}
