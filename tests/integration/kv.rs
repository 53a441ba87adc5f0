//! Key-value semantics through each guest, on both storage backends.

use crate::common::runtime;
use std::sync::Arc;
use txstore::testing::BackendKind;
use txstore::testing::{Backend, MemoryBackend, RocksBackend};
use txstore::testing::{GuestSource, StoreInstance};
use txstore::Config;
use txstore::Task;
use txstore::{Isolation, Limits};

const RU: Isolation = Isolation::ReadUncommitted;

pub fn open(guest: &str, backend: &Arc<dyn Backend>) -> StoreInstance {
    let component = runtime().load(&GuestSource::Builtin(guest.into())).unwrap();
    let mut s = component
        .instantiate(backend.open_store("kv").unwrap(), "kv", &Limits::default())
        .unwrap();
    s.init(&[]).unwrap();
    s.recover(None).unwrap();
    s
}

fn kv_semantics(guest: &str, backend: Arc<dyn Backend>) {
    let mut s = open(guest, &backend);
    // Ordered ranges: written out of order, read back sorted.
    for k in ["m", "c", "x", "a", "q", "b"] {
        s.put(k.as_bytes(), format!("v-{k}").as_bytes()).unwrap();
    }
    let all = s.range_all(None, None, RU).unwrap();
    let keys: Vec<&[u8]> = all.iter().map(|(k, _)| k.as_slice()).collect();
    assert_eq!(keys, [b"a", b"b", b"c", b"m", b"q", b"x"].map(|k| &k[..]));
    let mid = s.range_all(Some(b"b"), Some(b"q"), RU).unwrap();
    assert_eq!(
        mid.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        vec![b"b".to_vec(), b"c".to_vec(), b"m".to_vec()]
    );
    assert_eq!(
        s.range(None, None, RU, 2).unwrap().len(),
        2,
        "range honours its limit"
    );

    // Binary keys, including zero bytes and 0xff, order by bytes.
    let binary: Vec<Vec<u8>> = vec![
        vec![0],
        vec![0, 0],
        vec![0xff],
        vec![0xff, 0xff, 0],
        vec![1, 0, 1],
    ];
    for k in &binary {
        s.put(k, k).unwrap();
    }
    for k in &binary {
        assert_eq!(s.get(k, RU).unwrap().as_deref(), Some(k.as_slice()));
    }
    let low = s.range_all(None, Some(b"a"), RU).unwrap();
    assert_eq!(
        low.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        vec![vec![0], vec![0, 0], vec![1, 0, 1]]
    );

    // Empty values are values.
    s.put(b"empty", b"").unwrap();
    assert_eq!(s.get(b"empty", RU).unwrap(), Some(vec![]));

    // 1 MiB values.
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    s.put(b"big", &big).unwrap();
    assert_eq!(s.get(b"big", RU).unwrap().as_deref(), Some(big.as_slice()));

    // Delete then get; ranges skip the deleted key.
    s.delete(b"m").unwrap();
    assert_eq!(s.get(b"m", RU).unwrap(), None);
    assert!(!s
        .range_all(Some(b"a"), Some(b"z"), RU)
        .unwrap()
        .iter()
        .any(|(k, _)| k == b"m"));
    s.delete(b"never-there").unwrap();

    // Batched forms.
    s.put_many(&[
        (b"p1".to_vec(), b"1".to_vec()),
        (b"p2".to_vec(), b"2".to_vec()),
    ])
    .unwrap();
    s.delete_many(&[b"p1".to_vec()]).unwrap();
    let got = s
        .get_many(&[b"p1".to_vec(), b"p2".to_vec(), b"a".to_vec()], RU)
        .unwrap();
    assert_eq!(got, vec![None, Some(b"2".to_vec()), Some(b"v-a".to_vec())]);

    // Commit, then everything reads the same at both levels.
    s.commit(7).unwrap();
    assert_eq!(s.committed_offset().unwrap(), Some(7));
    assert_eq!(s.approximate_uncommitted_bytes().unwrap(), 0);
    for iso in [Isolation::ReadCommitted, RU] {
        assert_eq!(s.get(b"big", iso).unwrap().as_deref(), Some(big.as_slice()));
        assert_eq!(s.get(b"m", iso).unwrap(), None);
    }
    drop(s);
    // A new instance over the same storage sees the committed data.
    let mut again = open_after_clean_stop(guest, &backend, 7);
    assert_eq!(
        again
            .get(b"big", Isolation::ReadCommitted)
            .unwrap()
            .as_deref(),
        Some(big.as_slice())
    );
    assert_eq!(again.committed_offset().unwrap(), Some(7));
}

fn open_after_clean_stop(guest: &str, backend: &Arc<dyn Backend>, offset: u64) -> StoreInstance {
    let component = runtime().load(&GuestSource::Builtin(guest.into())).unwrap();
    let mut s = component
        .instantiate(backend.open_store("kv").unwrap(), "kv", &Limits::default())
        .unwrap();
    s.init(&[]).unwrap();
    let r = s.recover(Some(offset)).unwrap();
    assert_eq!(r.offset, Some(offset));
    s
}

#[test]
fn every_guest_kv_on_memory() {
    for guest in txstore_artifacts::names() {
        kv_semantics(guest, Arc::new(MemoryBackend::new()));
    }
}

#[test]
fn every_guest_kv_on_rocksdb() {
    for guest in txstore_artifacts::names() {
        let dir = tempfile::tempdir().unwrap();
        kv_semantics(guest, Arc::new(RocksBackend::open(dir.path()).unwrap()));
    }
}

/// Through the task: data written and committed survives a clean close and
/// a reopen of the RocksDB directory in the same process.
#[test]
fn reopen_after_clean_close_keeps_data() {
    for guest in txstore_artifacts::names() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new(guest, dir.path());
        config.store.backend = BackendKind::Rocksdb;
        let (mut task, report) = Task::open(&config, runtime()).unwrap();
        assert_eq!(report.recovered_offset, None);
        task.write(&[txstore::Record::Put(b"k".to_vec(), b"v".to_vec())])
            .unwrap();
        task.commit().unwrap();
        task.close().unwrap();
        let (mut task, report) = Task::open(&config, runtime()).unwrap();
        assert_eq!(report.action, "clean", "{guest}");
        assert_eq!(report.replayed_records, 0, "{guest}");
        assert_eq!(
            task.get(b"k", Isolation::ReadCommitted).unwrap(),
            Some(b"v".to_vec()),
            "{guest}"
        );
        task.close().unwrap();
    }
}
