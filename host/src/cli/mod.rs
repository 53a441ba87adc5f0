//! The `txstore` command line.

mod output;
mod run;

use run::run;

use crate::config::{Config, Guarantee};
use crate::runtime::{GuestSource, Isolation, Runtime};
use crate::task::{serve, RecoveryReport, Task};
use crate::{crash, runtime};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "txstore",
    version,
    about = "Transactional state stores for stream processing, as sandboxed wasm components"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// End the process abruptly at this crash point (also: TXSTORE_CRASH_AT).
    /// For `conformance`: the case to rerun, `P` or `P,Q` as its reproducer
    /// line prints.
    #[arg(long, global = true, value_name = "POINT")]
    crash_at: Option<String>,
    /// Make the N-th I/O call of one kind fail, for tests: `KIND:N` with
    /// KIND one of fsync, write-enospc, write-short, rename, storage-sync,
    /// storage-write, storage-read (also `TXSTORE_IO_ERROR`).
    #[arg(long, global = true, value_name = "KIND:N")]
    io_error: Option<String>,
    /// For a config whose input is a Kafka topic: the input partition whose
    /// store a store command (get, scan, put, delete, recover, compact,
    /// migrate) works on, under that partition's lock.
    #[arg(long, global = true, value_name = "P")]
    partition: Option<i32>,
}

/// `--partition`, for the store commands.
static PARTITION: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();

