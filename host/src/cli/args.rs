//! The command line's arguments: every subcommand's flags, with their
//! help text, and the parsers of their values.

use super::output;
use crate::config::Guarantee;
use crate::runtime::Isolation;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "txstore",
    version,
    about = "Transactional state stores for stream processing, as sandboxed wasm components"
)]
pub struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
    /// End the process abruptly at this crash point (also: TXSTORE_CRASH_AT).
    /// For `conformance`: the case to rerun, `P` or `P,Q` as its reproducer
    /// line prints.
    #[arg(long, global = true, value_name = "POINT")]
    pub(super) crash_at: Option<String>,
    /// Make the N-th I/O call of one kind fail, for tests: `KIND:N` with
    /// KIND one of fsync, write-enospc, write-short, rename, storage-sync,
    /// storage-write, storage-read (also `TXSTORE_IO_ERROR`).
    #[arg(long, global = true, value_name = "KIND:N")]
    pub(super) io_error: Option<String>,
    /// For a config whose input is a Kafka topic: the input partition whose
    /// store a store command (get, scan, put, delete, recover, compact,
    /// migrate) works on, under that partition's lock.
    #[arg(long, global = true, value_name = "P")]
    pub(super) partition: Option<i32>,
}

#[derive(Subcommand)]
pub(super) enum Command {
    /// Process an input file through the configured guest, one record per
    /// line, under the configured guarantee: exactly-once (the store
    /// equals the committed changelog after any crash) or at-least-once
    /// (nothing committed is lost; input after the last commit may be
    /// processed again). Resumes where the last run committed.
    Run(RunArgs),
    /// Run start-up recovery only and report what it did.
    Recover(RecoverArgs),
    /// Read one key and print its value (answered by the running task
    /// while `txstore run` processes the store).
    Get(GetArgs),
    /// Print the entries with keys in [from, to), in key order (answered by
    /// the running task while `txstore run` processes the store).
    Scan(ScanArgs),
    /// Write one key (one committed transaction).
    Put(PutArgs),
    /// Delete one key (one committed transaction).
    Delete(DeleteArgs),
    /// Crash a guest at every instant and check it stays exactly-once.
    Conformance(ConformanceArgs),
    /// Measure every built-in guest against plain RocksDB in one run.
    Bench(BenchArgs),
    /// One recovery measurement's loader (started by `bench`).
    #[command(hide = true)]
    BenchChild(BenchChildArgs),
    /// One `bench --stores` run for one target in a fresh process, so its
    /// resident memory is its own (started by `bench --stores`).
    #[command(hide = true)]
    BenchStoresChild(BenchStoresChildArgs),
    /// One conformance run in this process (started by `conformance`).
    #[command(hide = true)]
    ConformanceChild(ConformanceChildArgs),
    /// Move a store to another strategy without losing data: the old guest
    /// recovers it, its committed entries are copied into a store the new
    /// guest builds at the same changelog offset, both are read back and
    /// compared, and the new store is switched in. A crash before the
    /// switch's commit point leaves the old store as it was; after it, the
    /// next open finishes the switch. Then set store.guest to the new guest.
    Migrate(MigrateArgs),
    /// Clean the embedded changelog now: every committed segment is
    /// rewritten keeping each key's latest record, and deletes the store
    /// no longer needs are dropped (the store is recovered first). `txstore
    /// run` does the same in the background as segments fill.
    Compact(CompactArgs),
    /// Show a guest's world, version and whether it is transactional.
    Inspect(InspectArgs),
}

