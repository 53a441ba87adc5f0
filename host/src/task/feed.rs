//! Feeding a task from an input file: one record per newline-terminated
//! line, from the position the changelog says the last run committed, after
//! checking that the input is the one the store consumed.

use super::serve::QueryServer;
use super::Task;
use anyhow::{Context as _, Result};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Live queries are answered every this many records (between records:
/// one accept call, well under a record's cost).
const QUERY_POLL_RECORDS: u64 = 64;

/// Processes the input from the task's committed position to its end: one
/// record per newline-terminated line (a last line without a newline is
/// left for a later run, when it is complete).
pub(crate) fn feed(
    task: &mut Task,
    input: &Path,
    server: Option<&QueryServer>,
    progress: bool,
) -> Result<()> {
    feed_until(task, input, server, progress, None).map(|_| ())
}

/// [`feed`], stopping between records once `stop` is set (a signal):
/// returns true if it stopped before the end of the input. The caller
/// then closes the task, which commits everything processed.
pub(crate) fn feed_until(
    task: &mut Task,
    input: &Path,
    server: Option<&QueryServer>,
    progress: bool,
    stop: Option<&AtomicBool>,
) -> Result<bool> {
    let (mut reader, total, mut check) = open_checked(task, input)?;
    let mut position = task.input_position();
    let (bar, mut log) = progress_meters(progress, position, total);
    let mut line = Vec::new();
    let mut warnings = Warnings::default();
    let mut stopped = false;
    loop {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            stopped = true;
            break;
        }
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        let Some(record) = line.strip_suffix(b"\n") else {
            // A record ends only at a newline: a last line without one may
            // still be being written, and taking it now would split it.
            eprintln!(
                "note: input {} ends with a line of {n} bytes without a newline (byte {position}): held until it \
                 is complete",
                input.display()
            );
            break;
        };
        position += n as u64;
        check = crc32c::crc32c_append(check, &line);
        task.set_next_input_check(check);
        warnings.look(input, record, position);
        task.process_line(record, position)?;
        task.stats.input_bytes += n as u64;
        if task.stats.records % QUERY_POLL_RECORDS == 0 {
            if let Some(server) = server {
                server.poll(task)?;
            }
        }
        if task.stats.records % 4096 == 0 {
            bar.set_position(position);
            log.tick(position, task.stats.records);
        }
    }
    bar.finish_and_clear();
    Ok(stopped)
}

/// The input opened at the task's position, with its length and the
/// checksum of what came before. The input consumed so far must be the one
/// the store consumed: a different file of sufficient length would
/// otherwise resume mid-way.
fn open_checked(task: &Task, input: &Path) -> Result<(BufReader<std::fs::File>, u64, u32)> {
    let file = std::fs::File::open(input)
        .with_context(|| format!("cannot open input {}", input.display()))?;
    let total = file.metadata()?.len();
    let position = task.input_position();
    if position > total {
        anyhow::bail!(
            "input {} has {total} bytes but the changelog says {position} were already processed: wrong input file?",
            input.display()
        );
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut check = 0u32;
    let mut left = position;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = reader.read(&mut buf[..left.min(1 << 20) as usize])?;
        anyhow::ensure!(n > 0, "input {} shrank while it was read", input.display());
        check = crc32c::crc32c_append(check, &buf[..n]);
        left -= n as u64;
    }
    if let Some(committed) = task.committed_input_check() {
        if committed != check {
            anyhow::bail!(
                "input {} is not the input this store consumed: its first {position} bytes differ from what was \
                 committed (crc32c {check:08x}, committed {committed:08x}); give the same file (it may have grown), \
                 or use a new state_dir for new input",
                input.display()
            );
        }
    }
    Ok((reader, total, check))
}

/// A bar for a person at a terminal; a plain line every PROGRESS_EVERY for
/// a log (CI, a service's journal, `| tee`).
fn progress_meters(
    progress: bool,
    position: u64,
    total: u64,
) -> (indicatif::ProgressBar, PlainProgress) {
    use std::io::IsTerminal as _;
    let terminal = std::io::stderr().is_terminal();
    let bar = if progress && terminal {
        indicatif::ProgressBar::new(total).with_position(position)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap(),
    );
    (
        bar,
        PlainProgress::new(progress && !terminal, position, total),
    )
}

/// What an input's records may hold that is worth one warning, not one per
/// record.
#[derive(Default)]
struct Warnings {
    crlf: bool,
    utf8: bool,
}

impl Warnings {
    /// `record` ends at input byte `end`.
    fn look(&mut self, input: &Path, record: &[u8], end: u64) {
        if !self.crlf && record.ends_with(b"\r") {
            self.crlf = true;
            tracing::warn!(
                "input {} has CRLF line ends (first at byte {}): the \\r stays part of each record",
                input.display(),
                end - 1
            );
        }
        if !self.utf8 && std::str::from_utf8(record).is_err() {
            self.utf8 = true;
            tracing::warn!(
                "input {} is not valid UTF-8 (first in the line ending at byte {end}): records are taken as bytes",
                input.display()
            );
        }
    }
}

/// How often a run that is not on a terminal says where it is
/// (`TXSTORE_PROGRESS_MS` sets another period).
pub(crate) fn progress_every() -> std::time::Duration {
    let ms = std::env::var("TXSTORE_PROGRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    std::time::Duration::from_millis(ms)
}

/// Plain progress lines on stderr, for a log.
struct PlainProgress {
    on: bool,
    every: std::time::Duration,
    total: u64,
    last: std::time::Instant,
    last_position: u64,
}

impl PlainProgress {
    fn new(on: bool, position: u64, total: u64) -> Self {
        PlainProgress {
            on,
            every: progress_every(),
            total,
            last: std::time::Instant::now(),
            last_position: position,
        }
    }

    fn tick(&mut self, position: u64, records: u64) {
        let elapsed = self.last.elapsed();
        if !self.on || elapsed < self.every {
            return;
        }
        let rate = (position - self.last_position) as f64 / elapsed.as_secs_f64();
        let eta = (self.total.saturating_sub(position)) as f64 / rate.max(1.0);
        eprintln!(
            "progress: byte {position} of {} ({:.1}%), {records} records this run, {:.1} MB/s, eta {eta:.0} s",
            self.total,
            100.0 * position as f64 / self.total.max(1) as f64,
            rate / 1e6
        );
        self.last = std::time::Instant::now();
        self.last_position = position;
    }
}
