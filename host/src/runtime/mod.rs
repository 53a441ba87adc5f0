//! The wasm runtime: one wasmtime [`Engine`] for the process, guests
//! compiled once and cached on disk, instantiated cheaply from an
//! [`InstancePre`](wasmtime::component::InstancePre), each in its own
//! `Store` with memory, table, instance and time limits.

mod cache;
mod calls;
mod exports;
pub(crate) mod host;
mod host_v1;
mod host_v2;
pub(crate) mod instance;
pub(crate) mod limiter;
mod native;
pub(crate) mod packed;
mod store_instance;
mod world;

use cache::{check_cache, write_cache};
pub use cache::{prune_cache, CACHE_MAX_BYTES};
pub use calls::CallStats;
pub use host::GuestState;
pub use instance::{CallError, EntryRef, Isolation, Recovery, RecoveryAction, WitError};
pub use native::NAME as NATIVE;
pub use store_instance::{StoreInstance, RANGE_PAGE};
use world::{check_is_component, check_world};
pub(crate) use world::{link_error, World};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

pub(crate) mod bindings {
    /// The frozen 0.1.0 store world: keys, pages and batches as lists.
    pub(crate) mod v1 {
        wasmtime::component::bindgen!({
            path: "../wit/0.1.0",
            world: "store",
            with: {
                "txstore:store/storage.keyspace": crate::runtime::host::KeyspaceRes,
                "txstore:store/storage.cursor": crate::runtime::host::CursorRes,
            },
            imports: { default: trappable },
        });
    }

    /// The current store world (0.2.0): keys, pages and batches packed.
    pub(crate) mod v2 {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "store",
            with: {
                "txstore:store/storage.keyspace": crate::runtime::host::KeyspaceRes,
                "txstore:store/storage.cursor": crate::runtime::host::CursorRes,
            },
            imports: { default: trappable },
        });
    }
}

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "txstore:store";
/// The current version: what new guests are built against.
pub const WIT_VERSION: &str = "0.2.0";
/// Every version of the package the host links, oldest first: a guest or a
/// processor built against any of them loads.
pub const WIT_VERSIONS: &[&str] = &["0.1.0", WIT_VERSION];
/// How often the epoch advances; the unit of the per-call time budget.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Per-store sandbox limits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Linear memory a guest may grow to, in MiB.
    pub memory_mib: u64,
    /// Wall time one guest call may take before it is interrupted, in ms.
    pub call_timeout_ms: u64,
    /// Tables a guest may create.
    pub max_tables: u32,
    /// Core instances a guest may create.
    pub max_instances: u32,
    /// A processor's writes for one record (`state.put`/`delete` keys and
    /// values), in bytes: the host holds them until the record is applied.
    pub record_write_bytes: u64,
    /// A processor's `state.put`/`delete` calls for one record.
    pub record_writes: u64,
    /// A processor's output for one record (keys and values), in bytes.
    pub record_output_bytes: u64,
    /// A processor's output records for one input record.
    pub record_outputs: u64,
}

impl Limits {
    /// One call's time budget in epoch ticks (at least one).
    pub(crate) fn call_ticks(&self) -> u64 {
        self.call_timeout_ms
            .div_ceil(EPOCH_TICK.as_millis() as u64)
            .max(1)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mib: 512,
            call_timeout_ms: 30_000,
            max_tables: 100,
            max_instances: 100,
            record_write_bytes: 64 << 20,
            record_writes: 100_000,
            record_output_bytes: 64 << 20,
            record_outputs: 100_000,
        }
    }
}

/// Where a guest comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestSource {
    /// One of the guests built into the binary (see `txstore inspect`).
    Builtin(String),
    /// A `.wasm` component file.
    Path(PathBuf),
}

impl GuestSource {
    /// A built-in name when it is one (a built-in guest, or `native`),
    /// else a path.
    pub fn parse(s: &str) -> Self {
        if s == native::NAME || txstore_artifacts::builtin(s).is_some() {
            GuestSource::Builtin(s.to_string())
        } else {
            GuestSource::Path(PathBuf::from(s))
        }
    }
}

