//! The key index of a clean pass: for each key of the dirty range, where
//! its latest record is. See [`super`] for how a pass uses it.
//!
//! An entry is a 64-bit hash of the key (seeded per pass) -> the position
//! of the key's latest record (segment and byte, packed in a u64): 16
//! bytes in the table, no allocation per key. Two keys may share a hash;
//! the entry then holds the later of their latest records, and a record
//! is dropped only after its key is compared with the key at the entry's
//! position (read back from the segment), so a collision keeps records,
//! never drops one that is the latest of its key.

use super::super::frame::{HEADER, KIND_CLEANED, KIND_COMMIT, KIND_DATA};
use super::{data_key, open_frames, Plan};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// A table bucket: the entry (hash, position) and hashbrown's control byte.
const BUCKET_BYTES: usize = std::mem::size_of::<(u64, u64)>() + 1;
/// Packed positions: the segment's index in the plan above, the byte below.
const BYTE_BITS: u32 = 40;
const MAX_SEGMENTS: usize = 1 << (64 - BYTE_BITS);
/// Handles kept open to read keys back (the segments are immutable).
const OPEN_FILES: usize = 32;

/// The most entries an index may hold in `memory_bytes`: the table a std
/// `HashMap` grows to (power-of-two buckets, at most 7/8 full) stays within
/// the bound. Growing into it briefly holds the half-size table as well.
pub fn capacity(memory_bytes: usize) -> usize {
    let fit = memory_bytes / BUCKET_BYTES;
    if fit < 4 {
        return 0;
    }
    let buckets = 1usize << (usize::BITS - 1 - fit.leading_zeros());
    if buckets < 8 {
        buckets - 1
    } else {
        buckets / 8 * 7
    }
}

/// The table's hasher: the keys are hashes already.
#[derive(Default)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

fn fold(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// A fast seeded 64-bit hash of a key (multiply-fold over 8-byte words).
pub fn key_hash(seed: u64, key: &[u8]) -> u64 {
    const K0: u64 = 0xa076_1d64_78bd_642f;
    const K1: u64 = 0xe703_7ed1_a0b4_28db;
    let mut h = seed ^ K0 ^ (key.len() as u64).wrapping_mul(K1);
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        h = fold(h ^ u64::from_le_bytes(w.try_into().unwrap()), K1);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    fold(h ^ u64::from_le_bytes(tail), K0 ^ K1)
}

/// The packed position of byte `byte` of the plan's segment `segment`, if
/// it fits. Positions compare as the offsets of the records there do.
pub fn position(segment: usize, byte: u64) -> Option<u64> {
    (segment < MAX_SEGMENTS && byte < 1 << BYTE_BITS)
        .then(|| ((segment as u64) << BYTE_BITS) | byte)
}

/// What a pass knows of a record below its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A later record of the same key is in the indexed range: dropped.
    Superseded,
    /// The latest record of its key below the index's end, and the only
    /// one the pass keeps (a delete below the bound may go).
    Latest,
    /// Kept as it is: at or past the index's end, not known to be latest.
    Unindexed,
    /// In the indexed range, but another key with the same hash holds the
    /// entry: kept, and the clean point must not pass it.
    Collided,
}

/// Each dirty key's latest position, from the clean point on.
pub struct Index {
    map: HashMap<u64, u64, BuildHasherDefault<Prehashed>>,
    seed: u64,
    /// The clean point: where the indexed range starts.
    pub start: u64,
    /// The first offset not indexed (the plan's end if all was).
    pub end: u64,
}

