//! The log cleaner of the embedded changelog, in the spirit of Kafka's
//! compacted topics: sealed segments are rewritten into *cleaned* segments
//! that keep, for each key, only its latest record, at its original
//! offset.
//!
//! What a cleaned segment keeps, and why a replay from it is exact:
//! - every key's latest record in the cleaned range. A replay writes
//!   absolute values, so skipping a key's older values changes no final
//!   state, whichever commit offset the replay starts from;
//! - deletes at or above `deletes_below`, the offset the store was durably
//!   committed at when the clean began. A delete below it is dropped: the
//!   store already holds its effect, and a wiped store (replaying from 0)
//!   never had the key. The bound is written in the segment's header, and a
//!   store that recovers to an offset between 0 and it is refused (see
//!   `Changelog::deletes_missing_after`);
//! - the last commit frame (its offset ends the range, its payload is the
//!   input position) and one commit frame per [`COMMIT_EVERY`] kept data
//!   frames, so a replay can still commit (and a crash resume) part-way.
//!   The transactions between two kept commits become one: a replay that
//!   starts inside it applies it whole, which repeats only latest values.
//!
//! A cleaned segment starts with a header frame (kind 3, at the segment's
//! base offset) naming the end of the range it covers and `deletes_below`;
//! its frames carry increasing, no longer consecutive, offsets.
//!
//! A clean first indexes each key's latest offset over all the segments it
//! covers (reading the sealed segments only, so it may run on a thread
//! while the task appends), then works through them in groups of at most
//! one segment's bytes, in offset order. Each group is built into
//! `BASE.log.clean`, fsynced and installed before the next is built (so a
//! clean needs one group of extra disk): the group's first seal is
//! removed, the built file renamed over its first segment (the group's
//! commit point), then its other segments are removed and the new seal
//! written. Open finishes or undoes an interrupted install: a `.clean` file
//! is removed, and segments a cleaned segment covers are removed. So a
//! crash, abort or power cut leaves each group either cleaned or as it
//! was, and the groups before it cleaned: a valid log (see [`run`]).
//!
//! Memory: the index maps each key of the cleaned range to its latest
//! offset; past `memory_bytes` the clean covers only the segments indexed
//! whole (at least one), and the rest waits for the next clean.

use super::embedded::{
    decode, remove_if_exists, seal_path, write_seal, HEADER, KIND_CLEANED, KIND_COMMIT, KIND_DATA,
    MAX_FRAME, OP_DELETE,
};
use super::CommitInfo;
use crate::file::{self, File};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Kept data frames between two kept commit frames of a cleaned segment.
pub const COMMIT_EVERY: u64 = 1024;
/// Index bytes counted per key beyond its length (hash map entry, offset).
const INDEX_OVERHEAD: usize = 48;

/// What a clean is asked to do.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The sealed segments to rewrite, oldest first: (base offset, path).
    /// The first may be an earlier clean's segment.
    pub segments: Vec<(u64, PathBuf)>,
    /// Where the last of them ends: the base of the segment after it.
    pub end: u64,
    /// Deletes below this offset may be dropped.
    pub deletes_below: u64,
    /// The most the key index may hold.
    pub memory_bytes: usize,
    /// A group of segments rewritten and installed at once holds at most
    /// this many bytes (or one segment).
    pub group_bytes: u64,
}

/// Figures of one clean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CleanStats {
    pub segments_in: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub records_in: u64,
    pub records_kept: u64,
    pub deletes_dropped: u64,
    pub commits_kept: u64,
}

impl CleanStats {
    /// Adds another group's figures.
    pub fn add(&mut self, other: &CleanStats) {
        self.segments_in += other.segments_in;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
        self.records_in += other.records_in;
        self.records_kept += other.records_kept;
        self.deletes_dropped += other.deletes_dropped;
        self.commits_kept += other.commits_kept;
    }
}

/// A built, durable, not yet installed clean.
#[derive(Debug)]
pub struct Built {
    /// The `.clean` file.
    pub file: PathBuf,
    /// How many segments (from `base` on) it replaces.
    pub covers: usize,
    /// The base offset of the first, which it takes the place of.
    pub base: u64,
    /// Its header's bound (the largest of the plan's and its inputs').
    pub deletes_below: u64,
    /// The last commit of the covered range: the new segment's seal.
    pub last: CommitInfo,
    pub len: u64,
    pub stats: CleanStats,
}

