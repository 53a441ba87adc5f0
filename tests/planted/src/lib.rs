//! A small roll-forward store (temporary keyspace, marker, copy, clear)
//! with switchable bugs; without features it is correct, and the tests
//! check that the conformance suite accepts it so.

wit_bindgen::generate!({ path: "../../wit/0.1.0", world: "store" });

use exports::txstore::store::state_store::{Guest, Isolation, Recovery, RecoveryAction};
use std::cell::RefCell;
use std::collections::BTreeMap;
use txstore::store::storage::{self, Keyspace, KeyspaceOps, Op};
use txstore::store::types::{Entry, Error};

struct Store {
    main: Keyspace,
    temp: Keyspace,
    meta: Keyspace,
    uncommitted: u64,
    /// Writes not yet in `temp` (feature `lazy-temp-kept` only).
    pending: Vec<Op>,
}

/// Writes held in memory before they go to `temp` (`lazy-temp-kept`).
const LAZY: bool = cfg!(feature = "lazy-temp-kept");
const FLUSH_AT: usize = 256;

/// Sends held writes to `temp`.
fn flush(s: &mut Store) -> Result<(), Error> {
    if s.pending.is_empty() {
        return Ok(());
    }
    let ops = std::mem::take(&mut s.pending);
    storage::write(
        &[KeyspaceOps {
            keyspace: &s.temp,
            ops,
        }],
        false,
    )
}

/// Stages `ops` for `temp`: at once, or held (`lazy-temp-kept`).
fn stage(s: &mut Store, ops: Vec<Op>) -> Result<(), Error> {
    s.pending.extend(ops);
    if !LAZY || s.pending.len() >= FLUSH_AT {
        flush(s)?;
    }
    Ok(())
}

thread_local! {
    static STORE: RefCell<Option<Store>> = const { RefCell::new(None) };
}

fn with<R>(f: impl FnOnce(&mut Store) -> Result<R, Error>) -> Result<R, Error> {
    STORE.with(|s| match s.borrow_mut().as_mut() {
        Some(s) => f(s),
        None => Err(Error::Other("init was not called".into())),
    })
}

/// Writes go to main, synced: durable before the changelog commits them.
const BUGGY_WRITES: bool = cfg!(feature = "eager-store");

/// The key as stored: unchanged, but for the planted key bugs.
fn stored_key(key: &[u8]) -> Vec<u8> {
    if cfg!(feature = "long-keys-cut") {
        return key[..key.len().min(255)].to_vec();
    }
    if cfg!(feature = "lossy-keys") {
        return String::from_utf8_lossy(key).into_owned().into_bytes();
    }
    key.to_vec()
}

fn offset(meta: &Keyspace, key: &[u8]) -> Result<Option<u64>, Error> {
    Ok(meta
        .get(key)?
        .map(|v| u64::from_be_bytes(v.try_into().unwrap_or([0; 8]))))
}

