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

use super::{
    check_batch, check_name, check_range, Backend, Cursor, Entry, Health, KeyspaceId, NameKind, Op,
    Result, StorageError, StoreStorage,
};
use rocksdb::{
    checkpoint::Checkpoint, BlockBasedOptions, BoundColumnFamily, Cache, ColumnFamilyDescriptor,
    FlushOptions, Options, ReadOptions, WriteBatch, WriteOptions,
};
use std::collections::HashMap;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

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

/// How many bytes a snapshot restore copies per batch.
const RESTORE_BATCH_BYTES: usize = 4 << 20;

/// A RocksDB database in a state directory, shared by the stores in it.
pub struct RocksBackend {
    db: Arc<DbHandle>,
    dir: PathBuf,
    health: Arc<Health>,
}

/// One block cache for every database of the process, so memory stays
/// bounded however many stores a process opens (as Kafka Streams'
/// bounded-memory config does).
const BLOCK_CACHE_BYTES: usize = 256 << 20;
/// Bloom filter bits per key: about 1% false positives, so a read of an
/// absent key (roll-back's prior values, point reads) skips the files.
const BLOOM_BITS_PER_KEY: f64 = 10.0;

fn block_cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Cache::new_lru_cache(BLOCK_CACHE_BYTES))
}

/// The options of every column family (keyspace).
fn cf_options() -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(block_cache());
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
    let mut opts = Options::default();
    opts.set_block_based_table_factory(&table);
    opts
}

fn db_options() -> Options {
    let mut opts = cf_options();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_atomic_flush(true);
    opts
}

/// `db_options` as the database is opened with.
fn open_options() -> Result<Options> {
    // See `DbHandle::drop`, which flushes at close instead.
    Ok(db_options().get_options_from_string("avoid_flush_during_shutdown=true")?)
}

