//! txstore: transactional state stores for stream processing, with the
//! strategy as a sandboxed WebAssembly component.
//!
//! # Embedding
//!
//! A [`Task`] is one store (kept by a strategy guest in RocksDB) with its
//! changelog and checkpoint, driven by the exactly-once protocol: each
//! input record goes through a [`Processor`], whose writes and output
//! commit together with the record's input position. After a crash,
//! [`Task::open`] (or [`TaskBuilder::open`]) recovers the store to the
//! last commit and [`Task::input_position`] says where to resume.
//!
//! ```
//! use txstore::{Context, Error, Input, Isolation, Processor, TaskBuilder};
//!
//! /// Sums the numbers seen per key (`key<TAB>number` lines).
//! struct Sum;
//!
//! impl Processor for Sum {
//!     fn process(&mut self, input: Input<'_>, ctx: &mut Context<'_>) -> Result<(), Error> {
//!         let line = input.value().unwrap_or_default();
//!         let Some(tab) = line.iter().position(|&b| b == b'\t') else { return Ok(()) };
//!         let (key, n) = (&line[..tab], &line[tab + 1..]);
//!         let n: i64 = std::str::from_utf8(n).ok().and_then(|s| s.parse().ok())
//!             .ok_or_else(|| Error::processor("not a number"))?;
//!         let old: i64 = ctx.get(key)?.map_or(0, |v| String::from_utf8_lossy(&v).parse().unwrap_or(0));
//!         let sum = (old + n).to_string();
//!         ctx.put(key, sum.as_bytes());
//!         ctx.emit(key, Some(sum.as_bytes()));
//!         Ok(())
//!     }
//! }
//!
//! let dir = tempfile::tempdir()?;
//! let input = ["a\t1", "b\t5", "a\t2"];
//! let (mut task, _) = TaskBuilder::new(dir.path()).guest("roll-forward").processor(Sum).open()?;
//! // Resume after the last committed record (0 on a new store).
//! let mut position = task.input_position();
//! for line in &input[position as usize..] {
//!     position += 1;
//!     task.process_line(line.as_bytes(), position)?;
//! }
//! task.close()?;
//!
//! let (mut task, _) = TaskBuilder::new(dir.path()).processor(Sum).open()?;
//! assert_eq!(task.get(b"a", Isolation::ReadCommitted)?.as_deref(), Some(&b"3"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What you may use
//!
//! The public API is the items re-exported here and [`cli`] (the `txstore`
//! binary's entry point, for a binary that embeds its commands). Every
//! module below is private to the crate: one per part of the design, in
//! floors where a module imports only modules below it (docs/layout.md):
//! - `runtime`: wasmtime engine, guest loading and caching, sandbox limits;
//!   processor components;
//! - `storage`: durable keyspaces and snapshots (RocksDB, memory);
//! - `changelog`: the transactional log the store is rebuilt from;
//! - `checkpoint`: the atomically written checkpoint file;
//! - `task`: the exactly-once commit protocol and start-up recovery, the
//!   processors, the output, and the tasks of a Kafka input's partitions;
//! - `crash`: named crash points for crash tests;
//! - `file`: the file layer for the host's own files, with the power-loss
//!   simulation; `fault`: injected I/O errors; `mutants`: test-only bugs;
//! - `conformance`: the suite that crashes a guest everywhere and checks it;
//! - `bench`: `txstore bench`, guests against plain RocksDB;
//! - `config`: the TOML configuration;
//! - `metrics`: the operator's Prometheus endpoint (`[metrics] listen`);
//! - `tsv`: the escape of every `key<TAB>value` field the host writes.
//!
//! The integration tests and benches reach a few internals more through
//! `testing`, which only the `testing` feature (on for `cargo test` and
//! `cargo bench`) compiles: it is not API.

pub(crate) mod bench;
mod cause;
pub(crate) mod changelog;
pub(crate) mod checkpoint;
pub mod cli;
pub(crate) mod config;
pub(crate) mod conformance;
pub(crate) mod crash;
mod error;
pub(crate) mod fault;
pub(crate) mod file;
pub(crate) mod metrics;
pub(crate) mod mutants;
pub(crate) mod rng;
pub(crate) mod runtime;
pub(crate) mod storage;
pub(crate) mod task;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub(crate) mod tsv;

