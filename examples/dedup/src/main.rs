//! Deduplication with an event-time window, on txstore as a library.
//!
//! Input lines are `id<TAB>time<TAB>payload` (`time` a non-negative
//! integer, for example milliseconds). A record is accepted, and written to
//! the output as `id<TAB>payload`, unless a record with the same id was
//! accepted less than `window` time units before it (or at a later time:
//! input a little out of order is still deduplicated). The store keeps,
//! per id, the time of its last accepted record. Malformed lines are
//! skipped.
//!
//! Exactly once: the output file and the store commit with the input
//! position, so a crash at any instant, then a rerun, gives the output of
//! one uncrashed run.
//!
//! ```text
//! dedup run  --state DIR --input FILE [--window N] [--guest G] [--commit-every N]
//! dedup dump --state DIR          # the committed store: id<TAB>time
//! ```
//!
//! The output is `DIR/out.tsv`; a reader should take only its first N
//! bytes, N being the number in `DIR/out.tsv.committed`.

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;
use txstore::{Context, Error, Input, Isolation, Processor, TaskBuilder};

/// The deduplication logic: one record in, at most one output record out.
struct Dedup {
    window: u64,
}

/// `id<TAB>time<TAB>payload`, or `None` for a malformed line.
fn parse(line: &[u8]) -> Option<(&[u8], u64, &[u8])> {
    let mut fields = line.splitn(3, |&b| b == b'\t');
    let id = fields.next().filter(|id| !id.is_empty())?;
    let time = std::str::from_utf8(fields.next()?).ok()?;
    if time.is_empty() || !time.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id, time.parse().ok()?, fields.next()?))
}

impl Processor for Dedup {
    fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
        let Some((id, time, payload)) = input.value().and_then(parse) else {
            return Ok(());
        };
        if let Some(last) = ctx.get(id)? {
            let last: u64 = std::str::from_utf8(&last)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    Error::processor(format!(
                        "id {}: stored time is not a number",
                        id.escape_ascii()
                    ))
                })?;
            if time < last.saturating_add(self.window) {
                return Ok(()); // a duplicate
            }
        }
        ctx.put(id, time.to_string().as_bytes());
        ctx.emit(id, Some(payload));
        Ok(())
    }
}

struct Args {
    command: String,
    state: PathBuf,
    input: Option<PathBuf>,
    window: u64,
    guest: String,
    commit_every: u64,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let command = it.next().ok_or("usage: dedup run|dump --state DIR ...")?;
    let mut a = Args {
        command,
        state: PathBuf::new(),
        input: None,
        window: 1000,
        guest: "roll-forward".into(),
        commit_every: 1000,
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--state" => a.state = value.clone().into(),
            "--input" => a.input = Some(value.clone().into()),
            "--window" => a.window = number()?,
            "--guest" => a.guest = value.clone(),
            "--commit-every" => a.commit_every = number()?.max(1),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.state.as_os_str().is_empty() {
        return Err("--state DIR is required".into());
    }
    Ok(a)
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let input = a.input.as_ref().ok_or("run needs --input FILE")?;
    let (mut task, report) = TaskBuilder::new(&a.state)
        .guest(a.guest.as_str())
        .processor(Dedup { window: a.window })
        .output_file(a.state.join("out.tsv"))
        .commit_every(a.commit_every, Duration::from_secs(3600))
        .open()?;
    eprintln!(
        "recovered ({}): resuming at byte {} of {}",
        report.action,
        report.input_position,
        input.display()
    );
    // The input position is a byte offset into the input: resume there.
    let mut reader = BufReader::new(std::fs::File::open(input)?);
    let mut position = task.input_position();
    reader.seek(SeekFrom::Start(position))?;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        let Some(record) = line.strip_suffix(b"\n") else {
            break; // the end, or a last line still being written
        };
        position += n as u64;
        task.process_line(record, position)?;
    }
    let stats = task.close()?;
    eprintln!(
        "processed {} records, {} commits",
        stats.records, stats.commits
    );
    Ok(())
}

fn dump(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (mut task, _) = TaskBuilder::new(&a.state).guest(a.guest.as_str()).open()?;
    for (id, time) in task.range(None, None, Isolation::ReadCommitted)? {
        println!(
            "{}\t{}",
            String::from_utf8_lossy(&id),
            String::from_utf8_lossy(&time)
        );
    }
    task.close()?;
    Ok(())
}

fn main() {
    // Crash tests select a crash point through the environment.
    let result = txstore::arm_crash_point_from_env()
        .map_err(Into::into)
        .and_then(|()| args().map_err(Into::into))
        .and_then(|a| match a.command.as_str() {
            "run" => run(&a),
            "dump" => dump(&a),
            other => Err(format!("unknown command {other} (run, dump)").into()),
        });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
