//! One run of a workload in this process: open the store (recovery and
//! replay), check the recovered state against the model, then carry on with
//! the remaining steps, checking every read, and close. The explorer starts
//! this as a child process (`txstore conformance-child`) so that a crash
//! point can end it with `abort()`.

use super::workload::{self, Model, Step};
use crate::changelog::Record;
use crate::config::{Config, Guarantee};
use crate::crash;
use crate::runtime::{Isolation, Runtime};
use crate::task::{RecoveryReport, Task};
use std::collections::BTreeMap;
use std::path::Path;

/// The conformance task commits early past this many uncommitted bytes, so
/// the workload's large values exercise early commits.
pub const UNCOMMITTED_MAX_BYTES: u64 = 24 << 10;

/// The conformance changelog rolls past this many bytes per segment.
pub const SEGMENT_BYTES: u64 = 48 << 10;

/// Exit code of a child that found a violation (an abort is SIGABRT).
pub const VIOLATION_EXIT: i32 = 3;
/// Exit code of a child that stopped on an error it was told to expect
/// (an injected I/O error).
pub const STOPPED_EXIT: i32 = 4;

/// What the task acknowledged, kept beside the state directory where no
/// simulated crash reaches it: the independent record of what a crash must
/// not lose. A commit is acknowledged when `commit` returned; a clean
/// shutdown when `close` returned.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Acked {
    /// Workload steps covered by an acknowledged commit.
    pub steps: usize,
    /// The checkpoint offset of an acknowledged clean shutdown that no run
    /// has started from since.
    pub closed_at: Option<u64>,
}

/// The file that holds what the task acknowledged for state directory `dir`.
pub fn acked_path(dir: &Path) -> std::path::PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".acked");
    dir.with_file_name(name)
}