/// `txstore run`.
#[derive(Args)]
pub(super) struct RunArgs {
    /// The config file (TOML) that names the store, guest and input.
    #[arg(long, short)]
    pub(super) config: PathBuf,
    /// Input file (overrides task.input).
    #[arg(long)]
    pub(super) input: Option<PathBuf>,
    /// Print the recovery report and the summary as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// `txstore recover`.
#[derive(Args)]
pub(super) struct RecoverArgs {
    /// The config file that names the store.
    #[arg(long, short)]
    pub(super) config: PathBuf,
    /// Print the report as JSON (durations in seconds).
    #[arg(long)]
    pub(super) json: bool,
}

/// `txstore get`.
#[derive(Args)]
pub(super) struct GetArgs {
    /// The key (its UTF-8 bytes, or hex digits with --hex).
    pub(super) key: String,
    /// The key is given in hex (for keys that are not text).
    #[arg(long)]
    pub(super) hex: bool,
    /// The config file that names the store.
    #[arg(long, short)]
    pub(super) config: PathBuf,
    /// committed: the last committed state; uncommitted: with the open
    /// transaction.
    #[arg(long, value_enum, default_value_t = IsolationArg::Committed)]
    pub(super) isolation: IsolationArg,
    /// tsv: UTF-8 as is, backslash escapes for tab, newline, CR,
    /// backslash and invalid UTF-8; json: a string or base64; raw: the
    /// bytes; hex.
    #[arg(long, value_enum, default_value_t = output::Format::Tsv)]
    pub(super) format: output::Format,
}

/// `txstore scan`.
#[derive(Args)]
pub(super) struct ScanArgs {
    /// The config file that names the store.
    #[arg(long, short)]
    pub(super) config: PathBuf,
    /// First key (inclusive; default: the first).
    #[arg(long)]
    pub(super) from: Option<String>,
    /// End key (exclusive; default: past the last).
    #[arg(long)]
    pub(super) to: Option<String>,
    /// committed: the last committed state; uncommitted: with the open
    /// transaction.
    #[arg(long, value_enum, default_value_t = IsolationArg::Committed)]
    pub(super) isolation: IsolationArg,
    /// tsv (`key<TAB>value`, UTF-8 as is, backslash escapes for tab,
    /// newline, CR, backslash and invalid UTF-8), json (strings, or
    /// `key_base64`/`value_base64` for bytes that are not UTF-8), raw, hex.
    #[arg(long, value_enum, default_value_t = output::Format::Tsv)]
    pub(super) format: output::Format,
    /// At most this many entries.
    #[arg(long)]
    pub(super) limit: Option<usize>,
    /// Keys only.
    #[arg(long)]
    pub(super) keys_only: bool,
    /// Print only the number of entries.
    #[arg(long, conflicts_with_all = ["keys_only", "format"])]
    pub(super) count: bool,
}

/// `txstore put`.
#[derive(Args)]
pub(super) struct PutArgs {
    /// The key (its UTF-8 bytes, or hex digits with --hex).
    pub(super) key: String,
    /// The value (its UTF-8 bytes, or hex digits with --hex).
    pub(super) value: String,
    /// The key and value are given in hex.
    #[arg(long)]
    pub(super) hex: bool,
    /// The config file that names the store.
    #[arg(long, short)]
    pub(super) config: PathBuf,
}

/// `txstore delete`.
#[derive(Args)]
pub(super) struct DeleteArgs {
    /// The key (its UTF-8 bytes, or hex digits with --hex).
    pub(super) key: String,
    /// The key is given in hex.
    #[arg(long)]
    pub(super) hex: bool,
    /// The config file that names the store.
    #[arg(long, short)]
    pub(super) config: PathBuf,
}

/// `txstore conformance`.
#[derive(Args)]
pub(super) struct ConformanceArgs {
    /// Built-in names or .wasm paths.
    pub(super) guests: Vec<String>,
    /// The long run: every built-in guest, 16 random seeds and 64
    /// points per step (unless given).
    #[arg(long)]
    pub(super) all: bool,
    /// The seed explored at every crash point.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Further seeds, each crashed at a few random points.
    #[arg(long, default_value_t = 4)]
    pub(super) seeds: u64,
    /// Steps per workload.
    #[arg(long, default_value_t = 200)]
    pub(super) ops: usize,
    /// Most crash points per protocol step and for commit calls
    /// (evenly spread, first and last included; default 10, 64 with
    /// --all). Every one is also crashed again at each point of its
    /// own recovery.
    #[arg(long)]
    pub(super) max_points: Option<usize>,
    /// Child processes run at once.
    #[arg(long, default_value_t = 2)]
    pub(super) workers: usize,
    /// Keep each case's changelog in a fresh topic of this Kafka cluster
    /// (`host:port`) instead of the embedded log. Crashes inside
    /// recovery are not explored then (they need a copy of the changelog).
    #[arg(long, value_name = "BOOTSTRAP")]
    pub(super) kafka: Option<String>,
    /// Seeded power losses per crash point where the crash had a choice
    /// (torn pages, a prefix of unsynced storage writes), besides the
    /// seedless one that keeps nothing unsynced.
    #[arg(long, default_value_t = 2)]
    pub(super) power_seeds: u64,
    /// Second crashes per crashed state, spread over the storage calls
    /// of its recovery: a number (default 4) or `all` (with --all).
    #[arg(long, value_name = "N|all", value_parser = parse_recovery_points)]
    pub(super) recovery_points: Option<RecoveryPoints>,
    /// Crash modes to explore: lossy (abort), +flush (storage keeps
    /// every write), power (simulated machine crash).
    #[arg(long, value_delimiter = ',', default_values_t = ["lossy".to_string(), "+flush".to_string(), "power".to_string()],
          value_parser = ["lossy", "+flush", "power"])]
    pub(super) modes: Vec<String>,
    /// Skip the injected I/O error pass.
    #[arg(long)]
    pub(super) no_io_errors: bool,
    /// Guarantees to explore, each in full: the task's start-up path
    /// differs (under at-least-once a transactional guest recovers from
    /// a checkpoint written after every commit). Default: the quick
    /// pass under both, the full pass under exactly-once.
    #[arg(long, value_delimiter = ',')]
    pub(super) guarantees: Vec<Guarantee>,
    /// Run the quick pass only (every kind of crash point once or
    /// twice, under each guarantee): most bugs show in a minute.
    #[arg(long)]
    pub(super) quick: bool,
    /// An option for the guest's `init`, as `key=value` (repeatable):
    /// test the strategy with the settings it will run with.
    #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
    pub(super) options: Vec<(String, String)>,
    /// Stop a guest's exploration at its first failure (its report
    /// then covers only what ran): for a quick verdict, as mutation
    /// testing wants.
    #[arg(long)]
    pub(super) fail_fast: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
    /// Where each case's state directory is made (default: /dev/shm
    /// when writable, else the temp directory; crashes are simulated,
    /// so a disk only adds fsync time).
    #[arg(long, value_name = "DIR")]
    pub(super) scratch: Option<PathBuf>,
}

