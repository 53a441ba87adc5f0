use super::*;
use crate::changelog::embedded::{CleanSettings, EmbeddedLog};
use crate::changelog::{Changelog, Record, Replayed};
use crate::config::CleanMode;
use std::collections::BTreeMap;

type State = BTreeMap<Vec<u8>, Vec<u8>>;

fn apply(state: &mut State, r: &Record) {
    match r {
        Record::Put(k, v) => state.insert(k.clone(), v.clone()),
        Record::Delete(k) => state.remove(k),
    };
}

/// A state at `from` brought forward by the log's replay from `from`.
fn replayed(dir: &Path, mut state: State, from: u64) -> State {
    let mut log = EmbeddedLog::open(dir, SEGMENT).unwrap();
    log.check_replayable(from).unwrap();
    log.read_committed(from, &mut |item| {
        if let Replayed::Record(r) = item {
            apply(&mut state, &r);
        }
        Ok(())
    })
    .unwrap();
    state
}

const SEGMENT: u64 = 400;

/// A seeded workload: transactions of puts and deletes over few keys,
/// in segments of 400 bytes, the log told after each commit that the
/// store committed there (or a few commits earlier). Returns the
/// states at each commit offset (the oracle).
fn write(dir: &Path, seed: u64, txns: usize, lag: usize) -> Vec<(u64, State)> {
    let mut rng = crate::rng::Rng::new(seed);
    let mut log = EmbeddedLog::open(dir, SEGMENT).unwrap();
    log.set_cleaning(CleanSettings {
        mode: CleanMode::Inline,
        memory_bytes: 1 << 20,
    });
    let mut state = State::new();
    let mut history = vec![(0, State::new())];
    for t in 0..txns {
        let n = 1 + rng.below(5);
        let records: Vec<Record> = (0..n)
            .map(|_| {
                let key = vec![b'k', rng.below(8) as u8];
                if rng.chance(30) {
                    Record::Delete(key)
                } else {
                    Record::Put(key, vec![t as u8; rng.below(40) as usize])
                }
            })
            .collect();
        records.iter().for_each(|r| apply(&mut state, r));
        log.append(&records).unwrap();
        let offset = log.commit(t as u64 + 1, None).unwrap();
        history.push((offset, state.clone()));
        let durable = history[history.len().saturating_sub(1 + lag)].0;
        log.store_committed(durable).unwrap();
    }
    history
}

/// After cleaning, a replay from the start, or from any commit offset
/// a store may still be at, ends in the log's final state.
#[test]
fn a_cleaned_log_replays_to_the_same_state_from_every_start() {
    for seed in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let history = write(dir.path(), seed, 300, (seed % 4) as usize);
        let last = history.last().unwrap().1.clone();
        let log = EmbeddedLog::open(dir.path(), SEGMENT).unwrap();
        let kept_from = log.deletes_kept_from();
        let segments = log.segments().count();
        drop(log);
        assert!(kept_from > 0, "seed {seed}: nothing was cleaned");
        assert!(
            segments < 12,
            "seed {seed}: {segments} segments after cleaning"
        );
        assert_eq!(
            replayed(dir.path(), State::new(), 0),
            last,
            "seed {seed} from 0"
        );
        for (offset, state) in history.iter().filter(|(o, _)| *o >= kept_from) {
            assert_eq!(
                replayed(dir.path(), state.clone(), *offset),
                last,
                "seed {seed}: replay from {offset} (deletes kept from {kept_from})"
            );
        }
    }
}

