//! Processors as wasm components (the `processor` world of wit/): user
//! logic in its own sandbox (own `Store`, memory and time limits, the same
//! WASI with nothing in it), whose `state` imports the host serves from the
//! task's [`Context`], so every read and write goes through the strategy
//! guest and the task's exactly-once loop like a built-in's. Both versions
//! of the world are linked: 0.2.0 (keys and pages packed) and the frozen
//! 0.1.0 (lists), so a processor built before 0.2.0 keeps working.

use super::{Context, Input, Processor};
use crate::error::Error;
use crate::runtime::host::sandbox_wasi;
use crate::runtime::limiter::GuestLimiter;
use crate::runtime::packed::{into_packed, pack_values, unpack_arg, PackedBuf};
use crate::runtime::{CallError, Limits, LoadInfo, Runtime, World, WIT_VERSION};
use anyhow::{Context as _, Result};
use std::path::Path;
use std::time::Instant;
use wasmtime::component::ResourceTable;
use wasmtime::Store;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub(crate) mod bindings {
    /// The frozen 0.1.0 processor world: keys and pages as lists.
    pub(crate) mod v1 {
        wasmtime::component::bindgen!({
            path: "../wit/0.1.0",
            world: "processor",
            imports: { default: trappable },
        });
    }

    /// The current processor world (0.2.0): keys and pages packed, in
    /// the store world's own types (one `Packed`, one `Error`).
    pub(crate) mod v2 {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "processor",
            imports: { default: trappable },
            with: { "txstore:store/types": crate::runtime::bindings::v2::txstore::store::types },
        });
    }
}

use bindings::{v1, v2};

/// A linked processor of either version.
#[derive(Clone)]
enum Pre {
    V1(v1::ProcessorPre<ProcessorState>),
    V2(v2::ProcessorPre<ProcessorState>),
}

/// An instance of either version.
enum Api {
    V1(v1::Processor),
    V2(v2::Processor),
}

/// A compiled, linked processor ready to instantiate.
#[derive(Clone)]
pub struct ProcessorComponent {
    pub label: String,
    pre: Pre,
    /// The WIT version it was built against.
    pub version: &'static str,
    engine: wasmtime::Engine,
    pub load: LoadInfo,
    /// The world's exports and imports, for `inspect`.
    pub exports: Vec<String>,
    pub imports: Vec<String>,
}

/// The task's context, lent to the processor's `Store` for the length of
/// one `process` call.
struct Lent(*mut Context<'static>);

// SAFETY: the pointer is set and cleared by `WasmProcessor::process` on
// the thread that runs the call, and only dereferenced inside that call
// (the host functions run synchronously within it). Between calls it is
// null, and the state is moved between threads only between calls.
unsafe impl Send for Lent {}

/// Everything a processor's wasmtime `Store` holds.
pub struct ProcessorState {
    table: ResourceTable,
    wasi: WasiCtx,
    stderr: MemoryOutputPipe,
    limits: GuestLimiter,
    ctx: Lent,
    /// A store call that failed inside `process`: the processor is trapped
    /// and the task sees this (the strategy guest's) error.
    failed: Option<CallError>,
    /// What the running `process` call wrote: (calls, bytes).
    written: (u64, u64),
    /// `limits.record_writes` and `limits.record_write_bytes`.
    write_limits: (u64, u64),
    /// The limit a call went past, for the task's error line.
    over_limit: Option<String>,
}

impl ProcessorState {
    /// The context of the running `process` call.
    fn ctx(&mut self) -> wasmtime::Result<&mut Context<'static>> {
        if self.ctx.0.is_null() {
            wasmtime::bail!("the processor used `state` outside `process` (in `init`?)");
        }
        // SAFETY: non-null only during `process`, which holds the context
        // mutably borrowed and lends it to nobody else (see `Lent`).
        Ok(unsafe { &mut *self.ctx.0 })
    }

    /// Counts one write of `bytes` against the record's limits; past them
    /// the processor traps (the host holds every write until the record
    /// is applied, so this bounds the host memory a record can take).
    fn count_write(&mut self, bytes: usize) -> wasmtime::Result<()> {
        let (calls, total) = &mut self.written;
        *calls += 1;
        *total += bytes as u64;
        let (max_calls, max_bytes) = self.write_limits;
        let over = if *calls > max_calls {
            Some(format!(
                "more than {max_calls} writes for one record (limits.record_writes)"
            ))
        } else if *total > max_bytes {
            Some(format!(
                "more than {max_bytes} bytes of writes for one record (limits.record_write_bytes)"
            ))
        } else {
            None
        };
        if let Some(why) = over {
            self.over_limit = Some(why.clone());
            wasmtime::bail!("{why}");
        }
        Ok(())
    }

    /// A store call's result: a failed call traps the processor, and the
    /// task reports the strategy guest's error.
    fn store<T, E>(&mut self, r: Result<T, Error>) -> wasmtime::Result<Result<T, E>> {
        match r {
            Ok(v) => Ok(Ok(v)),
            Err(e) => {
                let message = e.to_string();
                if let Error::Guest(chain) = e {
                    if let Ok(call) = chain.downcast::<CallError>() {
                        self.failed = Some(call);
                    }
                }
                wasmtime::bail!("the store failed: {message}")
            }
        }
    }
}

