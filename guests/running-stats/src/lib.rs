//! A processor component: running statistics per key.
//!
//! Each input record carries a key and a number: a line of an input file is
//! `key<TAB>number` (split at the first tab), a Kafka record has the key as
//! its key and the number as its value. The number is a decimal `i64`
//! (an optional `-`, then ASCII digits). A record without a key, a tab or a
//! value, with an empty key or a number that does not parse changes
//! nothing and outputs nothing.
//!
//! The store keeps, under `prefix + key`, the text `count sum min max`;
//! each record updates it and outputs the new text under the key. Read,
//! modify, write: a record applied twice or lost shows in the count.
//!
//! Options (`task.processor_options`): `prefix`, prepended to store keys
//! (default empty).

wit_bindgen::generate!({ path: "../../wit", world: "processor" });

use exports::txstore::store::record_processor::{Guest, Input, Output};
use std::cell::RefCell;
use txstore::store::state;

thread_local! {
    static PREFIX: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// count, sum, min, max.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stats {
    count: u64,
    sum: i128,
    min: i64,
    max: i64,
}

impl Stats {
    fn parse(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?;
        let mut f = text.split(' ');
        let s = Stats {
            count: f.next()?.parse().ok()?,
            sum: f.next()?.parse().ok()?,
            min: f.next()?.parse().ok()?,
            max: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(s)
    }

    fn add(old: Option<Stats>, n: i64) -> Stats {
        match old {
            None => Stats { count: 1, sum: n as i128, min: n, max: n },
            Some(s) => Stats { count: s.count + 1, sum: s.sum + n as i128, min: s.min.min(n), max: s.max.max(n) },
        }
    }

    fn text(&self) -> Vec<u8> {
        format!("{} {} {} {}", self.count, self.sum, self.min, self.max).into_bytes()
    }
}

/// A decimal i64: optional `-`, then one or more ASCII digits.
fn parse_i64(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// The record's key and number text.
fn split(record: &Input) -> Option<(&[u8], &[u8])> {
    let value = record.value.as_deref()?;
    match &record.key {
        Some(key) => Some((key, value)),
        None => {
            let tab = value.iter().position(|&b| b == b'\t')?;
            Some((&value[..tab], &value[tab + 1..]))
        }
    }
}

struct RunningStats;

impl Guest for RunningStats {
    fn init(options: Vec<(String, String)>) -> Result<(), String> {
        for (name, value) in options {
            match name.as_str() {
                "prefix" => PREFIX.with(|p| *p.borrow_mut() = value.into_bytes()),
                other => return Err(format!("unknown option `{other}` (known: prefix)")),
            }
        }
        Ok(())
    }

    fn process(record: Input) -> Result<Vec<Output>, String> {
        let Some((key, number)) = split(&record) else {
            return Ok(Vec::new());
        };
        let Some(n) = parse_i64(number).filter(|_| !key.is_empty()) else {
            return Ok(Vec::new());
        };
        let mut stored = PREFIX.with(|p| p.borrow().clone());
        stored.extend_from_slice(key);
        let old = match state::get(&stored).map_err(|e| format!("state.get failed: {e:?}"))? {
            None => None,
            Some(text) => Some(Stats::parse(&text).ok_or_else(|| {
                format!(
                    "the stored statistics of `{}` are not `count sum min max`: `{}`",
                    key.escape_ascii(),
                    text.escape_ascii()
                )
            })?),
        };
        let text = Stats::add(old, n).text();
        state::put(&stored, &text).map_err(|e| format!("state.put failed: {e:?}"))?;
        Ok(vec![Output { key: key.to_vec(), value: Some(text) }])
    }
}

export!(RunningStats);