impl std::fmt::Display for GuestSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestSource::Builtin(n) => write!(f, "{n}"),
            GuestSource::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The wasmtime engine, the linker with the host's imports, and the cache.
pub struct Runtime {
    engine: Engine,
    linker: Linker<GuestState>,
    cache_dir: Option<PathBuf>,
}

/// How a component was loaded.
#[derive(Clone, Debug)]
pub struct LoadInfo {
    /// True when the compiled code came from the on-disk cache.
    pub cached: bool,
    pub elapsed: Duration,
    /// SHA-256 of the component bytes.
    pub hash: String,
}

/// A linked guest of one WIT version.
#[derive(Clone)]
pub(crate) enum GuestPre {
    V1(bindings::v1::StorePre<GuestState>),
    V2(bindings::v2::StorePre<GuestState>),
    /// No component: the native baseline (`native.rs`).
    Native,
}

/// A compiled, linked guest ready to instantiate.
#[derive(Clone)]
pub struct GuestComponent {
    pub label: String,
    pre: GuestPre,
    /// The WIT version the guest was built against (one of
    /// [`WIT_VERSIONS`]).
    pub version: &'static str,
    engine: Engine,
    pub load: LoadInfo,
    /// The world's exports and imports, for `inspect`.
    pub exports: Vec<String>,
    pub imports: Vec<String>,
}

impl Runtime {
    /// An engine configured for the lowest per-call cost that keeps the
    /// sandbox: epoch interruption (cheap) rather than fuel, no async
    /// component support (it costs about 3x per call).
    ///
    /// One runtime serves every task of a process (tasks on several
    /// threads share it). `cache_dir` keeps compiled guests between runs
    /// (`None`: compile at every start).
    ///
    /// ```
    /// let runtime = txstore::Runtime::new(None)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.max_wasm_stack(1 << 20);
        let engine = Engine::new(&config)
            .map_err(anyhow::Error::from)
            .context("creating the wasmtime engine")?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        bindings::v1::Store::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        bindings::v2::Store::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;

        // The ticker lives as long as the engine, which instances keep
        // alive after the Runtime itself is gone: it must not stop earlier,
        // or a guest call could run without a time limit.
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("txstore-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            })?;
        Ok(Self {
            engine,
            linker,
            cache_dir,
        })
    }

    #[doc(hidden)]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    #[doc(hidden)]
    /// Loads a guest by source.
    pub fn load(&self, source: &GuestSource) -> Result<GuestComponent> {
        match source {
            GuestSource::Builtin(name) if name == native::NAME => Ok(GuestComponent {
                label: native::NAME.to_string(),
                pre: GuestPre::Native,
                version: WIT_VERSION,
                engine: self.engine.clone(),
                load: LoadInfo {
                    cached: true,
                    elapsed: Duration::ZERO,
                    hash: native::NAME.to_string(),
                },
                exports: Vec::new(),
                imports: Vec::new(),
            }),
            GuestSource::Builtin(name) => {
                let bytes = txstore_artifacts::builtin(name).with_context(|| {
                    let names: Vec<_> = txstore_artifacts::names().collect();
                    format!(
                        "no built-in guest named `{name}` (built-in: {})",
                        names.join(", ")
                    )
                })?;
                self.load_bytes(name, bytes)
            }
            GuestSource::Path(path) => {
                let bytes = std::fs::read(path).with_context(|| {
                    let names: Vec<_> = txstore_artifacts::names().collect();
                    format!(
                        "cannot read guest {}: it is neither a built-in guest ({}) nor a readable .wasm file",
                        path.display(),
                        names.join(", ")
                    )
                })?;
                self.load_bytes(&path.display().to_string(), &bytes)
            }
        }
    }

