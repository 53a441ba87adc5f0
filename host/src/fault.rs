//! Injected I/O errors: the N-th call of one kind fails, as a failing disk
//! would make it fail. Selected with `--io-error SPEC` or
//! `TXSTORE_IO_ERROR=SPEC`, where SPEC is `KIND:N` (N counts from 1 over the
//! whole process) and KIND one of [`KINDS`]:
//! - `fsync`: an fsync/fdatasync of a host file (changelog, seal,
//!   checkpoint, directory) returns EIO;
//! - `write-enospc` / `write-short`: a write of a host file returns ENOSPC,
//!   or writes only part of its buffer and then fails;
//! - `rename`: a rename of a host file fails (EIO);
//! - `storage-sync`: a storage sync (or the sync of a synced write batch)
//!   fails after the writes reached the memtable;
//! - `storage-write`: a storage write call fails before it applies;
//! - `storage-read`: a storage read (`get`, `get-many`, a cursor's `next`)
//!   returns EIO, as a failed disk read or a checksum mismatch would. It
//!   changes nothing durable, so unlike a failed sync it does not poison
//!   the storage: the guest must pass the error on, never return what it
//!   read so far as if it were all.
//! - `changelog-drop`: each read of a Kafka changelog replay loses every
//!   message from its N-th on, as a broker or client that drops batches
//!   would (the replay must prove itself incomplete and stop);
//! - `changelog-hole`: each read loses the ten messages at offsets N to
//!   N+9 and gets the rest, as after a segment deleted in the middle.
//!
//! The rule the host keeps (PostgreSQL's "fsyncgate", 2018): after a failed
//! fsync the kernel may have dropped the dirty pages and will report
//! success next time, so nothing that depended on that fsync is trusted.
//! The layer that saw the error refuses every later call, the process
//! stops with one error line, and the next start recovers. In a power
//! simulation ([`crate::file`]) a failed fsync also drops the file's
//! unsynced pages, as the kernel may.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Environment variable that selects an injected error.
pub const ENV: &str = "TXSTORE_IO_ERROR";

/// The kinds of call counted, in report order.
pub const KINDS: &[&str] = &[
    "fsync",
    "write-enospc",
    "write-short",
    "rename",
    "storage-sync",
    "storage-write",
    "storage-read",
    "changelog-drop",
    "changelog-hole",
];

/// What is counted: one counter per class of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Fsync,
    Write,
    Rename,
    StorageSync,
    StorageWrite,
    StorageRead,
    ChangelogRead,
}

const CLASSES: [Class; 7] = [
    Class::Fsync,
    Class::Write,
    Class::Rename,
    Class::StorageSync,
    Class::StorageWrite,
    Class::StorageRead,
    Class::ChangelogRead,
];

impl Class {
    fn index(self) -> usize {
        CLASSES.iter().position(|c| *c == self).unwrap()
    }

    pub fn name(self) -> &'static str {
        match self {
            Class::Fsync => "fsync",
            Class::Write => "write",
            Class::Rename => "rename",
            Class::StorageSync => "storage-sync",
            Class::StorageWrite => "storage-write",
            Class::StorageRead => "storage-read",
            Class::ChangelogRead => "changelog-read",
        }
    }
}

/// The error an injected call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// EIO.
    Eio,
    /// ENOSPC.
    NoSpace,
    /// Part of the buffer is written, then EIO.
    Short,
    /// The message is lost on its way (a read only), and every later one.
    Drop,
    /// The messages at offsets N to N+9 are lost (a read only).
    Hole,
}

impl Fault {
    /// The `std::io::Error` a real call would have returned.
    pub fn io_error(self, what: &str) -> std::io::Error {
        let (code, why) = match self {
            Fault::Eio | Fault::Short => (5, "input/output error"),
            Fault::NoSpace => (28, "no space left on device"),
            Fault::Drop | Fault::Hole => (5, "message dropped"),
        };
        std::io::Error::new(
            std::io::Error::from_raw_os_error(code).kind(),
            format!("{what}: {why} (os error {code}, injected by {ENV})"),
        )
    }
}

