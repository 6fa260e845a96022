//! rivetd's heap: jemalloc as the allocator ([`Allocator`], declared by the
//! `rivetd` binary) and [`TrimHeap`], which hands the memory a large change
//! freed back to the system.
//!
//! A large document (10,000 Services and their EndpointSlices of 10
//! endpoints: 13 MB of JSON) is parsed into transient copies a few times
//! the size of what is kept. With glibc's malloc the kept objects end up
//! interleaved with the freed garbage in its arenas' pages, and the agent's
//! resident size stayed near the peak even after `malloc_trim`, from run to
//! run differently: 112.1–157.7 MiB after applying that document
//! (`cargo xtask bench services`, six runs on 2026-12-06, with a fixed mmap
//! threshold and a trim after each large change; 92.8 after a restart).
//! jemalloc keeps allocations of a size class together and returns whole
//! free pages: 101.3, 102.5, 101.4 MiB in three runs of the same
//! benchmark, 86.8 after a restart, 89.0 with 10,000 Services of 2
//! backends (108.0 before); connect latency, apply time and the time to a
//! new Service's first answer unchanged (2026-12-06 10:33).

/// The allocator `rivetd` declares as its global one.
pub type Allocator = tikv_jemallocator::Jemalloc;

/// Hands the heap's free memory back to the system when dropped (after a
/// large document or list is stored): jemalloc would otherwise keep freed
/// pages for its decay time (10 s) before returning them.
pub struct TrimHeap;

impl Drop for TrimHeap {
    fn drop(&mut self) {
        if !purge() {
            tracing::warn!("the allocator refused to purge its free pages");
        }
    }
}

/// Returns every jemalloc arena's unused pages to the system now; false
/// when jemalloc refused.
pub fn purge() -> bool {
    /// `arena.<MALLCTL_ARENAS_ALL>.purge`.
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    // SAFETY: a NUL-terminated control name; no value is read or written
    // (null pointers, zero length), as jemalloc documents for `purge`.
    // Harmless where jemalloc is linked but not the global allocator: its
    // arenas are empty.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn jemalloc_purges_its_arenas() {
        assert!(super::purge());
    }
}
