//! `txstore bench --stores N`: many stores in one process, as a Kafka
//! Streams application has (partitions × stores). Each store has its own
//! RocksDB in its own directory, as a partition's task does, and its own
//! guest instance; all share one wasm engine. Measured: the time to open all of them, the
//! resident memory each adds while idle, and the aggregate write rate
//! with the stores split over `threads` worker threads.

use super::{key, Target, VALUE_LEN};
use crate::rng::Rng;
use crate::runtime::{GuestSource, Limits, Runtime};
use crate::storage::{Backend, RocksBackend};
use anyhow::{Context, Result};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Options {
    pub stores: usize,
    /// Records written in all (spread uniformly over the stores).
    pub keys: u64,
    /// Records per commit round, per thread; a round commits every store
    /// of the thread (as Kafka Streams commits all its tasks at once).
    pub commit_every: u64,
    pub threads: usize,
    pub guests: Vec<String>,
    pub guest_options: Vec<(String, String)>,
    pub runs: usize,
}

/// One target's figures with `stores` stores open.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub target: String,
    pub stores: usize,
    pub threads: usize,
    /// Creating every store (native: its database and keyspace; guest:
    /// also instantiate, init, recover), `OPEN_THREADS` at a time.
    pub open_s: f64,
    /// Opening every store again after a clean close (a restart).
    pub reopen_s: f64,
    /// Resident memory added per open, idle store.
    pub rss_per_store_bytes: f64,
    pub write_per_s: f64,
    pub commit_round_p50_us: f64,
}

/// The process's resident set size, from `/proc/self/statm`.
pub fn resident_bytes() -> Result<u64> {
    let statm =
        std::fs::read_to_string("/proc/self/statm").context("cannot read /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("unexpected /proc/self/statm")?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Ok(pages * page)
}

/// One run for one target: (open seconds, reopen seconds, resident bytes
/// per store, records/s, commit-round latencies).
fn run_once(
    runtime: &Runtime,
    guest: Option<&str>,
    opts: &Options,
) -> Result<(f64, f64, f64, f64, Vec<Duration>)> {
    let dir = tempfile::tempdir()?;
    // Compiled before the clock and the memory reading: shared by all.
    let component = guest
        .map(|g| runtime.load(&GuestSource::parse(g)))
        .transpose()?;
    let before = resident_bytes()?;
    let started = Instant::now();
    let targets = open_all(component.as_ref(), dir.path(), opts)?;
    let open = started.elapsed().as_secs_f64();
    let per_store = resident_bytes()?.saturating_sub(before) as f64 / opts.stores as f64;
    // A restart: every store closed cleanly, then opened again.
    drop(targets);
    let started = Instant::now();
    let targets = open_all(component.as_ref(), dir.path(), opts)?;
    let reopen = started.elapsed().as_secs_f64();

    // Stores round-robin over the threads; each thread writes its share.
    let threads = opts.threads.clamp(1, opts.stores);
    let mut groups: Vec<Vec<Target>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, t) in targets.into_iter().enumerate() {
        groups[i % threads].push(t);
    }
    let per_thread = opts.keys / threads as u64;
    let started = Instant::now();
    let results: Vec<Result<Vec<Duration>>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(t, mut group)| {
                s.spawn(move || write_share(&mut group, per_thread, opts.commit_every, t as u64))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread panicked"))
            .collect()
    });
    let rate = (per_thread * threads as u64) as f64 / started.elapsed().as_secs_f64();
    let mut rounds = Vec::new();
    for r in results {
        rounds.extend(r?);
    }
    rounds.sort();
    Ok((open, reopen, per_store, rate, rounds))
}

/// Threads that open stores: a fresh RocksDB's open is a dozen fsyncs
/// (its directory, MANIFEST, CURRENT, OPTIONS), so opens wait on the disk
/// and overlap well beyond the core count.
const OPEN_THREADS: usize = 16;

/// Opens (or reopens) stores `s0..sN` under `dir`, `OPEN_THREADS` at a time.
fn open_all(
    component: Option<&crate::runtime::GuestComponent>,
    dir: &std::path::Path,
    opts: &Options,
) -> Result<Vec<Target>> {
    let open_one = |i: usize| -> Result<Target> {
        // Its own RocksDB, as each partition's task has (one database
        // with thousands of column families is quadratic to create:
        // RocksDB rewrites and re-parses its OPTIONS file per family).
        let name = format!("s{i}");
        let mut storage = RocksBackend::open(&dir.join(&name))?.open_store(&name)?;
        Ok(match component {
            None => {
                let ks = storage.open_keyspace("data")?;
                Target::Native { storage, ks }
            }
            Some(c) => {
                let mut s = c.instantiate(storage, &name, &Limits::default())?;
                s.init(&opts.guest_options)?;
                s.recover(None)?;
                Target::Guest(s)
            }
        })
    };
    let workers = OPEN_THREADS.min(opts.stores);
    let opened: Vec<Result<Vec<(usize, Target)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    (w..opts.stores)
                        .step_by(workers)
                        .map(|i| open_one(i).map(|t| (i, t)))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("open thread panicked"))
            .collect()
    });
    let mut all = Vec::with_capacity(opts.stores);
    for o in opened {
        all.extend(o?);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, t)| t).collect())
}