/// An armed injection: the `nth` call of `class` fails with `fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injection {
    pub class: Class,
    pub fault: Fault,
    pub nth: u64,
}

impl std::str::FromStr for Injection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "I/O error `{s}`: expected KIND:N with KIND one of {} and N a count from 1",
                KINDS.join(", ")
            )
        };
        let (kind, n) = s.split_once(':').ok_or_else(bad)?;
        let nth = n.parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(bad)?;
        let (class, fault) = match kind {
            "fsync" => (Class::Fsync, Fault::Eio),
            "write-enospc" => (Class::Write, Fault::NoSpace),
            "write-short" => (Class::Write, Fault::Short),
            "rename" => (Class::Rename, Fault::Eio),
            "storage-sync" => (Class::StorageSync, Fault::Eio),
            "storage-write" => (Class::StorageWrite, Fault::NoSpace),
            "storage-read" => (Class::StorageRead, Fault::Eio),
            "changelog-drop" => (Class::ChangelogRead, Fault::Drop),
            "changelog-hole" => (Class::ChangelogRead, Fault::Hole),
            _ => return Err(bad()),
        };
        Ok(Injection { class, fault, nth })
    }
}

impl std::fmt::Display for Injection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match (self.class, self.fault) {
            (Class::Write, Fault::NoSpace) => "write-enospc",
            (Class::Write, _) => "write-short",
            (Class::ChangelogRead, Fault::Hole) => "changelog-hole",
            (Class::ChangelogRead, _) => "changelog-drop",
            (c, _) => c.name(),
        };
        write!(f, "{kind}:{}", self.nth)
    }
}

static ARMED: OnceLock<Option<Injection>> = OnceLock::new();
static COUNTS: [AtomicU64; CLASSES.len()] = [const { AtomicU64::new(0) }; CLASSES.len()];

/// Arms `injection` for this process (first call wins). `None` reads the
/// environment variable.
pub fn arm(injection: Option<Injection>) -> Result<(), String> {
    let injection = match injection {
        Some(i) => Some(i),
        None => match std::env::var(ENV) {
            Ok(s) if !s.is_empty() => Some(s.parse()?),
            _ => None,
        },
    };
    let _ = ARMED.set(injection);
    Ok(())
}

/// Counts one call of `class`; returns the fault to inject if this call
/// is the armed one.
pub fn hit(class: Class) -> Option<Fault> {
    let n = COUNTS[class.index()].fetch_add(1, Ordering::Relaxed) + 1;
    match ARMED.get().and_then(Option::as_ref) {
        Some(i) if i.class == class && i.nth == n => {
            eprintln!("txstore: injecting {i} ({})", class.name());
            Some(i.fault)
        }
        _ => None,
    }
}

/// The fault and N of an injection armed for `class`, for a caller that
/// counts its own calls (a changelog read counts per read, not per process).
pub fn armed(class: Class) -> Option<(Fault, u64)> {
    ARMED
        .get()
        .and_then(Option::as_ref)
        .filter(|i| i.class == class)
        .map(|i| (i.fault, i.nth))
}

/// Calls counted so far, per class, in `CLASSES` order.
pub fn counts() -> Vec<(&'static str, u64)> {
    CLASSES
        .iter()
        .map(|c| (c.name(), COUNTS[c.index()].load(Ordering::Relaxed)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for s in KINDS {
            let spec = format!("{s}:3");
            assert_eq!(spec.parse::<Injection>().unwrap().to_string(), spec);
        }
        for bad in ["fsync", "fsync:0", "fsync:x", "nothing:1"] {
            assert!(bad.parse::<Injection>().is_err(), "{bad} accepted");
        }
    }
}