/// Writing or syncing the clean's own file failed. Like every failed
/// write of the host's files this stops the process (the log treats it as
/// a crash; the next open drops the file); any other failure of a clean
/// only stops cleaning, since the log itself is unchanged.
#[derive(Debug)]
pub struct WriteFailed(pub std::io::Error);

impl std::fmt::Display for WriteFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "changelog clean: {}", self.0)
    }
}

impl std::error::Error for WriteFailed {}

/// The path of a clean being built for the segment at `segment`.
fn building_path(segment: &Path) -> PathBuf {
    let mut name = segment.file_name().unwrap_or_default().to_os_string();
    name.push(".clean");
    segment.with_file_name(name)
}

/// A cleaned segment's header: the end of the range it covers and the
/// bound below which its deletes were dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub end: u64,
    pub deletes_below: u64,
}

pub fn encode_header(h: Header) -> Vec<u8> {
    let mut p = h.end.to_le_bytes().to_vec();
    p.extend_from_slice(&h.deletes_below.to_le_bytes());
    p
}

fn decode_header(payload: &[u8]) -> Option<Header> {
    (payload.len() == 16).then(|| Header {
        end: u64::from_le_bytes(payload[0..8].try_into().unwrap()),
        deletes_below: u64::from_le_bytes(payload[8..16].try_into().unwrap()),
    })
}

/// The header of `segment` if it is a cleaned one (reads one frame).
pub fn read_header(segment: &Path) -> Result<Option<Header>> {
    let f = std::fs::File::open(segment)
        .with_context(|| format!("cannot open changelog segment {}", segment.display()))?;
    // The header frame is small: read only what it needs.
    let mut frames = Frames::new(f, segment, HEADER + 64);
    match frames.next_frame() {
        Ok(Some(frame)) if frame.kind == KIND_CLEANED => {
            Ok(Some(decode_header(&frame.payload).with_context(|| {
                format!("cleaned segment {} has a bad header", segment.display())
            })?))
        }
        // Damage in the first frame is for the scan to report.
        _ => Ok(None),
    }
}

/// One owned frame, with its encoded bytes.
struct OwnedFrame {
    kind: u8,
    offset: u64,
    payload: Vec<u8>,
    bytes: Vec<u8>,
}

/// Reads a segment frame by frame without holding it whole.
struct Frames<'a, R> {
    r: BufReader<R>,
    path: &'a Path,
    at: u64,
}

impl<'a, R: Read> Frames<'a, R> {
    fn new(r: R, path: &'a Path, buffer: usize) -> Self {
        Frames {
            r: BufReader::with_capacity(buffer, r),
            path,
            at: 0,
        }
    }

    /// The next frame, None at the end; damage is an error (a clean never
    /// rewrites what it cannot read whole).
    fn next_frame(&mut self) -> Result<Option<OwnedFrame>> {
        let mut head = [0u8; HEADER];
        let mut got = 0;
        while got < HEADER {
            match self.r.read(&mut head[got..])? {
                0 if got == 0 => return Ok(None),
                0 => break,
                n => got += n,
            }
        }
        let damaged = || {
            anyhow::anyhow!(
                "changelog segment {} is damaged at byte {}: not cleaned",
                self.path.display(),
                self.at
            )
        };
        if got < HEADER {
            return Err(damaged());
        }
        let len = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
        if !(9..=MAX_FRAME).contains(&len) {
            return Err(damaged());
        }
        let mut bytes = vec![0u8; HEADER + len];
        bytes[..HEADER].copy_from_slice(&head);
        self.r
            .read_exact(&mut bytes[HEADER..])
            .map_err(|_| damaged())?;
        let (kind, offset, payload) = match decode(&bytes, 0) {
            Some((f, _)) => (f.kind, f.offset, f.payload.to_vec()),
            None => return Err(damaged()),
        };
        self.at += bytes.len() as u64;
        Ok(Some(OwnedFrame {
            kind,
            offset,
            payload,
            bytes,
        }))
    }
}

fn open_frames(path: &Path) -> Result<Frames<'_, std::fs::File>> {
    let f = std::fs::File::open(path)
        .with_context(|| format!("cannot open changelog segment {}", path.display()))?;
    Ok(Frames::new(f, path, 1 << 16))
}

