//! Test only: word counts through the batched `state` calls of WIT 0.2.0,
//! so the host's packed `state` (get-many, put-many, delete-many, range)
//! is held to an independent oracle (tests/integration/processors.rs).
//!
//! Each input line is words separated by spaces:
//! - `w`: one more of word `w`; a line's words are read with ONE
//!   `get-many` (in the order they appear, repeats asked again) and
//!   written with ONE `put-many` (sorted), outputting `w<TAB>count` each;
//! - `-w`: the line's deletes go in ONE `delete-many` (as they appear),
//!   outputting a tombstone `w` per distinct word, sorted, after the counts;
//! - `?p`: the number of stored keys that start with `p`, counted through
//!   `range` in pages of 2 (so paging and this line's own writes show),
//!   output as `?p<TAB>n`;
//! - `!bad`: a `put-many` whose offsets run past its buffer must be
//!   refused with `invalid-argument`, output as `!bad<TAB>refused`.

wit_bindgen::generate!({ path: "../../wit", world: "processor" });

use exports::txstore::store::record_processor::{Guest, Input, Output};
use std::collections::BTreeMap;
use txstore::store::state;
use txstore::store::types::{Error, Packed};

fn pack<'a>(strings: impl IntoIterator<Item = &'a [u8]>) -> Packed {
    let mut p = Packed { bytes: Vec::new(), ends: Vec::new() };
    for s in strings {
        p.bytes.extend_from_slice(s);
        p.ends.push(p.bytes.len() as u32);
    }
    p
}

fn strings(p: &Packed) -> Vec<&[u8]> {
    let mut at = 0;
    p.ends
        .iter()
        .map(|&end| {
            let s = &p.bytes[at..end as usize];
            at = end as usize;
            s
        })
        .collect()
}

fn failed(call: &str, e: Error) -> String {
    format!("state.{call} failed: {e:?}")
}

/// Stored keys starting with `prefix`, paged 2 at a time.
fn count_prefix(prefix: &[u8]) -> Result<u64, String> {
    let mut start = prefix.to_vec();
    let mut n = 0;
    loop {
        let page = state::range(Some(&start), None, 2).map_err(|e| failed("range", e))?;
        let s = strings(&page);
        for pair in s.chunks(2) {
            if !pair[0].starts_with(prefix) {
                return Ok(n);
            }
            n += 1;
        }
        if s.len() < 4 {
            return Ok(n);
        }
        start = s[s.len() - 2].to_vec();
        start.push(0);
    }
}

struct Batch;

impl Guest for Batch {
    fn init(options: Vec<(String, String)>) -> Result<(), String> {
        match options.first() {
            Some((name, _)) => Err(format!("unknown option `{name}`")),
            None => Ok(()),
        }
    }

    fn process(record: Input) -> Result<Vec<Output>, String> {
        let line = record.value.unwrap_or_default();
        let words: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|w| !w.is_empty()).collect();
        let plain: Vec<&[u8]> =
            words.iter().copied().filter(|w| !matches!(w[0], b'-' | b'?' | b'!')).collect();
        let mut out = Vec::new();

        let answers = state::get_many(&pack(plain.iter().copied())).map_err(|e| failed("get-many", e))?;
        let values = strings(&answers.values);
        if values.len() != plain.len() || answers.found.len() != plain.len() {
            return Err(format!("get-many answered {} of {} keys", values.len(), plain.len()));
        }
        let mut counts: BTreeMap<&[u8], u64> = BTreeMap::new();
        for (i, w) in plain.iter().enumerate() {
            let old = if answers.found[i] {
                std::str::from_utf8(values[i]).ok().and_then(|v| v.parse().ok()).ok_or("a count that is not a number")?
            } else {
                0
            };
            *counts.entry(w).or_insert(old) += 1;
        }
        let texts: Vec<(&[u8], Vec<u8>)> =
            counts.iter().map(|(w, n)| (*w, n.to_string().into_bytes())).collect();
        state::put_many(&pack(texts.iter().flat_map(|(w, n)| [*w, &n[..]])))
            .map_err(|e| failed("put-many", e))?;
        for (w, n) in texts {
            out.push(Output { key: w.to_vec(), value: Some(n) });
        }

        let deletes: Vec<&[u8]> = words.iter().filter(|w| w[0] == b'-').map(|w| &w[1..]).collect();
        state::delete_many(&pack(deletes.iter().copied())).map_err(|e| failed("delete-many", e))?;
        let distinct: std::collections::BTreeSet<&[u8]> = deletes.into_iter().collect();
        for w in distinct {
            out.push(Output { key: w.to_vec(), value: None });
        }

        for w in words.iter().filter(|w| matches!(w[0], b'?' | b'!')) {
            let answer = if w[0] == b'?' {
                count_prefix(&w[1..])?.to_string()
            } else {
                let bad = Packed { bytes: b"k".to_vec(), ends: vec![1, 9] };
                match state::put_many(&bad) {
                    Err(Error::InvalidArgument(_)) => "refused".to_string(),
                    other => return Err(format!("a malformed put-many was answered {other:?}")),
                }
            };
            out.push(Output { key: w.to_vec(), value: Some(answer.into_bytes()) });
        }
        Ok(out)
    }
}

export!(Batch);