impl Index {
    /// Indexes the plan's dirty range, from its clean point, until the
    /// table is full or the log ends. None if `cancel` was set.
    pub fn build(plan: &Plan, seed: u64, cancel: &AtomicBool) -> Result<Option<Index>> {
        let capacity = capacity(plan.memory_bytes);
        if capacity == 0 {
            bail!(
                "changelog.clean_memory_bytes = {} cannot hold a key index: not cleaned",
                plan.memory_bytes
            );
        }
        let start = plan.clean_to.min(plan.end);
        let mut index = Index {
            map: HashMap::default(),
            seed,
            start,
            end: plan.end,
        };
        let first = plan
            .segments
            .iter()
            .rposition(|(base, _)| *base <= start)
            .unwrap_or(0);
        'segments: for (i, (_, path)) in plan.segments.iter().enumerate().skip(first) {
            let mut frames = open_frames(path)?;
            while let Some(frame) = frames.next_frame()? {
                if cancel.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                match frame.kind {
                    KIND_DATA if frame.offset >= start => {
                        let (_, key) = data_key(&frame.payload, path)?;
                        let h = key_hash(seed, key);
                        let full = index.map.len() >= capacity && !index.map.contains_key(&h);
                        match position(i, frame.pos) {
                            Some(p) if !full => {
                                index.map.insert(h, p);
                            }
                            _ => {
                                index.end = frame.offset;
                                break 'segments;
                            }
                        }
                    }
                    KIND_DATA | KIND_CLEANED | KIND_COMMIT => {}
                    k => bail!(
                        "changelog segment {} has a frame of kind {k} at offset {}: not cleaned",
                        path.display(),
                        frame.offset
                    ),
                }
            }
        }
        Ok(Some(index))
    }

    /// What the pass does with the data record of `key` at `offset`, at
    /// position `at` (None past what positions can name: never below the
    /// index's end).
    pub fn verdict(
        &self,
        at: Option<u64>,
        offset: u64,
        key: &[u8],
        keys: &mut KeyReader,
    ) -> Result<Verdict> {
        let Some(at) = at.filter(|_| offset < self.end) else {
            return Ok(Verdict::Unindexed);
        };
        let indexed = offset >= self.start;
        Ok(match self.map.get(&key_hash(self.seed, key)) {
            // Below the clean point and no dirty key shares its hash: the
            // clean section's one record of its key.
            None if !indexed => Verdict::Latest,
            Some(&p) if p == at => Verdict::Latest,
            Some(&p) if p > at => {
                if keys.is(p, key)? {
                    Verdict::Superseded
                } else if indexed {
                    Verdict::Collided
                } else {
                    Verdict::Latest
                }
            }
            // Cannot happen for a record the index saw; keep it.
            _ => Verdict::Unindexed,
        })
    }
}

/// Reads keys back from the plan's segments by packed position.
pub struct KeyReader {
    segments: Vec<PathBuf>,
    open: HashMap<usize, std::fs::File>,
    buf: Vec<u8>,
}

impl KeyReader {
    pub fn new(plan: &Plan) -> Self {
        KeyReader {
            segments: plan.segments.iter().map(|(_, p)| p.clone()).collect(),
            open: HashMap::new(),
            buf: Vec::new(),
        }
    }

    /// Whether the data frame at `at` is a record of `key`. The segment
    /// is opened by name when first needed: a pass replaces a segment only
    /// after every record before the positions it still reads.
    fn is(&mut self, at: u64, key: &[u8]) -> Result<bool> {
        let segment = (at >> BYTE_BITS) as usize;
        let byte = at & ((1 << BYTE_BITS) - 1);
        let path = &self.segments[segment];
        if !self.open.contains_key(&segment) {
            if self.open.len() >= OPEN_FILES {
                self.open.clear();
            }
            let f = std::fs::File::open(path)
                .with_context(|| format!("cannot open changelog segment {}", path.display()))?;
            self.open.insert(segment, f);
        }
        let file = &self.open[&segment];
        // Frame header, kind, offset, op, key length, key.
        const KEY_AT: usize = HEADER + 9 + 1 + 4;
        self.buf.resize(KEY_AT + key.len(), 0);
        let mut got = 0;
        while got < self.buf.len() {
            match file.read_at(&mut self.buf[got..], byte + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot read {}", path.display()));
                }
            }
        }
        if got < KEY_AT {
            bail!(
                "changelog segment {} changed during a clean (no frame at byte {byte})",
                path.display()
            );
        }
        let len = u32::from_le_bytes(self.buf[KEY_AT - 4..KEY_AT].try_into().unwrap()) as usize;
        Ok(len == key.len() && got == self.buf.len() && &self.buf[KEY_AT..] == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_stays_within_the_bound() {
        for memory in [0, 100, 1 << 10, 1 << 20, 256 << 20, (1 << 20) + 12345] {
            let n = capacity(memory);
            let mut map: HashMap<u64, u64, BuildHasherDefault<Prehashed>> = HashMap::default();
            for i in 0..n as u64 {
                map.insert(key_hash(1, &i.to_le_bytes()), i);
            }
            assert!(
                map.capacity() * 8 / 7 * BUCKET_BYTES <= memory.max(1),
                "{memory}: {} entries, capacity {}",
                n,
                map.capacity()
            );
        }
        assert_eq!(capacity(1 << 20), 28_672);
    }

    #[test]
    fn positions_order_like_offsets() {
        let a = position(3, 100).unwrap();
        assert!(a < position(3, 101).unwrap());
        assert!(a > position(2, (1 << BYTE_BITS) - 1).unwrap());
        assert_eq!(position(1, 1 << BYTE_BITS), None);
    }
}
