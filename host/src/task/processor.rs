//! Processors: the logic that turns an input record into store writes and
//! output records. The built-ins (`kv`, `word-count`), a wasm component
//! ([`super::wasm_processor`]) and a caller's own Rust type all implement the
//! same [`Processor`] trait and see the store through the same
//! [`Context`].
//!
//! A processor reads the store at read-uncommitted (earlier records' writes
//! not yet committed, and this record's own writes, included) and writes
//! absolute values, so the changelog replays idempotently. A record's
//! writes and output are applied when `process` returns `Ok`, all together,
//! in the transaction of the record's input position: after a crash the
//! record is processed again against the store as it was before it.

use super::cache::WriteCache;
use crate::changelog::Record;
use crate::error::{marked, Error, Kind};
use crate::runtime::{Isolation, StoreInstance};
use std::collections::BTreeMap;
use std::ops::Bound;

/// One input record: a line of a file, or a Kafka record.
///
/// ```
/// use txstore::Input;
///
/// let line = Input::Line(b"apple\t3");
/// let record = Input::Keyed { key: Some(b"apple"), value: Some(b"3") };
/// assert_eq!(line.value(), Some(&b"apple\t3"[..]));
/// assert_eq!(record.key(), Some(&b"apple"[..]));
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A line without its newline.
    Line(&'a [u8]),
    /// A keyed record; `None` value is a tombstone.
    Keyed {
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
    },
}

impl<'a> Input<'a> {
    /// The record's key (a line has none).
    pub fn key(&self) -> Option<&'a [u8]> {
        match self {
            Input::Line(_) => None,
            Input::Keyed { key, .. } => *key,
        }
    }

    /// The record's value: a line is its own value; a tombstone has none.
    pub fn value(&self) -> Option<&'a [u8]> {
        match self {
            Input::Line(line) => Some(line),
            Input::Keyed { value, .. } => *value,
        }
    }
}

/// User logic run by a [`Task`](super::Task): one input record in, store
/// writes and output records out, through the [`Context`].
///
/// `process` must be deterministic in its input and the store (a crash
/// makes the task process a record again, against the store as it was
/// before that record). It returns `Err` to refuse a record: nothing of it
/// is applied and the task stops with [`Error::Processor`].
///
/// ```
/// use txstore::{Context, Error, Input, Processor};
///
/// /// Counts records per key; outputs each new count.
/// struct CountPerKey;
///
/// impl Processor for CountPerKey {
///     fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
///         let Some(key) = input.key() else { return Ok(()) };
///         let n: u64 = match ctx.get(key)? {
///             Some(v) => String::from_utf8_lossy(&v).parse().map_err(Error::processor)?,
///             None => 0,
///         };
///         let count = (n + 1).to_string().into_bytes();
///         ctx.put(key, &count);
///         ctx.emit(key, Some(&count));
///         Ok(())
///     }
/// }
/// # let _ = Box::new(CountPerKey) as Box<dyn Processor>;
/// ```
pub trait Processor: Send {
    /// Processes one record: reads and writes through `ctx`.
    fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error>;
}

impl Error {
    /// A processor's refusal of a record, with its reason.
    ///
    /// ```
    /// use txstore::Error;
    ///
    /// let e = Error::processor("line 7: not a number");
    /// assert!(matches!(e, Error::Processor(_)));
    /// assert_eq!(e.to_string(), "line 7: not a number");
    /// ```
    pub fn processor(why: impl std::fmt::Display) -> Self {
        Error::Processor(marked(Kind::Processor, why.to_string()))
    }
}

/// The store as one record's processing sees it, and what the record
/// writes and outputs.
///
/// Reads are read-uncommitted and see this record's own writes; writes and
/// output are held until `process` returns, then applied together.
///
/// ```
/// use txstore::{Context, Error, Input, Processor};
///
/// /// Keeps the first value seen per key; outputs only first sightings.
/// struct FirstSeen;
///
/// impl Processor for FirstSeen {
///     fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
///         let (Some(key), Some(value)) = (input.key(), input.value()) else { return Ok(()) };
///         if ctx.get(key)?.is_none() {
///             ctx.put(key, value);
///             assert_eq!(ctx.get(key)?.as_deref(), Some(value)); // its own write
///             ctx.emit(key, Some(value));
///         }
///         Ok(())
///     }
/// }
/// # let _ = Box::new(FirstSeen) as Box<dyn Processor>;
/// ```
pub struct Context<'a> {
    store: &'a mut StoreInstance,
    /// Earlier records' writes the task holds for the guest.
    cache: &'a WriteCache,
    /// This record's writes, in order.
    writes: Vec<Record>,
    /// Each written key's latest write, as its index in `writes`: built at
    /// the first read after a write, so a processor that only writes (or
    /// reads before it writes) never pays for it.
    latest: Option<BTreeMap<Vec<u8>, usize>>,
    /// Output records, when the task has an output.
    output: Option<Vec<Record>>,
}

