//! The embedded changelog: segment files of checksummed frames.
//!
//! Frame: `magic u32 | len u32 | crc32c u32 | kind u8 | offset u64 | payload`
//! (little-endian; `len` counts from `kind`; the CRC covers `len` and the
//! body). Every frame carries its offset, so frames can be found again
//! after damage. A transaction is its data frames followed by a commit frame
//! (payload: the input position); the committed offset is the commit
//! frame's offset + 1. Segments roll only at commits, so a transaction
//! never spans two files. Segment names are their first offset.
//!
//! At open, the active segment is scanned: everything after its last
//! commit (a torn write, or a transaction a crash left open) is the tail
//! and is truncated with a warning naming the bytes. Since every commit is
//! fsynced, a power cut can tear only the last transaction and the open
//! one: damage in the active segment that fewer than two commit frames
//! follow is a torn tail, and no frame after it is accepted (after a torn
//! write the bytes that follow may be a frame-shaped piece of a record's
//! value); damage that two commits follow is media damage, kept and
//! reported as below. Frames must carry consecutive offsets (increasing
//! ones in a segment the cleaner wrote, [`super::clean`], which starts with
//! a header frame). Then the segment is fsynced
//! before anything depends on it: a process that died inside `commit`'s
//! fdatasync leaves a commit frame that only the page cache holds, and a
//! store committed from it would be ahead of the log after a power cut.
//! In a sealed segment, damage followed by valid frames is *not*
//! truncated, since committed data lies beyond it: it is reported, and a
//! replay that must cross it fails with an error naming the segment and
//! byte. Segments must follow each other without a gap (each starts at the
//! offset the previous one ends at); a missing segment stops a replay that
//! would need it.
//!
//! All writes go through [`crate::file`], so tests can inject I/O errors
//! and simulate power loss. After any failed write or fsync the log
//! refuses every later call (the kernel may have dropped the pages it
//! failed to write): the process stops and the next open recovers.
//!
//! A segment that rolls is sealed: a small `.seal` file beside it records
//! its length and last commit. Open trusts a seal whose length matches and
//! scans only the active segment, so start-up does not read the whole log
//! (at a million records that scan was most of the recovery time). Sealed
//! segments are checked for damage by [`EmbeddedLog::verify_from`] before
//! a replay reads them, which still happens before anything changes.

mod cleaning;

pub use cleaning::CleanSettings;

use super::clean::CleanStats;
use super::frame::{
    decode, decode_commit, decode_record, encode, encode_commit, read_seal, segment_path,
    write_seal, HEADER, KIND_CLEANED, KIND_COMMIT, KIND_DATA, MAGIC, OP_DELETE, OP_PUT,
};
use super::{Changelog, CommitInfo, Record, Replayed};
use crate::file::{self, File};
use anyhow::{bail, Context, Result};
use cleaning::{finish_clean, Cleaning};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A damaged region found at open that valid frames follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub segment: PathBuf,
    pub byte: u64,
    pub len: u64,
    /// The end of the first transaction committed after the damage: a
    /// replay from at or past it never reads the damaged bytes.
    pub cleared_at: Option<u64>,
}

/// What opening the log found and did.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    /// Bytes cut from the tail (torn frame or unfinished transaction).
    pub truncated_bytes: u64,
    /// Damage in the middle, left in place.
    pub damage: Vec<Damage>,
}

pub struct EmbeddedLog {
    dir: PathBuf,
    segment_bytes: u64,
    /// (first offset, path), in order.
    segments: Vec<(u64, PathBuf)>,
    writer: BufWriter<File>,
    /// Bytes in the active segment up to the last commit.
    committed_len: u64,
    /// Bytes written to the active segment, including the open transaction.
    written_len: u64,
    next_offset: u64,
    last: Option<CommitInfo>,
    pub report: OpenReport,
    // The directory's lock: one writer per changelog, whatever the config.
    _lock: std::fs::File,
    /// Sealed segments not scanned since open (indexes into `segments`).
    unverified: Vec<usize>,
    /// The first failed write or fsync: every later call fails with it.
    failed: Option<String>,
    cleaning: Cleaning,
}

/// What scanning one segment found.
struct Scan {
    /// The last commit in the segment.
    last: Option<CommitInfo>,
    /// Bytes up to and including the last commit frame.
    good_end: usize,
    /// The whole segment's length.
    len: usize,
}

