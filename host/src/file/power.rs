//! A simulated machine crash for the host's own files, in the spirit of
//! RocksDB's FaultInjectionTestFS and of ALICE/CrashMonkey.
//!
//! In test mode the file layer keeps a journal beside the state directory
//! (`{state}.power/`) of what fsync made durable. Files and directories
//! are nodes with an id that a rename keeps. Per file: its content at its
//! last fsync (a shadow copy). Per directory: its entries (name -> node)
//! at its last fsync. And whether the state directory's own entry in its
//! parent is durable. The journal lives in files, so it spans processes:
//! a process that aborted (page cache kept) leaves unsynced bytes that the
//! next process may read, and a later power loss still drops them unless
//! someone fsynced them in between.
//!
//! A rename, of a file or of a directory, is one operation: durable once
//! either directory it touches is fsynced (both its sides then are, as a
//! journaling file system commits them together); until then it is
//! pending. A directory's contents belong to its node, not to its name: a
//! directory renamed into place and made durable keeps what is durable in
//! it, and one whose rename is undone goes back with all of it.
//!
//! `power_loss` rolls the state back to the journal: the tree the
//! durable entries describe (unsynced creates, renames and removes
//! undone, directories moved back with their contents), every file with
//! its durable content. With a seed, it also chooses what the hardware may
//! have kept besides: a prefix of the pending renames (in order, each
//! whole: the new name may or may not exist), each file's new length or
//! its old one, and for each 4 KiB page written since the fsync its new
//! content or its old one (the durable bytes, zeros past them): a torn,
//! reordered write. Bytes an fsync covered are never lost.
//!
//! What is assumed: the disk honours fsync; a page is written whole or not
//! at all (sector tearing inside a page is not modelled). RocksDB's files
//! are RocksDB's business, as [`crate::storage::power`] assumes: in a
//! store's directory (`store/`, a migration's `migrate-*/store/` and the
//! old store moved aside, `migrate-old/`) the database (`db/`) and anything
//! else the layer did not create (the files RocksDB exports into a
//! snapshot) are kept as they are, wherever the directory holding them
//! ends up; what the host writes there (snapshot directories, their
//! index, the restore marker) is simulated like any host file. Storage
//! power loss is simulated by [`crate::storage::power`]. A changelog
//! placed outside the state directory is not covered.
//!
//! Test mode starts when a power crash is armed or when
//! `TXSTORE_POWER_SIM=1` is set, and then continues in every process that
//! finds the journal. Nothing here runs otherwise.

mod loss;

#[cfg(test)]
use loss::power_loss;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Environment variable that starts a journal without arming a crash.
pub const ENV: &str = "TXSTORE_POWER_SIM";
/// The page size of the torn-write model.
pub const PAGE: usize = 4096;

/// A file or directory, by an id that renames keep.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
enum Node {
    File(u64),
    Dir(u64),
}

/// A rename no fsync has made durable yet: `node` moved from entry
/// `from` of directory `from_dir` to entry `to` of directory `to_dir`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Rename {
    node: Node,
    from_dir: u64,
    from: String,
    to_dir: u64,
    to: String,
}

/// Durable entries of each directory, by directory id.
type Durable = BTreeMap<u64, BTreeMap<String, Node>>;

/// What the layer knows is durable. Paths are relative to the root, `/`
/// separated; the root directory itself is "".
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct State {
    next_id: u64,
    /// The root's entry in its parent survived an fsync of the parent.
    root_durable: bool,
    /// The root directory's id.
    root: u64,
    /// Tracked nodes as they are now: path -> node.
    live: BTreeMap<String, Node>,
    /// Durable entries per directory (at its last fsync).
    durable: Durable,
    /// Files whose durable content is a shadow copy (others: empty).
    shadows: BTreeSet<u64>,
    /// Renames not yet durable, oldest first.
    pending: Vec<Rename>,
}

impl State {
    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The id of the tracked directory at `rel`.
    fn dir_id(&self, rel: &str) -> Option<u64> {
        match self.live.get(rel) {
            Some(Node::Dir(id)) => Some(*id),
            _ => None,
        }
    }
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
    start(root, dir);
}