impl WasiView for ProcessorState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl ProcessorState {
    /// `range` for both versions: the page, or why the arguments are
    /// refused (`invalid-argument`).
    fn range_page(
        &mut self,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<(Vec<u8>, Vec<u8>)>, String>> {
        if let (Some(s), Some(e)) = (&start, &end) {
            if s > e {
                return Ok(Err("range start is after its end".into()));
            }
        }
        let r = self.ctx()?.range(start.as_deref(), end.as_deref(), limit);
        self.store(r)
    }

    /// Writes `(key, value)` pairs (`None`: a delete) after counting all
    /// of them against the record's limits.
    fn write_all(&mut self, writes: &[(&[u8], Option<&[u8]>)]) -> wasmtime::Result<()> {
        for (key, value) in writes {
            self.count_write(key.len() + value.map_or(0, <[u8]>::len))?;
        }
        let ctx = self.ctx()?;
        for &(key, value) in writes {
            match value {
                Some(value) => ctx.put(key, value),
                None => ctx.delete(key),
            }
        }
        Ok(())
    }
}

impl v1::txstore::store::types::Host for ProcessorState {}

/// `state` in 0.1.0's types.
mod state_v1 {
    use super::v1::txstore::store::state::Host;
    use super::v1::txstore::store::types::{Entry, Error};
    use super::ProcessorState;

    type R<T> = wasmtime::Result<Result<T, Error>>;

    impl Host for ProcessorState {
        fn get(&mut self, key: Vec<u8>) -> R<Option<Vec<u8>>> {
            let r = self.ctx()?.get(&key);
            self.store(r)
        }

        fn get_many(&mut self, keys: Vec<Vec<u8>>) -> R<Vec<Option<Vec<u8>>>> {
            let r = self.ctx()?.get_many(&keys);
            self.store(r)
        }

        fn range(
            &mut self,
            start: Option<Vec<u8>>,
            end: Option<Vec<u8>>,
            limit: u32,
        ) -> R<Vec<Entry>> {
            Ok(self
                .range_page(start, end, limit)?
                .map_err(Error::InvalidArgument)
                .map(|p| {
                    p.into_iter()
                        .map(|(key, value)| Entry { key, value })
                        .collect()
                }))
        }

        fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> R<()> {
            self.write_all(&[(&key, Some(&value))])?;
            Ok(Ok(()))
        }

        fn delete(&mut self, key: Vec<u8>) -> R<()> {
            self.write_all(&[(&key, None)])?;
            Ok(Ok(()))
        }
    }
}

impl crate::runtime::bindings::v2::txstore::store::types::Host for ProcessorState {}

/// `state` in 0.2.0's types: keys and pages packed.
mod state_v2 {
    use super::v2::txstore::store::state::Host;
    use super::{into_packed, pack_values, unpack_arg, PackedBuf, ProcessorState};
    use crate::runtime::bindings::v2::txstore::store::types::{Error, MaybeValues, Packed};

    type R<T> = wasmtime::Result<Result<T, Error>>;

    impl Host for ProcessorState {
        fn get(&mut self, key: Vec<u8>) -> R<Option<Vec<u8>>> {
            let r = self.ctx()?.get(&key);
            self.store(r)
        }

        fn get_many(&mut self, keys: Packed) -> R<MaybeValues> {
            // Slices of the processor's one buffer: no copy per key.
            let keys: Vec<&[u8]> = match unpack_arg("get-many", &keys, 1) {
                Ok(keys) => keys.collect(),
                Err(e) => return Ok(Err(e)),
            };
            let r = self.ctx()?.get_many(&keys);
            Ok(self.store(r)?.map(|values| pack_values(&values)))
        }