/// `txstore bench`.
#[derive(Args)]
pub(super) struct BenchArgs {
    /// Distinct keys (and records per write phase).
    #[arg(long, default_value_t = 1_000_000)]
    pub(super) keys: u64,
    /// Records per commit (default: what 100 ms of native writes gives).
    #[arg(long)]
    pub(super) commit_every: Option<u64>,
    /// Guests to measure (default: every built-in one).
    #[arg(long, value_delimiter = ',')]
    pub(super) guests: Vec<String>,
    /// Point reads per isolation level.
    #[arg(long, default_value_t = 200_000)]
    pub(super) reads: u64,
    /// State sizes for the recovery curve (default: decades from
    /// 10000 up to --keys, and --keys).
    #[arg(long, value_delimiter = ',')]
    pub(super) recovery_sizes: Vec<u64>,
    /// Instead of the single-store figures: open this many stores in
    /// one process (each its own guest instance) and report open time,
    /// resident memory per store and aggregate write rate.
    #[arg(long, value_name = "N")]
    pub(super) stores: Option<usize>,
    /// Writer threads for --stores (stores split round-robin).
    #[arg(long, default_value_t = 1, requires = "stores")]
    pub(super) threads: usize,
    /// Instead of the single-store figures: `txstore run` end to end over
    /// this many input lines per processor (word count and kv), each guest
    /// against the `native` store.
    #[arg(long, value_name = "LINES", conflicts_with = "stores")]
    pub(super) pipeline: Option<u64>,
    /// Runs per figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub(super) runs: usize,
    /// md: a markdown table; json: the figures as JSON.
    #[arg(long, value_enum, default_value_t = BenchFormat::Md)]
    pub(super) format: BenchFormat,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
    /// Write throughput.svg and recovery.svg into this directory.
    #[arg(long, value_name = "DIR")]
    pub(super) plot: Option<PathBuf>,
    /// An option for every measured guest's `init`, as `key=value`
    /// (repeatable; pair it with `--guests`, since a guest refuses
    /// options it does not know).
    #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
    pub(super) options: Vec<(String, String)>,
}

