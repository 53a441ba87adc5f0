//! Checks of the contract that need no crash: key-value semantics,
//! isolation levels, ranges merged over tombstones, `committed-offset`
//! after a reopen, `approximate-uncommitted-bytes`, and errors returned as
//! the WIT error variant rather than traps. Each runs on a fresh in-memory
//! store.

use crate::runtime::{CallError, GuestComponent, Isolation, Limits, StoreInstance, WitError};
use crate::storage::{Backend, MemoryBackend};
use std::sync::Arc;

const RC: Isolation = Isolation::ReadCommitted;
const RU: Isolation = Isolation::ReadUncommitted;

type Check = fn(&mut Fixture) -> Result<(), String>;

/// The checks, by the property each one names.
pub const CHECKS: &[(&str, Check)] = &[
    ("key-value semantics", kv),
    ("read-committed hides the open transaction", isolation),
    ("ranges merge uncommitted writes and deletes", range_merge),
    ("committed-offset survives a reopen", reopen),
    (
        "approximate-uncommitted-bytes grows, then is zero after commit",
        uncommitted_bytes,
    ),
    ("bad arguments are errors, not traps", errors),
];

/// A guest over a memory backend that outlives its instances.
pub struct Fixture {
    guest: GuestComponent,
    backend: Arc<dyn Backend>,
    pub store: StoreInstance,
    pub transactional: bool,
}

impl Fixture {
    pub fn new(guest: &GuestComponent) -> Result<Self, String> {
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        let store = open(guest, &backend, None)?;
        let mut f = Fixture {
            guest: guest.clone(),
            backend,
            store,
            transactional: false,
        };
        f.transactional = f.store.transactional().map_err(|e| e.to_string())?;
        Ok(f)
    }
}

fn open(
    guest: &GuestComponent,
    backend: &Arc<dyn Backend>,
    checkpoint: Option<u64>,
) -> Result<StoreInstance, String> {
    let storage = backend
        .open_store("conformance")
        .map_err(|e| format!("{e:#}"))?;
    let mut s = guest
        .instantiate(storage, "conformance", &Limits::default())
        .map_err(|e| format!("{e:#}"))?;
    s.init(&[]).map_err(|e| e.to_string())?;
    s.recover(checkpoint).map_err(|e| e.to_string())?;
    Ok(s)
}

fn e(err: CallError) -> String {
    err.to_string()
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, expected {want:?}"))
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    list.iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn kv(f: &mut Fixture) -> Result<(), String> {
    let s = &mut f.store;
    for k in ["m", "c", "x", "a"] {
        s.put(k.as_bytes(), k.as_bytes()).map_err(e)?;
    }
    s.put(b"c", b"c2").map_err(e)?;
    s.put(&[0, 0xff], b"").map_err(e)?;
    s.delete(b"x").map_err(e)?;
    s.delete(b"never").map_err(e)?;
    expect(
        "get of an overwritten key",
        s.get(b"c", RU).map_err(e)?,
        Some(b"c2".to_vec()),
    )?;
    expect("get of a deleted key", s.get(b"x", RU).map_err(e)?, None)?;
    expect(
        "get of an empty value under a binary key",
        s.get(&[0, 0xff], RU).map_err(e)?,
        Some(vec![]),
    )?;
    let want = vec![
        (vec![0, 0xff], vec![]),
        (b"a".to_vec(), b"a".to_vec()),
        (b"c".to_vec(), b"c2".to_vec()),
        (b"m".to_vec(), b"m".to_vec()),
    ];
    expect(
        "range of everything",
        s.range_all(None, None, RU).map_err(e)?,
        want.clone(),
    )?;
    expect(
        "range with a limit of 2",
        s.range(None, None, RU, 2).map_err(e)?,
        want[..2].to_vec(),
    )?;
    expect(
        "range [b, m)",
        s.range_all(Some(b"b"), Some(b"m"), RU).map_err(e)?,
        want[2..3].to_vec(),
    )?;
    s.commit(1).map_err(e)?;
    expect(
        "range after commit",
        s.range_all(None, None, RC).map_err(e)?,
        want,
    )
}

fn isolation(f: &mut Fixture) -> Result<(), String> {
    if !f.transactional {
        return Ok(()); // no committed view to hide anything from
    }
    let s = &mut f.store;
    s.put_many(&pairs(&[("a", "1"), ("b", "2")])).map_err(e)?;
    s.commit(1).map_err(e)?;
    s.put(b"a", b"10").map_err(e)?;
    s.delete(b"b").map_err(e)?;
    s.put(b"c", b"3").map_err(e)?;
    let keys = [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()];
    expect(
        "read-committed get-many",
        s.get_many(&keys, RC).map_err(e)?,
        vec![Some(b"1".to_vec()), Some(b"2".to_vec()), None],
    )?;
    expect(
        "read-uncommitted get-many",
        s.get_many(&keys, RU).map_err(e)?,
        vec![Some(b"10".to_vec()), None, Some(b"3".to_vec())],
    )?;
    expect(
        "read-committed get of a key deleted in the open transaction",
        s.get(b"b", RC).map_err(e)?,
        Some(b"2".to_vec()),
    )?;
    expect(
        "read-committed range",
        s.range_all(None, None, RC).map_err(e)?,
        pairs(&[("a", "1"), ("b", "2")]),
    )
}

fn range_merge(f: &mut Fixture) -> Result<(), String> {
    let s = &mut f.store;
    s.put_many(&pairs(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]))
        .map_err(e)?;
    s.commit(1).map_err(e)?;
    s.delete_many(&[b"b".to_vec(), b"d".to_vec()]).map_err(e)?;
    s.put_many(&pairs(&[("bb", "22"), ("c", "33"), ("e", "5")]))
        .map_err(e)?;
    let want = pairs(&[("a", "1"), ("bb", "22"), ("c", "33"), ("e", "5")]);
    expect(
        "read-uncommitted range over tombstones",
        s.range_all(None, None, RU).map_err(e)?,
        want.clone(),
    )?;
    expect(
        "paged by 1",
        (0..4)
            .try_fold((Vec::new(), None::<Vec<u8>>), |(mut out, next), _| {
                let page = s.range(next.as_deref(), None, RU, 1).map_err(e)?;
                let next = page.last().map(|(k, _)| [k.as_slice(), &[0]].concat());
                out.extend(page);
                Ok::<_, String>((out, next))
            })?
            .0,
        want.clone(),
    )?;
    expect(
        "range [b, d)",
        s.range_all(Some(b"b"), Some(b"d"), RU).map_err(e)?,
        want[1..3].to_vec(),
    )
}

