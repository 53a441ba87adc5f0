//! The seeded workload and its oracle. A workload is a list of steps; the
//! task's input position is the number of steps done, so the changelog's
//! committed input position says exactly which steps the store must hold.
//! The model is a plain ordered map folded over the steps: it knows nothing
//! of guests, changelogs or RocksDB.

use crate::changelog::Record;
use crate::runtime::Isolation;
use std::collections::BTreeMap;

/// SplitMix64. Fixed here rather than taken from a crate so that a
/// reproducer line (`--seed S`) means the same workload in every version.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One step of a workload.
#[derive(Clone, Debug)]
pub enum Step {
    /// One input record: its writes go in together.
    Write(Vec<Record>),
    /// An explicit commit (two in a row make an empty transaction).
    Commit,
    /// A point read, checked against the model at `isolation`.
    Read(Vec<u8>, Isolation),
    /// A range read of [start, end), checked likewise.
    Range(Option<Vec<u8>>, Option<Vec<u8>>, Isolation),
}

/// Keys: text and binary, with zero and 0xff bytes, few enough that
/// overwrites and deletes of live keys are common.
fn key(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0 => vec![0],
        1 => vec![0, 0, rng.below(4) as u8],
        2 => vec![0xff, rng.below(4) as u8],
        3 => vec![0x80, 0x00, 0x7f],
        _ => format!("k{:02}", rng.below(20)).into_bytes(),
    }
}

/// Values: mostly small, some empty, a few large enough to force early
/// commits past the conformance task's uncommitted limit.
fn value(rng: &mut Rng, step: usize) -> Vec<u8> {
    let len = match rng.below(100) {
        0..=4 => 0,
        5..=7 => 16 << 10 | rng.below(16 << 10) as usize,
        _ => rng.below(40) as usize,
    };
    let tag = format!("s{step}:");
    let mut v = tag.into_bytes();
    v.extend((0..len).map(|i| (i as u64 * 31 + rng.below(256)) as u8));
    v
}

fn isolation(rng: &mut Rng) -> Isolation {
    if rng.chance(50) {
        Isolation::ReadCommitted
    } else {
        Isolation::ReadUncommitted
    }
}

/// The workload for `seed`: `len` steps.
pub fn generate(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    (0..len)
        .map(|i| match rng.below(100) {
            0..=54 => {
                let n = 1 + rng.below(3) as usize;
                Step::Write(
                    (0..n)
                        .map(|_| {
                            if rng.chance(25) {
                                Record::Delete(key(&mut rng))
                            } else {
                                Record::Put(key(&mut rng), value(&mut rng, i))
                            }
                        })
                        .collect(),
                )
            }
            55..=64 => Step::Commit,
            65..=89 => Step::Read(key(&mut rng), isolation(&mut rng)),
            _ => {
                let (a, b) = (key(&mut rng), key(&mut rng));
                let (start, end) = if a <= b { (a, b) } else { (b, a) };
                let start = rng.chance(80).then_some(start);
                let end = rng.chance(80).then_some(end);
                Step::Range(start, end, isolation(&mut rng))
            }
        })
        .collect()
}

/// The oracle: the store's contents as an ordered map.
pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

pub fn apply(model: &mut Model, records: &[Record]) {
    for r in records {
        match r {
            Record::Put(k, v) => {
                model.insert(k.clone(), v.clone());
            }
            Record::Delete(k) => {
                model.remove(k);
            }
        }
    }
}

/// The state after the first `done` steps.
pub fn model_at(steps: &[Step], done: usize) -> Model {
    let mut model = Model::new();
    for step in &steps[..done] {
        if let Step::Write(records) = step {
            apply(&mut model, records);
        }
    }
    model
}

/// The entries of `model` in [start, end).
pub fn range(model: &Model, start: Option<&[u8]>, end: Option<&[u8]>) -> Vec<(Vec<u8>, Vec<u8>)> {
    model
        .iter()
        .filter(|(k, _)| {
            start.is_none_or(|s| k.as_slice() >= s) && end.is_none_or(|e| k.as_slice() < e)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_workload_and_every_kind_of_step() {
        let a = format!("{:?}", generate(7, 300));
        assert_eq!(a, format!("{:?}", generate(7, 300)));
        assert_ne!(a, format!("{:?}", generate(8, 300)));
        let steps = generate(7, 300);
        assert!(steps.iter().any(|s| matches!(s, Step::Commit)));
        assert!(steps.iter().any(|s| matches!(s, Step::Range(..))));
        assert!(steps.iter().any(
            |s| matches!(s, Step::Write(r) if r.iter().any(|r| matches!(r, Record::Delete(_))))
        ));
        assert!(steps.iter().any(
            |s| matches!(s, Step::Write(r) if r.iter().any(|r| r.key().first() == Some(&0xff)))
        ));
    }

    #[test]
    fn model_folds_writes_in_order() {
        let steps = vec![
            Step::Write(vec![Record::Put(b"a".to_vec(), b"1".to_vec())]),
            Step::Write(vec![
                Record::Put(b"a".to_vec(), b"2".to_vec()),
                Record::Delete(b"b".to_vec()),
            ]),
            Step::Write(vec![Record::Delete(b"a".to_vec())]),
        ];
        assert_eq!(model_at(&steps, 2).get(&b"a"[..]), Some(&b"2".to_vec()));
        assert!(model_at(&steps, 3).is_empty());
    }
}