fn no_wal() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.disable_wal(true);
    w
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
        let health = Arc::<Health>::default();
        let db = Arc::new(DbHandle {
            db,
            health: health.clone(),
            cfs: Mutex::new(cfs),
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

/// Flushes every column family of `db` at one point (atomic flush).
fn flush_db(db: &DbHandle) -> Result<()> {
    let names = db.cf_names();
    let handles: Vec<_> = names.iter().filter_map(|n| db.cf_handle(n)).collect();
    let mut fo = FlushOptions::default();
    fo.set_wait(true);
    db.flush_cfs_opt(&handles.iter().collect::<Vec<_>>(), &fo)?;
    Ok(())
}

impl Backend for RocksBackend {
    fn open_store(&self, store: &str) -> Result<Box<dyn StoreStorage>> {
        check_name(NameKind::Store, store)?;
        let snapshots = self.dir.join("snapshots").join(store);
        Ok(Box::new(RocksStore {
            db: self.db.clone(),
            prefix: format!("{store}:"),
            cfs: Vec::new(),
            snapshots,
            health: self.health.clone(),
        }))
    }

    fn kind(&self) -> &'static str {
        "rocksdb"
    }
}

struct RocksStore {
    db: Arc<DbHandle>,
    /// `{store}:`, the start of every column family name of this store.
    prefix: String,
    /// Column family names by `KeyspaceId`.
    cfs: Vec<String>,
    snapshots: PathBuf,
    health: Arc<Health>,
}

impl RocksStore {
    fn cf(&self, ks: KeyspaceId) -> Arc<BoundColumnFamily<'_>> {
        let name = &self.cfs[ks.0 as usize];
        self.db
            .cf_handle(name)
            .expect("an opened keyspace's column family exists")
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

    /// Finishes a snapshot replacement a crash interrupted (see `create_snapshot`).
    fn settle_snapshots(&self) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(&self.snapshots) else {
            return Ok(());
        };
        for entry in entries {
            let path = entry?.path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if let Some(base) = name.strip_suffix(".new") {
                let done = self.snapshots.join(base);
                if done.exists() {
                    std::fs::remove_dir_all(&done)?;
                }
                std::fs::rename(&path, &done)?;
                sync_dir(&self.snapshots)?;
            }
        }
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
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
        let id = match self.cfs.iter().position(|n| *n == full) {
            Some(i) => i,
            None => {
                self.cfs.push(full);
                self.cfs.len() - 1
            }
        };
        Ok(KeyspaceId(id as u32))
    }

    fn keyspaces(&self) -> Result<Vec<String>> {
        self.health.check()?;
        let names = self.db.cf_names();
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix(&self.prefix))
            .map(str::to_string)
            .collect())
    }

    fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.health.before_read()?;
        Ok(self.db.get_cf(&self.cf(ks), key)?)
    }

    fn get_many(&self, ks: KeyspaceId, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.health.before_read()?;
        let cf = self.cf(ks);
        self.db
            .batched_multi_get_cf(&cf, keys, false)
            .into_iter()
            .map(|r| r.map(|v| v.map(|p| p.to_vec())).map_err(StorageError::from))
            .collect()
    }

    fn put(&mut self, ks: KeyspaceId, key: &[u8], value: &[u8]) -> Result<()> {
        self.health.before_write()?;
        Ok(self.db.put_cf_opt(&self.cf(ks), key, value, &no_wal())?)
    }

    fn delete(&mut self, ks: KeyspaceId, key: &[u8]) -> Result<()> {
        self.health.before_write()?;
        Ok(self.db.delete_cf_opt(&self.cf(ks), key, &no_wal())?)
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
        let mut iter = self.db.raw_iterator_cf_opt(&self.cf(ks), ro);
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
            .delete_range_cf_opt(&self.cf(ks), start, end, &no_wal())?)
    }

    fn clear(&mut self, ks: KeyspaceId) -> Result<()> {
        self.health.before_write()?;
        let mut batch = WriteBatch::default();
        self.clear_cf(&mut batch, &self.cf(ks), None);
        Ok(self.db.write_opt(batch, &no_wal())?)
    }

    fn is_empty(&self, ks: KeyspaceId) -> Result<bool> {
        self.health.check()?;
        let mut it = self.db.raw_iterator_cf(&self.cf(ks));
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
            let cf = self.cf(ks);
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
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        std::fs::create_dir_all(&self.snapshots)?;
        let staged = self.snapshots.join(format!("{name}.new"));
        if staged.exists() {
            std::fs::remove_dir_all(&staged)?;
        }
        // RocksDB builds the checkpoint under a temporary name and renames
        // it when complete, so `{name}.new` existing means it is whole; the
        // swap below is finished by `settle_snapshots` after a crash.
        Checkpoint::new(&self.db.db)?.create_checkpoint(&staged)?;
        self.settle_snapshots()
    }

    fn restore_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        self.settle_snapshots()?;
        let path = self.snapshots.join(name);
        if !path.exists() {
            return Err(StorageError::NoSuchSnapshot(name.into()));
        }
        let snap_cfs = Db::list_cf(&Options::default(), &path)?;
        let snap = Db::open_cf_for_read_only(&Options::default(), &path, &snap_cfs, false)?;
        let mut ours: Vec<String> = self.db.cf_names();
        ours.extend(snap_cfs.iter().cloned());
        ours.sort();
        ours.dedup();
        ours.retain(|n| n.starts_with(&self.prefix));
        for full in &ours {
            self.ensure_cf(full)?;
            let cf = self.db.cf_handle(full).unwrap();
            let mut batch = WriteBatch::default();
            self.clear_cf(&mut batch, &cf, None);
            if let Some(scf) = snap.cf_handle(full) {
                let mut it = snap.raw_iterator_cf(&scf);
                it.seek_to_first();
                while let (Some(k), Some(v)) = (it.key(), it.value()) {
                    batch.put_cf(&cf, k, v);
                    if batch.size_in_bytes() >= RESTORE_BATCH_BYTES {
                        self.db.write_opt(std::mem::take(&mut batch), &no_wal())?;
                    }
                    it.next();
                }
                it.status()?;
            }
            self.db.write_opt(batch, &no_wal())?;
        }
        self.flush_all(false)
    }

    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        self.settle_snapshots()?;
        let path = self.snapshots.join(name);
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
            sync_dir(&self.snapshots)?;
        }
        Ok(())
    }

    fn list_snapshots(&self) -> Result<Vec<String>> {
        self.health.check()?;
        self.settle_snapshots()?;
        let Ok(entries) = std::fs::read_dir(&self.snapshots) else {
            return Ok(Vec::new());
        };
        let mut names = Vec::new();
        for entry in entries {
            names.push(entry?.file_name().to_string_lossy().to_string());
        }
        names.sort();
        Ok(names)
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
