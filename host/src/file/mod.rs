//! The file layer: every file the host writes itself (changelog segments,
//! seals, checkpoint, lock files) and every directory operation on the
//! host's directories (snapshot and migration directories included) goes
//! through here, so that tests can inject I/O errors ([`crate::fault`])
//! and simulate a machine crash ([`power`]). RocksDB's files are RocksDB's
//! own and do not.
//!
//! Each call does what `std::fs` does and names the path in its error. In
//! a power simulation the layer also tells the journal what became durable:
//! a file's content at its fsync, a directory's entries at the directory's
//! fsync.

pub mod power;

use crate::fault::{self, Class, Fault};
use anyhow::Context as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub use power::attach;

/// An error that names what failed and where, keeping the OS error kind.
fn named(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// A host file open for writing.
#[derive(Debug)]
pub struct File {
    f: std::fs::File,
    path: PathBuf,
}

impl File {
    /// Creates `path`, or truncates it if it exists.
    pub fn create(path: &Path) -> io::Result<File> {
        let existed = path.exists();
        let f = std::fs::File::create(path).map_err(|e| named(e, "cannot create", path))?;
        power::on_create(path, existed);
        Ok(File {
            f,
            path: path.to_path_buf(),
        })
    }

    /// Opens `path` for appending, creating it if missing.
    pub fn append(path: &Path) -> io::Result<File> {
        let existed = path.exists();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| named(e, "cannot open", path))?;
        power::on_create(path, existed);
        Ok(File {
            f,
            path: path.to_path_buf(),
        })
    }

    /// Opens an existing file for writing in place (truncation).
    pub fn open_write(path: &Path) -> io::Result<File> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| named(e, "cannot open", path))?;
        Ok(File {
            f,
            path: path.to_path_buf(),
        })
    }

    /// The file's length now (page cache included).
    pub fn len(&self) -> io::Result<u64> {
        Ok(self
            .f
            .metadata()
            .map_err(|e| named(e, "cannot stat", &self.path))?
            .len())
    }

    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.f
            .set_len(len)
            .map_err(|e| named(e, "cannot truncate", &self.path))
    }

    /// fdatasync: the content is durable when this returns Ok.
    pub fn sync_data(&self) -> io::Result<()> {
        self.sync(false)
    }

    /// fsync: content and metadata.
    pub fn sync_all(&self) -> io::Result<()> {
        self.sync(true)
    }

    fn sync(&self, all: bool) -> io::Result<()> {
        if let Some(f) = fault::hit(Class::Fsync) {
            // The kernel may drop the dirty pages after a failed fsync.
            power::on_failed_sync(&self.path);
            return Err(f.io_error(&format!("fsync of {}", self.path.display())));
        }
        let r = if all {
            self.f.sync_all()
        } else {
            self.f.sync_data()
        };
        r.map_err(|e| named(e, "fsync of", &self.path))?;
        power::on_sync(&self.path);
        Ok(())
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match fault::hit(Class::Write) {
            Some(Fault::Short) => {
                // Part of the buffer reaches the file, then the device fails.
                let n = buf.len() / 2;
                self.f.write_all(&buf[..n])?;
                Err(Fault::Short.io_error(&format!("write of {}", self.path.display())))
            }
            Some(f) => Err(f.io_error(&format!("write of {}", self.path.display()))),
            None => self
                .f
                .write(buf)
                .map_err(|e| named(e, "write of", &self.path)),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.f.flush()
    }
}

/// Renames `from` to `to` (durable only after [`sync_dir`] of the parent).
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(f) = fault::hit(Class::Rename) {
        return Err(f.io_error(&format!("rename of {} to {}", from.display(), to.display())));
    }
    std::fs::rename(from, to).map_err(|e| named(e, "cannot rename", from))?;
    power::on_rename(from, to);
    Ok(())
}

/// Removes a file (durable only after [`sync_dir`] of the parent).
pub fn remove_file(path: &Path) -> io::Result<()> {
    std::fs::remove_file(path)?;
    power::on_remove(path);
    Ok(())
}

/// Removes a directory and everything in it (durable only after
/// [`sync_dir`] of the parent).
pub fn remove_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::remove_dir_all(dir).map_err(|e| named(e, "cannot remove", dir))?;
    power::on_remove_dir(dir);
    Ok(())
}

/// fsyncs a directory: its entries (creates, renames, removes) are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    if let Some(f) = fault::hit(Class::Fsync) {
        return Err(f.io_error(&format!("fsync of directory {}", dir.display())));
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| named(e, "fsync of directory", dir))?;
    power::on_sync_dir(dir);
    Ok(())
}

/// Creates `dir` and its missing parents, and makes each creation durable
/// (fsync of the parent of every directory it created): a directory whose
/// entry is lost in a power cut takes everything in it along.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.exists() {
        missing.push(d.to_path_buf());
        match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => d = p,
            _ => break,
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| named(e, "cannot create directory", dir))?;
    for created in missing.iter().rev() {
        power::on_create_dir(created);
    }
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir(parent)?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically and durably: a temporary file,
/// fsync, rename over `path`, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    rename(&tmp, path)?;
    if crate::mutants::active("checkpoint-no-dirsync") && path.ends_with("checkpoint") {
        return Ok(());
    }
    sync_dir(dir)
}

/// Takes the exclusive lock of `dir` (a `LOCK` file), so that no second
/// process (any backend, any config sharing the directory) writes there.
pub fn lock_dir(dir: &Path, what: &str) -> anyhow::Result<std::fs::File> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(crate::cause::marked(
            crate::cause::Kind::InUse,
            format!(
                "{what} {} is in use by another txstore process (it holds {}); stop it first",
                dir.display(),
                path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}
