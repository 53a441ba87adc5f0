//! The packed byte strings of WIT 0.2.0 (`packed`, `keys`, `entries`,
//! `maybe-values`) on the host's side: checking what a guest hands over,
//! walking it without copying, and building what the host sends.

use super::bindings::v2::txstore::store::types::{Error, MaybeValues, Packed};
use wasmtime::component::{ComponentType, Lower};

/// Packed strings borrowed from the host's own buffers, lowered into the
/// guest without an owned copy first.
#[derive(ComponentType, Lower, Clone, Copy, Debug)]
#[component(record)]
pub struct PackedRef<'a> {
    pub bytes: &'a [u8],
    pub ends: &'a [u32],
}

/// A packed buffer the host fills, reused between calls.
#[derive(Default, Debug)]
pub struct PackedBuf {
    pub bytes: Vec<u8>,
    pub ends: Vec<u32>,
}

impl PackedBuf {
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Appends one string. A buffer past 4 GiB cannot be described by u32
    /// offsets; the host's limits keep every page and batch far below it.
    pub fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        let end = u32::try_from(self.bytes.len()).expect("a packed buffer stays under 4 GiB");
        self.ends.push(end);
    }

    pub fn as_ref(&self) -> PackedRef<'_> {
        PackedRef {
            bytes: &self.bytes,
            ends: &self.ends,
        }
    }
}

/// Checks that `ends` describes `per`-string groups of `bytes`: never
/// decreasing, the last at the end of the buffer, a multiple of `per`
/// strings. The answer is what is wrong, for the error line.
pub fn check(bytes: &[u8], ends: &[u32], per: usize) -> Result<(), String> {
    if ends.len() % per != 0 {
        return Err(format!(
            "{} offsets, not a multiple of {per} (strings per item)",
            ends.len()
        ));
    }
    let mut last = 0u32;
    for (i, &end) in ends.iter().enumerate() {
        if end < last {
            return Err(format!(
                "offset {i} is {end}, below the one before it ({last})"
            ));
        }
        last = end;
    }
    if last as usize != bytes.len() {
        return Err(format!(
            "the offsets end at {last}, the buffer holds {} bytes",
            bytes.len()
        ));
    }
    Ok(())
}

/// The strings of a buffer [`check`] accepted, in order.
pub fn strings<'a>(bytes: &'a [u8], ends: &'a [u32]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let starts = std::iter::once(0).chain(ends.iter().copied());
    starts
        .zip(ends.iter().copied())
        .map(move |(s, e)| &bytes[s as usize..e as usize])
}

/// The (key, value) pairs of an `entries` buffer [`check`] accepted with
/// `per` = 2.
pub fn pairs<'a>(
    bytes: &'a [u8],
    ends: &'a [u32],
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
    let mut it = strings(bytes, ends);
    std::iter::from_fn(move || Some((it.next()?, it.next()?)))
}

/// One page of a range as the guest returned it: entries packed in one
/// buffer (checked), read without copying them out.
#[derive(Debug, Default)]
pub struct Page {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Page {
    /// A page a guest returned, refused when its offsets are malformed.
    pub(super) fn checked(bytes: Vec<u8>, ends: Vec<u32>) -> wasmtime::Result<Self> {
        check(&bytes, &ends, 2)
            .map_err(|why| wasmtime::Error::msg(format!("it returned a malformed page: {why}")))?;
        Ok(Self { bytes, ends })
    }

    pub(super) fn from_entries(entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Self {
        let mut buf = PackedBuf::default();
        for (k, v) in entries {
            buf.push(&k);
            buf.push(&v);
        }
        Self {
            bytes: buf.bytes,
            ends: buf.ends,
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        pairs(&self.bytes, &self.ends)
    }

    /// The last entry's key.
    pub fn last_key(&self) -> Option<&[u8]> {
        self.iter().last().map(|(k, _)| k)
    }

    /// The entries as owned pairs.
    pub fn to_pairs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    }
}

/// The strings of an argument a guest or a processor passed (`per` to an
/// item), or the error it gets for a malformed buffer, naming the call.
pub(crate) fn unpack_arg<'a>(
    call: &str,
    p: &'a Packed,
    per: usize,
) -> Result<impl Iterator<Item = &'a [u8]>, Error> {
    check(&p.bytes, &p.ends, per).map_err(|why| {
        Error::InvalidArgument(format!("{call}: malformed packed argument: {why}"))
    })?;
    Ok(strings(&p.bytes, &p.ends))
}

pub(crate) fn into_packed(buf: PackedBuf) -> Packed {
    Packed {
        bytes: buf.bytes,
        ends: buf.ends,
    }
}

/// Answers to a `get-many` as 0.2.0 sends them: one string and one flag
/// per key asked.
pub(crate) fn pack_values(values: &[Option<Vec<u8>>]) -> MaybeValues {
    let mut out = PackedBuf::default();
    let found = values
        .iter()
        .map(|v| {
            out.push(v.as_deref().unwrap_or_default());
            v.is_some()
        })
        .collect();
    MaybeValues {
        values: into_packed(out),
        found,
    }
}

/// The answers of a 0.2.0 `get-many`, checked against the keys asked.
pub(super) fn unpack_values(
    asked: usize,
    answer: MaybeValues,
) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
    let MaybeValues { values, found } = answer;
    let bad = |why: String| {
        wasmtime::Error::msg(format!("it returned malformed get-many answers: {why}"))
    };
    check(&values.bytes, &values.ends, 1).map_err(bad)?;
    if values.ends.len() != asked || found.len() != asked {
        return Err(bad(format!(
            "{} values and {} flags for {asked} keys",
            values.ends.len(),
            found.len()
        )));
    }
    Ok(strings(&values.bytes, &values.ends)
        .zip(found)
        .map(|(v, found)| found.then(|| v.to_vec()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_including_empty_ones() {
        let mut buf = PackedBuf::default();
        for s in [&b"k1"[..], b"", b"value", b"", b""] {
            buf.push(s);
        }
        assert_eq!(buf.ends, [2, 2, 7, 7, 7]);
        check(&buf.bytes, &buf.ends, 1).unwrap();
        let got: Vec<&[u8]> = strings(&buf.bytes, &buf.ends).collect();
        assert_eq!(got, [&b"k1"[..], b"", b"value", b"", b""]);
        buf.clear();
        assert!(strings(&buf.bytes, &buf.ends).next().is_none());
        check(&buf.bytes, &buf.ends, 2).unwrap();
    }

    #[test]
    fn entries_pair_up_keys_and_values() {
        let mut buf = PackedBuf::default();
        for s in [&b"a"[..], b"1", b"b", b""] {
            buf.push(s);
        }
        check(&buf.bytes, &buf.ends, 2).unwrap();
        let got: Vec<_> = pairs(&buf.bytes, &buf.ends).collect();
        assert_eq!(got, [(&b"a"[..], &b"1"[..]), (&b"b"[..], &b""[..])]);
    }

    #[test]
    fn malformed_offsets_are_refused_with_what_is_wrong() {
        let bytes = b"abcdef";
        assert!(check(bytes, &[2, 1, 6], 1)
            .unwrap_err()
            .contains("below the one before it"));
        assert!(check(bytes, &[2, 5], 1).unwrap_err().contains("end at 5"));
        assert!(check(bytes, &[2, 9], 1).unwrap_err().contains("end at 9"));
        assert!(check(bytes, &[1, 3, 6], 2)
            .unwrap_err()
            .contains("multiple of 2"));
        assert!(check(bytes, &[], 1).unwrap_err().contains("end at 0"));
        check(b"", &[], 2).unwrap();
    }
}