    #[doc(hidden)]
    /// Compiles (or fetches from the cache), checks the world and links.
    pub fn load_bytes(&self, label: &str, bytes: &[u8]) -> Result<GuestComponent> {
        let started = Instant::now();
        check_is_component(label, bytes)?;
        let hash = hex(&Sha256::digest(bytes));
        let (component, cached) = self.compile_cached(label, bytes, &hash)?;
        let (exports, imports, version) =
            check_world(label, &self.engine, &component, World::Store)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| link_error(label, &format!("{e:#}")))?;
        let not_store =
            || format!("guest {label} does not implement {WIT_PACKAGE}/store@{version}");
        let pre = if version == WIT_VERSION {
            GuestPre::V2(
                bindings::v2::StorePre::new(pre)
                    .map_err(anyhow::Error::from)
                    .with_context(not_store)?,
            )
        } else {
            GuestPre::V1(
                bindings::v1::StorePre::new(pre)
                    .map_err(anyhow::Error::from)
                    .with_context(not_store)?,
            )
        };
        let load = LoadInfo {
            cached,
            elapsed: started.elapsed(),
            hash,
        };
        Ok(GuestComponent {
            label: label.to_string(),
            pre,
            version,
            engine: self.engine.clone(),
            load,
            exports,
            imports,
        })
    }

    /// Checks `bytes` are a component of `world` at a version the host
    /// links, and compiles it (or fetches it from the cache): (component,
    /// cached, hash, exports, imports, version).
    #[allow(clippy::type_complexity)]
    pub(crate) fn compile_checked(
        &self,
        label: &str,
        bytes: &[u8],
        world: World,
    ) -> Result<(
        Component,
        bool,
        String,
        Vec<String>,
        Vec<String>,
        &'static str,
    )> {
        check_is_component(label, bytes)?;
        let hash = hex(&Sha256::digest(bytes));
        let (component, cached) = self.compile_cached(label, bytes, &hash)?;
        let (exports, imports, version) = check_world(label, &self.engine, &component, world)?;
        Ok((component, cached, hash, exports, imports, version))
    }

    fn cache_path(&self, hash: &str) -> Option<PathBuf> {
        use std::hash::{Hash, Hasher};
        let dir = self.cache_dir.as_ref()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        Some(dir.join(format!("{hash}-{:016x}.cwasm", h.finish())))
    }

    fn compile_cached(&self, label: &str, bytes: &[u8], hash: &str) -> Result<(Component, bool)> {
        let path = self.cache_path(hash);
        if let Some(path) = path.as_ref().filter(|p| p.exists()) {
            match check_cache(path).and_then(|()| {
                // SAFETY: the file is what `Component::serialize` wrote for
                // an engine with the same compatibility hash (it is in the
                // name), and its CRC32C matched, so neither a torn write
                // nor a flipped bit reaches wasmtime; wasmtime checks the
                // header and version again. Mapping the file (rather than
                // reading it) lets large guests start without copying their
                // code and initial heap. Nothing rewrites a cache file in
                // place: new entries are renamed over, old ones unlinked.
                unsafe { Component::deserialize_file(&self.engine, path) }
                    .map_err(anyhow::Error::from)
            }) {
                Ok(c) => {
                    // The modification time orders entries for pruning.
                    let _ = std::fs::File::options()
                        .append(true)
                        .open(path)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                    return Ok((c, true));
                }
                Err(e) => tracing::warn!(
                    "cached compilation {} is unusable ({e:#}); recompiling",
                    path.display()
                ),
            }
        }
        let component = Component::new(&self.engine, bytes)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("guest {label} failed to compile"))?;
        if let Some(path) = path {
            if let Err(e) = write_cache(&path, &component.serialize()?) {
                tracing::warn!("cannot cache compiled guest at {}: {e:#}", path.display());
            }
            prune_cache(path.parent().unwrap(), CACHE_MAX_BYTES, &path);
        }
        Ok((component, false))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl GuestComponent {
    /// The native store (`native.rs`), not a component.
    pub fn is_native(&self) -> bool {
        matches!(self.pre, GuestPre::Native)
    }

    /// A fresh instance over `storage`, named `store_name` in logs.
    pub fn instantiate(
        &self,
        storage: Box<dyn crate::storage::StoreStorage>,
        store_name: &str,
        limits: &Limits,
    ) -> Result<StoreInstance> {
        Ok(match self.pre {
            GuestPre::Native => {
                StoreInstance::Native(native::NativeInstance::new(storage, store_name))
            }
            _ => StoreInstance::Wasm(Box::new(instance::WasmInstance::new(
                self, storage, store_name, limits,
            )?)),
        })
    }
}