/// Entries a range page holds at most (the host's cursor cap).
pub const MAX_RANGE_PAGE: u32 = 4096;

impl<'a> Context<'a> {
    pub(super) fn new(
        store: &'a mut StoreInstance,
        cache: &'a WriteCache,
        with_output: bool,
    ) -> Self {
        Self {
            store,
            cache,
            writes: Vec::new(),
            latest: None,
            output: with_output.then(Vec::new),
        }
    }

    /// Builds `latest` if a read now needs it.
    fn index(&mut self) {
        if self.latest.is_none() && !self.writes.is_empty() {
            let mut latest = BTreeMap::new();
            for (i, w) in self.writes.iter().enumerate() {
                latest.insert(w.key().to_vec(), i);
            }
            self.latest = Some(latest);
        }
    }

    /// This record's own latest write of `key`: `Some(None)` for a delete
    /// (after [`Context::index`]).
    fn own(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.latest
            .as_ref()?
            .get(key)
            .map(|&i| match &self.writes[i] {
                Record::Put(_, v) => Some(v.as_slice()),
                Record::Delete(_) => None,
            })
    }

    /// The latest write of `key` the guest has not seen yet: this
    /// record's own, else an earlier record's in the task's cache.
    fn unseen(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.own(key).or_else(|| self.cache.latest(key))
    }

