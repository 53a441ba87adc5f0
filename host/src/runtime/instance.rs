//! One live guest: a wasmtime `Store` with its instance, and typed calls
//! that turn the guest's WIT errors, traps and limit breaches into
//! [`CallError`]. A trapped instance cannot be called again; callers
//! discard it and instantiate a new one.

use super::bindings::{v1, v2};
use super::exports::{
    from_v1, Api, BorrowedCalls, DeleteManyRef1, DeleteRef, Get, GetManyPacked, OldError,
    OldIsolation, PackedCall, PutManyRef1, PutRef, Unit, Unit1,
};
use super::host::GuestState;
use super::limiter::{GuestLimiter, MemoryLimitExceeded};
use super::packed::{unpack_values, PackedBuf, Page};
use super::{GuestComponent, GuestPre, Limits};
use crate::crash::Phase;
use crate::storage::StoreStorage;
use anyhow::Result;
use v2::exports::txstore::store::state_store as export;
use wasmtime::Store;

pub use super::exports::EntryRef;
pub use export::{Isolation, Recovery, RecoveryAction};
pub use v2::txstore::store::types::Error as WitError;

/// Why a guest call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The guest returned an error the contract defines.
    #[error("guest {guest} returned an error from {func}: {}", describe(.err))]
    Guest {
        guest: String,
        func: &'static str,
        err: WitError,
    },
    /// The guest trapped, ran out of time or memory: the instance is dead.
    #[error("guest {guest} failed in {func}: {reason}")]
    Trap {
        guest: String,
        func: &'static str,
        reason: String,
    },
}

impl CallError {
    /// The guest asked for a commit before more writes.
    pub fn is_uncommitted_limit(&self) -> bool {
        matches!(
            self,
            CallError::Guest {
                err: WitError::UncommittedLimit(_),
                ..
            }
        )
    }

    /// The instance must be discarded.
    pub fn is_trap(&self) -> bool {
        matches!(self, CallError::Trap { .. })
    }
}

/// One line for a WIT error (the generated `Display` prints the debug form).
pub fn describe(err: &WitError) -> String {
    match err {
        WitError::AccessDenied(m) => format!("access denied: {m}"),
        WitError::NoSuchSnapshot(n) => format!("no such snapshot: {n}"),
        WitError::UncommittedLimit(n) => format!("uncommitted limit of {n} bytes reached"),
        WitError::InvalidArgument(m) => format!("invalid argument: {m}"),
        WitError::Corrupt(m) => format!("corrupt store: {m}"),
        WitError::Storage(m) => format!("storage failed: {m}"),
        WitError::Other(m) => m.clone(),
    }
}

/// A live guest instance bound to one store's storage.
pub struct WasmInstance {
    store: Store<GuestState>,
    api: Api,
    borrowed: BorrowedCalls,
    /// Where a 0.2.0 batch is packed before it is lowered (kept for reuse).
    scratch: PackedBuf,
    label: String,
    limits: Limits,
    /// Why this instance takes no more calls: it trapped, or its commit
    /// failed (the store is then in an unknown state until a new instance
    /// recovers it).
    dead: Option<&'static str>,
    /// Export calls made, by function (the conformance suite's coverage;
    /// their time when metrics are on).
    calls: super::CallStats,
}

impl WasmInstance {
    pub(crate) fn new(
        guest: &GuestComponent,
        storage: Box<dyn StoreStorage>,
        store_name: &str,
        limits: &Limits,
    ) -> Result<Self> {
        let limiter = GuestLimiter::new(limits);
        let mut store = Store::new(
            &guest.engine,
            GuestState::new(storage, store_name.to_string(), limiter),
        );
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(u64::MAX / 2);
        store.epoch_deadline_trap();
        let (api, instance) = match &guest.pre {
            GuestPre::V1(pre) => {
                let instance = pre.instance_pre().instantiate(&mut store)?;
                (Api::V1(v1::Store::new(&mut store, &instance)?), instance)
            }
            GuestPre::V2(pre) => {
                let instance = pre.instance_pre().instantiate(&mut store)?;
                (Api::V2(v2::Store::new(&mut store, &instance)?), instance)
            }
            GuestPre::Native => anyhow::bail!("the native store is not a wasm guest"),
        };
        let borrowed = BorrowedCalls::new(&instance, &mut store, guest.version)?;
        Ok(Self {
            store,
            api,
            borrowed,
            scratch: PackedBuf::default(),
            label: guest.label.clone(),
            limits: limits.clone(),
            dead: None,
            calls: Default::default(),
        })
    }