/// Tracks `root` with the journal in `dir` (read, or started from what is
/// on disk now).
fn start(root: PathBuf, dir: PathBuf) {
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
    crate::crash::on_power_crash_last(Box::new(loss::power_loss));
}

/// A directory that holds a RocksDB database (`db`) beside the host's
/// snapshot areas: the store's, a migration's new one, the old one moved
/// aside.
fn store_dir(rel: &str) -> bool {
    rel == "store"
        || rel == "migrate-old"
        || rel
            .split_once('/')
            .is_some_and(|(m, s)| m.starts_with("migrate-") && s == "store")
}

/// Inside a store's directory (not the directory itself).
fn in_store(rel: &str) -> bool {
    let mut p = rel;
    while let Some((parent, _)) = p.rsplit_once('/') {
        if store_dir(parent) {
            return true;
        }
        p = parent;
    }
    false
}

/// A RocksDB database: `db` in a store's directory.
fn database(rel: &str) -> bool {
    match rel.rsplit_once('/') {
        Some((parent, name)) => name == "db" && store_dir(parent),
        None => false,
    }
}

/// Everything on disk now counts as durable (RocksDB's databases aside).
fn baseline(root: &Path, journal: &Path) -> State {
    let mut state = State {
        root_durable: root.exists(),
        ..State::default()
    };
    state.root = state.new_id();
    state.live.insert(String::new(), Node::Dir(state.root));
    if state.root_durable {
        let id = state.root;
        walk_baseline(root, "", id, journal, &mut state);
    }
    state
}

fn walk_baseline(root: &Path, rel: &str, id: u64, journal: &Path, state: &mut State) {
    let mut entries = BTreeMap::new();
    let Ok(list) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for entry in list.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let child = join(rel, &name);
        if database(&child) {
            continue;
        }
        let node = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let d = state.new_id();
            walk_baseline(root, &child, d, journal, state);
            Node::Dir(d)
        } else {
            let f = state.new_id();
            let content = std::fs::read(entry.path()).unwrap_or_default();
            std::fs::write(journal.join(format!("shadow-{f}")), content).expect("shadow write");
            state.shadows.insert(f);
            Node::File(f)
        };
        state.live.insert(child, node);
        entries.insert(name, node);
    }
    state.durable.insert(id, entries);
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

/// The parent directory and name of `rel` (not the root).
fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// Whether `path` is `prefix` or inside it.
fn within(path: &str, prefix: &str) -> bool {
    path == prefix
        || prefix.is_empty()
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// Applies the side of `r` in directory `dir` to `durable`: `r.from`
/// leaves it, `r.to` enters it.
fn apply_side(durable: &mut Durable, r: &Rename, dir: u64) {
    if r.from_dir == dir {
        if let Some(entries) = durable.get_mut(&dir) {
            if entries.get(&r.from) == Some(&r.node) {
                entries.remove(&r.from);
            }
        }
    }
    if r.to_dir == dir {
        durable.entry(dir).or_default().insert(r.to.clone(), r.node);
    }
}

/// Applies the whole of `r` to `durable`.
fn apply_rename(durable: &mut Durable, r: &Rename) {
    apply_side(durable, r, r.from_dir);
    if r.to_dir != r.from_dir {
        apply_side(durable, r, r.to_dir);
    }
}

impl Journal {
    fn save(&self) {
        let bytes = serde_json::to_vec(&self.state).expect("journal serializes");
        let tmp = self.dir.join("journal.json.tmp");
        std::fs::write(&tmp, bytes).expect("power journal write");
        std::fs::rename(&tmp, self.dir.join("journal.json")).expect("power journal rename");
    }

    /// `path` relative to the root, if it is in it.
    fn rel(&self, path: &Path) -> Option<String> {
        Some(
            absolute(path)
                .strip_prefix(&self.root)
                .ok()?
                .to_string_lossy()
                .to_string(),
        )
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

    /// Forgets the tracked nodes at `rel` and inside it.
    fn forget(&mut self, rel: &str) {
        self.state.live.retain(|p, _| !within(p, rel));
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
                let id = j.state.new_id();
                j.state.live.insert(rel, Node::File(id));
            }
        }
    });
}

