//! `txstore bench`: each built-in guest against plain RocksDB, measured in
//! the same run on the same machine, so figures are ratios rather than
//! absolutes.
//!
//! Workload: `keys` distinct 16-byte keys, 100-byte values. Write phases
//! put `keys` records one call each (as a stream processor does), keys drawn
//! uniformly or from a Zipf distribution (s = 0.99), committing every
//! `commit_every` records; the default is what Kafka Streams' 100 ms commit
//! interval gives at the native write rate measured first; then the uniform
//! phase again through the task's write cache (both sides batched by it,
//! as a task hands writes over). Then random point
//! reads at both isolation levels and a full scan. Recovery: a child process
//! loads a store of each size through the task, leaves one full uncommitted
//! transaction on disk and aborts; the time to open it again is measured.
//! Write phases and recoveries run `runs` times; the medians are reported.

pub mod pipeline;
pub mod report;
pub mod stores;

use crate::changelog::Record;
use crate::config::TaskConfig;
use crate::config::{Config, Guarantee};
use crate::rng::Rng;
use crate::runtime::{GuestSource, Isolation, Limits, Runtime, StoreInstance, RANGE_PAGE};
use crate::storage::{Backend, KeyspaceId, Op, RocksBackend, StoreStorage};
use crate::task::cache::{Batch, WriteCache};
use crate::task::Task;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

pub const KEY_LEN: usize = 16;
pub const VALUE_LEN: usize = 100;
/// Kafka Streams' default commit interval under exactly-once.
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
pub struct Options {
    pub keys: u64,
    /// Records per commit; `None`: the native rate times 100 ms.
    pub commit_every: Option<u64>,
    pub guests: Vec<String>,
    /// Point reads per isolation level.
    pub reads: u64,
    /// State sizes for the recovery curve.
    pub recovery_sizes: Vec<u64>,
    /// Write phases and recoveries are repeated this many times and the
    /// median reported (the machine is noisy).
    pub runs: usize,
    pub progress: bool,
    /// Passed to every measured guest's `init` (`--option k=v`).
    pub guest_options: Vec<(String, String)>,
}

/// One target's figures (the native baseline or a guest).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Figures {
    pub target: String,
    pub write_uniform_per_s: f64,
    pub write_zipf_per_s: f64,
    /// Uniform writes through the task's write cache (1 MiB), handed over
    /// in batches: to the guest as `put-many`, to native RocksDB as one
    /// write batch.
    pub write_cached_per_s: f64,
    pub read_committed_per_s: f64,
    pub read_uncommitted_per_s: f64,
    pub scan_entries_per_s: f64,
    pub commit_p50_us: f64,
    pub commit_p99_us: f64,
    /// Guests only: load with and without the compilation cache, one
    /// instantiation, the guest's peak linear memory.
    pub load_cold_ms: Option<f64>,
    pub load_cached_ms: Option<f64>,
    pub instantiate_us: Option<f64>,
    pub guest_peak_memory_bytes: Option<u64>,
    /// (state size, seconds to recover and replay, what recovery did).
    pub recovery: Vec<(u64, f64, String)>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub keys: u64,
    pub commit_every: u64,
    pub cores: usize,
    /// Runs per figure (medians).
    pub runs: usize,
    /// What every guest's `init` was given.
    pub guest_options: Vec<(String, String)>,
    pub native: Figures,
    pub guests: Vec<Figures>,
}

/// The store a write phase drives: plain storage or a guest.
enum Target {
    Native {
        storage: Box<dyn StoreStorage>,
        ks: KeyspaceId,
    },
    Guest(StoreInstance),
}