    /// The guest's label (built-in name or path).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Runs one export call under the time budget, in `phase`.
    fn call<T>(
        &mut self,
        func: &'static str,
        phase: Phase,
        f: impl FnOnce(&Api, &mut Store<GuestState>) -> wasmtime::Result<Result<T, WitError>>,
    ) -> Result<T, CallError> {
        let started = self.calls.begin(func);
        if let Some(why) = self.dead {
            return Err(self.trap(func, why.into()));
        }
        self.store.set_epoch_deadline(self.limits.call_ticks());
        self.store.data_mut().phase = phase;
        let result = f(&self.api, &mut self.store);
        self.store.data_mut().phase = Phase::Other;
        self.calls.end(func, started);
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(err)) => Err(CallError::Guest {
                guest: self.label.clone(),
                func,
                err,
            }),
            Err(e) => {
                self.dead = Some("the instance trapped earlier and was discarded");
                let reason = self.explain(&e);
                Err(self.trap(func, reason))
            }
        }
    }

    fn trap(&self, func: &'static str, reason: String) -> CallError {
        CallError::Trap {
            guest: self.label.clone(),
            func,
            reason,
        }
    }

    fn explain(&self, e: &wasmtime::Error) -> String {
        explain(e, &self.limits, &self.store.data().stderr)
    }

    /// Export calls made so far, by function.
    pub fn calls(&self) -> &super::CallStats {
        &self.calls
    }

    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    pub fn init(&mut self, options: &[(String, String)]) -> Result<(), CallError> {
        self.call("init", Phase::Other, |api, s| match api {
            Api::V1(g) => {
                from_v1::answer(g.txstore_store_state_store().call_init(s, options), |()| ())
            }
            Api::V2(g) => g.txstore_store_state_store().call_init(s, options),
        })
    }

    pub fn transactional(&mut self) -> Result<bool, CallError> {
        self.call("transactional", Phase::Other, |api, s| {
            match api {
                Api::V1(g) => g.txstore_store_state_store().call_transactional(s),
                Api::V2(g) => g.txstore_store_state_store().call_transactional(s),
            }
            .map(Ok)
        })
    }

    pub fn recover(&mut self, checkpointed: Option<u64>) -> Result<Recovery, CallError> {
        self.call("recover", Phase::Recover, |api, s| match api {
            Api::V1(g) => from_v1::answer(
                g.txstore_store_state_store().call_recover(s, checkpointed),
                from_v1::recovery,
            ),
            Api::V2(g) => g.txstore_store_state_store().call_recover(s, checkpointed),
        })
    }

    pub fn get(&mut self, key: &[u8], isolation: Isolation) -> Result<Option<Vec<u8>>, CallError> {
        let func = self.borrowed.get;
        self.call("get", Phase::Other, |api, s| {
            // SAFETY: checked against these signatures in `BorrowedCalls::new`.
            match api {
                Api::V1(_) => {
                    let f = unsafe { Get::<OldIsolation, OldError>::new_unchecked(func) };
                    let r = f.call(s, (key, from_v1::isolation(isolation)));
                    from_v1::answer(r.map(|(r,)| r), |v| v)
                }
                Api::V2(_) => {
                    let f = unsafe { Get::<Isolation, WitError>::new_unchecked(func) };
                    f.call(s, (key, isolation)).map(|(r,)| r)
                }
            }
        })
    }

    pub fn get_many(
        &mut self,
        keys: &[Vec<u8>],
        isolation: Isolation,
    ) -> Result<Vec<Option<Vec<u8>>>, CallError> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let func = self.borrowed.get_many;
        let result = self.call("get-many", Phase::Other, |api, s| match (api, func) {
            (Api::V1(g), _) => from_v1::answer(
                g.txstore_store_state_store()
                    .call_get_many(s, keys, from_v1::isolation(isolation)),
                |v| v,
            ),
            (Api::V2(_), Some(func)) => {
                for k in keys {
                    buf.push(k);
                }
                // SAFETY: checked against this signature in `BorrowedCalls::new`.
                let f = unsafe { GetManyPacked::new_unchecked(func) };
                match f.call(&mut *s, (buf.as_ref(), isolation))?.0 {
                    Ok(answer) => unpack_values(keys.len(), answer).map(Ok),
                    Err(e) => Ok(Err(e)),
                }
            }
            (Api::V2(_), None) => unreachable!("a 0.2.0 guest has its get-many typed"),
        });
        self.scratch = buf;
        result
    }

    /// One page of [start, end) at `isolation`, at most `limit` entries,
    /// packed as the guest returned it.
    pub fn range_page(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
        limit: u32,
    ) -> Result<Page, CallError> {
        let (start, end) = (start.map(<[u8]>::to_vec), end.map(<[u8]>::to_vec));
        self.call("range", Phase::Other, |api, s| match api {
            Api::V1(g) => from_v1::answer(
                g.txstore_store_state_store().call_range(
                    s,
                    start.as_ref(),
                    end.as_ref(),
                    from_v1::isolation(isolation),
                    limit,
                ),
                |page| Page::from_entries(page.into_iter().map(|e| (e.key, e.value))),
            ),
            Api::V2(g) => {
                match g.txstore_store_state_store().call_range(
                    s,
                    start.as_ref(),
                    end.as_ref(),
                    isolation,
                    limit,
                )? {
                    Ok(p) => Page::checked(p.bytes, p.ends).map(Ok),
                    Err(e) => Ok(Err(e)),
                }
            }
        })
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), CallError> {
        let func = self.borrowed.put;
        self.call("put", Phase::Other, |api, s| {
            // SAFETY: checked against these signatures in `BorrowedCalls::new`.
            match api {
                Api::V1(_) => {
                    let f = unsafe { PutRef::<Unit1>::new_unchecked(func) };
                    from_v1::answer(f.call(s, (key, value)).map(|(r,)| r), |()| ())
                }
                Api::V2(_) => {
                    let f = unsafe { PutRef::<Unit>::new_unchecked(func) };
                    f.call(s, (key, value)).map(|(r,)| r)
                }
            }
        })
    }

    pub fn delete(&mut self, key: &[u8]) -> Result<(), CallError> {
        let func = self.borrowed.delete;
        self.call("delete", Phase::Other, |api, s| {
            // SAFETY: checked against these signatures in `BorrowedCalls::new`.
            match api {
                Api::V1(_) => {
                    let f = unsafe { DeleteRef::<Unit1>::new_unchecked(func) };
                    from_v1::answer(f.call(s, (key,)).map(|(r,)| r), |()| ())
                }
                Api::V2(_) => {
                    let f = unsafe { DeleteRef::<Unit>::new_unchecked(func) };
                    f.call(s, (key,)).map(|(r,)| r)
                }
            }
        })
    }

    /// `put-many` of entries borrowed from the caller (the task's records).
    pub fn put_entries(&mut self, entries: &[EntryRef<'_>]) -> Result<(), CallError> {
        let func = self.borrowed.put_many;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let result = self.call("put-many", Phase::Other, |api, s| match api {
            Api::V1(_) => {
                // SAFETY: checked against this signature in `BorrowedCalls::new`.
                let f = unsafe { PutManyRef1::new_unchecked(func) };
                from_v1::answer(f.call(s, (entries,)).map(|(r,)| r), |()| ())
            }
            Api::V2(_) => {
                for e in entries {
                    buf.push(e.key);
                    buf.push(e.value);
                }
                // SAFETY: checked against this signature in `BorrowedCalls::new`.
                let f = unsafe { PackedCall::new_unchecked(func) };
                f.call(s, (buf.as_ref(),)).map(|(r,)| r)
            }
        });
        self.scratch = buf;
        result
    }

    /// `delete-many` of keys borrowed from the caller (the task's records).
    pub fn delete_keys(&mut self, keys: &[&[u8]]) -> Result<(), CallError> {
        let func = self.borrowed.delete_many;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let result = self.call("delete-many", Phase::Other, |api, s| match api {
            Api::V1(_) => {
                // SAFETY: checked against this signature in `BorrowedCalls::new`.
                let f = unsafe { DeleteManyRef1::new_unchecked(func) };
                from_v1::answer(f.call(s, (keys,)).map(|(r,)| r), |()| ())
            }
            Api::V2(_) => {
                for k in keys {
                    buf.push(k);
                }
                // SAFETY: checked against this signature in `BorrowedCalls::new`.
                let f = unsafe { PackedCall::new_unchecked(func) };
                f.call(s, (buf.as_ref(),)).map(|(r,)| r)
            }
        });
        self.scratch = buf;
        result
    }

    /// After a failed commit the store may hold part of it: the host makes
    /// no further call on this instance (the task stops; the next start
    /// recovers in a new one), whatever the guest would answer.
    pub fn commit(&mut self, offset: u64) -> Result<(), CallError> {
        let result = self.call("commit", Phase::Commit, |api, s| match api {
            Api::V1(g) => {
                from_v1::answer(g.txstore_store_state_store().call_commit(s, offset), |()| {
                    ()
                })
            }
            Api::V2(g) => g.txstore_store_state_store().call_commit(s, offset),
        });
        if result.is_err() && self.dead.is_none() {
            self.dead = Some("its commit failed earlier; a new instance must recover the store");
        }
        result
    }

    pub fn committed_offset(&mut self) -> Result<Option<u64>, CallError> {
        self.call("committed-offset", Phase::Other, |api, s| match api {
            Api::V1(g) => from_v1::answer(
                g.txstore_store_state_store().call_committed_offset(s),
                |o| o,
            ),
            Api::V2(g) => g.txstore_store_state_store().call_committed_offset(s),
        })
    }

    pub fn approximate_uncommitted_bytes(&mut self) -> Result<u64, CallError> {
        self.call("approximate-uncommitted-bytes", Phase::Other, |api, s| {
            match api {
                Api::V1(g) => g
                    .txstore_store_state_store()
                    .call_approximate_uncommitted_bytes(s),
                Api::V2(g) => g
                    .txstore_store_state_store()
                    .call_approximate_uncommitted_bytes(s),
            }
            .map(Ok)
        })
    }

    /// The largest linear memory the guest has grown to, in bytes.
    pub fn peak_memory_bytes(&self) -> u64 {
        self.store.data().limits.peak_memory as u64
    }
}

