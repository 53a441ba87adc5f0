//! Micro-benchmarks of the wasm boundary: one put, one get and one
//! instantiation through a guest, against the same put and get on plain
//! RocksDB storage (the native baseline), in one run.
//!
//! `cargo bench -p txstore --bench calls`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use txstore::runtime::{GuestSource, Isolation, Limits, Runtime};
use txstore::storage::{Backend, MemoryBackend, RocksBackend};

fn key(i: u64) -> [u8; 16] {
    txstore::bench::key(i)
}

fn calls(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let backend = RocksBackend::open(dir.path()).unwrap();
    let value = vec![0x5a; 100];

    let mut native = backend.open_store("native").unwrap();
    let ks = native.open_keyspace("data").unwrap();
    let mut i = 0u64;
    c.bench_function("native rocksdb put", |b| {
        b.iter(|| {
            i += 1;
            native.put(ks, &key(i % 100_000), &value).unwrap()
        })
    });
    c.bench_function("native rocksdb get", |b| {
        b.iter(|| {
            i += 1;
            native.get(ks, &key(i % 100_000)).unwrap()
        })
    });

    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(Some(cache.path().to_path_buf())).unwrap();
    for guest in ["buffered", "roll-forward", "roll-back", "wipe-on-crash"] {
        let component = runtime.load(&GuestSource::Builtin(guest.into())).unwrap();
        let mut store = component
            .instantiate(
                backend.open_store(guest).unwrap(),
                guest,
                &Limits::default(),
            )
            .unwrap();
        store.init(&[]).unwrap();
        store.recover(None).unwrap();
        let mut n = 0u64;
        c.bench_function(&format!("{guest} put"), |b| {
            b.iter(|| {
                n += 1;
                store.put(&key(n % 100_000), &value).unwrap();
                if n % 50_000 == 0 {
                    store.commit(n).unwrap();
                }
            })
        });
        store.commit(n + 1).unwrap();
        c.bench_function(&format!("{guest} get read-committed"), |b| {
            b.iter(|| {
                n += 1;
                store
                    .get(&key(n % 100_000), Isolation::ReadCommitted)
                    .unwrap()
            })
        });
        let memory = MemoryBackend::new();
        c.bench_function(&format!("{guest} instantiate"), |b| {
            b.iter_batched(
                || memory.open_store("i").unwrap(),
                |storage| {
                    component
                        .instantiate(storage, "i", &Limits::default())
                        .unwrap()
                },
                BatchSize::SmallInput,
            )
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2));
    targets = calls
}
criterion_main!(benches);