fn read_acked(dir: &Path) -> Acked {
    std::fs::read(acked_path(dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_acked(dir: &Path, acked: &Acked) {
    let path = acked_path(dir);
    let tmp = path.with_extension("acked.tmp");
    std::fs::write(&tmp, serde_json::to_vec(acked).unwrap()).expect("write the acknowledgements");
    std::fs::rename(&tmp, &path).expect("write the acknowledgements");
}

/// A broken promise, named so that reports can be grouped by property.
#[derive(Debug)]
pub struct Violation {
    pub property: &'static str,
    pub detail: String,
}

/// Whether `v` is an error the host reported rather than a broken promise.
pub fn is_error(v: &Violation) -> bool {
    matches!(
        v.property,
        "no guest errors" | "recovery follows the contract"
    )
}

fn violation(property: &'static str, detail: impl Into<String>) -> Violation {
    Violation {
        property,
        detail: detail.into(),
    }
}

/// What a finished run saw, for the explorer to plan crash points.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Steps done before this run (the committed input position).
    pub resumed_at: usize,
    pub recovery_action: String,
    pub replayed_records: u64,
    /// Storage calls inside `commit` and inside `recover`.
    pub commit_calls: u64,
    pub recover_calls: u64,
    /// Times each protocol step was reached.
    pub steps: Vec<(String, u64)>,
    /// I/O calls made, per kind ([`crate::fault::counts`]).
    #[serde(default)]
    pub io_calls: Vec<(String, u64)>,
    /// Calls of each contract function this run made.
    #[serde(default)]
    pub guest_calls: Vec<(String, u64)>,
    /// Reads compared with the model, recovery's three included (both
    /// isolation levels and `committed-offset`).
    #[serde(default)]
    pub reads_checked: u64,
    /// Records the guest refused with `uncommitted-limit`.
    #[serde(default)]
    pub limit_refusals: u64,
    /// What the guest's `transactional` said: false leaves read-committed
    /// unchecked and allows a wipe.
    #[serde(default)]
    pub transactional: bool,
    /// `after-write` occurrences reached with writes of the open
    /// transaction in storage ([`crate::crash::dirty_after_writes`]).
    #[serde(default)]
    pub dirty_after_writes: Vec<u64>,
}

/// The task configuration every conformance run uses.
pub fn config(guest: &str, dir: &Path, kafka: Option<&super::KafkaTarget>) -> Config {
    let mut config = Config::new(guest, dir);
    if let Some(k) = kafka {
        config.changelog.kind = crate::config::ChangelogKind::Kafka;
        config.changelog.bootstrap_servers = Some(k.bootstrap.clone());
        config.changelog.topic = Some(k.topic.clone());
    }
    config.task.guarantee = Guarantee::ExactlyOnce;
    // Commits come from the workload and from the uncommitted limit only.
    config.task.commit_interval_records = u64::MAX;
    config.task.commit_interval_ms = u64::MAX;
    config.task.max_uncommitted_bytes = UNCOMMITTED_MAX_BYTES;
    // Small segments, so the workload rolls and seals several of them.
    config.changelog.segment_bytes = SEGMENT_BYTES;
    // Cleaned as it is sealed, inside the commit: every clean's crash
    // points come in the same order in every run.
    config.changelog.clean = crate::config::CleanMode::Inline;
    config
}

fn show(entries: &[(Vec<u8>, Vec<u8>)]) -> String {
    let keys: Vec<String> = entries.iter().take(8).map(|(k, _)| short(k)).collect();
    format!(
        "{} entries [{}{}]",
        entries.len(),
        keys.join(", "),
        if entries.len() > 8 { ", ..." } else { "" }
    )
}

/// The first difference between what the store returned and the model.
fn diff(got: &[(Vec<u8>, Vec<u8>)], want: &[(Vec<u8>, Vec<u8>)]) -> Option<String> {
    if got == want {
        return None;
    }
    for (i, w) in want.iter().enumerate() {
        match got.get(i) {
            Some(g) if g == w => continue,
            Some(g) if g.0 == w.0 => {
                return Some(format!(
                    "key {} has {}, expected {}",
                    short(&w.0),
                    show_value(Some(&g.1)),
                    show_value(Some(&w.1))
                ))
            }
            Some(g) if g.0 < w.0 => {
                return Some(format!("key {} should not be there", short(&g.0)))
            }
            _ => return Some(format!("key {} is missing", short(&w.0))),
        }
    }
    let extra = &got[want.len()];
    Some(format!(
        "key {} should not be there (store: {}, model: {})",
        short(&extra.0),
        show(got),
        show(want)
    ))
}

/// Runs `steps` on the store in `dir` from wherever its changelog says it
/// stands. Returns what it saw, or the first violation.
pub fn run(runtime: &Runtime, config: &Config, steps: &[Step]) -> Result<Summary, Violation> {
    crash::track_open_writes_from_now();
    let dir = &config.state_dir();
    let acked = read_acked(dir);
    // The first start after a clean shutdown checks its checkpoint; a start
    // that crashes after reading it has consumed it, so clear it first.
    if acked.closed_at.is_some() {
        write_acked(
            dir,
            &Acked {
                steps: acked.steps,
                closed_at: None,
            },
        );
    }
    let (mut task, report) = Task::open(config, runtime)
        .map_err(|e| violation("recovery follows the contract", format!("{e:#}")))?;
    let (_, recover_calls) = crash::call_counts();
    let done = task.committed_input_position() as usize;
    check_nothing_lost(&acked, &report, done)?;
    write_acked(
        dir,
        &Acked {
            steps: done,
            closed_at: None,
        },
    );
    crash::step("after-recovery");
    let committed = check_recovered_state(&mut task, &report, &acked, steps, done)?;
    let reads_checked = 3 + execute(&mut task, steps, done, committed, report.transactional, dir)?;
    let guest_calls: Vec<(String, u64)> = task
        .store()
        .call_counts()
        .iter()
        .map(|(f, n)| (f.to_string(), *n))
        .collect();
    let stats = task
        .close()
        .map_err(|e| violation("no guest errors", format!("close: {e:#}")))?;
    write_acked(
        dir,
        &Acked {
            steps: stats.committed_steps as usize,
            closed_at: Some(stats.closed_at),
        },
    );
    crash::step("after-close");
    let (commit_calls, _) = crash::call_counts();
    Ok(Summary {
        resumed_at: done,
        recovery_action: report.action,
        replayed_records: report.replayed_records,
        commit_calls,
        recover_calls,
        steps: crash::step_counts()
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
        io_calls: crate::fault::counts()
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
        guest_calls,
        reads_checked,
        limit_refusals: stats.limit_refusals,
        transactional: report.transactional,
        dirty_after_writes: crash::dirty_after_writes(),
    })
}

/// What recovery kept: every acknowledged commit, and a clean close's
/// checkpoint.
fn check_nothing_lost(
    acked: &Acked,
    report: &RecoveryReport,
    done: usize,
) -> Result<(), Violation> {
    if done < acked.steps {
        return Err(violation(
            "nothing committed is lost",
            format!(
                "the task acknowledged a commit of {} steps, but after the crash the changelog holds {done} \
                 (recovery: {}, replayed {} records)",
                acked.steps, report.action, report.replayed_records
            ),
        ));
    }
    if let Some(at) = acked.closed_at {
        if report.checkpoint != Some(at) {
            return Err(violation(
                "a clean shutdown survives a crash",
                format!(
                    "the task closed cleanly with checkpoint {at}, but the next start found {:?}",
                    report.checkpoint
                ),
            ));
        }
    }
    Ok(())
}

/// The recovered store against the committed model, at both isolation
/// levels; returns that model.
fn check_recovered_state(
    task: &mut Task,
    report: &RecoveryReport,
    acked: &Acked,
    steps: &[Step],
    done: usize,
) -> Result<Model, Violation> {
    if done > steps.len() {
        return Err(violation(
            "committed state",
            format!(
                "the changelog says {done} steps were committed, of {}",
                steps.len()
            ),
        ));
    }
    let committed = workload::model_at(steps, done);
    let want: Vec<_> = committed
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let read = |task: &mut Task, iso| {
        task.store()
            .range_all(None, None, iso)
            .map_err(|e| violation("no guest errors", e.to_string()))
    };
    let got = read(task, Isolation::ReadCommitted)?;
    if let Some(d) = diff(&got, &want) {
        return Err(violation(
            "committed state after recovery",
            format!(
                "after {} (replayed {} records) at step {done}: {d}",
                report.action, report.replayed_records
            ),
        ));
    }
    let got = read(task, Isolation::ReadUncommitted)?;
    if let Some(d) = diff(&got, &want) {
        return Err(violation(
            "nothing uncommitted visible after recovery",
            format!("at step {done}, read-uncommitted: {d}"),
        ));
    }
    // After the state checks, which name the graver failure.
    if acked.closed_at.is_some() && report.action != "clean" {
        return Err(violation(
            "recovery after a clean shutdown says clean",
            format!(
                "the task closed cleanly, but recover reported `{}` (to offset {:?}, checkpoint {:?})",
                report.action, report.recovered_offset, report.checkpoint
            ),
        ));
    }
    committed_offset_matches(task, "after recovery")?;
    Ok(committed)
}

/// The store's `committed-offset` is the changelog's last commit: after a
/// recovery (which ends with the store at the changelog's end) and after
/// every commit.
fn committed_offset_matches(task: &mut Task, when: &str) -> Result<(), Violation> {
    let want = task.committed_offset();
    let got = task
        .store()
        .committed_offset()
        .map_err(|e| violation("no guest errors", format!("{when}: committed-offset: {e}")))?;
    if got != want {
        return Err(violation(
            "committed-offset is the last commit",
            format!("{when}: committed-offset returned {got:?}, the changelog's last commit is {want:?}"),
        ));
    }
    Ok(())
}

/// Runs steps `from..`, checking reads against the live and committed
/// models. Returns how many reads it compared.
fn execute(
    task: &mut Task,
    steps: &[Step],
    from: usize,
    committed: Model,
    transactional: bool,
    dir: &Path,
) -> Result<u64, Violation> {
    let mut check = Checker {
        task,
        steps,
        live: committed.clone(),
        committed,
        committed_at: from,
        transactional,
        dir,
        reads: 0,
    };
    for (i, step) in steps.iter().enumerate().skip(from) {
        match step {
            Step::Read(_, iso) | Step::ReadMany(_, iso) | Step::Range(_, _, iso, _)
                if check.unchecked(*iso) => {}
            Step::Write(records, shape) => check.write(i, records, *shape)?,
            Step::Commit => check.task.commit().map_err(|e| guest_error(e.into()))?,
            Step::Read(key, iso) => check.read(i, key, *iso)?,
            Step::ReadMany(keys, iso) => check.read_many(i, keys, *iso)?,
            Step::Range(start, end, iso, page) => {
                check.range(i, start.as_deref(), end.as_deref(), *iso, *page)?
            }
            Step::Empty => empty_calls(check.task)
                .map_err(|v| violation(v.property, format!("step {i}: {}", v.detail)))?,
        }
        check.after_step(i, matches!(step, Step::Commit))?;
    }
    Ok(check.reads)
}

fn guest_error(e: anyhow::Error) -> Violation {
    violation("no guest errors", format!("{e:#}"))
}

/// The running workload's checks: the live model (every write so far) and
/// the committed one (the writes up to the last commit).
struct Checker<'a> {
    task: &'a mut Task,
    steps: &'a [Step],
    live: Model,
    committed: Model,
    /// The steps the committed model holds.
    committed_at: usize,
    transactional: bool,
    dir: &'a Path,
    /// Reads compared so far.
    reads: u64,
}

impl Checker<'_> {
    /// A store that is not transactional has no committed view to check.
    fn unchecked(&self, iso: Isolation) -> bool {
        iso == Isolation::ReadCommitted && !self.transactional
    }

    fn model(&self, iso: Isolation) -> &Model {
        if iso == Isolation::ReadCommitted {
            &self.committed
        } else {
            &self.live
        }
    }

    fn write(
        &mut self,
        i: usize,
        records: &[Record],
        shape: workload::Shape,
    ) -> Result<(), Violation> {
        self.task.write_with(records, shape).map_err(guest_error)?;
        // Before the record ends (and the task's threshold may commit): the
        // estimate bounds memory through those early commits, so it may
        // count more, never less than the keys and values held, nor far
        // more (commits for nothing).
        let open_from = (self.task.committed_input_position() as usize).min(i);
        let (held, written) = held_bytes(&self.steps[open_from..=i]);
        let said = self
            .task
            .store()
            .approximate_uncommitted_bytes()
            .map_err(|e| guest_error(e.into()))?;
        if said < held || said > written {
            return Err(violation(
                "approximate-uncommitted-bytes counts what is held",
                format!(
                    "step {i}: it returned {said}, but the open transaction holds {held} bytes of keys and values \
                     (at most {written} with twice every write and {WRITE_OVERHEAD} per write)"
                ),
            ));
        }
        workload::apply(&mut self.live, records);
        self.task.end_record(i as u64 + 1).map_err(guest_error)
    }

    fn read(&mut self, i: usize, key: &[u8], iso: Isolation) -> Result<(), Violation> {
        self.reads += 1;
        let got = self.task.get(key, iso).map_err(|e| guest_error(e.into()))?;
        let want = self.model(iso).get(key);
        if got.as_ref() != want {
            return Err(violation(
                property(iso),
                format!(
                    "step {i}: get {} returned {}, expected {}",
                    short(key),
                    show_value(got.as_deref()),
                    show_value(want.map(Vec::as_slice))
                ),
            ));
        }
        Ok(())
    }

    fn read_many(&mut self, i: usize, keys: &[Vec<u8>], iso: Isolation) -> Result<(), Violation> {
        self.reads += 1;
        let got = self
            .task
            .store()
            .get_many(keys, iso)
            .map_err(|e| guest_error(e.into()))?;
        if got.len() != keys.len() {
            return Err(violation(
                property(iso),
                format!(
                    "step {i}: get-many of {} keys returned {} values",
                    keys.len(),
                    got.len()
                ),
            ));
        }
        let model = self.model(iso);
        if let Some(j) = (0..keys.len()).find(|&j| got[j].as_ref() != model.get(&keys[j])) {
            return Err(violation(
                property(iso),
                format!(
                    "step {i}: get-many of {} keys: key #{j} {} returned {}, expected {}",
                    keys.len(),
                    short(&keys[j]),
                    show_value(got[j].as_deref()),
                    show_value(model.get(&keys[j]).map(Vec::as_slice))
                ),
            ));
        }
        Ok(())
    }

    fn range(
        &mut self,
        i: usize,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        iso: Isolation,
        page: u32,
    ) -> Result<(), Violation> {
        self.reads += 1;
        let want = workload::range(self.model(iso), start, end);
        let (got, complete) = paged_range(self.task, start, end, iso, page)
            .map_err(|v| violation(v.property, format!("step {i}: {}", v.detail)))?;
        // Paging one entry at a time through thousands costs more than it
        // tells: a long range is compared as far as it went.
        let want = if complete {
            &want[..]
        } else {
            &want[..got.len().min(want.len())]
        };
        if let Some(d) = diff(&got, want) {
            return Err(violation(
                property(iso),
                format!("step {i}: range by pages of {page}: {d}"),
            ));
        }
        Ok(())
    }

    /// A commit (explicit or early) moves the committed model; after an
    /// explicit one the store's offset and estimate are checked too.
    fn after_step(&mut self, i: usize, explicit_commit: bool) -> Result<(), Violation> {
        let now = self.task.committed_input_position() as usize;
        if now != self.committed_at {
            self.committed_at = now;
            self.committed = workload::model_at(self.steps, now);
            write_acked(
                self.dir,
                &Acked {
                    steps: now,
                    closed_at: None,
                },
            );
        }
        if now == i + 1 && explicit_commit {
            committed_offset_matches(self.task, &format!("step {i}: after commit"))?;
            self.reads += 1;
            let left = self
                .task
                .store()
                .approximate_uncommitted_bytes()
                .map_err(|e| guest_error(e.into()))?;
            if left != 0 {
                return Err(violation(
                    "approximate-uncommitted-bytes is zero after commit",
                    format!("step {i}: {left} bytes"),
                ));
            }
        }
        Ok(())
    }
}