/// The key of a data frame's payload (`op u8 | key len u32 | key | value`).
fn data_key<'a>(payload: &'a [u8], path: &Path) -> Result<(u8, &'a [u8])> {
    let bad = || {
        anyhow::anyhow!(
            "changelog segment {} has a malformed data frame",
            path.display()
        )
    };
    let (&op, rest) = payload.split_first().ok_or_else(bad)?;
    let klen = u32::from_le_bytes(rest.get(0..4).ok_or_else(bad)?.try_into().unwrap()) as usize;
    Ok((op, rest.get(4..4 + klen).ok_or_else(bad)?))
}

/// Each key's latest offset in the segments a clean covers.
struct Index {
    latest: HashMap<Vec<u8>, u64>,
    /// How many of the plan's segments (a prefix) were indexed whole.
    covers: usize,
    /// The plan's bound, raised to its inputs' own.
    deletes_below: u64,
}

/// Pass 1: each key's latest offset, over as many whole segments as the
/// memory bound allows. None if `cancel` was set.
fn index(plan: &Plan, cancel: &AtomicBool) -> Result<Option<Index>> {
    assert!(!plan.segments.is_empty(), "a clean needs a segment");
    let mut latest: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut index_bytes = 0usize;
    let mut covers = 0;
    let mut deletes_below = plan.deletes_below;
    'segments: for (i, (_, path)) in plan.segments.iter().enumerate() {
        let mut frames = open_frames(path)?;
        while let Some(frame) = frames.next_frame()? {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            match frame.kind {
                KIND_DATA => {
                    let (_, key) = data_key(&frame.payload, path)?;
                    match latest.get_mut(key) {
                        Some(o) => *o = frame.offset,
                        None => {
                            index_bytes += key.len() + INDEX_OVERHEAD;
                            if index_bytes > plan.memory_bytes {
                                if i == 0 {
                                    bail!(
                                        "the keys of changelog segment {} need more than {} bytes of index \
                                         (changelog.clean_memory_bytes): not cleaned",
                                        path.display(),
                                        plan.memory_bytes
                                    );
                                }
                                // Offsets indexed from this segment point at
                                // records it keeps: still latest-or-later.
                                break 'segments;
                            }
                            latest.insert(key.to_vec(), frame.offset);
                        }
                    }
                }
                KIND_CLEANED => {
                    let h = decode_header(&frame.payload).with_context(|| {
                        format!("cleaned segment {} has a bad header", path.display())
                    })?;
                    deletes_below = deletes_below.max(h.deletes_below);
                }
                KIND_COMMIT => {}
                k => bail!(
                    "changelog segment {} has a frame of kind {k} at offset {}: not cleaned",
                    path.display(),
                    frame.offset
                ),
            }
        }
        covers = i + 1;
    }

    Ok(Some(Index {
        latest,
        covers,
        deletes_below,
    }))
}

