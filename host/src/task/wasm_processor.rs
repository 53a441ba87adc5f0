//! Processors as wasm components (the `processor` world of wit/): user
//! logic in its own sandbox (own `Store`, memory and time limits, the same
//! WASI with nothing in it), whose `state` imports the host serves from the
//! task's [`Context`], so every read and write goes through the strategy
//! guest and the task's exactly-once loop like a built-in's.

use super::{Context, Input, Processor};
use crate::error::Error;
use crate::runtime::host::sandbox_wasi;
use crate::runtime::limiter::GuestLimiter;
use crate::runtime::{CallError, Limits, LoadInfo, Runtime, World};
use anyhow::{Context as _, Result};
use std::path::Path;
use std::time::Instant;
use wasmtime::component::ResourceTable;
use wasmtime::Store;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/0.1.0",
        world: "processor",
        imports: { default: trappable },
    });
}

use bindings::exports::txstore::store::record_processor as export;
use bindings::txstore::store::types::{Entry, Error as WitError};

/// A compiled, linked processor ready to instantiate.
#[derive(Clone)]
pub struct ProcessorComponent {
    pub label: String,
    pre: bindings::ProcessorPre<ProcessorState>,
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
    fn store<T>(&mut self, r: Result<T, Error>) -> wasmtime::Result<Result<T, WitError>> {
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

impl bindings::txstore::store::types::Host for ProcessorState {}

type R<T> = wasmtime::Result<Result<T, WitError>>;

impl bindings::txstore::store::state::Host for ProcessorState {
    fn get(&mut self, key: Vec<u8>) -> R<Option<Vec<u8>>> {
        let r = self.ctx()?.get(&key);
        self.store(r)
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> R<Vec<Option<Vec<u8>>>> {
        let r = self.ctx()?.get_many(&keys);
        self.store(r)
    }

    fn range(&mut self, start: Option<Vec<u8>>, end: Option<Vec<u8>>, limit: u32) -> R<Vec<Entry>> {
        if let (Some(s), Some(e)) = (&start, &end) {
            if s > e {
                return Ok(Err(WitError::InvalidArgument(
                    "range start is after its end".into(),
                )));
            }
        }
        let r = self.ctx()?.range(start.as_deref(), end.as_deref(), limit);
        let page = self.store(r)?;
        Ok(page.map(|p| {
            p.into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect()
        }))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> R<()> {
        self.count_write(key.len() + value.len())?;
        self.ctx()?.put(&key, &value);
        Ok(Ok(()))
    }

    fn delete(&mut self, key: Vec<u8>) -> R<()> {
        self.count_write(key.len())?;
        self.ctx()?.delete(&key);
        Ok(Ok(()))
    }
}

/// Adds the processor world's imports (WASI and `state`) to `linker`.
fn add_to_linker(linker: &mut wasmtime::component::Linker<ProcessorState>) -> Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    bindings::Processor::add_to_linker::<_, wasmtime::component::HasSelf<_>>(linker, |s| s)?;
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
            let (component, cached, hash, exports, imports) =
                runtime.compile_checked(&label, &bytes, World::Processor)?;
            let mut linker = wasmtime::component::Linker::new(runtime.engine());
            add_to_linker(&mut linker)?;
            let pre = linker
                .instantiate_pre(&component)
                .map_err(|e| crate::runtime::link_error(&label, &format!("{e:#}")))?;
            let pre = bindings::ProcessorPre::new(pre)
                .map_err(anyhow::Error::from)
                .with_context(|| {
                    format!("processor {label} does not implement txstore:store/processor")
                })?;
            Ok::<_, anyhow::Error>((pre, cached, hash, exports, imports))
        })();
        // Whatever is wrong with the file, it is the config's choice.
        let (pre, cached, hash, exports, imports) = checked
            .map_err(|e| crate::error::marked(crate::error::Kind::Config, format!("{e:#}")))?;
        Ok(ProcessorComponent {
            label,
            pre,
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
        let api = self
            .pre
            .instantiate(&mut store)
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
        let r = p
            .api
            .txstore_store_record_processor()
            .call_init(&mut p.store, options);
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
    api: bindings::Processor,
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
        let record = export::Input {
            key: input.key().map(<[u8]>::to_vec),
            value: input.value().map(<[u8]>::to_vec),
        };
        self.arm();
        self.store.data_mut().written = (0, 0);
        // Lend the context for this call only (see `Lent`).
        self.store.data_mut().ctx = Lent((ctx as *mut Context<'_>).cast::<Context<'static>>());
        let result = self
            .api
            .txstore_store_record_processor()
            .call_process(&mut self.store, &record);
        self.store.data_mut().ctx = Lent(std::ptr::null_mut());
        match result {
            Ok(Ok(outputs)) => {
                let bytes: u64 = outputs
                    .iter()
                    .map(|o| (o.key.len() + o.value.as_ref().map_or(0, Vec::len)) as u64)
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
                for o in outputs {
                    ctx.emit(&o.key, o.value.as_deref());
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
