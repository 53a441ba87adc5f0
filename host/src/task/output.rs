//! Output to a file (`task.output = { kind = "file", path = ... }`), with
//! the same exactly-once contract as an output topic read `read_committed`:
//! a reader that reads only the first N bytes of the file, N being the
//! number in `<path>.committed` (0 when it is missing or empty, as a power
//! cut may leave it: it is replaced without an fsync, since it may lag),
//! never sees a line of an uncommitted transaction, and sees each
//! committed one once.
//!
//! Lines are `key<TAB>value` for a put and `key` alone for a delete (the
//! `kv` input format), each field escaped as `get` / `scan` TSV escapes it
//! ([`crate::tsv`]): valid UTF-8 as is, `\\`, `\t`, `\n`, `\r`, and `\xNN`
//! for each byte that is not valid UTF-8, so a key or value holding a tab
//! or a newline cannot forge lines, and `tsv::unescape` gives back the
//! exact bytes.
//!
//! Before each changelog commit the new lines are fsynced and
//! `position length crc` (the input position, the output length, and
//! the CRC32C of `position length` in hex) is appended to `<path>.index`
//! and fsynced; after the commit `<path>.committed` is replaced with the
//! new length. At open, the changelog's committed input position finds
//! its length in the index, and the file is cut there: what a crash left
//! after it belonged to a transaction that never committed (its input is
//! processed again), and the index keeps only that entry. A last index
//! line that does not check (a power cut inside its append, which may
//! leave it partial, zeroed or garbage) never counted and is dropped; a
//! damaged line before a good one was fsynced, and is refused. The index
//! is rewritten to its last entry every [`INDEX_MAX_LINES`] commits too.
//! A non-empty file without an index is not this store's output: it is
//! refused, never cut.

use crate::changelog::Record;
use crate::file::{self, File};
use crate::tsv;
use anyhow::{bail, Context, Result};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Index lines after which a run rewrites the index to its last entry,
/// so that it stays small however long the run (open reads it all).
pub const INDEX_MAX_LINES: u64 = 1024;

pub struct FileOutput {
    path: PathBuf,
    out: BufWriter<File>,
    index: File,
    /// Lines in the index.
    index_lines: u64,
    /// The entry the last `prepare` appended: the one in force once its
    /// commit is published.
    last_entry: (u64, u64),
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
        let index = match std::fs::read(&index_path) {
            Ok(bytes) => Some(
                parse_index(&bytes)
                    .with_context(|| format!("output index {} is damaged", index_path.display()))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", index_path.display()))
            }
        };
        if let Some(Index { torn, .. }) = index.as_ref().filter(|i| i.torn > 0) {
            tracing::warn!(
                "output index {}: dropped a last line of {torn} bytes torn by a crash before its commit",
                index_path.display()
            );
        }
        let entries = index.as_ref().map_or(&[][..], |i| &i.entries[..]);
        let committed = match entries.iter().rev().find(|(p, _)| *p == position) {
            Some(&(_, len)) => len,
            None if position == 0 => 0,
            None => bail!(
                "output {}: its index has no entry for the committed input position {position}: the output belongs \
                 to another store or run (move it aside to start a new one)",
                path.display()
            ),
        };
        // Without an index nothing in the file is ours: an unrelated file
        // at the path is refused, never cut.
        if index.is_none() && std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            bail!(
                "output {} exists and is not this store's output (no {}): move it aside",
                path.display(),
                index_path.display()
            );
        }
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
        file::write_atomic(&index_path, index_line(position, committed).as_bytes())?;
        let index = File::append(&index_path)?;
        let mut output = FileOutput {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 16, file),
            index,
            index_lines: 1,
            last_entry: (position, committed),
            len: committed,
        };
        output.published()?;
        Ok(output)
    }

    /// Adds the lines of `records` to the open transaction.
    pub fn emit(&mut self, records: &[Record]) -> Result<()> {
        for r in records {
            let mut line = tsv::escape(r.key());
            if let Record::Put(_, v) = r {
                line.push('\t');
                line.push_str(&tsv::escape(v));
            }
            line.push('\n');
            self.out.write_all(line.as_bytes())?;
            self.len += line.len() as u64;
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
        self.index
            .write_all(index_line(position, self.len).as_bytes())
            .with_context(what)?;
        crate::crash::step("before-output-index-sync");
        self.index.sync_data().with_context(what)?;
        self.index_lines += 1;
        self.last_entry = (position, self.len);
        Ok(())
    }

    /// The commit is durable: readers may now read up to here.
    pub fn published(&mut self) -> Result<()> {
        if self.index_lines >= INDEX_MAX_LINES {
            // Only the entry just committed is ever looked up again. A
            // crash before the rename keeps the old index, which holds it
            // too (fsynced by `prepare`).
            let index_path = with_suffix(&self.path, ".index");
            let (position, len) = self.last_entry;
            file::write_atomic(&index_path, index_line(position, len).as_bytes())?;
            // The old handle appends to the replaced file.
            self.index = File::append(&index_path)?;
            self.index_lines = 1;
        }
        // Durable or not, it only ever lags: open rebuilds it.
        let committed = with_suffix(&self.path, ".committed");
        let tmp = with_suffix(&self.path, ".committed.tmp");
        std::fs::write(&tmp, format!("{}\n", self.len))
            .and_then(|()| std::fs::rename(&tmp, &committed))
            .with_context(|| format!("cannot write {}", committed.display()))
    }
}