        fn range(&mut self, start: Option<Vec<u8>>, end: Option<Vec<u8>>, limit: u32) -> R<Packed> {
            Ok(self
                .range_page(start, end, limit)?
                .map_err(Error::InvalidArgument)
                .map(|p| {
                    let mut out = PackedBuf::default();
                    for (key, value) in &p {
                        out.push(key);
                        out.push(value);
                    }
                    into_packed(out)
                }))
        }

        fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> R<()> {
            self.write_all(&[(&key, Some(&value))])?;
            Ok(Ok(()))
        }

        fn delete(&mut self, key: Vec<u8>) -> R<()> {
            self.write_all(&[(&key, None)])?;
            Ok(Ok(()))
        }

        fn put_many(&mut self, entries: Packed) -> R<()> {
            let strings: Vec<&[u8]> = match unpack_arg("put-many", &entries, 2) {
                Ok(strings) => strings.collect(),
                Err(e) => return Ok(Err(e)),
            };
            let writes: Vec<_> = strings.chunks(2).map(|kv| (kv[0], Some(kv[1]))).collect();
            self.write_all(&writes)?;
            Ok(Ok(()))
        }

        fn delete_many(&mut self, keys: Packed) -> R<()> {
            let writes: Vec<_> = match unpack_arg("delete-many", &keys, 1) {
                Ok(keys) => keys.map(|k| (k, None)).collect(),
                Err(e) => return Ok(Err(e)),
            };
            self.write_all(&writes)?;
            Ok(Ok(()))
        }
    }
}

/// Adds the processor world's imports (WASI and `state`, both versions) to
/// `linker`.
fn add_to_linker(linker: &mut wasmtime::component::Linker<ProcessorState>) -> Result<()> {
    use wasmtime::component::HasSelf;
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    v1::Processor::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    v2::Processor::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    Ok(())
}

impl ProcessorComponent {
    /// Loads a processor component (the `processor` world) from `path`,
    /// compiled by `runtime` (and its cache).
    pub fn load(runtime: &Runtime, path: &Path) -> Result<Self> {
        let started = Instant::now();
        let label = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| {
            crate::error::marked(
                crate::error::Kind::Config,
                format!("cannot read processor {label}: {e} (task.processor names `kv`, `word-count` or a .wasm file)"),
            )
        })?;
        let checked = (|| {
            let (component, cached, hash, exports, imports, version) =
                runtime.compile_checked(&label, &bytes, World::Processor)?;
            let mut linker = wasmtime::component::Linker::new(runtime.engine());
            add_to_linker(&mut linker)?;
            let pre = linker
                .instantiate_pre(&component)
                .map_err(|e| crate::runtime::link_error(&label, &format!("{e:#}")))?;
            let not_processor = || {
                format!("processor {label} does not implement txstore:store/processor@{version}")
            };
            let pre = if version == WIT_VERSION {
                Pre::V2(
                    v2::ProcessorPre::new(pre)
                        .map_err(anyhow::Error::from)
                        .with_context(not_processor)?,
                )
            } else {
                Pre::V1(
                    v1::ProcessorPre::new(pre)
                        .map_err(anyhow::Error::from)
                        .with_context(not_processor)?,
                )
            };
            Ok::<_, anyhow::Error>((pre, cached, hash, exports, imports, version))
        })();
        // Whatever is wrong with the file, it is the config's choice.
        let (pre, cached, hash, exports, imports, version) = checked
            .map_err(|e| crate::error::marked(crate::error::Kind::Config, format!("{e:#}")))?;
        Ok(ProcessorComponent {
            label,
            pre,
            version,
            engine: runtime.engine().clone(),
            load: LoadInfo {
                cached,
                elapsed: started.elapsed(),
                hash,
            },
            exports,
            imports,
        })
    }

