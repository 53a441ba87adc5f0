//! One pass of the cleaner: the key index built over the plan's segments,
//! then each group of segments rewritten into one `.clean` file keeping
//! each key's latest record (and the commits that bound them).

use super::index::{self, Index, KeyReader, Verdict};
use super::{
    building_path, data_key, encode_header, open_frames, read_header, Built, CleanStats, Header,
    OwnedFrame, Plan, WriteFailed, COMMIT_EVERY,
};
use crate::changelog::frame::{KIND_CLEANED, KIND_COMMIT, KIND_DATA, OP_DELETE};
use crate::changelog::CommitInfo;
use crate::file::{self, File};
use anyhow::{bail, Context, Result};
use std::hash::BuildHasher;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// One pass's state.
pub(super) struct Pass<'a> {
    pub(super) plan: &'a Plan,
    pub(super) index: Index,
    pub(super) keys: KeyReader,
    /// The plan's bound, raised to its inputs' own.
    pub(super) deletes_below: u64,
    /// How many of the plan's segments (a prefix) the pass rewrites.
    pub(super) rewrite: usize,
    /// Where the pass leaves the clean point: the index's end, lowered to
    /// the first indexed record of a key that lost a hash collision.
    pub(super) clean_to: u64,
}

/// What writing a group came to.
pub(super) enum Written {
    Built(Built),
    Cancelled,
    /// A key lost a hash collision at this offset, below the header's
    /// clean point: the group is written again with the clean point there.
    Collided(u64),
}

/// A data frame's fate in a cleaned group.
enum Keep {
    Yes,
    No,
    /// Its key lost a hash collision at this offset, below the clean point.
    Collided(u64),
}

/// The cleaned file a group is written to, and what went into it.
struct GroupOut {
    out: BufWriter<File>,
    len: u64,
    /// Offsets must increase through a cleaned segment.
    previous: Option<u64>,
    kept_since_commit: u64,
    /// The last commit read, kept or not: the group's end.
    last: Option<CommitInfo>,
    stats: CleanStats,
}

impl GroupOut {
    /// Creates `path` and writes the group's header frame.
    fn create(path: &Path, base: u64, header: Header, segments_in: u64) -> Result<Self> {
        let out = BufWriter::with_capacity(1 << 16, File::create(path).map_err(WriteFailed)?);
        let mut group = GroupOut {
            out,
            len: 0,
            previous: None,
            kept_since_commit: 0,
            last: None,
            stats: CleanStats {
                segments_in,
                ..CleanStats::default()
            },
        };
        let mut bytes = Vec::new();
        crate::changelog::frame::encode(&mut bytes, KIND_CLEANED, base, &[&encode_header(header)]);
        group.out.write_all(&bytes).map_err(WriteFailed)?;
        group.len = bytes.len() as u64;
        Ok(group)
    }

    fn write(&mut self, frame: &OwnedFrame) -> Result<()> {
        self.out.write_all(&frame.bytes).map_err(WriteFailed)?;
        self.len += frame.bytes.len() as u64;
        Ok(())
    }

    /// Writes a kept frame of `path`, whose offset must follow the last.
    fn keep(&mut self, frame: &OwnedFrame, path: &Path) -> Result<()> {
        if self.previous.is_some_and(|p| frame.offset <= p) {
            bail!(
                "changelog offsets go back at {} in {}: not cleaned",
                frame.offset,
                path.display()
            );
        }
        self.previous = Some(frame.offset);
        if frame.kind == KIND_DATA {
            self.stats.records_kept += 1;
            self.kept_since_commit += 1;
        } else {
            self.stats.commits_kept += 1;
        }
        self.write(frame)
    }
}

