//! The `txstore` command line.

mod run;

use run::run;

use crate::config::Config;
use crate::runtime::{GuestSource, Isolation, Runtime};
use crate::task::{RecoveryReport, Task};
use crate::{crash, runtime};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
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
}

#[derive(Subcommand)]
enum Command {
    /// Process an input file through the configured guest, exactly-once.
    Run {
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
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Read one key.
    Get {
        key: String,
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long, value_enum, default_value_t = IsolationArg::Committed)]
        isolation: IsolationArg,
    },
    /// Print keys in [from, to) as `key<TAB>value` lines (or JSON).
    Scan {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
        #[arg(long, value_enum, default_value_t = IsolationArg::Committed)]
        isolation: IsolationArg,
        #[arg(long, value_enum, default_value_t = Format::Tsv)]
        format: Format,
    },
    /// Write one key (one committed transaction).
    Put {
        key: String,
        value: String,
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Delete one key (one committed transaction).
    Delete {
        key: String,
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Crash a guest at every instant and check it stays exactly-once.
    Conformance {
        /// Built-in names or .wasm paths.
        guests: Vec<String>,
        /// Every built-in guest, with more random seeds.
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
        /// Most crash points per protocol step and for commit calls.
        #[arg(long, default_value_t = 64)]
        max_points: usize,
        /// Child processes run at once.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Keep each case's changelog in a fresh topic of this Kafka cluster
        /// (`host:port`) instead of the embedded log. Crashes inside
        /// recovery are not explored then (they need a copy of the changelog).
        #[arg(long, value_name = "BOOTSTRAP")]
        kafka: Option<String>,
        /// Also write the report as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
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
        /// State sizes for the recovery curve.
        #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
        recovery_sizes: Vec<u64>,
        /// Runs per figure; the median is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long, value_enum, default_value_t = BenchFormat::Md)]
        format: BenchFormat,
        /// Also write the figures as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Write throughput.svg and recovery.svg into this directory.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
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

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Tsv,
    Json,
}

/// Renders bytes for a terminal: printable ASCII as is, `\\`, `\t`, `\n`
/// and everything else as `\xNN`.
pub fn escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

fn runtime_for(config: &Config) -> Result<Runtime> {
    Runtime::new(config.cache_dir())
}

fn open(config_path: &PathBuf) -> Result<(Task, RecoveryReport)> {
    let config = Config::load(config_path)?;
    let runtime = runtime_for(&config)?;
    Task::open(&config, &runtime)
}

pub fn main(cli: Cli) -> Result<()> {
    if let Command::Conformance {
        guests,
        all,
        seed,
        seeds,
        ops,
        max_points,
        workers,
        kafka,
        json,
    } = cli.command
    {
        let mut guests = guests;
        if all {
            guests.extend(txstore_artifacts::names().map(str::to_string));
        }
        let random_seeds = if all { seeds.max(16) } else { seeds };
        let opts = crate::conformance::Options {
            guests,
            seed,
            random_seeds,
            ops,
            max_points,
            workers,
            only: cli.crash_at,
            kafka,
            progress: std::io::stderr().is_terminal(),
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
        } => {
            let guests = if guests.is_empty() {
                txstore_artifacts::names().map(str::to_string).collect()
            } else {
                guests
            };
            let opts = crate::bench::Options {
                keys,
                commit_every,
                guests,
                reads,
                recovery_sizes,
                runs,
                progress: std::io::stderr().is_terminal(),
            };
            let runtime = Runtime::new(crate::config::default_cache_dir())?;
            let report = crate::bench::run(&runtime, &opts)?;
            match format {
                BenchFormat::Md => print!("{}", crate::bench::report::markdown(&report)),
                BenchFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
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
        } => {
            let runtime = Runtime::new(crate::config::default_cache_dir())?;
            crate::bench::recovery_child(&runtime, &guest, &dir, keys, txn)
        }
        Command::ConformanceChild {
            guest,
            dir,
            seed,
            ops,
            kafka,
            topic,
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
            config,
            isolation,
        } => {
            let (mut task, _) = open(&config)?;
            let value = task.get(key.as_bytes(), isolation.into())?;
            task.close()?;
            match value {
                Some(v) => println!("{}", escape(&v)),
                None => anyhow::bail!("key {} not found", escape(key.as_bytes())),
            }
            Ok(())
        }
        Command::Scan {
            config,
            from,
            to,
            isolation,
            format,
        } => {
            let (mut task, _) = open(&config)?;
            let entries = task.store().range_all(
                from.as_deref().map(str::as_bytes),
                to.as_deref().map(str::as_bytes),
                isolation.into(),
            )?;
            task.close()?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match format {
                Format::Tsv => {
                    for (k, v) in entries {
                        writeln!(out, "{}\t{}", escape(&k), escape(&v))?;
                    }
                }
                Format::Json => {
                    let rows: Vec<_> = entries
                        .iter()
                        .map(|(k, v)| serde_json::json!({"key": escape(k), "value": escape(v)}))
                        .collect();
                    writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
                }
            }
            Ok(())
        }
        Command::Put { key, value, config } => {
            let (mut task, _) = open(&config)?;
            task.write(&[crate::changelog::Record::Put(
                key.into_bytes(),
                value.into_bytes(),
            )])?;
            task.commit()?;
            task.close()?;
            Ok(())
        }
        Command::Delete { key, config } => {
            let (mut task, _) = open(&config)?;
            task.write(&[crate::changelog::Record::Delete(key.into_bytes())])?;
            task.commit()?;
            task.close()?;
            Ok(())
        }
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
    let component = runtime.load(&source)?;
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
