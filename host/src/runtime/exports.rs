//! The guest's `state-store` exports as the WIT version it was built
//! against types them, and the calls the host makes with borrowed
//! arguments (typed once at instantiation, so each call lowers the
//! caller's bytes straight into guest memory).

use super::bindings::{v1, v2};
use super::host::GuestState;
use super::packed::PackedRef;
use super::{Isolation, Recovery, RecoveryAction, WitError};
use anyhow::{Context as _, Result};
use v2::txstore::store::types::MaybeValues;
use wasmtime::component::{ComponentType, Func, Instance, Lower, TypedFunc};
use wasmtime::Store;

/// An entry of `put-many` borrowed from the caller's records: the one copy
/// of its bytes is the one into guest memory.
#[derive(ComponentType, Lower, Clone, Copy, Debug)]
#[component(record)]
pub struct EntryRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
}

pub(super) type Unit = (Result<(), WitError>,);
pub(super) type Unit1 = (Result<(), OldError>,);
pub(super) type PutRef<'a, R> = TypedFunc<(&'a [u8], &'a [u8]), R>;
pub(super) type DeleteRef<'a, R> = TypedFunc<(&'a [u8],), R>;
pub(super) type PutManyRef1<'a> = TypedFunc<(&'a [EntryRef<'a>],), Unit1>;
pub(super) type DeleteManyRef1<'a> = TypedFunc<(&'a [&'a [u8]],), Unit1>;
pub(super) type PackedCall<'a> = TypedFunc<(PackedRef<'a>,), Unit>;
pub(super) type Get<'a, I, E> = TypedFunc<(&'a [u8], I), (Result<Option<Vec<u8>>, E>,)>;
pub(super) type OldIsolation = v1::exports::txstore::store::state_store::Isolation;
pub(super) type OldError = v1::txstore::store::types::Error;
pub(super) type GetManyPacked<'a> =
    TypedFunc<(PackedRef<'a>, Isolation), (Result<MaybeValues, WitError>,)>;

/// The write calls (and 0.2.0's `get-many`) typed for borrowed arguments:
/// the bindings take owned ones, which would cost the caller a copy of
/// every key and value. Each is checked against its signature once, at
/// instantiation, and called unchecked after.
pub(super) struct BorrowedCalls {
    pub get: Func,
    pub put: Func,
    pub delete: Func,
    pub put_many: Func,
    pub delete_many: Func,
    /// 0.2.0 only (0.1.0's takes a list of keys the bindings lower well).
    pub get_many: Option<Func>,
}

impl BorrowedCalls {
    pub fn new(instance: &Instance, store: &mut Store<GuestState>, version: &str) -> Result<Self> {
        let func =
            |store: &mut Store<GuestState>, name| export_func(instance, store, version, name);
        let get = func(store, "get")?;
        let (put, delete) = (func(store, "put")?, func(store, "delete")?);
        let (put_many, delete_many) = (func(store, "put-many")?, func(store, "delete-many")?);
        let get_many = if version == super::WIT_VERSION {
            get.typed::<(&[u8], Isolation), (Result<Option<Vec<u8>>, WitError>,)>(&*store)?;
            put.typed::<(&[u8], &[u8]), Unit>(&*store)?;
            delete.typed::<(&[u8],), Unit>(&*store)?;
            put_many.typed::<(PackedRef,), Unit>(&*store)?;
            delete_many.typed::<(PackedRef,), Unit>(&*store)?;
            let get_many = func(store, "get-many")?;
            get_many.typed::<(PackedRef, Isolation), (Result<MaybeValues, WitError>,)>(&*store)?;
            Some(get_many)
        } else {
            get.typed::<(&[u8], OldIsolation), (Result<Option<Vec<u8>>, OldError>,)>(&*store)?;
            put.typed::<(&[u8], &[u8]), Unit1>(&*store)?;
            delete.typed::<(&[u8],), Unit1>(&*store)?;
            put_many.typed::<(&[EntryRef],), Unit1>(&*store)?;
            delete_many.typed::<(&[&[u8]],), Unit1>(&*store)?;
            None
        };
        Ok(Self {
            get,
            put,
            delete,
            put_many,
            delete_many,
            get_many,
        })
    }
}

/// Function `name` of the guest's `state-store` export at `version`.
fn export_func(
    instance: &Instance,
    store: &mut Store<GuestState>,
    version: &str,
    name: &str,
) -> Result<Func> {
    let iface = format!("{}/state-store@{version}", super::WIT_PACKAGE);
    let export = instance
        .get_export_index(&mut *store, None, &iface)
        .with_context(|| format!("the guest does not export {iface}"))?;
    let func = instance
        .get_export_index(&mut *store, Some(&export), name)
        .with_context(|| format!("{iface} has no {name}"))?;
    instance
        .get_func(&mut *store, func)
        .with_context(|| format!("{iface}#{name} is not a function"))
}

/// The guest's exports, as the version it was built against types them.
pub(super) enum Api {
    V1(v1::Store),
    V2(v2::Store),
}

/// A 0.1.0 guest's answer in the host's (0.2.0) types: the two versions'
/// errors, isolation levels and recoveries are the same variants.
pub(super) mod from_v1 {
    use super::{v1, Isolation, Recovery, RecoveryAction, WitError};
    use v1::exports::txstore::store::state_store as old;
    use v1::txstore::store::types::Error as OldError;

    pub fn error(e: OldError) -> WitError {
        match e {
            OldError::AccessDenied(m) => WitError::AccessDenied(m),
            OldError::NoSuchSnapshot(m) => WitError::NoSuchSnapshot(m),
            OldError::UncommittedLimit(n) => WitError::UncommittedLimit(n),
            OldError::InvalidArgument(m) => WitError::InvalidArgument(m),
            OldError::Corrupt(m) => WitError::Corrupt(m),
            OldError::Storage(m) => WitError::Storage(m),
            OldError::Other(m) => WitError::Other(m),
        }
    }

    pub fn answer<T, U>(
        r: wasmtime::Result<Result<T, OldError>>,
        f: impl FnOnce(T) -> U,
    ) -> wasmtime::Result<Result<U, WitError>> {
        r.map(|r| r.map(f).map_err(error))
    }

    pub fn isolation(i: Isolation) -> old::Isolation {
        match i {
            Isolation::ReadCommitted => old::Isolation::ReadCommitted,
            Isolation::ReadUncommitted => old::Isolation::ReadUncommitted,
        }
    }

    pub fn recovery(r: old::Recovery) -> Recovery {
        Recovery {
            offset: r.offset,
            action: match r.action {
                old::RecoveryAction::Clean => RecoveryAction::Clean,
                old::RecoveryAction::Discarded => RecoveryAction::Discarded,
                old::RecoveryAction::RolledForward => RecoveryAction::RolledForward,
                old::RecoveryAction::RolledBack => RecoveryAction::RolledBack,
                old::RecoveryAction::Wiped => RecoveryAction::Wiped,
            },
        }
    }
}
