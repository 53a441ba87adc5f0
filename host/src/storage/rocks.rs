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
//! Snapshots (`snapshots/{store}/{name}/`): one exported directory per
//! keyspace, hard links to the family's SST files (see [`super::sst`]),
//! and `snapshot.json` listing them. Creating one flushes and links; a
//! restore drops each family and ingests the snapshot's files by link.
//! Both cost in proportion to the store's file count, not its bytes, and
//! touch only this store's families. A snapshot is built under
//! `staging/{store}/partial/{name}`, renamed to `staging/{store}/ready/`
//! when whole, then moved into place (`settle_snapshots` finishes that move
//! after a crash). A restore is made atomic by `restoring/{store}`, written
//! before the first family is dropped and removed after the last is
//! ingested: opening the store finishes a restore a crash interrupted.

use super::sst::{self, SstFile};
use super::{
    check_batch, check_name, check_range, Backend, Cursor, Entry, Health, KeyspaceId, NameKind, Op,
    Result, StorageError, StoreStorage,
};
use crate::file;
use rocksdb::{
    BlockBasedOptions, BoundColumnFamily, Cache, ColumnFamilyDescriptor, FlushOptions, InfoLogger,
    LogLevel, Options, ReadOptions, WriteBatch, WriteOptions,
};
use std::collections::{HashMap, HashSet};
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
/// checkpoint of the whole database) copies per batch.
const RESTORE_BATCH_BYTES: usize = 4 << 20;
/// The file in a snapshot directory that lists its keyspaces and files.
const SNAPSHOT_INDEX: &str = "snapshot.json";

/// `snapshot.json`: each keyspace of the store at the snapshot, with the
/// directory (under the snapshot's) holding its exported files.
#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotIndex {
    keyspaces: Vec<SnapshotKeyspace>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotKeyspace {
    name: String,
    dir: String,
    files: Vec<SstFile>,
}

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
    // A process opens a database per store, hundreds at a start. What an
    // open costs beyond reading the MANIFEST, each measured at 1,000 stores
    // (docs/bench/stores.md):
    // - 16 threads started per open to load table files (RocksDB's
    //   default): a state store's few files load as fast in the caller;
    opts.set_max_file_opening_threads(1);
    // - a `LOG` file per database with every option dumped at each open
    //   (see `open_options`);
    // - reading every table file's properties to refresh statistics that
    //   only steer compaction.
    opts.set_skip_stats_update_on_db_open(true);
    opts
}

/// `db_options` as the database is opened with.
fn open_options() -> Result<Options> {
    // See `DbHandle::drop`, which flushes at close instead.
    let mut opts = db_options().get_options_from_string("avoid_flush_during_shutdown=true")?;
    // Set here, not in `db_options`: options parsed from a string do not
    // keep the callback alive. Warnings and errors go to the process's log
    // rather than a `LOG` file per database; the options dump (header
    // level) and information messages are dropped, and so are the
    // warnings RocksDB gives for what the store does on purpose (BENIGN).
    opts.set_info_logger(InfoLogger::new_callback_logger(
        LogLevel::Warn,
        |level, msg| match level {
            LogLevel::Warn if BENIGN.iter().any(|b| msg.contains(b)) => {
                tracing::debug!(target: "txstore::rocksdb", "{}", msg.trim_end())
            }
            LogLevel::Warn => tracing::warn!(target: "txstore::rocksdb", "{}", msg.trim_end()),
            LogLevel::Error | LogLevel::Fatal => {
                tracing::error!(target: "txstore::rocksdb", "{}", msg.trim_end())
            }
            LogLevel::Debug | LogLevel::Info | LogLevel::Header => {}
        },
    ));
    Ok(opts)
}

