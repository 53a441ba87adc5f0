//! The embedded changelog's on-disk format: frames, commit payloads and
//! segment seals, shared by the log ([`super::embedded`]) and the cleaner
//! ([`super::clean`]), which rewrites segments in the same format.
//!
//! Frame: `magic u32 | len u32 | crc32c u32 | kind u8 | offset u64 | payload`
//! (little-endian; `len` counts from `kind`; the CRC covers `len` and the
//! body).

use super::{CommitInfo, Record};
use crate::file;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub(super) const MAGIC: u32 = 0x4754_5854; // "TXTG" read little-endian
pub(super) const HEADER: usize = 12;
/// Largest frame body accepted: bounds what a corrupt length can make us read.
pub(super) const MAX_FRAME: usize = 256 << 20;
pub(super) const KIND_DATA: u8 = 1;
pub(super) const KIND_COMMIT: u8 = 2;
/// The header of a cleaned segment ([`super::clean`]).
pub(super) const KIND_CLEANED: u8 = 3;
pub(super) const OP_PUT: u8 = 0;
pub(super) const OP_DELETE: u8 = 1;

/// One decoded frame.
pub(super) struct Frame<'a> {
    pub kind: u8,
    pub offset: u64,
    pub payload: &'a [u8],
}

/// Decodes the frame at `buf[pos..]`, or None if it is not a whole valid frame.
pub(super) fn decode(buf: &[u8], pos: usize) -> Option<(Frame<'_>, usize)> {
    let head = buf.get(pos..pos + HEADER)?;
    let magic = u32::from_le_bytes(head[0..4].try_into().unwrap());
    let len = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(head[8..12].try_into().unwrap());
    if magic != MAGIC || !(9..=MAX_FRAME).contains(&len) {
        return None;
    }
    let body = buf.get(pos + HEADER..pos + HEADER + len)?;
    if crc32c::crc32c_append(crc32c::crc32c(&head[4..8]), body) != crc {
        return None;
    }
    let offset = u64::from_le_bytes(body[1..9].try_into().unwrap());
    Some((
        Frame {
            kind: body[0],
            offset,
            payload: &body[9..],
        },
        HEADER + len,
    ))
}

pub(super) fn encode(out: &mut Vec<u8>, kind: u8, offset: u64, payload: &[&[u8]]) {
    let len = 9 + payload.iter().map(|p| p.len()).sum::<usize>();
    assert!(
        len <= MAX_FRAME,
        "changelog frame of {len} bytes exceeds {MAX_FRAME}"
    );
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&offset.to_le_bytes());
    for p in payload {
        out.extend_from_slice(p);
    }
    let crc = crc32c::crc32c_append(
        crc32c::crc32c(&out[start + 4..start + 8]),
        &out[start + HEADER..],
    );
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

pub(super) fn decode_record(payload: &[u8]) -> Result<Record> {
    let (&op, rest) = payload.split_first().context("empty data frame")?;
    let klen = u32::from_le_bytes(
        rest.get(0..4)
            .context("short data frame")?
            .try_into()
            .unwrap(),
    ) as usize;
    let key = rest
        .get(4..4 + klen)
        .context("data frame key overruns the frame")?
        .to_vec();
    let value = &rest[4 + klen..];
    match op {
        OP_PUT => Ok(Record::Put(key, value.to_vec())),
        OP_DELETE if value.is_empty() => Ok(Record::Delete(key)),
        _ => bail!("data frame with unknown operation {op}"),
    }
}

pub(super) fn segment_path(dir: &Path, first_offset: u64) -> PathBuf {
    dir.join(format!("{first_offset:020}.log"))
}

pub(super) fn seal_path(segment: &Path) -> PathBuf {
    segment.with_extension("seal")
}

/// Seal format 1 (32 bytes) has no input checksum; format 2 (40) has.
pub(super) const SEAL_MAGIC_V1: &[u8; 4] = b"TXSL";
pub(super) const SEAL_MAGIC: &[u8; 4] = b"TXS2";
pub(super) const SEAL_LEN: usize = 40;

/// What a seal records about a full segment: its length and last commit.
/// Layout: magic | len u64 | offset u64 | input position u64 | has check
/// u32 | input check u32 | crc32c u32 of the rest.
pub(super) fn encode_seal(len: u64, last: CommitInfo) -> [u8; SEAL_LEN] {
    let mut b = [0u8; SEAL_LEN];
    b[0..4].copy_from_slice(SEAL_MAGIC);
    b[4..12].copy_from_slice(&len.to_le_bytes());
    b[12..20].copy_from_slice(&last.offset.to_le_bytes());
    b[20..28].copy_from_slice(&last.input_position.to_le_bytes());
    b[28..32].copy_from_slice(&u32::from(last.input_check.is_some()).to_le_bytes());
    b[32..36].copy_from_slice(&last.input_check.unwrap_or(0).to_le_bytes());
    let crc = crc32c::crc32c(&b[0..36]);
    b[36..40].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A commit frame's payload: the input position, then its checksum if any.
pub(super) fn encode_commit(input_position: u64, input_check: Option<u32>) -> Vec<u8> {
    let mut p = input_position.to_le_bytes().to_vec();
    if let Some(c) = input_check {
        p.extend_from_slice(&c.to_le_bytes());
    }
    p
}

pub(super) fn decode_commit(payload: &[u8]) -> Option<(u64, Option<u32>)> {
    let position = u64::from_le_bytes(payload.get(0..8)?.try_into().ok()?);
    match payload.len() {
        8 => Some((position, None)),
        12 => Some((
            position,
            Some(u32::from_le_bytes(payload[8..12].try_into().ok()?)),
        )),
        _ => None,
    }
}

/// The seal of `segment`, if there is a valid one matching its length.
pub(super) fn read_seal(segment: &Path) -> Option<CommitInfo> {
    let b = std::fs::read(seal_path(segment)).ok()?;
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let half = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let input_check = match (b.len(), b.get(0..4)?) {
        (32, m) if m == SEAL_MAGIC_V1 && crc32c::crc32c(&b[0..28]) == half(28) => None,
        (SEAL_LEN, m) if m == SEAL_MAGIC && crc32c::crc32c(&b[0..36]) == half(36) => {
            (half(28) == 1).then(|| half(32))
        }
        _ => return None,
    };
    let len = std::fs::metadata(segment).ok()?.len();
    (len == word(4)).then(|| CommitInfo {
        offset: word(12),
        input_position: word(20),
        input_check,
    })
}

/// Writes `segment`'s seal atomically and durably.
pub(super) fn write_seal(segment: &Path, len: u64, last: CommitInfo) -> Result<()> {
    file::write_atomic(&seal_path(segment), &encode_seal(len, last))?;
    Ok(())
}

pub(super) fn remove_if_exists(path: &Path) -> Result<()> {
    match file::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.with_context(|| format!("cannot remove {}", path.display())),
    }
}
