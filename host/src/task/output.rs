//! Output to a file (`task.output = { kind = "file", path = ... }`), with
//! the same exactly-once contract as an output topic read `read_committed`:
//! a reader that reads only the first N bytes of the file, N being the
//! number in `<path>.committed` (0 when it is missing or empty, as a power
//! cut may leave it: it is replaced without an fsync, since it may lag),
//! never sees a line of an uncommitted transaction, and sees each
//! committed one once.
//!
//! Lines are `key<TAB>value` for a put and `key` alone for a delete (the
//! `kv` input format). Before each changelog commit the new lines are
//! fsynced and `(input position, output length)` is appended to
//! `<path>.index` and fsynced; after the commit `<path>.committed` is
//! replaced with the new length. At open, the changelog's committed input
//! position finds its length in the index, and the file is cut there: what
//! a crash left after it belonged to a transaction that never committed
//! (its input is processed again), and the index keeps only that entry.

use crate::changelog::Record;
use crate::file::{self, File};
use anyhow::{bail, Context, Result};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub struct FileOutput {
    path: PathBuf,
    out: BufWriter<File>,
    index: File,
    /// Bytes in the file, committed or not.
    len: u64,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

impl FileOutput {
    /// Opens the output for a task whose changelog committed input
    /// position is `position`, cutting what no commit covers.
    pub fn open(path: &Path, position: u64) -> Result<Self> {
        let index_path = with_suffix(path, ".index");
        let entries = match std::fs::read_to_string(&index_path) {
            Ok(text) => parse_index(&text)
                .with_context(|| format!("output index {} is damaged", index_path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", index_path.display()))
            }
        };
        let committed = match entries.iter().rev().find(|(p, _)| *p == position) {
            Some(&(_, len)) => len,
            None if position == 0 => 0,
            None => bail!(
                "output {}: its index has no entry for the committed input position {position}: the output belongs \
                 to another store or run (move it aside to start a new one)",
                path.display()
            ),
        };
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let file = File::append(path)?;
        file::sync_dir(dir)?; // a created file's name is durable
        let on_disk = file.len()?;
        if on_disk < committed {
            bail!(
                "output {} has {on_disk} bytes but {committed} were committed: it was truncated or replaced",
                path.display()
            );
        }
        if on_disk > committed {
            tracing::warn!(
                "output {}: cut {} bytes no commit covers (a crash before their transaction committed)",
                path.display(),
                on_disk - committed
            );
            file.set_len(committed)?;
            file.sync_all()?;
        }
        // The index keeps only the entry in force; rewritten atomically.
        file::write_atomic(&index_path, format!("{position} {committed}\n").as_bytes())?;
        let index = File::append(&index_path)?;
        let mut output = FileOutput {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 16, file),
            index,
            len: committed,
        };
        output.published()?;
        Ok(output)
    }

    /// Adds the lines of `records` to the open transaction.
    pub fn emit(&mut self, records: &[Record]) -> Result<()> {
        for r in records {
            let (key, value) = match r {
                Record::Put(k, v) => (k, Some(v)),
                Record::Delete(k) => (k, None),
            };
            self.out.write_all(key)?;
            if let Some(v) = value {
                self.out.write_all(b"\t")?;
                self.out.write_all(v)?;
            }
            self.out.write_all(b"\n")?;
            self.len += (key.len() + value.map_or(0, |v| 1 + v.len()) + 1) as u64;
        }
        Ok(())
    }

    /// Makes the open transaction's lines durable and records the length
    /// the commit at input position `position` will publish: called
    /// before the changelog commit.
    pub fn prepare(&mut self, position: u64) -> Result<()> {
        let what = || format!("cannot write output {}", self.path.display());
        self.out.flush().with_context(what)?;
        self.out.get_ref().sync_data().with_context(what)?;
        writeln!(self.index, "{position} {}", self.len).with_context(what)?;
        self.index.sync_data().with_context(what)?;
        Ok(())
    }

    /// The commit is durable: readers may now read up to here.
    pub fn published(&mut self) -> Result<()> {
        // Durable or not, it only ever lags: open rebuilds it.
        let committed = with_suffix(&self.path, ".committed");
        let tmp = with_suffix(&self.path, ".committed.tmp");
        std::fs::write(&tmp, format!("{}\n", self.len))
            .and_then(|()| std::fs::rename(&tmp, &committed))
            .with_context(|| format!("cannot write {}", committed.display()))
    }
}

fn parse_index(text: &str) -> Result<Vec<(u64, u64)>> {
    // A last line without its newline was torn by a crash before its
    // commit: it never counted.
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .map(|l| {
            let (p, n) = l.split_once(' ').context("a line without two numbers")?;
            Ok((p.parse()?, n.parse()?))
        })
        .collect()
}