/// Pass 2: writes what `segments` (consecutive, indexed by `idx`) keep
/// into one durable `.clean` file that takes the first one's place and
/// covers up to `end`. None if `cancel` was set.
fn write_group(
    segments: &[(u64, PathBuf)],
    end: u64,
    idx: &Index,
    cancel: &AtomicBool,
) -> Result<Option<Built>> {
    let (latest, deletes_below, covers) = (&idx.latest, idx.deletes_below, segments.len());
    let (base, first) = &segments[0];
    let out_path = building_path(first);
    let mut out = BufWriter::with_capacity(1 << 16, File::create(&out_path).map_err(WriteFailed)?);
    let mut stats = CleanStats {
        segments_in: covers as u64,
        ..CleanStats::default()
    };
    let mut last: Option<CommitInfo> = None;
    let mut header = Vec::new();
    super::embedded::encode(
        &mut header,
        KIND_CLEANED,
        *base,
        &[&encode_header(Header { end, deletes_below })],
    );
    out.write_all(&header).map_err(WriteFailed)?;
    let mut len = header.len() as u64;
    let mut kept_since_commit = 0u64;
    // Offsets must increase through a cleaned segment.
    let mut previous: Option<u64> = None;
    for (i, (_, path)) in segments.iter().enumerate() {
        stats.bytes_in += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let mut frames = open_frames(path)?;
        // Commit frames are kept only after data: the covered range's
        // last one always (it is written after the loop if it was skipped).
        let mut pending_commit: Option<OwnedFrame> = None;
        while let Some(frame) = frames.next_frame()? {
            if cancel.load(Ordering::Relaxed) {
                drop(out);
                let _ = file::remove_file(&out_path);
                return Ok(None);
            }
            let keep = match frame.kind {
                KIND_DATA => {
                    stats.records_in += 1;
                    let (op, key) = data_key(&frame.payload, path)?;
                    let is_latest = latest.get(key) == Some(&frame.offset);
                    let dropped_delete =
                        is_latest && op == OP_DELETE && frame.offset < deletes_below;
                    stats.deletes_dropped += u64::from(dropped_delete);
                    is_latest && !dropped_delete
                }
                KIND_COMMIT => {
                    let (position, check) = super::embedded::decode_commit(&frame.payload)
                        .context("commit frame payload is not 8 or 12 bytes")?;
                    last = Some(CommitInfo {
                        offset: frame.offset + 1,
                        input_position: position,
                        input_check: check,
                    });
                    if kept_since_commit >= COMMIT_EVERY {
                        kept_since_commit = 0;
                        pending_commit = None;
                        true
                    } else {
                        pending_commit = Some(frame);
                        continue;
                    }
                }
                // A header: the input's own, replaced by ours.
                _ => false,
            };
            if keep {
                if previous.is_some_and(|p| frame.offset <= p) {
                    bail!(
                        "changelog offsets go back at {} in {}: not cleaned",
                        frame.offset,
                        path.display()
                    );
                }
                previous = Some(frame.offset);
                if frame.kind == KIND_DATA {
                    stats.records_kept += 1;
                    kept_since_commit += 1;
                } else {
                    stats.commits_kept += 1;
                }
                out.write_all(&frame.bytes).map_err(WriteFailed)?;
                len += frame.bytes.len() as u64;
            }
        }
        if i + 1 == covers {
            if let Some(frame) = pending_commit.take() {
                stats.commits_kept += 1;
                out.write_all(&frame.bytes).map_err(WriteFailed)?;
                len += frame.bytes.len() as u64;
            }
        }
    }
    let last = last.context("the segments to clean hold no commit")?;
    if last.offset != end {
        bail!(
            "the segments to clean end at offset {} but the next segment starts at {end}: not cleaned",
            last.offset
        );
    }
    let file = out.into_inner().map_err(|e| WriteFailed(e.into_error()))?;
    file.sync_all().map_err(WriteFailed)?;
    stats.bytes_out = len;
    Ok(Some(Built {
        file: out_path,
        covers,
        base: *base,
        deletes_below,
        last,
        len,
        stats,
    }))
}

/// Builds one `.clean` file for every segment of `plan` the index covers
/// (a clean in one piece: `txstore compact`'s last step, and tests).
pub fn build(plan: &Plan, cancel: &AtomicBool) -> Result<Option<Built>> {
    let Some(idx) = index(plan, cancel)? else {
        return Ok(None);
    };
    let end = plan.segments.get(idx.covers).map_or(plan.end, |(b, _)| *b);
    write_group(&plan.segments[..idx.covers], end, &idx, cancel)
}

/// One group a clean put in place: `covers` segments from `base` replaced
/// by one cleaned segment.
#[derive(Clone, Copy, Debug)]
pub struct Installed {
    pub base: u64,
    pub covers: usize,
    pub deletes_below: u64,
    pub stats: CleanStats,
}

/// Why a clean stopped early.
#[derive(Debug)]
pub enum Stopped {
    /// The log is unchanged where the clean did not reach (damage, the
    /// memory bound): cleaning stops, the task goes on.
    Skipped(anyhow::Error),
    /// A write, fsync, rename or remove of the host's files failed: like
    /// any failed I/O of the log, the process stops.
    Io(anyhow::Error),
    Cancelled,
}

/// What a clean did: the groups it installed, in order, then why it
/// stopped, if it did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub installed: Vec<Installed>,
    pub stopped: Option<Stopped>,
}

