//! How an open embedded log cleans itself: when a clean pass is due, and
//! what the log takes in from one ([`super::super::clean`]).

use super::super::clean::{self, CleanStats};
use super::super::frame::{read_seal, remove_if_exists, seal_path};
use super::EmbeddedLog;
use crate::config::CleanMode;
use anyhow::{bail, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How the log cleans itself ([`super::super::clean`]).
#[derive(Clone, Copy, Debug)]
pub struct CleanSettings {
    pub mode: CleanMode,
    /// The most a clean's key index may hold.
    pub memory_bytes: usize,
}

/// The cleaner's state in an open log.
pub(super) struct Cleaning {
    pub(super) settings: CleanSettings,
    pub(super) running: Option<clean::Background>,
    /// Cleaning stopped for this process (damage).
    pub(super) stopped: bool,
    /// A pass ended short of the log's end (noted once per process).
    pub(super) short_noted: bool,
    /// A segment was sealed (or a clean taken in) since the last look: only
    /// then can a clean have become due, so commits in between skip it.
    pub(super) check_due: bool,
    /// Deletes below this offset may have been cleaned away.
    pub(super) deletes_kept_from: u64,
    /// The segments a clean wrote: base offset -> their header's clean
    /// point. The log's clean point is the last one's.
    pub(super) cleaned: std::collections::BTreeMap<u64, u64>,
    /// Passes taken in since open (metrics).
    pub(super) runs: u64,
}

impl Cleaning {
    /// Cleaning off, as an open log starts.
    pub(super) fn new(
        deletes_kept_from: u64,
        cleaned: std::collections::BTreeMap<u64, u64>,
    ) -> Self {
        Cleaning {
            settings: CleanSettings {
                mode: CleanMode::Off,
                memory_bytes: 256 << 20,
            },
            running: None,
            stopped: false,
            short_noted: false,
            check_due: true,
            deletes_kept_from,
            cleaned,
            runs: 0,
        }
    }
}

/// Removes the segments a cleaned segment covers (left by a crash after
/// the clean's commit point). Returns the highest bound below which
/// deletes were cleaned away, how many segments it removed, and the
/// cleaned segments' clean points.
pub(super) fn finish_clean(
    segments: &mut Vec<(u64, PathBuf)>,
) -> Result<(u64, usize, std::collections::BTreeMap<u64, u64>)> {
    let mut cleaned = std::collections::BTreeMap::new();
    let mut deletes_kept_from = 0;
    let mut removed = 0;
    let mut i = 0;
    while i < segments.len() {
        let Some(h) = clean::read_header(&segments[i].1)? else {
            i += 1;
            continue;
        };
        deletes_kept_from = deletes_kept_from.max(h.deletes_below);
        cleaned.insert(segments[i].0, h.clean_to);
        while let Some((base, path)) = segments.get(i + 1).cloned() {
            if base >= h.end {
                break;
            }
            if let Some(end) = read_seal(&path).map(|c| c.offset) {
                if end > h.end {
                    bail!(
                        "changelog segment {} (offsets {base}..{end}) overlaps the cleaned segment {} (up to {}): \
                         nothing was changed",
                        path.display(),
                        segments[i].1.display(),
                        h.end
                    );
                }
            }
            remove_if_exists(&path)?;
            remove_if_exists(&seal_path(&path))?;
            segments.remove(i + 1);
            removed += 1;
        }
        i += 1;
    }
    Ok((deletes_kept_from, removed, cleaned))
}

impl EmbeddedLog {
    /// Turns cleaning on (or off): see [`super::super::clean`]. A background clean
    /// runs inline while a crash point is armed, so that a crash test's
    /// steps come in the same order every run.
    pub fn set_cleaning(&mut self, mut settings: CleanSettings) {
        if settings.mode == CleanMode::Background && crate::crash::armed_mode().is_some() {
            settings.mode = CleanMode::Inline;
        }
        self.cleaning.settings = settings;
    }

    /// Cleans every sealed segment now (sealing the active one first if it
    /// holds commits), dropping deletes below `store_offset`, the offset
    /// the store is durably committed at: pass after pass until the clean
    /// point reaches the end (when the dirty keys outnumber what the index
    /// holds, a pass covers only part of the log). Returns the clean's
    /// figures, or None if there was nothing to clean. A clean that could
    /// not reach the end says so in them (`clean_to` below `log_end`).
    pub fn clean_now(&mut self, store_offset: u64) -> Result<Option<CleanStats>> {
        if let Some(running) = self.cleaning.running.take() {
            let outcome = running.cancel();
            self.guarded(|log| log.apply(outcome).map(|_| ()))?;
        }
        self.guarded(|log| {
            if log.written_len > log.committed_len {
                bail!("changelog: cannot clean with a transaction open");
            }
            if log.committed_len > 0 {
                log.writer.flush()?;
                log.roll()?;
            }
            let mut total: Option<CleanStats> = None;
            // Passes that left the clean point where it was (a key that lost
            // a hash collision at the clean point; each pass has its own seed).
            let mut stalled = 0;
            while let Some(plan) = log.clean_plan(store_offset, true) {
                let before = log.clean_point();
                let mut outcome =
                    clean::run(&plan, &log.dir, &std::sync::atomic::AtomicBool::new(false));
                let skipped = match outcome.stopped.take() {
                    Some(clean::Stopped::Skipped(e)) => Some(e),
                    other => {
                        outcome.stopped = other;
                        None
                    }
                };
                let stats = log.apply(outcome)?;
                if let Some(e) = skipped {
                    return Err(e);
                }
                match &mut total {
                    None => total = Some(stats),
                    Some(t) => t.then(&stats),
                }
                let now = log.clean_point();
                stalled = if now > before { 0 } else { stalled + 1 };
                if now >= plan.end || stalled >= 3 {
                    break;
                }
            }
            Ok(total)
        })
    }

    /// The log's clean point: below it, at most one record per key.
    pub(super) fn clean_point(&self) -> u64 {
        self.cleaning
            .cleaned
            .last_key_value()
            .map_or(0, |(_, clean_to)| *clean_to)
    }

    /// The clean to run now, if any: every sealed segment, once the ones no
    /// clean wrote hold a segment's bytes and half the cleaned ones' (a
    /// dirty ratio of 1/3); or whenever there is one if `force`. Disk then
    /// peaks near 1.5 times the live state and three segments (cleaned,
    /// half as much dirty and the segment that crossed the line, the
    /// active one, one group being rewritten): within twice the live state
    /// and one segment once the state holds four segments. Each clean
    /// rewrites about three bytes per byte of history it takes in.
    fn clean_plan(&self, store_offset: u64, force: bool) -> Option<clean::Plan> {
        let sealed = &self.segments[..self.segments.len() - 1];
        if sealed.is_empty() {
            return None;
        }
        let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let (mut cleaned, mut dirty) = (0u64, 0u64);
        for (base, path) in sealed {
            if self.cleaning.cleaned.contains_key(base) {
                cleaned += len(path);
            } else {
                dirty += len(path);
            }
        }
        let due = dirty >= self.segment_bytes.max(cleaned / 2);
        if !force && !due {
            return None;
        }
        Some(clean::Plan {
            segments: sealed.to_vec(),
            end: self.segments[self.segments.len() - 1].0,
            clean_to: self.clean_point(),
            deletes_below: store_offset,
            memory_bytes: self.cleaning.settings.memory_bytes,
            group_bytes: self.segment_bytes,
        })
    }

    /// After a store commit: takes in a finished background clean, or
    /// starts (or runs inline) one that is due.
    pub(super) fn clean_step(&mut self, store_offset: u64) -> Result<()> {
        if let Some(running) = &self.cleaning.running {
            if !running.is_finished() {
                return Ok(());
            }
            let outcome = self.cleaning.running.take().unwrap().join();
            return self.apply(outcome).map(|_| ());
        }
        if self.cleaning.stopped
            || self.cleaning.settings.mode == CleanMode::Off
            || !std::mem::take(&mut self.cleaning.check_due)
        {
            return Ok(());
        }
        let Some(plan) = self.clean_plan(store_offset, false) else {
            return Ok(());
        };
        match self.cleaning.settings.mode {
            CleanMode::Background => {
                self.cleaning.running = Some(clean::Background::start(plan, self.dir.clone()))
            }
            CleanMode::Inline => {
                let outcome =
                    clean::run(&plan, &self.dir, &std::sync::atomic::AtomicBool::new(false));
                self.apply(outcome)?;
            }
            CleanMode::Off => unreachable!(),
        }
        Ok(())
    }

    /// Takes in what a clean installed (its files are in place already),
    /// then acts on why it stopped: damage or the memory bound stop
    /// cleaning with one warning; an I/O error is returned, so the log
    /// fails and the process stops. Returns the figures of what it did.
    pub(super) fn apply(&mut self, outcome: clean::Outcome) -> Result<CleanStats> {
        let mut total = CleanStats::default();
        let unverified: Vec<u64> = self
            .unverified
            .iter()
            .map(|&i| self.segments[i].0)
            .collect();
        for g in &outcome.installed {
            let at = self
                .segments
                .iter()
                .position(|(b, _)| *b == g.base)
                .expect("a clean's group starts at a segment of the log");
            assert!(
                at + g.covers < self.segments.len(),
                "a clean never covers the active segment"
            );
            for (base, _) in self.segments.drain(at + 1..at + g.covers) {
                self.cleaning.cleaned.remove(&base);
            }
            let c = &mut self.cleaning;
            c.cleaned.insert(g.base, g.clean_to);
            c.deletes_kept_from = c.deletes_kept_from.max(g.deletes_below);
            total.add(&g.stats);
        }
        total.passes = 1;
        self.cleaning.runs += 1;
        total.index_capacity = outcome.index_capacity as u64;
        total.clean_to = self.clean_point();
        total.log_end = outcome.end;
        // A pass that ended short of the log's end (its index full) leaves
        // segments that may already be due again.
        self.cleaning.check_due = true;
        if outcome.stopped.is_none() && total.clean_to < outcome.end && !self.cleaning.short_noted {
            self.cleaning.short_noted = true;
            tracing::info!(
                "changelog cleaning in {}: changelog.clean_memory_bytes = {} holds {} keys, fewer than the \
                 dirty keys: a pass covers part of the log (offsets below {} of {}), the next ones go on",
                self.dir.display(),
                self.cleaning.settings.memory_bytes,
                outcome.index_capacity,
                total.clean_to,
                outcome.end
            );
        }
        // A clean reads every segment it covers whole: those are verified.
        let installed: Vec<u64> = outcome.installed.iter().map(|g| g.base).collect();
        self.unverified = self
            .segments
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| unverified.contains(b) && !installed.contains(b))
            .map(|(i, _)| i)
            .collect();
        if !outcome.installed.is_empty() {
            tracing::debug!(
                groups = outcome.installed.len(),
                ?total,
                "changelog cleaned"
            );
        }
        match outcome.stopped {
            None | Some(clean::Stopped::Cancelled) => Ok(total),
            Some(clean::Stopped::Skipped(e)) => {
                tracing::warn!(
                    "changelog cleaning in {} stopped: {e:#}; the changelog grows until the next start",
                    self.dir.display()
                );
                self.cleaning.stopped = true;
                Ok(total)
            }
            Some(clean::Stopped::Io(e)) => Err(e),
        }
    }
}
