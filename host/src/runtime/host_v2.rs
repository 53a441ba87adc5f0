//! `storage` as WIT 0.2.0 types it: keys, pages and batches packed (one
//! buffer and its offsets, see `packed`), so a page crosses in two
//! allocations instead of two per entry.

use super::bindings::v2::txstore::store::storage::{
    Host, HostCursor, HostKeyspace, KeyspaceOps, Level, Op as WitOp,
};
use super::bindings::v2::txstore::store::types::{self, Error, MaybeValues, Packed};
use super::host::{Answer, CursorRes, GuestState, KeyspaceRes};
use super::packed::{into_packed, pack_values, unpack_arg as unpack, PackedBuf};
use crate::storage::{Op, StorageError};
use wasmtime::component::Resource;

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Denied(m) => Error::AccessDenied(m),
            StorageError::NoSuchSnapshot(n) => Error::NoSuchSnapshot(n),
            StorageError::Invalid(m) => Error::InvalidArgument(m),
            StorageError::Io(m) => Error::Storage(m),
        }
    }
}

type R<T> = wasmtime::Result<Result<T, Error>>;

fn wit<T>(answer: Answer<T>) -> R<T> {
    answer.map(|r| r.map_err(Error::from))
}

impl types::Host for GuestState {}

impl HostKeyspace for GuestState {
    fn open(&mut self, name: String) -> R<Resource<KeyspaceRes>> {
        wit(GuestState::open(self, name))
    }

    fn open_snapshot(&mut self, snapshot: String, name: String) -> R<Resource<KeyspaceRes>> {
        wit(GuestState::open_snapshot(self, snapshot, name))
    }

    fn name(&mut self, this: Resource<KeyspaceRes>) -> wasmtime::Result<String> {
        GuestState::name(self, &this)
    }

    fn get(&mut self, this: Resource<KeyspaceRes>, key: Vec<u8>) -> R<Option<Vec<u8>>> {
        wit(GuestState::get(self, &this, &key))
    }

    fn get_many(&mut self, this: Resource<KeyspaceRes>, keys: Packed) -> R<MaybeValues> {
        // Slices of the guest's one buffer: no copy of a key of its own.
        let keys: Vec<&[u8]> = match unpack("get-many", &keys, 1) {
            Ok(keys) => keys.collect(),
            Err(e) => return Ok(Err(e)),
        };
        let answers = GuestState::get_many(self, &this, &keys);
        wit(answers.map(|r| r.map(|values| pack_values(&values))))
    }

    fn put(&mut self, this: Resource<KeyspaceRes>, key: Vec<u8>, value: Vec<u8>) -> R<()> {
        wit(GuestState::put(self, &this, &key, &value))
    }

    fn delete(&mut self, this: Resource<KeyspaceRes>, key: Vec<u8>) -> R<()> {
        wit(GuestState::delete(self, &this, &key))
    }

    fn scan(
        &mut self,
        this: Resource<KeyspaceRes>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
    ) -> R<Resource<CursorRes>> {
        wit(GuestState::scan(
            self,
            &this,
            start.as_deref(),
            end.as_deref(),
        ))
    }

    fn delete_range(&mut self, this: Resource<KeyspaceRes>, start: Vec<u8>, end: Vec<u8>) -> R<()> {
        wit(GuestState::delete_range(self, &this, &start, &end))
    }

    fn clear(&mut self, this: Resource<KeyspaceRes>) -> R<()> {
        wit(GuestState::clear(self, &this))
    }

    fn is_empty(&mut self, this: Resource<KeyspaceRes>) -> R<bool> {
        wit(GuestState::is_empty(self, &this))
    }

    fn drop(&mut self, this: Resource<KeyspaceRes>) -> wasmtime::Result<()> {
        self.drop_keyspace(this)
    }
}

impl HostCursor for GuestState {
    fn next(&mut self, this: Resource<CursorRes>, max: u32) -> R<Packed> {
        let batch = GuestState::next(self, &this, max);
        wit(batch.map(|r| {
            r.map(|entries| {
                let mut out = PackedBuf::default();
                out.ends.reserve(2 * entries.len());
                for (key, value) in &entries {
                    out.push(key);
                    out.push(value);
                }
                into_packed(out)
            })
        }))
    }

    fn drop(&mut self, this: Resource<CursorRes>) -> wasmtime::Result<()> {
        self.drop_cursor(this)
    }
}

/// The storage operations of one WIT operation, appended to `out`.
fn lower_op(op: WitOp, out: &mut Vec<Op>) -> Result<(), Error> {
    match op {
        WitOp::Put(e) => out.push(Op::Put(e.key, e.value)),
        WitOp::Delete(k) => out.push(Op::Delete(k)),
        WitOp::PutMany(entries) => {
            let mut it = unpack("write: put-many", &entries, 2)?;
            while let (Some(key), Some(value)) = (it.next(), it.next()) {
                out.push(Op::Put(key.to_vec(), value.to_vec()));
            }
        }
        WitOp::DeleteMany(keys) => {
            out.extend(unpack("write: delete-many", &keys, 1)?.map(|k| Op::Delete(k.to_vec())));
        }
        WitOp::DeleteRange((s, e)) => out.push(Op::DeleteRange(s, e)),
        WitOp::Clear => out.push(Op::Clear),
    }
    Ok(())
}

impl Host for GuestState {
    fn write(&mut self, batch: Vec<KeyspaceOps>, sync: bool) -> R<()> {
        self.count_write();
        let mut ops = Vec::with_capacity(batch.len());
        for group in batch {
            let ks = self.ks(&group.keyspace)?;
            let mut group_ops = Vec::with_capacity(group.ops.len());
            for op in group.ops {
                if let Err(e) = lower_op(op, &mut group_ops) {
                    return Ok(Err(e));
                }
            }
            ops.push((ks, group_ops));
        }
        wit(GuestState::write(self, ops, sync))
    }

    fn sync(&mut self) -> R<()> {
        wit(GuestState::sync(self))
    }

    fn create_snapshot(&mut self, name: String) -> R<()> {
        wit(GuestState::create_snapshot(self, &name))
    }

    fn restore_snapshot(&mut self, name: String) -> R<()> {
        wit(GuestState::restore_snapshot(self, &name))
    }

    fn drop_snapshot(&mut self, name: String) -> R<()> {
        wit(GuestState::drop_snapshot(self, &name))
    }

    fn list_snapshots(&mut self) -> R<Vec<String>> {
        wit(GuestState::list_snapshots(self))
    }

    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            Level::Trace => tracing::Level::TRACE,
            Level::Debug => tracing::Level::DEBUG,
            Level::Info => tracing::Level::INFO,
            Level::Warn => tracing::Level::WARN,
            Level::Error => tracing::Level::ERROR,
        };
        GuestState::log(self, level, &message);
        Ok(())
    }
}