/// Cleans `plan` group by group, in offset order: each group of
/// consecutive segments (at most `group_bytes` of them, or one) is
/// rewritten and installed before the next is built, so a clean needs at
/// most one group's bytes of extra disk. A crash between groups leaves the
/// groups before it cleaned and those after it as they were: each key's
/// latest record is still in the log (a record is dropped only for a later
/// one of its key, in a group at or after its own), and a dropped delete's
/// older puts were in the groups already cleaned.
pub fn run(plan: &Plan, dir: &Path, cancel: &AtomicBool) -> Outcome {
    let mut out = Outcome::default();
    let idx = match index(plan, cancel) {
        Ok(Some(idx)) => idx,
        Ok(None) => {
            out.stopped = Some(Stopped::Cancelled);
            return out;
        }
        Err(e) => {
            out.stopped = Some(Stopped::Skipped(e));
            return out;
        }
    };
    let segments = &plan.segments[..idx.covers];
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut start = 0;
    while start < segments.len() {
        let mut bytes = len(&segments[start].1);
        let mut stop = start + 1;
        while stop < segments.len() && bytes + len(&segments[stop].1) <= plan.group_bytes {
            bytes += len(&segments[stop].1);
            stop += 1;
        }
        let end = plan.segments.get(stop).map_or(plan.end, |(b, _)| *b);
        let group = &segments[start..stop];
        let built = match write_group(group, end, &idx, cancel) {
            Ok(Some(b)) => b,
            Ok(None) => {
                out.stopped = Some(Stopped::Cancelled);
                return out;
            }
            Err(e) if e.downcast_ref::<WriteFailed>().is_some() => {
                out.stopped = Some(Stopped::Io(e));
                return out;
            }
            Err(e) => {
                out.stopped = Some(Stopped::Skipped(e));
                return out;
            }
        };
        if let Err(e) = install(dir, group, &built) {
            out.stopped = Some(Stopped::Io(e));
            return out;
        }
        out.installed.push(Installed {
            base: built.base,
            covers: built.covers,
            deletes_below: built.deletes_below,
            stats: built.stats,
        });
        start = stop;
    }
    out
}

/// Puts a built group in place of its segments: the first one's seal is
/// removed (it describes the old file; without one, open scans), the
/// built file renamed over it (the commit point), then the others removed
/// and the new seal written.
fn install(dir: &Path, group: &[(u64, PathBuf)], built: &Built) -> Result<()> {
    crate::crash::step("clean-built");
    let first = &group[0].1;
    assert_eq!(
        group[0].0, built.base,
        "a group's clean takes its first segment's place"
    );
    remove_if_exists(&seal_path(first))?;
    file::sync_dir(dir)?;
    file::rename(&built.file, first)?;
    file::sync_dir(dir)?;
    crate::crash::step("clean-installed");
    for (_, path) in &group[1..] {
        remove_if_exists(path)?;
        remove_if_exists(&seal_path(path))?;
    }
    file::sync_dir(dir)?;
    write_seal(first, built.len, built.last)
}

/// A clean running on its own thread.
pub struct Background {
    handle: std::thread::JoinHandle<Outcome>,
    cancel: Arc<AtomicBool>,
}

impl Background {
    pub fn start(plan: Plan, dir: PathBuf) -> Self {
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("txstore-cleaner".into())
            .spawn(move || run(&plan, &dir, &flag))
            .expect("spawning the changelog cleaner thread");
        Background { handle, cancel }
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the clean. A panic leaves unknown what it installed: the
    /// log must stop (the next open sorts the segments out).
    pub fn join(self) -> Outcome {
        self.handle.join().unwrap_or_else(|_| Outcome {
            installed: Vec::new(),
            stopped: Some(Stopped::Io(anyhow::anyhow!(
                "the changelog cleaner thread panicked"
            ))),
        })
    }

    /// Stops the clean after the group it is in (a half-built group's file
    /// is removed, or left for the next open) and waits for it.
    pub fn cancel(self) -> Outcome {
        self.cancel.store(true, Ordering::Relaxed);
        self.join()
    }
}

#[cfg(test)]
mod tests {
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
        let mut rng = crate::conformance::workload::Rng::new(seed);
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

    /// Past the index's memory bound, a clean covers only the segments it
    /// indexed whole, and what it covers still replays exactly.
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
            deletes_below: 0,
            memory_bytes: 30 * (8 + INDEX_OVERHEAD),
            group_bytes: u64::MAX,
        };
        let built = build(&plan, &AtomicBool::new(false)).unwrap().unwrap();
        assert!(
            built.covers >= 1 && built.covers < plan.segments.len(),
            "covers {}",
            built.covers
        );
        assert_eq!(built.last.offset, plan.segments[built.covers].0);
        std::fs::remove_file(plan.segments[0].1.with_extension("seal")).unwrap();
        std::fs::rename(&built.file, &plan.segments[0].1).unwrap();
        assert_eq!(replayed(dir.path(), State::new(), 0), state);
    }
}
