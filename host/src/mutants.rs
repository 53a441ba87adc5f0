//! Host mutants: deliberate durability bugs that prove the power-loss
//! simulation bites (a crash suite is only as good as the bugs it
//! catches). Compiled in only with the test-only cargo feature `mutants`
//! and then enabled one at a time by `TXSTORE_MUTANT=NAME`:
//! - `changelog-no-sync`: the changelog commit skips its fdatasync;
//! - `checkpoint-no-dirsync`: the checkpoint is renamed into place without
//!   the directory fsync;
//! - `truncate-no-sync`: the torn-tail truncation at open skips its fsync.
//!
//! Without the feature [`active`] is `false` and compiles away.

/// Every mutant there is.
#[cfg(feature = "mutants")]
const NAMES: &[&str] = &[
    "changelog-no-sync",
    "checkpoint-no-dirsync",
    "truncate-no-sync",
];

/// Whether mutant `name` is on in this process.
#[cfg(feature = "mutants")]
pub fn active(name: &str) -> bool {
    assert!(NAMES.contains(&name), "unknown mutant {name}");
    std::env::var("TXSTORE_MUTANT").is_ok_and(|m| m == name)
}

/// Whether mutant `name` is on in this process (never: built without `mutants`).
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub fn active(_name: &str) -> bool {
    false
}