/// Scans `path` (first offset `base`) frame by frame: finds its last
/// commit and records damage (clearing earlier damage at each commit).
/// `tail` is true for the active segment, where the first unreadable frame
/// ends the scan: what follows is a torn tail, never trusted.
fn scan(path: &Path, base: u64, tail: bool, damage: &mut Vec<Damage>) -> Result<Scan> {
    let buf = std::fs::read(path)
        .with_context(|| format!("cannot read changelog segment {}", path.display()))?;
    let mut out = Scan {
        last: None,
        good_end: 0,
        len: buf.len(),
    };
    let mut pos = 0;
    // The offset the next frame must carry (at least, in a cleaned
    // segment); unknown after damage.
    let mut expect = Some(base);
    let mut cleaned = false;
    while pos < buf.len() {
        let frame = decode(&buf, pos).filter(|(f, _)| {
            let in_order = expect.is_none_or(|e| f.offset == e || (cleaned && f.offset > e));
            // A cleaned segment's header comes first, at the base offset.
            in_order && (f.kind != KIND_CLEANED || pos == 0)
        });
        match frame {
            Some((frame, n)) if frame.kind == KIND_CLEANED => {
                cleaned = true;
                // Its first kept record may carry the base offset too.
                expect = Some(base);
                pos += n;
            }
            Some((frame, n)) => {
                expect = Some(frame.offset + 1);
                if frame.kind == KIND_COMMIT {
                    let (input_position, input_check) = decode_commit(frame.payload)
                        .context("commit frame payload is not 8 or 12 bytes")?;
                    out.last = Some(CommitInfo { offset: frame.offset + 1, input_position, input_check });
                    out.good_end = pos + n;
                    for d in damage.iter_mut().filter(|d| d.cleared_at.is_none()) {
                        d.cleared_at = Some(frame.offset + 1);
                    }
                }
                pos += n;
            }
            // A power cut tears only what no fsync covered: the last
            // transaction (its commit never acknowledged) and the open one.
            // Damage that two commits follow was fsynced, so it is media
            // damage, kept and reported like damage in a sealed segment;
            // anything else in the active segment is a torn tail.
            None if tail && commits_after(&buf, pos) < 2 => break,
            None => match resync(&buf, pos + 1) {
                Some(next) => {
                    expect = None;
                    damage.push(Damage { segment: path.to_path_buf(), byte: pos as u64, len: (next - pos) as u64, cleared_at: None });
                    tracing::error!(
                        "changelog segment {} is damaged at byte {pos} ({} bytes); valid frames follow, so nothing is \
                         truncated; a replay that needs those bytes will fail",
                        path.display(),
                        next - pos
                    );
                    pos = next;
                }
                None => bail!(
                    "changelog segment {} is damaged at byte {pos} and later segments exist; refusing to truncate \
                     committed data",
                    path.display()
                ),
            },
        }
    }
    Ok(out)
}

/// How many commit frames follow damage at `pos` (resyncing past more).
fn commits_after(buf: &[u8], pos: usize) -> usize {
    let mut commits = 0;
    let mut at = resync(buf, pos + 1);
    while let Some(p) = at {
        match decode(buf, p) {
            Some((frame, n)) => {
                commits += usize::from(frame.kind == KIND_COMMIT);
                at = Some(p + n);
            }
            None => at = resync(buf, p + 1),
        }
    }
    commits
}

/// Segment `path` must start at `base`, where the segments before it end.
fn check_follows(path: &Path, base: u64, before: Option<CommitInfo>) -> Result<()> {
    match before {
        Some(prev) if prev.offset != base => bail!(
            "changelog segment {} starts at offset {base} but the segments before it end at offset {}: \
             segments are missing or misplaced; nothing was changed",
            path.display(),
            prev.offset
        ),
        _ => Ok(()),
    }
}

/// Finds the next position after `from` where a valid frame starts.
fn resync(buf: &[u8], from: usize) -> Option<usize> {
    let magic = MAGIC.to_le_bytes();
    (from..buf.len().saturating_sub(HEADER - 1))
        .find(|&p| buf[p..p + 4] == magic && decode(buf, p).is_some())
}

