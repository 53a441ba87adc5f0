//! Moving a store to another strategy (`txstore migrate`).
//!
//! Strategies lay out their keyspaces differently, so a store cannot simply
//! be opened by another guest (the manifest refuses it). Migration goes
//! through the committed state: the old guest recovers the store as a run
//! would, its read-committed entries are copied into a new store built by
//! the new guest in `migrate-new/` and committed there at the same
//! changelog offset, both sides are read back and compared, and the new
//! store is then switched in. The changelog and the checkpoint are kept:
//! the new store holds exactly the state at the offset they name.
//!
//! Crash safety rests on one atomic rename, `migrate-new/` to
//! `migrate-ready/` (the commit point, made durable by an fsync of the state
//! directory):
//! - before it, the old store is untouched; the next open of the state
//!   directory (a run, or migrate again) removes `migrate-new/`;
//! - after it, the migration is decided; the next open finishes the switch,
//!   each step idempotent: `store/` to `migrate-old/`, `migrate-ready/store`
//!   to `store/`, the new manifest into place, then the leftovers removed.
//!
//! Every directory operation goes through [`crate::file`], so a power
//! simulation sees them (a rename undone by the cut takes the directory's
//! contents, RocksDB's files included, back with it) and each step is
//! swept with power cuts as well as aborts.

use super::{manifest, Task};
use crate::changelog::Record;
use crate::config::{BackendKind, Config};
use crate::crash;
use crate::runtime::{Isolation, Runtime, StoreInstance};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

/// The new store while it is being built (discarded by a crash).
const NEW: &str = "migrate-new";
/// The new store once complete: its existence is the commit point.
const READY: &str = "migrate-ready";
/// The old store, between the switch and its removal.
const OLD: &str = "migrate-old";

/// Entries per read page and per write call.
const PAGE: u32 = 1024;
/// The new store commits at least this often, so that a guest which holds
/// its open transaction in memory (buffered) never holds the whole store.
const COMMIT_EVERY_BYTES: u64 = 16 << 20;

/// What a migration did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MigrateReport {
    pub store: String,
    pub from: String,
    pub to: String,
    /// The changelog offset both stores are committed at.
    pub offset: u64,
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
    /// SHA-256 over the committed entries (length-prefixed key and value,
    /// in key order), equal on both sides.
    pub sha256: String,
    /// Seconds, in JSON.
    #[serde(rename = "seconds", serialize_with = "super::recovery::as_seconds")]
    pub elapsed: Duration,
}

/// Finishes or undoes a migration a crash interrupted, under the state
/// directory's lock, before anything opens the store. Returns true when it
/// finished one (the store now belongs to the new guest).
pub fn settle(state_dir: &Path) -> Result<bool> {
    let new = state_dir.join(NEW);
    if new.exists() {
        // Never committed: the old store is the store.
        remove_dir(&new)?;
        crate::file::sync_dir(state_dir)?;
    }
    let ready = state_dir.join(READY);
    if !ready.exists() {
        return Ok(false);
    }
    let store = state_dir.join("store");
    let old = state_dir.join(OLD);
    if ready.join("store").exists() {
        if store.exists() {
            if old.exists() {
                remove_dir(&old)?;
            }
            crate::file::rename(&store, &old)?;
            crate::file::sync_dir(state_dir)?;
            crash::step("migrate-old-moved");
        }
        crate::file::rename(&ready.join("store"), &store)?;
        crate::file::sync_dir(state_dir)?;
        crash::step("migrate-new-moved");
    }
    let manifest = ready.join(manifest::FILE);
    if manifest.exists() {
        crate::file::rename(&manifest, &manifest::path(state_dir))?;
        crate::file::sync_dir(state_dir)?;
    }
    if old.exists() {
        remove_dir(&old)?;
    }
    remove_dir(&ready)?;
    crate::file::sync_dir(state_dir)?;
    Ok(true)
}

/// Through the file layer, so a power simulation sees the removal.
fn remove_dir(dir: &Path) -> Result<()> {
    crate::file::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))
}

