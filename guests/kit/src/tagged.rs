//! A value or its absence as one stored value, for a keyspace that must
//! record both.

use crate::{Error, Packed};

/// Tag byte of a value that is there...
pub const PRESENT: u8 = 1;
/// ...and of one that is not: the whole stored value.
pub const ABSENT: u8 = 0;

/// A value or its absence as one stored value, for a keyspace that must
/// record both (a staged delete, a key that did not exist): `PRESENT` with
/// the value, or `ABSENT` alone. The variant says where the tag byte goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tagged {
    /// Before the value: adding or removing it shifts every byte of the value.
    First,
    /// After the value: adding or removing it shifts nothing.
    Last,
}

impl Tagged {
    pub fn encode(self, value: Option<Vec<u8>>) -> Vec<u8> {
        match value {
            Some(mut v) => {
                // Room for the tag alone, not twice the value (a full vector doubles).
                v.reserve_exact(1);
                match self {
                    Tagged::First => v.insert(0, PRESENT),
                    Tagged::Last => v.push(PRESENT),
                }
                v
            }
            None => vec![ABSENT],
        }
    }

    /// Appends what `encode` makes of `value` to `out` as one string,
    /// with no buffer of its own.
    pub fn encode_into(self, value: Option<&[u8]>, out: &mut Packed) {
        match (value, self) {
            (Some(v), Tagged::First) => {
                out.bytes.push(PRESENT);
                out.bytes.extend_from_slice(v);
            }
            (Some(v), Tagged::Last) => {
                out.bytes.extend_from_slice(v);
                out.bytes.push(PRESENT);
            }
            (None, _) => out.bytes.push(ABSENT),
        }
        out.ends.push(out.bytes.len() as u32);
    }

    /// The value `encode` was given, borrowed from `stored`; anything it
    /// cannot have written is `corrupt`, naming `keyspace`.
    pub fn decode_slice<'a>(self, stored: &'a [u8], keyspace: &str) -> Result<Option<&'a [u8]>, Error> {
        let split = match self {
            Tagged::First => stored.split_first().map(|(t, v)| (*t, v)),
            Tagged::Last => stored.split_last().map(|(t, v)| (*t, v)),
        };
        match split {
            Some((PRESENT, value)) => Ok(Some(value)),
            Some((ABSENT, rest)) if rest.is_empty() => Ok(None),
            _ => Err(Error::Corrupt(format!("{keyspace} keyspace holds a value without a valid tag"))),
        }
    }

    /// The value `encode` was given; anything it cannot have written is
    /// `corrupt`, naming `keyspace`.
    pub fn decode(self, mut stored: Vec<u8>, keyspace: &str) -> Result<Option<Vec<u8>>, Error> {
        match self.decode_slice(&stored, keyspace)? {
            None => Ok(None),
            Some(_) => {
                match self {
                    Tagged::First => {
                        stored.remove(0);
                    }
                    Tagged::Last => stored.truncate(stored.len() - 1),
                }
                Ok(Some(stored))
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;

    #[test]
    fn tagged_values_round_trip_with_the_tag_where_it_is_asked() {
        for (tagged, put) in [(Tagged::First, vec![PRESENT, 0, 7]), (Tagged::Last, vec![0, 7, PRESENT])] {
            assert_eq!(tagged.encode(Some(vec![0, 7])), put);
            assert_eq!(tagged.encode(Some(Vec::new())), vec![PRESENT]);
            assert_eq!(tagged.encode(None), vec![ABSENT]);
            for value in [None, Some(vec![]), Some(vec![ABSENT]), Some(vec![PRESENT]), Some(vec![1, 0, 0, 1])] {
                assert_eq!(tagged.decode(tagged.encode(value.clone()), "temp").unwrap(), value);
                let mut p = packed(&["before"]);
                tagged.encode_into(value.as_deref(), &mut p);
                assert_eq!(p.string(1), tagged.encode(value.clone()));
                assert_eq!(tagged.decode_slice(p.string(1), "temp").unwrap(), value.as_deref());
            }
        }
        assert_eq!(PRESENT, 1, "stored by earlier versions");
        assert_eq!(ABSENT, 0, "stored by earlier versions");
    }

    #[test]
    fn a_value_without_a_valid_tag_is_corrupt() {
        for tagged in [Tagged::First, Tagged::Last] {
            // Empty, an unknown tag, and bytes with an `absent` tag.
            for stored in [vec![], vec![2], vec![ABSENT, ABSENT], vec![ABSENT, 5], vec![5, ABSENT]] {
                let err = tagged.decode(stored.clone(), "undo").unwrap_err();
                assert!(
                    matches!(&err, Error::Corrupt(m) if m == "undo keyspace holds a value without a valid tag"),
                    "{tagged:?} {stored:?}: {err:?}"
                );
                assert_eq!(format!("{:?}", tagged.decode_slice(&stored, "undo").unwrap_err()), format!("{err:?}"));
            }
        }
        // One layout read as the other is refused when its tag is not where
        // the other expects it (here the value ends in neither tag).
        assert!(Tagged::Last.decode(Tagged::First.encode(Some(vec![9])), "temp").is_err());
        assert!(Tagged::First.decode(Tagged::Last.encode(Some(vec![9])), "temp").is_err());
    }
}