/// RocksDB warnings about what a snapshot store does by design: opening
/// table files it exported and ingested back (no unique ID recorded, a
/// read-ahead guessed for a file never read before). An operator cannot
/// act on them; they stay at debug level (`TXSTORE_LOG=debug`).
const BENIGN: &[&str] = &[
    "is calculated based on heuristics",
    "is calculated based on TailPrefetchStats",
    "opened without unique ID to verify",
];

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

    fn kind(&self) -> &'static str {
        "rocksdb"
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

    /// Builds view `cf` of `keyspace` in `snapshot` unless this process
    /// built it since the snapshot was last replaced: an empty family the
    /// snapshot's files are ingested into by link, so its cost follows the
    /// file count, once per snapshot version.
    fn view(&self, snapshot: &str, keyspace: &str, cf: &str) -> Result<()> {
        let mut views = self.db.views.lock().unwrap();
        if views.contains(cf) {
            return Ok(());
        }
        self.settle_snapshots()?;
        let dir = self.snapshots.join(snapshot);
        if !dir.exists() {
            return Err(StorageError::NoSuchSnapshot(snapshot.into()));
        }
        if dir.join("CURRENT").exists() {
            return Err(StorageError::Io(format!(
                "snapshot {snapshot:?} ({}) is of an earlier format that cannot be read in place; create it again",
                dir.display()
            )));
        }
        let index = self.read_index(snapshot)?;
        if self.db.cf_handle(cf).is_some() {
            self.db.drop_cf(cf)?;
        }
        self.db.create_cf(cf, &cf_options())?;
        if let Some(saved) = index.keyspaces.iter().find(|k| k.name == keyspace) {
            let mut files = saved.files.clone();
            sst::ingest_order(&mut files);
            let handle = self.db.cf_handle(cf).expect("created above");
            sst::ingest(&self.db, &handle, &dir.join(&saved.dir), &files)?;
        }
        views.insert(cf.to_string());
        Ok(())
    }

    /// Drops the views of `snapshot` (it was replaced or dropped): their
    /// files go, and the next read builds the view again.
    fn drop_views(&self, snapshot: &str) -> Result<()> {
        let start = format!("{}:{snapshot}:", self.prefix);
        let mut views = self.db.views.lock().unwrap();
        let stale: Vec<String> = views
            .iter()
            .filter(|v| v.starts_with(&start))
            .cloned()
            .collect();
        for cf in stale {
            views.remove(&cf);
            self.db.drop_cf(&cf)?;
        }
        Ok(())
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

    /// Moves built snapshots into place and removes half-built ones: what a
    /// crash during `create_snapshot` left.
    fn settle_snapshots(&self) -> Result<()> {
        if self.partial.exists() {
            std::fs::remove_dir_all(&self.partial)?;
        }
        let Ok(entries) = std::fs::read_dir(&self.ready) else {
            return Ok(());
        };
        for entry in entries {
            let built = entry?.path();
            let done = self.snapshots.join(built.file_name().unwrap());
            file::create_dir_all(&self.snapshots)?;
            if done.exists() {
                std::fs::remove_dir_all(&done)?;
            }
            file::rename(&built, &done)?;
            sync_dir(&self.snapshots)?;
            sync_dir(&self.ready)?;
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

    /// Finishes a restore a crash interrupted (see the module comment).
    fn finish_restore(&self) -> Result<()> {
        let Ok(marker) = std::fs::read_to_string(&self.restoring) else {
            return Ok(());
        };
        // The marker is written atomically before the first family is
        // dropped; one without its newline (torn, by an earlier build that
        // wrote it in place) was cut short before anything was dropped.
        match marker.strip_suffix('\n') {
            Some(name) => {
                self.settle_snapshots()?;
                let index = self.read_index(name)?;
                self.restore_files(name, &index)
            }
            None => {
                file::remove_file(&self.restoring)?;
                sync_dir(self.restoring.parent().unwrap())
            }
        }
    }

    fn read_index(&self, name: &str) -> Result<SnapshotIndex> {
        let path = self.snapshots.join(name).join(SNAPSHOT_INDEX);
        let text = std::fs::read(&path)?;
        serde_json::from_slice(&text).map_err(|e| {
            StorageError::Io(format!(
                "snapshot index {} is unreadable: {e}",
                path.display()
            ))
        })
    }

    /// Replaces every keyspace of this store with the snapshot's files.
    /// Idempotent, so `finish_restore` can run it again from the start.
    fn restore_files(&self, name: &str, index: &SnapshotIndex) -> Result<()> {
        let dir = self.snapshots.join(name);
        let parent = self.restoring.parent().unwrap();
        file::create_dir_all(parent)?;
        file::write_atomic(&self.restoring, format!("{name}\n").as_bytes())?;
        let mut families: Vec<String> = self.own_families().into_iter().map(|(_, f)| f).collect();
        families.extend(
            index
                .keyspaces
                .iter()
                .map(|k| format!("{}{}", self.prefix, k.name)),
        );
        families.sort();
        families.dedup();
        for (done, full) in families.iter().enumerate() {
            self.restore_seam(done)?;
            // A dropped family's files go when nothing reads them; an
            // empty family of the same name takes its place.
            if self.db.cf_handle(full).is_some() {
                self.db.drop_cf(full)?;
            }
            self.db.create_cf(full, &cf_options())?;
            {
                let mut names = self.db.cfs.lock().unwrap();
                if !names.contains(full) {
                    names.push(full.clone());
                }
            }
            let ks = full.strip_prefix(&self.prefix).unwrap();
            if let Some(saved) = index.keyspaces.iter().find(|k| k.name == ks) {
                let mut files = saved.files.clone();
                sst::ingest_order(&mut files);
                let cf = self.db.cf_handle(full).expect("created above");
                sst::ingest(&self.db, &cf, &dir.join(&saved.dir), &files)?;
            }
        }
        file::remove_file(&self.restoring)?;
        sync_dir(parent)
    }

    #[cfg(test)]
    fn restore_seam(&self, done: usize) -> Result<()> {
        match self.restore_stops_after {
            Some(n) if n == done => Err(StorageError::Io("test: restore stopped".into())),
            _ => Ok(()),
        }
    }

    #[cfg(not(test))]
    fn restore_seam(&self, _done: usize) -> Result<()> {
        Ok(())
    }

    /// Restores a snapshot of the earlier format (a checkpoint of the whole
    /// database) by copying it: kept so such snapshots stay usable.
    fn restore_checkpoint(&mut self, path: &Path) -> Result<()> {
        let snap_cfs = Db::list_cf(&Options::default(), path)?;
        let snap = Db::open_cf_for_read_only(&Options::default(), path, &snap_cfs, false)?;
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
        self.health.check()?;
        check_name(NameKind::Snapshot, snapshot)?;
        check_name(NameKind::Keyspace, name)?;
        self.settle_snapshots()?;
        if !self.snapshots.join(snapshot).exists() {
            return Err(StorageError::NoSuchSnapshot(snapshot.into()));
        }
        let cf = format!("{}:{snapshot}:{name}", self.prefix);
        Ok(self.id(Family::View {
            snapshot: snapshot.to_string(),
            keyspace: name.to_string(),
            cf,
        }))
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

    fn get_many(&self, ks: KeyspaceId, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
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
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        self.settle_snapshots()?;
        // Every family at one point first, so the per-family flush of the
        // export below has nothing to cut (it would break the prefix rule).
        self.flush_all(false)?;
        let building = self.partial.join(name);
        file::create_dir_all(&building)?;
        let mut index = SnapshotIndex {
            keyspaces: Vec::new(),
        };
        for (i, (ks, full)) in self.own_families().into_iter().enumerate() {
            let cf = self.db.cf_handle(&full).expect("listed families exist");
            let dir = i.to_string();
            let files = sst::export(&self.db, &cf, &building.join(&dir))?;
            index.keyspaces.push(SnapshotKeyspace {
                name: ks,
                dir,
                files,
            });
        }
        let text = serde_json::to_vec_pretty(&index).expect("the index serializes");
        file::write_atomic(&building.join(SNAPSHOT_INDEX), &text)?;
        file::create_dir_all(&self.ready)?;
        file::rename(&building, &self.ready.join(name))?;
        sync_dir(&self.ready)?;
        self.settle_snapshots()?;
        self.drop_views(name)
    }

    fn restore_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        self.settle_snapshots()?;
        let path = self.snapshots.join(name);
        if !path.exists() {
            return Err(StorageError::NoSuchSnapshot(name.into()));
        }
        if path.join("CURRENT").exists() {
            return self.restore_checkpoint(&path);
        }
        let index = self.read_index(name)?;
        // Earlier writes of every family durable first: a restore is a
        // sync point (as `create_snapshot` is).
        self.flush_all(false)?;
        // A restore cut short leaves families dropped or half-filled: the
        // backend refuses every call until a restart finishes it.
        self.health.sync(false, || self.restore_files(name, &index))
    }

    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        self.settle_snapshots()?;
        self.drop_views(name)?;
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::MemoryBackend;
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

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

    /// Snapshots created and restored between random calls leave RocksDB
    /// as the memory backend (the oracle) after every call and after a
    /// reopen, and never touch another store of the same database.
    #[test]
    fn snapshots_agree_with_the_memory_backend() {
        for seed in 0..24 {
            let dir = tempfile::tempdir().unwrap();
            let memory = MemoryBackend::new();
            let mut m = memory.open_store("s").unwrap();
            let mk = open(&mut *m);
            {
                let rocks = RocksBackend::open(dir.path()).unwrap();
                let mut r = rocks.open_store("s").unwrap();
                let rk = open(&mut *r);
                let mut other = rocks.open_store("t").unwrap();
                let ok = open(&mut *other);
                other.put(ok[0], b"t", b"kept").unwrap();
                for (n, call) in calls_with_snapshots(seed, 80).iter().enumerate() {
                    let (a, b) = (apply(&mut *r, rk, call), apply(&mut *m, mk, call));
                    assert_eq!(
                        a.is_ok(),
                        b.is_ok(),
                        "seed {seed}, call {n} {call:?}: {a:?}, {b:?}"
                    );
                    assert_eq!(
                        dump(&*r, rk),
                        dump(&*m, mk),
                        "seed {seed}, after call {n}: {call:?}"
                    );
                    assert_eq!(
                        views(&mut *r),
                        views(&mut *m),
                        "seed {seed}, snapshots after call {n}"
                    );
                }
                assert_eq!(other.get(ok[0], b"t").unwrap(), Some(b"kept".to_vec()));
                assert_eq!(other.list_snapshots().unwrap(), Vec::<String>::new());
            }
            let rocks = RocksBackend::open(dir.path()).unwrap();
            let mut r = rocks.open_store("s").unwrap();
            let rk = open(&mut *r);
            assert_eq!(dump(&*r, rk), dump(&*m, mk), "seed {seed}, after a reopen");
            assert_eq!(r.list_snapshots().unwrap(), m.list_snapshots().unwrap());
            for n in 0..2 {
                let call = Call::Restore(n);
                let (a, b) = (apply(&mut *r, rk, &call), apply(&mut *m, mk, &call));
                assert_eq!(a.is_ok(), b.is_ok(), "seed {seed}, {call:?} after a reopen");
                assert_eq!(
                    dump(&*r, rk),
                    dump(&*m, mk),
                    "seed {seed}, {call:?} after a reopen"
                );
            }
        }
    }

    /// Both keyspaces as they are in snapshots `s0` and `s1` (None when
    /// it does not exist), checking that they refuse writes.
    fn views(s: &mut dyn StoreStorage) -> Vec<Option<[Vec<Entry>; 2]>> {
        (0..2)
            .map(|n| {
                let snap = format!("s{n}");
                let ks = [
                    s.open_snapshot_keyspace(&snap, "k0").ok()?,
                    s.open_snapshot_keyspace(&snap, "k1").unwrap(),
                ];
                assert!(matches!(
                    s.put(ks[0], b"k", b"v"),
                    Err(StorageError::Denied(_))
                ));
                let batch = vec![(ks[1], vec![Op::Clear])];
                assert!(matches!(
                    s.write(batch, false),
                    Err(StorageError::Denied(_))
                ));
                Some(dump(s, ks))
            })
            .collect()
    }

    fn contents(s: &dyn StoreStorage, ks: KeyspaceId) -> BTreeMap<Vec<u8>, Vec<u8>> {
        dump(s, [ks, ks])[0].iter().cloned().collect()
    }

    /// Files on several levels, overlapping level-0 files and deletes:
    /// a restore gives the newest version of every key, and the restored
    /// files are links to the snapshot's, not copies.
    #[test]
    fn a_restore_links_the_files_of_every_level_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let mut s = rocks.open_store("s").unwrap();
        let ks = s.open_keyspace("main").unwrap();
        let key = |i: u32| format!("key{i:05}").into_bytes();
        let mut oracle = BTreeMap::new();
        for round in 0..4u32 {
            for i in (0..2000).filter(|i| i % (round + 1) == 0) {
                let v = format!("r{round}-{i}").into_bytes();
                s.put(ks, &key(i), &v).unwrap();
                oracle.insert(key(i), v);
            }
            for i in (0..2000).filter(|i| i % 7 == round) {
                s.delete(ks, &key(i)).unwrap();
                oracle.remove(&key(i));
            }
            s.sync().unwrap();
            if round == 1 {
                let cf = rocks.db.cf_handle("s:main").unwrap();
                rocks.db.compact_range_cf(&cf, None::<&[u8]>, None::<&[u8]>);
            }
        }
        let levels: Vec<i32> = rocks
            .db
            .live_files()
            .unwrap()
            .iter()
            .filter(|f| f.column_family_name == "s:main")
            .map(|f| f.level)
            .collect();
        assert!(
            levels.iter().filter(|l| **l == 0).count() >= 2 && levels.iter().any(|l| *l > 0),
            "{levels:?}"
        );
        s.create_snapshot("c").unwrap();
        for i in 0..2500 {
            s.put(ks, &key(i), b"later").unwrap();
        }
        s.sync().unwrap();
        s.restore_snapshot("c").unwrap();
        assert!(contents(&*s, ks) == oracle, "restored contents differ");
        for f in rocks
            .db
            .live_files()
            .unwrap()
            .iter()
            .filter(|f| f.column_family_name == "s:main")
        {
            let path = dir.path().join("db").join(f.name.trim_start_matches('/'));
            assert!(
                std::fs::metadata(&path).unwrap().nlink() >= 2,
                "{} was copied",
                path.display()
            );
        }
        drop(s);
        drop(rocks);
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let mut s = rocks.open_store("s").unwrap();
        let ks = s.open_keyspace("main").unwrap();
        assert!(
            contents(&*s, ks) == oracle,
            "restored contents differ after a reopen"
        );
    }

    /// A restore stopped after its first keyspace is finished when the
    /// store is next opened; a marker cut short (no newline) means the
    /// restore never started and is removed.
    #[test]
    fn a_restore_cut_short_is_finished_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let expect;
        {
            let rocks = RocksBackend::open(dir.path()).unwrap();
            let mut s = rocks.store("s").unwrap();
            let ks = open(&mut s);
            s.put(ks[0], b"a", b"1").unwrap();
            s.put(ks[1], b"b", b"2").unwrap();
            s.create_snapshot("c").unwrap();
            expect = dump(&s, ks);
            s.put(ks[0], b"a", b"changed").unwrap();
            s.delete(ks[1], b"b").unwrap();
            s.put(ks[1], b"x", b"new").unwrap();
            s.restore_stops_after = Some(1);
            assert!(s.restore_snapshot("c").is_err());
            assert!(dir.path().join("restoring/s").exists());
            // Nothing reads the half-restored store.
            assert!(s.get(ks[1], b"x").is_err());
        }
        {
            let rocks = RocksBackend::open(dir.path()).unwrap();
            let mut s = rocks.open_store("s").unwrap();
            let ks = open(&mut *s);
            assert_eq!(dump(&*s, ks), expect);
            assert!(!dir.path().join("restoring/s").exists());
            s.put(ks[0], b"a", b"after").unwrap();
        }
        std::fs::write(dir.path().join("restoring/s"), "c").unwrap();
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let mut s = rocks.open_store("s").unwrap();
        let ks = open(&mut *s);
        assert_eq!(s.get(ks[0], b"a").unwrap(), Some(b"after".to_vec()));
        assert!(!dir.path().join("restoring/s").exists());
    }

    /// What a crash inside `create_snapshot` leaves: a half-built snapshot
    /// is discarded, a built one not yet moved is moved into place.
    #[test]
    fn a_snapshot_cut_short_is_discarded_and_a_built_one_moved_in() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksBackend::open(dir.path()).unwrap();
        let mut s = rocks.open_store("s").unwrap();
        let ks = open(&mut *s);
        s.put(ks[0], b"a", b"1").unwrap();
        s.create_snapshot("c").unwrap();
        let staging = dir.path().join("staging/s");
        std::fs::create_dir_all(staging.join("ready")).unwrap();
        std::fs::rename(dir.path().join("snapshots/s/c"), staging.join("ready/c")).unwrap();
        std::fs::create_dir_all(staging.join("partial/d/0")).unwrap();
        assert_eq!(s.list_snapshots().unwrap(), vec!["c".to_string()]);
        assert!(!staging.join("partial").exists());
        s.put(ks[0], b"a", b"2").unwrap();
        s.restore_snapshot("c").unwrap();
        assert_eq!(s.get(ks[0], b"a").unwrap(), Some(b"1".to_vec()));
    }
}