/// Says which limit a trap came from, when it came from one, and what the
/// guest printed last (a Rust guest's panic message): one line, not the
/// wasm backtrace.
pub(crate) fn explain(
    e: &wasmtime::Error,
    limits: &Limits,
    stderr: &wasmtime_wasi::p2::pipe::MemoryOutputPipe,
) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => {
            format!(
                "guest exceeded its time limit of {} ms",
                limits.call_timeout_ms
            )
        }
        Some(wasmtime::Trap::StackOverflow) => "guest overflowed its wasm stack".into(),
        _ if e.downcast_ref::<MemoryLimitExceeded>().is_some() => {
            format!(
                "guest exceeded its memory limit of {} MiB",
                limits.memory_mib
            )
        }
        Some(trap) => match last_stderr_line(stderr) {
            Some(said) => format!("guest trapped ({trap}): {said}"),
            None => format!("guest trapped: {trap}"),
        },
        // A host function's error: its own message, not the wasm
        // backtrace wasmtime wraps it in.
        None => format!(
            "guest failed: {}",
            e.root_cause().to_string().lines().next().unwrap_or("")
        ),
    }
}

fn last_stderr_line(stderr: &wasmtime_wasi::p2::pipe::MemoryOutputPipe) -> Option<String> {
    let bytes = stderr.contents();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // Rust prints "thread .. panicked at FILE:LINE:" then the message.
    match lines.iter().rposition(|l| l.contains("panicked at")) {
        Some(i) => Some(format!("{} {}", lines[i], lines.get(i + 1).unwrap_or(&""))),
        None => lines.last().map(|l| l.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::runtime::{GuestSource, Isolation, Limits, Runtime};
    use crate::storage::{
        Backend, Cursor, KeyspaceId, MemoryBackend, Op, Result, StorageError, StoreStorage,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Memory storage whose writes fail while `fail` is set.
    struct Failing {
        inner: Box<dyn StoreStorage>,
        fail: Arc<AtomicBool>,
    }

    impl Failing {
        fn check(&self) -> Result<()> {
            if self.fail.load(Ordering::Relaxed) {
                return Err(StorageError::Io("planted write failure".into()));
            }
            Ok(())
        }
    }

    impl StoreStorage for Failing {
        fn open_keyspace(&mut self, name: &str) -> Result<KeyspaceId> {
            self.inner.open_keyspace(name)
        }
        fn open_snapshot_keyspace(&mut self, snapshot: &str, name: &str) -> Result<KeyspaceId> {
            self.inner.open_snapshot_keyspace(snapshot, name)
        }
        fn keyspaces(&self) -> Result<Vec<String>> {
            self.inner.keyspaces()
        }
        fn get(&self, ks: KeyspaceId, key: &[u8]) -> Result<Option<Vec<u8>>> {
            self.inner.get(ks, key)
        }
        fn put(&mut self, ks: KeyspaceId, key: &[u8], value: &[u8]) -> Result<()> {
            self.check()?;
            self.inner.put(ks, key, value)
        }
        fn delete(&mut self, ks: KeyspaceId, key: &[u8]) -> Result<()> {
            self.check()?;
            self.inner.delete(ks, key)
        }
        fn scan(
            &self,
            ks: KeyspaceId,
            s: Option<&[u8]>,
            e: Option<&[u8]>,
        ) -> Result<Box<dyn Cursor>> {
            self.inner.scan(ks, s, e)
        }
        fn delete_range(&mut self, ks: KeyspaceId, start: &[u8], end: &[u8]) -> Result<()> {
            self.check()?;
            self.inner.delete_range(ks, start, end)
        }
        fn clear(&mut self, ks: KeyspaceId) -> Result<()> {
            self.check()?;
            self.inner.clear(ks)
        }
        fn is_empty(&self, ks: KeyspaceId) -> Result<bool> {
            self.inner.is_empty(ks)
        }
        fn write(&mut self, batch: Vec<(KeyspaceId, Vec<Op>)>, sync: bool) -> Result<()> {
            self.check()?;
            self.inner.write(batch, sync)
        }
        fn sync(&mut self) -> Result<()> {
            self.inner.sync()
        }
        fn create_snapshot(&mut self, name: &str) -> Result<()> {
            self.inner.create_snapshot(name)
        }
        fn restore_snapshot(&mut self, name: &str) -> Result<()> {
            self.inner.restore_snapshot(name)
        }
        fn drop_snapshot(&mut self, name: &str) -> Result<()> {
            self.inner.drop_snapshot(name)
        }
        fn list_snapshots(&self) -> Result<Vec<String>> {
            self.inner.list_snapshots()
        }
    }

    /// A failed commit ends the instance: the store may hold part of the
    /// commit, so no read or write may follow on it, whether or not the
    /// guest guards itself (wipe-on-crash does not).
    #[test]
    fn no_call_after_a_failed_commit() {
        let runtime = Runtime::new(None).unwrap();
        let guest = runtime.load(&GuestSource::parse("wipe-on-crash")).unwrap();
        let fail = Arc::new(AtomicBool::new(false));
        let storage = Failing {
            inner: MemoryBackend::new().open_store("s").unwrap(),
            fail: fail.clone(),
        };
        let mut s = guest
            .instantiate(Box::new(storage), "s", &Limits::default())
            .unwrap();
        s.init(&[]).unwrap();
        s.recover(None).unwrap();
        s.put(b"k", b"v").unwrap();
        fail.store(true, Ordering::Relaxed);
        assert!(s.commit(1).is_err());
        fail.store(false, Ordering::Relaxed);
        let err = s.get(b"k", Isolation::ReadUncommitted).unwrap_err();
        assert!(err.to_string().contains("commit failed"), "{err}");
        assert!(s.is_dead());
    }
}
