//! In-memory backend for fast tests: ordered maps behind `Arc`s, so a
//! cursor keeps the view it was opened on while later writes copy on write.
//! Nothing survives the process; "durable" means "kept until drop".
//! Injected faults and the failed-sync rule behave as on RocksDB, so a
//! guest sees the same errors on either backend.

use super::{
    check_batch, check_name, check_range, Backend, Cursor, Entry, Health, KeyspaceId, NameKind, Op,
    Result, StorageError, StoreStorage,
};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
struct StoreData {
    keyspaces: BTreeMap<String, Arc<Map>>,
    snapshots: BTreeMap<String, BTreeMap<String, Arc<Map>>>,
}

/// Stores kept in memory; reopening a store in the same backend sees its data.
#[derive(Default)]
pub struct MemoryBackend {
    stores: Mutex<HashMap<String, Arc<Mutex<StoreData>>>>,
    health: Arc<Health>,
}

impl MemoryBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Test seam: the next sync of any store here fails.
    #[cfg(test)]
    pub(crate) fn fail_next_sync(&self) {
        self.health.fail_next_sync();
    }
}

impl Backend for MemoryBackend {
    fn open_store(&self, store: &str) -> Result<Box<dyn StoreStorage>> {
        check_name(NameKind::Store, store)?;
        let data = self
            .stores
            .lock()
            .unwrap()
            .entry(store.to_string())
            .or_default()
            .clone();
        Ok(Box::new(MemoryStore {
            data,
            names: Vec::new(),
            health: self.health.clone(),
        }))
    }
}

struct MemoryStore {
    data: Arc<Mutex<StoreData>>,
    /// What each `KeyspaceId` names.
    names: Vec<Name>,
    health: Arc<Health>,
}

/// A keyspace of the store, or one as it is in a snapshot (read-only).
#[derive(Clone, PartialEq)]
enum Name {
    Live(String),
    Snapshot { snapshot: String, keyspace: String },
}

impl MemoryStore {
    fn id(&mut self, name: Name) -> KeyspaceId {
        let id = match self.names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                self.names.push(name);
                self.names.len() - 1
            }
        };
        KeyspaceId(id as u32)
    }

    fn map(&self, ks: KeyspaceId) -> Result<Arc<Map>> {
        let data = self.data.lock().unwrap();
        Ok(match &self.names[ks.0 as usize] {
            Name::Live(name) => data.keyspaces.get(name).cloned(),
            Name::Snapshot { snapshot, keyspace } => data
                .snapshots
                .get(snapshot)
                .ok_or_else(|| StorageError::NoSuchSnapshot(snapshot.clone()))?
                .get(keyspace)
                .cloned(),
        }
        .unwrap_or_default())
    }

    /// The keyspace's name if it may be written.
    fn writable(&self, ks: KeyspaceId) -> Result<&str> {
        match &self.names[ks.0 as usize] {
            Name::Live(name) => Ok(name),
            Name::Snapshot { snapshot, keyspace } => Err(read_only(snapshot, keyspace)),
        }
    }

    fn edit<R>(&self, ks: KeyspaceId, f: impl FnOnce(&mut Map) -> R) -> Result<R> {
        let name = self.writable(ks)?.to_string();
        let mut data = self.data.lock().unwrap();
        let map = data.keyspaces.entry(name).or_default();
        Ok(f(Arc::make_mut(map)))
    }
}

/// The refusal of a write to a keyspace opened in a snapshot.
pub(super) fn read_only(snapshot: &str, keyspace: &str) -> StorageError {
    StorageError::Denied(format!(
        "keyspace {keyspace:?} of snapshot {snapshot:?} is read-only"
    ))
}

fn apply(map: &mut Map, op: Op) {
    match op {
        Op::Put(k, v) => {
            map.insert(k, v);
        }
        Op::Delete(k) => {
            map.remove(&k);
        }
        Op::DeleteRange(s, e) => {
            let doomed: Vec<_> = map.range(s..e).map(|(k, _)| k.clone()).collect();
            for k in doomed {
                map.remove(&k);
            }
        }
        Op::Clear => map.clear(),
    }
}

impl StoreStorage for MemoryStore {
    fn open_keyspace(&mut self, name: &str) -> Result<KeyspaceId> {
        self.health.check()?;
        check_name(NameKind::Keyspace, name)?;
        self.data
            .lock()
            .unwrap()
            .keyspaces
            .entry(name.to_string())
            .or_default();
        Ok(self.id(Name::Live(name.to_string())))
    }