/// Per-write bookkeeping a guest may count on top of key and value bytes.
const WRITE_OVERHEAD: u64 = 256;

/// What `steps` hold open: the bytes of keys and last values (none for a
/// delete) of the distinct keys they write, and the most an estimate may
/// say (twice every write's key and value, and [`WRITE_OVERHEAD`] each).
fn held_bytes(steps: &[Step]) -> (u64, u64) {
    let mut last: BTreeMap<&[u8], usize> = BTreeMap::new();
    let mut written = 0u64;
    for step in steps {
        if let Step::Write(records, _) = step {
            for r in records {
                let value = match r {
                    Record::Put(_, v) => v.len(),
                    Record::Delete(_) => 0,
                };
                written += 2 * (r.key().len() + value) as u64 + WRITE_OVERHEAD;
                last.insert(r.key(), value);
            }
        }
    }
    let held = last.iter().map(|(k, v)| (k.len() + v) as u64).sum();
    (held, written)
}

/// The entries of [start, end) at `iso` through `range` calls of `page`
/// entries, each page checked for its size and order; at most
/// [`RANGE_CALLS`] calls. True when the range was read to its end.
fn paged_range(
    task: &mut Task,
    start: Option<&[u8]>,
    end: Option<&[u8]>,
    iso: Isolation,
    page: u32,
) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), Violation> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut next = start.map(<[u8]>::to_vec);
    let broken = |d: String| violation(property(iso), d);
    for _ in 0..RANGE_CALLS {
        let got = task
            .store()
            .range(next.as_deref(), end, iso, page)
            .map_err(|e| violation("no guest errors", e.to_string()))?;
        if got.len() as u64 > u64::from(page) {
            return Err(broken(format!(
                "range with limit {page} returned {} entries",
                got.len()
            )));
        }
        if let Some(bad) = got
            .iter()
            .map(|(k, _)| k)
            .zip(got.iter().skip(1).map(|(k, _)| k))
            .find(|(a, b)| a >= b)
        {
            return Err(broken(format!(
                "range returned key {} before {}: not in key order",
                short(bad.0),
                short(bad.1)
            )));
        }
        let full = got.len() as u64 == u64::from(page);
        if let Some((k, _)) = got.last() {
            next = Some([k.as_slice(), &[0]].concat());
        }
        out.extend(got);
        if !full {
            return Ok((out, true));
        }
    }
    Ok((out, false))
}

