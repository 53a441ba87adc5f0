//! The RocksDB options every database and column family is opened with,
//! and where RocksDB's own log messages go.

use super::Result;
use rocksdb::{BlockBasedOptions, Cache, InfoLogger, LogLevel, Options, WriteOptions};
use std::sync::OnceLock;

/// One block cache for every database of the process, so memory stays
/// bounded however many stores a process opens (as Kafka Streams'
/// bounded-memory config does).
const BLOCK_CACHE_BYTES: usize = 256 << 20;
/// Bloom filter bits per key: about 1% false positives, so a read of an
/// absent key (roll-back's prior values, point reads) skips the files.
const BLOOM_BITS_PER_KEY: f64 = 10.0;

fn block_cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Cache::new_lru_cache(BLOCK_CACHE_BYTES))
}

/// The options of every column family (keyspace).
pub(super) fn cf_options() -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(block_cache());
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
    let mut opts = Options::default();
    opts.set_block_based_table_factory(&table);
    opts
}

fn db_options() -> Options {
    let mut opts = cf_options();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_atomic_flush(true);
    // A process opens a database per store, hundreds at a start. What an
    // open costs beyond reading the MANIFEST, each measured at 1,000 stores
    // (docs/bench/stores.md):
    // - 16 threads started per open to load table files (RocksDB's
    //   default): a state store's few files load as fast in the caller;
    opts.set_max_file_opening_threads(1);
    // - a `LOG` file per database with every option dumped at each open
    //   (see `open_options`);
    // - reading every table file's properties to refresh statistics that
    //   only steer compaction.
    opts.set_skip_stats_update_on_db_open(true);
    opts
}

/// `db_options` as the database is opened with.
pub(super) fn open_options() -> Result<Options> {
    // See `DbHandle::drop`, which flushes at close instead.
    let mut opts = db_options().get_options_from_string("avoid_flush_during_shutdown=true")?;
    // Set here, not in `db_options`: options parsed from a string do not
    // keep the callback alive. Warnings and errors go to the process's log
    // rather than a `LOG` file per database; the options dump (header
    // level) and information messages are dropped, and so are the
    // warnings RocksDB gives for what the store does on purpose (BENIGN).
    opts.set_info_logger(InfoLogger::new_callback_logger(
        LogLevel::Warn,
        |level, msg| match level {
            LogLevel::Warn if BENIGN.iter().any(|b| msg.contains(b)) => {
                tracing::debug!(target: "txstore::rocksdb", "{}", msg.trim_end())
            }
            LogLevel::Warn => tracing::warn!(target: "txstore::rocksdb", "{}", msg.trim_end()),
            LogLevel::Error | LogLevel::Fatal => {
                tracing::error!(target: "txstore::rocksdb", "{}", msg.trim_end())
            }
            LogLevel::Debug | LogLevel::Info | LogLevel::Header => {}
        },
    ));
    Ok(opts)
}

/// RocksDB warnings about what a snapshot store does by design: opening
/// table files it exported and ingested back (no unique ID recorded, a
/// read-ahead guessed for a file never read before). An operator cannot
/// act on them; they stay at debug level (`TXSTORE_LOG=debug`).
const BENIGN: &[&str] = &[
    "is calculated based on heuristics",
    "is calculated based on TailPrefetchStats",
    "opened without unique ID to verify",
];

pub(super) fn no_wal() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.disable_wal(true);
    w
}