/// Disk use follows the live state: after `compact`, one cleaned
/// segment holding each live key once (and the empty active one).
#[test]
fn clean_now_keeps_one_record_per_live_key() {
    let dir = tempfile::tempdir().unwrap();
    let history = write(dir.path(), 7, 500, 0);
    let (end, last) = history.last().unwrap().clone();
    let mut log = EmbeddedLog::open(dir.path(), SEGMENT).unwrap();
    let stats = log.clean_now(end).unwrap().expect("something to clean");
    assert_eq!(stats.records_kept, last.len() as u64, "{stats:?}");
    // Frames of the live entries, a header and a commit per segment.
    let live: u64 = last
        .iter()
        .map(|(k, v)| 26 + (k.len() + v.len()) as u64)
        .sum();
    let segments: Vec<PathBuf> = log.segments().map(Path::to_path_buf).collect();
    let bytes: u64 = segments
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        bytes <= live + 70 * segments.len() as u64,
        "{bytes} bytes for {live} live"
    );
    assert_eq!(
        std::fs::metadata(segments.last().unwrap()).unwrap().len(),
        0
    );
    drop(log);
    assert_eq!(replayed(dir.path(), State::new(), 0), last);
    assert_eq!(replayed(dir.path(), last.clone(), end), last);
    // Nothing more to drop: a second compact rewrites the same records.
    let mut log = EmbeddedLog::open(dir.path(), SEGMENT).unwrap();
    let again = log.clean_now(end).unwrap().unwrap();
    assert_eq!(again.records_kept, stats.records_kept);
    assert_eq!(log.end_offset(), end);
}

/// A crash before the clean's commit point leaves the old segments
/// (the built file is dropped at open); one after it leaves the
/// cleaned segment, and open removes the segments it covers. Either
/// way the log replays to the same state.
#[test]
fn an_interrupted_install_leaves_one_segment_set() {
    for after_rename in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = EmbeddedLog::open(dir.path(), SEGMENT).unwrap();
        let mut state = State::new();
        for t in 0..60u64 {
            let r = Record::Put(vec![b'k', (t % 5) as u8], vec![t as u8; 30]);
            apply(&mut state, &r);
            log.append(&[r]).unwrap();
            log.commit(t + 1, None).unwrap();
        }
        let end = log.end_offset();
        let segments: Vec<(u64, PathBuf)> = log
            .segments()
            .map(|p| {
                let base = p.file_stem().unwrap().to_str().unwrap().parse().unwrap();
                (base, p.to_path_buf())
            })
            .collect();
        drop(log);
        let sealed = segments[..segments.len() - 1].to_vec();
        let plan = Plan {
            end: segments.last().unwrap().0,
            segments: sealed.clone(),
            clean_to: 0,
            deletes_below: end,
            memory_bytes: 1 << 20,
            group_bytes: u64::MAX,
        };
        let built = build(&plan, &AtomicBool::new(false)).unwrap().unwrap();
        assert_eq!(built.covers, sealed.len());
        if after_rename {
            std::fs::remove_file(sealed[0].1.with_extension("seal")).unwrap();
            std::fs::rename(&built.file, &sealed[0].1).unwrap();
        }
        let log = EmbeddedLog::open(dir.path(), SEGMENT).unwrap();
        let now = log.segments().count();
        assert_eq!(
            now,
            if after_rename { 2 } else { segments.len() },
            "after_rename {after_rename}"
        );
        assert!(!built.file.exists());
        assert_eq!(log.end_offset(), end);
        drop(log);
        assert_eq!(replayed(dir.path(), State::new(), 0), state);
    }
}

/// Past the index's memory bound, a pass ends at the first key the index
/// could not take (inside a segment), and what it rewrote still replays
/// exactly.
#[test]
fn the_memory_bound_shortens_a_clean() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = EmbeddedLog::open(dir.path(), SEGMENT).unwrap();
    let mut state = State::new();
    for t in 0..200u64 {
        let r = Record::Put(format!("key-{t:04}").into_bytes(), vec![1; 20]);
        apply(&mut state, &r);
        log.append(&[r]).unwrap();
        log.commit(t + 1, None).unwrap();
    }
    let segments: Vec<(u64, PathBuf)> = log
        .segments()
        .map(|p| {
            (
                p.file_stem().unwrap().to_str().unwrap().parse().unwrap(),
                p.to_path_buf(),
            )
        })
        .collect();
    drop(log);
    let plan = Plan {
        end: segments.last().unwrap().0,
        segments: segments[..segments.len() - 1].to_vec(),
        clean_to: 0,
        deletes_below: 0,
        // 32 buckets: 28 keys.
        memory_bytes: 40 * 17,
        group_bytes: u64::MAX,
    };
    assert_eq!(index_capacity(plan.memory_bytes), 28);
    let built = build(&plan, &AtomicBool::new(false)).unwrap().unwrap();
    assert!(
        built.covers >= 1 && built.covers < plan.segments.len(),
        "covers {}",
        built.covers
    );
    // Transaction t is a record at 2t and its commit: the 29th key's
    // record is the first not indexed.
    assert_eq!(built.clean_to, 56);
    assert!(plan.segments[built.covers - 1].0 < 56 && plan.segments[built.covers].0 > 56);
    assert_eq!(built.last.offset, plan.segments[built.covers].0);
    std::fs::remove_file(plan.segments[0].1.with_extension("seal")).unwrap();
    std::fs::rename(&built.file, &plan.segments[0].1).unwrap();
    assert_eq!(replayed(dir.path(), State::new(), 0), state);
}

