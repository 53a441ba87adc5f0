//! The `txstore` command line: a short dispatcher over one module per
//! subcommand (`args` holds every flag). The store commands share how a
//! config names its store (`--partition` for a Kafka input's stores).

mod args;
mod bench;
mod compact;
mod conformance;
mod inspect;
mod migrate;
mod output;
mod query;
mod recover;
mod run;
mod write;

pub use args::Cli;
use args::Command;

use crate::config::Config;
use crate::runtime::Runtime;
use crate::task::{RecoveryReport, Task};
use anyhow::Result;
use std::path::Path;

/// `--partition`, for the store commands.
static PARTITION: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();

pub fn main(cli: Cli) -> Result<()> {
    let _ = PARTITION.set(cli.partition);
    // For conformance, --crash-at and --io-error name a case to rerun;
    // for every other command they arm this process.
    if let Command::Conformance(a) = cli.command {
        return conformance::main(a, cli.crash_at, cli.io_error);
    }
    arm_faults(cli.crash_at, cli.io_error)?;
    match cli.command {
        Command::Conformance(_) => unreachable!("handled above"),
        Command::ConformanceChild(a) => conformance::child(a),
        Command::Bench(a) => bench::main(a),
        Command::BenchChild(a) => bench::child(a),
        Command::BenchStoresChild(a) => bench::stores_child(a),
        Command::Run(a) => run::run(&a.config, a.input, a.json),
        Command::Recover(a) => recover::main(a),
        Command::Get(a) => query::get(a),
        Command::Scan(a) => query::scan(a),
        Command::Put(a) => write::put(a),
        Command::Delete(a) => write::delete(a),
        Command::Migrate(a) => migrate::main(a),
        Command::Compact(a) => compact::main(&a.config, a.json),
        Command::Inspect(a) => inspect::main(&a.guest),
    }
}

/// `--crash-at` and `--io-error` (or their environment variables) for this
/// process.
fn arm_faults(crash_at: Option<String>, io_error: Option<String>) -> Result<()> {
    let point = crash_at
        .map(|p| p.parse::<crate::crash::Armed>())
        .transpose()
        .map_err(anyhow::Error::msg)?;
    crate::crash::arm(point).map_err(anyhow::Error::msg)?;
    let injection = io_error
        .map(|s| s.parse::<crate::fault::Injection>())
        .transpose()
        .map_err(anyhow::Error::msg)?;
    crate::fault::arm(injection).map_err(anyhow::Error::msg)
}

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

fn runtime_for(config: &Config) -> Result<Runtime> {
    Runtime::new(config.cache_dir())
}

/// The store a store command names, opened (recovered).
fn open(config_path: &Path) -> Result<(Task, RecoveryReport)> {
    let config = load_store(config_path)?;
    let runtime = runtime_for(&config)?;
    Ok(Task::open(&config, &runtime)?)
}
