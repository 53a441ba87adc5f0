//! The wasm runtime: one wasmtime [`Engine`] for the process, guests
//! compiled once and cached on disk, instantiated cheaply from an
//! [`InstancePre`](wasmtime::component::InstancePre), each in its own
//! `Store` with memory, table, instance and time limits.

mod exports;
pub(crate) mod host;
mod host_v1;
mod host_v2;
pub(crate) mod instance;
pub(crate) mod limiter;
mod native;
pub(crate) mod packed;
mod store_instance;

pub use host::GuestState;
pub use instance::{CallError, EntryRef, Isolation, Recovery, RecoveryAction, WitError};
pub use native::NAME as NATIVE;
pub use store_instance::{StoreInstance, RANGE_PAGE};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
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

/// A cached compilation ends in its CRC32C and this tag, so a truncated or
/// damaged file is recompiled instead of being mapped as code.
const CACHE_TAG: &[u8; 4] = b"TXCC";

/// The most compiled code the cache keeps. Guests that embed a language
/// runtime compile to tens of MB, and their builds are often not
/// reproducible (each rebuild is a new hash), so the cache must forget.
pub const CACHE_MAX_BYTES: u64 = 1 << 30;

/// Removes the least recently used cache entries until the `.cwasm` files
/// in `dir` fit in `max` bytes; `keep` (just written) is never removed.
/// Best effort: a failure only leaves the cache larger.
pub fn prune_cache(dir: &Path, max: u64, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= max {
            break;
        }
        if path != keep && std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "compiled-guest cache over {max} bytes: removed {}",
                path.display()
            );
            total -= len;
        }
    }
}

fn write_cache(path: &Path, code: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir)?;
    // Write aside and rename, so a reader never sees half a file.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, code)?;
    std::io::Write::write_all(&mut tmp, &crc32c::crc32c(code).to_le_bytes())?;
    std::io::Write::write_all(&mut tmp, CACHE_TAG)?;
    tmp.persist(path)?;
    Ok(())
}

/// Checks a cached compilation's trailer: its CRC32C over the code.
fn check_cache(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let n = file.metadata()?.len();
    if n < 8 {
        anyhow::bail!("no trailer: truncated or not written by txstore");
    }
    let mut code = (&mut file).take(n - 8);
    let mut crc = 0u32;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let got = code.read(&mut buf)?;
        if got == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..got]);
    }
    let mut trailer = [0u8; 8];
    file.read_exact(&mut trailer)?;
    if &trailer[4..] != CACHE_TAG {
        anyhow::bail!("no trailer: truncated or not written by txstore");
    }
    if crc != u32::from_le_bytes(trailer[..4].try_into().unwrap()) {
        anyhow::bail!("checksum mismatch");
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Refuses core modules and other files before wasmtime gives a less
/// direct error.
fn check_is_component(label: &str, bytes: &[u8]) -> Result<()> {
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        bail!("guest {label} is not a WebAssembly file (no `\\0asm` header)");
    }
    // Bytes 4..8: version and layer; layer 1 is a component.
    if bytes[6..8] != [1, 0] {
        bail!(
            "guest {label} is a core WebAssembly module, not a component: build it for wasm32-wasip2 \
             (or wrap it with `wasm-tools component new`)"
        );
    }
    Ok(())
}

/// What the linker offers a guest, for error messages.
const PROVIDED: &str =
    "txstore:store/storage and txstore:store/state, each @0.1.0 and @0.2.0, and WASI 0.2 \
                        (cli, clocks, filesystem, io, random, sockets; with no files, environment, \
                        network or clock)";

/// One line for a failed link, naming the import wasmtime could not match
/// (its message has the form "component imports instance `NAME`, but ...").
pub(crate) fn link_error(label: &str, message: &str) -> anyhow::Error {
    let name = message
        .split_once("imports instance `")
        .or_else(|| message.split_once("imports func `"))
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(name, _)| name);
    match name {
        Some(name) => {
            let why = message.split_once(": ").map_or(message, |(_, why)| why);
            anyhow::anyhow!(
                "guest {label} imports `{name}`, which this host does not provide in the form the guest expects \
                 ({why}); the host links only {PROVIDED}: rebuild the guest without that import"
            )
        }
        None => anyhow::anyhow!("guest {label} cannot be linked: {message}"),
    }
}

/// The worlds of wit/ a component may implement.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum World {
    /// A strategy: exports `state-store`, imports `storage`.
    Store,
    /// User logic: exports `processor`, imports `state`.
    Processor,
}

impl World {
    fn name(self) -> &'static str {
        match self {
            World::Store => "store",
            World::Processor => "processor",
        }
    }

    fn export(self) -> &'static str {
        match self {
            World::Store => "state-store",
            World::Processor => "record-processor",
        }
    }

    fn import(self) -> &'static str {
        match self {
            World::Store => "storage",
            World::Processor => "state",
        }
    }

    /// The versions of this world the host links, oldest first.
    fn versions(self) -> &'static [&'static str] {
        WIT_VERSIONS
    }
}