/// One index entry: `position length crc`, the CRC32C of `position length`.
fn index_line(position: u64, len: u64) -> String {
    let entry = format!("{position} {len}");
    format!("{entry} {:08x}\n", crc32c::crc32c(entry.as_bytes()))
}

/// An index entry, if `line` (with its newline) is a whole, intact one.
fn parse_line(line: &[u8]) -> Option<(u64, u64)> {
    let line = std::str::from_utf8(line.strip_suffix(b"\n")?).ok()?;
    let (entry, crc) = line.rsplit_once(' ')?;
    if crc.len() != 8 || u32::from_str_radix(crc, 16).ok()? != crc32c::crc32c(entry.as_bytes()) {
        return None;
    }
    let (p, n) = entry.split_once(' ')?;
    Some((p.parse().ok()?, n.parse().ok()?))
}

#[derive(Debug)]
struct Index {
    entries: Vec<(u64, u64)>,
    /// Bytes after the last intact line (a torn append), dropped.
    torn: usize,
}

fn parse_index(bytes: &[u8]) -> Result<Index> {
    let mut entries = Vec::new();
    let (mut good_end, mut bad_line) = (0, None);
    let mut at = 0;
    for (i, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        at += line.len();
        match (parse_line(line), bad_line) {
            // An intact line after a damaged one: the damaged one was
            // fsynced before it, so this is damage, not a torn append.
            (Some(_), Some(bad)) => bail!(
                "line {} does not check, but later lines do (damage, not a crash): move the output and its index \
                 aside to start a new one",
                bad + 1
            ),
            (Some(entry), None) => {
                entries.push(entry);
                good_end = at;
            }
            // Only the last append can be unsynced: whatever follows the
            // last intact line (garbage may hold newlines) is its tear.
            (None, _) => {
                bad_line.get_or_insert(i);
            }
        }
    }
    Ok(Index {
        entries,
        torn: bytes.len() - good_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(lines: &[(u64, u64)]) -> Vec<u8> {
        lines
            .iter()
            .flat_map(|&(p, n)| index_line(p, n).into_bytes())
            .collect()
    }

    #[test]
    fn a_torn_last_index_line_is_dropped_and_earlier_damage_refused() {
        let good = index_of(&[(10, 100), (20, 250)]);
        let mut line = index_line(30, 400).into_bytes();
        for tear in [
            // No newline, zeros, garbage with a newline, a flipped digit.
            line[..7].to_vec(),
            vec![0; line.len()],
            [&[0u8; 5][..], &line[5..]].concat(),
            b"\xff\x00garbage\nmore\x00".to_vec(),
            {
                line[0] ^= 1;
                line.clone()
            },
        ] {
            let index = parse_index(&[&good[..], &tear[..]].concat()).unwrap();
            assert_eq!(index.entries, [(10, 100), (20, 250)], "{tear:?}");
            assert_eq!(index.torn, tear.len());
        }
        let mut damaged = index_of(&[(10, 100), (20, 250), (30, 400)]);
        damaged[2] = b'7';
        let e = parse_index(&damaged).unwrap_err().to_string();
        assert!(e.contains("line 1 does not check"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }

    #[test]
    fn fields_are_escaped_and_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        let mut out = FileOutput::open(&path, 0).unwrap();
        let (key, value) = (b"evil\nkey".to_vec(), b"v1\nforged\t999\\\xff".to_vec());
        out.emit(&[
            Record::Put(key.clone(), value.clone()),
            Record::Delete(b"a\tb".to_vec()),
        ])
        .unwrap();
        out.prepare(5).unwrap();
        out.published().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text:?}");
        let (k, v) = lines[0].split_once('\t').unwrap();
        assert_eq!(tsv::unescape(k), Some(key));
        assert_eq!(tsv::unescape(v), Some(value));
        assert_eq!(tsv::unescape(lines[1]), Some(b"a\tb".to_vec()));
        let committed = std::fs::read_to_string(with_suffix(&path, ".committed")).unwrap();
        assert_eq!(committed.trim(), text.len().to_string());
    }

    #[test]
    fn a_file_without_an_index_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        std::fs::write(&path, "someone's data\n").unwrap();
        let e = format!("{:#}", FileOutput::open(&path, 0).err().unwrap());
        assert!(
            e.contains("exists and is not this store's output (no "),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"someone's data\n");
        // Empty, it is taken (a crash before the index was written).
        std::fs::write(&path, "").unwrap();
        FileOutput::open(&path, 0).unwrap();
    }

    /// The index is rewritten to one line at the bound; reopening at the
    /// last commit works whether a crash kept the old index (with a
    /// stray temporary file) or the new one, and appends go to the new.
    #[test]
    fn the_index_is_compacted_and_every_crash_state_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        let index_path = with_suffix(&path, ".index");
        let mut out = FileOutput::open(&path, 0).unwrap();
        let mut before = Vec::new();
        for p in 1..=INDEX_MAX_LINES + 5 {
            out.emit(&[Record::Put(p.to_string().into_bytes(), b"v".to_vec())])
                .unwrap();
            out.prepare(p).unwrap();
            if p == INDEX_MAX_LINES - 1 {
                // What a crash inside the rewrite keeps: the old index.
                before = std::fs::read(&index_path).unwrap();
            }
            out.published().unwrap();
            let lines = parse_index(&std::fs::read(&index_path).unwrap())
                .unwrap()
                .entries
                .len() as u64;
            assert!(lines <= INDEX_MAX_LINES, "{lines} lines after commit {p}");
            if p == INDEX_MAX_LINES - 1 {
                assert_eq!(lines, 1, "compacted at the bound");
            }
        }
        let len = std::fs::metadata(&path).unwrap().len();
        drop(out);
        FileOutput::open(&path, INDEX_MAX_LINES + 5).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);

        // The old index and a stray temporary file, at the commit that
        // compacted: the entry is there.
        let mut tmp = index_path.clone().into_os_string();
        tmp.push(".tmp");
        std::fs::write(&tmp, b"half").unwrap();
        std::fs::write(&index_path, &before).unwrap();
        let mut out = FileOutput::open(&path, INDEX_MAX_LINES - 1).unwrap();
        out.emit(&[Record::Delete(b"k".to_vec())]).unwrap();
        out.prepare(INDEX_MAX_LINES).unwrap();
        drop(out);
        FileOutput::open(&path, INDEX_MAX_LINES).unwrap();
    }
}