/// 30,000 keys written 20 times (one in seven deleted in the last
/// round), in segments of 512 KiB, the store committed at each commit,
/// cleaned as `mode` says with a 1 MiB index. Returns the oracle.
fn history_over_many_keys(dir: &Path, mode: CleanMode) -> State {
    const KEYS: u64 = 30_000;
    let mut log = EmbeddedLog::open(dir, MANY_SEGMENT).unwrap();
    log.set_cleaning(CleanSettings {
        mode,
        memory_bytes: 1 << 20,
    });
    let mut state = State::new();
    let mut batch = Vec::new();
    for round in 0..20u64 {
        for k in 0..KEYS {
            let key = format!("key{k:06}").into_bytes();
            let r = if round == 19 && k % 7 == 0 {
                Record::Delete(key)
            } else {
                Record::Put(key, format!("v{round:02}-{k:016}").into_bytes())
            };
            apply(&mut state, &r);
            batch.push(r);
            if batch.len() == 1000 {
                log.append(&batch).unwrap();
                batch.clear();
                let end = log.commit(round * KEYS + k, None).unwrap();
                log.store_committed(end).unwrap();
            }
        }
    }
    state
}

const MANY_SEGMENT: u64 = 512 << 10;

/// (segments, bytes) of the log in `dir`.
fn log_size(dir: &Path) -> (usize, u64) {
    let log = EmbeddedLog::open(dir, MANY_SEGMENT).unwrap();
    let s: Vec<PathBuf> = log.segments().map(Path::to_path_buf).collect();
    (
        s.len(),
        s.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum(),
    )
}

/// Issue 31: a live key set larger than the index (30,000 keys, a 1 MiB
/// bound holds 28,672) is still cleaned down to about its live size:
/// inline at each store commit, and by `compact` of the whole history,
/// pass after pass; both replay to the oracle.
#[test]
fn a_live_set_larger_than_the_index_is_cleaned() {
    for mode in [CleanMode::Inline, CleanMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let state = history_over_many_keys(dir.path(), mode);
        let live: u64 = state
            .iter()
            .map(|(k, v)| 26 + (k.len() + v.len()) as u64)
            .sum();
        let before = log_size(dir.path());
        let mut log = EmbeddedLog::open(dir.path(), MANY_SEGMENT).unwrap();
        log.set_cleaning(CleanSettings {
            mode: CleanMode::Inline,
            memory_bytes: 1 << 20,
        });
        let end = log.end_offset();
        let stats = log.clean_now(end).unwrap().unwrap();
        drop(log);
        let after = log_size(dir.path());
        eprintln!("{mode:?}: live {live} bytes; {before:?} -> {after:?}; {stats:?}");
        if mode == CleanMode::Inline {
            assert!(
                before.1 < 2 * live + 4 * MANY_SEGMENT,
                "{before:?} for {live} live bytes"
            );
        } else {
            assert!(stats.passes > 1, "{stats:?}");
        }
        assert!(after.1 < 3 * live, "{after:?} for {live} live bytes");
        assert_eq!((stats.clean_to, stats.log_end), (end, end), "{stats:?}");
        assert_eq!(stats.records_kept, state.len() as u64, "{stats:?}");
        assert_eq!(replayed(dir.path(), State::new(), 0), state, "{mode:?}");
    }
}