/// The most `range` calls one paged read makes.
pub(super) const RANGE_CALLS: usize = 96;

/// Calls with nothing in them change nothing and return nothing. A guest
/// may refuse an empty write with `uncommitted-limit` (it holds as much as
/// it may); any other error is a guest error.
fn empty_calls(task: &mut Task) -> Result<(), Violation> {
    let store = task.store();
    let failed = |what: &str, e: crate::runtime::CallError| {
        violation("no guest errors", format!("{what}: {e}"))
    };
    let wrong = |d: String| violation("calls with empty lists", d);
    for (what, r) in [
        ("put-many of an empty list", store.put_many(&[])),
        ("delete-many of an empty list", store.delete_many(&[])),
    ] {
        match r {
            Err(e) if !e.is_uncommitted_limit() => return Err(failed(what, e)),
            _ => {}
        }
    }
    for iso in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
        let got = store
            .get_many(&[], iso)
            .map_err(|e| failed("get-many of no keys", e))?;
        if !got.is_empty() {
            return Err(wrong(format!(
                "get-many of no keys returned {} values",
                got.len()
            )));
        }
        let got = store
            .range(None, None, iso, 0)
            .map_err(|e| failed("range with limit 0", e))?;
        if !got.is_empty() {
            return Err(wrong(format!(
                "range with limit 0 returned {} entries",
                got.len()
            )));
        }
    }
    Ok(())
}

/// A key in a message: escaped, long ones cut with their length.
fn short(key: &[u8]) -> String {
    const SHOWN: usize = 24;
    if key.len() <= SHOWN {
        return format!("`{}`", crate::tsv::escape_ascii(key));
    }
    format!(
        "`{}...` ({} bytes)",
        crate::tsv::escape_ascii(&key[..SHOWN]),
        key.len()
    )
}

/// A value in a message: absent, or its length and first bytes.
fn show_value(v: Option<&[u8]>) -> String {
    match v {
        None => "nothing".to_string(),
        Some(v) => format!("a value of {} bytes {}", v.len(), short(v)),
    }
}

fn property(iso: Isolation) -> &'static str {
    match iso {
        Isolation::ReadCommitted => "read-committed sees only committed data",
        Isolation::ReadUncommitted => "read-uncommitted sees the open transaction",
    }
}
