//! The on-disk cache of compiled components: each entry checked by its
//! CRC32C before it is mapped as code, and the least recently used
//! dropped past a size bound.

use anyhow::Result;
use std::path::{Path, PathBuf};

/// A cached compilation ends in its CRC32C and this tag, so a truncated or
/// damaged file is recompiled instead of being mapped as code.
const CACHE_TAG: &[u8; 4] = b"TXCC";

/// The most compiled code the cache keeps. Guests that embed a language
/// runtime compile to tens of MB, and their builds are often not
/// reproducible (each rebuild is a new hash), so the cache must forget.
pub const CACHE_MAX_BYTES: u64 = 1 << 30;

/// Removes the least recently used cache entries until the `.cwasm` files
/// in `dir` fit in `max` bytes; `keep` (just written) is never removed.
/// Best effort: a failure only leaves the cache larger.
pub fn prune_cache(dir: &Path, max: u64, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= max {
            break;
        }
        if path != keep && std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "compiled-guest cache over {max} bytes: removed {}",
                path.display()
            );
            total -= len;
        }
    }
}

pub(super) fn write_cache(path: &Path, code: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir)?;
    // Write aside and rename, so a reader never sees half a file.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, code)?;
    std::io::Write::write_all(&mut tmp, &crc32c::crc32c(code).to_le_bytes())?;
    std::io::Write::write_all(&mut tmp, CACHE_TAG)?;
    tmp.persist(path)?;
    Ok(())
}

/// Checks a cached compilation's trailer: its CRC32C over the code.
pub(super) fn check_cache(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let n = file.metadata()?.len();
    if n < 8 {
        anyhow::bail!("no trailer: truncated or not written by txstore");
    }
    let mut code = (&mut file).take(n - 8);
    let mut crc = 0u32;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let got = code.read(&mut buf)?;
        if got == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..got]);
    }
    let mut trailer = [0u8; 8];
    file.read_exact(&mut trailer)?;
    if &trailer[4..] != CACHE_TAG {
        anyhow::bail!("no trailer: truncated or not written by txstore");
    }
    if crc != u32::from_le_bytes(trailer[..4].try_into().unwrap()) {
        anyhow::bail!("checksum mismatch");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::prune_cache;
    use std::time::{Duration, SystemTime};

    /// Oldest first, until the rest fits; the entry just written stays even
    /// when it alone is over the limit; other files are not touched.
    #[test]
    fn prune_removes_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = SystemTime::now() - Duration::from_secs(1000);
        let mut paths = Vec::new();
        for (i, name) in ["old.cwasm", "mid.cwasm", "new.cwasm", "notes.txt"]
            .iter()
            .enumerate()
        {
            let p = dir.path().join(name);
            std::fs::write(&p, vec![0u8; 100]).unwrap();
            let f = std::fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(t0 + Duration::from_secs(i as u64 * 10))
                .unwrap();
            paths.push(p);
        }
        prune_cache(dir.path(), 250, &paths[2]);
        let left: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(left, [false, true, true, true]);
        prune_cache(dir.path(), 50, &paths[2]);
        let left: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(left, [false, false, true, true]);
    }
}