/// Whether the store in `state_dir` is kept by `to` already: a migration
/// a crash interrupted after its commit point is finished here first (a
/// power simulation's journal attached before, so that it sees the
/// settling). Refuses a directory without a store.
fn settled_to(state_dir: &Path, to: &str) -> Result<bool> {
    let no_store = || {
        anyhow::anyhow!(
            "no store in {} to migrate (store.state_dir of the config)",
            state_dir.display()
        )
    };
    if !state_dir.is_dir() {
        return Err(no_store());
    }
    crate::file::attach(state_dir);
    {
        let _lock = crate::file::lock_dir(state_dir, "state directory")?;
        settle(state_dir)?;
        if manifest::read(state_dir)?.is_some_and(|m| m.guest == to) {
            return Ok(true);
        }
    }
    if !state_dir.join("store").exists() {
        return Err(no_store());
    }
    Ok(false)
}

/// Moves the store `config` names to guest `to` (a built-in name or a
/// `.wasm` path, relative to the current directory), whose `init` gets
/// `options`. `None`: the store already belonged to `to` (a migration
/// interrupted after its commit point, now finished).
pub fn migrate(
    config: &Config,
    runtime: &Runtime,
    to: &str,
    options: &[(String, String)],
) -> Result<Option<MigrateReport>> {
    let started = Instant::now();
    let state_dir = config.state_dir();
    if config.store.backend != BackendKind::Rocksdb {
        bail!("txstore migrate moves a store on disk: store.backend must be rocksdb");
    }
    let to_source = crate::runtime::GuestSource::parse(to);
    let target = runtime.load(&to_source)?;
    let from_name = manifest::strategy(&config.store.guest);
    let to_name = manifest::strategy(to);
    if from_name == to_name {
        bail!(
            "store `{}` in {} is already kept by `{from_name}`",
            config.store.name,
            state_dir.display()
        );
    }

    if settled_to(&state_dir, &to_name)? {
        return Ok(None);
    }

    // The old guest recovers the store exactly as a run would (replaying
    // the changelog's committed tail), so what is copied is the committed
    // state at the changelog's end.
    let (mut old, _) = Task::open(config, runtime)?;
    let offset = old.changelog.end_offset();

    let new_dir = state_dir.join(NEW);
    let (entries, bytes, sha256) = match build(config, &target, options, &mut old, offset, &to_name)
    {
        Ok(built) => built,
        Err(e) => {
            // The old store stays the store: drop the partial new one and
            // close the old cleanly (its checkpoint spares the next start a
            // replay), then report what failed.
            let _ = remove_dir(&new_dir);
            let _ = old.close();
            return Err(e);
        }
    };

    // A clean close of the old store (checkpoint at `offset`, which the new
    // store is committed at too), keeping the directory locked so no run
    // commits past `offset` before the switch.
    let (_, lock) = old.close_keeping_lock()?;
    crate::file::rename(&new_dir, &state_dir.join(READY))?;
    crate::file::sync_dir(&state_dir)?;
    crash::step("migrate-committed");
    settle(&state_dir)?;
    drop(lock);
    Ok(Some(MigrateReport {
        store: config.store.name.clone(),
        from: from_name,
        to: to_name,
        offset,
        entries,
        bytes,
        sha256,
        elapsed: started.elapsed(),
    }))
}

/// Builds the new store in `migrate-new/` from `old`'s committed state at
/// `offset`, checks it and writes its manifest. Returns the entries, bytes
/// and digest copied.
fn build(
    config: &Config,
    target: &crate::runtime::GuestComponent,
    options: &[(String, String)],
    old: &mut Task,
    offset: u64,
    to_name: &str,
) -> Result<(u64, u64, String)> {
    let state_dir = config.state_dir();
    let new_dir = state_dir.join(NEW);
    if new_dir.exists() {
        remove_dir(&new_dir)?;
    }
    crate::file::create_dir_all(&new_dir)
        .with_context(|| format!("cannot create {}", new_dir.display()))?;
    let digest_of_copy = {
        let backend = super::open_backend_at(config.store.backend, &new_dir.join("store"))?;
        let storage = backend.open_store(&config.store.name)?;
        let mut new = target.instantiate(storage, &config.store.name, &config.limits)?;
        new.init(options)?;
        let label = new.label().to_string();
        let recovery = new.recover(None)?;
        if recovery.offset.is_some() {
            bail!("guest {label} found a committed offset in a store it has just created");
        }
        let (entries, bytes, sha256) = copy(&mut old.instance, &mut new, offset)?;
        crash::step("migrate-copied");
        let (check_entries, check_bytes, check_sha) = digest(&mut new)?;
        if (check_entries, check_bytes, &check_sha) != (entries, bytes, &sha256) {
            bail!(
                "the store built by {label} reads back {check_entries} entries ({check_bytes} bytes, sha256 \
                 {}..), not the {entries} entries ({bytes} bytes, sha256 {}..) copied: the new guest lost or \
                 changed data; the old store is kept",
                &check_sha[..12],
                &sha256[..12]
            );
        }
        if offset > 0 && new.committed_offset()? != Some(offset) {
            bail!("guest {label} does not report the committed offset {offset} after its commit");
        }
        (entries, bytes, sha256)
    };
    // The new store's storage is closed (and synced by its commits); make
    // its directory entries durable before the commit point.
    // RocksDB fsyncs its own files and `db/`; `store/` was made by us.
    crate::file::sync_dir(&new_dir.join("store"))?;
    crate::file::sync_dir(&new_dir)?;
    let mut m = manifest::expected(config, &target.load.hash, target.version);
    m.guest = to_name.to_string();
    manifest::write_to(&new_dir.join(manifest::FILE), &m)?;
    crash::step("migrate-built");
    Ok(digest_of_copy)
}

