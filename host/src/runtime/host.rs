//! The host side of the `storage` interface: what a guest may do, resolved
//! against its own [`StoreStorage`] only. Every call is counted for the
//! `commit-call:N` / `recover-call:N` crash points. The calls are written
//! once here; `host_v1` and `host_v2` give them the types of each WIT
//! version.

use super::limiter::GuestLimiter;
use crate::crash::{self, Phase};
use crate::storage::{self, Cursor, Entry, KeyspaceId, Op, StoreStorage, MAX_CURSOR_BATCH};
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
    pub(super) fn count_write(&self) {
        self.count();
        crash::guest_write(self.phase);
    }

    pub(super) fn ks(&self, r: &Resource<KeyspaceRes>) -> wasmtime::Result<KeyspaceId> {
        Ok(self.table.get(r)?.id)
    }
}

/// A storage call's answer: the outer error is the guest's fault (a handle
/// it does not own) and traps; the inner one is the contract's.
pub(super) type Answer<T> = wasmtime::Result<storage::Result<T>>;

/// The `storage` calls, whatever the WIT version.
impl GuestState {
    pub(super) fn open(&mut self, name: String) -> Answer<Resource<KeyspaceRes>> {
        self.count();
        match self.storage.open_keyspace(&name) {
            Ok(id) => Ok(Ok(self.table.push(KeyspaceRes { id, name })?)),
            Err(e) => Ok(Err(e)),
        }
    }

    pub(super) fn open_snapshot(
        &mut self,
        snapshot: String,
        name: String,
    ) -> Answer<Resource<KeyspaceRes>> {
        self.count();
        match self.storage.open_snapshot_keyspace(&snapshot, &name) {
            Ok(id) => Ok(Ok(self.table.push(KeyspaceRes { id, name })?)),
            Err(e) => Ok(Err(e)),
        }
    }

    pub(super) fn name(&mut self, this: &Resource<KeyspaceRes>) -> wasmtime::Result<String> {
        Ok(self.table.get(this)?.name.clone())
    }

    pub(super) fn get(
        &mut self,
        this: &Resource<KeyspaceRes>,
        key: &[u8],
    ) -> Answer<Option<Vec<u8>>> {
        self.count();
        let ks = self.ks(this)?;
        Ok(self.storage.get(ks, key))
    }

    pub(super) fn get_many(
        &mut self,
        this: &Resource<KeyspaceRes>,
        keys: &[&[u8]],
    ) -> Answer<Vec<Option<Vec<u8>>>> {
        self.count();
        let ks = self.ks(this)?;
        Ok(self.storage.get_many(ks, keys))
    }

    pub(super) fn put(
        &mut self,
        this: &Resource<KeyspaceRes>,
        key: &[u8],
        value: &[u8],
    ) -> Answer<()> {
        self.count_write();
        let ks = self.ks(this)?;
        Ok(self.storage.put(ks, key, value))
    }

    pub(super) fn delete(&mut self, this: &Resource<KeyspaceRes>, key: &[u8]) -> Answer<()> {
        self.count_write();
        let ks = self.ks(this)?;
        Ok(self.storage.delete(ks, key))
    }

    pub(super) fn scan(
        &mut self,
        this: &Resource<KeyspaceRes>,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
    ) -> Answer<Resource<CursorRes>> {
        self.count();
        let ks = self.ks(this)?;
        match self.storage.scan(ks, start, end) {
            Ok(c) => Ok(Ok(self.table.push(CursorRes(c))?)),
            Err(e) => Ok(Err(e)),
        }
    }

    pub(super) fn delete_range(
        &mut self,
        this: &Resource<KeyspaceRes>,
        start: &[u8],
        end: &[u8],
    ) -> Answer<()> {
        self.count_write();
        let ks = self.ks(this)?;
        Ok(self.storage.delete_range(ks, start, end))
    }

    pub(super) fn clear(&mut self, this: &Resource<KeyspaceRes>) -> Answer<()> {
        self.count_write();
        let ks = self.ks(this)?;
        Ok(self.storage.clear(ks))
    }

    pub(super) fn is_empty(&mut self, this: &Resource<KeyspaceRes>) -> Answer<bool> {
        self.count();
        let ks = self.ks(this)?;
        Ok(self.storage.is_empty(ks))
    }

    pub(super) fn drop_keyspace(&mut self, this: Resource<KeyspaceRes>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }

    pub(super) fn next(&mut self, this: &Resource<CursorRes>, max: u32) -> Answer<Vec<Entry>> {
        self.count();
        let cursor = self.table.get_mut(this)?;
        Ok(cursor.0.next((max as usize).min(MAX_CURSOR_BATCH)))
    }

    pub(super) fn drop_cursor(&mut self, this: Resource<CursorRes>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }

    /// A batch whose keyspaces are already resolved ([`Self::ks`]) after
    /// [`Self::count_write`] counted the call.
    pub(super) fn write(&mut self, ops: Vec<(KeyspaceId, Vec<Op>)>, sync: bool) -> Answer<()> {
        Ok(self.storage.write(ops, sync))
    }

    pub(super) fn sync(&mut self) -> Answer<()> {
        self.count();
        Ok(self.storage.sync())
    }

    pub(super) fn create_snapshot(&mut self, name: &str) -> Answer<()> {
        self.count();
        Ok(self.storage.create_snapshot(name))
    }

    pub(super) fn restore_snapshot(&mut self, name: &str) -> Answer<()> {
        self.count_write();
        Ok(self.storage.restore_snapshot(name))
    }

    pub(super) fn drop_snapshot(&mut self, name: &str) -> Answer<()> {
        self.count();
        Ok(self.storage.drop_snapshot(name))
    }

    pub(super) fn list_snapshots(&mut self) -> Answer<Vec<String>> {
        self.count();
        Ok(self.storage.list_snapshots())
    }

    pub(super) fn log(&mut self, level: tracing::Level, message: &str) {
        let store = &self.store_name;
        match level {
            tracing::Level::TRACE => tracing::trace!(target: "txstore::guest", store, "{message}"),
            tracing::Level::DEBUG => tracing::debug!(target: "txstore::guest", store, "{message}"),
            tracing::Level::INFO => tracing::info!(target: "txstore::guest", store, "{message}"),
            tracing::Level::WARN => tracing::warn!(target: "txstore::guest", store, "{message}"),
            tracing::Level::ERROR => tracing::error!(target: "txstore::guest", store, "{message}"),
        }
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
