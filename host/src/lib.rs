//! txstore: transactional state stores for stream processing, with the
//! strategy as a sandboxed WebAssembly component.
//!
//! Modules, one per part of the design:
//! - [`runtime`]: wasmtime engine, guest loading and caching, sandbox limits;
//! - [`storage`]: durable keyspaces and snapshots (RocksDB, memory);
//! - [`changelog`]: the transactional log the store is rebuilt from;
//! - [`checkpoint`]: the atomically written checkpoint file;
//! - [`task`]: the exactly-once commit protocol and start-up recovery, the
//!   output, and the tasks of a Kafka input's partitions;
//! - [`crash`]: named crash points for crash tests;
//! - [`file`]: the file layer for the host's own files, with the power-loss
//!   simulation; [`fault`]: injected I/O errors; [`mutants`]: test-only bugs;
//! - [`conformance`]: the suite that crashes a guest everywhere and checks it;
//! - [`bench`]: `txstore bench`, guests against plain RocksDB;
//! - [`config`] and [`cli`]: the TOML configuration and the command line.

pub mod bench;
pub mod changelog;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod crash;
pub mod fault;
pub mod file;
pub mod mutants;
pub mod runtime;
pub mod storage;
pub mod task;