/// ```
/// use txstore::Record;
///
/// let put = Record::Put(b"k".to_vec(), b"v".to_vec());
/// assert_eq!(put.key(), b"k");
/// assert_eq!(Record::Delete(b"k".to_vec()).key(), b"k");
/// ```
pub use changelog::Record;
/// ```
/// let config = txstore::Config::new("roll-forward", "state".as_ref());
/// assert_eq!(config.task.guarantee, txstore::Guarantee::ExactlyOnce);
/// ```
pub use config::Config;
/// ```
/// use txstore::Guarantee;
///
/// assert_eq!(Guarantee::default(), Guarantee::ExactlyOnce);
/// assert_eq!(Guarantee::AtLeastOnce.to_string(), "at-least-once");
/// ```
pub use config::Guarantee;
pub use error::Error;
/// ```
/// use txstore::{Isolation, TaskBuilder};
///
/// let dir = tempfile::tempdir()?;
/// let (mut task, _) = TaskBuilder::new(dir.path()).manual_commits().open()?;
/// task.process_line(b"k\tv", 4)?;
/// assert_eq!(task.get(b"k", Isolation::ReadCommitted)?, None);
/// assert!(task.get(b"k", Isolation::ReadUncommitted)?.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use runtime::Isolation;
/// ```
/// let limits = txstore::Limits { memory_mib: 128, call_timeout_ms: 5_000, ..Default::default() };
/// assert_eq!(limits.max_tables, txstore::Limits::default().max_tables);
/// ```
pub use runtime::Limits;
/// A wasmtime engine with the host's imports linked, and the cache of
/// compiled guests.
pub use runtime::Runtime;
/// ```
/// use txstore::{Isolation, Kv, TaskBuilder};
///
/// let dir = tempfile::tempdir()?;
/// let (mut task, _) = TaskBuilder::new(dir.path()).processor(Kv).open()?;
/// task.process_line(b"k\tv", 4)?; // puts k = v
/// task.process_line(b"k", 6)?; // deletes k
/// assert_eq!(task.get(b"k", Isolation::ReadUncommitted)?, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use task::processor::Kv;
/// ```
/// use txstore::{Isolation, TaskBuilder, WordCount};
///
/// let dir = tempfile::tempdir()?;
/// let (mut task, _) = TaskBuilder::new(dir.path()).processor(WordCount).open()?;
/// task.process_line(b"Hello, hello world", 19)?;
/// assert_eq!(task.get(b"hello", Isolation::ReadUncommitted)?.as_deref(), Some(&b"2"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use task::processor::WordCount;
/// The most entries one [`Context::range`] call returns.
pub use task::processor::MAX_RANGE_PAGE;
/// ```
/// let dir = tempfile::tempdir()?;
/// let (mut task, _) = txstore::TaskBuilder::new(dir.path()).open()?;
/// task.process_line(b"a\t1", 4)?;
/// task.close()?;
/// let (_, report) = txstore::TaskBuilder::new(dir.path()).open()?;
/// assert_eq!((report.action.as_str(), report.input_position), ("clean", 4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use task::RecoveryReport;
/// ```
/// use txstore::{Isolation, TaskBuilder};
///
/// let dir = tempfile::tempdir()?;
/// let (mut task, _) = TaskBuilder::new(dir.path()).open()?;
/// task.process_line(b"a\t1", 4)?;
/// task.close()?; // commits, checkpoints
/// let (mut task, report) = TaskBuilder::new(dir.path()).open()?;
/// assert_eq!(task.get(b"a", Isolation::ReadCommitted)?.as_deref(), Some(&b"1"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use task::Task;
/// ```
/// let dir = tempfile::tempdir()?;
/// let (mut task, _) = txstore::TaskBuilder::new(dir.path()).open()?;
/// task.process_line(b"a\t1", 4)?;
/// let stats: txstore::TaskStats = task.close()?;
/// assert_eq!((stats.records, stats.commits), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use task::TaskStats;
pub use task::{Context, Input, Processor, TaskBuilder};

/// Arms the crash point that the environment names, for an application's
/// own crash tests: with `TXSTORE_CRASH_AT=POINT` (for example
/// `after-changelog-commit@3`, or `after-write@100+power` for a simulated
/// power cut) the process aborts when a task reaches that point of the
/// protocol; `TXSTORE_POWER_SIM=1` keeps the power-loss journal of the
/// state directory in the runs that follow. Without these variables it
/// does nothing. Call it once, first thing in `main`.
///
/// ```
/// txstore::arm_crash_point_from_env()?;
/// # Ok::<(), txstore::Error>(())
/// ```
pub fn arm_crash_point_from_env() -> Result<(), Error> {
    crash::arm(None).map_err(|e| Error::Config(anyhow::anyhow!("{}: {e}", crash::ENV)))
}

/// Lets txstore drive a Kafka input (`task.input = { kind = "kafka", ... }`
/// in `config`, with a Kafka changelog): one task per assigned partition,
/// each with its own store, guest instance and processor (`processors`
/// makes one per partition; `None`: the processor the config names),
/// until `stop` is set (every open task then commits and closes) or a
/// task fails. The consumer group moves partitions between processes; a
/// moved partition's state follows it through its changelog.
///
/// ```no_run
/// use std::sync::atomic::AtomicBool;
/// use txstore::{Config, Processor, Runtime, WordCount};
///
/// let config = Config::load("pipeline.toml".as_ref())?;
/// let runtime = Runtime::new(None)?;
/// static STOP: AtomicBool = AtomicBool::new(false); // set from a signal handler
/// let make = |_partition: i32| Box::new(WordCount) as Box<dyn Processor>;
/// let summary = txstore::run_kafka_input(&config, &runtime, &STOP, Some(&make))?;
/// println!("{} records", summary.stats.records);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_kafka_input(
    config: &Config,
    runtime: &Runtime,
    stop: &std::sync::atomic::AtomicBool,
    processors: Option<&(dyn Fn(i32) -> Box<dyn Processor> + Sync)>,
) -> Result<KafkaSummary, Error> {
    Ok(task::partitions::run(config, runtime, stop, processors)?)
}

/// What [`run_kafka_input`] did: every partition opened (with its
/// recovery), closed and lost, and the tasks' counters.
///
/// ```no_run
/// # let summary: txstore::KafkaSummary = unimplemented!();
/// for (partition, report) in &summary.opened {
///     println!("partition {partition}: {} to {:?}", report.action, report.recovered_offset);
/// }
/// ```
pub use task::partitions::Summary as KafkaSummary;