fn reopen(f: &mut Fixture) -> Result<(), String> {
    f.store.put(b"k", b"v").map_err(e)?;
    f.store.commit(5).map_err(e)?;
    expect(
        "committed-offset",
        f.store.committed_offset().map_err(e)?,
        Some(5),
    )?;
    // A clean stop: the host wrote checkpoint 5; a new instance recovers.
    let mut again = open(&f.guest, &f.backend, Some(5))?;
    expect(
        "committed-offset after reopen",
        again.committed_offset().map_err(e)?,
        Some(5),
    )?;
    expect(
        "data after reopen",
        again.get(b"k", RC).map_err(e)?,
        Some(b"v".to_vec()),
    )?;
    f.store = again;
    Ok(())
}

fn uncommitted_bytes(f: &mut Fixture) -> Result<(), String> {
    let s = &mut f.store;
    let mut last = s.approximate_uncommitted_bytes().map_err(e)?;
    expect("uncommitted bytes of a new store", last, 0)?;
    for i in 0..20u32 {
        s.put(format!("key-{i:03}").as_bytes(), &[7; 100])
            .map_err(e)?;
        let now = s.approximate_uncommitted_bytes().map_err(e)?;
        if now < last {
            return Err(format!("fell from {last} to {now} after putting a new key"));
        }
        last = now;
    }
    if last == 0 {
        return Err("still 0 after 20 puts of 100 bytes".into());
    }
    s.commit(1).map_err(e)?;
    expect(
        "uncommitted bytes after commit",
        s.approximate_uncommitted_bytes().map_err(e)?,
        0,
    )
}

fn errors(f: &mut Fixture) -> Result<(), String> {
    match f.store.range(Some(b"z"), Some(b"a"), RU, 10) {
        Err(CallError::Guest {
            err: WitError::InvalidArgument(_),
            ..
        }) => {}
        Err(CallError::Guest { err, .. }) => {
            return Err(format!(
                "range with start > end returned {err:?}, expected invalid-argument"
            ))
        }
        Err(trap) => return Err(format!("range with start > end trapped: {trap}")),
        Ok(page) => {
            return Err(format!(
                "range with start > end returned {} entries, expected invalid-argument",
                page.len()
            ))
        }
    }
    // The instance must still work after returning an error.
    f.store.put(b"after", b"error").map_err(e)?;
    expect(
        "get after an error",
        f.store.get(b"after", RU).map_err(e)?,
        Some(b"error".to_vec()),
    )?;
    unknown_option(f)
}

/// An option no guest knows, for [`unknown_option`].
const UNKNOWN_OPTION: &str = "txstore-conformance-no-such-option";

/// `init` refuses an option it does not know with `invalid-argument`
/// naming it: a misspelt setting must not run silently on its default.
fn unknown_option(f: &mut Fixture) -> Result<(), String> {
    let storage = f
        .backend
        .open_store("conformance-options")
        .map_err(|e| format!("{e:#}"))?;
    let mut fresh = f
        .guest
        .instantiate(storage, "conformance-options", &Limits::default())
        .map_err(|e| format!("{e:#}"))?;
    match fresh.init(&[(UNKNOWN_OPTION.to_string(), "1".to_string())]) {
        Err(CallError::Guest {
            err: WitError::InvalidArgument(msg),
            ..
        }) if msg.contains(UNKNOWN_OPTION) => Ok(()),
        Err(CallError::Guest { err, .. }) => Err(format!(
            "init with the unknown option `{UNKNOWN_OPTION}` returned {err:?}, expected invalid-argument naming it"
        )),
        Err(trap) => Err(format!("init with an unknown option trapped: {trap}")),
        Ok(()) => Err(format!(
            "init accepted the unknown option `{UNKNOWN_OPTION}`: a misspelt setting would run silently on its default"
        )),
    }
}