    /// The value of `key`, or `None`.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_line(b"k\tv", 4)?;
    /// task.process_with(5, |ctx| {
    ///     assert_eq!(ctx.get(b"k")?.as_deref(), Some(&b"v"[..]));
    ///     Ok(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.index();
        if let Some(unseen) = self.unseen(key) {
            return Ok(unseen.map(<[u8]>::to_vec));
        }
        Ok(self.store.get(key, Isolation::ReadUncommitted)?)
    }

    /// The values of `keys`, in the order asked (one guest call for the
    /// keys this record has not written).
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_with(1, |ctx| {
    ///     ctx.put(b"a", b"1");
    ///     let got = ctx.get_many(&[b"a".to_vec(), b"b".to_vec()])?;
    ///     assert_eq!(got, vec![Some(b"1".to_vec()), None]);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_many<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        self.index();
        // Only the keys the store must answer are copied.
        let ask: Vec<Vec<u8>> = keys
            .iter()
            .map(AsRef::as_ref)
            .filter(|k| self.unseen(k).is_none())
            .map(<[u8]>::to_vec)
            .collect();
        let mut stored = self
            .store
            .get_many(&ask, Isolation::ReadUncommitted)?
            .into_iter();
        Ok(keys
            .iter()
            .map(|k| match self.unseen(k.as_ref()) {
                Some(unseen) => unseen.map(<[u8]>::to_vec),
                None => stored.next().expect("one answer per key asked"),
            })
            .collect())
    }

    /// Up to `limit` (at most [`MAX_RANGE_PAGE`]) entries with keys in
    /// [`start`, `end`), in key order; fewer than `limit` means the range
    /// holds no more. Page on with `start` = last key + `0x00`.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_line(b"a\t1", 4)?;
    /// task.process_line(b"b\t2", 8)?;
    /// task.process_with(9, |ctx| {
    ///     ctx.delete(b"a");
    ///     ctx.put(b"c", b"3");
    ///     let page = ctx.range(None, None, 10)?;
    ///     assert_eq!(page, vec![(b"b".to_vec(), b"2".to_vec()), (b"c".to_vec(), b"3".to_vec())]);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn range(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
        self.index();
        let limit = limit.min(MAX_RANGE_PAGE) as usize;
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut next = start.map(<[u8]>::to_vec);
        while out.len() < limit {
            let page = self.store.range(
                next.as_deref(),
                end,
                Isolation::ReadUncommitted,
                limit as u32,
            )?;
            let full = page.len() == limit;
            // The stored page covers [next, its last key] when full, else
            // [next, end): this record's writes in that window overlay it.
            let window_end = if full {
                page.last().map(|(k, _)| k.clone())
            } else {
                None
            };
            let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = page.into_iter().collect();
            // Earlier records' cached writes in the window, then this
            // record's own on top.
            let upper = match (&window_end, end) {
                (Some(last), _) => Bound::Included(last.as_slice()),
                (None, Some(end)) => Bound::Excluded(end),
                (None, None) => Bound::Unbounded,
            };
            let lower_cached = next.as_deref().map_or(Bound::Unbounded, Bound::Included);
            self.cache.overlay(&mut merged, lower_cached, upper);
            let lower = match &next {
                Some(k) => std::ops::Bound::Included(k.clone()),
                None => std::ops::Bound::Unbounded,
            };
            let own = self
                .latest
                .iter()
                .flat_map(|l| l.range((lower.clone(), std::ops::Bound::Unbounded)));
            for (k, &i) in own {
                let inside = match (&window_end, end) {
                    (Some(last), _) => k <= last,
                    (None, Some(end)) => k.as_slice() < end,
                    (None, None) => true,
                };
                if !inside {
                    break;
                }
                match &self.writes[i] {
                    Record::Put(_, v) => merged.insert(k.clone(), v.clone()),
                    Record::Delete(_) => merged.remove(k),
                };
            }
            out.extend(merged);
            match window_end {
                Some(mut last) if full => {
                    last.push(0);
                    next = Some(last);
                }
                _ => break,
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Sets `key` to `value`.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_with(1, |ctx| Ok(ctx.put(b"k", b"v")))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        if let Some(latest) = &mut self.latest {
            latest.insert(key.to_vec(), self.writes.len());
        }
        self.writes.push(Record::Put(key.to_vec(), value.to_vec()));
    }

    /// Removes `key` (removing an absent key is not an error).
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_with(1, |ctx| Ok(ctx.delete(b"never-written")))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn delete(&mut self, key: &[u8]) {
        if let Some(latest) = &mut self.latest {
            latest.insert(key.to_vec(), self.writes.len());
        }
        self.writes.push(Record::Delete(key.to_vec()));
    }

    /// Outputs a record: `value` under `key`, or a tombstone for `None`.
    /// Dropped when the task has no output.
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_with(1, |ctx| {
    ///     assert!(!ctx.has_output()); // no output configured: emit drops it
    ///     ctx.emit(b"k", Some(b"v"));
    ///     Ok(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn emit(&mut self, key: &[u8], value: Option<&[u8]>) {
        if let Some(out) = &mut self.output {
            out.push(match value {
                Some(v) => Record::Put(key.to_vec(), v.to_vec()),
                None => Record::Delete(key.to_vec()),
            });
        }
    }

    /// True when output records go somewhere (else [`Context::emit`]
    /// drops them, and a processor may skip building them).
    ///
    /// ```
    /// use txstore::TaskBuilder;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
    /// task.process_with(1, |ctx| Ok(assert!(!ctx.has_output())))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn has_output(&self) -> bool {
        self.output.is_some()
    }

    /// The record's writes and output.
    pub(crate) fn finish(self) -> (Vec<Record>, Vec<Record>) {
        (self.writes, self.output.unwrap_or_default())
    }
}

/// `key<TAB>value` puts `value`; a line without a tab deletes `key`. A
/// keyed record puts its value under its key; a null value deletes it (a
/// record without a key changes nothing). Outputs each change.
pub struct Kv;

impl Processor for Kv {
    fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
        let (key, value) = match input {
            Input::Line(line) => match line.iter().position(|&b| b == b'\t') {
                Some(i) => (&line[..i], Some(&line[i + 1..])),
                None => (line, None),
            },
            Input::Keyed { key: None, .. } => return Ok(()),
            Input::Keyed {
                key: Some(k),
                value,
            } => (k, value),
        };
        match value {
            Some(v) => ctx.put(key, v),
            None => ctx.delete(key),
        }
        ctx.emit(key, value);
        Ok(())
    }
}

/// Counts words: maximal runs of Unicode letters and digits
/// (`char::is_alphanumeric`), lowercased (Unicode), as UTF-8; bytes that
/// are not UTF-8 separate words. So "Café naïve Über straße" counts `café`,
/// `naïve`, `über`, `straße`. A count is stored as decimal text.
/// Read-modify-write, so applying a record twice shows as a wrong count.
/// Outputs each touched word's new count.
pub struct WordCount;

/// The words of `line`, as `word_count` defines them.
pub fn words(line: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    line.utf8_chunks().flat_map(|chunk| {
        chunk
            .valid()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| w.to_lowercase().into_bytes())
    })
}

