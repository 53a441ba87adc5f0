//! What every Rust strategy needs besides its own algorithm: the bindings
//! of `wit/store.wit` (0.2.0), packed keys, pages and batches, the four
//! write calls as one, tagged values, the recovery verdict, offset records,
//! cursors and the ordered merge.

pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "store",
        pub_export_macro: true,
        export_macro_name: "export_store",
        default_bindings_module: "txstore_guest_kit::bindings",
    });
}

pub use bindings::export_store;
pub use bindings::exports::txstore::store::state_store::{Guest, Isolation, Recovery, RecoveryAction};
pub use bindings::txstore::store::storage::{self, Cursor, Keyspace, KeyspaceOps, Level, Op};
pub use bindings::txstore::store::types::{Entry, Error, MaybeValues, Packed};

mod packed;
mod read;
mod tagged;
mod writes;

pub use read::{apply_tagged, bounds, check_range, merge, read_range, CursorIter, CURSOR_BATCH};
pub use tagged::{Tagged, ABSENT, PRESENT};
pub use writes::{write_op, Pending, Write, Writes};

/// Reads a big-endian u64 stored under `key`.
pub fn read_u64(ks: &Keyspace, key: &[u8]) -> Result<Option<u64>, Error> {
    match ks.get(key)? {
        None => Ok(None),
        Some(bytes) => match <[u8; 8]>::try_from(bytes.as_slice()) {
            Ok(b) => Ok(Some(u64::from_be_bytes(b))),
            Err(_) => Err(Error::Corrupt(format!(
                "value under {:?} has {} bytes, expected 8",
                String::from_utf8_lossy(key),
                bytes.len()
            ))),
        },
    }
}

/// The put of a big-endian u64, as a batch operation.
pub fn put_u64(key: &[u8], value: u64) -> Op {
    Op::Put(Entry { key: key.to_vec(), value: value.to_be_bytes().to_vec() })
}

/// Refuses every `init` option but those in `known`.
pub fn check_options(guest: &str, options: &[(String, String)], known: &[&str]) -> Result<(), Error> {
    for (name, _) in options {
        if !known.contains(&name.as_str()) {
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            return Err(Error::InvalidArgument(format!("{guest}: unknown option `{name}` (known: {known})")));
        }
    }
    Ok(())
}

/// The guest's single store, set by `init`.
pub struct Slot<T>(std::cell::RefCell<Option<T>>);

impl<T> Slot<T> {
    pub const fn new() -> Self {
        Self(std::cell::RefCell::new(None))
    }

    pub fn set(&self, value: T) {
        *self.0.borrow_mut() = Some(value);
    }

    /// Runs `f` on the store, or fails if `init` was not called.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> Result<R, Error>) -> Result<R, Error> {
        match self.0.borrow_mut().as_mut() {
            Some(t) => f(t),
            None => Err(Error::Other("init was not called".into())),
        }
    }

    /// `f` on the store, or `default` before `init`.
    pub fn peek<R>(&self, default: R, f: impl FnOnce(&T) -> R) -> R {
        self.0.borrow().as_ref().map_or(default, f)
    }
}

// A guest is single-threaded; calls never overlap.
unsafe impl<T> Sync for Slot<T> {}

/// What a transactional store's `recover` returns once storage holds its
/// committed state at offset `stored`. `found` is what it did with writes
/// of the open transaction it found in storage (`None`: there were none);
/// with none, `clean` means the host's checkpoint is this very state.
/// A checkpoint ahead of `stored` means a commit the host saw return is
/// missing: corrupt, never papered over by a replay.
pub fn recovered(
    checkpointed: Option<u64>,
    stored: Option<u64>,
    found: Option<RecoveryAction>,
) -> Result<Recovery, Error> {
    if checkpointed > stored {
        return Err(Error::Corrupt(format!(
            "the checkpoint says offset {checkpointed:?} but the store committed only {stored:?}"
        )));
    }
    let action = match found {
        Some(action) => action,
        None if checkpointed == stored => RecoveryAction::Clean,
        None => RecoveryAction::Discarded,
    };
    Ok(Recovery { offset: stored, action })
}

#[cfg(test)]
pub(crate) mod test_util {
    use crate::{Entry, Packed, Write};

    pub fn w(key: &str, value: Option<&str>) -> Write {
        (key.as_bytes().to_vec(), value.map(|v| v.as_bytes().to_vec()))
    }

    pub fn entry(key: &str, value: &str) -> Entry {
        Entry { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec() }
    }

    pub fn packed(strings: &[&str]) -> Packed {
        let mut p = Packed::new();
        for s in strings {
            p.push(s.as_bytes());
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_reports_what_it_found_and_refuses_a_checkpoint_ahead() {
        let r = |c, s, found| recovered(c, s, found).map(|r| (r.offset, r.action));
        use RecoveryAction::*;
        assert_eq!(r(Some(5), Some(5), None).unwrap(), (Some(5), Clean));
        assert_eq!(r(None, None, None).unwrap(), (None, Clean));
        assert_eq!(r(None, Some(5), None).unwrap(), (Some(5), Discarded));
        assert_eq!(r(Some(4), Some(5), None).unwrap(), (Some(5), Discarded));
        assert_eq!(r(Some(5), Some(5), Some(RolledBack)).unwrap(), (Some(5), RolledBack));
        assert_eq!(r(None, Some(5), Some(Discarded)).unwrap(), (Some(5), Discarded));
        assert_eq!(r(Some(5), Some(5), Some(Discarded)).unwrap(), (Some(5), Discarded));
        for (c, s) in [(Some(6), Some(5)), (Some(0), None)] {
            let err = recovered(c, s, Some(RolledBack)).unwrap_err();
            let expected = format!("the checkpoint says offset {c:?} but the store committed only {s:?}");
            assert!(matches!(&err, Error::Corrupt(m) if *m == expected), "{err:?}");
        }
    }
}
