//! What the integration tests and benches reach besides the API (feature
//! `testing`, on for `cargo test` and `cargo bench` only): not API, and
//! free to change. Everything else they use is the documented API.

pub use crate::bench::key;
pub use crate::config::{BackendKind, ProcessorSpec};
pub use crate::runtime::{GuestSource, StoreInstance};
pub use crate::storage::{Backend, MemoryBackend, RocksBackend};
pub use crate::task::serve::{is_served, socket_name};
pub use crate::tsv::unescape;
use std::path::Path;

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}