impl Processor for WordCount {
    fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
        // A Kafka record's value is the line; its key plays no part.
        let line = input.value().unwrap_or_default();
        let mut counts: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for w in words(line) {
            *counts.entry(w).or_default() += 1;
        }
        if counts.is_empty() {
            return Ok(());
        }
        let keys: Vec<&[u8]> = counts.keys().map(Vec::as_slice).collect();
        let current = ctx.get_many(&keys)?;
        for ((word, n), old) in counts.into_iter().zip(current) {
            let old = old
                .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
            let count = (old + n).to_string().into_bytes();
            ctx.put(&word, &count);
            ctx.emit(&word, Some(&count));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_unicode_letters_and_digits_lowercased() {
        let got: Vec<String> =
            words("Café naïve Über straße, ASCII-only 42x \u{2014} x".as_bytes())
                .map(|w| String::from_utf8(w).unwrap())
                .collect();
        assert_eq!(
            got,
            ["café", "naïve", "über", "straße", "ascii", "only", "42x", "x"]
        );
        // Bytes that are not UTF-8 separate words, as punctuation does.
        let got: Vec<Vec<u8>> = words(b"ab\xffcd").collect();
        assert_eq!(got, [b"ab".to_vec(), b"cd".to_vec()]);
    }
    use crate::runtime::{GuestSource, Limits, Runtime};
    use crate::storage::{Backend, MemoryBackend};

    /// A `buffered` store holding `committed`, committed at offset 1.
    fn store(committed: &[(&str, &str)]) -> StoreInstance {
        let runtime = Runtime::new(None).unwrap();
        let guest = runtime
            .load(&GuestSource::Builtin("buffered".into()))
            .unwrap();
        let backend = MemoryBackend::new();
        let storage = backend.open_store("t").unwrap();
        let mut s = guest.instantiate(storage, "t", &Limits::default()).unwrap();
        s.init(&[]).unwrap();
        s.recover(None).unwrap();
        for (k, v) in committed {
            s.put(k.as_bytes(), v.as_bytes()).unwrap();
        }
        s.commit(1).unwrap();
        s
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// A record's reads see its own puts and deletes before they reach the
    /// store: point reads, batched reads and ranges alike.
    #[test]
    fn reads_see_the_records_own_writes() {
        let mut s = store(&[("a", "1"), ("b", "2"), ("c", "3")]);
        let cache = WriteCache::new(0);
        let mut ctx = Context::new(&mut s, &cache, false);
        ctx.put(b"b", b"20");
        ctx.delete(b"c");
        ctx.put(b"d", b"4");
        ctx.put(b"d", b"40");
        assert_eq!(ctx.get(b"b").unwrap().as_deref(), Some(&b"20"[..]));
        assert_eq!(ctx.get(b"c").unwrap(), None);
        assert_eq!(ctx.get(b"d").unwrap().as_deref(), Some(&b"40"[..]));
        let keys: Vec<Vec<u8>> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        let got = ctx.get_many(&keys).unwrap();
        let want = [Some("1"), Some("20"), None, Some("40"), None]
            .map(|v| v.map(|v| v.as_bytes().to_vec()));
        assert_eq!(got, want);
        let all = kv(&[("a", "1"), ("b", "20"), ("d", "40")]);
        assert_eq!(ctx.range(None, None, 100).unwrap(), all);
        assert_eq!(ctx.range(Some(b"b"), Some(b"d"), 100).unwrap(), all[1..2]);
        assert_eq!(ctx.range(None, None, 2).unwrap(), all[..2]);
        assert_eq!(ctx.range(Some(b"b\0"), None, 2).unwrap(), all[2..]);
        // A write after the reads is seen by the next read too.
        ctx.delete(b"a");
        ctx.put(b"e", b"5");
        assert_eq!(ctx.get(b"a").unwrap(), None);
        assert_eq!(ctx.get(b"e").unwrap().as_deref(), Some(&b"5"[..]));
        let (writes, output) = ctx.finish();
        assert_eq!(writes.len(), 6);
        assert!(output.is_empty(), "no output configured, nothing kept");
        // Nothing reached the store.
        assert_eq!(
            s.get(b"b", Isolation::ReadUncommitted).unwrap().as_deref(),
            Some(&b"2"[..])
        );
    }

    /// A page must not come back short while entries remain, even when
    /// the record deleted every stored entry of the first window.
    #[test]
    fn a_range_page_is_full_when_own_deletes_empty_a_window() {
        let keys: Vec<String> = (0..10).map(|i| format!("k{i:02}")).collect();
        let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
        let mut s = store(&pairs);
        let cache = WriteCache::new(0);
        let mut ctx = Context::new(&mut s, &cache, true);
        for k in &keys[..5] {
            ctx.delete(k.as_bytes());
        }
        ctx.put(b"k055", b"new");
        let page = ctx.range(None, None, 3).unwrap();
        assert_eq!(page, kv(&[("k05", "v"), ("k055", "new"), ("k06", "v")]));
        ctx.emit(b"k", None);
        assert_eq!(ctx.finish().1, vec![Record::Delete(b"k".to_vec())]);
    }
}
