//! Integration tests of the txstore host: one test binary (one link of
//! RocksDB and wasmtime), modules by subject.

mod broker;
mod cli;
mod common;
mod compact;
mod conformance;
mod failures;
mod kafka;
mod kill_loop;
mod kv;
mod live;
mod metrics;
mod migrate;
mod output;
mod pipeline;
mod polyglot;
mod power;
mod processors;
mod protocol;
mod restore;
mod sandbox;
mod standby;
mod strategies;
