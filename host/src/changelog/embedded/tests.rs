use super::*;
use crate::changelog::{Changelog, Record, Replayed};

/// Writes `txns` transactions of three puts each; returns the segment.
fn write_log(dir: &Path, txns: u64) -> PathBuf {
    let mut log = EmbeddedLog::open(dir, 1 << 30).unwrap();
    for t in 0..txns {
        for i in 0..3u64 {
            log.append(&[Record::Put(
                format!("k{t}-{i}").into_bytes(),
                vec![t as u8; (t * 7 % 50) as usize],
            )])
            .unwrap();
        }
        log.commit(t + 1, None).unwrap();
    }
    segment_path(dir, 0)
}

fn read_all(dir: &Path) -> Result<(u64, Vec<String>)> {
    let mut log = EmbeddedLog::open(dir, 1 << 30)?;
    let mut keys = Vec::new();
    log.read_committed(0, &mut |item| {
        if let Replayed::Record(r) = item {
            keys.push(String::from_utf8_lossy(r.key()).to_string());
        }
        Ok(())
    })?;
    Ok((log.end_offset(), keys))
}

/// A power cut inside an open transaction can keep a later page and
/// lose an earlier one: the tail is cut at the first damage, and what
/// was committed before it stays replayable.
#[test]
fn torn_page_inside_the_open_transaction_is_cut_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write_log(dir.path(), 3);
    let committed = std::fs::metadata(&seg).unwrap().len() as usize;
    {
        let mut log = EmbeddedLog::open(dir.path(), 1 << 30).unwrap();
        for i in 0..40u8 {
            log.append(&[Record::Put(vec![b'x', i], vec![i; 300])])
                .unwrap();
        }
        log.writer.flush().unwrap();
    }
    let mut bytes = std::fs::read(&seg).unwrap();
    let hole = committed + 100;
    bytes[hole..hole + 4096].fill(0);
    std::fs::write(&seg, &bytes).unwrap();
    let mut log = EmbeddedLog::open(dir.path(), 1 << 30).unwrap();
    assert_eq!(log.report.truncated_bytes as usize, bytes.len() - committed);
    assert!(log.report.damage.is_empty(), "{:?}", log.report.damage);
    log.check_replayable(0).unwrap();
    drop(log);
    assert_eq!(read_all(dir.path()).unwrap().1.len(), 9);
}

/// After a torn write, a frame-shaped piece of a record's value (here
/// a whole commit frame naming a later input position) is never taken
/// for a commit.
#[test]
fn frame_inside_a_value_after_a_tear_is_not_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write_log(dir.path(), 2);
    let committed = std::fs::metadata(&seg).unwrap().len() as usize;
    let mut forged = Vec::new();
    // The open transaction's data frame gets offset 8; forge the commit
    // frame that would follow it: offset 9, input position 999.
    encode(&mut forged, KIND_COMMIT, 9, &[&999u64.to_le_bytes()]);
    {
        let mut log = EmbeddedLog::open(dir.path(), 1 << 30).unwrap();
        log.append(&[Record::Put(b"kv".to_vec(), forged.clone())])
            .unwrap();
        log.writer.flush().unwrap();
    }
    // Tear the data frame's header: the forged frame follows the damage.
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[committed + 5] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let log = EmbeddedLog::open(dir.path(), 1 << 30).unwrap();
    assert_eq!(
        log.last_commit().unwrap().input_position,
        2,
        "forged commit accepted"
    );
    assert_eq!(log.end_offset(), 8);
}

/// A second writer on the same changelog directory is refused while
/// the first holds it (it would truncate the first one's open
/// transaction).
#[test]
fn a_second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = EmbeddedLog::open(dir.path(), 1 << 30).unwrap();
    first
        .append(&[Record::Put(b"a".to_vec(), b"1".to_vec())])
        .unwrap();
    let err = EmbeddedLog::open(dir.path(), 1 << 30)
        .err()
        .expect("second writer accepted");
    assert!(
        format!("{err:#}").contains("in use by another txstore process"),
        "{err:#}"
    );
    first.commit(1, None).unwrap();
    drop(first);
    assert_eq!(read_all(dir.path()).unwrap().1, vec!["a".to_string()]);
}