/// The segment files of `dir` (base offset and path, in order) and the
/// `.clean` files an interrupted clean left.
fn list_segments(dir: &Path) -> Result<(Vec<(u64, PathBuf)>, Vec<PathBuf>)> {
    let mut segments = Vec::new();
    let mut leftovers = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(base) = name
            .strip_suffix(".log")
            .and_then(|b| b.parse::<u64>().ok())
        {
            segments.push((base, path));
        } else if name.ends_with(".log.clean") {
            leftovers.push(path);
        }
    }
    segments.sort();
    Ok((segments, leftovers))
}

/// What checking the segments at open found.
struct Checked {
    /// The last commit.
    last: Option<CommitInfo>,
    /// Where the committed data of the last segment ends.
    committed_len: u64,
    /// Sealed segments trusted by their seal, not yet scanned.
    unverified: Vec<usize>,
}

/// Checks that each segment follows the one before; scans the tail (cut
/// after its last commit) and any old segment without a seal (sealed now).
fn check_segments(segments: &[(u64, PathBuf)], report: &mut OpenReport) -> Result<Checked> {
    let mut checked = Checked {
        last: None,
        committed_len: 0,
        unverified: Vec::new(),
    };
    for (i, (base, path)) in segments.iter().enumerate() {
        let tail = i + 1 == segments.len();
        check_follows(path, *base, checked.last)?;
        if !tail {
            if let Some(sealed) = read_seal(path) {
                checked.last = Some(sealed);
                checked.unverified.push(i);
                continue;
            }
        }
        let found = scan(path, *base, tail, &mut report.damage)?;
        checked.last = found.last.or(checked.last);
        if tail {
            let dropped = found.len - found.good_end;
            if dropped > 0 {
                tracing::warn!(
                    "changelog: truncated {dropped} bytes after the last commit in {} (byte {} onwards: a torn \
                     write or a transaction left open by a crash)",
                    path.display(),
                    found.good_end
                );
                File::open_write(path)?.set_len(found.good_end as u64)?;
                report.truncated_bytes = dropped as u64;
            }
            checked.committed_len = found.good_end as u64;
        } else if let Some(l) = found.last {
            // An old segment without a (valid) seal: seal it now.
            write_seal(path, found.len as u64, l)?;
        }
    }
    Ok(checked)
}

