//! A simulated machine crash for the host's own files, in the spirit of
//! RocksDB's FaultInjectionTestFS and of ALICE/CrashMonkey.
//!
//! In test mode the file layer keeps a journal beside the state directory
//! (`{state}.power/`) of what fsync made durable: per file, its content at
//! its last fsync (a shadow copy); per directory, its entries at its last
//! fsync; and whether the state directory's own entry in its parent is
//! durable. The journal lives in files, so it spans processes: a process
//! that aborted (page cache kept) leaves unsynced bytes that the next
//! process may read, and a later power loss still drops them unless
//! someone fsynced them in between.
//!
//! [`power_loss`] rolls the state back to the journal: every directory to
//! its durable entries (unsynced creates, renames and removes undone), and
//! every file to its durable content. With a seed, it also chooses what
//! the hardware may have kept besides: the file's new length or its old
//! one, and for each 4 KiB page written since the fsync its new content or
//! its old one (the durable bytes, zeros past them): a torn, reordered
//! write. Bytes an fsync covered are never lost. Directory
//! operations are always undone (no seed keeps an unsynced rename).
//!
//! What is assumed: the disk honours fsync; a page is written whole or
//! not at all (sector tearing inside a page is not modelled); RocksDB's
//! files (`{state}/store`) are RocksDB's business, and storage power loss
//! is simulated by [`crate::storage::power`] instead. A changelog placed
//! outside the state directory is not covered.
//!
//! Test mode starts when a power crash is armed or when
//! `TXSTORE_POWER_SIM=1` is set, and then continues in every process that
//! finds the journal. Nothing here runs otherwise.

use crate::conformance::workload::Rng;
use crate::crash::PowerReport;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Environment variable that starts a journal without arming a crash.
pub const ENV: &str = "TXSTORE_POWER_SIM";
/// The page size of the torn-write model.
pub const PAGE: usize = 4096;
/// Subdirectories of the state directory that the layer does not own.
const EXCLUDED: &[&str] = &["store"];

/// What the layer knows is durable. Paths are relative to the root, `/`
/// separated; the root directory itself is "".
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct State {
    next_id: u64,
    /// The root's entry in its parent survived an fsync of the parent.
    root_durable: bool,
    /// Files as they are now: path -> file id (stable across renames).
    live: BTreeMap<String, u64>,
    /// Durable entries per directory: name -> file id, or None for a directory.
    durable: BTreeMap<String, BTreeMap<String, Option<u64>>>,
    /// Files whose durable content is a shadow copy (others: empty).
    shadows: BTreeSet<u64>,
}

struct Journal {
    root: PathBuf,
    dir: PathBuf,
    state: State,
}

static JOURNAL: Mutex<Option<Journal>> = Mutex::new(None);

