//! The per-store resource limiter: caps linear memory, tables and instances,
//! and remembers the largest memory the guest reached (for memory checks).

use wasmtime::ResourceLimiter;

/// Elements one table may hold.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// The error a memory grow past the cap traps with.
#[derive(Debug, thiserror::Error)]
#[error("guest exceeded its memory limit of {limit_mib} MiB (asked for {asked} bytes)")]
pub struct MemoryLimitExceeded {
    pub limit_mib: u64,
    pub asked: usize,
}

pub struct GuestLimiter {
    memory_cap: usize,
    limit_mib: u64,
    tables: usize,
    instances: usize,
    /// Largest linear memory size granted so far, in bytes.
    pub peak_memory: usize,
}

impl GuestLimiter {
    pub fn new(limits: &super::Limits) -> Self {
        Self {
            memory_cap: (limits.memory_mib as usize) << 20,
            limit_mib: limits.memory_mib,
            tables: limits.max_tables as usize,
            instances: limits.max_instances as usize,
            peak_memory: 0,
        }
    }
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            return Err(MemoryLimitExceeded {
                limit_mib: self.limit_mib,
                asked: desired,
            }
            .into());
        }
        self.peak_memory = self.peak_memory.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.instances
    }
}
