//! A store's snapshots (`snapshots/{store}/{name}/`): one exported directory per
//! keyspace, hard links to the family's SST files (see `storage/sst.rs`),
//! and `snapshot.json` listing them. Creating one flushes and links; a
//! restore drops each family and ingests the snapshot's files by link.
//! Both cost in proportion to the store's file count, not its bytes, and
//! touch only this store's families. A snapshot is built under
//! `staging/{store}/partial/{name}`, renamed to `staging/{store}/ready/`
//! when whole, then moved into place (`settle_snapshots` finishes that move
//! after a crash). A restore is made atomic by `restoring/{store}`, written
//! before the first family is dropped and removed after the last is
//! ingested: opening the store finishes a restore a crash interrupted.

use super::options::{cf_options, no_wal};
use super::{sync_dir, Db, Family, RocksStore};
use crate::file;
use crate::storage::sst::{self, SstFile};
use crate::storage::{check_name, KeyspaceId, NameKind, Result, StorageError};
use rocksdb::{Options, WriteBatch};
use std::path::Path;

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

impl RocksStore {
    /// Builds view `cf` of `keyspace` in `snapshot` unless this process
    /// built it since the snapshot was last replaced: an empty family the
    /// snapshot's files are ingested into by link, so its cost follows the
    /// file count, once per snapshot version.
    pub(super) fn view(&self, snapshot: &str, keyspace: &str, cf: &str) -> Result<()> {
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

    /// Moves built snapshots into place and removes half-built ones: what a
    /// crash during `create_snapshot` left.
    pub(super) fn settle_snapshots(&self) -> Result<()> {
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

    /// Finishes a restore a crash interrupted (see the module comment).
    pub(super) fn finish_restore(&self) -> Result<()> {
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

    pub(super) fn snapshot_keyspace(&mut self, snapshot: &str, name: &str) -> Result<KeyspaceId> {
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

    pub(super) fn snapshot_create(&mut self, name: &str) -> Result<()> {
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

    pub(super) fn snapshot_restore(&mut self, name: &str) -> Result<()> {
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

    pub(super) fn snapshot_drop(&mut self, name: &str) -> Result<()> {
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

    pub(super) fn snapshot_list(&self) -> Result<Vec<String>> {
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

#[cfg(test)]
mod tests {
    use super::super::RocksBackend;
    use crate::storage::testing::*;
    use crate::storage::{
        Backend, Entry, KeyspaceId, MemoryBackend, Op, StorageError, StoreStorage,
    };
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

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