impl<'a> Pass<'a> {
    /// Builds the index. None if `cancel` was set.
    pub(super) fn new(plan: &'a Plan, cancel: &AtomicBool) -> Result<Option<Pass<'a>>> {
        // A seed per pass: keys that collide in one pass do not in the next.
        let seed = std::collections::hash_map::RandomState::new().hash_one(plan.clean_to);
        let Some(index) = Index::build(plan, seed, cancel)? else {
            return Ok(None);
        };
        let rewrite = plan
            .segments
            .iter()
            .take_while(|(base, _)| *base < index.end)
            .count();
        let mut deletes_below = plan.deletes_below;
        for (_, path) in &plan.segments[..rewrite] {
            if let Some(h) = read_header(path)? {
                deletes_below = deletes_below.max(h.deletes_below);
            }
        }
        Ok(Some(Pass {
            plan,
            keys: KeyReader::new(plan),
            deletes_below,
            rewrite,
            clean_to: index.end,
            index,
        }))
    }

    /// The end offset of the group ending before segment `stop`.
    pub(super) fn group_end(&self, stop: usize) -> u64 {
        self.plan
            .segments
            .get(stop)
            .map_or(self.plan.end, |(b, _)| *b)
    }

    /// Writes what segments `first..stop` keep into one durable `.clean`
    /// file that takes the first one's place.
    fn write_group(&mut self, first: usize, stop: usize, cancel: &AtomicBool) -> Result<Written> {
        let end = self.group_end(stop);
        let header = Header {
            end,
            deletes_below: self.deletes_below,
            clean_to: self.clean_to.min(end),
        };
        let (base, first_path) = &self.plan.segments[first];
        let out_path = building_path(first_path);
        let mut out = GroupOut::create(&out_path, *base, header, (stop - first) as u64)?;
        for segment in first..stop {
            if let Some(stopped) =
                self.copy_segment(segment, header, &mut out, cancel, segment + 1 == stop)?
            {
                drop(out);
                let _ = file::remove_file(&out_path);
                return Ok(stopped);
            }
        }
        let last = out.last.context("the segments to clean hold no commit")?;
        if last.offset != end {
            bail!(
                "the segments to clean end at offset {} but the next segment starts at {end}: not cleaned",
                last.offset
            );
        }
        let file = out
            .out
            .into_inner()
            .map_err(|e| WriteFailed(e.into_error()))?;
        file.sync_all().map_err(WriteFailed)?;
        let mut stats = out.stats;
        stats.bytes_out = out.len;
        stats.records_dropped = stats.records_in - stats.records_kept;
        Ok(Written::Built(Built {
            file: out_path,
            covers: stop - first,
            base: *base,
            deletes_below: header.deletes_below,
            clean_to: header.clean_to,
            last,
            len: out.len,
            stats,
        }))
    }

    /// Copies what `segment` keeps into `out`. Some when the group stops
    /// short: cancelled, or a key lost a hash collision below the clean
    /// point.
    fn copy_segment(
        &mut self,
        segment: usize,
        header: Header,
        out: &mut GroupOut,
        cancel: &AtomicBool,
        last_segment: bool,
    ) -> Result<Option<Written>> {
        let plan = self.plan;
        let path = &plan.segments[segment].1;
        out.stats.bytes_in += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let mut frames = open_frames(path)?;
        // Commit frames are kept only after data: the covered range's last
        // one always (it is written after the loop if it was skipped).
        let mut pending_commit: Option<OwnedFrame> = None;
        while let Some(frame) = frames.next_frame()? {
            if cancel.load(Ordering::Relaxed) {
                return Ok(Some(Written::Cancelled));
            }
            let keep = match frame.kind {
                KIND_DATA => {
                    match self.data_verdict(&frame, segment, path, header, &mut out.stats)? {
                        Keep::Yes => true,
                        Keep::No => false,
                        Keep::Collided(offset) => return Ok(Some(Written::Collided(offset))),
                    }
                }
                KIND_COMMIT => {
                    let (position, check) = crate::changelog::frame::decode_commit(&frame.payload)
                        .context("commit frame payload is not 8 or 12 bytes")?;
                    out.last = Some(CommitInfo {
                        offset: frame.offset + 1,
                        input_position: position,
                        input_check: check,
                    });
                    if out.kept_since_commit >= COMMIT_EVERY {
                        out.kept_since_commit = 0;
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
                out.keep(&frame, path)?;
            }
        }
        if last_segment {
            if let Some(frame) = pending_commit.take() {
                out.stats.commits_kept += 1;
                out.write(&frame)?;
            }
        }
        Ok(None)
    }

    /// Whether a data frame is kept: the latest record of its key, unless
    /// a delete the store no longer needs.
    fn data_verdict(
        &mut self,
        frame: &OwnedFrame,
        segment: usize,
        path: &Path,
        header: Header,
        stats: &mut CleanStats,
    ) -> Result<Keep> {
        stats.records_in += 1;
        let (op, key) = data_key(&frame.payload, path)?;
        let at = index::position(segment, frame.pos);
        Ok(
            match self.index.verdict(at, frame.offset, key, &mut self.keys)? {
                Verdict::Superseded => Keep::No,
                Verdict::Latest if op == OP_DELETE && frame.offset < header.deletes_below => {
                    stats.deletes_dropped += 1;
                    Keep::No
                }
                Verdict::Collided if frame.offset < header.clean_to => Keep::Collided(frame.offset),
                Verdict::Latest | Verdict::Unindexed | Verdict::Collided => Keep::Yes,
            },
        )
    }

    /// [`Pass::write_group`], again with a lower clean point after a
    /// collision (each retry lowers it, so this ends).
    pub(super) fn build_group(
        &mut self,
        first: usize,
        stop: usize,
        cancel: &AtomicBool,
    ) -> Result<Written> {
        loop {
            match self.write_group(first, stop, cancel)? {
                Written::Collided(at) => self.clean_to = at,
                done => return Ok(done),
            }
        }
    }
}

/// Builds one `.clean` file for every segment a pass over `plan` rewrites,
/// without installing it (tests).
#[cfg(test)]
pub fn build(plan: &Plan, cancel: &AtomicBool) -> Result<Option<Built>> {
    let Some(mut pass) = Pass::new(plan, cancel)? else {
        return Ok(None);
    };
    match pass.build_group(0, pass.rewrite, cancel)? {
        Written::Built(b) => Ok(Some(b)),
        _ => Ok(None),
    }
}
