//! The log cleaner of the embedded changelog, in the spirit of Kafka's log
//! cleaner: sealed segments are rewritten into *cleaned* segments that
//! keep, for each key, only its latest record, at its original offset.
//!
//! The log has a *clean point*. The invariant every pass keeps: below it
//! the log holds at most one record per key. From it on is the dirty
//! section. A pass:
//! 1. indexes the dirty section from the clean point, oldest first: each
//!    key's latest position ([`index`]), until the index is full or the
//!    sealed segments end. The bound: at most
//!    [`index::capacity`]`(memory_bytes)` keys (16 bytes each in a hash
//!    table that stays within `memory_bytes`: 28,672 keys for 1 MiB). The
//!    first record the index could not take is the pass's end `e`;
//! 2. rewrites the log from its start through the segment holding `e`,
//!    dropping each record below `e` whose key has a later record in the
//!    indexed range; records at or past `e` are copied as they are;
//! 3. leaves the clean point at `e`: below it, the clean section's records
//!    of keys the range did not touch, and each indexed key's latest.
//!
//! Every pass takes in at least one more key's records, so repeated passes
//! go through a dirty section of any size with a bounded index, whatever
//! the live key set; one pass does it all when the dirty keys fit.
//!
//! What a cleaned segment keeps, and why a replay from it is exact:
//! - every key's latest record. A record is dropped only for a later one
//!   of its key (compared, not only hashed), and a replay writes absolute
//!   values, so skipping a key's older values changes no final state,
//!   whichever commit offset the replay starts from;
//! - deletes at or above `deletes_below`, the offset the store was durably
//!   committed at when the clean began. A delete below it is dropped if it
//!   is its key's latest and the pass keeps no older record of its key (the
//!   invariant, or the index points at it): the store already holds its
//!   effect, and a wiped store (replaying from 0) never had the key. The
//!   bound is written in the segment's header, and a store that recovers to
//!   an offset between 0 and it is refused (see
//!   `Changelog::deletes_missing_after`);
//! - the last commit frame (its offset ends the range, its payload is the
//!   input position) and one commit frame per [`COMMIT_EVERY`] kept data
//!   frames, so a replay can still commit (and a crash resume) part-way.
//!   The transactions between two kept commits become one: a replay that
//!   starts inside it applies it whole, which repeats only latest values.
//!
//! A cleaned segment starts with a header frame (kind 3, at the segment's
//! base offset) naming the end of the range it covers, `deletes_below` and
//! its clean point (the log's is its last cleaned segment's); its frames
//! carry increasing, no longer consecutive, offsets.
//!
//! The index reads only sealed segments, so a pass may run on a thread
//! while the task appends. The rewrite goes in groups of at most one
//! segment's bytes, in offset order. Each group is built into
//! `BASE.log.clean`, fsynced and installed before the next is built (so a
//! clean needs one group of extra disk): the group's first seal is
//! removed, the built file renamed over its first segment (the group's
//! commit point), then its other segments are removed and the new seal
//! written. Open finishes or undoes an interrupted install: a `.clean` file
//! is removed, and segments a cleaned segment covers are removed. So a
//! crash, abort or power cut leaves each group either cleaned or as it
//! was, and the groups before it cleaned: a valid log (see [`run`]).

mod index;
mod pass;

#[cfg(test)]
use pass::build;
use pass::{Pass, Written};
#[cfg(test)]
mod tests;

use super::frame::{
    decode, remove_if_exists, seal_path, write_seal, HEADER, KIND_CLEANED, MAX_FRAME,
};
use super::CommitInfo;
use crate::file;
use anyhow::{Context, Result};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[cfg(test)]
use index::capacity as index_capacity;

/// Kept data frames between two kept commit frames of a cleaned segment.
pub const COMMIT_EVERY: u64 = 1024;

/// What a clean pass is asked to do.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The sealed segments, oldest first: (base offset, path). The first
    /// ones may be an earlier clean's.
    pub segments: Vec<(u64, PathBuf)>,
    /// Where the last of them ends: the base of the segment after it.
    pub end: u64,
    /// The log's clean point: the dirty section starts here.
    pub clean_to: u64,
    /// Deletes below this offset may be dropped.
    pub deletes_below: u64,
    /// The most the key index may hold.
    pub memory_bytes: usize,
    /// A group of segments rewritten and installed at once holds at most
    /// this many bytes (or one segment).
    pub group_bytes: u64,
}

/// Figures of a clean: of one group, of one pass (its groups summed), or
/// of several passes ([`CleanStats::then`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CleanStats {
    /// Segments and bytes read and bytes written (summed over passes: each
    /// pass rewrites the log from its start).
    pub segments_in: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Records the clean took in: those it kept plus those it dropped.
    pub records_in: u64,
    /// Records in the segments the last pass rewrote.
    pub records_kept: u64,
    /// Records dropped: superseded, or deletes below the bound.
    pub records_dropped: u64,
    pub deletes_dropped: u64,
    pub commits_kept: u64,
    pub passes: u64,
    /// The most keys a pass's index holds (`changelog.clean_memory_bytes`).
    pub index_capacity: u64,
    /// The log's clean point after the clean, and its sealed end: equal
    /// when the whole sealed log is clean.
    pub clean_to: u64,
    pub log_end: u64,
}

impl CleanStats {
    /// Adds another group's figures (of the same pass).
    pub fn add(&mut self, other: &CleanStats) {
        self.segments_in += other.segments_in;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
        self.records_in += other.records_in;
        self.records_kept += other.records_kept;
        self.records_dropped += other.records_dropped;
        self.deletes_dropped += other.deletes_dropped;
        self.commits_kept += other.commits_kept;
    }

