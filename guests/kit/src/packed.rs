//! Packed byte strings, `wit/store.wit`'s `packed`, `keys`, `entries` and
//! `maybe-values`: built by pushing, read by iterating, checked before a
//! caller's buffer is read.

use crate::{Error, MaybeValues, Packed};

/// Packed byte strings (`wit/store.wit`'s `packed`): string i is
/// `bytes[ends[i-1]..ends[i]]`. Built by pushing, read by iterating, never
/// one allocation per string.
impl Packed {
    pub const fn new() -> Self {
        Packed { bytes: Vec::new(), ends: Vec::new() }
    }

    /// Appends one string.
    pub fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len() as u32);
    }

    /// Appends a key and its value (an `entries` buffer).
    pub fn push_entry(&mut self, key: &[u8], value: &[u8]) {
        self.push(key);
        self.push(value);
    }

    /// The number of strings.
    pub fn strings_len(&self) -> usize {
        self.ends.len()
    }

    /// The number of entries of an `entries` buffer.
    pub fn entries_len(&self) -> usize {
        self.ends.len() / 2
    }

    /// String `i`.
    pub fn string(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    /// The strings, in order.
    pub fn strings(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.ends.len()).map(|i| self.string(i))
    }

    /// The (key, value) pairs of an `entries` buffer, in order.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        (0..self.entries_len()).map(|i| (self.string(2 * i), self.string(2 * i + 1)))
    }

    /// Refuses a buffer whose offsets do not describe groups of `per`
    /// strings of `bytes` (what a caller sent must be checked before it is
    /// read: a bad offset would trap).
    pub fn check(&self, per: usize, what: &str) -> Result<(), Error> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("{what}: malformed packed argument: {why}")));
        if self.ends.len() % per != 0 {
            return bad(format!("{} offsets, not a multiple of {per}", self.ends.len()));
        }
        let mut last = 0;
        for &end in &self.ends {
            if end < last {
                return bad(format!("offset {end} below {last}"));
            }
            last = end;
        }
        if last as usize != self.bytes.len() {
            return bad(format!("the offsets end at {last}, the buffer holds {} bytes", self.bytes.len()));
        }
        Ok(())
    }
}

/// Answers to a batched get, built one by one in the order asked.
impl MaybeValues {
    pub const fn new() -> Self {
        MaybeValues { values: Packed::new(), found: Vec::new() }
    }

    pub fn push(&mut self, value: Option<&[u8]>) {
        self.values.push(value.unwrap_or_default());
        self.found.push(value.is_some());
    }

    pub fn len(&self) -> usize {
        self.found.len()
    }

    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Answer `i`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.found[i].then(|| self.values.string(i))
    }

    /// The answers, in order.
    pub fn iter(&self) -> impl Iterator<Item = Option<&[u8]>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;

    #[test]
    fn packed_strings_round_trip_and_malformed_ones_are_refused() {
        let p = packed(&["k1", "", "value"]);
        assert_eq!(p.ends, [2, 2, 7]);
        assert_eq!(p.strings().collect::<Vec<_>>(), [&b"k1"[..], b"", b"value"]);
        p.check(1, "t").unwrap();
        assert!(p.check(2, "t").is_err());
        let e = packed(&["a", "1", "b", ""]);
        assert_eq!(e.entries().collect::<Vec<_>>(), [(&b"a"[..], &b"1"[..]), (&b"b"[..], &b""[..])]);
        for (bytes, ends) in [(b"abc".to_vec(), vec![2, 1]), (b"abc".to_vec(), vec![1, 2]), (vec![], vec![4])] {
            let bad = Packed { bytes, ends };
            assert!(
                matches!(bad.check(1, "put-many"), Err(Error::InvalidArgument(m)) if m.starts_with("put-many: malformed"))
            );
        }
        let mut answers = MaybeValues::new();
        assert!(answers.is_empty());
        answers.push(Some(b"v"));
        assert!(!answers.is_empty());
        answers.push(None);
        answers.push(Some(b""));
        assert_eq!(answers.iter().collect::<Vec<_>>(), [Some(&b"v"[..]), None, Some(&b""[..])]);
    }
}
