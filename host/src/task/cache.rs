//! The host's write cache: the writes of the records processed since the
//! last flush, each key's latest only, handed to the guest in one call (as
//! Kafka Streams' record cache sits in front of its stores). A put costs a
//! map insert here instead of a component call.
//!
//! Rules that keep the contract (see `Task::flush_cache`):
//! - the cache holds puts only or deletes only, so one flush is one guest
//!   call, all or nothing (a guest may refuse it with `uncommitted-limit`
//!   and the host can still commit at the cache's start);
//! - the cached records' changelog appends and outputs wait with their
//!   writes: an early commit at the cache's start must not carry them;
//! - reads at read-uncommitted see the cache first.

use crate::changelog::Record;
use crate::runtime::EntryRef;
use std::collections::BTreeMap;
use std::ops::Bound;

/// What the cache counts per write on top of key and value (the map entry
/// and the record), as guests count theirs.
const WRITE_OVERHEAD: usize = 64;

/// Where the input stands at a record boundary: position and checksum.
pub(crate) type Boundary = (u64, Option<u32>);

pub(crate) struct WriteCache {
    max_bytes: usize,
    /// The cached records' writes, in order.
    writes: Vec<Record>,
    /// The cached records' output, in order.
    outputs: Vec<Record>,
    /// Per cached record: where its writes and output end, and the
    /// boundary it ends at.
    records: Vec<Cached>,
    /// Each written key's latest write, as its index in `writes`.
    latest: BTreeMap<Vec<u8>, usize>,
    /// The boundary the first cached record starts at.
    start: Boundary,
    bytes: usize,
    /// Whether the writes held are puts (else deletes).
    puts: bool,
}

struct Cached {
    writes_end: usize,
    outputs_end: usize,
    end: Boundary,
}

/// One cached record, taken back out for the per-record path.
pub(crate) struct CachedRecord {
    pub start: Boundary,
    pub writes: Vec<Record>,
    pub outputs: Vec<Record>,
}

/// The guest call a flush makes: each key's latest write, in key order.
pub(crate) enum Batch<'a> {
    Puts(Vec<EntryRef<'a>>),
    Deletes(Vec<&'a [u8]>),
}

/// Whether a record's writes are all puts, all deletes, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    None,
    Puts,
    Deletes,
    Mixed,
}

pub(crate) fn shape(writes: &[Record]) -> Shape {
    let puts = writes
        .iter()
        .filter(|w| matches!(w, Record::Put(..)))
        .count();
    match (puts, writes.len()) {
        (_, 0) => Shape::None,
        (p, n) if p == n => Shape::Puts,
        (0, _) => Shape::Deletes,
        _ => Shape::Mixed,
    }
}

impl WriteCache {
    /// A cache that asks for a flush at `max_bytes` (0: every record).
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            writes: Vec::new(),
            outputs: Vec::new(),
            records: Vec::new(),
            latest: BTreeMap::new(),
            start: (0, None),
            bytes: 0,
            puts: true,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records cached.
    pub fn records(&self) -> u64 {
        self.records.len() as u64
    }

    /// Writes cached (every record's, not only each key's latest).
    pub fn writes(&self) -> u64 {
        self.writes.len() as u64
    }

    /// Bytes cached, counted as guests count theirs.
    pub fn bytes(&self) -> u64 {
        self.bytes as u64
    }

    pub fn start(&self) -> Boundary {
        self.start
    }

    /// Whether a record of `shape` may join without a flush first: the
    /// cache keeps one kind of write, and a record with both kinds goes to
    /// the guest on its own.
    pub fn takes(&self, shape: Shape) -> bool {
        match shape {
            Shape::None => true,
            Shape::Mixed => false,
            Shape::Puts => self.writes.is_empty() || self.puts,
            Shape::Deletes => self.writes.is_empty() || !self.puts,
        }
    }