impl EmbeddedLog {
    /// Opens (creating) the log in `dir`, checking and repairing as the
    /// module documentation says.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<Self> {
        file::create_dir_all(dir)
            .with_context(|| format!("cannot create changelog directory {}", dir.display()))?;
        let lock = crate::file::lock_dir(dir, "changelog directory")?;
        let (mut segments, leftovers) = list_segments(dir)?;
        // A clean a crash interrupted before its commit point (the rename)
        // is dropped; one interrupted after it is finished.
        for path in &leftovers {
            file::remove_file(path)
                .with_context(|| format!("cannot remove unfinished clean {}", path.display()))?;
        }
        let (deletes_kept_from, removed, cleaned) = finish_clean(&mut segments)?;
        if !leftovers.is_empty() || removed > 0 {
            file::sync_dir(dir)?;
            tracing::info!(
                "changelog: dropped {} unfinished clean(s), removed {removed} segment(s) a clean had replaced",
                leftovers.len()
            );
        }
        let mut report = OpenReport::default();
        let checked = check_segments(&segments, &mut report)?;
        // Offsets of a truncated open transaction are reused.
        let next_offset = checked.last.map_or(0, |c: CommitInfo| c.offset);
        if segments.is_empty() {
            segments.push((0, segment_path(dir, 0)));
        }
        let active = &segments.last().unwrap().1;
        let file = File::append(active)?;
        // Whatever this process read (perhaps only from the page cache of
        // a process that died inside its fsync) is durable from here on,
        // before a replay or a store commit can depend on it.
        if !crate::mutants::active("truncate-no-sync") {
            file.sync_data()?;
            file::sync_dir(dir)?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            segments,
            writer: BufWriter::with_capacity(1 << 16, file),
            committed_len: checked.committed_len,
            written_len: checked.committed_len,
            next_offset,
            last: checked.last,
            report,
            unverified: checked.unverified,
            failed: None,
            _lock: lock,
            cleaning: Cleaning::new(deletes_kept_from, cleaned),
        })
    }

    /// Scans the sealed segments a replay from `from` will read, adding any
    /// damage to `report.damage`. Call before anything depends on them.
    pub fn verify_from(&mut self, from: u64) -> Result<()> {
        let first = self
            .segments
            .iter()
            .rposition(|(base, _)| *base <= from)
            .unwrap_or(0);
        let (check, keep): (Vec<usize>, Vec<usize>) =
            self.unverified.iter().partition(|&&i| i >= first);
        self.unverified = keep;
        for i in check {
            let path = self.segments[i].1.clone();
            let end = read_seal(&path).map(|c| c.offset);
            let before = self.report.damage.len();
            let base = self.segments[i].0;
            scan(&path, base, false, &mut self.report.damage)?;
            // Damage after the segment's last commit is cleared where the
            // next segment starts: a replay from there never reads it.
            for d in &mut self.report.damage[before..] {
                d.cleared_at = d.cleared_at.or(end);
            }
        }
        Ok(())
    }

    fn write_frame(&mut self, kind: u8, payload: &[&[u8]]) -> Result<u64> {
        let mut buf = Vec::new();
        let offset = self.next_offset;
        encode(&mut buf, kind, offset, payload);
        self.writer.write_all(&buf)?;
        self.written_len += buf.len() as u64;
        self.next_offset += 1;
        Ok(offset)
    }

    fn roll(&mut self) -> Result<()> {
        let full = &self.segments.last().unwrap().1;
        write_seal(
            full,
            self.committed_len,
            self.last.expect("a segment rolls at a commit"),
        )?;
        let path = segment_path(&self.dir, self.next_offset);
        let file = File::append(&path)?;
        file::sync_dir(&self.dir)?;
        self.writer = BufWriter::with_capacity(1 << 16, file);
        self.segments.push((self.next_offset, path));
        self.committed_len = 0;
        self.written_len = 0;
        self.cleaning.check_due = true;
        Ok(())
    }

    fn append_frames(&mut self, records: &[Record]) -> Result<()> {
        for record in records {
            let (op, key, value): (u8, &[u8], &[u8]) = match record {
                Record::Put(k, v) => (OP_PUT, k, v),
                Record::Delete(k) => (OP_DELETE, k, &[]),
            };
            self.write_frame(
                KIND_DATA,
                &[&[op], &(key.len() as u32).to_le_bytes(), key, value],
            )?;
        }
        Ok(())
    }

    fn commit_frame(&mut self, input_position: u64, input_check: Option<u32>) -> Result<u64> {
        let marker =
            self.write_frame(KIND_COMMIT, &[&encode_commit(input_position, input_check)])?;
        self.writer.flush()?;
        crate::crash::step("before-changelog-sync");
        if !crate::mutants::active("changelog-no-sync") {
            self.writer
                .get_ref()
                .sync_data()
                .context("changelog commit failed")?;
        }
        self.committed_len = self.written_len;
        let info = CommitInfo {
            offset: marker + 1,
            input_position,
            input_check,
        };
        self.last = Some(info);
        if self.committed_len >= self.segment_bytes {
            self.roll()?;
        }
        Ok(info.offset)
    }

    /// Runs `op`; a failure poisons the log (see the module documentation).
    fn guarded<T>(&mut self, op: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if let Some(first) = &self.failed {
            bail!("changelog failed earlier ({first}); nothing after it is trusted: restart to recover");
        }
        op(self).inspect_err(|e| self.failed = Some(format!("{e:#}")))
    }

    /// The segment files, oldest first.
    #[cfg(test)]
    pub fn segments(&self) -> impl Iterator<Item = &Path> {
        self.segments.iter().map(|(_, p)| p.as_path())
    }
}

impl Changelog for EmbeddedLog {
    fn append(&mut self, records: &[Record]) -> Result<()> {
        self.guarded(|log| log.append_frames(records))
    }

    fn commit(&mut self, input_position: u64, input_check: Option<u32>) -> Result<u64> {
        self.guarded(|log| log.commit_frame(input_position, input_check))
    }

