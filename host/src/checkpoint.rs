//! The checkpoint file: the offset up to which the store is known to hold
//! the changelog, written atomically (temp file, fsync, rename, fsync the
//! directory) with a version and a checksum.
//!
//! Layout (24 bytes, little-endian): `magic "TXCK" | version u32 | offset
//! u64 | crc32c u32 of the first 16 bytes | reserved u32 (0)`.
//!
//! Under exactly-once the task reads it and removes it at start-up, and
//! writes it again only at a clean shutdown, as Kafka Streams does: a
//! checkpoint on disk then always means "the store was closed cleanly at
//! this offset". Under at-least-once it is written after every commit.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"TXCK";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
const LEN: usize = 24;

pub struct Checkpoint {
    path: PathBuf,
}

impl Checkpoint {
    /// The checkpoint file of the state directory `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("checkpoint"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checkpointed offset, `None` if there is no file. A damaged file or
    /// one from a newer version is an error naming the file.
    pub fn read(&self) -> Result<Option<u64>> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot read checkpoint {}", self.path.display()))
            }
        };
        decode(&bytes)
            .map(Some)
            .with_context(|| format!("checkpoint {}", self.path.display()))
    }

    /// Writes `offset` atomically and durably.
    pub fn write(&self, offset: u64) -> Result<()> {
        crate::file::write_atomic(&self.path, &encode(offset))
            .with_context(|| format!("cannot write checkpoint {}", self.path.display()))
    }

    /// Removes the file durably (no error if absent).
    pub fn remove(&self) -> Result<()> {
        match crate::file::remove_file(&self.path) {
            Ok(()) => {
                crate::file::sync_dir(self.path.parent().unwrap())?;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => {
                Err(e).with_context(|| format!("cannot remove checkpoint {}", self.path.display()))
            }
        }
    }
}

fn encode(offset: u64) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4..8].copy_from_slice(&VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a checkpoint file's bytes.
pub fn decode(b: &[u8]) -> Result<u64> {
    if b.len() != LEN || &b[0..4] != MAGIC {
        bail!(
            "is not a txstore checkpoint ({} bytes, expected {LEN} starting with TXCK)",
            b.len()
        );
    }
    let version = u32::from_le_bytes(b[4..8].try_into().unwrap());
    let crc = u32::from_le_bytes(b[16..20].try_into().unwrap());
    if crc != crc32c::crc32c(&b[0..16]) {
        bail!("is damaged (checksum mismatch)");
    }
    if b[20..24] != [0; 4] {
        bail!("is damaged (reserved bytes are not zero)");
    }
    if version != VERSION {
        bail!("has format version {version}, this txstore reads version {VERSION} (written by a newer txstore?)");
    }
    Ok(u64::from_le_bytes(b[8..16].try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        assert_eq!(decode(&encode(42)).unwrap(), 42);
        for i in 0..20 {
            let mut b = encode(42);
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at byte {i} accepted");
        }
        let mut newer = encode(1);
        newer[4..8].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&newer[0..16]);
        newer[16..20].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&newer)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Any bytes decode to an offset only if they are exactly what
        /// `encode` writes for it; nothing panics.
        #[test]
        fn fuzz_decode(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            if let Ok(offset) = decode(&bytes) {
                proptest::prop_assert_eq!(&encode(offset)[..], &bytes[..]);
            }
        }

        /// Every single-bit flip of a valid file is caught.
        #[test]
        fn fuzz_bit_flips(offset in proptest::prelude::any::<u64>(), bit in 0usize..(LEN * 8)) {
            let mut b = encode(offset);
            b[bit / 8] ^= 1 << (bit % 8);
            proptest::prop_assert!(decode(&b).is_err());
        }
    }
}