/// Checks that the component exports our `world`'s interface at a version
/// the host links, all of it at that one version, and imports nothing but
/// that world's import and WASI. Returns (exports, imports, version).
fn check_world(
    label: &str,
    engine: &Engine,
    component: &Component,
    world: World,
) -> Result<(Vec<String>, Vec<String>, &'static str)> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let ours = |name: &str| -> Option<(String, String)> {
        let rest = name.strip_prefix(&format!("{WIT_PACKAGE}/"))?;
        let (iface, version) = rest.split_once('@')?;
        Some((iface.to_string(), version.to_string()))
    };
    let what = match world {
        World::Store => "guest",
        World::Processor => "processor",
    };
    // The kind first (a store named as a processor is told so, whatever
    // its version), then the version.
    if !exports
        .iter()
        .any(|n| ours(n).is_some_and(|(i, _)| i == world.export()))
    {
        bail!(
            "{what} {label} does not export {WIT_PACKAGE}/{}@{} (it exports: {});{}",
            world.export(),
            world.versions()[world.versions().len() - 1],
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            },
            other_world_hint(world, &exports, &ours)
        );
    }
    let version = built_against(label, what, world, exports.iter().chain(&imports), &ours)?;
    let provided = format!("{WIT_PACKAGE}/{}@{version} and WASI 0.2", world.import());
    for name in &imports {
        let allowed = match ours(name) {
            Some((iface, _)) => iface == world.import() || iface == "types",
            None => name.starts_with("wasi:"),
        };
        if !allowed {
            bail!("{what} {label} imports `{name}`, which this host does not provide to a {} component; it links only {provided}", world.name());
        }
    }
    Ok((exports, imports, version))
}

/// What to do about a component that does not export `world`'s interface:
/// name it where its own world belongs, or build it against `world`.
fn other_world_hint(
    world: World,
    exports: &[String],
    ours: &dyn Fn(&str) -> Option<(String, String)>,
) -> String {
    let other = match world {
        World::Store => World::Processor,
        World::Processor => World::Store,
    };
    if exports
        .iter()
        .any(|n| ours(n).is_some_and(|(i, _)| i == other.export()))
    {
        format!(
            " it is a {} component: name it in {}",
            other.name(),
            match other {
                World::Store => "store.guest",
                World::Processor => "task.processor",
            }
        )
    } else {
        format!(" build it against the `{}` world of wit/", world.name())
    }
}

/// The one version of `world` that every name of our package in `names`
/// has; refused when one is a version the host does not link, or when
/// they mix two.
fn built_against<'a>(
    label: &str,
    what: &str,
    world: World,
    names: impl Iterator<Item = &'a String>,
    ours: &dyn Fn(&str) -> Option<(String, String)>,
) -> Result<&'static str> {
    let versions = world.versions();
    let mut found: Option<&'static str> = None;
    for name in names {
        let Some((_, version)) = ours(name) else {
            continue;
        };
        let Some(known) = versions.iter().copied().find(|v| *v == version) else {
            let want = versions
                .iter()
                .map(|v| format!("{WIT_PACKAGE}@{v}"))
                .collect::<Vec<_>>()
                .join(" and ");
            bail!(
                "{what} {label} was built against {WIT_PACKAGE}@{version}, but this host provides {want} \
                 for a {} component",
                world.name()
            );
        };
        match found {
            Some(v) if v != known => bail!(
                "{what} {label} mixes {WIT_PACKAGE}@{v} and @{known}: build it against one version"
            ),
            _ => found = Some(known),
        }
    }
    Ok(found.unwrap_or(versions[versions.len() - 1]))
}

impl GuestComponent {
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

#[cfg(test)]
mod tests {
    use super::prune_cache;
    use std::time::{Duration, SystemTime};

    /// Oldest first, until the rest fits; the entry just written stays even
    /// when it alone is over the limit; other files are not touched.
    #[test]
    fn prune_removes_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = SystemTime::now() - Duration::from_secs(1000);
        let mut paths = Vec::new();
        for (i, name) in ["old.cwasm", "mid.cwasm", "new.cwasm", "notes.txt"]
            .iter()
            .enumerate()
        {
            let p = dir.path().join(name);
            std::fs::write(&p, vec![0u8; 100]).unwrap();
            let f = std::fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(t0 + Duration::from_secs(i as u64 * 10))
                .unwrap();
            paths.push(p);
        }
        prune_cache(dir.path(), 250, &paths[2]);
        let left: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(left, [false, true, true, true]);
        prune_cache(dir.path(), 50, &paths[2]);
        let left: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(left, [false, false, true, true]);
    }
}
