//! Processors turn an input record into store writes. They read the store
//! at read-uncommitted (their own earlier writes included), and return
//! absolute values, so the changelog can be replayed idempotently. The
//! built-ins' output records are their writes: word count emits each
//! touched word's new count, kv the change.

use crate::changelog::Record;
use crate::config::ProcessorKind;
use crate::runtime::{CallError, Isolation, StoreInstance};
use std::collections::BTreeMap;

/// One input record: a line of a file, or a Kafka record.
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

pub trait Processor: Send {
    /// The writes for one input record.
    fn process(
        &mut self,
        input: Input<'_>,
        store: &mut StoreInstance,
    ) -> Result<Vec<Record>, CallError>;
}

pub fn new(kind: ProcessorKind) -> Box<dyn Processor> {
    match kind {
        ProcessorKind::Kv => Box::new(Kv),
        ProcessorKind::WordCount => Box::new(WordCount),
    }
}

/// `key<TAB>value` puts `value`; a line without a tab deletes `key`. A
/// keyed record puts its value under its key; a null value deletes it (a
/// record without a key changes nothing).
pub struct Kv;

impl Processor for Kv {
    fn process(
        &mut self,
        input: Input<'_>,
        _store: &mut StoreInstance,
    ) -> Result<Vec<Record>, CallError> {
        Ok(match input {
            Input::Line(line) => vec![match line.iter().position(|&b| b == b'\t') {
                Some(i) => Record::Put(line[..i].to_vec(), line[i + 1..].to_vec()),
                None => Record::Delete(line.to_vec()),
            }],
            Input::Keyed { key: None, .. } => Vec::new(),
            Input::Keyed {
                key: Some(k),
                value: Some(v),
            } => vec![Record::Put(k.to_vec(), v.to_vec())],
            Input::Keyed {
                key: Some(k),
                value: None,
            } => vec![Record::Delete(k.to_vec())],
        })
    }
}

/// Counts words: maximal runs of ASCII letters and digits, lowercased. A
/// count is stored as decimal text. Read-modify-write, so applying a record
/// twice shows as a wrong count.
pub struct WordCount;

/// The words of `line`, as `word_count` defines them.
pub fn words(line: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    line.split(|b| !b.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_lowercase())
}

impl Processor for WordCount {
    fn process(
        &mut self,
        input: Input<'_>,
        store: &mut StoreInstance,
    ) -> Result<Vec<Record>, CallError> {
        // A Kafka record's value is the line; its key plays no part.
        let line = match input {
            Input::Line(line) => line,
            Input::Keyed { value, .. } => value.unwrap_or_default(),
        };
        let mut counts: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for w in words(line) {
            *counts.entry(w).or_default() += 1;
        }
        if counts.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Vec<u8>> = counts.keys().cloned().collect();
        let current = store.get_many(&keys, Isolation::ReadUncommitted)?;
        Ok(counts
            .into_iter()
            .zip(current)
            .map(|((word, n), old)| {
                let old = old
                    .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
                    .unwrap_or(0);
                Record::Put(word, (old + n).to_string().into_bytes())
            })
            .collect())
    }
}
