//! The host side of the `storage` interface: what a guest may do, resolved
//! against its own [`StoreStorage`] only. Every call is counted for the
//! `commit-call:N` / `recover-call:N` crash points.

use super::bindings::txstore::store::storage::{
    Host, HostCursor, HostKeyspace, KeyspaceOps, Level, Op as WitOp,
};
use super::bindings::txstore::store::types::{self, Entry, Error as WitError};
use super::limiter::GuestLimiter;
use crate::crash::{self, Phase};
use crate::storage::{Cursor, KeyspaceId, Op, StorageError, StoreStorage, MAX_CURSOR_BATCH};
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// Bytes of guest stderr kept; writes past it fail in the guest.
const STDERR_CAPACITY: usize = 16 << 10;

/// A clock that always reads zero.
struct StoppedClock;

impl wasmtime_wasi::HostWallClock for StoppedClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for StoppedClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The WASI a guest gets (strategy or processor): no preopens,
/// environment, arguments or network (wasmtime-wasi's defaults), and clocks
/// stopped at zero: the contracts grant no time, so a guest cannot make its
/// results depend on it. Stderr goes to a bounded buffer, so a trap can say
/// what the guest said last (a Rust panic message) without the guest
/// flooding anything.
pub(crate) fn sandbox_wasi() -> (WasiCtx, MemoryOutputPipe) {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let wasi = wasmtime_wasi::WasiCtxBuilder::new()
        .wall_clock(StoppedClock)
        .monotonic_clock(StoppedClock)
        .allow_ip_name_lookup(false)
        .stderr(stderr.clone())
        .build();
    (wasi, stderr)
}

/// A keyspace handle held by a guest.
pub struct KeyspaceRes {
    id: KeyspaceId,
    name: String,
}

/// A cursor handle held by a guest.
pub struct CursorRes(Box<dyn Cursor>);

/// Everything a guest's wasmtime `Store` holds.
pub struct GuestState {
    pub(crate) table: ResourceTable,
    pub(crate) wasi: WasiCtx,
    /// What the guest wrote to stderr (bounded).
    pub(crate) stderr: MemoryOutputPipe,
    pub(crate) limits: GuestLimiter,
    pub(crate) storage: Box<dyn StoreStorage>,
    pub(crate) store_name: String,
    /// The export being called, for crash-point counting.
    pub(crate) phase: Phase,
}

impl GuestState {
    pub(crate) fn new(
        storage: Box<dyn StoreStorage>,
        store_name: String,
        limits: GuestLimiter,
    ) -> Self {
        let (wasi, stderr) = sandbox_wasi();
        Self {
            stderr,
            table: ResourceTable::new(),
            wasi,
            limits,
            storage,
            store_name,
            phase: Phase::Other,
        }
    }

    fn count(&self) {
        crash::storage_call(self.phase);
    }

    /// Counts a call that changes storage (and `count`s it).
    fn count_write(&self) {
        self.count();
        crash::guest_write(self.phase);
    }

    fn ks(&self, r: &Resource<KeyspaceRes>) -> wasmtime::Result<KeyspaceId> {
        Ok(self.table.get(r)?.id)
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl From<StorageError> for WitError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Denied(m) => WitError::AccessDenied(m),
            StorageError::NoSuchSnapshot(n) => WitError::NoSuchSnapshot(n),
            StorageError::Invalid(m) => WitError::InvalidArgument(m),
            StorageError::Io(m) => WitError::Storage(m),
        }
    }
}

type R<T> = wasmtime::Result<Result<T, WitError>>;

fn wit<T>(r: crate::storage::Result<T>) -> R<T> {
    Ok(r.map_err(WitError::from))
}

impl types::Host for GuestState {}

impl HostKeyspace for GuestState {
    fn open(&mut self, name: String) -> R<Resource<KeyspaceRes>> {
        self.count();
        match self.storage.open_keyspace(&name) {
            Ok(id) => Ok(Ok(self.table.push(KeyspaceRes { id, name })?)),
            Err(e) => Ok(Err(e.into())),
        }
    }

    fn open_snapshot(&mut self, snapshot: String, name: String) -> R<Resource<KeyspaceRes>> {
        self.count();
        match self.storage.open_snapshot_keyspace(&snapshot, &name) {
            Ok(id) => Ok(Ok(self.table.push(KeyspaceRes { id, name })?)),
            Err(e) => Ok(Err(e.into())),
        }
    }

