//! `native`: the wipe-on-crash strategy written in Rust and called
//! directly, with no component, no sandbox and no boundary in between.
//! It exists to be measured against: the same task, changelog and commit
//! protocol over a plain RocksDB store, as Kafka Streams runs today, so
//! `txstore bench --pipeline` can say what a user of the whole pipeline
//! pays for each sandboxed guest. Its semantics are the wipe-on-crash
//! guest's (guests/wipe-on-crash), held to the same conformance suite:
//! writes go straight to `data`, `commit` puts the offset into `meta` with
//! a synced write, and a start without a checkpoint wipes for a full
//! replay. It runs inside the host, so it is offered for measurement and
//! for operators who trust it as they trust the host, not as a strategy
//! plug-in.

use super::instance::{CallError, EntryRef, Isolation, Recovery, RecoveryAction, WitError};
use super::packed::Page;
use crate::crash::{self, Phase};
use crate::storage::{KeyspaceId, Op, StorageError, StoreStorage, MAX_CURSOR_BATCH};

/// The name a config gives it (`store.guest = "native"`).
pub const NAME: &str = "native";
const OFFSET: &[u8] = b"committed-offset";

/// A live native store: [`super::StoreInstance`]'s other backend.
pub struct NativeInstance {
    storage: Box<dyn StoreStorage>,
    store_name: String,
    /// `data` and `meta`, opened by `init`.
    keyspaces: Option<(KeyspaceId, KeyspaceId)>,
    uncommitted_bytes: u64,
    /// Why it takes no more calls (a failed commit).
    dead: Option<&'static str>,
    calls: super::CallStats,
}

impl NativeInstance {
    pub(super) fn new(storage: Box<dyn StoreStorage>, store_name: &str) -> Self {
        Self {
            storage,
            store_name: store_name.to_string(),
            keyspaces: None,
            uncommitted_bytes: 0,
            dead: None,
            calls: Default::default(),
        }
    }

    pub fn label(&self) -> &str {
        NAME
    }

    pub fn calls(&self) -> &super::CallStats {
        &self.calls
    }

    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Runs one contract call: counted, refused once dead, its storage
    /// errors turned into the contract's.
    fn call<T>(
        &mut self,
        func: &'static str,
        phase: Phase,
        f: impl FnOnce(&mut Self, Phase) -> Result<T, WitError>,
    ) -> Result<T, CallError> {
        let started = self.calls.begin(func);
        if let Some(why) = self.dead {
            return Err(CallError::Trap {
                guest: NAME.into(),
                func,
                reason: why.into(),
            });
        }
        let result = f(self, phase);
        self.calls.end(func, started);
        result.map_err(|err| CallError::Guest {
            guest: NAME.into(),
            func,
            err,
        })
    }

    /// `data` and `meta`, or the error of a call made before `init`.
    fn ids(&self) -> Result<(KeyspaceId, KeyspaceId), WitError> {
        self.keyspaces
            .ok_or_else(|| WitError::Other("native: init was not called".into()))
    }

    /// One storage call, counted as a guest's is (crash points).
    fn counted<T>(
        &mut self,
        phase: Phase,
        writes: bool,
        f: impl FnOnce(&mut dyn StoreStorage) -> Result<T, StorageError>,
    ) -> Result<T, WitError> {
        crash::storage_call(phase);
        if writes {
            crash::guest_write(phase);
        }
        f(self.storage.as_mut()).map_err(WitError::from)
    }

    fn read_offset(&mut self, phase: Phase) -> Result<Option<u64>, WitError> {
        let (_, meta) = self.ids()?;
        match self.counted(phase, false, |s| s.get(meta, OFFSET))? {
            None => Ok(None),
            Some(v) => match <[u8; 8]>::try_from(v.as_slice()) {
                Ok(b) => Ok(Some(u64::from_be_bytes(b))),
                Err(_) => Err(WitError::Corrupt(format!(
                    "native: `committed-offset` holds {} bytes, not 8",
                    v.len()
                ))),
            },
        }
    }

    pub fn init(&mut self, options: &[(String, String)]) -> Result<(), CallError> {
        self.call("init", Phase::Other, |n, phase| {
            if let Some((name, _)) = options.first() {
                return Err(WitError::InvalidArgument(format!(
                    "native: unknown option `{name}` (it takes none)"
                )));
            }
            let data = n.counted(phase, false, |s| s.open_keyspace("data"))?;
            let meta = n.counted(phase, false, |s| s.open_keyspace("meta"))?;
            n.keyspaces = Some((data, meta));
            Ok(())
        })
    }

    pub fn transactional(&mut self) -> Result<bool, CallError> {
        self.call("transactional", Phase::Other, |_, _| Ok(false))
    }

