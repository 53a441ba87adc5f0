//! Reading storage: a cursor as an iterator, whole pages passed on, an
//! overlay merged over a base, a tagged keyspace applied to another.

use crate::{storage, Cursor, Entry, Error, Keyspace, KeyspaceOps, Op, Packed, Tagged};
use std::collections::VecDeque;

/// Entries fetched per cursor call.
pub const CURSOR_BATCH: u32 = 1024;

/// A storage cursor as an iterator. A storage error ends the iteration
/// and is kept in `error` for the caller to check.
pub struct CursorIter {
    cursor: Cursor,
    buf: VecDeque<Entry>,
    done: bool,
    /// Entries asked for by the next cursor call: small first (a read of
    /// one entry should not copy a thousand), doubling to `CURSOR_BATCH`.
    fetch: u32,
    pub error: Option<Error>,
}

impl CursorIter {
    pub fn new(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<Self, Error> {
        Self::expecting(ks, start, end, CURSOR_BATCH)
    }

    /// A cursor for a read that wants about `wanted` entries (a range's
    /// limit): its first call fetches that many, later ones more.
    pub fn expecting(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>, wanted: u32) -> Result<Self, Error> {
        Ok(Self {
            cursor: ks.scan(start, end)?,
            buf: VecDeque::new(),
            done: false,
            fetch: wanted.clamp(1, CURSOR_BATCH),
            error: None,
        })
    }

    /// The error that ended the iteration, if one did.
    pub fn finish(self) -> Result<(), Error> {
        self.error.map_or(Ok(()), Err)
    }
}

impl Iterator for CursorIter {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if self.buf.is_empty() && !self.done {
            match self.cursor.next(self.fetch) {
                Ok(page) if page.ends.is_empty() => self.done = true,
                Ok(page) => {
                    self.buf.extend(page.entries().map(|(k, v)| Entry { key: k.to_vec(), value: v.to_vec() }));
                    self.fetch = (self.fetch * 2).min(CURSOR_BATCH);
                }
                Err(e) => {
                    self.error = Some(e);
                    self.done = true;
                }
            }
        }
        self.buf.pop_front()
    }
}

/// Merges `overlay` (key, Some(value) or None for a delete) over `base`,
/// both in key order, into a page of at most `limit` live entries.
pub fn merge<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    base: impl Iterator<Item = Entry>,
    overlay: impl Iterator<Item = (K, Option<V>)>,
    limit: u32,
) -> Packed {
    let mut base = base.peekable();
    let mut overlay = overlay.peekable();
    let mut out = Packed::new();
    while (out.entries_len() as u32) < limit {
        let take_overlay = match (base.peek(), overlay.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(b), Some((k, _))) => {
                if k.as_ref() <= b.key.as_slice() {
                    if k.as_ref() == b.key.as_slice() {
                        base.next();
                    }
                    true
                } else {
                    false
                }
            }
        };
        if take_overlay {
            let (key, value) = overlay.next().unwrap();
            if let Some(value) = value {
                out.push_entry(key.as_ref(), value.as_ref());
            }
        } else {
            let e = base.next().unwrap();
            out.push_entry(&e.key, &e.value);
        }
    }
    out
}

/// Reads up to `limit` entries of [start, end) from `ks` as one page: the
/// cursor's pages are passed on (or joined), never split into entries.
pub fn read_range(ks: &Keyspace, start: Option<&[u8]>, end: Option<&[u8]>, limit: u32) -> Result<Packed, Error> {
    if limit == 0 {
        return Ok(Packed::new());
    }
    let cursor = ks.scan(start, end)?;
    let mut out = cursor.next(limit.min(CURSOR_BATCH))?;
    // Only an empty page ends the cursor (a short one need not).
    while !out.ends.is_empty() && out.entries_len() < limit as usize {
        let want = (limit as usize - out.entries_len()).min(CURSOR_BATCH as usize) as u32;
        let page = cursor.next(want)?;
        if page.ends.is_empty() {
            break;
        }
        let base = out.bytes.len() as u32;
        out.bytes.extend_from_slice(&page.bytes);
        out.ends.extend(page.ends.iter().map(|e| e + base));
    }
    Ok(out)
}

/// Applies every entry of `from` to `to`, a cursor page per `write` call:
/// a value `tag` marks present is put, an absent one deletes its key. A
/// page's keys are distinct, so its puts and deletes go as two packed
/// batches and no entry is copied out on its own. Not atomic as a whole:
/// callers make it idempotent (`from` stays until everything is applied).
pub fn apply_tagged(from: &Keyspace, to: &Keyspace, tag: Tagged, name: &str) -> Result<(), Error> {
    let cursor = from.scan(None, None)?;
    loop {
        let page = cursor.next(CURSOR_BATCH)?;
        if page.ends.is_empty() {
            return Ok(());
        }
        let (mut puts, mut deletes) = (Packed::new(), Packed::new());
        for (key, stored) in page.entries() {
            match tag.decode_slice(stored, name)? {
                Some(value) => puts.push_entry(key, value),
                None => deletes.push(key),
            }
        }
        storage::write(&[KeyspaceOps { keyspace: to, ops: vec![Op::PutMany(puts), Op::DeleteMany(deletes)] }], false)?;
    }
}

/// `Some(start..end)` bounds as a `BTreeMap` range argument.
pub fn bounds(start: Option<Vec<u8>>, end: Option<Vec<u8>>) -> (std::ops::Bound<Vec<u8>>, std::ops::Bound<Vec<u8>>) {
    use std::ops::Bound::*;
    (start.map_or(Unbounded, Included), end.map_or(Unbounded, Excluded))
}

/// Checks a range's bounds the way the host does.
pub fn check_range(start: &Option<Vec<u8>>, end: &Option<Vec<u8>>) -> Result<(), Error> {
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(Error::InvalidArgument("range start is after its end".into()));
        }
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;

    #[test]
    fn merge_lays_the_overlay_over_the_base_up_to_the_limit() {
        let base = vec![entry("a", "1"), entry("c", "3"), entry("e", "5")];
        let overlay: Vec<(&[u8], Option<&[u8]>)> =
            vec![(b"b", Some(b"2")), (b"c", None), (b"e", Some(b"55")), (b"f", Some(b""))];
        let all = merge(base.clone().into_iter(), overlay.clone().into_iter(), 10);
        let want = packed(&["a", "1", "b", "2", "e", "55", "f", ""]);
        assert_eq!((all.bytes, all.ends), (want.bytes, want.ends));
        let two = merge(base.into_iter(), overlay.into_iter(), 2);
        let want = packed(&["a", "1", "b", "2"]);
        assert_eq!((two.bytes, two.ends), (want.bytes, want.ends));
    }
}