    /// Takes in a later pass over the same log.
    pub fn then(&mut self, pass: &CleanStats) {
        self.segments_in += pass.segments_in;
        self.bytes_in += pass.bytes_in;
        self.bytes_out += pass.bytes_out;
        self.records_dropped += pass.records_dropped;
        self.deletes_dropped += pass.deletes_dropped;
        self.records_kept = pass.records_kept;
        self.records_in = self.records_kept + self.records_dropped;
        self.commits_kept = pass.commits_kept;
        self.passes += pass.passes;
        self.index_capacity = pass.index_capacity;
        self.clean_to = pass.clean_to;
        self.log_end = pass.log_end;
    }
}

/// A built, durable, not yet installed group.
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
    /// Its header's clean point.
    pub clean_to: u64,
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

/// A cleaned segment's header: the end of the range it covers, the bound
/// below which its deletes were dropped, and its clean point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub end: u64,
    pub deletes_below: u64,
    pub clean_to: u64,
}

pub fn encode_header(h: Header) -> Vec<u8> {
    let mut p = h.end.to_le_bytes().to_vec();
    p.extend_from_slice(&h.deletes_below.to_le_bytes());
    p.extend_from_slice(&h.clean_to.to_le_bytes());
    p
}

/// 24 bytes; a header of 16 (before clean points) is clean to its end.
fn decode_header(payload: &[u8]) -> Option<Header> {
    let word = |i: usize| u64::from_le_bytes(payload[i..i + 8].try_into().unwrap());
    match payload.len() {
        16 => Some(Header {
            end: word(0),
            deletes_below: word(8),
            clean_to: word(0),
        }),
        24 => Some(Header {
            end: word(0),
            deletes_below: word(8),
            clean_to: word(16),
        }),
        _ => None,
    }
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

/// One owned frame, with its encoded bytes and where it starts.
struct OwnedFrame {
    kind: u8,
    offset: u64,
    pos: u64,
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
        let pos = self.at;
        self.at += bytes.len() as u64;
        Ok(Some(OwnedFrame {
            kind,
            offset,
            pos,
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

/// One group a clean put in place: `covers` segments from `base` replaced
/// by one cleaned segment.
#[derive(Clone, Copy, Debug)]
pub struct Installed {
    pub base: u64,
    pub covers: usize,
    pub deletes_below: u64,
    pub clean_to: u64,
    pub stats: CleanStats,
}

/// Why a clean stopped early.
#[derive(Debug)]
pub enum Stopped {
    /// The log is unchanged where the clean did not reach (damage, a
    /// memory bound too small for any index): cleaning stops, the task
    /// goes on.
    Skipped(anyhow::Error),
    /// A write, fsync, rename or remove of the host's files failed: like
    /// any failed I/O of the log, the process stops.
    Io(anyhow::Error),
    Cancelled,
}

/// What a pass did: the groups it installed, in order, then why it
/// stopped, if it did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub installed: Vec<Installed>,
    pub stopped: Option<Stopped>,
    /// The most keys the pass's index could hold.
    pub index_capacity: usize,
    /// The plan's end.
    pub end: u64,
}

/// One pass over `plan`, group by group, in offset order: each group of
/// consecutive segments (at most `group_bytes` of them, or one) is
/// rewritten and installed before the next is built, so a clean needs at
/// most one group's bytes of extra disk. A crash between groups leaves the
/// groups before it cleaned and those after it as they were: each key's
/// latest record is still in the log (a record is dropped only for a later
/// one of its key, in a group at or after its own), a dropped delete's
/// older records were in the groups already cleaned, and each group's
/// clean point is at most the pass's, so the log's (its last cleaned
/// segment's) keeps the invariant.
pub fn run(plan: &Plan, dir: &Path, cancel: &AtomicBool) -> Outcome {
    let mut out = Outcome {
        index_capacity: index::capacity(plan.memory_bytes),
        end: plan.end,
        ..Outcome::default()
    };
    let mut pass = match Pass::new(plan, cancel) {
        Ok(Some(pass)) => pass,
        Ok(None) => {
            out.stopped = Some(Stopped::Cancelled);
            return out;
        }
        Err(e) => {
            out.stopped = Some(Stopped::Skipped(e));
            return out;
        }
    };
    let segments = &plan.segments[..pass.rewrite];
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut start = 0;
    while start < segments.len() {
        let mut bytes = len(&segments[start].1);
        let mut stop = start + 1;
        while stop < segments.len() && bytes + len(&segments[stop].1) <= plan.group_bytes {
            bytes += len(&segments[stop].1);
            stop += 1;
        }
        let built = match pass.build_group(start, stop, cancel) {
            Ok(Written::Built(b)) => b,
            Ok(_) => {
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
        if let Err(e) = install(dir, &segments[start..stop], &built) {
            out.stopped = Some(Stopped::Io(e));
            return out;
        }
        out.installed.push(Installed {
            base: built.base,
            covers: built.covers,
            deletes_below: built.deletes_below,
            clean_to: built.clean_to,
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
            stopped: Some(Stopped::Io(anyhow::anyhow!(
                "the changelog cleaner thread panicked"
            ))),
            ..Outcome::default()
        })
    }

    /// Stops the clean after the group it is in (a half-built group's file
    /// is removed, or left for the next open) and waits for it.
    pub fn cancel(self) -> Outcome {
        self.cancel.store(true, Ordering::Relaxed);
        self.join()
    }
}