    fn name(&mut self, this: Resource<KeyspaceRes>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.name.clone())
    }

    fn get(&mut self, this: Resource<KeyspaceRes>, key: Vec<u8>) -> R<Option<Vec<u8>>> {
        self.count();
        let ks = self.ks(&this)?;
        wit(self.storage.get(ks, &key))
    }

    fn get_many(
        &mut self,
        this: Resource<KeyspaceRes>,
        keys: Vec<Vec<u8>>,
    ) -> R<Vec<Option<Vec<u8>>>> {
        self.count();
        let ks = self.ks(&this)?;
        wit(self.storage.get_many(ks, &keys))
    }

    fn put(&mut self, this: Resource<KeyspaceRes>, key: Vec<u8>, value: Vec<u8>) -> R<()> {
        self.count_write();
        let ks = self.ks(&this)?;
        wit(self.storage.put(ks, &key, &value))
    }

    fn delete(&mut self, this: Resource<KeyspaceRes>, key: Vec<u8>) -> R<()> {
        self.count_write();
        let ks = self.ks(&this)?;
        wit(self.storage.delete(ks, &key))
    }

    fn scan(
        &mut self,
        this: Resource<KeyspaceRes>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
    ) -> R<Resource<CursorRes>> {
        self.count();
        let ks = self.ks(&this)?;
        match self.storage.scan(ks, start.as_deref(), end.as_deref()) {
            Ok(c) => Ok(Ok(self.table.push(CursorRes(c))?)),
            Err(e) => Ok(Err(e.into())),
        }
    }

    fn delete_range(&mut self, this: Resource<KeyspaceRes>, start: Vec<u8>, end: Vec<u8>) -> R<()> {
        self.count_write();
        let ks = self.ks(&this)?;
        wit(self.storage.delete_range(ks, &start, &end))
    }

    fn clear(&mut self, this: Resource<KeyspaceRes>) -> R<()> {
        self.count_write();
        let ks = self.ks(&this)?;
        wit(self.storage.clear(ks))
    }

    fn is_empty(&mut self, this: Resource<KeyspaceRes>) -> R<bool> {
        self.count();
        let ks = self.ks(&this)?;
        wit(self.storage.is_empty(ks))
    }

    fn drop(&mut self, this: Resource<KeyspaceRes>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl HostCursor for GuestState {
    fn next(&mut self, this: Resource<CursorRes>, max: u32) -> R<Vec<Entry>> {
        self.count();
        let cursor = self.table.get_mut(&this)?;
        let batch = cursor.0.next((max as usize).min(MAX_CURSOR_BATCH));
        wit(batch.map(|b| {
            b.into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect()
        }))
    }

    fn drop(&mut self, this: Resource<CursorRes>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl Host for GuestState {
    fn write(&mut self, batch: Vec<KeyspaceOps>, sync: bool) -> R<()> {
        self.count_write();
        let mut ops = Vec::with_capacity(batch.len());
        for group in batch {
            let ks = self.ks(&group.keyspace)?;
            let group_ops = group
                .ops
                .into_iter()
                .map(|op| match op {
                    WitOp::Put(e) => Op::Put(e.key, e.value),
                    WitOp::Delete(k) => Op::Delete(k),
                    WitOp::DeleteRange((s, e)) => Op::DeleteRange(s, e),
                    WitOp::Clear => Op::Clear,
                })
                .collect();
            ops.push((ks, group_ops));
        }
        wit(self.storage.write(ops, sync))
    }

    fn sync(&mut self) -> R<()> {
        self.count();
        wit(self.storage.sync())
    }

    fn create_snapshot(&mut self, name: String) -> R<()> {
        self.count();
        wit(self.storage.create_snapshot(&name))
    }

    fn restore_snapshot(&mut self, name: String) -> R<()> {
        self.count_write();
        wit(self.storage.restore_snapshot(&name))
    }

    fn drop_snapshot(&mut self, name: String) -> R<()> {
        self.count();
        wit(self.storage.drop_snapshot(&name))
    }

    fn list_snapshots(&mut self) -> R<Vec<String>> {
        self.count();
        wit(self.storage.list_snapshots())
    }

    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let store = &self.store_name;
        match level {
            Level::Trace => tracing::trace!(target: "txstore::guest", store, "{message}"),
            Level::Debug => tracing::debug!(target: "txstore::guest", store, "{message}"),
            Level::Info => tracing::info!(target: "txstore::guest", store, "{message}"),
            Level::Warn => tracing::warn!(target: "txstore::guest", store, "{message}"),
            Level::Error => tracing::error!(target: "txstore::guest", store, "{message}"),
        }
        Ok(())
    }
}