impl Target {
    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        offset: &mut u64,
        commits: &mut Vec<Duration>,
    ) -> Result<()> {
        match self {
            Target::Native { storage, ks } => Ok(storage.put(*ks, key, value)?),
            Target::Guest(g) => match g.put(key, value) {
                Err(e) if e.is_uncommitted_limit() => {
                    self.commit(offset, commits)?;
                    let Target::Guest(g) = self else {
                        unreachable!()
                    };
                    Ok(g.put(key, value)?)
                }
                other => Ok(other?),
            },
        }
    }

    /// Hands the cache over in one call: `put-many` to a guest (after a
    /// commit if it refuses), one write batch to native storage.
    fn flush(
        &mut self,
        cache: &mut WriteCache,
        offset: &mut u64,
        commits: &mut Vec<Duration>,
    ) -> Result<()> {
        let Batch::Puts(entries) = cache.batch() else {
            bail!("the bench writes only puts")
        };
        match self {
            Target::Native { storage, ks } => {
                let ops = entries
                    .iter()
                    .map(|e| Op::Put(e.key.to_vec(), e.value.to_vec()))
                    .collect();
                storage.write(vec![(*ks, ops)], false)?;
            }
            Target::Guest(g) => match g.put_entries(&entries) {
                Err(e) if e.is_uncommitted_limit() => {
                    drop(entries);
                    self.commit(offset, commits)?;
                    return self.flush(cache, offset, commits);
                }
                other => other?,
            },
        }
        drop(entries);
        cache.take_applied();
        Ok(())
    }

    fn commit(&mut self, offset: &mut u64, commits: &mut Vec<Duration>) -> Result<()> {
        *offset += 1;
        let t = Instant::now();
        match self {
            Target::Native { storage, .. } => storage.sync()?,
            Target::Guest(g) => g.commit(*offset)?,
        }
        commits.push(t.elapsed());
        Ok(())
    }

    fn get(&mut self, key: &[u8], iso: Isolation) -> Result<Option<Vec<u8>>> {
        match self {
            Target::Native { storage, ks } => Ok(storage.get(*ks, key)?),
            Target::Guest(g) => Ok(g.get(key, iso)?),
        }
    }

    fn scan_all(&mut self) -> Result<u64> {
        match self {
            Target::Native { storage, ks } => {
                let mut cursor = storage.scan(*ks, None, None)?;
                let mut n = 0;
                loop {
                    let batch = cursor.next(RANGE_PAGE)?;
                    if batch.is_empty() {
                        return Ok(n);
                    }
                    n += batch.len() as u64;
                }
            }
            // Page by page, as the native cursor batches: no one list of
            // every entry (a caller would not hold a whole store at once).
            Target::Guest(g) => {
                let mut n = 0;
                g.range_pages(None, None, Isolation::ReadCommitted, usize::MAX, |page| {
                    n += page.len() as u64
                })?;
                Ok(n)
            }
        }
    }
}

/// Key `i` as 16 bytes, spread over the key space (not in index order).
pub fn key(i: u64) -> [u8; KEY_LEN] {
    let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) ^ i;
    let mut k = [0u8; KEY_LEN];
    k[..8].copy_from_slice(&h.to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// Zipf(s = 0.99) over `0..n` by inverse CDF.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: u64) -> Self {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for i in 1..=n {
            sum += 1.0 / (i as f64).powf(0.99);
            cdf.push(sum);
        }
        cdf.iter_mut().for_each(|c| *c /= sum);
        Zipf(cdf)
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        self.0.partition_point(|c| *c < u).min(self.0.len() - 1) as u64
    }
}

fn open_target(
    runtime: &Runtime,
    guest: Option<&str>,
    options: &[(String, String)],
    dir: &Path,
) -> Result<(Target, Option<u64>)> {
    let backend = RocksBackend::open(dir)?;
    let mut storage = backend.open_store("bench")?;
    Ok(match guest {
        None => {
            let ks = storage.open_keyspace("data")?;
            (Target::Native { storage, ks }, None)
        }
        Some(g) => {
            let component = runtime.load(&GuestSource::parse(g))?;
            let mut s = component.instantiate(storage, "bench", &Limits::default())?;
            s.init(options)?;
            s.recover(None)?;
            (Target::Guest(s), None)
        }
    })
}