    /// A fresh instance under `limits`, configured with `options`.
    pub fn instantiate(
        &self,
        limits: &Limits,
        options: &[(String, String)],
    ) -> Result<WasmProcessor> {
        let (wasi, stderr) = sandbox_wasi();
        let state = ProcessorState {
            table: ResourceTable::new(),
            wasi,
            stderr,
            limits: GuestLimiter::new(limits),
            ctx: Lent(std::ptr::null_mut()),
            failed: None,
            written: (0, 0),
            write_limits: (limits.record_writes, limits.record_write_bytes),
            over_limit: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(u64::MAX / 2);
        store.epoch_deadline_trap();
        let api = match &self.pre {
            Pre::V1(pre) => pre.instantiate(&mut store).map(Api::V1),
            Pre::V2(pre) => pre.instantiate(&mut store).map(Api::V2),
        }
        .map_err(anyhow::Error::from)
        .with_context(|| format!("processor {} cannot be instantiated", self.label))?;
        let mut p = WasmProcessor {
            store,
            api,
            label: self.label.clone(),
            limits: limits.clone(),
            dead: false,
        };
        p.arm();
        let r = match &p.api {
            Api::V1(api) => api
                .txstore_store_record_processor()
                .call_init(&mut p.store, options),
            Api::V2(api) => api
                .txstore_store_record_processor()
                .call_init(&mut p.store, options),
        };
        match r {
            Ok(Ok(())) => Ok(p),
            Ok(Err(why)) => Err(crate::error::marked(
                crate::error::Kind::Config,
                format!(
                    "processor {} refused its options (task.processor_options): {why}",
                    self.label
                ),
            )),
            Err(e) => {
                let why = p.explain(&e);
                anyhow::bail!("processor {} failed in init: {why}", self.label)
            }
        }
    }
}

/// A live processor instance: [`Processor`] for a task.
pub struct WasmProcessor {
    store: Store<ProcessorState>,
    api: Api,
    label: String,
    limits: Limits,
    /// It trapped: its state is unknown, it takes no more calls.
    dead: bool,
}

impl WasmProcessor {
    /// Sets the time budget of the next call.
    fn arm(&mut self) {
        self.store.set_epoch_deadline(self.limits.call_ticks());
    }

    fn explain(&self, e: &wasmtime::Error) -> String {
        crate::runtime::instance::explain(e, &self.limits, &self.store.data().stderr)
    }
}

impl Processor for WasmProcessor {
    fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
        if self.dead {
            return Err(Error::processor(format!(
                "processor {} trapped earlier and takes no more records",
                self.label
            )));
        }
        let (key, value) = (
            input.key().map(<[u8]>::to_vec),
            input.value().map(<[u8]>::to_vec),
        );
        self.arm();
        self.store.data_mut().written = (0, 0);
        // Lend the context for this call only (see `Lent`).
        self.store.data_mut().ctx = Lent((ctx as *mut Context<'_>).cast::<Context<'static>>());
        // The outputs as (key, value) whichever the version.
        let result = match &self.api {
            Api::V1(api) => {
                use v1::exports::txstore::store::record_processor::Input;
                api.txstore_store_record_processor()
                    .call_process(&mut self.store, &Input { key, value })
                    .map(|r| r.map(|o| o.into_iter().map(|o| (o.key, o.value)).collect::<Vec<_>>()))
            }
            Api::V2(api) => {
                use v2::exports::txstore::store::record_processor::Input;
                api.txstore_store_record_processor()
                    .call_process(&mut self.store, &Input { key, value })
                    .map(|r| r.map(|o| o.into_iter().map(|o| (o.key, o.value)).collect::<Vec<_>>()))
            }
        };
        self.store.data_mut().ctx = Lent(std::ptr::null_mut());
        match result {
            Ok(Ok(outputs)) => {
                let bytes: u64 = outputs
                    .iter()
                    .map(|(k, v)| (k.len() + v.as_ref().map_or(0, Vec::len)) as u64)
                    .sum();
                let over = if outputs.len() as u64 > self.limits.record_outputs {
                    Some(format!(
                        "{} output records for one record, more than limits.record_outputs = {}",
                        outputs.len(),
                        self.limits.record_outputs
                    ))
                } else if bytes > self.limits.record_output_bytes {
                    Some(format!(
                        "{bytes} bytes of output for one record, more than limits.record_output_bytes = {}",
                        self.limits.record_output_bytes
                    ))
                } else {
                    None
                };
                if let Some(why) = over {
                    self.dead = true;
                    return Err(Error::processor(format!(
                        "processor {} stopped: {why}",
                        self.label
                    )));
                }
                for (key, value) in outputs {
                    ctx.emit(&key, value.as_deref());
                }
                Ok(())
            }
            Ok(Err(why)) => Err(Error::processor(format!(
                "processor {} refused a record: {why}",
                self.label
            ))),
            Err(e) => {
                self.dead = true;
                if let Some(why) = self.store.data_mut().over_limit.take() {
                    return Err(Error::processor(format!(
                        "processor {} stopped: {why}",
                        self.label
                    )));
                }
                if let Some(call) = self.store.data_mut().failed.take() {
                    return Err(Error::Guest(
                        anyhow::Error::from(call)
                            .context(format!("processor {}: a store call failed", self.label)),
                    ));
                }
                Err(Error::processor(format!(
                    "processor {} failed: {}",
                    self.label,
                    self.explain(&e)
                )))
            }
        }
    }
}
