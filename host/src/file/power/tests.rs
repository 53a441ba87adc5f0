use super::loss::torn;
use super::*;
use crate::rng::Rng;
use std::sync::MutexGuard;

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

/// The journal is one per process: these tests take turns.
static TURN: Mutex<()> = Mutex::new(());

/// A state directory `state` tracked by a fresh journal, detached on drop.
struct Sim {
    _turn: MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Sim {
    fn new() -> Sim {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let root = absolute(&dir.path().join("state"));
        std::fs::create_dir_all(&root).unwrap();
        start(root.clone(), journal_dir(&root));
        Sim {
            _turn: turn,
            _dir: dir,
            root,
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        *JOURNAL.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn read(path: &Path) -> String {
    String::from_utf8(std::fs::read(path).unwrap_or_default()).unwrap()
}

/// A migration's directory as `migrate` builds it: the manifest through
/// the layer, RocksDB's database behind its back, both made durable.
fn build_migration(root: &Path) -> PathBuf {
    let new = root.join("migrate-new");
    crate::file::create_dir_all(&new).unwrap();
    let db = new.join("store/db");
    std::fs::create_dir_all(&db).unwrap();
    std::fs::write(db.join("CURRENT"), "MANIFEST-1").unwrap();
    crate::file::sync_dir(&new.join("store")).unwrap();
    crate::file::sync_dir(&new).unwrap();
    crate::file::write_atomic(&new.join("manifest"), b"new guest").unwrap();
    new
}

/// A renamed directory is durable once its parent is fsynced, with what
/// is durable in it (RocksDB's files as RocksDB left them); before that
/// the rename is undone, and the directory goes back whole.
#[test]
fn a_directory_rename_is_durable_after_the_parent_fsync_and_undone_before() {
    for synced in [false, true] {
        let sim = Sim::new();
        let new = build_migration(&sim.root);
        let ready = sim.root.join("migrate-ready");
        crate::file::rename(&new, &ready).unwrap();
        if synced {
            crate::file::sync_dir(&sim.root).unwrap();
        }
        // Written after the rename and never synced: lost either way.
        let mut late = crate::file::File::create(&ready.join("late")).unwrap();
        std::io::Write::write_all(&mut late, b"x").unwrap();
        power_loss(None);
        let (kept, gone) = if synced {
            (&ready, &new)
        } else {
            (&new, &ready)
        };
        assert!(!gone.exists(), "synced {synced}");
        assert_eq!(read(&kept.join("manifest")), "new guest", "synced {synced}");
        assert_eq!(
            read(&kept.join("store/db/CURRENT")),
            "MANIFEST-1",
            "synced {synced}"
        );
        assert!(!kept.join("late").exists(), "synced {synced}");
    }
}

/// With a seed, an unsynced rename may survive or not, but whole: the
/// directory is under exactly one of its names, with its contents.
#[test]
fn an_unsynced_directory_rename_survives_whole_or_not_at_all() {
    let mut outcomes = BTreeSet::new();
    for seed in 0..16 {
        let sim = Sim::new();
        let new = build_migration(&sim.root);
        let ready = sim.root.join("migrate-ready");
        crate::file::rename(&new, &ready).unwrap();
        let report = power_loss(Some(seed));
        assert!(report.choices >= 1, "{}", report.summary);
        assert!(new.exists() != ready.exists(), "seed {seed}");
        let kept = if ready.exists() { &ready } else { &new };
        assert_eq!(read(&kept.join("manifest")), "new guest", "seed {seed}");
        assert_eq!(read(&kept.join("store/db/CURRENT")), "MANIFEST-1");
        outcomes.insert(ready.exists());
    }
    assert_eq!(outcomes.len(), 2, "no seed kept (or undid) the rename");
}

/// Snapshot directories in the store's directory are simulated like the
/// host's other directories (a built snapshot moved to `ready/` goes back
/// to `partial/` unless `ready/` was fsynced), while RocksDB's files there
/// (its database, the files it exported) are kept as they are.
#[test]
fn snapshot_directories_in_the_store_are_simulated() {
    for synced in [false, true] {
        let sim = Sim::new();
        let store = sim.root.join("store");
        std::fs::create_dir_all(store.join("db")).unwrap();
        std::fs::write(store.join("db/CURRENT"), "MANIFEST-1").unwrap();
        crate::file::sync_dir(&sim.root).unwrap();
        let building = store.join("staging/s/partial/c");
        crate::file::create_dir_all(&building).unwrap();
        std::fs::create_dir_all(building.join("0")).unwrap();
        std::fs::write(building.join("0/1.sst"), "sst").unwrap();
        crate::file::write_atomic(&building.join("snapshot.json"), b"{}").unwrap();
        let ready = store.join("staging/s/ready");
        crate::file::create_dir_all(&ready).unwrap();
        crate::file::rename(&building, &ready.join("c")).unwrap();
        if synced {
            crate::file::sync_dir(&ready).unwrap();
        }
        std::fs::write(store.join("db/CURRENT"), "MANIFEST-2").unwrap();
        power_loss(None);
        let (kept, gone) = if synced {
            (ready.join("c"), building)
        } else {
            (building, ready.join("c"))
        };
        assert!(!gone.exists(), "synced {synced}");
        assert_eq!(read(&kept.join("snapshot.json")), "{}", "synced {synced}");
        assert_eq!(read(&kept.join("0/1.sst")), "sst", "synced {synced}");
        assert_eq!(read(&store.join("db/CURRENT")), "MANIFEST-2");
    }
}

/// A rename out of a directory is durable when the directory it enters
/// is fsynced, and the other way round: the entry is then in one place.
#[test]
fn a_rename_across_directories_is_one_operation() {
    for sync_source in [false, true] {
        let sim = Sim::new();
        let (a, b) = (sim.root.join("a"), sim.root.join("b"));
        crate::file::create_dir_all(&a).unwrap();
        crate::file::create_dir_all(&b).unwrap();
        crate::file::write_atomic(&a.join("f"), b"content").unwrap();
        crate::file::rename(&a.join("f"), &b.join("g")).unwrap();
        crate::file::sync_dir(if sync_source { &a } else { &b }).unwrap();
        power_loss(None);
        assert!(!a.join("f").exists(), "sync_source {sync_source}");
        assert_eq!(read(&b.join("g")), "content", "sync_source {sync_source}");
    }
}