/// Each figure's median over `runs` of one target (recovery is measured
/// apart, after these).
fn median_figures(runs: Vec<Figures>) -> Figures {
    let of = |f: fn(&Figures) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let of_some = |f: fn(&Figures) -> Option<f64>| {
        let mut v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    Figures {
        target: runs[0].target.clone(),
        write_uniform_per_s: of(|f| f.write_uniform_per_s),
        write_zipf_per_s: of(|f| f.write_zipf_per_s),
        write_cached_per_s: of(|f| f.write_cached_per_s),
        read_committed_per_s: of(|f| f.read_committed_per_s),
        read_uncommitted_per_s: of(|f| f.read_uncommitted_per_s),
        scan_entries_per_s: of(|f| f.scan_entries_per_s),
        commit_p50_us: of(|f| f.commit_p50_us),
        commit_p99_us: of(|f| f.commit_p99_us),
        load_cold_ms: of_some(|f| f.load_cold_ms),
        load_cached_ms: of_some(|f| f.load_cached_ms),
        instantiate_us: of_some(|f| f.instantiate_us),
        guest_peak_memory_bytes: runs.iter().filter_map(|f| f.guest_peak_memory_bytes).max(),
        recovery: Vec::new(),
    }
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// One write phase on a fresh store: (records/s, commit latencies, target).
fn write_phase(
    runtime: &Runtime,
    guest: Option<&str>,
    options: &[(String, String)],
    dir: &Path,
    keys: u64,
    commit_every: u64,
    zipf: Option<&Zipf>,
    bar: &indicatif::ProgressBar,
) -> Result<(f64, Vec<Duration>, Target)> {
    let (mut target, _) = open_target(runtime, guest, options, dir)?;
    let value = vec![0x5a; VALUE_LEN];
    let mut rng = Rng::new(keys);
    let (mut offset, mut commits) = (0u64, Vec::new());
    let started = Instant::now();
    for n in 1..=keys {
        let i = match zipf {
            Some(z) => z.sample(&mut rng),
            None => rng.below(keys),
        };
        target.put(&key(i), &value, &mut offset, &mut commits)?;
        if n % commit_every == 0 {
            target.commit(&mut offset, &mut commits)?;
        }
        if n % 65536 == 0 {
            bar.inc(65536);
        }
    }
    target.commit(&mut offset, &mut commits)?;
    let rate = keys as f64 / started.elapsed().as_secs_f64();
    commits.sort();
    Ok((rate, commits, target))
}

/// Uniform writes through the task's write cache, committing every
/// `commit_every` records: records/s.
fn cached_write_phase(
    runtime: &Runtime,
    guest: Option<&str>,
    options: &[(String, String)],
    dir: &Path,
    keys: u64,
    commit_every: u64,
) -> Result<f64> {
    let (mut target, _) = open_target(runtime, guest, options, dir)?;
    let mut cache = WriteCache::new(TaskConfig::default().max_cache_bytes);
    let mut rng = Rng::new(keys);
    let (mut offset, mut commits) = (0u64, Vec::new());
    let started = Instant::now();
    for n in 1..=keys {
        let record = Record::Put(key(rng.below(keys)).to_vec(), vec![0x5a; VALUE_LEN]);
        cache.push(vec![record], Vec::new(), (n - 1, None), (n, None));
        if cache.full() {
            target.flush(&mut cache, &mut offset, &mut commits)?;
        }
        if n % commit_every == 0 {
            target.flush(&mut cache, &mut offset, &mut commits)?;
            target.commit(&mut offset, &mut commits)?;
        }
    }
    target.flush(&mut cache, &mut offset, &mut commits)?;
    target.commit(&mut offset, &mut commits)?;
    Ok(keys as f64 / started.elapsed().as_secs_f64())
}

/// Everything but recovery for one target.
fn measure(
    runtime: &Runtime,
    guest: Option<&str>,
    opts: &Options,
    commit_every: u64,
    zipf: &Zipf,
    bar: &indicatif::ProgressBar,
) -> Result<Figures> {
    let name = guest.unwrap_or("native rocksdb").to_string();
    bar.set_message(name.clone());
    let mut f = Figures {
        target: name,
        ..Figures::default()
    };
    let dir = tempfile::tempdir()?;
    let (rate, _, zipf_target) = write_phase(
        runtime,
        guest,
        &opts.guest_options,
        &dir.path().join("zipf"),
        opts.keys,
        commit_every,
        Some(zipf),
        bar,
    )?;
    drop(zipf_target);
    f.write_zipf_per_s = rate;
    f.write_cached_per_s = cached_write_phase(
        runtime,
        guest,
        &opts.guest_options,
        &dir.path().join("cached"),
        opts.keys,
        commit_every,
    )?;
    bar.inc(opts.keys);
    let (rate, commits, mut target) = write_phase(
        runtime,
        guest,
        &opts.guest_options,
        &dir.path().join("uniform"),
        opts.keys,
        commit_every,
        None,
        bar,
    )?;
    f.write_uniform_per_s = rate;
    f.commit_p50_us = percentile(&commits, 0.5);
    f.commit_p99_us = percentile(&commits, 0.99);
    // Reads of keys that exist and keys that do not, as they come.
    let mut rng = Rng::new(7);
    for iso in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
        let started = Instant::now();
        for _ in 0..opts.reads {
            std::hint::black_box(target.get(&key(rng.below(opts.keys)), iso)?);
        }
        let rate = opts.reads as f64 / started.elapsed().as_secs_f64();
        match iso {
            Isolation::ReadCommitted => f.read_committed_per_s = rate,
            Isolation::ReadUncommitted => f.read_uncommitted_per_s = rate,
        }
    }
    let started = Instant::now();
    let n = target.scan_all()?;
    f.scan_entries_per_s = n as f64 / started.elapsed().as_secs_f64();
    if let (Some(g), Target::Guest(instance)) = (guest, &target) {
        f.guest_peak_memory_bytes = Some(instance.peak_memory_bytes());
        let (cold, cached, inst) = load_times(g)?;
        f.load_cold_ms = Some(cold);
        f.load_cached_ms = Some(cached);
        f.instantiate_us = Some(inst);
    }
    Ok(f)
}

/// (cold compile ms, cached load ms, instantiate µs, median of 100).
fn load_times(guest: &str) -> Result<(f64, f64, f64)> {
    let cache = tempfile::tempdir()?;
    let source = GuestSource::parse(guest);
    let cold = Runtime::new(Some(cache.path().to_path_buf()))?
        .load(&source)?
        .load
        .elapsed
        .as_secs_f64()
        * 1e3;
    let runtime = Runtime::new(Some(cache.path().to_path_buf()))?;
    let component = runtime.load(&source)?;
    let cached = component.load.elapsed.as_secs_f64() * 1e3;
    let backend = crate::storage::MemoryBackend::new();
    let mut times: Vec<Duration> = (0..100)
        .map(|_| {
            let t = Instant::now();
            let s =
                component.instantiate(backend.open_store("bench")?, "bench", &Limits::default());
            let d = t.elapsed();
            s.map(|_| d)
        })
        .collect::<Result<_>>()?;
    times.sort();
    Ok((cold, cached, percentile(&times, 0.5)))
}

/// The task config of a recovery measurement.
fn recovery_config(
    guest: &str,
    options: &[(String, String)],
    dir: &Path,
    commit_every: u64,
) -> Config {
    let mut config = Config::new(guest, dir);
    config.add_init_options(options);
    config.task.guarantee = Guarantee::ExactlyOnce;
    config.task.commit_interval_records = commit_every;
    config.task.commit_interval_ms = u64::MAX;
    config.task.max_uncommitted_bytes = u64::MAX;
    config
}

/// The crash point of a recovery child: the last write of the open
/// transaction, with every write flushed (the worst case for recovery).
fn recovery_crash_point(keys: u64, txn: u64) -> String {
    format!("after-write@{}+flush", keys + txn)
}

/// The child side of a recovery measurement, started with
/// `recovery_crash_point` armed: loads `keys` keys through the task, then
/// one more full transaction that never commits.
pub fn recovery_child(
    runtime: &Runtime,
    guest: &str,
    options: &[(String, String)],
    dir: &Path,
    keys: u64,
    txn: u64,
) -> Result<()> {
    let config = recovery_config(guest, options, dir, txn);
    let (mut task, _) = Task::open(&config, runtime)?;
    let value = vec![0x5a; VALUE_LEN];
    for i in 0..keys {
        task.write(&[Record::Put(key(i).to_vec(), value.clone())])?;
        task.end_record(i + 1)?;
    }
    task.commit()?;
    // The open transaction: overwrites of existing keys.
    for i in 0..txn {
        task.write(&[Record::Put(key(i % keys).to_vec(), vec![0xa5; VALUE_LEN])])?;
    }
    bail!(
        "the crash point {} was not reached",
        recovery_crash_point(keys, txn)
    )
}

/// Parent side: runs the child, then times the next open.
fn recovery_time(
    runtime: &Runtime,
    guest: &str,
    options: &[(String, String)],
    keys: u64,
    txn: u64,
) -> Result<(f64, String)> {
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args([
            "bench-child",
            "--guest",
            guest,
            "--keys",
            &keys.to_string(),
            "--txn",
            &txn.to_string(),
            "--dir",
        ])
        .arg(dir.path())
        .args(crate::config::option_args(options))
        .env(crate::crash::ENV, recovery_crash_point(keys, txn))
        .output()
        .context("cannot start the recovery child")?;
    if std::os::unix::process::ExitStatusExt::signal(&out.status) != Some(6) {
        bail!(
            "recovery child for {guest} did not crash: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let config = recovery_config(guest, options, dir.path(), txn);
    let (task, report) = Task::open(&config, runtime)?;
    drop(task);
    Ok((report.elapsed.as_secs_f64(), report.action))
}

/// The default commit size: what `COMMIT_INTERVAL` of native writes
/// gives, probed on a fresh store.
pub fn default_commit_every(runtime: &Runtime, keys: u64) -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let probe = keys.min(200_000);
    let (rate, _, _) = write_phase(
        runtime,
        None,
        &[],
        dir.path(),
        probe,
        u64::MAX,
        None,
        &indicatif::ProgressBar::hidden(),
    )?;
    Ok(((rate * COMMIT_INTERVAL.as_secs_f64()) as u64).max(1))
}

/// The recovery curve's sizes when none are given: decades from 10^4 up
/// to `keys`, and `keys` itself.
pub fn recovery_sizes_for(keys: u64) -> Vec<u64> {
    let mut sizes: Vec<u64> = std::iter::successors(Some(10_000u64), |s| s.checked_mul(10))
        .take_while(|&s| s < keys)
        .collect();
    sizes.push(keys);
    sizes
}

/// Runs everything; progress on stderr.
pub fn run(runtime: &Runtime, opts: &Options) -> Result<Report> {
    let bar = if opts.progress {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:16} {bar:40} {pos}/{len} {elapsed}").unwrap(),
    );
    let phases = 3 * opts.runs.max(1) as u64 * opts.keys * (1 + opts.guests.len() as u64);
    bar.set_length(phases);
    let zipf = Zipf::new(opts.keys);
    let commit_every = match opts.commit_every {
        Some(k) => k,
        None => default_commit_every(runtime, opts.keys)?,
    };
    // Round-robin, one run of every target per round: a machine that
    // slows down during the bench slows every target alike, rather than
    // whichever ran last.
    let targets: Vec<Option<&str>> = std::iter::once(None)
        .chain(opts.guests.iter().map(|g| Some(g.as_str())))
        .collect();
    let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); targets.len()];
    for _ in 0..opts.runs.max(1) {
        for (t, target) in targets.iter().enumerate() {
            runs[t].push(measure(runtime, *target, opts, commit_every, &zipf, &bar)?);
        }
    }
    let mut medians = runs.into_iter().map(median_figures);
    let native = medians.next().expect("the native target is measured");
    let mut guests: Vec<Figures> = medians.collect();
    bar.set_length(bar.length().unwrap_or(0) + (opts.recovery_sizes.len() * guests.len()) as u64);
    for f in &mut guests {
        for &size in &opts.recovery_sizes {
            bar.set_message(format!("recover {}", f.target));
            let txn = commit_every.min(size);
            let mut times = Vec::new();
            let mut action = String::new();
            for _ in 0..opts.runs.max(1) {
                let (secs, a) = recovery_time(runtime, &f.target, &opts.guest_options, size, txn)?;
                times.push(secs);
                action = a;
            }
            f.recovery.push((size, median(&mut times), action));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(Report {
        keys: opts.keys,
        commit_every,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        runs: opts.runs.max(1),
        guest_options: opts.guest_options.clone(),
        native,
        guests,
    })
}

#[cfg(test)]
mod tests {
    use super::{median_figures, Figures};

    /// Every figure is its own median over the runs (a run slow at writes
    /// need not be the one slow at reads); memory is the largest seen.
    #[test]
    fn each_figure_is_the_median_of_its_runs() {
        let run = |w: f64, r: f64, mem: u64| Figures {
            target: "g".into(),
            write_uniform_per_s: w,
            read_committed_per_s: r,
            load_cold_ms: Some(w),
            guest_peak_memory_bytes: Some(mem),
            ..Figures::default()
        };
        let m = median_figures(vec![
            run(3.0, 10.0, 5),
            run(1.0, 30.0, 9),
            run(2.0, 20.0, 7),
        ]);
        assert_eq!((m.write_uniform_per_s, m.read_committed_per_s), (2.0, 20.0));
        assert_eq!((m.load_cold_ms, m.load_cached_ms), (Some(2.0), None));
        assert_eq!(
            (m.guest_peak_memory_bytes, m.target.as_str()),
            (Some(9), "g")
        );
    }
}