/// `txstore bench-child`.
#[derive(Args)]
pub(super) struct BenchChildArgs {
    #[arg(long)]
    pub(super) guest: String,
    #[arg(long)]
    pub(super) dir: PathBuf,
    #[arg(long)]
    pub(super) keys: u64,
    #[arg(long)]
    pub(super) txn: u64,
    #[arg(long = "option", value_parser = parse_option)]
    pub(super) options: Vec<(String, String)>,
}

/// `txstore bench-stores-child`.
#[derive(Args)]
pub(super) struct BenchStoresChildArgs {
    /// The options and the target, as JSON.
    #[arg(long)]
    pub(super) spec: String,
}

/// `txstore conformance-child`.
#[derive(Args)]
pub(super) struct ConformanceChildArgs {
    #[arg(long)]
    pub(super) guest: String,
    #[arg(long)]
    pub(super) dir: PathBuf,
    #[arg(long)]
    pub(super) seed: u64,
    #[arg(long)]
    pub(super) ops: usize,
    #[arg(long, requires = "topic")]
    pub(super) kafka: Option<String>,
    #[arg(long)]
    pub(super) topic: Option<String>,
    /// An injected I/O error is armed: stopping on an error is expected.
    #[arg(long)]
    pub(super) expect_errors: bool,
    #[arg(long, default_value_t = Guarantee::ExactlyOnce)]
    pub(super) guarantee: Guarantee,
    #[arg(long = "option", value_parser = parse_option)]
    pub(super) options: Vec<(String, String)>,
}

/// `txstore migrate`.
#[derive(Args)]
pub(super) struct MigrateArgs {
    /// The config file that names the store and its current guest.
    #[arg(long, short)]
    pub(super) config: PathBuf,
    /// The guest to move to: a built-in name or a .wasm path.
    #[arg(long, value_name = "GUEST")]
    pub(super) to: String,
    /// An option for the new guest's `init`, as `key=value` (repeatable;
    /// give the same ones in the config's [store.options] afterwards).
    #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
    pub(super) options: Vec<(String, String)>,
    /// Print the report as JSON (durations in seconds).
    #[arg(long)]
    pub(super) json: bool,
}

/// `txstore compact`.
#[derive(Args)]
pub(super) struct CompactArgs {
    /// The config file that names the store.
    #[arg(long, short)]
    pub(super) config: PathBuf,
    /// Print the figures as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// `txstore inspect`.
#[derive(Args)]
pub(super) struct InspectArgs {
    /// A built-in name or a .wasm path.
    pub(super) guest: String,
}

#[derive(Clone, Copy, ValueEnum)]
pub(super) enum IsolationArg {
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
pub(super) enum BenchFormat {
    Md,
    Json,
}

/// `--recovery-points`: a number, or `all` (`None`).
#[derive(Clone, Copy, Debug)]
pub struct RecoveryPoints(pub(super) Option<usize>);

fn parse_recovery_points(s: &str) -> Result<RecoveryPoints, String> {
    if s == "all" {
        return Ok(RecoveryPoints(None));
    }
    s.parse()
        .map(|n| RecoveryPoints(Some(n)))
        .map_err(|_| format!("`{s}` is not a number or `all`"))
}

/// `key=value`, for `--option`.
fn parse_option(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not key=value"))
}