/// Copies every read-committed entry of `from` into `to`, committing `to`
/// at `offset` every [`COMMIT_EVERY_BYTES`] and at the end. Returns the
/// entries, bytes and digest of what was read.
fn copy(
    from: &mut StoreInstance,
    to: &mut StoreInstance,
    offset: u64,
) -> Result<(u64, u64, String)> {
    let mut sum = Digester::default();
    let mut open_bytes = 0u64;
    for_each_page(from, |page| {
        let writes: Vec<Record> = page
            .into_iter()
            .map(|(k, v)| {
                sum.add(&k, &v);
                open_bytes += (k.len() + v.len()) as u64;
                Record::Put(k, v)
            })
            .collect();
        // A guest at its uncommitted limit commits what it holds and
        // takes the rest: every offset claimed is `offset`, and until the
        // commit point nothing of the new store counts.
        super::apply::apply_with_early_commit(to, &writes, offset)?;
        if open_bytes >= COMMIT_EVERY_BYTES {
            to.commit(offset)?;
            open_bytes = 0;
        }
        Ok(())
    })?;
    if offset > 0 || sum.entries > 0 {
        to.commit(offset)?;
    }
    Ok(sum.finish())
}

/// Entries, bytes and digest of `store`'s read-committed state.
fn digest(store: &mut StoreInstance) -> Result<(u64, u64, String)> {
    let mut sum = Digester::default();
    for_each_page(store, |page| {
        for (k, v) in &page {
            sum.add(k, v);
        }
        Ok(())
    })?;
    Ok(sum.finish())
}

/// Hands `store`'s read-committed entries to `f`, a page of [`PAGE`] at a
/// time, in key order (one page in memory, whatever the store's size).
fn for_each_page(
    store: &mut StoreInstance,
    mut f: impl FnMut(Vec<(Vec<u8>, Vec<u8>)>) -> Result<()>,
) -> Result<()> {
    let mut next: Option<Vec<u8>> = None;
    loop {
        let page = store.range(next.as_deref(), None, Isolation::ReadCommitted, PAGE)?;
        let full = page.len() == PAGE as usize;
        if let Some((k, _)) = page.last() {
            next = Some(successor(k));
        }
        f(page)?;
        if !full {
            return Ok(());
        }
    }
}

/// The smallest key after `k`.
fn successor(k: &[u8]) -> Vec<u8> {
    let mut s = k.to_vec();
    s.push(0);
    s
}

#[derive(Default)]
struct Digester {
    hash: Sha256,
    entries: u64,
    bytes: u64,
}

impl Digester {
    fn add(&mut self, k: &[u8], v: &[u8]) {
        // Length prefixes: ("ab", "c") and ("a", "bc") differ.
        self.hash.update((k.len() as u64).to_be_bytes());
        self.hash.update(k);
        self.hash.update((v.len() as u64).to_be_bytes());
        self.hash.update(v);
        self.entries += 1;
        self.bytes += (k.len() + v.len()) as u64;
    }

    fn finish(self) -> (u64, u64, String) {
        let hex: String = self
            .hash
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (self.entries, self.bytes, hex)
    }
}
