//! Micro-benchmarks of the wasm boundary: one put, one get, one page of a
//! scan and one instantiation through a guest, against the same put, get
//! and scan page on plain RocksDB storage (the native baseline), in one run.
//!
//! `cargo bench -p txstore --bench calls`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use txstore::testing::GuestSource;
use txstore::testing::{Backend, MemoryBackend, RocksBackend};
use txstore::{Isolation, Limits, Runtime};

/// mimalloc rather than glibc's malloc: see the workspace Cargo.toml.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn key(i: u64) -> [u8; 16] {
    txstore::testing::key(i)
}

/// Entries per scan page: the host's cursor batch and a guest's `range` page.
const PAGE: u32 = 1024;
/// Distinct keys each store holds.
const KEYS: u64 = 100_000;

fn calls(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let backend = RocksBackend::open(dir.path()).unwrap();
    let value = vec![0x5a; 100];

    let mut native = backend.open_store("native").unwrap();
    let ks = native.open_keyspace("data").unwrap();
    // Every key present before any timing, whichever benchmarks a filter keeps.
    for k in 0..KEYS {
        native.put(ks, &key(k), &value).unwrap();
    }
    let mut i = 0u64;
    c.bench_function("native rocksdb put", |b| {
        b.iter(|| {
            i += 1;
            native.put(ks, &key(i % KEYS), &value).unwrap()
        })
    });
    c.bench_function("native rocksdb get", |b| {
        b.iter(|| {
            i += 1;
            native.get(ks, &key(i % KEYS)).unwrap()
        })
    });
    native.sync().unwrap();
    c.bench_function("native rocksdb scan page of 1024", |b| {
        b.iter(|| {
            i += 1;
            let mut cursor = native.scan(ks, Some(&key(i % KEYS)), None).unwrap();
            cursor.next(PAGE as usize).unwrap()
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
        for k in 0..KEYS {
            store.put(&key(k), &value).unwrap();
            if k % 10_000 == 0 {
                store.commit(k + 1).unwrap();
            }
        }
        let mut n = KEYS;
        store.commit(n).unwrap();
        c.bench_function(&format!("{guest} put"), |b| {
            b.iter(|| {
                n += 1;
                store.put(&key(n % KEYS), &value).unwrap();
                if n % 50_000 == 0 {
                    store.commit(n).unwrap();
                }
            })
        });
        store.commit(n + 1).unwrap();
        c.bench_function(&format!("{guest} get read-committed"), |b| {
            b.iter(|| {
                n += 1;
                store.get(&key(n % KEYS), Isolation::ReadCommitted).unwrap()
            })
        });
        c.bench_function(&format!("{guest} scan page of 1024"), |b| {
            b.iter(|| {
                n += 1;
                let start = key(n % KEYS);
                store
                    .range(Some(&start), None, Isolation::ReadCommitted, PAGE)
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
