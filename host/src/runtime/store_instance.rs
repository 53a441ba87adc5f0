//! A live store, whichever backend serves it: a wasm guest in its sandbox
//! ([`WasmInstance`]) or the native baseline ([`NativeInstance`]). The
//! task, the conformance suite and the bench call this one type; what is
//! built from the contract's calls (paging through a range) is here, once.

use super::instance::{CallError, EntryRef, Isolation, Recovery, WasmInstance};
use super::native::NativeInstance;
use super::packed::Page;

/// Entries per `range` call when the host pages through a range.
pub const RANGE_PAGE: usize = 1024;

/// A live store instance bound to one store's storage.
pub enum StoreInstance {
    Wasm(Box<WasmInstance>),
    Native(NativeInstance),
}

/// The same call on either backend.
macro_rules! either {
    ($self:ident, $i:ident => $call:expr) => {
        match $self {
            StoreInstance::Wasm($i) => $call,
            StoreInstance::Native($i) => $call,
        }
    };
}

impl StoreInstance {
    /// The guest's label (built-in name or path).
    pub fn label(&self) -> &str {
        either!(self, i => i.label())
    }

    /// Export calls made so far, by function.
    pub fn call_counts(&self) -> &std::collections::BTreeMap<&'static str, u64> {
        self.calls().counts()
    }

    /// Export calls made so far, with their time when metrics are on.
    pub fn calls(&self) -> &super::CallStats {
        either!(self, i => i.calls())
    }

    pub fn is_dead(&self) -> bool {
        either!(self, i => i.is_dead())
    }

    pub fn init(&mut self, options: &[(String, String)]) -> Result<(), CallError> {
        either!(self, i => i.init(options))
    }

    pub fn transactional(&mut self) -> Result<bool, CallError> {
        either!(self, i => i.transactional())
    }

    pub fn recover(&mut self, checkpointed: Option<u64>) -> Result<Recovery, CallError> {
        either!(self, i => i.recover(checkpointed))
    }

    pub fn get(&mut self, key: &[u8], isolation: Isolation) -> Result<Option<Vec<u8>>, CallError> {
        either!(self, i => i.get(key, isolation))
    }

    pub fn get_many(
        &mut self,
        keys: &[Vec<u8>],
        isolation: Isolation,
    ) -> Result<Vec<Option<Vec<u8>>>, CallError> {
        either!(self, i => i.get_many(keys, isolation))
    }

    /// One page of [start, end) at `isolation`, at most `limit` entries.
    pub fn range(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
        limit: u32,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, CallError> {
        Ok(self.range_page(start, end, isolation, limit)?.to_pairs())
    }

    /// One page of [start, end) at `isolation`, at most `limit` entries,
    /// packed as the guest returned it.
    pub fn range_page(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
        limit: u32,
    ) -> Result<Page, CallError> {
        either!(self, i => i.range_page(start, end, isolation, limit))
    }

    /// Every entry of [start, end), paging through `range`.
    pub fn range_all(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, CallError> {
        self.range_up_to(start, end, isolation, usize::MAX)
    }

    /// The first `max` entries of [start, end), paging through `range`.
    pub fn range_up_to(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, CallError> {
        let mut out = Vec::new();
        self.range_pages(start, end, isolation, max, |page| {
            out.extend(page.iter().map(|(k, v)| (k.to_vec(), v.to_vec())))
        })?;
        Ok(out)
    }

    /// Pages through `range` over [start, end), [`RANGE_PAGE`] entries at a
    /// time, handing each page to `each`, until `max` entries are read.
    pub fn range_pages(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        isolation: Isolation,
        max: usize,
        mut each: impl FnMut(&Page),
    ) -> Result<(), CallError> {
        let (mut read, mut next) = (0, start.map(<[u8]>::to_vec));
        loop {
            let want = RANGE_PAGE.min(max - read);
            if want == 0 {
                return Ok(());
            }
            let page = self.range_page(next.as_deref(), end, isolation, want as u32)?;
            let full = page.len() == want;
            if let Some(k) = page.last_key() {
                let mut k = k.to_vec();
                k.push(0);
                next = Some(k);
            }
            read += page.len();
            each(&page);
            if !full {
                return Ok(());
            }
        }
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), CallError> {
        either!(self, i => i.put(key, value))
    }

    pub fn delete(&mut self, key: &[u8]) -> Result<(), CallError> {
        either!(self, i => i.delete(key))
    }

    pub fn put_many(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), CallError> {
        let entries: Vec<EntryRef> = entries
            .iter()
            .map(|(key, value)| EntryRef { key, value })
            .collect();
        self.put_entries(&entries)
    }

    /// `put-many` of entries borrowed from the caller (the task's records).
    pub fn put_entries(&mut self, entries: &[EntryRef<'_>]) -> Result<(), CallError> {
        either!(self, i => i.put_entries(entries))
    }

    pub fn delete_many(&mut self, keys: &[Vec<u8>]) -> Result<(), CallError> {
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.delete_keys(&keys)
    }

    /// `delete-many` of keys borrowed from the caller (the task's records).
    pub fn delete_keys(&mut self, keys: &[&[u8]]) -> Result<(), CallError> {
        either!(self, i => i.delete_keys(keys))
    }

    /// After a failed commit the store may hold part of it: the host makes
    /// no further call on this instance (the task stops; the next start
    /// recovers in a new one), whatever the guest would answer.
    pub fn commit(&mut self, offset: u64) -> Result<(), CallError> {
        either!(self, i => i.commit(offset))
    }

    pub fn committed_offset(&mut self) -> Result<Option<u64>, CallError> {
        either!(self, i => i.committed_offset())
    }

    pub fn approximate_uncommitted_bytes(&mut self) -> Result<u64, CallError> {
        either!(self, i => i.approximate_uncommitted_bytes())
    }

    /// The largest linear memory the guest has grown to, in bytes (0 for
    /// the native store, which has none of its own).
    pub fn peak_memory_bytes(&self) -> u64 {
        match self {
            StoreInstance::Wasm(i) => i.peak_memory_bytes(),
            StoreInstance::Native(_) => 0,
        }
    }
}