/// Segments must follow each other: a missing one in the middle stops
/// the open, a missing first one stops a replay from before it.
#[test]
fn a_missing_segment_is_refused_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = EmbeddedLog::open(dir.path(), 200).unwrap();
        for t in 0..12u64 {
            log.append(&[Record::Put(format!("k{t}").into_bytes(), vec![7; 100])])
                .unwrap();
            log.commit(t + 1, None).unwrap();
        }
    }
    let segments: Vec<_> = EmbeddedLog::open(dir.path(), 200)
        .unwrap()
        .segments()
        .map(Path::to_path_buf)
        .collect();
    assert!(segments.len() >= 4, "{segments:?}");
    let middle = dir.path().join("middle");
    std::fs::rename(&segments[2], &middle).unwrap();
    let err = EmbeddedLog::open(dir.path(), 200)
        .err()
        .expect("gap accepted");
    assert!(
        format!("{err:#}").contains("segments are missing"),
        "{err:#}"
    );
    std::fs::rename(&middle, &segments[2]).unwrap();
    std::fs::remove_file(&segments[0]).unwrap();
    let mut log = EmbeddedLog::open(dir.path(), 200).unwrap();
    let err = log.check_replayable(0).unwrap_err();
    assert!(
        format!("{err:#}").contains("earlier segments are missing"),
        "{err:#}"
    );
}

/// After a failed write the log refuses every later call.
#[test]
fn a_failed_log_stays_failed() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = EmbeddedLog::open(dir.path(), 1 << 30).unwrap();
    log.failed = Some("fsync of x: input/output error".into());
    let err = log.commit(1, None).unwrap_err();
    assert!(
        format!("{err:#}").contains("changelog failed earlier"),
        "{err:#}"
    );
    assert!(log.append(&[Record::Delete(b"a".to_vec())]).is_err());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// A torn tail at any byte keeps exactly the transactions whose
    /// commit frame survived.
    #[test]
    fn fuzz_truncation_keeps_whole_transactions(cut in 0usize..2000) {
        let dir = tempfile::tempdir().unwrap();
        let seg = write_log(dir.path(), 12);
        let bytes = std::fs::read(&seg).unwrap();
        let cut = cut.min(bytes.len());
        std::fs::write(&seg, &bytes[..cut]).unwrap();
        let (_, keys) = read_all(dir.path()).unwrap();
        proptest::prop_assert_eq!(keys.len() % 3, 0);
        let whole = keys.len() / 3;
        for (i, k) in keys.iter().enumerate() {
            proptest::prop_assert_eq!(k, &format!("k{}-{}", i / 3, i % 3));
        }
        // Reopening after the repair changes nothing more.
        proptest::prop_assert_eq!(read_all(dir.path()).unwrap().1.len(), whole * 3);
    }

    /// Garbage anywhere: open and read either work or fail with an
    /// error; never a panic, and never a record that was not written.
    #[test]
    fn fuzz_garbage_never_panics(at in 0usize..2000, garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..64)) {
        let dir = tempfile::tempdir().unwrap();
        let seg = write_log(dir.path(), 12);
        let mut bytes = std::fs::read(&seg).unwrap();
        let at = at.min(bytes.len());
        let end = (at + garbage.len()).min(bytes.len());
        bytes.splice(at..end, garbage.iter().copied());
        std::fs::write(&seg, &bytes).unwrap();
        if let Ok((_, keys)) = read_all(dir.path()) {
            for k in keys {
                proptest::prop_assert!(k.starts_with('k') && k.contains('-'), "invented record {}", k);
            }
        }
    }
}