/// One thread's writes over its stores: key `i` goes to store `i mod n`.
fn write_share(
    group: &mut [Target],
    records: u64,
    commit_every: u64,
    seed: u64,
) -> Result<Vec<Duration>> {
    let value = vec![0x5a; VALUE_LEN];
    let mut rng = Rng::new(seed + 1);
    let n = group.len() as u64;
    let mut offsets = vec![0u64; group.len()];
    let mut rounds = Vec::new();
    for r in 1..=records {
        let i = rng.below(u64::MAX / 2);
        let store = (i % n) as usize;
        // An early commit inside `put` (buffered's limit) moves the
        // store's offset; its time is not part of a round.
        group[store].put(&key(i), &value, &mut offsets[store], &mut Vec::new())?;
        if r % commit_every == 0 {
            rounds.push(commit_all(group, &mut offsets)?);
        }
    }
    rounds.push(commit_all(group, &mut offsets)?);
    Ok(rounds)
}

/// Commits every store of a thread: one round.
fn commit_all(group: &mut [Target], offsets: &mut [u64]) -> Result<Duration> {
    let t = Instant::now();
    for (g, offset) in group.iter_mut().zip(offsets.iter_mut()) {
        g.commit(offset, &mut Vec::new())?;
    }
    Ok(t.elapsed())
}

/// What a child process is asked to measure.
#[derive(serde::Serialize, serde::Deserialize)]
struct Spec {
    options: Options,
    guest: Option<String>,
}

/// The child side: one run for one target, its figures as JSON on stdout.
pub fn child(runtime: &Runtime, spec: &str) -> Result<()> {
    let spec: Spec = serde_json::from_str(spec).context("bad --spec")?;
    let (open, reopen, rss, rate, rounds) =
        run_once(runtime, spec.guest.as_deref(), &spec.options)?;
    let f = Figures {
        target: spec.guest.unwrap_or_else(|| "native rocksdb".into()),
        stores: spec.options.stores,
        threads: spec.options.threads.clamp(1, spec.options.stores),
        open_s: open,
        reopen_s: reopen,
        rss_per_store_bytes: rss,
        write_per_s: rate,
        commit_round_p50_us: super::percentile(&rounds, 0.5),
    };
    println!("{}", serde_json::to_string(&f)?);
    Ok(())
}

/// Native first, then each guest; `runs` runs each in a fresh process
/// (memory freed by one target would otherwise be reused by the next),
/// medians.
pub fn run(opts: &Options, progress: bool) -> Result<Vec<Figures>> {
    let exe = std::env::current_exe()?;
    let mut all = Vec::new();
    let targets = std::iter::once(None).chain(opts.guests.iter().map(|g| Some(g.clone())));
    for guest in targets {
        let name = guest.clone().unwrap_or_else(|| "native rocksdb".into());
        let spec = serde_json::to_string(&Spec {
            options: opts.clone(),
            guest,
        })?;
        let mut runs = Vec::new();
        for run in 0..opts.runs.max(1) {
            if progress {
                eprintln!("stores: {name}, {} stores, run {}", opts.stores, run + 1);
            }
            let out = std::process::Command::new(&exe)
                .args(["bench-stores-child", "--spec", &spec])
                .stderr(std::process::Stdio::inherit())
                .output()
                .context("cannot start the bench child")?;
            if !out.status.success() {
                anyhow::bail!("bench --stores: the run for {name} failed ({})", out.status);
            }
            let f: Figures = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("bench --stores: bad figures from the run for {name}"))?;
            runs.push(f);
        }
        let pick =
            |f: fn(&Figures) -> f64| super::median(&mut runs.iter().map(f).collect::<Vec<_>>());
        all.push(Figures {
            open_s: pick(|f| f.open_s),
            reopen_s: pick(|f| f.reopen_s),
            rss_per_store_bytes: pick(|f| f.rss_per_store_bytes),
            write_per_s: pick(|f| f.write_per_s),
            commit_round_p50_us: pick(|f| f.commit_round_p50_us),
            ..runs[0].clone()
        });
    }
    Ok(all)
}

/// The figures as a markdown table, ratios to native.
pub fn markdown(figures: &[Figures]) -> String {
    let mut s = String::new();
    let Some(native) = figures.first() else {
        return s;
    };
    s.push_str(&format!(
        "{} stores in one process, {} writer thread(s), {} cores\n\n",
        native.stores,
        native.threads,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    s.push_str("| store | create all | reopen all | resident per store | write | × native | commit round p50 |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for f in figures {
        s.push_str(&format!(
            "| {} | {:.3} s | {:.3} s | {:.2} MiB | {:.0} k/s | {:.2} | {:.0} µs |\n",
            f.target,
            f.open_s,
            f.reopen_s,
            f.rss_per_store_bytes / (1 << 20) as f64,
            f.write_per_s / 1e3,
            f.write_per_s / native.write_per_s,
            f.commit_round_p50_us
        ));
    }
    s
}