    /// Caches one record (whose shape [`WriteCache::takes`] accepted) that
    /// starts at `start` and ends at `end`.
    pub fn push(
        &mut self,
        writes: Vec<Record>,
        outputs: Vec<Record>,
        start: Boundary,
        end: Boundary,
    ) {
        debug_assert!(self.takes(shape(&writes)));
        if self.records.is_empty() {
            self.start = start;
        }
        for w in writes {
            if self.writes.is_empty() {
                self.puts = matches!(w, Record::Put(..));
            }
            self.bytes += WRITE_OVERHEAD
                + match &w {
                    Record::Put(k, v) => k.len() + v.len(),
                    Record::Delete(k) => k.len(),
                };
            // A key written again replaces its entry; the old record stays
            // in `writes` for the per-record path.
            match self.latest.get_mut(w.key()) {
                Some(i) => *i = self.writes.len(),
                None => {
                    self.latest.insert(w.key().to_vec(), self.writes.len());
                }
            }
            self.writes.push(w);
        }
        self.outputs.extend(outputs);
        self.records.push(Cached {
            writes_end: self.writes.len(),
            outputs_end: self.outputs.len(),
            end,
        });
    }

    /// Whether the cache holds as much as it may.
    pub fn full(&self) -> bool {
        self.bytes >= self.max_bytes
    }

    /// The latest cached write of `key`: `Some(None)` for a delete.
    pub fn latest(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.latest.get(key).map(|&i| value(&self.writes[i]))
    }

    /// Applies the cached writes with keys in (`lower`, `upper`) to
    /// `entries` (a page of what the guest holds there).
    pub fn overlay(
        &self,
        entries: &mut BTreeMap<Vec<u8>, Vec<u8>>,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
    ) {
        for (k, &i) in self.latest.range::<[u8], _>((lower, upper)) {
            match value(&self.writes[i]) {
                Some(v) => entries.insert(k.clone(), v.to_vec()),
                None => entries.remove(k),
            };
        }
    }

    /// The one guest call that applies the cache.
    pub fn batch(&self) -> Batch<'_> {
        if self.puts {
            Batch::Puts(
                self.latest
                    .iter()
                    .map(|(key, &i)| EntryRef {
                        key: key.as_slice(),
                        value: value(&self.writes[i]).expect("a put cache holds puts"),
                    })
                    .collect(),
            )
        } else {
            Batch::Deletes(self.latest.keys().map(Vec::as_slice).collect())
        }
    }

    /// Empties the cache after its batch was applied: each key's latest
    /// write in key order (what the changelog takes), and the output.
    pub fn take_applied(&mut self) -> (Vec<Record>, Vec<Record>) {
        let mut writes = std::mem::take(&mut self.writes);
        let applied = std::mem::take(&mut self.latest)
            .into_values()
            .map(|i| std::mem::replace(&mut writes[i], Record::Delete(Vec::new())))
            .collect();
        let outputs = std::mem::take(&mut self.outputs);
        self.clear();
        (applied, outputs)
    }

    /// Empties the cache into its records, in order, each with all its
    /// writes (for the per-record path when the guest refuses the batch).
    pub fn take_records(&mut self) -> Vec<CachedRecord> {
        let mut writes = std::mem::take(&mut self.writes).into_iter();
        let mut outputs = std::mem::take(&mut self.outputs).into_iter();
        let (mut w_at, mut o_at, mut start) = (0, 0, self.start);
        let records = std::mem::take(&mut self.records)
            .into_iter()
            .map(|c| {
                let r = CachedRecord {
                    start,
                    writes: writes.by_ref().take(c.writes_end - w_at).collect(),
                    outputs: outputs.by_ref().take(c.outputs_end - o_at).collect(),
                };
                (w_at, o_at, start) = (c.writes_end, c.outputs_end, c.end);
                r
            })
            .collect();
        self.clear();
        records
    }

    fn clear(&mut self) {
        self.writes.clear();
        self.outputs.clear();
        self.records.clear();
        self.latest.clear();
        self.bytes = 0;
    }
}