    pub fn recover(&mut self, checkpointed: Option<u64>) -> Result<Recovery, CallError> {
        self.call("recover", Phase::Recover, |n, phase| {
            let (data, meta) = n.ids()?;
            let stored = n.read_offset(phase)?;
            match (checkpointed, stored) {
                // A checkpoint means the last stop was clean: the store
                // holds that state.
                (Some(c), Some(o)) if o >= c => {
                    return Ok(Recovery {
                        offset: Some(c),
                        action: RecoveryAction::Clean,
                    })
                }
                (None, None) if n.counted(phase, false, |s| s.is_empty(data))? => {
                    return Ok(Recovery {
                        offset: None,
                        action: RecoveryAction::Clean,
                    })
                }
                _ => {}
            }
            tracing::warn!(
                target: "txstore::guest",
                store = n.store_name,
                "no usable checkpoint: wiping the store for a full replay"
            );
            n.counted(phase, true, |s| {
                s.write(vec![(data, vec![Op::Clear]), (meta, vec![Op::Clear])], true)
            })?;
            n.uncommitted_bytes = 0;
            Ok(Recovery {
                offset: None,
                action: RecoveryAction::Wiped,
            })
        })
    }

    /// Both isolation levels read `data`: the store keeps no separate
    /// committed view (it is not transactional).
    pub fn get(&mut self, key: &[u8], _: Isolation) -> Result<Option<Vec<u8>>, CallError> {
        self.call("get", Phase::Other, |n, phase| {
            let (data, _) = n.ids()?;
            n.counted(phase, false, |s| s.get(data, key))
        })
    }

    pub fn get_many(
        &mut self,
        keys: &[Vec<u8>],
        _: Isolation,
    ) -> Result<Vec<Option<Vec<u8>>>, CallError> {
        self.call("get-many", Phase::Other, |n, phase| {
            let (data, _) = n.ids()?;
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            n.counted(phase, false, |s| s.get_many(data, &keys))
        })
    }

    pub fn range_page(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        _: Isolation,
        limit: u32,
    ) -> Result<Page, CallError> {
        self.call("range", Phase::Other, |n, phase| {
            if let (Some(s), Some(e)) = (start, end) {
                if s > e {
                    return Err(WitError::InvalidArgument(
                        "native: range start is after its end".into(),
                    ));
                }
            }
            let (data, _) = n.ids()?;
            let mut cursor = n.counted(phase, false, |s| s.scan(data, start, end))?;
            let mut page = Vec::new();
            while page.len() < limit as usize {
                let want = (limit as usize - page.len()).min(MAX_CURSOR_BATCH);
                crash::storage_call(phase);
                let got = cursor.next(want).map_err(WitError::from)?;
                if got.is_empty() {
                    break;
                }
                page.extend(got);
            }
            Ok(Page::from_entries(page))
        })
    }

    /// Writes `ops` to `data` in one unsynced batch.
    fn write(&mut self, func: &'static str, ops: Vec<Op>, bytes: u64) -> Result<(), CallError> {
        self.call(func, Phase::Other, |n, phase| {
            let (data, _) = n.ids()?;
            n.counted(phase, true, |s| s.write(vec![(data, ops)], false))?;
            n.uncommitted_bytes += bytes;
            Ok(())
        })
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), CallError> {
        let bytes = (key.len() + value.len()) as u64;
        self.write("put", vec![Op::Put(key.to_vec(), value.to_vec())], bytes)
    }

    pub fn delete(&mut self, key: &[u8]) -> Result<(), CallError> {
        self.write("delete", vec![Op::Delete(key.to_vec())], key.len() as u64)
    }

    pub fn put_entries(&mut self, entries: &[EntryRef<'_>]) -> Result<(), CallError> {
        let bytes = entries
            .iter()
            .map(|e| (e.key.len() + e.value.len()) as u64)
            .sum();
        let ops = entries
            .iter()
            .map(|e| Op::Put(e.key.to_vec(), e.value.to_vec()))
            .collect();
        self.write("put-many", ops, bytes)
    }

    pub fn delete_keys(&mut self, keys: &[&[u8]]) -> Result<(), CallError> {
        let bytes = keys.iter().map(|k| k.len() as u64).sum();
        let ops = keys.iter().map(|k| Op::Delete(k.to_vec())).collect();
        self.write("delete-many", ops, bytes)
    }

    /// The offset and every write before it become durable together.
    pub fn commit(&mut self, offset: u64) -> Result<(), CallError> {
        let result = self.call("commit", Phase::Commit, |n, phase| {
            let (_, meta) = n.ids()?;
            let put = Op::Put(OFFSET.to_vec(), offset.to_be_bytes().to_vec());
            n.counted(phase, true, |s| s.write(vec![(meta, vec![put])], true))?;
            n.uncommitted_bytes = 0;
            Ok(())
        });
        if result.is_err() && self.dead.is_none() {
            self.dead = Some("its commit failed earlier; a new instance must recover the store");
        }
        result
    }

    pub fn committed_offset(&mut self) -> Result<Option<u64>, CallError> {
        self.call("committed-offset", Phase::Other, |n, phase| {
            n.read_offset(phase)
        })
    }

    pub fn approximate_uncommitted_bytes(&mut self) -> Result<u64, CallError> {
        self.call("approximate-uncommitted-bytes", Phase::Other, |n, _| {
            Ok(n.uncommitted_bytes)
        })
    }
}
