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
//! # Modules
//!
//! The public API is the items re-exported here. The modules, one per part
//! of the design, are public for the command line and the tests, and
//! hidden from these docs:
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
//! - `config` and `cli`: the TOML configuration and the command line.

#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod changelog;
#[doc(hidden)]
pub mod checkpoint;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod conformance;
#[doc(hidden)]
pub mod crash;
mod error;
#[doc(hidden)]
pub mod fault;
#[doc(hidden)]
pub mod file;
#[doc(hidden)]
pub mod mutants;
#[doc(hidden)]
pub mod runtime;
#[doc(hidden)]
pub mod storage;
#[doc(hidden)]
pub mod task;

pub use changelog::Record;
pub use config::{Config, Guarantee};
pub use error::Error;
pub use runtime::{Isolation, Limits, Runtime};
pub use task::processor::{Kv, WordCount};
pub use task::{Context, Input, Processor, RecoveryReport, Task, TaskBuilder, TaskStats};