fn value(w: &Record) -> Option<&[u8]> {
    match w {
        Record::Put(_, v) => Some(v),
        Record::Delete(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str) -> Record {
        Record::Put(k.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    fn del(k: &str) -> Record {
        Record::Delete(k.as_bytes().to_vec())
    }

    #[test]
    fn a_record_is_shaped_by_its_kinds_of_write() {
        assert_eq!(shape(&[]), Shape::None);
        assert_eq!(shape(&[put("a", "1"), put("b", "2")]), Shape::Puts);
        assert_eq!(shape(&[del("a")]), Shape::Deletes);
        assert_eq!(shape(&[put("a", "1"), del("b")]), Shape::Mixed);
    }

    /// One kind at a time: a flush is one all-or-nothing guest call.
    #[test]
    fn the_cache_holds_one_kind_of_write() {
        let mut c = WriteCache::new(1 << 20);
        assert!(c.takes(Shape::Puts) && c.takes(Shape::Deletes));
        assert!(!c.takes(Shape::Mixed));
        c.push(vec![put("a", "1")], vec![], (0, None), (1, None));
        assert!(c.takes(Shape::Puts) && c.takes(Shape::None));
        assert!(!c.takes(Shape::Deletes));
        let mut d = WriteCache::new(1 << 20);
        d.push(vec![del("a")], vec![], (0, None), (1, None));
        assert!(d.takes(Shape::Deletes) && !d.takes(Shape::Puts));
    }

    /// The batch is each key's latest write in key order; reads see it.
    #[test]
    fn the_latest_write_of_each_key_is_read_and_flushed() {
        let mut c = WriteCache::new(1 << 20);
        c.push(
            vec![put("b", "1"), put("a", "1")],
            vec![put("o", "1")],
            (10, Some(7)),
            (20, None),
        );
        c.push(vec![put("b", "2")], vec![], (20, None), (30, None));
        assert_eq!(c.latest(b"b"), Some(Some(&b"2"[..])));
        assert_eq!(c.latest(b"c"), None);
        assert_eq!((c.records(), c.start()), (2, (10, Some(7))));
        let Batch::Puts(entries) = c.batch() else {
            panic!("puts")
        };
        let got: Vec<_> = entries.iter().map(|e| (e.key, e.value)).collect();
        assert_eq!(got, vec![(&b"a"[..], &b"1"[..]), (&b"b"[..], &b"2"[..])]);
        let (applied, outputs) = c.take_applied();
        assert_eq!(applied, vec![put("a", "1"), put("b", "2")]);
        assert_eq!(outputs, vec![put("o", "1")]);
        assert!(c.is_empty() && c.bytes() == 0 && c.latest(b"a").is_none());
    }

    #[test]
    fn deletes_are_read_as_absent_and_overlay_a_page() {
        let mut c = WriteCache::new(1 << 20);
        c.push(vec![del("b"), del("d")], vec![], (0, None), (1, None));
        assert_eq!(c.latest(b"b"), Some(None));
        let mut page: BTreeMap<Vec<u8>, Vec<u8>> = [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        // d is outside the window [a, d): it stays.
        c.overlay(&mut page, Bound::Included(b"a"), Bound::Excluded(b"d"));
        let keys: Vec<_> = page.keys().map(|k| k.as_slice()).collect();
        assert_eq!(keys, vec![&b"a"[..], b"c", b"d"]);
        let Batch::Deletes(keys) = c.batch() else {
            panic!("deletes")
        };
        assert_eq!(keys, vec![&b"b"[..], b"d"]);
    }

    /// Taken back per record, each record keeps all its writes (not only
    /// the latest) and its own boundaries, for the per-record path.
    #[test]
    fn records_come_back_whole_with_their_boundaries() {
        let mut c = WriteCache::new(1 << 20);
        c.push(
            vec![put("a", "1")],
            vec![put("o", "1")],
            (5, Some(1)),
            (6, Some(2)),
        );
        c.push(vec![], vec![put("o", "2")], (6, Some(2)), (7, Some(3)));
        c.push(
            vec![put("a", "2"), put("b", "1")],
            vec![],
            (7, Some(3)),
            (9, Some(4)),
        );
        let records = c.take_records();
        let got: Vec<_> = records
            .iter()
            .map(|r| (r.start.0, r.writes.len(), r.outputs.len()))
            .collect();
        assert_eq!(got, vec![(5, 1, 1), (6, 0, 1), (7, 2, 0)]);
        assert_eq!(records[2].writes, vec![put("a", "2"), put("b", "1")]);
        assert_eq!(
            (records[1].start, records[2].start),
            ((6, Some(2)), (7, Some(3)))
        );
        assert!(c.is_empty());
    }

    #[test]
    fn the_cache_is_full_at_its_byte_limit() {
        let mut c = WriteCache::new(2 * (WRITE_OVERHEAD as u64 + 2));
        c.push(vec![put("a", "1")], vec![], (0, None), (1, None));
        assert!(!c.full());
        c.push(vec![put("a", "2")], vec![], (1, None), (2, None));
        assert!(c.full());
        assert!(WriteCache::new(0).full());
    }
}