    fn open_snapshot_keyspace(&mut self, snapshot: &str, name: &str) -> Result<KeyspaceId> {
        self.health.check()?;
        check_name(NameKind::Snapshot, snapshot)?;
        check_name(NameKind::Keyspace, name)?;
        if !self.data.lock().unwrap().snapshots.contains_key(snapshot) {
            return Err(StorageError::NoSuchSnapshot(snapshot.into()));
        }
        Ok(self.id(Name::Snapshot {
            snapshot: snapshot.to_string(),
            keyspace: name.to_string(),
        }))
    }

    fn keyspaces(&self) -> Result<Vec<String>> {
        self.health.check()?;
        Ok(self
            .data
            .lock()
            .unwrap()
            .keyspaces
            .keys()
            .cloned()
            .collect())
    }

    fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.health.before_read()?;
        Ok(self.map(ks)?.get(key).cloned())
    }

    fn put(&mut self, ks: KeyspaceId, key: &[u8], value: &[u8]) -> Result<()> {
        self.health.before_write()?;
        self.edit(ks, |m| m.insert(key.to_vec(), value.to_vec()))?;
        Ok(())
    }

    fn delete(&mut self, ks: KeyspaceId, key: &[u8]) -> Result<()> {
        self.health.before_write()?;
        self.edit(ks, |m| m.remove(key))?;
        Ok(())
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
        Ok(Box::new(MemoryCursor {
            map: self.map(ks)?,
            next: start.map_or(Bound::Unbounded, |s| Bound::Included(s.to_vec())),
            end: end.map(<[u8]>::to_vec),
            health: self.health.clone(),
        }))
    }

    fn delete_range(&mut self, ks: KeyspaceId, start: &[u8], end: &[u8]) -> Result<()> {
        self.health.check()?;
        check_range(start, end)?;
        self.health.before_write()?;
        self.edit(ks, |m| {
            apply(m, Op::DeleteRange(start.to_vec(), end.to_vec()))
        })
    }

    fn clear(&mut self, ks: KeyspaceId) -> Result<()> {
        self.health.before_write()?;
        self.edit(ks, Map::clear)
    }

    fn is_empty(&self, ks: KeyspaceId) -> Result<bool> {
        self.health.check()?;
        Ok(self.map(ks)?.is_empty())
    }

    fn write(&mut self, batch: Vec<(KeyspaceId, Vec<Op>)>, sync: bool) -> Result<()> {
        self.health.check()?;
        check_batch(&batch)?;
        for (ks, _) in &batch {
            self.writable(*ks)?;
        }
        self.health.before_write()?;
        for (ks, ops) in batch {
            self.edit(ks, |m| ops.into_iter().for_each(|op| apply(m, op)))?;
        }
        if sync {
            // Applied, then the "flush" fails: poisoned, as on RocksDB.
            self.health.sync(true, || Ok(()))?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.health.sync(true, || Ok(()))
    }

    fn create_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        let mut data = self.data.lock().unwrap();
        let image = data.keyspaces.clone();
        data.snapshots.insert(name.to_string(), image);
        Ok(())
    }

    fn restore_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        let mut data = self.data.lock().unwrap();
        let image = data
            .snapshots
            .get(name)
            .cloned()
            .ok_or_else(|| StorageError::NoSuchSnapshot(name.into()))?;
        for (ks, map) in data.keyspaces.iter_mut() {
            *map = image.get(ks).cloned().unwrap_or_default();
        }
        for (ks, map) in image {
            data.keyspaces.entry(ks).or_insert(map);
        }
        Ok(())
    }

    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.health.check()?;
        check_name(NameKind::Snapshot, name)?;
        self.data.lock().unwrap().snapshots.remove(name);
        Ok(())
    }

    fn list_snapshots(&self) -> Result<Vec<String>> {
        self.health.check()?;
        Ok(self
            .data
            .lock()
            .unwrap()
            .snapshots
            .keys()
            .cloned()
            .collect())
    }
}

struct MemoryCursor {
    map: Arc<Map>,
    next: Bound<Vec<u8>>,
    end: Option<Vec<u8>>,
    health: Arc<Health>,
}

impl Cursor for MemoryCursor {
    fn next(&mut self, max: usize) -> Result<Vec<Entry>> {
        self.health.before_read()?;
        let end = self
            .end
            .as_ref()
            .map_or(Bound::Unbounded, |e| Bound::Excluded(e.clone()));
        let out: Vec<Entry> = self
            .map
            .range::<Vec<u8>, _>((self.next.clone(), end))
            .take(max.min(super::MAX_CURSOR_BATCH))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some((k, _)) = out.last() {
            self.next = Bound::Excluded(k.clone());
        }
        Ok(out)
    }
}