fn all(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<Vec<Entry>, Error> {
    let cursor = ks.scan(start, end)?;
    let mut out = Vec::new();
    loop {
        let batch = match cursor.next(1024) {
            Ok(batch) => batch,
            Err(_) if cfg!(feature = "read-error-ends-scan") => return Ok(out),
            Err(e) => return Err(e),
        };
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}

/// The first cursor batch only: the loop the author forgot.
fn first_batch(ks: &Keyspace) -> Result<Vec<Entry>, Error> {
    ks.scan(None, None)?.next(1024)
}

/// Copies the temporary keyspace into main (tag 1 = put, 0 = delete).
fn copy(s: &Store) -> Result<(), Error> {
    let staged = if cfg!(feature = "copy-first-batch") {
        first_batch(&s.temp)?
    } else {
        all(&s.temp, None, None)?
    };
    let ops: Vec<Op> = staged
        .into_iter()
        .map(|e| match e.value.split_first() {
            Some((1, v)) => Op::Put(Entry {
                key: e.key,
                value: v.to_vec(),
            }),
            _ => Op::Delete(e.key),
        })
        .collect();
    storage::write(
        &[KeyspaceOps {
            keyspace: &s.main,
            ops,
        }],
        true,
    )
}

fn finish(s: &Store, o: u64) -> Result<(), Error> {
    let ops = vec![
        Op::Put(Entry {
            key: b"offset".to_vec(),
            value: o.to_be_bytes().to_vec(),
        }),
        Op::Delete(b"marker".to_vec()),
    ];
    storage::write(
        &[KeyspaceOps {
            keyspace: &s.meta,
            ops,
        }],
        true,
    )
}

fn clear_temp(s: &Store) -> Result<(), Error> {
    if cfg!(feature = "keeps-temp") {
        return Ok(());
    }
    storage::write(
        &[KeyspaceOps {
            keyspace: &s.temp,
            ops: vec![Op::Clear],
        }],
        true,
    )
}

fn read(s: &mut Store, key: &[u8], isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
    if isolation == Isolation::ReadUncommitted {
        flush(s)?;
    }
    let key = &stored_key(key)[..];
    let see_temp =
        isolation == Isolation::ReadUncommitted || cfg!(feature = "leaky-read-committed");
    if see_temp && !BUGGY_WRITES {
        if let Some(v) = s.temp.get(key)? {
            return Ok(match v.split_first() {
                Some((1, v)) => Some(v.to_vec()),
                _ => None,
            });
        }
    }
    s.main.get(key)
}

struct Planted;

impl Guest for Planted {
    fn init(options: Vec<(String, String)>) -> Result<(), Error> {
        if let Some((name, _)) = options.first().filter(|_| !cfg!(feature = "options-ignored")) {
            return Err(Error::InvalidArgument(format!("planted: unknown option `{name}` (known: none)")));
        }
        let store = Store {
            main: Keyspace::open("main")?,
            temp: Keyspace::open("temp")?,
            meta: Keyspace::open("meta")?,
            uncommitted: 0,
            pending: Vec::new(),
        };
        STORE.with(|s| *s.borrow_mut() = Some(store));
        Ok(())
    }

    fn transactional() -> bool {
        !cfg!(feature = "wipe-keeps-checkpoint")
    }

    fn recover(checkpointed: Option<u64>) -> Result<Recovery, Error> {
        with(|s| {
            s.uncommitted = 0;
            s.pending.clear();
            if cfg!(feature = "wipe-keeps-checkpoint") {
                for ks in [&s.main, &s.temp, &s.meta] {
                    ks.clear()?;
                }
                return Ok(Recovery {
                    offset: checkpointed,
                    action: RecoveryAction::Wiped,
                });
            }
            if cfg!(feature = "checkpoint-trusted")
                && checkpointed.is_some()
                && checkpointed == offset(&s.meta, b"offset")?
            {
                return Ok(Recovery {
                    offset: checkpointed,
                    action: RecoveryAction::Clean,
                });
            }
            if let Some(marker) = offset(&s.meta, b"marker")? {
                if cfg!(feature = "non-idempotent-recovery") {
                    finish(s, marker)?;
                    copy(s)?;
                } else {
                    copy(s)?;
                    finish(s, marker)?;
                }
                clear_temp(s)?;
                return Ok(Recovery {
                    offset: Some(marker),
                    action: RecoveryAction::RolledForward,
                });
            }
            // Writes of the interrupted transaction left in storage: then
            // recovery discards something and must say so, whatever the
            // checkpoint (under at-least-once it always matches).
            let open_writes = !s.temp.scan(None, None)?.next(1)?.is_empty();
            if !LAZY {
                clear_temp(s)?;
            }
            let stored = offset(&s.meta, b"offset")?;
            Ok(Recovery {
                offset: stored,
                action: if cfg!(feature = "clean-after-discard")
                    || (!open_writes && checkpointed.is_some() && checkpointed == stored)
                {
                    RecoveryAction::Clean
                } else {
                    RecoveryAction::Discarded
                },
            })
        })
    }

    fn get(key: Vec<u8>, isolation: Isolation) -> Result<Option<Vec<u8>>, Error> {
        if cfg!(feature = "hostile") && key == b"probe" {
            return Ok(Some(hostile::probe().into_bytes()));
        }
        with(|s| read(s, &key, isolation))
    }

    fn get_many(keys: Vec<Vec<u8>>, isolation: Isolation) -> Result<Vec<Option<Vec<u8>>>, Error> {
        if cfg!(feature = "get-many-sorted") {
            let keys: std::collections::BTreeSet<Vec<u8>> = keys.into_iter().collect();
            return with(|s| keys.iter().map(|k| read(s, k, isolation)).collect());
        }
        with(|s| keys.iter().map(|k| read(s, k, isolation)).collect())
    }

    fn range(
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        isolation: Isolation,
        limit: u32,
    ) -> Result<Vec<Entry>, Error> {
        if let (Some(a), Some(b)) = (&start, &end) {
            if a > b {
                return Err(Error::InvalidArgument(
                    "range start is after its end".into(),
                ));
            }
        }
        let limit = if cfg!(feature = "range-limit-zero-unbounded") && limit == 0 {
            u32::MAX
        } else {
            limit
        };
        with(|s| {
            if isolation == Isolation::ReadUncommitted {
                flush(s)?;
            }
            let committed = all(&s.main, start.as_deref(), end.as_deref())?;
            let early = cfg!(feature = "range-limit-before-merge")
                && isolation == Isolation::ReadUncommitted;
            let mut view: BTreeMap<Vec<u8>, Vec<u8>> = committed
                .into_iter()
                .take(if early { limit as usize } else { usize::MAX })
                .map(|e| (e.key, e.value))
                .collect();
            let see_temp =
                isolation == Isolation::ReadUncommitted || cfg!(feature = "leaky-read-committed");
            if see_temp && !BUGGY_WRITES {
                for e in all(&s.temp, start.as_deref(), end.as_deref())? {
                    match e.value.split_first() {
                        Some((1, v)) => view.insert(e.key, v.to_vec()),
                        _ => view.remove(&e.key),
                    };
                }
            }
            Ok(view
                .into_iter()
                .take(limit as usize)
                .map(|(key, value)| Entry { key, value })
                .collect())
        })
    }

    fn put(key: Vec<u8>, value: Vec<u8>) -> Result<(), Error> {
        Self::put_many(vec![Entry { key, value }])
    }

    fn delete(key: Vec<u8>) -> Result<(), Error> {
        if cfg!(feature = "single-delete-forgets") {
            return with(|s| {
                s.uncommitted += key.len() as u64;
                s.temp.delete(&key)
            });
        }
        Self::delete_many(vec![key])
    }

    fn put_many(entries: Vec<Entry>) -> Result<(), Error> {
        let bytes = entries.iter().map(|e| e.key.len() + e.value.len()).sum::<usize>();
        small_batch(entries.len(), bytes)?;
        if cfg!(feature = "hostile") {
            for e in &entries {
                hostile::on_put(&e.key);
            }
        }
        with(|s| {
            s.uncommitted += entries
                .iter()
                .map(|e| (e.key.len() + e.value.len()) as u64)
                .sum::<u64>();
            if BUGGY_WRITES {
                let ops = entries.into_iter().map(Op::Put).collect();
                return storage::write(
                    &[KeyspaceOps {
                        keyspace: &s.main,
                        ops,
                    }],
                    true,
                );
            }
            let ops = entries
                .into_iter()
                .map(|e| {
                    let value = if cfg!(feature = "empty-value-deletes") && e.value.is_empty() {
                        vec![0]
                    } else {
                        [&[1u8][..], &e.value].concat()
                    };
                    Op::Put(Entry {
                        key: stored_key(&e.key),
                        value,
                    })
                })
                .collect();
            stage(s, ops)
        })
    }

    fn delete_many(keys: Vec<Vec<u8>>) -> Result<(), Error> {
        small_batch(keys.len(), keys.iter().map(Vec::len).sum())?;
        with(|s| {
            s.uncommitted += keys.iter().map(|k| k.len() as u64).sum::<u64>();
            if BUGGY_WRITES {
                let ops = keys.into_iter().map(Op::Delete).collect();
                return storage::write(
                    &[KeyspaceOps {
                        keyspace: &s.main,
                        ops,
                    }],
                    true,
                );
            }
            let ops = keys
                .into_iter()
                .map(|key| {
                    Op::Put(Entry {
                        key: stored_key(&key),
                        value: vec![0],
                    })
                })
                .collect();
            stage(s, ops)
        })
    }

    fn commit(offset: u64) -> Result<(), Error> {
        with(|s| {
            if cfg!(feature = "zero-bytes-skip-copy") && s.uncommitted == 0 {
                // "Nothing written": but a delete of the empty key is.
                return finish(s, offset);
            }
            let marker = vec![Op::Put(Entry {
                key: b"marker".to_vec(),
                value: offset.to_be_bytes().to_vec(),
            })];
            // Held writes go in with the marker, in one atomic batch.
            storage::write(
                &[
                    KeyspaceOps {
                        keyspace: &s.temp,
                        ops: std::mem::take(&mut s.pending),
                    },
                    KeyspaceOps {
                        keyspace: &s.meta,
                        ops: marker,
                    },
                ],
                true,
            )?;
            copy(s)?;
            if cfg!(feature = "hostile") && s.main.get(b"trap-commit")?.is_some() && s.temp.get(b"trap-commit")?.is_some() {
                panic!("planted trap in the middle of commit, after the copy");
            }
            clear_temp(s)?;
            finish(s, offset)?;
            s.uncommitted = 0;
            Ok(())
        })
    }

    fn committed_offset() -> Result<Option<u64>, Error> {
        with(|s| offset(&s.meta, b"offset"))
    }

    fn approximate_uncommitted_bytes() -> u64 {
        STORE.with(|s| s.borrow().as_ref().map_or(0, |s| s.uncommitted))
    }
}

/// What the hostile guest tries.
mod hostile {
    /// Reports what the sandbox let through, as `name:result` words.
    pub fn probe() -> String {
        let fs = match std::fs::read("/etc/passwd").or_else(|_| std::fs::read("passwd")) {
            Ok(b) => format!("fs:read-{}-bytes", b.len()),
            Err(_) => "fs:denied".into(),
        };
        let dir = match std::fs::read_dir(".").or_else(|_| std::fs::read_dir("/")) {
            Ok(_) => "dir:listed".to_string(),
            Err(_) => "dir:denied".into(),
        };
        let env = format!("env:{}", std::env::vars().count());
        let clock = format!(
            "clock:{}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
        );
        let net = match std::net::TcpStream::connect("127.0.0.1:22") {
            Ok(_) => "net:connected".to_string(),
            Err(_) => "net:denied".into(),
        };
        format!("{fs} {dir} {env} {clock} {net}")
    }

    pub fn on_put(key: &[u8]) {
        match key {
            b"loop" => {
                let mut n = 0u64;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            b"bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            _ => {}
        }
    }
}

export!(Planted);

/// The `small-batches` guest's refusal of a call of many entries.
fn small_batch(entries: usize, bytes: usize) -> Result<(), Error> {
    const MAX_BATCH_BYTES: usize = 512;
    if cfg!(feature = "small-batches") && entries > 1 && bytes > MAX_BATCH_BYTES {
        return Err(Error::UncommittedLimit(MAX_BATCH_BYTES as u64));
    }
    Ok(())
}
