//! The power cut itself: the tracked tree rolled back to what the journal
//! says is durable (see [`super`]).

use super::{
    apply_rename, baseline, in_store, join, within, Durable, Journal, Node, JOURNAL, PAGE,
};
use crate::crash::PowerReport;
use crate::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What a file becomes after the power cut: its durable content, or with
/// a seed, a mix of durable and current pages. Returns the content and the
/// number of choices the seed had.
pub(super) fn torn(
    durable: &[u8],
    current: Option<&[u8]>,
    rng: Option<&mut Rng>,
) -> (Vec<u8>, u64) {
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

/// The tree the durable entries describe, from the root: path -> node. A
/// directory is in one place (the first met, should two entries name it).
pub(super) fn durable_tree(durable: &Durable, root: u64) -> BTreeMap<String, Node> {
    let mut tree = BTreeMap::from([(String::new(), Node::Dir(root))]);
    let mut placed = BTreeSet::from([root]);
    let mut pending = vec![(String::new(), root)];
    while let Some((dir, id)) = pending.pop() {
        let Some(entries) = durable.get(&id) else {
            continue;
        };
        for (name, node) in entries {
            let rel = join(&dir, name);
            match *node {
                Node::Dir(d) => {
                    if placed.insert(d) {
                        tree.insert(rel.clone(), *node);
                        pending.push((rel, d));
                    }
                }
                Node::File(_) => {
                    tree.insert(rel, *node);
                }
            }
        }
    }
    tree
}

fn depth(rel: &str) -> usize {
    rel.matches('/').count()
}

/// Where `rel` is after the directory moves `moved` (from, to).
fn after_moves(rel: &str, moved: &[(String, String)]) -> String {
    moved
        .iter()
        .filter(|(from, _)| within(rel, from))
        .max_by_key(|(from, _)| from.len())
        .map_or_else(
            || rel.to_string(),
            |(from, to)| format!("{to}{}", &rel[from.len()..]),
        )
}

/// Moves every tracked directory that is elsewhere than the durable tree
/// has it back there, with everything in it (RocksDB's files included):
/// first each aside into the journal, outermost first, then each into
/// place, outermost first. Returns the moves (from, to).
fn move_dirs(j: &Journal, target: &BTreeMap<String, Node>) -> Vec<(String, String)> {
    let root = &j.root;
    let now: BTreeMap<Node, &String> = j
        .state
        .live
        .iter()
        .filter(|(_, n)| matches!(n, Node::Dir(_)))
        .map(|(p, n)| (*n, p))
        .collect();
    let mut moves: Vec<(String, String, u64)> = target
        .iter()
        .filter_map(|(to, node)| {
            let Node::Dir(id) = node else { return None };
            let from = now.get(node)?;
            (from.as_str() != to && !to.is_empty() && root.join(from).is_dir())
                .then(|| ((*from).clone(), to.clone(), *id))
        })
        .collect();
    if moves.is_empty() {
        return Vec::new();
    }
    let hold = j.dir.join("moving");
    let _ = std::fs::remove_dir_all(&hold);
    std::fs::create_dir_all(&hold).expect("power loss: create the holding directory");
    moves.sort_by_key(|(from, _, _)| depth(from));
    let mut held: Vec<(String, PathBuf)> = Vec::new();
    for (from, _, id) in &moves {
        let at = held
            .iter()
            .filter(|(p, _)| within(from, p))
            .max_by_key(|(p, _)| p.len())
            .map_or_else(
                || root.join(from),
                |(p, tmp)| tmp.join(&from[p.len() + 1..]),
            );
        let tmp = hold.join(id.to_string());
        std::fs::rename(&at, &tmp).expect("power loss: move a directory aside");
        held.push((from.clone(), tmp));
    }
    moves.sort_by_key(|(_, to, _)| depth(to));
    for (_, to, id) in &moves {
        let dest = root.join(to);
        // Whatever is there is not what the durable tree has there.
        remove_entry(&dest);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).expect("power loss: create a directory");
        }
        std::fs::rename(hold.join(id.to_string()), &dest)
            .expect("power loss: move a directory back");
    }
    let _ = std::fs::remove_dir(&hold);
    moves.into_iter().map(|(from, to, _)| (from, to)).collect()
}

/// Removes a file or a directory tree, if there is one.
fn remove_entry(path: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(path).expect("power loss: remove a directory");
            true
        }
        Ok(_) => {
            std::fs::remove_file(path).expect("power loss: remove a file");
            true
        }
        Err(_) => false,
    }
}

/// Removes every entry the durable tree does not have, except RocksDB's
/// (untracked, in a store's directory). Returns how many it removed.
fn remove_undurable(
    root: &Path,
    target: &BTreeMap<String, Node>,
    tracked: &BTreeSet<String>,
) -> usize {
    let mut removed = 0;
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let rel = join(&dir, &entry.file_name().to_string_lossy());
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            match target.get(&rel) {
                Some(Node::Dir(_)) if is_dir => {
                    stack.push(rel);
                    continue;
                }
                Some(Node::File(_)) if !is_dir => continue,
                None if !tracked.contains(&rel) && in_store(&rel) => continue,
                _ => {}
            }
            removed += usize::from(remove_entry(&entry.path()));
        }
    }
    removed
}

/// Each tracked file's current content by file id, before anything moves.
fn current_contents(j: &Journal, root: &Path) -> BTreeMap<u64, Vec<u8>> {
    let mut current = BTreeMap::new();
    for (rel, node) in &j.state.live {
        if let Node::File(id) = node {
            if let Ok(bytes) = std::fs::read(root.join(rel)) {
                current.insert(*id, bytes);
            }
        }
    }
    current
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
    let current = current_contents(j, &root);
    // Renames the hardware may have kept: a prefix, none without a seed.
    let mut choices = 0u64;
    let mut durable = j.state.durable.clone();
    let pending = &j.state.pending;
    let kept = match rng.as_mut() {
        Some(rng) if !pending.is_empty() => {
            choices += pending.len() as u64;
            rng.below(pending.len() as u64 + 1) as usize
        }
        _ => 0,
    };
    for r in &pending[..kept] {
        apply_rename(&mut durable, r);
    }
    let target = durable_tree(&durable, j.state.root);
    let moved = move_dirs(j, &target);
    let tracked: BTreeSet<String> = j
        .state
        .live
        .keys()
        .map(|p| after_moves(p, &moved))
        .collect();
    let removed = remove_undurable(&root, &target, &tracked);
    for (rel, node) in &target {
        if let Node::Dir(_) = node {
            std::fs::create_dir_all(root.join(rel)).expect("power loss: create a directory");
        }
    }
    let mut changed = 0;
    for (rel, node) in &target {
        let Node::File(id) = node else { continue };
        let (content, c) = torn(
            &j.durable_content(*id),
            current.get(id).map(Vec::as_slice),
            rng.as_mut(),
        );
        choices += c;
        let path = root.join(rel);
        if std::fs::read(&path).ok().as_deref() != Some(content.as_slice()) {
            changed += 1;
            std::fs::write(&path, &content).expect("power loss: write a file");
        }
    }
    let renames = pending.len();
    j.state = baseline(&root, &j.dir);
    j.save();
    PowerReport {
        summary: format!(
            "files: {changed} rolled back, {removed} unsynced entries undone, {} directories moved back, \
             {kept} of {renames} unsynced renames kept",
            moved.len()
        ),
        choices,
    }
}