/// The journal directory of state directory `root`.
pub fn journal_dir(root: &Path) -> PathBuf {
    let mut name = root.file_name().unwrap_or_default().to_os_string();
    name.push(".power");
    root.with_file_name(name)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Starts tracking the state directory `root` if this is a power
/// simulation (see the module documentation); otherwise does nothing.
pub fn attach(root: &Path) {
    let root = absolute(root);
    let dir = journal_dir(&root);
    let wanted = crate::crash::power_armed() || std::env::var(ENV).is_ok_and(|v| v == "1");
    if !dir.exists() && !wanted {
        return;
    }
    let mut guard = JOURNAL.lock().unwrap_or_else(|e| e.into_inner());
    if guard.as_ref().is_some_and(|j| j.root == root) {
        return;
    }
    let state = match std::fs::read(dir.join("journal.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes).expect("power journal is readable"),
        Err(_) => {
            std::fs::create_dir_all(&dir).expect("cannot create the power journal");
            baseline(&root, &dir)
        }
    };
    let j = Journal { root, dir, state };
    j.save();
    *guard = Some(j);
}

/// Everything on disk now counts as durable.
fn baseline(root: &Path, journal: &Path) -> State {
    let mut state = State {
        root_durable: root.exists(),
        ..State::default()
    };
    if state.root_durable {
        walk_baseline(root, "", journal, &mut state);
    }
    state
}

fn walk_baseline(root: &Path, rel: &str, journal: &Path, state: &mut State) {
    let mut entries = BTreeMap::new();
    let Ok(list) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for entry in list.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let child = join(rel, &name);
        if excluded(&child) {
            entries.insert(name, None);
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            entries.insert(name, None);
            walk_baseline(root, &child, journal, state);
        } else {
            let id = state.next_id;
            state.next_id += 1;
            let content = std::fs::read(entry.path()).unwrap_or_default();
            std::fs::write(journal.join(format!("shadow-{id}")), content).expect("shadow write");
            state.shadows.insert(id);
            state.live.insert(child, id);
            entries.insert(name, Some(id));
        }
    }
    state.durable.insert(rel.to_string(), entries);
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

fn excluded(rel: &str) -> bool {
    EXCLUDED
        .iter()
        .any(|e| rel == *e || rel.starts_with(&format!("{e}/")))
}

impl Journal {
    fn save(&self) {
        let bytes = serde_json::to_vec(&self.state).expect("journal serializes");
        let tmp = self.dir.join("journal.json.tmp");
        std::fs::write(&tmp, bytes).expect("power journal write");
        std::fs::rename(&tmp, self.dir.join("journal.json")).expect("power journal rename");
    }

    /// `path` relative to the root, if the layer owns it.
    fn rel(&self, path: &Path) -> Option<String> {
        let rel = absolute(path)
            .strip_prefix(&self.root)
            .ok()?
            .to_string_lossy()
            .to_string();
        (!excluded(&rel)).then_some(rel)
    }

    fn shadow(&self, id: u64) -> PathBuf {
        self.dir.join(format!("shadow-{id}"))
    }

    fn durable_content(&self, id: u64) -> Vec<u8> {
        if self.state.shadows.contains(&id) {
            std::fs::read(self.shadow(id)).expect("shadow read")
        } else {
            Vec::new()
        }
    }

    fn new_id(&mut self) -> u64 {
        let id = self.state.next_id;
        self.state.next_id += 1;
        id
    }
}

fn with_journal(f: impl FnOnce(&mut Journal)) {
    let mut guard = JOURNAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(j) = guard.as_mut() {
        f(j);
        j.save();
    }
}

pub(super) fn on_create(path: &Path, existed: bool) {
    with_journal(|j| {
        if let Some(rel) = j.rel(path) {
            if !existed || !j.state.live.contains_key(&rel) {
                let id = j.new_id();
                j.state.live.insert(rel, id);
            }
        }
    });
}

pub(super) fn on_rename(from: &Path, to: &Path) {
    with_journal(|j| {
        if let (Some(a), Some(b)) = (j.rel(from), j.rel(to)) {
            if let Some(id) = j.state.live.remove(&a) {
                j.state.live.insert(b, id);
            }
        }
    });
}

pub(super) fn on_remove(path: &Path) {
    with_journal(|j| {
        if let Some(rel) = j.rel(path) {
            j.state.live.remove(&rel);
        }
    });
}

pub(super) fn on_sync(path: &Path) {
    with_journal(|j| {
        let Some(rel) = j.rel(path) else { return };
        let Some(&id) = j.state.live.get(&rel) else {
            return;
        };
        let content = std::fs::read(path).expect("read of a synced file");
        std::fs::write(j.shadow(id), content).expect("shadow write");
        j.state.shadows.insert(id);
    });
}

/// After a failed fsync the kernel may drop the file's dirty pages: what
/// a later read sees is the durable content.
pub(super) fn on_failed_sync(path: &Path) {
    with_journal(|j| {
        let Some(rel) = j.rel(path) else { return };
        let Some(&id) = j.state.live.get(&rel) else {
            return;
        };
        let old = j.durable_content(id);
        std::fs::write(path, old).expect("revert after a failed fsync");
    });
}

pub(super) fn on_sync_dir(dir: &Path) {
    with_journal(|j| {
        let abs = absolute(dir);
        if Some(abs.as_path()) == j.root.parent() {
            j.state.root_durable = j.root.exists();
            return;
        }
        let Some(rel) = j.rel(&abs) else { return };
        let mut entries = BTreeMap::new();
        for entry in std::fs::read_dir(&abs).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let child = join(&rel, &name);
            if entry.file_type().is_ok_and(|t| t.is_dir()) || excluded(&child) {
                entries.insert(name, None);
            } else {
                let id = match j.state.live.get(&child) {
                    Some(&id) => id,
                    None => {
                        // Written behind the layer's back: take it as it is.
                        let id = j.new_id();
                        j.state.live.insert(child, id);
                        id
                    }
                };
                entries.insert(name, Some(id));
            }
        }
        j.state.durable.insert(rel, entries);
    });
}

/// What a file becomes after the power cut: its durable content, or with
/// a seed, a mix of durable and current pages. Returns the content and the
/// number of choices the seed had.
fn torn(durable: &[u8], current: Option<&[u8]>, rng: Option<&mut Rng>) -> (Vec<u8>, u64) {
    let (Some(current), Some(rng)) = (current, rng) else {
        return (durable.to_vec(), 0);
    };
    let mut choices = 0;
    let len = if durable.len() != current.len() {
        choices += 1;
        if rng.chance(50) {
            current.len()
        } else {
            durable.len()
        }
    } else {
        durable.len()
    };
    let mut out = vec![0u8; len];
    for start in (0..len).step_by(PAGE) {
        let end = (start + PAGE).min(len);
        let old = durable.get(start..end.min(durable.len())).unwrap_or(&[]);
        let new = current.get(start..end.min(current.len())).unwrap_or(&[]);
        let page = &mut out[start..end];
        if old == new && old.len() == page.len() {
            page.copy_from_slice(old);
            continue;
        }
        choices += 1;
        // New content, or old: the durable bytes, zeros past them. Never
        // zeros over durable bytes: what an fsync covered stays.
        let pick = if rng.chance(50) { new } else { old };
        page[..pick.len()].copy_from_slice(pick);
    }
    (out, choices)
}

/// Rolls the tracked state back as a power cut would (see the module
/// documentation) and starts a fresh journal from the result. Does nothing
/// outside a power simulation.
pub fn power_loss(seed: Option<u64>) -> PowerReport {
    let mut guard = JOURNAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(j) = guard.as_mut() else {
        return PowerReport {
            summary: "files: not simulated".into(),
            choices: 0,
        };
    };
    let mut rng = seed.map(Rng::new);
    let root = j.root.clone();
    if !j.state.root_durable {
        let _ = std::fs::remove_dir_all(&root);
        j.state = baseline(&root, &j.dir);
        j.save();
        return PowerReport {
            summary: format!(
                "files: {} was never made durable in its parent, lost whole",
                root.display()
            ),
            choices: 0,
        };
    }
    // Current content by file id, before anything is rewritten.
    let mut current: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (rel, id) in &j.state.live {
        if let Ok(bytes) = std::fs::read(root.join(rel)) {
            current.insert(*id, bytes);
        }
    }
    // The tree a power cut leaves: durable entries, each file torn or not.
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut dirs: BTreeSet<String> = BTreeSet::from([String::new()]);
    let mut choices = 0u64;
    let mut pending = vec![String::new()];
    while let Some(dir) = pending.pop() {
        let Some(entries) = j.state.durable.get(&dir) else {
            continue;
        };
        for (name, entry) in entries {
            let rel = join(&dir, name);
            if excluded(&rel) {
                continue;
            }
            match entry {
                None => {
                    dirs.insert(rel.clone());
                    pending.push(rel);
                }
                Some(id) => {
                    let (content, c) = torn(
                        &j.durable_content(*id),
                        current.get(id).map(Vec::as_slice),
                        rng.as_mut(),
                    );
                    choices += c;
                    files.insert(rel, content);
                }
            }
        }
    }
    // Apply: remove what is not durable, write what is.
    let mut removed = 0;
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let rel = join(&dir, &entry.file_name().to_string_lossy());
            if excluded(&rel) {
                continue;
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if dirs.contains(&rel) {
                    stack.push(rel);
                } else {
                    std::fs::remove_dir_all(entry.path()).expect("power loss: remove a directory");
                    removed += 1;
                }
            } else if !files.contains_key(&rel) {
                std::fs::remove_file(entry.path()).expect("power loss: remove a file");
                removed += 1;
            }
        }
    }
    for dir in &dirs {
        std::fs::create_dir_all(root.join(dir)).expect("power loss: create a directory");
    }
    let mut changed = 0;
    for (rel, content) in &files {
        let path = root.join(rel);
        if std::fs::read(&path).ok().as_deref() != Some(content.as_slice()) {
            changed += 1;
        }
        std::fs::write(&path, content).expect("power loss: write a file");
    }
    j.state = baseline(&root, &j.dir);
    j.save();
    PowerReport {
        summary: format!("files: {changed} rolled back, {removed} unsynced entries undone"),
        choices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_pages_come_from_old_new_or_zeros() {
        let old = vec![1u8; PAGE * 2];
        let mut new = old.clone();
        new.extend(vec![2u8; PAGE * 2]);
        new[10] = 3;
        for seed in 0..32 {
            let (out, choices) = torn(&old, Some(&new), Some(&mut Rng::new(seed)));
            // The length, page 0, and pages 2 and 3 when the new length is kept.
            let want = if out.len() == new.len() { 4 } else { 2 };
            assert_eq!(choices, want, "seed {seed}");
            assert!(out.len() == old.len() || out.len() == new.len());
            for (i, page) in out.chunks(PAGE).enumerate() {
                let o = old.get(i * PAGE..(i + 1) * PAGE);
                let n = &new[i * PAGE..(i + 1) * PAGE];
                assert!(
                    Some(page) == o || page == n || page.iter().all(|b| *b == 0),
                    "seed {seed} page {i} is neither old, new nor zeros"
                );
            }
        }
        assert_eq!(
            torn(&old, Some(&new), None).0,
            old,
            "no seed: durable content"
        );
    }
}