/// A directory the layer created (durable once its parent is fsynced).
pub(super) fn on_create_dir(path: &Path) {
    with_journal(|j| {
        // The root is tracked from the start.
        if let Some(rel) = j.rel(path).filter(|r| !r.is_empty()) {
            // A new directory: nothing tracked at its path before is in it.
            j.forget(&rel);
            let id = j.state.new_id();
            j.state.live.insert(rel, Node::Dir(id));
        }
    });
}

pub(super) fn on_rename(from: &Path, to: &Path) {
    with_journal(|j| {
        let (Some(a), Some(b)) = (j.rel(from), j.rel(to)) else {
            return;
        };
        if a == b || a.is_empty() || b.is_empty() {
            return;
        }
        let Some(node) = j.state.live.remove(&a) else {
            return;
        };
        // What `to` named is replaced; a directory takes its tracked
        // contents along.
        j.forget(&b);
        let inside: Vec<(String, Node)> = j
            .state
            .live
            .iter()
            .filter(|(p, _)| within(p, &a))
            .map(|(p, n)| (p.clone(), *n))
            .collect();
        for (p, n) in inside {
            j.state.live.remove(&p);
            j.state.live.insert(format!("{b}{}", &p[a.len()..]), n);
        }
        j.state.live.insert(b.clone(), node);
        let ((from_parent, from_name), (to_parent, to_name)) = (split(&a), split(&b));
        if let (Some(from_dir), Some(to_dir)) =
            (j.state.dir_id(from_parent), j.state.dir_id(to_parent))
        {
            j.state.pending.push(Rename {
                node,
                from_dir,
                from: from_name.to_string(),
                to_dir,
                to: to_name.to_string(),
            });
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

/// A directory removed with everything in it.
pub(super) fn on_remove_dir(path: &Path) {
    with_journal(|j| {
        if let Some(rel) = j.rel(path).filter(|r| !r.is_empty()) {
            j.forget(&rel);
        }
    });
}

pub(super) fn on_sync(path: &Path) {
    with_journal(|j| {
        let Some(rel) = j.rel(path) else { return };
        let Some(&Node::File(id)) = j.state.live.get(&rel) else {
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
        let Some(&Node::File(id)) = j.state.live.get(&rel) else {
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
        let id = match j.state.live.get(&rel) {
            Some(Node::Dir(id)) => *id,
            Some(Node::File(_)) => return,
            // RocksDB's own directory: not simulated.
            None if in_store(&rel) => return,
            None => {
                let id = j.state.new_id();
                j.state.live.insert(rel.clone(), Node::Dir(id));
                id
            }
        };
        let mut entries = BTreeMap::new();
        for entry in std::fs::read_dir(&abs).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let child = join(&rel, &name);
            let node = match j.state.live.get(&child) {
                Some(node) => *node,
                // Made by RocksDB (its database, a snapshot's exported
                // files): kept as it is, not simulated.
                None if in_store(&child) => continue,
                // Made behind the layer's back: tracked from now on.
                None => {
                    let id = j.state.new_id();
                    let node = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        Node::Dir(id)
                    } else {
                        Node::File(id)
                    };
                    j.state.live.insert(child, node);
                    node
                }
            };
            entries.insert(name, node);
        }
        j.state.durable.insert(id, entries);
        // Renames into or out of this directory are durable now, both
        // sides: this side is in the entries just taken.
        let pending = std::mem::take(&mut j.state.pending);
        for r in pending {
            if r.from_dir == id || r.to_dir == id {
                for side in [r.from_dir, r.to_dir] {
                    if side != id {
                        apply_side(&mut j.state.durable, &r, side);
                    }
                }
            } else {
                j.state.pending.push(r);
            }
        }
    });
}

#[cfg(test)]
mod tests;
