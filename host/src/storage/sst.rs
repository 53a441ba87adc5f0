//! A column family's SST files out and back in, by hard link: the two
//! RocksDB calls that make a snapshot of one store cost in proportion to
//! its file count rather than its bytes. rust-rocksdb does not wrap them,
//! so they go through the C API (`librocksdb-sys`) here and nowhere else.
//!
//! - [`export`]: `Checkpoint::ExportColumnFamily` hard-links the family's
//!   live SST files into a new directory (RocksDB fsyncs it) and reports
//!   each file's level and sequence numbers.
//! - [`ingest`]: `IngestExternalFile` with `allow_db_generated_files` links
//!   such files into an empty family, keeping their sequence numbers.
//!   RocksDB requires the files of one key ordered oldest first: deeper
//!   levels first, and within level 0 the older (lower sequence) first,
//!   which [`ingest_order`] gives.

use super::{Result, StorageError};
use librocksdb_sys as ffi;
use rocksdb::{AsColumnFamilyRef, AsRawPtr};
use std::ffi::{c_char, CStr, CString};
use std::path::Path;

type Db = rocksdb::DBWithThreadMode<rocksdb::MultiThreaded>;

/// One exported SST file: its name inside the export directory, its LSM
/// level and its largest sequence number (for [`ingest_order`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct SstFile {
    pub name: String,
    pub level: i32,
    pub largest_seqno: u64,
}

/// Takes a RocksDB error string out of `err` (freeing it).
fn take_error(err: *mut c_char, what: &str) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: RocksDB sets `err` to a malloc'd NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    unsafe { ffi::rocksdb_free(err.cast()) };
    Err(StorageError::Io(format!("{what}: {msg}")))
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| StorageError::Io(format!("path {} contains a NUL byte", p.display())))
}

/// Hard-links the live SST files of `cf` into `dir` (which must not exist;
/// RocksDB creates and fsyncs it). The family's memtable is flushed first
/// by RocksDB; callers flush every family before, so that flush cuts
/// nothing (see `rocks/mod.rs` on atomic flushes).
pub(super) fn export(db: &Db, cf: &impl AsColumnFamilyRef, dir: &Path) -> Result<Vec<SstFile>> {
    let path = c_path(dir)?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: `db` and `cf` outlive these calls; every object created here
    // is destroyed before returning, on every path.
    unsafe {
        let cp = ffi::rocksdb_checkpoint_object_create(db.as_raw_ptr(), &mut err);
        take_error(err, "cannot start a column-family export")?;
        let meta =
            ffi::rocksdb_checkpoint_export_column_family(cp, cf.inner(), path.as_ptr(), &mut err);
        ffi::rocksdb_checkpoint_object_destroy(cp);
        take_error(err, "cannot export a column family")?;
        let files = ffi::rocksdb_export_import_files_metadata_get_files(meta);
        let mut out = Vec::new();
        for i in 0..ffi::rocksdb_livefiles_count(files) {
            let name = CStr::from_ptr(ffi::rocksdb_livefiles_name(files, i))
                .to_string_lossy()
                .trim_start_matches('/')
                .to_string();
            out.push(SstFile {
                name,
                level: ffi::rocksdb_livefiles_level(files, i),
                largest_seqno: ffi::rocksdb_livefiles_largest_seqno(files, i),
            });
        }
        ffi::rocksdb_livefiles_destroy(files);
        ffi::rocksdb_export_import_files_metadata_destroy(meta);
        Ok(out)
    }
}

/// `files` in the order ingestion needs: deeper levels first, then by
/// largest sequence number (level 0 files overlap; the older goes first).
pub(super) fn ingest_order(files: &mut [SstFile]) {
    files.sort_by_key(|f| (std::cmp::Reverse(f.level), f.largest_seqno));
}

/// Links `files` (of `dir`, in [`ingest_order`]) into `cf`, which must be
/// empty. The files stay where they are (linked, not moved). The ingestion
/// is recorded in RocksDB's MANIFEST, which RocksDB syncs.
pub(super) fn ingest(
    db: &Db,
    cf: &impl AsColumnFamilyRef,
    dir: &Path,
    files: &[SstFile],
) -> Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let paths: Vec<CString> = files
        .iter()
        .map(|f| c_path(&dir.join(&f.name)))
        .collect::<Result<_>>()?;
    let ptrs: Vec<*const c_char> = paths.iter().map(|p| p.as_ptr()).collect();
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: as in `export`; `paths` outlives the call.
    unsafe {
        let opts = ffi::rocksdb_ingestexternalfileoptions_create();
        ffi::rocksdb_ingestexternalfileoptions_set_link_files(opts, 1);
        ffi::rocksdb_ingestexternalfileoptions_set_allow_db_generated_files(opts, 1);
        // DB-generated files keep their sequence numbers, which RocksDB
        // requires to be ingested without snapshot consistency.
        ffi::rocksdb_ingestexternalfileoptions_set_snapshot_consistency(opts, 0);
        ffi::rocksdb_ingest_external_file_cf(
            db.as_raw_ptr(),
            cf.inner(),
            ptrs.as_ptr(),
            ptrs.len(),
            opts,
            &mut err,
        );
        ffi::rocksdb_ingestexternalfileoptions_destroy(opts);
    }
    take_error(err, "cannot ingest snapshot files")
}