/// The config of the store a store command works on: the config's own, or
/// for a Kafka input the store of the partition `--partition` names.
fn load_store(config_path: &Path) -> Result<Config> {
    let config = Config::load(config_path)?;
    let partition = PARTITION.get().copied().flatten();
    match (config.kafka_input().is_some(), partition) {
        (true, Some(p)) if p >= 0 => {
            let mut c = config.for_partition(p, p + 1);
            // A query never creates a topic.
            c.changelog.create_topic = false;
            Ok(c)
        }
        (true, Some(p)) => anyhow::bail!("--partition {p}: a partition is a number from 0"),
        (false, Some(_)) => anyhow::bail!(
            "--partition is for a config whose input is a Kafka topic; {} has one store",
            config_path.display()
        ),
        (_, None) => Ok(config),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Process an input file through the configured guest, one record per
    /// line, under the configured guarantee: exactly-once (the store
    /// equals the committed changelog after any crash) or at-least-once
    /// (nothing committed is lost; input after the last commit may be
    /// processed again). Resumes where the last run committed.
    Run {
        /// The config file (TOML) that names the store, guest and input.
        #[arg(long, short)]
        config: PathBuf,
        /// Input file (overrides task.input).
        #[arg(long)]
        input: Option<PathBuf>,
        /// Print the recovery report and the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run start-up recovery only and report what it did.
    Recover {
        /// The config file that names the store.
        #[arg(long, short)]
        config: PathBuf,
        /// Print the report as JSON (durations in seconds).
        #[arg(long)]
        json: bool,
    },
    /// Read one key and print its value (answered by the running task
    /// while `txstore run` processes the store).
    Get {
        /// The key (its UTF-8 bytes, or hex digits with --hex).
        key: String,
        /// The key is given in hex (for keys that are not text).
        #[arg(long)]
        hex: bool,
        /// The config file that names the store.
        #[arg(long, short)]
        config: PathBuf,
        /// committed: the last committed state; uncommitted: with the open
        /// transaction.
        #[arg(long, value_enum, default_value_t = IsolationArg::Committed)]
        isolation: IsolationArg,
        /// tsv: UTF-8 as is, backslash escapes for tab, newline, CR,
        /// backslash and invalid UTF-8; json: a string or base64; raw: the
        /// bytes; hex.
        #[arg(long, value_enum, default_value_t = output::Format::Tsv)]
        format: output::Format,
    },
    /// Print the entries with keys in [from, to), in key order (answered by
    /// the running task while `txstore run` processes the store).
    Scan {
        /// The config file that names the store.
        #[arg(long, short)]
        config: PathBuf,
        /// First key (inclusive; default: the first).
        #[arg(long)]
        from: Option<String>,
        /// End key (exclusive; default: past the last).
        #[arg(long)]
        to: Option<String>,
        /// committed: the last committed state; uncommitted: with the open
        /// transaction.
        #[arg(long, value_enum, default_value_t = IsolationArg::Committed)]
        isolation: IsolationArg,
        /// tsv (`key<TAB>value`, UTF-8 as is, backslash escapes for tab,
        /// newline, CR, backslash and invalid UTF-8), json (strings, or
        /// `key_base64`/`value_base64` for bytes that are not UTF-8), raw, hex.
        #[arg(long, value_enum, default_value_t = output::Format::Tsv)]
        format: output::Format,
        /// At most this many entries.
        #[arg(long)]
        limit: Option<usize>,
        /// Keys only.
        #[arg(long)]
        keys_only: bool,
        /// Print only the number of entries.
        #[arg(long, conflicts_with_all = ["keys_only", "format"])]
        count: bool,
    },
    /// Write one key (one committed transaction).
    Put {
        /// The key (its UTF-8 bytes, or hex digits with --hex).
        key: String,
        /// The value (its UTF-8 bytes, or hex digits with --hex).
        value: String,
        /// The key and value are given in hex.
        #[arg(long)]
        hex: bool,
        /// The config file that names the store.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Delete one key (one committed transaction).
    Delete {
        /// The key (its UTF-8 bytes, or hex digits with --hex).
        key: String,
        /// The key is given in hex.
        #[arg(long)]
        hex: bool,
        /// The config file that names the store.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Crash a guest at every instant and check it stays exactly-once.
    Conformance {
        /// Built-in names or .wasm paths.
        guests: Vec<String>,
        /// The long run: every built-in guest, 16 random seeds and 64
        /// points per step (unless given).
        #[arg(long)]
        all: bool,
        /// The seed explored at every crash point.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Further seeds, each crashed at a few random points.
        #[arg(long, default_value_t = 4)]
        seeds: u64,
        /// Steps per workload.
        #[arg(long, default_value_t = 200)]
        ops: usize,
        /// Most crash points per protocol step and for commit calls
        /// (evenly spread, first and last included; default 10, 64 with
        /// --all). Every one is also crashed again at each point of its
        /// own recovery.
        #[arg(long)]
        max_points: Option<usize>,
        /// Child processes run at once.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Keep each case's changelog in a fresh topic of this Kafka cluster
        /// (`host:port`) instead of the embedded log. Crashes inside
        /// recovery are not explored then (they need a copy of the changelog).
        #[arg(long, value_name = "BOOTSTRAP")]
        kafka: Option<String>,
        /// Seeded power losses per crash point where the crash had a choice
        /// (torn pages, a prefix of unsynced storage writes), besides the
        /// seedless one that keeps nothing unsynced.
        #[arg(long, default_value_t = 2)]
        power_seeds: u64,
        /// Second crashes per crashed state, spread over the storage calls
        /// of its recovery: a number (default 4) or `all` (with --all).
        #[arg(long, value_name = "N|all", value_parser = parse_recovery_points)]
        recovery_points: Option<RecoveryPoints>,
        /// Crash modes to explore: lossy (abort), +flush (storage keeps
        /// every write), power (simulated machine crash).
        #[arg(long, value_delimiter = ',', default_values_t = ["lossy".to_string(), "+flush".to_string(), "power".to_string()],
              value_parser = ["lossy", "+flush", "power"])]
        modes: Vec<String>,
        /// Skip the injected I/O error pass.
        #[arg(long)]
        no_io_errors: bool,
        /// Guarantees to explore, each in full: the task's start-up path
        /// differs (under at-least-once a transactional guest recovers from
        /// a checkpoint written after every commit). Default: the quick
        /// pass under both, the full pass under exactly-once.
        #[arg(long, value_delimiter = ',')]
        guarantees: Vec<Guarantee>,
        /// Run the quick pass only (every kind of crash point once or
        /// twice, under each guarantee): most bugs show in a minute.
        #[arg(long)]
        quick: bool,
        /// An option for the guest's `init`, as `key=value` (repeatable):
        /// test the strategy with the settings it will run with.
        #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
        options: Vec<(String, String)>,
        /// Stop a guest's exploration at its first failure (its report
        /// then covers only what ran): for a quick verdict, as mutation
        /// testing wants.
        #[arg(long)]
        fail_fast: bool,
        /// Also write the report as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Where each case's state directory is made (default: /dev/shm
        /// when writable, else the temp directory; crashes are simulated,
        /// so a disk only adds fsync time).
        #[arg(long, value_name = "DIR")]
        scratch: Option<PathBuf>,
    },
    /// Measure every built-in guest against plain RocksDB in one run.
    Bench {
        /// Distinct keys (and records per write phase).
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Records per commit (default: what 100 ms of native writes gives).
        #[arg(long)]
        commit_every: Option<u64>,
        /// Guests to measure (default: every built-in one).
        #[arg(long, value_delimiter = ',')]
        guests: Vec<String>,
        /// Point reads per isolation level.
        #[arg(long, default_value_t = 200_000)]
        reads: u64,
        /// State sizes for the recovery curve (default: decades from
        /// 10000 up to --keys, and --keys).
        #[arg(long, value_delimiter = ',')]
        recovery_sizes: Vec<u64>,
        /// Instead of the single-store figures: open this many stores in
        /// one process (each its own guest instance) and report open time,
        /// resident memory per store and aggregate write rate.
        #[arg(long, value_name = "N")]
        stores: Option<usize>,
        /// Writer threads for --stores (stores split round-robin).
        #[arg(long, default_value_t = 1, requires = "stores")]
        threads: usize,
        /// Runs per figure; the median is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// md: a markdown table; json: the figures as JSON.
        #[arg(long, value_enum, default_value_t = BenchFormat::Md)]
        format: BenchFormat,
        /// Also write the figures as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Write throughput.svg and recovery.svg into this directory.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
        /// An option for every measured guest's `init`, as `key=value`
        /// (repeatable; pair it with `--guests`, since a guest refuses
        /// options it does not know).
        #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
        options: Vec<(String, String)>,
    },
    /// One recovery measurement's loader (started by `bench`).
    #[command(hide = true)]
    BenchChild {
        #[arg(long)]
        guest: String,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        keys: u64,
        #[arg(long)]
        txn: u64,
        #[arg(long = "option", value_parser = parse_option)]
        options: Vec<(String, String)>,
    },
    /// One `bench --stores` run for one target in a fresh process, so its
    /// resident memory is its own (started by `bench --stores`).
    #[command(hide = true)]
    BenchStoresChild {
        /// The options and the target, as JSON.
        #[arg(long)]
        spec: String,
    },
    /// One conformance run in this process (started by `conformance`).
    #[command(hide = true)]
    ConformanceChild {
        #[arg(long)]
        guest: String,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        ops: usize,
        #[arg(long, requires = "topic")]
        kafka: Option<String>,
        #[arg(long)]
        topic: Option<String>,
        /// An injected I/O error is armed: stopping on an error is expected.
        #[arg(long)]
        expect_errors: bool,
        #[arg(long, default_value_t = Guarantee::ExactlyOnce)]
        guarantee: Guarantee,
        #[arg(long = "option", value_parser = parse_option)]
        options: Vec<(String, String)>,
    },
    /// Move a store to another strategy without losing data: the old guest
    /// recovers it, its committed entries are copied into a store the new
    /// guest builds at the same changelog offset, both are read back and
    /// compared, and the new store is switched in. A crash before the
    /// switch's commit point leaves the old store as it was; after it, the
    /// next open finishes the switch. Then set store.guest to the new guest.
    Migrate {
        /// The config file that names the store and its current guest.
        #[arg(long, short)]
        config: PathBuf,
        /// The guest to move to: a built-in name or a .wasm path.
        #[arg(long, value_name = "GUEST")]
        to: String,
        /// An option for the new guest's `init`, as `key=value` (repeatable;
        /// give the same ones in the config's [store.options] afterwards).
        #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
        options: Vec<(String, String)>,
        /// Print the report as JSON (durations in seconds).
        #[arg(long)]
        json: bool,
    },
    /// Clean the embedded changelog now: every committed segment is
    /// rewritten keeping each key's latest record, and deletes the store
    /// no longer needs are dropped (the store is recovered first). `txstore
    /// run` does the same in the background as segments fill.
    Compact {
        /// The config file that names the store.
        #[arg(long, short)]
        config: PathBuf,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a guest's world, version and whether it is transactional.
    Inspect {
        /// A built-in name or a .wasm path.
        guest: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum IsolationArg {
    Committed,
    Uncommitted,
}

impl From<IsolationArg> for Isolation {
    fn from(i: IsolationArg) -> Self {
        match i {
            IsolationArg::Committed => Isolation::ReadCommitted,
            IsolationArg::Uncommitted => Isolation::ReadUncommitted,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum BenchFormat {
    Md,
    Json,
}

/// `key=value`, for `--option`.
/// `--recovery-points`: a number, or `all` (`None`).
#[derive(Clone, Copy, Debug)]
pub struct RecoveryPoints(Option<usize>);

fn parse_recovery_points(s: &str) -> Result<RecoveryPoints, String> {
    if s == "all" {
        return Ok(RecoveryPoints(None));
    }
    s.parse()
        .map(|n| RecoveryPoints(Some(n)))
        .map_err(|_| format!("`{s}` is not a number or `all`"))
}

fn parse_option(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not key=value"))
}

/// A key or value from the command line: its UTF-8 bytes, or with `hex`
/// the bytes its hex digits spell.
fn arg_bytes(what: &str, text: &str, hex: bool) -> Result<Vec<u8>> {
    if !hex {
        return Ok(text.as_bytes().to_vec());
    }
    let digits = text.as_bytes();
    anyhow::ensure!(
        digits.len() % 2 == 0,
        "the {what} `{text}` is not hex: an odd number of digits"
    );
    digits
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .with_context(|| format!("the {what} `{text}` is not hex"))
        })
        .collect()
}

fn runtime_for(config: &Config) -> Result<Runtime> {
    Runtime::new(config.cache_dir())
}

/// The answer of the task running on the store, if one is running.
fn live(config_path: &PathBuf, request: &serve::Request) -> Result<Option<serve::Answer>> {
    let config = load_store(config_path)?;
    serve::ask(&config.state_dir(), request)
}

fn open(config_path: &Path) -> Result<(Task, RecoveryReport)> {
    let config = load_store(config_path)?;
    let runtime = runtime_for(&config)?;
    Ok(Task::open(&config, &runtime)?)
}

/// A bench's figures on stdout (markdown or JSON) and, if asked, as JSON
/// in a file.
fn print_figures(
    format: BenchFormat,
    md: &str,
    figures: &impl serde::Serialize,
    json: Option<&std::path::Path>,
) -> Result<()> {
    match format {
        BenchFormat::Md => print!("{md}"),
        BenchFormat::Json => println!("{}", serde_json::to_string_pretty(figures)?),
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

pub fn main(cli: Cli) -> Result<()> {
    let _ = PARTITION.set(cli.partition);
    if let Command::Conformance {
        guests,
        all,
        seed,
        seeds,
        ops,
        max_points,
        workers,
        kafka,
        power_seeds,
        recovery_points,
        modes,
        no_io_errors,
        guarantees,
        quick,
        options,
        fail_fast,
        json,
        scratch,
    } = cli.command
    {
        let mut guests = guests;
        if all {
            guests.extend(txstore_artifacts::names().map(str::to_string));
        }
        let random_seeds = if all { seeds.max(16) } else { seeds };
        let max_points = max_points.unwrap_or(if all { 64 } else { 10 });
        let both = vec![Guarantee::ExactlyOnce, Guarantee::AtLeastOnce];
        let (quick_guarantees, guarantees) = match (guarantees.is_empty(), all) {
            (false, _) => (guarantees.clone(), guarantees),
            (true, true) => (both.clone(), both),
            (true, false) => (both, vec![Guarantee::ExactlyOnce]),
        };
        let opts = crate::conformance::Options {
            guests,
            seed,
            random_seeds,
            ops,
            max_points,
            workers,
            only: cli.crash_at,
            only_io_error: cli.io_error,
            kafka,
            power_seeds,
            recovery_points: match recovery_points {
                Some(RecoveryPoints(n)) => n,
                None if all => None,
                None => Some(4),
            },
            modes,
            io_errors: !no_io_errors,
            guarantees,
            quick: quick_guarantees,
            quick_only: quick,
            guest_options: options,
            fail_fast,
            progress: true,
            scratch,
            ..Default::default()
        };
        return conformance(&opts, json);
    }
    let point = cli
        .crash_at
        .map(|p| p.parse::<crash::Armed>())
        .transpose()
        .map_err(anyhow::Error::msg)?;
    crash::arm(point).map_err(anyhow::Error::msg)?;
    let injection = cli
        .io_error
        .map(|s| s.parse::<crate::fault::Injection>())
        .transpose()
        .map_err(anyhow::Error::msg)?;
    crate::fault::arm(injection).map_err(anyhow::Error::msg)?;
    match cli.command {
        Command::Conformance { .. } => unreachable!("handled above"),
        Command::Bench {
            keys,
            commit_every,
            guests,
            reads,
            recovery_sizes,
            runs,
            format,
            json,
            plot,
            options,
            stores,
            threads,
        } => {
            let guests = if guests.is_empty() {
                txstore_artifacts::names().map(str::to_string).collect()
            } else {
                guests
            };
            let runtime = Runtime::new(crate::config::default_cache_dir())?;
            if let Some(stores) = stores {
                anyhow::ensure!(stores > 0, "--stores must be at least 1");
                let commit_every = match commit_every {
                    Some(k) => k,
                    None => crate::bench::default_commit_every(&runtime, keys)?,
                };
                let opts = crate::bench::stores::Options {
                    stores,
                    keys,
                    commit_every,
                    threads,
                    guests,
                    guest_options: options,
                    runs,
                };
                let figures = crate::bench::stores::run(&opts, std::io::stderr().is_terminal())?;
                let md = crate::bench::stores::markdown(&figures);
                return print_figures(format, &md, &figures, json.as_deref());
            }
            let recovery_sizes = if recovery_sizes.is_empty() {
                crate::bench::recovery_sizes_for(keys)
            } else {
                recovery_sizes
            };
            let opts = crate::bench::Options {
                keys,
                commit_every,
                guests,
                reads,
                recovery_sizes,
                runs,
                progress: std::io::stderr().is_terminal(),
                guest_options: options,
            };
            let report = crate::bench::run(&runtime, &opts)?;
            let md = crate::bench::report::markdown(&report);
            print_figures(format, &md, &report, json.as_deref())?;
            if let Some(dir) = plot {
                crate::bench::report::plots(&report, &dir)?;
            }
            Ok(())
        }
        Command::BenchChild {
            guest,
            dir,
            keys,
            txn,
            options,
        } => {
            let runtime = Runtime::new(crate::config::default_cache_dir())?;
            crate::bench::recovery_child(&runtime, &guest, &options, &dir, keys, txn)
        }
        Command::BenchStoresChild { spec } => {
            let runtime = Runtime::new(crate::config::default_cache_dir())?;
            crate::bench::stores::child(&runtime, &spec)
        }
        Command::ConformanceChild {
            guest,
            dir,
            seed,
            ops,
            kafka,
            topic,
            expect_errors,
            guarantee,
            options,
        } => {
            let runtime = Runtime::new(crate::config::default_cache_dir())?;
            let kafka = kafka
                .zip(topic)
                .map(|(bootstrap, topic)| crate::conformance::KafkaTarget { bootstrap, topic });
            std::process::exit(crate::conformance::child_main(
                &runtime,
                &guest,
                &dir,
                seed,
                ops,
                kafka.as_ref(),
                expect_errors,
                guarantee,
                &options,
            ));
        }
        Command::Run {
            config,
            input,
            json,
        } => run(&config, input, json),
        Command::Recover { config, json } => {
            let (task, report) = open(&config)?;
            task.close()?;
            if json {
                let (_, recover_calls) = crash::call_counts();
                let mut value = serde_json::to_value(&report)?;
                value["recover_storage_calls"] = recover_calls.into();
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print_recovery(&report);
            }
            Ok(())
        }
        Command::Get {
            key,
            hex,
            config,
            isolation,
            format,
        } => {
            let key = arg_bytes("key", &key, hex)?;
            let request = serve::Request::get(&key, isolation.into());
            let value = match live(&config, &request)? {
                Some(answer) => answer.into_value()?,
                None => {
                    let (mut task, _) = open(&config)?;
                    let value = task.get(&key, isolation.into())?;
                    task.close()?;
                    value
                }
            };
            match value {
                Some(v) => {
                    let mut out = std::io::stdout().lock();
                    output::write_value(&mut out, format, &v)?;
                    out.flush()?;
                }
                None => anyhow::bail!("key {} not found", crate::tsv::escape(&key)),
            }
            Ok(())
        }
        Command::Scan {
            config,
            from,
            to,
            isolation,
            format,
            limit,
            keys_only,
            count,
        } => {
            let (from, to) = (
                from.as_deref().map(str::as_bytes),
                to.as_deref().map(str::as_bytes),
            );
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut counted = 0usize;
            let shape = output::Shape { keys_only };
            // Lines go out page by page; JSON is one array, written at the end.
            let json = matches!(format, output::Format::Json);
            let mut held = Vec::new();
            let mut each = |mut entries: Vec<(Vec<u8>, Vec<u8>)>| -> Result<()> {
                counted += entries.len();
                if json && !count {
                    held.append(&mut entries);
                } else if !count {
                    output::write_entries(&mut out, format, shape, &entries)?;
                }
                Ok(())
            };
            let state_dir = load_store(&config)?.state_dir();
            let live = serve::ask_scan(&state_dir, from, to, limit, isolation.into(), &mut each)?;
            if !live {
                let (mut task, _) = open(&config)?;
                let mut failed = Ok(());
                task.store().range_pages(
                    from,
                    to,
                    isolation.into(),
                    limit.unwrap_or(usize::MAX),
                    |page| {
                        if failed.is_ok() {
                            failed = each(page);
                        }
                    },
                )?;
                failed?;
                task.close()?;
            }
            if count {
                writeln!(out, "{counted}")?;
            } else if json {
                output::write_entries(&mut out, format, shape, &held)?;
            }
            out.flush()?;
            Ok(())
        }
        Command::Put {
            key,
            value,
            hex,
            config,
        } => {
            let record = crate::changelog::Record::Put(
                arg_bytes("key", &key, hex)?,
                arg_bytes("value", &value, hex)?,
            );
            let (mut task, _) = open(&config)?;
            task.write(&[record])?;
            task.commit()?;
            task.close()?;
            Ok(())
        }
        Command::Delete { key, hex, config } => {
            let record = crate::changelog::Record::Delete(arg_bytes("key", &key, hex)?);
            let (mut task, _) = open(&config)?;
            task.write(&[record])?;
            task.commit()?;
            task.close()?;
            Ok(())
        }
        Command::Migrate {
            config: config_path,
            to,
            options,
            json,
        } => {
            let config = load_store(&config_path)?;
            let runtime = runtime_for(&config)?;
            let Some(r) = crate::task::migrate::migrate(&config, &runtime, &to, &options)? else {
                println!(
                    "store `{}` in {} is already kept by {to} (an interrupted migration is finished); now set \
                     store.guest = {to:?} in {}",
                    config.store.name,
                    config.state_dir().display(),
                    config_path.display()
                );
                return Ok(());
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "migrated store `{}` from {} to {}: {} entries ({} bytes, sha256 {}..) at changelog offset {} \
                     in {:.2} s",
                    r.store,
                    r.from,
                    r.to,
                    r.entries,
                    r.bytes,
                    &r.sha256[..16],
                    r.offset,
                    r.elapsed.as_secs_f64()
                );
                println!(
                    "now set store.guest = {:?} in {}{}",
                    to,
                    config_path.display(),
                    if options.is_empty() {
                        String::new()
                    } else {
                        " (and the options given here in [store.options])".to_string()
                    }
                );
            }
            Ok(())
        }
        Command::Compact { config, json } => compact(&config, json),
        Command::Inspect { guest } => inspect(&guest),
    }
}

fn conformance(opts: &crate::conformance::Options, json: Option<PathBuf>) -> Result<()> {
    if opts.guests.is_empty() {
        anyhow::bail!("name at least one guest (a built-in name or a .wasm path), or pass --all");
    }
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    let started = Instant::now();
    let reports = crate::conformance::run(&runtime, opts)?;
    print!("{}", crate::conformance::render(&reports));
    println!(
        "
{} guests in {:.1} s",
        reports.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.guest.as_str())
        .collect();
    if !failed.is_empty() {
        anyhow::bail!("conformance failed for {}", failed.join(", "));
    }
    Ok(())
}

/// Segment files and bytes of an embedded changelog directory.
fn changelog_size(dir: &Path) -> (u64, u64) {
    let mut out = (0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            out.0 += 1;
            out.1 += entry.metadata().map_or(0, |m| m.len());
        }
    }
    out
}

fn compact(config_path: &Path, json: bool) -> Result<()> {
    let config = load_store(config_path)?;
    let dir = config.changelog_dir();
    let started = std::time::Instant::now();
    let (mut task, _) = open(config_path)?;
    let before = changelog_size(&dir);
    let stats = task.compact()?;
    task.close()?;
    let after = changelog_size(&dir);
    let seconds = started.elapsed().as_secs_f64();
    if json {
        let value = serde_json::json!({
            "changelog": dir,
            "segments_before": before.0, "bytes_before": before.1,
            "segments_after": after.0, "bytes_after": after.1,
            "clean": stats, "seconds": seconds,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        if stats.is_some_and(|s| s.clean_to < s.log_end) {
            anyhow::bail!(
                "changelog.clean_memory_bytes = {} could not cover the whole log",
                config.changelog.clean_memory_bytes
            );
        }
        return Ok(());
    }
    let Some(s) = stats else {
        println!(
            "changelog {}: nothing to clean ({} bytes)",
            dir.display(),
            before.1
        );
        return Ok(());
    };
    println!(
        "changelog {}: {} segments, {} bytes -> {} segments, {} bytes; kept {} of {} records, dropped {} \
         deletes, {} pass{}, in {seconds:.2} s",
        dir.display(),
        before.0,
        before.1,
        after.0,
        after.1,
        s.records_kept,
        s.records_in,
        s.deletes_dropped,
        s.passes,
        if s.passes == 1 { "" } else { "es" }
    );
    // The key index is bounded: say when one pass could not hold the log.
    let memory = config.changelog.clean_memory_bytes;
    if s.clean_to < s.log_end {
        anyhow::bail!(
            "changelog.clean_memory_bytes = {memory} (an index of {} keys) could not cover the whole log: \
             offsets {}..{} are not cleaned",
            s.index_capacity,
            s.clean_to,
            s.log_end
        );
    }
    if s.passes > 1 {
        println!(
            "changelog.clean_memory_bytes = {memory} holds {} keys, fewer than the log's: one pass could not \
             cover the whole log, {} passes did",
            s.index_capacity, s.passes
        );
    }
    Ok(())
}

fn print_recovery(r: &RecoveryReport) {
    let off = |o: Option<u64>| o.map_or("none".to_string(), |o| o.to_string());
    println!(
        "guest:             {} (transactional: {})",
        r.guest, r.transactional
    );
    println!("guarantee:         {}", r.guarantee);
    match r.checkpoint {
        Some(c) => println!("checkpoint:        found, offset {c}"),
        None => println!("checkpoint:        none (first start, or an unclean stop)"),
    }
    let what = match r.action.as_str() {
        "wiped" => "wiped the store",
        "rolled-forward" => "rolled an interrupted commit forward",
        "rolled-back" => "rolled back to the last committed image",
        "discarded" => "discarded uncommitted writes",
        _ => "nothing to undo",
    };
    println!(
        "recovered to:      offset {} ({}: {what})",
        off(r.recovered_offset),
        r.action
    );
    if r.changelog_truncated_bytes > 0 {
        println!(
            "changelog:         truncated {} bytes of an unfinished tail",
            r.changelog_truncated_bytes
        );
    }
    println!(
        "replayed:          {} records in {} transactions (changelog end {})",
        r.replayed_records, r.replayed_transactions, r.changelog_end
    );
    println!("input resumes at:  byte {}", r.input_position);
    println!("time:              {:.1} ms", r.elapsed.as_secs_f64() * 1e3);
}

fn inspect(guest: &str) -> Result<()> {
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    let source = GuestSource::parse(guest);
    let component = match (runtime.load(&source), &source) {
        (Ok(c), _) => c,
        (Err(e), GuestSource::Path(path))
            if format!("{e:#}").contains("it is a processor component") =>
        {
            return inspect_processor(&runtime, path);
        }
        (Err(e), _) => return Err(e),
    };
    let backend = crate::storage::MemoryBackend::new();
    let storage = crate::storage::Backend::open_store(&backend, "inspect")?;
    let mut instance = component.instantiate(storage, "inspect", &runtime::Limits::default())?;
    let transactional = instance.transactional()?;
    println!("guest:          {source}");
    println!(
        "world:          {}/store@{}",
        runtime::WIT_PACKAGE,
        runtime::WIT_VERSION
    );
    println!("transactional:  {transactional}");
    println!("exports:        {}", component.exports.join(", "));
    println!("imports:        {}", component.imports.join(", "));
    println!("sha256:         {}", component.load.hash);
    println!(
        "load:           {:.1} ms ({})",
        component.load.elapsed.as_secs_f64() * 1e3,
        if component.load.cached {
            "cached compilation"
        } else {
            "compiled"
        }
    );
    Ok(())
}

/// `txstore inspect` of a processor component (the `processor` world).
fn inspect_processor(runtime: &Runtime, path: &Path) -> Result<()> {
    let component = crate::task::wasm_processor::ProcessorComponent::load(runtime, path)?;
    println!("processor:      {}", path.display());
    println!(
        "world:          {}/processor@{}",
        runtime::WIT_PACKAGE,
        runtime::WIT_VERSION
    );
    println!("exports:        {}", component.exports.join(", "));
    println!("imports:        {}", component.imports.join(", "));
    println!("sha256:         {}", component.load.hash);
    Ok(())
}
