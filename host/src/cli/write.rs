//! `txstore put` and `txstore delete`: one write, one committed
//! transaction, through the task's protocol like any record's.

use super::args::{DeleteArgs, PutArgs};
use super::open;
use super::query::arg_bytes;
use crate::changelog::Record;
use anyhow::Result;
use std::path::Path;

pub(super) fn put(a: PutArgs) -> Result<()> {
    let record = Record::Put(
        arg_bytes("key", &a.key, a.hex)?,
        arg_bytes("value", &a.value, a.hex)?,
    );
    commit_one(&a.config, record)
}

pub(super) fn delete(a: DeleteArgs) -> Result<()> {
    commit_one(&a.config, Record::Delete(arg_bytes("key", &a.key, a.hex)?))
}

fn commit_one(config: &Path, record: Record) -> Result<()> {
    let (mut task, _) = open(config)?;
    task.write(&[record])?;
    task.commit()?;
    task.close()?;
    Ok(())
}