    fn read_committed(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(Replayed) -> Result<()>,
    ) -> Result<()> {
        self.writer.flush()?;
        let first = self
            .segments
            .iter()
            .rposition(|(base, _)| *base <= from)
            .unwrap_or(0);
        let mut last_good = from;
        for (i, (_, path)) in self.segments[first..].iter().enumerate() {
            let buf = std::fs::read(path)
                .with_context(|| format!("cannot read changelog segment {}", path.display()))?;
            // The open transaction of the active segment is not for readers.
            let limit = if first + i + 1 == self.segments.len() {
                self.committed_len as usize
            } else {
                buf.len()
            };
            let mut pending = Vec::new();
            // Damage inside the transaction being read: fatal only if it is delivered.
            let mut damaged_at: Option<usize> = None;
            let mut pos = 0;
            while pos < limit {
                let Some((frame, n)) = decode(&buf, pos) else {
                    match resync(&buf[..limit], pos + 1) {
                        Some(next) => {
                            damaged_at.get_or_insert(pos);
                            pos = next;
                            continue;
                        }
                        None => bail!(
                            "changelog segment {} is corrupt at byte {pos} (bad checksum or frame): replay cannot go \
                             past offset {last_good}; nothing was deleted",
                            path.display()
                        ),
                    }
                };
                match frame.kind {
                    KIND_DATA => pending.push(frame.payload),
                    KIND_CLEANED => {}
                    KIND_COMMIT => {
                        let txn_end = frame.offset + 1;
                        if txn_end > from {
                            if let Some(at) = damaged_at {
                                bail!(
                                    "changelog segment {} is corrupt at byte {at} (bad checksum or frame) inside the \
                                     transaction ending at offset {txn_end}: replay cannot go past offset {last_good}; \
                                     nothing was deleted",
                                    path.display()
                                );
                            }
                            for payload in pending.drain(..) {
                                let record = decode_record(payload).with_context(|| {
                                    format!("changelog segment {} at byte {pos}", path.display())
                                })?;
                                f(Replayed::Record(record))?;
                            }
                            f(Replayed::Commit(txn_end))?;
                        }
                        pending.clear();
                        damaged_at = None;
                        last_good = txn_end.max(from);
                    }
                    k => bail!(
                        "changelog segment {} has a frame of unknown kind {k} at byte {pos}",
                        path.display()
                    ),
                }
                pos += n;
            }
        }
        Ok(())
    }

    fn check_replayable(&mut self, from: u64) -> Result<()> {
        let (first, path) = &self.segments[0];
        if from < *first {
            bail!(
                "changelog in {} starts at offset {first} ({}) but recovery needs to replay from offset {from}: \
                 earlier segments are missing; nothing was changed",
                self.dir.display(),
                path.display()
            );
        }
        self.verify_from(from)?;
        for d in &self.report.damage {
            if d.cleared_at.is_none_or(|c| c > from) {
                bail!(
                    "changelog segment {} is damaged at byte {} ({} bytes) and recovery needs to replay across it \
                     (from offset {from}); nothing was changed or deleted: restore the segment from a copy (removing the \
                     state directory would delete the only copy of the committed data)",
                    d.segment.display(),
                    d.byte,
                    d.len
                );
            }
        }
        Ok(())
    }

    fn last_commit(&self) -> Option<CommitInfo> {
        self.last
    }

    fn clean_now(&mut self, store_offset: u64) -> Result<Option<CleanStats>> {
        EmbeddedLog::clean_now(self, store_offset)
    }

    fn store_committed(&mut self, offset: u64) -> Result<()> {
        self.guarded(|log| log.clean_step(offset))
    }

    fn deletes_kept_from(&self) -> u64 {
        self.cleaning.deletes_kept_from
    }

    fn figures(&self) -> Option<crate::metrics::ChangelogFigures> {
        // Sealed segments by their length on disk (a stat each: called
        // at most once a second), the active one by what was written.
        let sealed = &self.segments[..self.segments.len().saturating_sub(1)];
        let bytes = sealed
            .iter()
            .filter_map(|(_, p)| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum::<u64>()
            + self.written_len;
        Some(crate::metrics::ChangelogFigures {
            bytes,
            segments: self.segments.len() as u64,
            cleaner_runs: self.cleaning.runs,
        })
    }
}

impl Drop for EmbeddedLog {
    fn drop(&mut self) {
        if let Some(running) = self.cleaning.running.take() {
            // What it installed is on disk; open takes it in next time.
            let _ = running.cancel();
        }
    }
}

#[cfg(test)]
mod tests;
