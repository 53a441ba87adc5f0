//! The consumer-group offset metadata a transaction commits with the
//! input position: the changelog's committed end, the last marker's
//! sequence number and time, and the input's checksum.

/// Prefix of the offset metadata that holds the changelog's committed end.
pub(super) const END_METADATA: &str = "txstore-changelog-end=";
/// The last marker's sequence number, in the metadata.
pub(super) const SEQ_METADATA: &str = "txn=";
/// When the last marker was written (ms), in the metadata.
pub(super) const MARKER_TIME_METADATA: &str = "marker-ms=";
/// Follows the end in the metadata when the input is a file: its CRC32C.
pub(super) const CHECK_METADATA: &str = "input-crc32c=";
/// The offset metadata committed with a transaction: the changelog's
/// committed end, the last marker (sequence number, time) and the input's
/// checksum.
pub(super) fn metadata(end: u64, marker: Option<(u64, i64)>, check: Option<u32>) -> String {
    let mut m = format!("{END_METADATA}{end}");
    if let Some((seq, ms)) = marker {
        m += &format!(";{SEQ_METADATA}{seq};{MARKER_TIME_METADATA}{ms}");
    }
    if let Some(c) = check {
        m += &format!(";{CHECK_METADATA}{c:08x}");
    }
    m
}

/// What [`metadata`] wrote (None: not txstore's). A field it does not know
/// is refused: a newer txstore's metadata must not be half read.
#[allow(clippy::type_complexity)]
pub(super) fn parse_metadata(m: &str) -> Option<(u64, Option<(u64, i64)>, Option<u32>)> {
    let mut fields = m.strip_prefix(END_METADATA)?.split(';');
    let end = fields.next()?.parse().ok()?;
    let (mut seq, mut time, mut check) = (None, None, None);
    for field in fields {
        if let Some(v) = field.strip_prefix(SEQ_METADATA) {
            seq = Some(v.parse().ok()?);
        } else if let Some(v) = field.strip_prefix(MARKER_TIME_METADATA) {
            time = Some(v.parse().ok()?);
        } else if let Some(v) = field.strip_prefix(CHECK_METADATA) {
            check = Some(u32::from_str_radix(v, 16).ok()?);
        } else {
            return None;
        }
    }
    let marker = match (seq, time) {
        (Some(s), Some(t)) => Some((s, t)),
        (None, None) => None,
        _ => return None,
    };
    Some((end, marker, check))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_foreign_text_is_refused() {
        for (end, marker, check) in [
            (0, None, None),
            (17, Some((3, 1_800_000_000_000)), None),
            (1 << 40, Some((9, 5)), Some(0xdead_beef)),
            (5, None, Some(1)),
        ] {
            assert_eq!(
                parse_metadata(&metadata(end, marker, check)),
                Some((end, marker, check))
            );
        }
        // Written before markers: the end and the checksum only.
        assert_eq!(
            parse_metadata("txstore-changelog-end=12;input-crc32c=0000000a"),
            Some((12, None, Some(10)))
        );
        for foreign in [
            "",
            "12",
            "txstore-changelog-end=x",
            "txstore-changelog-end=1;txn=2",
            "txstore-changelog-end=1;new=2",
        ] {
            assert_eq!(parse_metadata(foreign), None, "{foreign}");
        }
    }
}
